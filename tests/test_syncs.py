"""No hidden host-device syncs on the training and decoding hot paths, checked without a GPU.

On an accelerator every ``.item()``, ``.tolist()``, ``bool(tensor)``, ``int(tensor)``,
``float(tensor)``, ``.cpu()`` and ``nonzero()`` waits for the device to finish all the work queued
so far. Such a call once per layer per step (``if bool(mask.all())`` in attention) stalls the
device a dozen times per step. These tests count those calls on the CPU (where they cost nothing,
so the count is what matters) by wrapping the tensor methods, and assert:

* the model's forward and backward make none;
* a training update makes a fixed small number, the same for 1 and 3 layers per stack;
* greedy and beam decoding make a fixed small number per decoder step, the same for 1 and
  3 layers (docs/gpu.md lists them).

Counted calls include those on tensors that stay on the host on a GPU too (index bookkeeping in
the search), so the counts are upper bounds. On CUDA, tests/test_cuda.py checks the same paths
with ``torch.cuda.set_sync_debug_mode``.
"""

from __future__ import annotations

import contextlib
import random
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch
from trainutil import tiny_model_config

from aiayn.config import ModelConfig
from aiayn.decode import DecodeConfig, translate_ids
from aiayn.model import Transformer

pytestmark = pytest.mark.usefixtures("one_thread")

# Tensor methods that copy device data to the host (a sync on CUDA).
SYNC_METHODS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu",
                "numpy", "nonzero")


@contextlib.contextmanager
def counting_syncs() -> Iterator[Counter]:
    """Count calls of SYNC_METHODS (and ``torch.nonzero``) by the caller's file:line."""
    sites: Counter = Counter()
    mp = pytest.MonkeyPatch()

    def counted(original):
        def wrapper(*args, **kwargs):
            caller = traceback.extract_stack(limit=2)[0]
            sites[f"{caller.filename.rsplit('/', 2)[-1]}:{caller.lineno}"] += 1
            return original(*args, **kwargs)

        return wrapper

    for name in SYNC_METHODS:
        mp.setattr(torch.Tensor, name, counted(getattr(torch.Tensor, name)))
    mp.setattr(torch, "nonzero", counted(torch.nonzero))
    try:
        yield sites
    finally:
        mp.undo()


def tiny_config(layers: int, **overrides) -> ModelConfig:
    return tiny_model_config(50, 64, n_encoder_layers=layers, n_decoder_layers=layers,
                             **{"dropout": 0.3, **overrides})


def without_eos(model: Transformer) -> Transformer:
    """A model that never emits EOS (its output mask leaves it out): every hypothesis runs to
    the length cap, so every configuration decodes the same number of steps."""
    model.output_mask[model.cfg.eos_id] = False
    return model


def random_pairs(n: int, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    rng = random.Random(seed)
    return [([rng.randrange(4, 50) for _ in range(rng.randint(3, 9))],
             [rng.randrange(4, 50) for _ in range(rng.randint(3, 9))]) for _ in range(n)]


def test_the_counter_sees_syncs():
    x = torch.ones(3)
    with counting_syncs() as sites:
        bool(x.all()), x.sum().item(), x.tolist(), x.nonzero(), torch.nonzero(x)
    assert sum(sites.values()) == 5, sites


@pytest.mark.parametrize("norm_first", [False, True])
def test_model_forward_and_backward_make_no_syncs(norm_first):
    """Padding in source and target (masks with padded keys) and a fully padded source row
    (a dead query row in cross-attention) take every branch of the attention."""
    for fused in (False, True):
        model = Transformer(tiny_config(2, norm_first=norm_first, dropout=0.1)).train()
        src = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 0], [0, 0, 0, 0]])
        tgt = torch.tensor([[1, 5, 6], [1, 7, 0], [1, 0, 0]])
        with _attention_path(fused), counting_syncs() as sites:
            logits = model(src, tgt)
            logits.float().logsumexp(-1).sum().backward()
        assert not sites, f"fused={fused}: host-device syncs at {dict(sites)}"
        assert torch.isfinite(logits[:2]).all()


@contextlib.contextmanager
def _attention_path(fused: bool) -> Iterator[None]:
    """Force the fused (F.scaled_dot_product_attention) or the explicit attention path."""
    from aiayn.model import attention

    mp = pytest.MonkeyPatch()
    mp.setattr(attention, "EXPLICIT_MAX_KEYS_CPU", -1 if fused else 10**9)
    try:
        yield
    finally:
        mp.undo()


def _update_syncs(tmp_path, layers: int, output_vocab: str) -> Counter:
    from aiayn.data import DataConfig, pair_store
    from aiayn.run_config import RunConfig, TrainConfig
    from aiayn.train.distributed import DistContext
    from aiayn.train.run_folder import RunFolder
    from aiayn.train.translation import TranslationTask
    from aiayn.train.trainer import Trainer

    cfg = RunConfig(model=tiny_config(layers, output_vocab=output_vocab), data=DataConfig(),
                    train=TrainConfig(precision="fp32", device="cpu", seed=1))
    task = TranslationTask(cfg)
    task.stores = {"train": pair_store(random_pairs(16)), "valid": pair_store([])}
    folder = RunFolder(str(tmp_path / f"run{layers}{output_vocab}"))
    folder.prepare(resume=False)
    trainer = Trainer(cfg, task, folder, DistContext(), {}, "", resume=False)
    if trainer.model.output_mask is not None:
        trainer.model.output_mask[:40] = True
    trainer.update([list(range(8))])  # warm-up: first-call paths
    with counting_syncs() as sites:
        assert trainer.update([list(range(8)), list(range(8, 16))])  # two micro-batches
    return sites


# One training update with two micro-batches: the trainer's one copy of loss, NLL and gradient
# norm, and per micro-batch the loss's selection of the non-padding rows (nonzero: their number
# sets the shapes). output_vocab = "targets" adds two per micro-batch (kept_outputs in tasks.py).
UPDATE_SYNCS = {"all": 1 + 2 * 1, "targets": 1 + 2 * 3}


@pytest.mark.parametrize("output_vocab", ["all", "targets"])
def test_a_training_update_makes_a_fixed_number_of_syncs(tmp_path, output_vocab):
    one, three = (_update_syncs(tmp_path, n, output_vocab) for n in (1, 3))
    assert one == three, f"syncs grow with the layers: 1 layer {dict(one)}, 3 layers {dict(three)}"
    assert sum(one.values()) <= UPDATE_SYNCS[output_vocab], dict(one)


# Per decoder step with no EOS possible (without_eos): one, which brings the step's EOS candidates
# and dead sentences to the host together (aiayn/decode/generator.py, SequenceGenerator.step);
# beam search one more, the cache reorder's check. Per batch a few more (source lengths, the
# hypotheses at the end).
STEP_SYNCS = {1: 1, 4: 2}
BATCH_SYNCS = 6


@pytest.mark.parametrize("beam", [1, 4])
def test_decoding_makes_a_fixed_number_of_syncs_per_step(beam):
    sources = [s for s, _ in random_pairs(6, seed=1)]
    max_len = 12
    cfg = DecodeConfig(beam=beam, max_len_a=0.0, max_len_b=max_len)
    counts = {}
    for layers in (1, 3):
        model = without_eos(Transformer(tiny_config(layers, output_vocab="targets")).eval())
        translate_ids(model, sources[:1], cfg)  # warm-up
        with counting_syncs() as sites:
            hyps = translate_ids(model, sources, replace(cfg, batch_tokens=10_000))
        assert all(len(h[0].tokens) == max_len for h in hyps)  # every step ran, no EOS
        counts[layers] = sites
    assert counts[1] == counts[3], f"syncs grow with the layers: {counts}"
    total = sum(counts[1].values())
    assert total <= BATCH_SYNCS + STEP_SYNCS[beam] * max_len, dict(counts[1])
