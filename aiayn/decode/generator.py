"""The decode loop: one :class:`SequenceGenerator` drives greedy search, beam search and
sampling over a step function (fairseq's ``sequence_generator.py``).

Shape legend: B sentences · b active sentences · k live rows per sentence · N rows fed to the
model (b, or b·k) · t tokens so far (BOS or the prompt first) · V vocab.

Search never sees the model. It sees a *step function* ``step(tokens, cache) -> (log_probs,
cache)``: ``tokens`` (N, t) are all tokens so far (a cached model reads only those it has not seen),
``log_probs`` (N, V) are the next-token log-probabilities, a fresh tensor (search may write into
it). The cache is opaque except for ``cache.reorder(index)``, called whenever rows are selected
(beams move, finished sentences leave), and may be None. This is fairseq's split, and it is what
the tests exercise with hand-set probabilities.

Each step the loop runs the step function, applies the rules (:class:`~aiayn.decode.rules.Rules`)
to the log-probabilities, asks the strategy (:mod:`aiayn.decode.search`) for candidates, ends
the hypotheses whose candidate is EOS, continues the k best others, and lets the sentences that
are done leave. Sentences can also join between steps (the server's step-level batching);
:func:`greedy_search`, :func:`beam_search` and :func:`sample` are loops over it.

Lengths: ``max_len`` counts generated tokens, EOS included; a hypothesis that reaches it without EOS
ends there (as Hugging Face ``max_new_tokens`` does). ``min_len`` (a rule) forbids EOS before
that many.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from aiayn.decode.rules import Rows
from aiayn.decode.search import (
    BeamSearch,
    Candidates,
    GreedySearch,
    Hypothesis,
    Sampling,
    Search,
    SearchSettings,
    StepFn,
)

__all__ = ["SequenceGenerator", "greedy_search", "beam_search", "sample"]


@dataclass
class _Beams:
    """The live state of the search over b still-active sentences.

    Sentences may join later (:meth:`SequenceGenerator.add`): their rows of ``tokens`` are
    filled on the left (with BOS, never read) up to the common width, so each row's last column
    is the token the next step feeds. A sentence that has generated g tokens holds them in the
    last g columns of its rows.
    """

    tokens: Tensor  # (b·k, t) every hypothesis so far, BOS (or the prompt) first
    scores: Tensor  # (b, k) cumulative log-probabilities (float32)
    sentence: Tensor  # (b,) id of each active sentence (CPU)

    def select(self, keep: Tensor) -> _Beams:
        """The sentences at positions ``keep`` (b',) of the CPU, in that order."""
        beam = self.scores.size(1)
        on_device = keep.to(self.tokens.device, non_blocking=True)
        tokens = self.tokens.view(-1, beam, self.tokens.size(1))[on_device].flatten(0, 1)
        return _Beams(tokens, self.scores[on_device], self.sentence[keep])

    def concat(self, other: _Beams) -> _Beams:
        """Both states' sentences as one (same rows per sentence and width)."""
        return _Beams(
            torch.cat([self.tokens, other.tokens]),
            torch.cat([self.scores, other.scores]),
            torch.cat([self.sentence, other.sentence]),
        )


@dataclass
class _Active:
    """Host-side view of the active sentences at one step, in the order of their rows: no
    tensor is read back for them."""

    ids: list[int]
    generated: list[int]  # tokens each had before this step
    caps: list[int]  # each one's max_len


# Leading columns no sentence reads that the loop lets pile up before it drops them.
TRIM_AT = 8


class SequenceGenerator:
    """The decode loop, as an object that sentences join and leave between steps.

    ``add`` starts sentences (each with its own max_len) and returns their ids; ``step`` runs
    one decoder step for all of them; ``pop_done`` hands out the n-best lists of the sentences
    that have ended; ``drop`` removes sentences (their client went away). The server's
    step-level batching (aiayn/serve/batching.py) adds and drops sentences between steps.

    Sentences never mix: each has its own k rows, and the hypotheses of a sentence are the same
    whether it decodes alone, in a batch or joins one that is running (tested). A sentence
    added before the first step runs one row at that step (its k beams are still the same); one
    that joins a running search comes with k rows of which only the first is alive (score 0,
    the others -inf), which picks the same candidates. ``min_len`` and ``max_len`` count the
    tokens each sentence has generated. The cache, given to every ``step`` and ``drop``, follows
    the rows with ``cache.reorder(index)``; after sentences that joined later have left the
    oldest, ``cache.trim(n)`` drops the first n positions, which no remaining row reads.
    """

    def __init__(self, settings: SearchSettings, search: Search, device: Any = None) -> None:
        self.settings, self.search, self.device = settings, search, device
        self.steps = 0  # decoder steps run so far
        self.state: _Beams | None = None
        self.finished: dict[int, list[Hypothesis]] = {}  # by sentence id, active ones
        self._ended: dict[int, list[Hypothesis]] = {}  # n-best lists not yet popped
        self._next_id = 0
        self._begin = 1  # tokens every row starts with: BOS, or the prompt given to add()
        # By id: the step each active sentence joined at and its max_len; the ids in row order
        self._ids: list[int] = []
        self._start: dict[int, int] = {}
        self._cap: dict[int, int] = {}

    @property
    def active(self) -> int:
        """Sentences still searching."""
        return 0 if self.state is None else self.state.sentence.numel()

    def add(self, max_len: int | Tensor, n: int = 1, prompt: Tensor | None = None) -> list[int]:
        """Start ``n`` sentences (``max_len``: an int or (n,) caps); returns their ids. Their
        rows follow those of the sentences already there (the cache must get theirs likewise).
        ``prompt`` (n, t0): what their rows start with instead of BOS, for a first add only."""
        lengths = _as_lengths(max_len, n).tolist()
        ids = list(range(self._next_id, self._next_id + n))
        self._next_id += n
        for i, cap in zip(ids, lengths):
            self.finished[i], self._start[i], self._cap[i] = [], self.steps, cap
        k = 1 if self.state is None else self.state.scores.size(1)  # rows per sentence now
        if prompt is not None:
            if self.state is not None or self.steps:
                raise ValueError("a prompt starts a search: add() it first")
            tokens, self._begin = prompt.to(self.device), prompt.size(1)
        else:
            width = 1 if self.state is None else self.state.tokens.size(1)
            bos = self.settings.bos_id
            tokens = torch.full((n * k, width), bos, dtype=torch.long, device=self.device)
        scores = torch.full((n, k), float("-inf"), device=self.device)
        scores[:, 0] = 0.0  # k identical rows: only the first is alive
        new = _Beams(tokens, scores, torch.tensor(ids))
        self.state = new if self.state is None else self.state.concat(new)
        self._ids += ids
        return ids

    @torch.no_grad()
    def step(self, step: StepFn, cache: Any) -> Any:
        """One decoder step for every active sentence; returns the cache (reordered to the rows
        that go on; left as it is when no sentence is left)."""
        state = self.state
        if state is None:
            raise ValueError("no sentence to search: add() some first")
        active = _Active(
            self._ids,
            [self.steps - self._start[s] for s in self._ids],
            [self._cap[s] for s in self._ids],
        )
        log_probs, cache = step(state.tokens, cache)
        rows = Rows(state.tokens, self.settings.eos_id, active.generated, active.caps, self._begin)
        log_probs = self.settings.rules.apply(log_probs, rows)
        cands = self.search.step(log_probs, state.scores)
        room = [len(self.finished[s]) < self.search.beam for s in active.ids]  # before endings
        k, b = self.search.beam, state.scores.size(0)
        top = cands.scores[:, :k]
        is_eos = (cands.tokens[:, :k] == self.settings.eos_id) & (top > float("-inf"))  # (b, k)
        before = state
        state, moved = self._advance(before, cands)
        dead = (state.scores == float("-inf")).all(1)  # (b,): no live beam left
        flags = torch.cat([dead, is_eos.view(-1)]).tolist()  # the step's one host-device sync
        self._finish(before, cands, active, flags[b:])
        self.steps += 1
        done = self._done(state, active, room, flags[:b])
        keep = [i for i, d in enumerate(done) if not d]
        for i in (i for i, d in enumerate(done) if d):
            self._end(active.ids[i])
        if not keep:
            self.state, self._ids = None, []
            return cache
        if len(keep) == len(done) and not self.search.moves_rows:
            self.state = state  # every row goes on where it was: the cache stays as it is
            return cache
        if len(keep) < len(done):  # sentences leave: one small copy to the device
            kept = torch.tensor(keep)
            k = state.scores.size(1)
            moved = moved.view(-1, k)[kept.to(moved.device, non_blocking=True)].reshape(-1)
            state, self._ids = state.select(kept), [active.ids[i] for i in keep]
        self.state = state
        return self._follow(cache, moved)

    def _finish(
        self, state: _Beams, cands: Candidates, active: _Active, is_eos: list[bool]
    ) -> None:
        """Move EOS candidates ranked among the first k of their sentence (``is_eos``: per
        sentence and rank, flattened, on the host) into ``finished``.

        Host-device syncs: none on a step without EOS candidates, two on one with them, whatever
        their number (their scores and tokens are each copied at once).
        """
        k = self.search.beam
        where = [p for p, e in enumerate(is_eos) if e]
        if not where:
            return
        device = cands.scores.device
        i = torch.tensor([p // k for p in where]).to(device, non_blocking=True)
        j = torch.tensor([p % k for p in where]).to(device, non_blocking=True)
        scores = cands.scores[i, j].tolist()
        rows = state.tokens[cands.rows[i, j]].tolist()  # (m, t)
        for at, log_prob, row in zip((p // k for p in where), scores, rows):
            n = active.generated[at]
            rank = self.search.rank(log_prob, n + 1)  # its tokens and this EOS
            self.finished[active.ids[at]].append(
                Hypothesis(row[len(row) - n :], rank, log_prob, True)
            )

    def _advance(self, state: _Beams, cands: Candidates) -> tuple[_Beams, Tensor]:
        """Continue with the k best non-EOS candidates; return the new state and their source
        rows. An EOS candidate continues only where a sentence has fewer than k others (greedy
        search and sampling: one candidate), as a dead row (-inf).

        Shape: candidates (b, n) -> tokens (b·k, t + 1), scores (b, k), rows (b·k,).
        """
        k, eos, width = self.search.beam, self.settings.eos_id, cands.tokens.size(1)
        if width == k:  # a candidate per row (greedy search, sampling): each row goes on
            rows, new, scores = cands.rows.view(-1), cands.tokens, cands.scores
        else:
            rank = torch.arange(width, device=cands.tokens.device).expand_as(cands.tokens)
            order = (rank + (cands.tokens == eos) * width).topk(k, dim=-1, largest=False).indices
            rows = cands.rows.gather(1, order).view(-1)  # (b·k,)
            new = cands.tokens.gather(1, order)  # (b, k)
            scores = cands.scores.gather(1, order)
        scores = scores.masked_fill(new == eos, float("-inf"))
        kept = state.tokens.index_select(0, rows) if self.search.moves_rows else state.tokens
        tokens = torch.cat([kept, new.view(-1, 1)], dim=1)  # (b·k, t + 1)
        return _Beams(tokens, scores, state.sentence), rows

    def _done(
        self, state: _Beams, active: _Active, room: list[bool], dead: list[bool]
    ) -> list[bool]:
        """Which active sentences are done: k finished hypotheses (and, without early
        stopping, no live beam that could beat them), no live beam left, or max_len reached
        (their live beams are then kept, cut, where the sentence had fewer than k finished
        hypotheses before this step, ``room``: they compete with this step's EOS endings);
        ``dead``: per sentence, no live beam left (read in the step's one sync)."""
        k, early = self.search.beam, self.search.early_stopping
        generated = [g + 1 for g in active.generated]  # this step's token included
        at_cap = [c <= g for c, g in zip(active.caps, generated)]
        cut = [i for i, cap in enumerate(at_cap) if cap and (room[i] or not early)]
        for i, hyps in zip(cut, self._cut(state, cut, generated)):
            self.finished[active.ids[i]].extend(hyps)
        full = [len(self.finished[s]) >= k for s in active.ids]
        if not early and any(full):
            best_live = state.scores[:, 0].tolist()  # live beams are ranked: 0 is best
            for i, (s, n) in enumerate(zip(active.ids, generated)):
                if full[i]:
                    worst = sorted(h.score for h in self.finished[s])[-k]  # k-th best finished
                    full[i] = self.search.rank(best_live[i], n) <= worst
        return [cap or d or f for cap, d, f in zip(at_cap, dead, full)]

    def _cut(self, state: _Beams, cut: list[int], generated: list[int]) -> list[list[Hypothesis]]:
        """The live beams of the sentences ``cut`` (they reached max_len) as hypotheses without
        EOS. Their beams come to the host in one copy of tokens and one of scores, whatever
        their number; the other sentences' stay on the device."""
        if not cut:
            return []
        k, t = state.scores.size(1), state.tokens.size(1)
        rows = state.tokens.reshape(-1, k, t)[cut].tolist()  # (c, k, t)
        scores = state.scores[cut].tolist()  # (c, k)
        out = []
        for beams, row, n in zip(rows, scores, (generated[i] for i in cut)):
            out.append(
                [
                    Hypothesis(r[t - n :], self.search.rank(s, n), s, False)
                    for r, s in zip(beams, row)
                    if s > float("-inf")
                ]
            )
        return out

    def drop(self, ids: Sequence[int], cache: Any) -> Any:
        """Remove sentences ``ids`` (ended or unknown ones are ignored); returns the cache."""
        state, gone = self.state, set(ids)
        for i in gone:
            for table in (self.finished, self._ended, self._start, self._cap):
                table.pop(i, None)
        if state is None or not gone & set(self._ids):
            return cache
        keep = [i for i, s in enumerate(self._ids) if s not in gone]
        if not keep:
            self.state, self._ids = None, []
            return cache
        k = state.scores.size(1)
        kept = torch.tensor(keep)
        rows = (kept[:, None] * k + torch.arange(k)).view(-1).to(state.tokens.device)
        self.state, self._ids = state.select(kept), [self._ids[i] for i in keep]
        return self._follow(cache, rows)

    def pop_done(self) -> dict[int, list[Hypothesis]]:
        """The sentences that have ended since the last call: id -> n-best list, best first."""
        ended, self._ended = self._ended, {}
        return ended

    def _end(self, sentence: int) -> None:
        del self._start[sentence], self._cap[sentence]
        hyps = self.finished.pop(sentence)
        self._ended[sentence] = sorted(hyps, key=lambda h: -h.score)[: self.settings.nbest]

    def _follow(self, cache: Any, rows: Tensor) -> Any:
        """Reorder the cache to ``rows``; drop the leading columns no sentence reads any more
        (those before the oldest remaining sentence joined), in the tokens and the cache, once
        there are enough of them."""
        assert self.state is not None
        if cache is not None:
            cache = cache.reorder(rows)
        width = self.state.tokens.size(1)
        read = self._begin - 1 + self.steps - min(self._start[s] for s in self._ids)
        unread = width - 1 - read
        # A trim copies the cache: done once the unread columns are a quarter of the width and
        # at least TRIM_AT, so that it is rare and the width stays within 4/3 of what is read
        if unread >= max(TRIM_AT, width // 4):
            self.state.tokens = self.state.tokens[:, unread:]
            if cache is not None:
                cache = cache.trim(unread)
        return cache


def _as_lengths(max_len: int | Tensor, n: int) -> Tensor:
    """An int or (n,) tensor of per-sentence caps -> LongTensor (n,) on the CPU."""
    lengths = torch.as_tensor(max_len, dtype=torch.long).cpu().expand(n).clone()
    if bool((lengths < 1).any()):
        raise ValueError(f"max_len must be >= 1, got {lengths.tolist()}")
    return lengths


def _run(
    generator: SequenceGenerator,
    step: StepFn,
    cache: Any,
    max_len: int | Tensor,
    n: int,
    prompt: Tensor | None = None,
) -> list[list[Hypothesis]]:
    """Add ``n`` sentences, step until all have ended; their n-best lists in order."""
    ids = generator.add(max_len, n, prompt)
    results: dict[int, list[Hypothesis]] = {}
    while generator.active:
        cache = generator.step(step, cache)
        results.update(generator.pop_done())
    return [results[i] for i in ids]


@torch.no_grad()
def greedy_search(
    step: StepFn,
    cache: Any,
    batch_size: int,
    max_len: int | Tensor,
    settings: SearchSettings,
    device: Any = None,
) -> list[Hypothesis]:
    """The most probable token at every step, for B sentences at once.

    Shape: max_len int or (B,) -> B hypotheses (score = log_prob). A sentence leaves the batch
    (``cache.reorder``) the step it ends.
    """
    generator = SequenceGenerator(settings, GreedySearch(), device)
    return [hyps[0] for hyps in _run(generator, step, cache, max_len, batch_size)]


@torch.no_grad()
def beam_search(
    step: StepFn,
    cache: Any,
    batch_size: int,
    max_len: int | Tensor,
    settings: SearchSettings,
    device: Any = None,
) -> list[list[Hypothesis]]:
    """Batched beam search of k = ``settings.beam``; returns the ``settings.nbest`` best
    hypotheses of every sentence, best first.

    Shape: the first step is fed (B, 1) tokens, one row per sentence (its k beams are still the
    same), and the cache must be built for those B rows; search then expands it to B·k rows with
    ``cache.reorder`` (each row repeated k times, in the order of its new beams). Later steps are
    fed (B·k, t) tokens (rows b·k … b·k + k-1 are sentence b's beams) and return (B·k, V). At each
    step the 2k best continuations of each sentence are taken (fairseq); EOS among the first k
    ends a hypothesis, scored log P / lp(|Y|); the k best others continue. A sentence is done
    when it has k finished hypotheses or reaches its max_len; done sentences leave the batch
    (``cache.reorder``). With ``early_stopping=False`` a sentence with k finished hypotheses goes
    on while its best live beam, scored over the length penalty of its current length, beats the
    worst of its k best finished ones (Hugging Face's heuristic).
    """
    generator = SequenceGenerator(settings, BeamSearch(settings), device)
    return _run(generator, step, cache, max_len, batch_size)


@torch.no_grad()
def sample(
    step: StepFn,
    cache: Any,
    prompt: Tensor,
    max_len: int,
    settings: SearchSettings,
    rng: torch.Generator | None = None,
) -> list[Hypothesis]:
    """Ancestral sampling (``settings.sampling``: temperature, top-k, top-p; its seed unless
    ``rng`` is given), for language models.

    Shape: prompt (B, t0) (BOS first) -> B hypotheses of at most ``max_len`` new tokens;
    log_prob is the log-probability of the sampled tokens after the rules, before the sampling
    filters.
    """
    if settings.sampling is None:
        raise ValueError("sample() needs settings.sampling (a SamplingConfig)")
    search = Sampling(settings.sampling, rng, prompt.device)
    generator = SequenceGenerator(settings, search, prompt.device)
    out = _run(generator, step, cache, max_len, prompt.size(0), prompt)
    return [hyps[0] for hyps in out]
