"""Step-level batching (aiayn/decode/continuous.py): sentences that join a running search between
decoder steps, with other source lengths, beams and n-best lists, decode as they do alone; the
rows of sentences that end or are dropped leave, and the cache drops the positions no row reads.
"""

from __future__ import annotations

import pytest
import torch
from trainutil import tiny_model_config

from aiayn.decode import DecodeConfig, Ensemble, translate_ids
from aiayn.decode.continuous import RunningTranslation
from aiayn.decode.generator import SequenceGenerator
from aiayn.decode.rules import Rules
from aiayn.decode.search import BeamSearch, SearchSettings
from aiayn.model import Transformer

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 29


def tiny(seed: int = 0, **kw) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(tiny_model_config(vocab=VOCAB, max_len=64, **kw)).eval()


def sources(n: int, seed: int = 1) -> list[list[int]]:
    """n sources of 2 to 9 tokens (ids 4 … V-1), EOS (2) last, as aiayn's data has them."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 10, (n,), generator=g).tolist()
    return [torch.randint(4, VOCAB, (n,), generator=g).tolist() + [2] for n in lengths]


def run_joining(model, cfg, srcs, joins):
    """Decode ``srcs`` in one RunningTranslation, source i added before step ``joins[i]`` (in
    groups: those with equal steps join together); the hypotheses by source, and the largest
    cache length seen."""
    running = RunningTranslation(model, cfg, torch.device("cpu"))
    ids: dict[int, int] = {}
    out: dict[int, list] = {}
    step, longest = 0, 0
    while len(out) < len(srcs):
        group = [i for i, at in enumerate(joins) if at == step]
        if group:
            ids.update(zip(running.add([srcs[i] for i in group]), group))
        if running.active:
            for sid, hyps in running.step().items():
                out[ids[sid]] = hyps
            longest = max(longest, running.cache.length if running.cache is not None else 0)
        step += 1
    return [out[i] for i in range(len(srcs))], longest


def assert_same(got, want):
    for g, w in zip(got, want):
        assert [h.tokens for h in g] == [h.tokens for h in w]
        assert [h.finished for h in g] == [h.finished for h in w]
        assert [h.score for h in g] == pytest.approx([h.score for h in w], abs=1e-5)
        assert [h.log_prob for h in g] == pytest.approx([h.log_prob for h in w], abs=1e-5)


@pytest.mark.parametrize(
    "beam, nbest, kw",
    [(1, 1, {}), (3, 1, {}), (4, 3, {"norm_first": True}), (2, 2, {"positional": "learned"})],
)
def test_sentences_joining_at_other_steps_decode_as_alone(beam, nbest, kw):
    model = tiny(**kw)
    cfg = DecodeConfig(beam=beam, nbest=nbest, max_len_a=1.0, max_len_b=3, alpha=0.6)
    srcs = sources(7)
    alone = [translate_ids(model, [s], cfg)[0] for s in srcs]
    got, _ = run_joining(model, cfg, srcs, joins=[0, 0, 1, 3, 3, 4, 9])
    assert_same(got, alone)


def test_min_len_forced_eos_and_late_stopping_count_each_sentences_own_tokens():
    model = tiny(seed=3)
    cfg = DecodeConfig(
        beam=3,
        nbest=2,
        max_len_a=0.0,
        max_len_b=6,
        min_len=4,
        forced_eos=True,
        bad_ids=(5,),
        early_stopping=False,
        length_penalty="power",
        alpha=1.0,
    )
    srcs = sources(5, seed=4)
    alone = [translate_ids(model, [s], cfg)[0] for s in srcs]
    got, _ = run_joining(model, cfg, srcs, joins=[0, 2, 2, 3, 5])
    assert_same(got, alone)
    assert all(len(h.tokens) >= 4 and 5 not in h.tokens for hyps in got for h in hyps)


@pytest.mark.parametrize("beam", [1, 3])
def test_repetition_controls_read_only_each_joined_sentences_own_tokens(beam):
    """A row that joins later is left-filled with BOS: the n-gram ban must not read the fill
    (it would ban BOS after BOS where the sentence alone has one token so far)."""
    model = tiny(seed=8)
    cfg = DecodeConfig(beam=beam, nbest=beam, max_len_a=1.0, max_len_b=4, no_repeat_ngram_size=2,
                       repetition_penalty=1.3)
    srcs = sources(8, seed=9)
    alone = [translate_ids(model, [s], cfg)[0] for s in srcs]
    got, _ = run_joining(model, cfg, srcs, joins=[0, 1, 2, 2, 3, 5, 6, 8])
    assert_same(got, alone)


def test_an_ensemble_takes_joining_sentences_too():
    model = Ensemble([tiny(seed=5), tiny(seed=6, norm_first=True)]).eval()
    cfg = DecodeConfig(beam=2, max_len_a=1.0, max_len_b=2)
    srcs = sources(4, seed=7)
    alone = [translate_ids(model, [s], cfg)[0] for s in srcs]
    got, _ = run_joining(model, cfg, srcs, joins=[0, 1, 4, 5])
    assert_same(got, alone)


def test_the_cache_drops_positions_once_the_oldest_sentences_have_left():
    """A stream of sentences, each joining after the last: the cache never holds much more
    than the longest sentence's positions, however long the stream runs."""
    model = tiny(seed=8)
    cfg = DecodeConfig(beam=2, max_len_a=0.0, max_len_b=6)
    srcs = sources(12, seed=9)
    alone = [translate_ids(model, [s], cfg)[0] for s in srcs]
    got, longest = run_joining(model, cfg, srcs, joins=[3 * i for i in range(12)])
    assert_same(got, alone)
    assert longest <= 2 * 7  # 12 sentences over ~40 steps: positions were dropped


def test_dropped_sentences_leave_and_the_others_are_unchanged():
    model = tiny(seed=10)
    cfg = DecodeConfig(beam=3, max_len_a=0.0, max_len_b=8)
    srcs = sources(4, seed=11)
    alone = [translate_ids(model, [s], cfg)[0] for s in srcs]
    running = RunningTranslation(model, cfg, torch.device("cpu"))
    ids = running.add(srcs)
    running.step()
    running.drop([ids[1], ids[2]])
    assert running.active == 2 and running.cache.layers[0].self_k.size(0) == 2 * 3
    out = {}
    while running.active:
        out.update(running.step())
    assert set(out) == {ids[0], ids[3]}
    assert_same([out[ids[0]], out[ids[3]]], [alone[0], alone[3]])
    running.drop([ids[0]])  # an ended sentence: nothing to do
    assert running.cache is None


def test_cross_attention_narrows_to_the_longest_source_left_once_the_longest_has_gone():
    """A running batch never empties under steady traffic: once the sentence with the longest
    source leaves, the padding it left in every row's cross-attention keys/values and memory
    mask is dropped, and the others decode as alone."""
    model = tiny(seed=14)
    cfg = DecodeConfig(beam=2, max_len_a=0.0, max_len_b=10)
    short = sources(3, seed=15)
    long = [5 + i % 20 for i in range(40)] + [2]
    alone = [translate_ids(model, [s], cfg)[0] for s in short]
    running = RunningTranslation(model, cfg, torch.device("cpu"))
    ids = running.add(short[:1])
    running.step()
    gone, *rest = running.add([long, *short[1:]])  # joins a running search: offsets
    running.step()
    assert running.cache.layers[0].cross_k.size(2) == len(long)
    running.drop([gone])
    width = max(len(s) for s in short)
    assert running.cache.layers[0].cross_k.size(2) == width
    assert running.cache.layers[0].cross_v.size(2) == width
    assert running.cache.memory_mask.size(-1) == width
    out = {}
    while running.active:
        out.update(running.step())
    assert_same([out[i] for i in (*ids, *rest)], alone)


def test_add_refuses_empty_sources():
    running = RunningTranslation(tiny(), DecodeConfig(), torch.device("cpu"))
    with pytest.raises(ValueError, match="non-empty"):
        running.add([[5, 2], []])


def test_rows_join_into_the_spare_rows_of_a_running_cache_without_a_copy():
    """Once rows have joined, each reorder leaves spare rows behind the cache's, and the next
    sentences' rows are written there: their join copies none of the running rows."""
    model = tiny(seed=12)
    cfg = DecodeConfig(beam=2, max_len_a=0.0, max_len_b=8)
    srcs = sources(3, seed=13)
    running = RunningTranslation(model, cfg, torch.device("cpu"))
    running.add(srcs[:1])
    running.step()
    running.add(srcs[1:2])  # the first join copies (no spare rows yet)
    running.step()
    before = [layer.self_k.data_ptr() for layer in running.cache.layers]
    running.add(srcs[2:])
    assert [layer.self_k.data_ptr() for layer in running.cache.layers] == before
    assert running.cache.layers[0].self_k.size(0) == 3 * 2
    assert not running.cache.layers[0].self_k[4:].any()  # the new rows' keys: zeros


class StubRows:
    """A stand-in cache that knows which sentence each row is (reordered with the beams)."""

    def __init__(self) -> None:
        self.sentence: list[int] = []

    def reorder(self, index):
        self.sentence = [self.sentence[i] for i in index.tolist()]
        return self

    def trim(self, n):
        return self


BOS, EOS, A = 1, 2, 3  # the stub vocabulary: 0 pad · 1 BOS · 2 EOS · 3 a


def dist(p_eos: float) -> list[float]:
    return [0.0, 0.0, p_eos, 1.0 - p_eos]


def run_stub(tables, joins, **search):
    """Beam search (beam 2) over a stub step: sentence ``name`` reads ``tables[name][prefix]``
    (EOS never, by default) and joins before step ``joins[name]``; its n-best lists by name."""

    def step(tokens, cache):  # a row's own prefix: what follows its last BOS
        rows = [row[len(row) - row[::-1].index(BOS) :] for row in tokens.tolist()]
        probs = [tables[s].get(tuple(r), dist(0.0)) for s, r in zip(cache.sentence, rows)]
        return torch.tensor(probs).log(), cache

    settings = SearchSettings(BOS, EOS, beam=2, **search)
    beam_search = SequenceGenerator(settings, BeamSearch(settings))
    cache, names, out, at = StubRows(), {}, {}, 0
    while len(out) < len(joins):
        for name in [name for name, when in joins.items() if when == at]:
            rows = 1 if not beam_search.active else 2
            names[beam_search.add(10)[0]] = name
            cache.sentence += [name] * rows
        if beam_search.active:
            cache = beam_search.step(step, cache)
            out.update((names[s], hyps) for s, hyps in beam_search.pop_done().items())
        at += 1
    return out


def assert_same_hyps(got, want):
    assert [h.tokens for h in got] == [h.tokens for h in want]
    assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-6)


def test_late_stopping_counts_each_joined_sentences_own_length():
    """Without early stopping a sentence goes on while its best live beam, over the penalty of
    its own length, can beat its finished ones. A sentence that joins at step 2, beside one
    that never ends, stops when it would alone: with the other's length it would go on and
    find another second best."""
    tables = {"never ends": {}, "stops": {(): dist(0.6), (A,): dist(0.6), (A, A): dist(0.99)}}
    kw = dict(alpha=1.0, penalty="power", nbest=2, early_stopping=False)
    alone = run_stub(tables, {"stops": 0}, **kw)["stops"]
    assert [h.tokens for h in alone] == [[], [A]]  # it stopped after 2 tokens
    assert_same_hyps(run_stub(tables, {"never ends": 0, "stops": 2}, **kw)["stops"], alone)


def test_min_len_counts_each_joined_sentences_own_tokens():
    tables = {"never ends": {}, "quick": {(): dist(0.9), (A,): dist(0.9), (A, A): dist(0.9)}}
    alone = run_stub(tables, {"quick": 0}, rules=Rules(min_len=2))["quick"]
    assert alone[0].tokens == [A, A]
    assert_same_hyps(run_stub(tables, {"never ends": 0, "quick": 4}, rules=Rules(min_len=2))["quick"], alone)
