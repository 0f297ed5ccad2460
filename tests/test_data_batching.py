"""Token-budget batching: budget, coverage, determinism, resume, DDP sharding; collate functions."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from _data_helpers import multi30k_bpe, needs_mirror, real_cache, use_real_cache  # noqa: F401
from aiayn.data import (DataConfig, TokenBatchSampler, collate_classification, collate_translation,
                        padding_fraction, pair_lengths, prepare_translation)
from aiayn.errors import ConfigError

RNG = np.random.default_rng(1234)
SRC = RNG.integers(1, 60, size=3000).tolist()
TGT = (np.asarray(SRC) + RNG.integers(-5, 10, size=3000)).clip(2, None).tolist()
BUDGET = 1500


def sampler(**kw) -> TokenBatchSampler:
    return TokenBatchSampler(SRC, TGT, **{"max_tokens": BUDGET, "seed": 7, **kw})


def padded(batch: list[int]) -> int:
    return len(batch) * max(max(SRC[i], TGT[i]) for i in batch)


def test_every_example_once_per_epoch_within_the_budget():
    s = sampler()
    for epoch in range(3):
        batches = s.batches(epoch)
        assert sorted(i for b in batches for i in b) == list(range(len(SRC)))
        assert all(padded(b) <= BUDGET for b in batches)


def test_batches_are_full_and_length_bucketed():
    s = sampler()
    batches = s.batches(0)
    # Greedy cut over the sorted order: each batch could not take one more example of its width.
    widths = sorted(max(a, b) for a, b in zip(SRC, TGT))
    assert len(batches) <= np.ceil(sum(widths) / BUDGET) * 1.15
    assert padding_fraction(s) < 0.15  # random lengths 1-60 would pad ~50% unsorted


def test_batches_are_the_lists_of_before(world_size=2):
    """An epoch's batches are held as one index array (Batches) and equal, batch for batch, the
    lists the sampler built before (so runs saved mid-epoch resume on the same batches)."""
    s = sampler(rank=1, world_size=world_size)
    rng = np.random.default_rng([7, 3])
    src, tgt = np.asarray(SRC), np.asarray(TGT)
    width = np.maximum(src, tgt)
    order = np.lexsort((rng.random(len(SRC)), tgt, src, width))
    cut = [order[a:b] for a, b in zip(s._bounds[:-1], s._bounds[1:])]
    cut = [cut[i] for i in rng.permutation(len(cut))]
    before = [b.tolist() for b in cut[1::world_size][: len(cut) // world_size]]
    batches = s.batches(3)
    assert batches == before and before == batches and list(batches) == before
    assert batches[5:9] == before[5:9] and batches[::-1][0] == before[-1]
    assert all(type(b) is list and type(b[0]) is int for b in batches[:3])
    assert batches != before[:-1] and batches != sampler().batches(3)


def test_distinct_shapes_counts_the_batch_tensor_shapes():
    s = sampler()
    src, tgt = np.asarray(SRC), np.asarray(TGT)
    shapes = {(len(b), int(src[b].max()), int(tgt[b].max())) for b in sampler(shuffle=False).batches()}
    assert s.distinct_shapes() == len(shapes) > 10
    assert TokenBatchSampler([2, 4, 4, 7], [3, 1, 5, 7], max_tokens=8).distinct_shapes() == 3


def test_padding_fraction_counts_padded_cells():
    s = TokenBatchSampler([2, 4], [3, 1], max_tokens=100, shuffle=False)
    assert s.batches() == [[0, 1]]
    # cells: src 2 x 4 = 8, tgt 2 x 3 = 6; real tokens: 6 + 4 = 10
    assert padding_fraction(s) == pytest.approx(1 - 10 / 14)


def test_deterministic_given_seed_and_different_across_epochs_and_seeds():
    assert sampler().batches(0) == sampler().batches(0)
    assert sampler().batches(0) != sampler().batches(1)
    assert sampler().batches(0) != sampler(seed=8).batches(0)
    assert len({len(sampler().batches(e)) for e in range(5)}) == 1  # same count every epoch
    assert len(sampler()) == len(sampler().batches(3))


def test_no_shuffle_is_sorted_by_length():
    batches = sampler(shuffle=False).batches(0)
    assert batches == sampler(shuffle=False).batches(5)
    order = [i for b in batches for i in b]
    widths = [max(SRC[i], TGT[i]) for i in order]
    assert widths == sorted(widths)
    for batch, following in zip(batches, batches[1:]):  # greedy: the next example did not fit
        assert (len(batch) + 1) * max(SRC[following[0]], TGT[following[0]]) > BUDGET


def test_iteration_follows_epochs_and_set_epoch():
    s = sampler()
    assert list(s) == s.batches(0)
    assert s.epoch == 1 and list(s) == s.batches(1)
    s.set_epoch(5)
    assert list(s) == sampler().batches(5)


def test_resume_mid_epoch_is_exact():
    s = sampler()
    s.set_epoch(2)
    it = iter(s)
    head = [next(it) for _ in range(7)]
    buffer = io.BytesIO()
    torch.save(s.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)  # plain ints only
    assert all(type(v) is int for v in state.values())

    resumed = sampler()
    resumed.load_state_dict(state)
    resumed.set_epoch(2)  # what a trainer does at the top of the epoch: must not rewind
    assert head + list(resumed) == sampler().batches(2)
    assert list(resumed) == sampler().batches(3)


def test_resume_refuses_other_data():
    state = sampler().state_dict()
    with pytest.raises(ValueError, match="num_examples"):
        TokenBatchSampler(SRC[:-1], TGT[:-1], max_tokens=BUDGET, seed=7).load_state_dict(state)
    with pytest.raises(ValueError, match="seed"):
        sampler(seed=1).load_state_dict(state)


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_get_disjoint_shards_of_equal_length(world_size):
    shards = [sampler(rank=r, world_size=world_size).batches(4) for r in range(world_size)]
    assert len({len(s) for s in shards}) == 1
    assert len(shards[0]) == len(sampler(rank=0, world_size=world_size))
    seen = [i for shard in shards for b in shard for i in b]
    assert len(seen) == len(set(seen))  # disjoint
    full = sampler().batches(4)
    assert len(full) - world_size < len(shards[0]) * world_size <= len(full)  # < world_size dropped
    assert set(map(tuple, (b for s in shards for b in s))) <= set(map(tuple, full))


def test_single_sequence_lengths_and_oversized_examples():
    s = TokenBatchSampler([5, 500, 5, 5], None, max_tokens=100, shuffle=False)
    assert s.batches() == [[0, 2, 3], [1]]  # the over-long example alone
    s = TokenBatchSampler([5] * 10, max_tokens=100, max_batch_size=4, shuffle=False)
    assert [len(b) for b in s.batches()] == [4, 4, 2]


def test_bad_arguments():
    with pytest.raises(ValueError, match="equal length"):
        TokenBatchSampler([1, 2], [1])
    with pytest.raises(ValueError, match="max_tokens"):
        TokenBatchSampler([1], max_tokens=0)
    with pytest.raises(ValueError, match="rank"):
        TokenBatchSampler([1], rank=2, world_size=2)


# ---- collate ------------------------------------------------------------------------------------


def test_collate_translation_shifts_and_pads():
    pairs = [([5, 6, 7], [8, 9]), ([10], [11, 12, 13, 14])]
    batch = collate_translation(pairs, pad_id=0, bos_id=1, eos_id=2)
    assert batch.src.tolist() == [[5, 6, 7], [10, 0, 0]]
    assert batch.tgt_in.tolist() == [[1, 8, 9, 0, 0], [1, 11, 12, 13, 14]]
    assert batch.tgt_out.tolist() == [[8, 9, 2, 0, 0], [11, 12, 13, 14, 2]]
    assert batch.src.dtype == batch.tgt_in.dtype == batch.tgt_out.dtype == torch.long
    assert (batch.n_src_tokens, batch.n_tgt_tokens) == (4, 8)
    assert batch.n_tgt_tokens == int((batch.tgt_out != 0).sum()) and len(batch) == 2
    assert pair_lengths(pairs) == ([3, 1], [3, 5])  # the tensor widths the sampler budgets
    moved = batch.to("cpu")
    assert torch.equal(moved.tgt_out, batch.tgt_out)


def test_collate_translation_other_special_ids():
    batch = collate_translation([([4], [])], pad_id=9, bos_id=7, eos_id=8)
    assert batch.tgt_in.tolist() == [[7]] and batch.tgt_out.tolist() == [[8]]
    with pytest.raises(ValueError):
        collate_translation([])


def test_collate_classification():
    batch = collate_classification([([5, 6], 1), ([7], 0)], pad_id=0, bos_id=1)
    assert batch.tokens.tolist() == [[1, 5, 6], [1, 7, 0]]
    assert batch.labels.tolist() == [1, 0] and batch.n_tokens == 5


@needs_mirror
def test_multi30k_tokenise_and_batch(use_real_cache, multi30k_bpe):
    """All of Multi30k train tokenised and batched within the token budget, little padding.
    (How long it takes is `aiayn data stats`'s to report, not a test's: on a shared CI machine a
    time limit fails at random; it once took 16 s under load against 2.2 s idle.)"""
    cfg = DataConfig(dataset="multi30k", max_tokens=4096)
    train, valid = prepare_translation(cfg, multi30k_bpe)  # read + tokenise train and val
    sampler = TokenBatchSampler(*pair_lengths(train), max_tokens=cfg.max_tokens, seed=cfg.seed)
    batches = [collate_translation([train[i] for i in b]) for b in sampler]
    assert len(train) == 29000 and len(valid) == 1014  # nothing over max_len=256 in Multi30k
    assert sum(len(b) for b in batches) == 29000
    assert all(b.src.numel() <= 4096 and b.tgt_in.numel() <= 4096 for b in batches)
    assert padding_fraction(sampler) < 0.10


def test_pad_to_multiple_rounds_the_batch_widths_within_the_budget_and_cuts_the_shapes():
    """data.pad_to_multiple: every batch's source and target widths are multiples of 8 and
    rows x width stays within max_tokens; an epoch has far fewer distinct batch shapes; the
    tensors a batch collates to have those widths."""
    plain, padded = sampler(shuffle=False), sampler(shuffle=False, pad_to_multiple=8)
    src, tgt = np.asarray(SRC), np.asarray(TGT)
    for b in padded.batches():
        width = max(-(-int(src[b].max()) // 8) * 8, -(-int(tgt[b].max()) // 8) * 8)
        assert len(b) * width <= padded.max_tokens or len(b) == 1
    assert padded.distinct_shapes() * 2 < plain.distinct_shapes()
    assert sorted(i for b in padded.batches() for i in b) == list(range(len(SRC)))
    pairs = [([5] * 3, [6] * 9), ([5] * 10, [6] * 2)]
    batch = collate_translation(pairs, multiple=8)
    assert batch.src.shape == (2, 16) and batch.tgt_in.shape == batch.tgt_out.shape == (2, 16)
    assert batch.n_src_tokens == 13 and batch.n_tgt_tokens == 13  # padding is not counted
    assert padding_fraction(padded) > padding_fraction(plain)
    with pytest.raises(ValueError, match="pad_to_multiple"):
        sampler(pad_to_multiple=0)


def test_pad_to_multiple_is_for_translation_only():
    DataConfig(pad_to_multiple=8).validate()
    with pytest.raises(ConfigError, match="pad_to_multiple"):
        DataConfig(kind="classification", pad_to_multiple=8).validate()
    with pytest.raises(ConfigError, match="pad_to_multiple"):
        DataConfig(pad_to_multiple=0).validate()


def test_padding_to_a_multiple_leaves_the_models_outputs_unchanged():
    """The extra positions are padding, masked like any other: a tiny Transformer's logits at
    the real positions and its label-smoothed loss are those of the unpadded batch."""
    from trainutil import tiny_model_config

    from aiayn.model import Transformer
    from aiayn.train.loss import label_smoothed_nll_loss

    torch.manual_seed(0)
    model = Transformer(tiny_model_config(vocab=40, max_len=64)).eval()
    rng = np.random.default_rng(1)
    pairs = [(rng.integers(4, 40, n).tolist(), rng.integers(4, 40, m).tolist())
             for n, m in ((5, 7), (11, 3), (2, 9))]
    outs = []
    for multiple in (1, 8):
        b = collate_translation(pairs, multiple=multiple)
        with torch.no_grad():
            logits = model(b.src, b.tgt_in)
        loss, _ = label_smoothed_nll_loss(logits, b.tgt_out, 0.1, 0)
        outs.append((logits, loss))
    (a, loss_a), (p, loss_p) = outs
    assert p.shape[1] == 16 and torch.allclose(p[:, : a.shape[1]], a, atol=1e-5)
    assert torch.allclose(loss_a, loss_p, atol=1e-6)


BUCKETS = (8, 12, 16, 24, 32, 48, 64, 80)


def test_bucket_widths_pad_to_a_few_widths_and_fix_each_buckets_rows():
    """data.bucket_widths: each batch's source and target widths are buckets, rows x bucket
    stays within max_tokens, a batch never spans two buckets, so every batch of a bucket but its
    last has budget // bucket rows; an epoch has a few shapes, each batch's shape one of those
    that shape_batches() lists (one batch each, the most padded cells first), in every epoch."""
    from aiayn.data.batching import bucket_width

    plain, bucketed = sampler(shuffle=False), sampler(bucket_widths=BUCKETS)
    src, tgt = np.asarray(SRC), np.asarray(TGT)
    rows_of: dict[int, list[int]] = {}
    for b in sampler(shuffle=False, bucket_widths=BUCKETS).batches():
        widths = bucket_width(np.maximum(src[b], tgt[b]), BUCKETS)
        assert len(set(widths.tolist())) == 1  # one bucket per batch
        width = int(widths[0])
        assert len(b) * width <= BUDGET
        rows_of.setdefault(width, []).append(len(b))
    for width, rows in rows_of.items():
        assert set(rows[:-1]) <= {BUDGET // width} and rows[-1] <= BUDGET // width
    assert sorted(i for b in bucketed.batches(2) for i in b) == list(range(len(SRC)))
    listed = bucketed.shape_batches()
    assert len(listed) == bucketed.distinct_shapes() and bucketed.distinct_shapes() * 3 < plain.distinct_shapes()
    cells = [rows * (s + t) for (rows, s, t), _ in listed]
    assert cells == sorted(cells, reverse=True)
    for shape, b in listed:
        c = collate_translation([([5] * SRC[i], [6] * (TGT[i] - 1)) for i in b], widths=BUCKETS)
        assert (len(c), c.src.size(1), c.tgt_in.size(1)) == shape
    for epoch in (0, 3):
        seen = {(len(b), bucket_width(int(src[b].max()), BUCKETS), bucket_width(int(tgt[b].max()), BUCKETS))
                for b in bucketed.batches(epoch)}
        assert seen == {shape for shape, _ in listed}
    batch = collate_translation([([5] * 3, [6] * 9), ([5] * 10, [6] * 2)], widths=BUCKETS)
    assert batch.src.shape == (2, 12) and batch.tgt_in.shape == batch.tgt_out.shape == (2, 12)
    assert bucket_width(np.array([1, 8, 9, 80, 81]), BUCKETS).tolist() == [8, 8, 12, 80, 81]
    with pytest.raises(ValueError, match="bucket_widths"):
        sampler(bucket_widths=(16, 8))


def test_bucket_widths_off_leaves_the_batches_as_they_were():
    assert sampler(bucket_widths=()).batches(2) == sampler().batches(2)
    assert sampler(bucket_widths=()).distinct_shapes() == sampler().distinct_shapes()


def test_bucket_widths_config_checks():
    DataConfig(bucket_widths=(16, 32, 256)).validate()
    for bad, words in [(dict(bucket_widths=(32, 16, 256)), "ascending"),
                       (dict(bucket_widths=(16, 128)), r"reach data.max_len \(256\)"),
                       (dict(bucket_widths=(0, 256)), "positive"),
                       (dict(bucket_widths=(16, 256), pad_to_multiple=8), "without data.pad_to"),
                       (dict(kind="classification", bucket_widths=(256,)), "translation")]:
        with pytest.raises(ConfigError, match=words):
            DataConfig(**bad)
    from aiayn.config import ModelConfig
    from aiayn.run_config import RunConfig, check_run_config

    cfg = RunConfig(model=ModelConfig(max_len=40), data=DataConfig(max_len=34, bucket_widths=(16, 48)))
    with pytest.raises(ConfigError, match="bucket, 48"):
        check_run_config(cfg)


def test_fit_bucket_widths_wastes_the_least_padding():
    """Against every choice of widths by brute force, on a small histogram."""
    import itertools

    from aiayn.data.batching import bucket_width, fit_bucket_widths

    widths = np.random.default_rng(3).integers(1, 15, size=200)
    for n in (1, 2, 3, 4):
        got = fit_bucket_widths(widths, n, 16)
        assert got[-1] == 16 and len(got) <= n
        waste = lambda ws: int((bucket_width(widths, ws) - widths).sum())  # noqa: E731
        best = min(waste((*c, 16)) for c in itertools.combinations(range(1, 16), n - 1))
        assert waste(got) == best
    assert fit_bucket_widths([3, 3, 5, 9], 5, 9) == (3, 5, 9)  # no empty bucket
