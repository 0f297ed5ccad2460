"""Search: greedy, batched beam search and sampling over a step function.

Shape legend: B sentences · k beam size · N rows fed to the model (B, or B·k) · t tokens so far
(BOS included) · V vocab.

Search never sees the model. It sees a *step function* ``step(tokens, cache) -> (log_probs,
cache)``: ``tokens`` (N, t) are all tokens so far (a cached model reads only those it has not seen),
``log_probs`` (N, V) are the next-token log-probabilities, a fresh tensor (search may write into
it). The cache is opaque except for
``cache.reorder(index)``, called whenever rows are selected (beams move, finished sentences leave),
and may be None. This is fairseq's split (``Search.step`` sees only log-probs), and it is what the
tests exercise with hand-set probabilities. Besides the step function, the cache and each
sentence's length cap, all three take one :class:`SearchSettings`: the special ids and how to
choose (:func:`aiayn.decode.translate.search_settings` makes it from a DecodeConfig).

Beam search is an object, :class:`BeamSearch`, that sentences can join between steps (the
server's step-level batching); :func:`beam_search` is a loop over it. A cache that rows join
also has ``trim(n)`` (see :class:`BeamSearch`).

Lengths: ``max_len`` counts generated tokens, EOS included; a hypothesis that reaches it without EOS
ends there (as Hugging Face ``max_new_tokens`` does). ``min_len`` forbids EOS before that many.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

StepFn = Callable[[Tensor, Any], tuple[Tensor, Any]]

__all__ = [
    "Hypothesis",
    "StepFn",
    "length_penalty",
    "greedy_search",
    "beam_search",
    "BeamSearch",
    "sample",
    "filter_log_probs",
    "Rules",
    "SearchSettings",
]


@dataclass
class Hypothesis:
    """One output sequence."""

    tokens: list[int]  # generated tokens, without BOS and without EOS
    score: float  # log_prob / length penalty: what hypotheses are ranked by
    log_prob: float  # sum of the model's token log-probabilities, EOS included when emitted
    finished: bool  # True when it ended with EOS, False when cut at max_len
    # (source token, output token) index pairs, when alignments were asked for (DecodeConfig)
    alignment: list[tuple[int, int]] | None = None


def length_penalty(length: int | Tensor, alpha: float, kind: str = "gnmt") -> float | Tensor:
    """The divisor of a hypothesis's log-probability; ``length`` counts tokens, EOS included.

    gnmt: ((5 + |Y|) / 6)^α (Wu et al. 2016, Eq. 14) · average: |Y| · none: 1 · power: |Y|^α
    (Hugging Face's ``length_penalty``).
    """
    if kind == "gnmt":
        return ((5.0 + length) / 6.0) ** alpha
    if kind == "power":
        return length**alpha * 1.0
    if kind == "average":
        return length * 1.0
    if kind == "none":
        return length * 0.0 + 1.0
    raise ValueError(f"length_penalty must be 'gnmt', 'average', 'none' or 'power', got {kind!r}")


def _as_lengths(max_len: int | Tensor, n: int) -> Tensor:
    """An int or (n,) tensor of per-sentence caps -> LongTensor (n,) on the CPU."""
    lengths = torch.as_tensor(max_len, dtype=torch.long).cpu().expand(n).clone()
    if bool((lengths < 1).any()):
        raise ValueError(f"max_len must be >= 1, got {lengths.tolist()}")
    return lengths


def _forbid_eos(log_probs: Tensor, eos_id: int, forbid: bool | Tensor) -> Tensor:
    """(N, V) -> (N, V) float32 with EOS at -inf when ``forbid`` (before ``min_len``): a bool
    for all rows, or an (N,) bool per row.

    In place when ``log_probs`` is already float32: step functions return fresh tensors.
    """
    log_probs = log_probs.float()
    if isinstance(forbid, Tensor):
        log_probs[:, eos_id].masked_fill_(forbid, float("-inf"))
    elif forbid:
        log_probs[:, eos_id] = float("-inf")
    return log_probs


@dataclass(frozen=True)
class Rules:
    """What search does to each step's log-probabilities before choosing (Hugging Face's logits
    processors, in their order): ``repetition_penalty`` on the tokens so far, ``no_repeat_ngram``
    bans, ``suppress`` tokens to -inf, EOS to -inf before ``min_len``, ``force_eos`` at a row's
    last allowed token (EOS at log-probability 0, everything else -inf), then ``renormalize``
    (log-softmax again)."""

    suppress: tuple[int, ...] = ()
    force_eos: bool = False
    renormalize: bool = False
    # Hugging Face's RepetitionPenaltyLogitsProcessor (Keskar et al. 2019): the score of every
    # token already in the row (BOS included, as HF's input_ids) times the penalty when negative,
    # over it when positive; 1 is off. Search sees log-probabilities, so a penalty > 1 always
    # lowers a repeated token (HF applies it to log-probabilities in beam search too).
    repetition_penalty: float = 1.0
    # Hugging Face's NoRepeatNGramLogitsProcessor: a token that would complete an n-gram already
    # in the row is banned (-inf); 0 is off. A row whose every allowed token would be banned
    # (a forced prefix token, a tiny vocabulary) keeps its scores instead of dying.
    no_repeat_ngram: int = 0


@dataclass(frozen=True)
class SearchSettings:
    """What greedy search, beam search and sampling are told besides the step function, the
    cache and each sentence's length cap: one object for the three (each reads its part)."""

    bos_id: int
    eos_id: int
    pad_id: int = 0  # fed to the rows that have ended while others go on (greedy, sampling)
    min_len: int = 0  # EOS is forbidden before this many generated tokens
    rules: Rules = Rules()  # the per-step adjustments of the log-probabilities (greedy, beam)
    # Beam search: k, the length penalty (length_penalty's alpha and kind), hypotheses returned,
    # and whether a sentence stops at k finished ones (BeamSearch)
    beam: int = 1
    alpha: float = 0.6
    penalty: str = "gnmt"
    nbest: int = 1
    early_stopping: bool = True
    # Sampling: temperature, top-k and nucleus filtering (filter_log_probs)
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0


def _apply_rules(
    log_probs: Tensor,
    eos_id: int,
    forbid: bool | Tensor,
    rules: Rules,
    last: Tensor | None,
    tokens: Tensor | None = None,
    bos_at: Tensor | None = None,
) -> Tensor:
    """(N, V) -> (N, V) float32 after ``rules``; ``last`` (N,) bool marks the rows whose next
    token is the last their cap allows; ``tokens`` (N, t) are each row's tokens so far, BOS
    first (what the repetition rules read); ``bos_at`` (N,): where each row's own BOS is, when
    rows that joined a running search are left-filled with BOS (None: at 0). In place when
    already float32 (step functions return fresh tensors)."""
    log_probs = log_probs.float()
    if tokens is not None and rules.repetition_penalty != 1.0:  # the fill repeats BOS: no change
        _penalize_repeats(log_probs, tokens, rules.repetition_penalty)
    if tokens is not None and rules.no_repeat_ngram > 0:
        _ban_repeated_ngrams(log_probs, tokens, rules.no_repeat_ngram, bos_at)
    log_probs = _forbid_eos(log_probs, eos_id, forbid)
    if rules.suppress:
        log_probs[:, list(rules.suppress)] = float("-inf")
    if rules.force_eos and last is not None:
        log_probs.masked_fill_(last[:, None], float("-inf"))
        log_probs[:, eos_id] = torch.where(last, 0.0, log_probs[:, eos_id])
    if rules.renormalize:
        log_probs = log_probs.log_softmax(-1)
    return log_probs


def _penalize_repeats(log_probs: Tensor, tokens: Tensor, penalty: float) -> None:
    """In place: the scores of the tokens in each row divided by ``penalty`` where positive,
    multiplied where negative (Hugging Face's RepetitionPenaltyLogitsProcessor).

    Shape: log_probs (N, V), tokens (N, t)."""
    score = log_probs.gather(1, tokens)  # (N, t); a repeated token gathers the same value
    score = torch.where(score < 0, score * penalty, score / penalty)
    log_probs.scatter_(1, tokens, score)


def _ban_repeated_ngrams(
    log_probs: Tensor, tokens: Tensor, n: int, bos_at: Tensor | None = None
) -> None:
    """In place: -inf for every token that would complete an n-gram already in its row (Hugging
    Face's NoRepeatNGramLogitsProcessor), unless that bans every token the row still allows.

    Shape: log_probs (N, V), tokens (N, t), bos_at (N,) or None; nothing is banned before the row
    holds an n-gram. The n-grams that start left of a row's own BOS (``bos_at``: the fill of a
    row that joined a running search) are not its own and ban nothing."""
    t = tokens.size(1)
    if t < n:
        return
    grams = tokens.unfold(1, n, 1)  # (N, t - n + 1, n): every n-gram of each row
    tail = tokens[:, t - n + 1 :]  # (N, n - 1): what the next token would extend
    match = (grams[:, :, :-1] == tail[:, None, :]).all(-1)  # (N, t - n + 1)
    if bos_at is not None:
        match &= torch.arange(t - n + 1, device=match.device) >= bos_at[:, None]
    hits = torch.zeros_like(log_probs).scatter_add_(1, grams[:, :, -1], match.float())
    banned = hits > 0  # (N, V)
    allowed = log_probs > float("-inf")
    keep = ~(allowed & ~banned).any(-1, keepdim=True)  # (N, 1): the ban would empty the row
    log_probs.masked_fill_(banned & ~keep, float("-inf"))


def _start(bos_id: int | Tensor, n: int, device: torch.device | str | None) -> Tensor:
    """BOS for n rows (or a given (n, t) prefix) -> (n, t) LongTensor."""
    if isinstance(bos_id, Tensor):
        return bos_id.to(device)
    return torch.full((n, 1), bos_id, dtype=torch.long, device=device)


# --------------------------------------------------------------------------------------------
# Greedy search
# --------------------------------------------------------------------------------------------


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

    Shape: max_len int or (B,) -> B hypotheses (score = log_prob). Finished rows keep being fed
    ``settings.pad_id`` until every row is done; ``settings.rules`` adjust each step's scores.
    """
    eos_id, pad_id, min_len, rules = (
        settings.eos_id,
        settings.pad_id,
        settings.min_len,
        settings.rules,
    )
    lengths = _as_lengths(max_len, batch_size).to(device)
    tokens = _start(settings.bos_id, batch_size, device)  # (B, 1)
    log_prob = torch.zeros(batch_size, device=device)
    done = torch.zeros(batch_size, dtype=torch.bool, device=device)
    ended, count = done.clone(), torch.zeros(batch_size, dtype=torch.long, device=device)
    for t in range(int(lengths.max())):
        log_probs, cache = step(tokens, cache)
        last = count >= lengths - 1 if rules.force_eos else None  # (B,) the cap's last token
        best, nxt = _apply_rules(log_probs, eos_id, t < min_len, rules, last, tokens).max(-1)
        tokens, done = _extend(tokens, nxt, best, log_prob, done, ended, count, eos_id, pad_id)
        done |= count >= lengths
        if bool(done.all()):
            break
    return _row_hypotheses(tokens[:, 1:], log_prob, ended, count)


def _extend(
    tokens: Tensor,
    nxt: Tensor,
    token_log_prob: Tensor,
    log_prob: Tensor,
    done: Tensor,
    ended: Tensor,
    count: Tensor,
    eos_id: int,
    pad_id: int,
) -> tuple[Tensor, Tensor]:
    """Append one token per row (pad where already done); update the (B,) tallies in place."""
    log_prob += token_log_prob.masked_fill(done, 0.0)
    count += (~done).long()
    nxt = nxt.masked_fill(done, pad_id)
    ended |= ~done & (nxt == eos_id)
    return torch.cat([tokens, nxt[:, None]], dim=1), done | ended  # (B, t + 1)


def _row_hypotheses(
    new: Tensor, log_prob: Tensor, ended: Tensor, count: Tensor
) -> list[Hypothesis]:
    """(B, t) generated tokens + tallies -> B hypotheses (EOS and later padding dropped)."""
    out = []
    for row, total, end, n in zip(new.tolist(), log_prob.tolist(), ended.tolist(), count.tolist()):
        out.append(Hypothesis(row[: n - 1 if end else n], total, total, end))
    return out


# --------------------------------------------------------------------------------------------
# Beam search
# --------------------------------------------------------------------------------------------


@dataclass
class _Beams:
    """The live state of beam search over b still-active sentences.

    Sentences may join later (:meth:`BeamSearch.add`): their rows of ``tokens`` are filled on
    the left (with BOS, never read) up to the common width, so each row's last column is the
    token the next step feeds. A sentence that has generated g tokens holds them in the last g
    columns of its rows.
    """

    tokens: Tensor  # (b·k, t) every hypothesis so far, BOS first
    scores: Tensor  # (b, k) cumulative log-probabilities (float32)
    sentence: Tensor  # (b,) id of each active sentence (CPU)

    def select(self, keep: Tensor) -> _Beams:
        """The sentences at positions ``keep`` (b',) of the CPU, in that order."""
        beam = self.scores.size(1)
        on_device = keep.to(self.tokens.device, non_blocking=True)
        tokens = self.tokens.view(-1, beam, self.tokens.size(1))[on_device].flatten(0, 1)
        return _Beams(tokens, self.scores[on_device], self.sentence[keep])


# Leading columns no sentence reads that BeamSearch lets pile up before it drops them.
TRIM_AT = 8


class BeamSearch:
    """Beam search as an object that sentences join and leave between steps.

    ``add`` starts sentences (each with its own max_len) and returns their ids; ``step`` runs
    one decoder step for all of them; ``pop_done`` hands out the n-best lists of the sentences
    that have ended; ``drop`` removes sentences (their client went away). :func:`beam_search`
    is a loop over it; the server's step-level batching (aiayn/serve/batching.py) adds and
    drops sentences between steps.

    Sentences never mix: each has its own k rows, and the hypotheses of a sentence are the same
    whether it decodes alone, in a batch or joins one that is running (tested). A sentence
    added before the first step runs one row at that step (its k beams are still the same); one
    that joins a running search comes with k rows of which only the first is alive (score 0,
    the others -inf), which picks the same 2k candidates. ``min_len`` and ``max_len`` count the
    tokens each sentence has generated. The cache, given to every ``step`` and ``drop``, follows
    the rows with ``cache.reorder(index)``; after sentences that joined later have left the
    oldest, ``cache.trim(n)`` drops the first n positions, which no remaining row reads.
    """

    def __init__(self, settings: SearchSettings, device: Any = None) -> None:
        s = settings
        self.beam, self.bos_id, self.eos_id, self.device = s.beam, s.bos_id, s.eos_id, device
        self.alpha, self.penalty, self.min_len, self.nbest = s.alpha, s.penalty, s.min_len, s.nbest
        self.rules, self.early_stopping = s.rules, s.early_stopping
        self.steps = 0  # decoder steps run so far
        self.state: _Beams | None = None
        self.finished: dict[int, list[Hypothesis]] = {}  # by sentence id, active ones
        self._ended: dict[int, list[Hypothesis]] = {}  # n-best lists not yet popped
        self._next_id = 0
        # Host-side bookkeeping in Python (no tensor to read back at every step): the ids of the
        # active sentences, in the order of their rows, and by id the step each joined at and
        # its max_len
        self._ids: list[int] = []
        self._start: dict[int, int] = {}
        self._cap: dict[int, int] = {}

    @property
    def active(self) -> int:
        """Sentences still searching."""
        return 0 if self.state is None else self.state.sentence.numel()

    def add(self, max_len: int | Tensor, n: int = 1) -> list[int]:
        """Start ``n`` sentences (``max_len``: an int or (n,) caps); returns their ids. Their
        rows follow those of the sentences already there (the cache must get theirs likewise)."""
        lengths = _as_lengths(max_len, n).tolist()
        ids = list(range(self._next_id, self._next_id + n))
        self._next_id += n
        for i, cap in zip(ids, lengths):
            self.finished[i], self._start[i], self._cap[i] = [], self.steps, cap
        k = 1 if self.state is None else self.state.scores.size(1)  # rows per sentence now
        width = 1 if self.state is None else self.state.tokens.size(1)
        tokens = torch.full((n * k, width), self.bos_id, dtype=torch.long, device=self.device)
        scores = torch.full((n, k), float("-inf"), device=self.device)
        scores[:, 0] = 0.0  # k identical rows: only the first is alive
        new = _Beams(tokens, scores, torch.tensor(ids))
        self.state = new if self.state is None else _concat(self.state, new)
        self._ids += ids
        return ids

    @torch.no_grad()
    def step(self, step: StepFn, cache: Any) -> Any:
        """One decoder step for every active sentence; returns the cache (reordered to the rows
        that go on; left as it is when no sentence is left)."""
        state, beam, ids = self.state, self.beam, self._ids
        if state is None:
            raise ValueError("no sentence to search: add() some first")
        generated = [self.steps - self._start[s] for s in ids]  # tokens each has so far
        caps = [self._cap[s] for s in ids]
        log_probs, cache = step(state.tokens, cache)
        last = None
        if self.rules.force_eos:  # the rows whose next token is the last their cap allows
            last = _row_flags(state, [c <= g + 1 for c, g in zip(caps, generated)])
        forbid = _rows_where(state, [g < self.min_len for g in generated])
        log_probs = _apply_rules(
            log_probs, self.eos_id, forbid, self.rules, last, state.tokens,
            self._bos_at(state, generated),
        )  # fmt: skip
        cand_scores, cand_rows, cand_tokens = _top_candidates(state, log_probs, 2 * beam)
        room = [len(self.finished[s]) < beam for s in ids]  # before this step's endings
        _finish_eos(
            state, cand_scores, cand_rows, cand_tokens, self.eos_id, self.finished, ids,
            generated, self.alpha, self.penalty, beam,
        )  # fmt: skip
        state, rows = _advance(state, cand_scores, cand_rows, cand_tokens, self.eos_id, beam)
        self.steps += 1
        done = _done(
            state, ids, [g + 1 for g in generated], caps, self.finished, beam, self.alpha,
            self.penalty, self.early_stopping, room,
        )  # fmt: skip
        keep = [i for i, d in enumerate(done) if not d]
        for i in (i for i, d in enumerate(done) if d):
            self._end(ids[i])
        if not keep:
            self.state, self._ids = None, []
            return cache
        if len(keep) < len(done):  # sentences leave: one small copy to the device
            kept = torch.tensor(keep)
            rows = rows.view(-1, beam)[kept.to(rows.device, non_blocking=True)].reshape(-1)
            state, self._ids = state.select(kept), [ids[i] for i in keep]
        self.state = state
        return self._follow(cache, rows)

    def _bos_at(self, state: _Beams, generated: list[int]) -> Tensor | None:
        """(rows,) where each row's own BOS is, for the n-gram rule, when some sentence joined
        after others (its row is left-filled with BOS); None when every row starts at 0."""
        if not self.rules.no_repeat_ngram:
            return None
        width = state.tokens.size(1)
        bos_at = [width - 1 - g for g in generated]  # by sentence
        if not any(bos_at):
            return None
        per_sentence = state.tokens.size(0) // len(generated)
        out = torch.tensor(bos_at).repeat_interleave(per_sentence)
        return out.to(state.tokens.device, non_blocking=True)

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
        self._ended[sentence] = sorted(hyps, key=lambda h: -h.score)[: self.nbest]

    def _follow(self, cache: Any, rows: Tensor) -> Any:
        """Reorder the cache to ``rows``; drop the leading columns no sentence reads any more
        (those before the oldest remaining sentence joined), in the tokens and the cache, once
        there are enough of them."""
        assert self.state is not None
        if cache is not None:
            cache = cache.reorder(rows)
        width = self.state.tokens.size(1)
        unread = width - 1 - (self.steps - min(self._start[s] for s in self._ids))
        # A trim copies the cache: done once the unread columns are a quarter of the width and
        # at least TRIM_AT, so that it is rare and the width stays within 4/3 of what is read
        if unread >= max(TRIM_AT, width // 4):
            self.state.tokens = self.state.tokens[:, unread:]
            if cache is not None:
                cache = cache.trim(unread)
        return cache


def _concat(a: _Beams, b: _Beams) -> _Beams:
    """Two states' sentences as one (same rows per sentence and width)."""
    return _Beams(
        torch.cat([a.tokens, b.tokens]),
        torch.cat([a.scores, b.scores]),
        torch.cat([a.sentence, b.sentence]),
    )


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
    worst of its k best finished ones (Hugging Face's heuristic). ``rules`` (:class:`Rules`)
    adjust each step's scores. A loop over :class:`BeamSearch`.
    """
    search = BeamSearch(settings, device)
    ids = search.add(max_len, batch_size)
    results: dict[int, list[Hypothesis]] = {}
    while search.active:
        cache = search.step(step, cache)
        results.update(search.pop_done())
    return [results[i] for i in ids]


def _rows_where(state: _Beams, flags: list[bool]) -> bool | Tensor:
    """Per-sentence flags as one bool when all agree (no copy to the device), else as rows."""
    return all(flags) if all(flags) or not any(flags) else _row_flags(state, flags)


def _row_flags(state: _Beams, flags: list[bool]) -> Tensor:
    """Per-sentence flags as a (b·k,) bool on the device, one per row."""
    per_sentence = state.tokens.size(0) // len(flags)
    out = torch.tensor(flags).repeat_interleave(per_sentence)
    return out.to(state.tokens.device, non_blocking=True)


def _top_candidates(state: _Beams, log_probs: Tensor, n: int) -> tuple[Tensor, Tensor, Tensor]:
    """The n best one-token extensions of each sentence's k live rows (k = 1 on the first step).

    Shape: log_probs (b·k, V) -> scores, source rows (into b·k), tokens, each (b, n). Where
    fewer than n extensions exist (k·V < n) the rest are -inf, as dead beams are, on the
    sentence's own first row (so a cache reorder never mixes sentences).
    """
    (b, k), V = state.scores.shape, log_probs.size(-1)
    if k * V < n:
        scores, rows, tokens = _top_candidates(state, log_probs, k * V)
        pad = n - k * V
        own = torch.arange(b, device=rows.device)[:, None].expand(b, pad) * k
        return (
            F.pad(scores, (0, pad), value=float("-inf")),
            torch.cat([rows, own], dim=1),
            F.pad(tokens, (0, pad), value=0),
        )
    if V >= 4 * TOPK_BLOCK and k * (V // TOPK_BLOCK) >= n:  # at least n blocks to rank
        return _top_candidates_blocked(state.scores, log_probs, n)
    total = (state.scores[:, :, None] + log_probs.view(b, k, V)).view(b, k * V)  # (b, k·V)
    cand_scores, flat = total.topk(n, dim=-1)  # (b, n)
    base = torch.arange(b, device=flat.device)[:, None] * k
    return cand_scores, base + flat // V, flat % V


# Tokens per block in the two-stage top-k below (64 to 128 were fastest at V = 8000, docs/decoding.md).
TOPK_BLOCK = 64


def _top_candidates_blocked(
    scores: Tensor, log_probs: Tensor, n: int, block: int = TOPK_BLOCK
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`_top_candidates` without forming the (b, k·V) sums, exactly.

    Each row's vocabulary is cut into blocks of ``block`` tokens (the last one holds the
    remainder). The n best sums score[s, j] + log_probs[s·k + j, v] of sentence s lie in the n
    blocks with the best score + block maximum, so only those n·block sums are formed and ranked.
    At V = 8000 this replaces a (b, k·V) add and a k·V-wide top-k by a max over the vocabulary
    and two small top-ks. Nothing of size V is copied: blocks are views of ``log_probs``.

    Shape: scores (b, k), log_probs (b·k, V) -> scores, rows (into b·k), tokens, each (b, n).
    """
    b, k = scores.shape
    V = log_probs.size(-1)
    per_beam = log_probs.view(b, k, V)
    full = V // block * block
    maxes = (
        per_beam[..., :full].unflatten(-1, (full // block, block)).amax(-1)
    )  # (b, k, V // block)
    if full < V:  # the remainder is a block of its own
        maxes = torch.cat([maxes, per_beam[..., full:].amax(-1, keepdim=True)], dim=-1)
    nb = maxes.size(-1)
    top = (
        (maxes + scores[:, :, None]).view(b, k * nb).topk(n, dim=-1).indices
    )  # (b, n): row j, block c
    j, c = top // nb, top % nb
    # Each chosen block as a window of `block` consecutive tokens of a view; the remainder's
    # window ends at V, and the tokens it shares with the block before are that block's.
    start = (c * block).clamp(max=V - block)  # (b, n) first token of each window
    sentence = torch.arange(b, device=top.device)[:, None]
    cand = per_beam.unfold(-1, block, 1)[sentence, j, start]  # (b, n, block)
    if full < V:
        shared = start[..., None] + torch.arange(block, device=top.device) < (c * block)[..., None]
        cand = cand.masked_fill(shared, float("-inf"))
    cand = cand + scores.gather(1, j)[:, :, None]
    cand_scores, flat = cand.view(b, n * block).topk(n, dim=-1)  # (b, n)
    slot = flat // block
    rows = sentence * k + j.gather(1, slot)
    return cand_scores, rows, start.gather(1, slot) + flat % block


def _finish_eos(
    state: _Beams,
    cand_scores: Tensor,
    cand_rows: Tensor,
    cand_tokens: Tensor,
    eos_id: int,
    finished: dict[int, list[Hypothesis]],
    ids: list[int],
    generated: list[int],
    alpha: float,
    penalty: str,
    beam: int,
) -> None:
    """Move EOS candidates ranked among the first k of their sentence into ``finished``.
    ``ids``, ``generated``: each active sentence's id and the tokens it had before this step.

    Host-device syncs: one per step, three more on a step with EOS candidates, whatever their
    number (their sentences, scores and tokens are each copied at once).
    """
    is_eos = (cand_tokens[:, :beam] == eos_id) & (cand_scores[:, :beam] > float("-inf"))  # (b, k)
    where = is_eos.nonzero()  # (n, 2): sentence i, rank j
    if where.size(0) == 0:
        return
    i, j = where[:, 0], where[:, 1]
    scores = cand_scores[i, j].tolist()
    rows = state.tokens[cand_rows[i, j]].tolist()  # (n, t)
    for at, log_prob, row in zip(i.tolist(), scores, rows):
        n = generated[at]
        divisor = float(length_penalty(n + 1, alpha, penalty))  # its tokens and this EOS
        finished[ids[at]].append(
            Hypothesis(row[len(row) - n :], log_prob / divisor, log_prob, True)
        )


def _advance(
    state: _Beams,
    cand_scores: Tensor,
    cand_rows: Tensor,
    cand_tokens: Tensor,
    eos_id: int,
    beam: int,
) -> tuple[_Beams, Tensor]:
    """Continue with the k best non-EOS candidates; return the new state and their source rows.

    Shape: candidates (b, 2k) -> tokens (b·k, t + 1), scores (b, k), rows (b·k,).
    """
    width = cand_tokens.size(1)
    rank = torch.arange(width, device=cand_tokens.device).expand_as(cand_tokens)
    order = (rank + (cand_tokens == eos_id) * width).topk(beam, dim=-1, largest=False).indices
    rows = cand_rows.gather(1, order).view(-1)  # (b·k,)
    new = cand_tokens.gather(1, order).view(-1, 1)  # (b·k, 1)
    tokens = torch.cat([state.tokens.index_select(0, rows), new], dim=1)  # (b·k, t + 1)
    return _Beams(tokens, cand_scores.gather(1, order), state.sentence), rows


def _done(
    state: _Beams,
    ids: list[int],
    generated: list[int],
    caps: list[int],
    finished: dict[int, list[Hypothesis]],
    beam: int,
    alpha: float,
    penalty: str,
    early_stopping: bool,
    room: list[bool],
) -> list[bool]:
    """Which active sentences are done: k finished hypotheses (and, without
    ``early_stopping``, no live beam that could beat them), no live beam left, or max_len
    reached (their live beams are then kept, cut, where the sentence had fewer than k finished
    hypotheses before this step, ``room``: they compete with this step's EOS endings).
    ``ids``, ``generated``, ``caps``: each active sentence's id, the tokens it has generated
    (this step's included) and its max_len."""
    at_cap = [c <= g for c, g in zip(caps, generated)]
    dead = (state.scores == float("-inf")).all(1).tolist()  # one sync per step
    cut = [i for i, cap in enumerate(at_cap) if cap and (room[i] or not early_stopping)]
    for i, hyps in zip(cut, _cut(state, cut, generated, beam, alpha, penalty)):
        finished[ids[i]].extend(hyps)
    full = [len(finished[s]) >= beam for s in ids]
    if not early_stopping and any(full):
        best_live = state.scores[:, 0].tolist()  # live beams are ranked: 0 is best
        for i, (s, n) in enumerate(zip(ids, generated)):
            if full[i]:
                worst = sorted(h.score for h in finished[s])[-beam]  # the k-th best finished
                full[i] = best_live[i] / float(length_penalty(n, alpha, penalty)) <= worst
    return [cap or d or f for cap, d, f in zip(at_cap, dead, full)]


def _cut(
    state: _Beams, cut: list[int], generated: list[int], beam: int, alpha: float, penalty: str
) -> list[list[Hypothesis]]:
    """The live beams of the sentences ``cut`` (they reached max_len) as hypotheses without EOS.
    Their beams come to the host in one copy of tokens and one of scores, whatever their number;
    the other sentences' stay on the device."""
    if not cut:
        return []
    t = state.tokens.size(1)
    rows = state.tokens.reshape(-1, beam, t)[cut].tolist()  # (c, k, t)
    scores = state.scores[cut].tolist()  # (c, k)
    out = []
    for beams, row, n in zip(rows, scores, (generated[i] for i in cut)):
        divisor = float(length_penalty(n, alpha, penalty))
        out.append(
            [
                Hypothesis(r[t - n :], s / divisor, s, False)
                for r, s in zip(beams, row)
                if s > float("-inf")
            ]
        )
    return out


# --------------------------------------------------------------------------------------------
# Sampling
# --------------------------------------------------------------------------------------------


def filter_log_probs(
    log_probs: Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
) -> Tensor:
    """Temperature, then top-k, then nucleus (top-p, Holtzman et al. 2020) filtering.

    Shape: (N, V) -> (N, V) normalised log-probabilities, removed tokens at -inf. top_k = 0 and
    top_p = 1 switch those filters off; at least one token always survives.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    x = log_probs.float() / temperature
    if 0 < top_k < x.size(-1):
        kth = x.topk(top_k, dim=-1).values[:, -1:]  # (N, 1)
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1.0:
        sorted_x, order = x.sort(dim=-1, descending=True)
        before = sorted_x.softmax(-1).cumsum(-1) - sorted_x.softmax(-1)  # mass ranked above
        drop = (before >= top_p).scatter(1, order, before >= top_p)
        x = x.masked_fill(drop, float("-inf"))
    return x.log_softmax(-1)


@torch.no_grad()
def sample(
    step: StepFn,
    cache: Any,
    prefix: Tensor,
    max_len: int,
    settings: SearchSettings,
    rng: torch.Generator | None = None,
) -> list[Hypothesis]:
    """Ancestral sampling from a filtered distribution (``settings.temperature``, ``top_k``,
    ``top_p``), for language models.

    Shape: prefix (B, t0) (a prompt, BOS first) -> B hypotheses of at most ``max_len`` new
    tokens; log_prob is the model's own (unfiltered) log-probability of the sampled tokens.
    """
    eos_id, pad_id, min_len = settings.eos_id, settings.pad_id, settings.min_len
    temperature, top_k, top_p = settings.temperature, settings.top_k, settings.top_p
    tokens, B = prefix, prefix.size(0)
    log_prob = torch.zeros(B, device=prefix.device)
    done = torch.zeros(B, dtype=torch.bool, device=prefix.device)
    ended, count = done.clone(), torch.zeros(B, dtype=torch.long, device=prefix.device)
    for t in range(max_len):
        log_probs, cache = step(tokens, cache)
        log_probs = _forbid_eos(log_probs, eos_id, t < min_len)
        probs = filter_log_probs(log_probs, temperature, top_k, top_p).exp()
        nxt = torch.multinomial(probs, 1, generator=rng).squeeze(1)  # (B,)
        token_log_prob = log_probs.gather(1, nxt[:, None]).squeeze(1)
        tokens, done = _extend(
            tokens, nxt, token_log_prob, log_prob, done, ended, count, eos_id, pad_id
        )
        if bool(done.all()):
            break
    return _row_hypotheses(tokens[:, prefix.size(1) :], log_prob, ended, count)
