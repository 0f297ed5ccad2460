"""Search with a stub model whose per-step probabilities are set by hand (fairseq's approach).

Vocabulary: 0 pad · 1 BOS · 2 EOS · 3 "a" · 4 "b". A table maps (sentence, prefix) to the next-token
distribution. The stub cache records the tokens each row has seen and is reordered by search;
every step asserts that it still matches the tokens search feeds, so a wrong ``reorder`` fails.
"""

from __future__ import annotations

import math

import pytest
import torch

from aiayn.decode import (
    DecodeConfig,
    Rules,
    SamplingConfig,
    SearchSettings,
    beam_search,
    filter_log_probs,
    greedy_search,
    sample,
)
from aiayn.decode.search import _top_candidates, _top_candidates_blocked, length_penalty
from aiayn.decode.step import force_prefix
from aiayn.errors import ConfigError

PAD, BOS, EOS, A, B = 0, 1, 2, 3, 4
V = 5
SAMPLING = SearchSettings(BOS, EOS, sampling=SamplingConfig())


pytestmark = pytest.mark.usefixtures("one_thread")


def dist(eos=0.0, a=0.0, b=0.0) -> list[float]:
    return [0.0, 0.0, eos, a, b]


class StubCache:
    """Per-row sentence id and the tokens seen so far; reorder() selects rows."""

    def __init__(self, sentence: torch.Tensor) -> None:
        self.sentence = sentence
        self.seen = torch.ones(len(sentence), 0, dtype=torch.long)
        self.reorders = 0

    def reorder(self, index: torch.Tensor) -> "StubCache":
        self.sentence = self.sentence[index]
        self.seen = self.seen[index]
        self.reorders += 1
        return self


def stub_step(tables: list[dict[tuple, list[float]]], default: list[float] | None = None):
    """A step function reading tables[sentence][prefix without BOS]."""
    default = default or dist(eos=1.0)

    def step(tokens, cache):
        assert torch.equal(cache.seen, tokens[:, :-1]), "cache out of sync with the beams"
        cache.seen = tokens.clone()
        rows = [tables[s].get(tuple(t[1:]), default) for s, t in zip(cache.sentence.tolist(), tokens.tolist())]
        return torch.tensor(rows).log(), cache

    return step


def run_beam(tables, beam, max_len=10, **kw):
    n = len(tables)
    cache = StubCache(torch.arange(n))  # one row per sentence: search expands it to the beams
    return beam_search(stub_step(tables), cache, n, max_len, SearchSettings(BOS, EOS, beam=beam, **kw))


def run_greedy(tables, max_len=10, **kw):
    cache = StubCache(torch.arange(len(tables)))
    return greedy_search(stub_step(tables), cache, len(tables), max_len, SearchSettings(BOS, EOS, **kw))


# "a" looks best first, but only "b" leads to a confident EOS.
TRAP = {(): dist(a=0.6, b=0.4), (A,): dist(eos=0.34, a=0.33, b=0.33), (B,): dist(eos=0.9, a=0.1)}


def test_greedy_exact_tokens_and_score():
    table = {(): dist(eos=0.1, a=0.6, b=0.3), (A,): dist(eos=0.2, a=0.1, b=0.7),
             (A, B): dist(eos=0.9, a=0.1)}
    (hyp,) = run_greedy([table])
    assert hyp.tokens == [A, B] and hyp.finished
    assert hyp.log_prob == pytest.approx(math.log(0.6) + math.log(0.7) + math.log(0.9), abs=1e-6)


def test_beam_finds_a_better_sequence_than_greedy():
    (g,) = run_greedy([TRAP])
    assert g.tokens == [A] and g.log_prob == pytest.approx(math.log(0.6 * 0.34), abs=1e-6)
    (best,) = run_beam([TRAP], beam=2, alpha=0.0)[0]
    assert best.tokens == [B] and best.log_prob == pytest.approx(math.log(0.4 * 0.9), abs=1e-6)
    assert best.log_prob > g.log_prob


def test_beam_scores_use_the_gnmt_length_penalty():
    (best,) = run_beam([TRAP], beam=2, alpha=0.6)[0]
    lp = ((5 + 2) / 6) ** 0.6  # two tokens: "b" and EOS
    assert best.score == pytest.approx(math.log(0.36) / lp, abs=1e-6)
    assert length_penalty(2, 0.6) == pytest.approx(lp)


def test_nbest_returns_sorted_hypotheses_with_exact_scores():
    hyps = run_beam([TRAP], beam=2, alpha=0.0, nbest=2)[0]
    assert [h.tokens for h in hyps] == [[B], [A]]
    assert [h.score for h in hyps] == pytest.approx([math.log(0.36), math.log(0.6 * 0.34)], abs=1e-6)


def test_length_normalisation_changes_the_winner():
    # [] (EOS at once): P = 0.4. [a, b]: P = 0.6·0.6·0.95 = 0.342, but per token much better.
    table = {(): dist(eos=0.4, a=0.6), (A,): dist(a=0.4, b=0.6), (A, B): dist(eos=0.95, a=0.05),
             (A, A): dist(eos=0.5, b=0.5)}
    raw = run_beam([table], beam=2, penalty="none")[0][0]
    avg = run_beam([table], beam=2, penalty="average")[0][0]
    assert raw.tokens == [] and raw.score == pytest.approx(math.log(0.4), abs=1e-6)
    assert avg.tokens == [A, B] and avg.score == pytest.approx(math.log(0.342) / 3, abs=1e-6)


def random_table(seed: int, depth: int = 6) -> dict:
    """Every prefix up to ``depth`` gets random probabilities (EOS included)."""
    g = torch.Generator().manual_seed(seed)
    table, frontier = {}, [()]
    for _ in range(depth):
        nxt = []
        for prefix in frontier:
            p = torch.rand(3, generator=g) + 0.05
            table[prefix] = dist(*(p / p.sum()).tolist())
            nxt += [prefix + (A,), prefix + (B,)]
        frontier = nxt
    return table


def test_beam_one_equals_greedy():
    tables = [random_table(s) for s in range(12)]
    greedy = run_greedy(tables, max_len=5)
    beam = run_beam(tables, beam=1, max_len=5, alpha=0.0)
    for g, (b,) in zip(greedy, beam):
        assert b.tokens == g.tokens and b.finished == g.finished
        assert b.log_prob == pytest.approx(g.log_prob, abs=1e-5)


def test_a_sentence_decodes_the_same_alone_and_in_a_batch():
    tables = [random_table(s) for s in range(8)]
    together = run_beam(tables, beam=3, max_len=6, nbest=3)
    for table, hyps in zip(tables, together):
        alone = run_beam([table], beam=3, max_len=6, nbest=3)[0]
        assert [h.tokens for h in hyps] == [h.tokens for h in alone]
        assert [h.score for h in hyps] == pytest.approx([h.score for h in alone], abs=1e-6)


def test_max_len_cuts_hypotheses_per_sentence():
    never_ends = dist(a=0.5, b=0.5)
    tables = [{}, {}]
    cache = StubCache(torch.arange(2))
    step = stub_step(tables, default=never_ends)
    out = beam_search(step, cache, 2, torch.tensor([3, 5]),
                      SearchSettings(BOS, EOS, beam=2, alpha=0.0, nbest=2))
    assert [len(h.tokens) for h in out[0]] == [3, 3] and [len(h.tokens) for h in out[1]] == [5, 5]
    assert not any(h.finished for hs in out for h in hs)
    assert out[1][0].score == pytest.approx(5 * math.log(0.5), abs=1e-6)
    greedy = greedy_search(step, StubCache(torch.arange(2)), 2, torch.tensor([3, 5]),
                           SearchSettings(BOS, EOS))
    assert [len(h.tokens) for h in greedy] == [3, 5]


def test_min_len_forbids_early_eos():
    table = {(): dist(eos=0.9, a=0.1), (A,): dist(eos=0.9, a=0.1), (A, A): dist(eos=0.9, a=0.1)}
    (hyp,) = run_greedy([table], rules=Rules(min_len=2))
    assert hyp.tokens == [A, A] and hyp.finished
    (best,) = run_beam([table], beam=2, rules=Rules(min_len=2))[0]
    assert best.tokens == [A, A]


def test_the_first_step_runs_one_row_per_sentence_then_the_beams():
    """Beams start identical, so the first step is fed B rows; the cache is then expanded to B·k."""
    fed = []
    step = stub_step([random_table(1), random_table(2)])

    def counting(tokens, cache):
        fed.append(tuple(tokens.shape))
        return step(tokens, cache)

    cache = StubCache(torch.arange(2))
    beam_search(counting, cache, 2, 4, SearchSettings(BOS, EOS, Rules(min_len=4), beam=3))
    assert fed == [(2, 1), (6, 2), (6, 3), (6, 4)]


def test_finished_sentences_leave_the_batch():
    quick = {(): dist(eos=1.0)}
    slow = random_table(3)
    cache = StubCache(torch.arange(2))
    beam_search(stub_step([quick, slow]), cache, 2, 6, SearchSettings(BOS, EOS, beam=2))
    assert cache.sentence.tolist() == [1, 1]  # only the slow sentence's beams remain


@pytest.mark.parametrize("vocab", [8000, 8003, 257])
def test_blocked_top_candidates_equal_the_full_ranking(vocab):
    """The two-stage top-k of large vocabularies picks exactly what ranking all k·V sums picks:
    same scores, rows and tokens, also with dead (-inf) beams and a forbidden token."""
    g = torch.Generator().manual_seed(vocab)
    b, k = 6, 5
    for trial in range(6):
        lp = torch.log_softmax(3 * torch.randn(b * k, vocab, generator=g), -1)
        scores = 5 * torch.randn(b, k, generator=g)
        if trial % 2 == 0:
            scores[:, 1:] = float("-inf")  # the first step: only beam 0 is alive
        lp[:, EOS] = float("-inf") if trial % 3 == 0 else lp[:, EOS]
        total = (scores[:, :, None] + lp.view(b, k, vocab)).view(b, k * vocab)
        want_scores, flat = total.topk(2 * k, dim=-1)
        got = _top_candidates_blocked(scores, lp, 2 * k)
        assert torch.equal(got[0], want_scores)
        assert torch.equal(got[1], torch.arange(b)[:, None] * k + flat // vocab)
        assert torch.equal(got[2], flat % vocab)
    # The first step ranks one row per sentence (k = 1) for the 2k candidates of k = 5 beams;
    # with fewer blocks than candidates (vocab 257: 5 blocks) the full ranking is used.
    lp = torch.log_softmax(3 * torch.randn(b, vocab, generator=g), -1)
    first = torch.zeros(b, 1)  # the scores of one live row per sentence
    want_scores, flat = lp.topk(2 * k, dim=-1)
    got = _top_candidates(first, lp, 2 * k)
    assert torch.equal(got[0], want_scores)
    assert torch.equal(got[1], torch.arange(b)[:, None].expand(b, 2 * k))
    assert torch.equal(got[2], flat)
    # Fewer extensions than candidates (V = 3 < 2k): the rest are -inf on the sentence's own row.
    scores, rows, tokens = _top_candidates(first, lp[:, :3], 2 * k)
    assert torch.isinf(scores[:, 3:]).all() and torch.equal(scores[:, :3], lp[:, :3].topk(3).values)
    assert torch.equal(rows, torch.arange(b)[:, None].expand(b, 2 * k))


def test_filter_log_probs_top_k_and_top_p():
    lp = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    k2 = filter_log_probs(lp, top_k=2).exp()
    assert k2[0].tolist() == pytest.approx([0.625, 0.375, 0.0, 0.0])
    p = filter_log_probs(lp, top_p=0.8).exp()  # 0.5 + 0.3 reach 0.8: the rest goes
    assert p[0].tolist() == pytest.approx([0.625, 0.375, 0.0, 0.0])
    p = filter_log_probs(lp, top_p=0.81).exp()
    assert p[0].tolist() == pytest.approx([0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0])
    t = filter_log_probs(lp, temperature=0.5).exp()
    expected = torch.tensor([0.5, 0.3, 0.15, 0.05]) ** 2
    assert t[0].tolist() == pytest.approx((expected / expected.sum()).tolist())
    with pytest.raises(ValueError):
        filter_log_probs(lp, temperature=0.0)


def test_sampling_with_top_k_1_is_greedy_and_seeded_sampling_repeats():
    tables = [random_table(s) for s in range(6)]
    greedy = run_greedy(tables, max_len=5)
    prefix = torch.full((6, 1), BOS)
    top1 = sample(stub_step(tables), StubCache(torch.arange(6)), prefix, 5,
                  SearchSettings(BOS, EOS, sampling=SamplingConfig(top_k=1)))
    assert [h.tokens for h in top1] == [h.tokens for h in greedy]
    assert [h.log_prob for h in top1] == pytest.approx([h.log_prob for h in greedy], abs=1e-5)
    runs = [sample(stub_step(tables), StubCache(torch.arange(6)), prefix, 5, SAMPLING,
                   rng=torch.Generator().manual_seed(7)) for _ in range(2)]
    assert [h.tokens for h in runs[0]] == [h.tokens for h in runs[1]]


def test_sampling_follows_the_distribution():
    table = {(): dist(eos=0.0, a=0.7, b=0.3)}
    n = 4000
    out = sample(stub_step([table] * 1, default=dist(eos=1.0)), StubCache(torch.zeros(n, dtype=torch.long)),
                 torch.full((n, 1), BOS), 1, SAMPLING, rng=torch.Generator().manual_seed(0))
    share_a = sum(h.tokens == [A] for h in out) / n
    assert abs(share_a - 0.7) < 0.03


def test_decode_config_validates():
    with pytest.raises(ConfigError):
        DecodeConfig(beam=0)
    with pytest.raises(ConfigError):
        DecodeConfig(beam=2, nbest=3)


# ---- the rules of Hugging Face's generate() (imported Marian models, issue #44) ----------------


def test_power_length_penalty_is_length_to_alpha():
    assert length_penalty(4, 0.5, "power") == pytest.approx(2.0)
    assert length_penalty(7, 0.0, "power") == pytest.approx(1.0)


def test_suppressed_tokens_are_never_output_and_keep_their_mass_unless_renormalized():
    table = {(): dist(eos=0.1, a=0.6, b=0.3), (B,): dist(eos=0.9, a=0.1)}
    (hyp,) = run_greedy([table], rules=Rules(bad_ids=(A,)))
    assert hyp.tokens == [B] and hyp.log_prob == pytest.approx(math.log(0.3) + math.log(0.9))
    (hyp,) = run_greedy([table], rules=Rules(bad_ids=(A,), renormalize=True))
    assert hyp.log_prob == pytest.approx(math.log(0.3 / 0.4) + math.log(0.9 / 0.9))


def test_forced_eos_ends_a_hypothesis_at_the_cap_with_log_prob_zero():
    table = {(): dist(eos=0.1, a=0.9), (A,): dist(eos=0.1, a=0.9), (A, A): dist(eos=0.1, a=0.9)}
    (hyp,) = run_greedy([table], max_len=3, rules=Rules(forced_eos=True))
    assert hyp.tokens == [A, A] and hyp.finished
    assert hyp.log_prob == pytest.approx(2 * math.log(0.9))  # the forced EOS adds 0
    rules = Rules(forced_eos=True)
    (best,) = run_beam([table], 2, max_len=3, rules=rules, early_stopping=False)[0]
    assert best.tokens == [A, A] and best.finished
    assert best.score == pytest.approx(2 * math.log(0.9) / ((5 + 3) / 6) ** 0.6)


def test_without_early_stopping_beam_search_goes_on_while_a_live_beam_can_win():
    """Two quick endings fill a beam of 2; early stopping keeps the better of them, the Hugging
    Face heuristic goes on (the live beam's score over its length still beats the worse) and
    finds the long confident ending."""
    table = {
        (): dist(eos=0.3, a=0.7),
        (A,): dist(eos=0.3, a=0.7),
        (A, A): dist(eos=0.01, a=0.99),
        (A, A, A): dist(eos=0.99, a=0.01),
    }
    early = run_beam([table], 2, alpha=1.0, penalty="power")[0][0]
    late = run_beam([table], 2, alpha=1.0, penalty="power", early_stopping=False)[0][0]
    assert early.tokens == [A] and late.tokens == [A, A, A]


# ---- every rule under sampling (they used to apply to greedy and beam search only) ------------


def run_sample(tables, max_len=6, n=1, rules=Rules(), top_k=0, seed=0, step=None):
    """``sample`` over the stub step (one row per table), seeded."""
    settings = SearchSettings(BOS, EOS, rules, sampling=SamplingConfig(top_k=top_k, seed=seed))
    step = step or stub_step(tables, default=dist(eos=0.05, a=0.9, b=0.05))
    cache = StubCache(torch.arange(len(tables)))
    return sample(step, cache, torch.full((len(tables), 1), BOS), max_len, settings)


def test_sampling_never_draws_a_banned_id():
    likes_a = [{} for _ in range(50)]  # every prefix: "a" at 0.9
    assert sum(A in h.tokens for h in run_sample(likes_a)) > 40  # the rule is what stops it
    assert not any(A in h.tokens for h in run_sample(likes_a, rules=Rules(bad_ids=(A,))))


def test_sampling_keeps_min_len():
    quick = [{} for _ in range(50)]
    step = stub_step(quick, default=dist(eos=0.98, a=0.01, b=0.01))
    assert sum(h.tokens == [] for h in run_sample(quick, step=step)) > 40
    hyps = run_sample(quick, step=step, rules=Rules(min_len=3))
    assert all(len(h.tokens) >= 3 for h in hyps)
    assert all(h.finished for h in hyps)  # and then EOS, almost surely taken


def test_sampling_applies_the_repetition_penalty():
    """top-k 1: the draw is the best token after the rules. "a" (0.5) beats "b" (0.45) until
    it is in the row: log 0.5 · 2 < log 0.45."""
    table = [{}]
    step = stub_step(table, default=dist(eos=0.05, a=0.5, b=0.45))
    (plain,) = run_sample(table, max_len=3, top_k=1, step=step)
    assert plain.tokens == [A, A, A]
    (hyp,) = run_sample(table, max_len=3, top_k=1, step=step, rules=Rules(repetition_penalty=2.0))
    assert hyp.tokens == [A, B, A]
    want = math.log(0.5) + math.log(0.45) + 2 * math.log(0.5)  # "a" again, penalised
    assert hyp.log_prob == pytest.approx(want, abs=1e-5)


def test_sampling_never_repeats_a_banned_ngram():
    rows = [{} for _ in range(20)]
    for hyp in run_sample(rows, max_len=8, rules=Rules(no_repeat_ngram_size=2)):
        pairs = list(zip([BOS, *hyp.tokens], hyp.tokens))
        assert len(pairs) == len(set(pairs)), hyp.tokens
    plain = run_sample(rows, max_len=8)
    assert any(len(set(zip(h.tokens, h.tokens[1:]))) < len(h.tokens) - 1 for h in plain)


def test_sampling_ends_with_forced_eos_at_the_cap():
    rows = [{} for _ in range(20)]
    step = stub_step(rows, default=dist(eos=0.001, a=0.5, b=0.499))
    assert not any(h.finished for h in run_sample(rows, max_len=3, step=step))
    hyps = run_sample(rows, max_len=3, step=step, rules=Rules(forced_eos=True))
    assert all(h.finished and len(h.tokens) == 2 for h in hyps)


def test_sampling_follows_a_forced_prefix():
    rows = [{} for _ in range(20)]
    forced = torch.tensor([[B, B, -1]]).expand(20, 3)  # "b b", then sampling goes on
    step, cache = force_prefix(stub_step(rows, default=dist(eos=0.05, a=0.9, b=0.05)),
                               StubCache(torch.arange(20)), forced)
    settings = SearchSettings(BOS, EOS, sampling=SamplingConfig(seed=0))
    hyps = sample(step, cache, torch.full((20, 1), BOS), 6, settings)
    assert all(h.tokens[:2] == [B, B] for h in hyps)
    assert sum(h.tokens[2:3] == [A] for h in hyps) > 15  # after it, the model's own choice
