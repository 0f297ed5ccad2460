"""Search: greedy, batched beam search and sampling over a step function.

Shape legend: B sentences · k beam size · N rows fed to the model (B, or B·k) · t tokens so far
(BOS included) · V vocab.

Search never sees the model. It sees a *step function* ``step(tokens, cache) -> (log_probs,
cache)``: ``tokens`` (N, t) are all tokens so far (a cached model reads only those it has not seen),
``log_probs`` (N, V) are the next-token log-probabilities, a fresh tensor (search may write into
it). The cache is opaque except for
``cache.reorder(index)``, called whenever rows are selected (beams move, finished sentences leave),
and may be None. This is fairseq's split (``Search.step`` sees only log-probs), and it is what the
tests exercise with hand-set probabilities.

Lengths: ``max_len`` counts generated tokens, EOS included; a hypothesis that reaches it without EOS
ends there (as Hugging Face ``max_new_tokens`` does). ``min_len`` forbids EOS before that many.
"""

from __future__ import annotations

from collections.abc import Callable
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
    "sample",
    "filter_log_probs",
    "Rules",
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


def _forbid_eos(log_probs: Tensor, eos_id: int, forbid: bool) -> Tensor:
    """(N, V) -> (N, V) float32 with EOS at -inf when ``forbid`` (before ``min_len``).

    In place when ``log_probs`` is already float32: step functions return fresh tensors.
    """
    log_probs = log_probs.float()
    if forbid:
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


def _apply_rules(
    log_probs: Tensor,
    eos_id: int,
    forbid: bool,
    rules: Rules,
    last: Tensor | None,
    tokens: Tensor | None = None,
) -> Tensor:
    """(N, V) -> (N, V) float32 after ``rules``; ``last`` (N,) bool marks the rows whose next
    token is the last their cap allows; ``tokens`` (N, t) are each row's tokens so far, BOS
    first (what the repetition rules read). In place when already float32 (step functions
    return fresh tensors)."""
    log_probs = log_probs.float()
    if tokens is not None and rules.repetition_penalty != 1.0:
        _penalize_repeats(log_probs, tokens, rules.repetition_penalty)
    if tokens is not None and rules.no_repeat_ngram > 0:
        _ban_repeated_ngrams(log_probs, tokens, rules.no_repeat_ngram)
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


def _ban_repeated_ngrams(log_probs: Tensor, tokens: Tensor, n: int) -> None:
    """In place: -inf for every token that would complete an n-gram already in its row (Hugging
    Face's NoRepeatNGramLogitsProcessor), unless that bans every token the row still allows.

    Shape: log_probs (N, V), tokens (N, t); nothing is banned before the row holds an n-gram."""
    t = tokens.size(1)
    if t < n:
        return
    grams = tokens.unfold(1, n, 1)  # (N, t - n + 1, n): every n-gram of each row
    tail = tokens[:, t - n + 1 :]  # (N, n - 1): what the next token would extend
    match = (grams[:, :, :-1] == tail[:, None, :]).all(-1)  # (N, t - n + 1)
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
    bos_id: int,
    eos_id: int,
    max_len: int | Tensor,
    min_len: int = 0,
    pad_id: int = 0,
    device: Any = None,
    rules: Rules = Rules(),
) -> list[Hypothesis]:
    """The most probable token at every step, for B sentences at once.

    Shape: max_len int or (B,) -> B hypotheses (score = log_prob). Finished rows keep being fed
    ``pad_id`` until every row is done. ``rules`` (:class:`Rules`) adjust each step's scores.
    """
    lengths = _as_lengths(max_len, batch_size).to(device)
    tokens = _start(bos_id, batch_size, device)  # (B, 1)
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
    """The live state of beam search over b still-active sentences."""

    tokens: Tensor  # (b·k, t) every hypothesis so far, BOS first
    scores: Tensor  # (b, k) cumulative log-probabilities (float32)
    sentence: Tensor  # (b,) original index of each active sentence (CPU)


@torch.no_grad()
def beam_search(
    step: StepFn,
    cache: Any,
    batch_size: int,
    beam: int,
    bos_id: int,
    eos_id: int,
    max_len: int | Tensor,
    alpha: float = 0.6,
    penalty: str = "gnmt",
    min_len: int = 0,
    nbest: int = 1,
    device: Any = None,
    rules: Rules = Rules(),
    early_stopping: bool = True,
) -> list[list[Hypothesis]]:
    """Batched beam search; returns the ``nbest`` best hypotheses of every sentence, best first.

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
    adjust each step's scores.
    """
    lengths = _as_lengths(max_len, batch_size)
    finished: list[list[Hypothesis]] = [[] for _ in range(batch_size)]
    # All k beams of a sentence start identical: the first step runs one row per sentence.
    scores = torch.zeros(batch_size, 1, device=device)
    state = _Beams(_start(bos_id, batch_size, device), scores, torch.arange(batch_size))
    for t in range(int(lengths.max())):
        log_probs, cache = step(state.tokens, cache)
        last = _last_rows(state, lengths, t) if rules.force_eos else None
        log_probs = _apply_rules(log_probs, eos_id, t < min_len, rules, last, state.tokens)
        cand_scores, cand_rows, cand_tokens = _top_candidates(state, log_probs, 2 * beam)
        room = [len(f) < beam for f in finished]  # per sentence, before this step's endings
        _finish_eos(
            state, cand_scores, cand_rows, cand_tokens, eos_id, finished, alpha, penalty, beam
        )
        state, rows = _advance(state, cand_scores, cand_rows, cand_tokens, eos_id, beam)
        done = _done(state, lengths, finished, beam, t + 1, alpha, penalty, early_stopping, room)
        keep = (~done).nonzero().squeeze(1)  # (b',) on the CPU
        if keep.numel() == 0:
            break
        if keep.numel() < done.numel():  # sentences leave: one small copy to the device
            on_device = keep.to(state.tokens.device, non_blocking=True)
            rows = rows.view(-1, beam)[on_device].reshape(-1)  # (b'·k,)
            state = _Beams(
                state.tokens.view(-1, beam, state.tokens.size(1))[on_device].flatten(0, 1),
                state.scores[on_device],
                state.sentence[keep],
            )
        if cache is not None:
            cache = cache.reorder(rows)
    return [sorted(h, key=lambda h: -h.score)[:nbest] for h in finished]


def _last_rows(state: _Beams, lengths: Tensor, t: int) -> Tensor:
    """(b·k,) or (b,) bool on the device: rows whose next token is the last their cap allows."""
    rows_per_sentence = state.tokens.size(0) // state.sentence.numel()
    last = (lengths[state.sentence] <= t + 1).repeat_interleave(rows_per_sentence)
    return last.to(state.tokens.device, non_blocking=True)


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
    finished: list[list[Hypothesis]],
    alpha: float,
    penalty: str,
    beam: int,
) -> None:
    """Move EOS candidates ranked among the first k of their sentence into ``finished``.

    Host-device syncs: one per step, three more on a step with EOS candidates, whatever their
    number (their sentences, scores and tokens are each copied at once).
    """
    is_eos = (cand_tokens[:, :beam] == eos_id) & (cand_scores[:, :beam] > float("-inf"))  # (b, k)
    where = is_eos.nonzero()  # (n, 2): sentence i, rank j
    if where.size(0) == 0:
        return
    length = state.tokens.size(1)  # tokens generated so far + this EOS
    divisor = float(length_penalty(length, alpha, penalty))
    i, j = where[:, 0], where[:, 1]
    scores = cand_scores[i, j].tolist()
    tokens = state.tokens[cand_rows[i, j], 1:].tolist()  # (n, t - 1)
    for s, log_prob, toks in zip(state.sentence[i.cpu()].tolist(), scores, tokens):
        finished[s].append(Hypothesis(toks, log_prob / divisor, log_prob, True))


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
    lengths: Tensor,
    finished: list[list[Hypothesis]],
    beam: int,
    generated: int,
    alpha: float,
    penalty: str,
    early_stopping: bool = True,
    room: list[bool] | None = None,  # by sentence (original index)
) -> Tensor:
    """Which active sentences are done (b,) bool: k finished hypotheses (and, without
    ``early_stopping``, no live beam that could beat them), no live beam left, or max_len
    reached (their live beams are then kept, cut, where the sentence had fewer than k finished
    hypotheses before this step, ``room``: they compete with this step's EOS endings)."""
    sentences = state.sentence.tolist()  # host tensors: no sync
    at_cap = (lengths[state.sentence] <= generated).tolist()
    dead = (state.scores == float("-inf")).all(1).tolist()  # one sync per step
    room = room if room is not None else [len(f) < beam for f in finished]
    cut = [
        i
        for i, (s, cap) in enumerate(zip(sentences, at_cap))
        if cap and (room[s] or not early_stopping)
    ]
    for i, hyps in zip(cut, _cut(state, cut, beam, alpha, penalty)):
        finished[sentences[i]].extend(hyps)
    full = [len(finished[s]) >= beam for s in sentences]
    if not early_stopping and any(full):
        divisor = float(length_penalty(generated, alpha, penalty))
        best_live = (state.scores[:, 0] / divisor).tolist()  # live beams are ranked: 0 is best
        for i, s in enumerate(sentences):
            if full[i]:
                worst = sorted(h.score for h in finished[s])[-beam]  # the k-th best finished
                full[i] = best_live[i] <= worst
    return torch.tensor([cap or d or f for cap, d, f in zip(at_cap, dead, full)], dtype=torch.bool)


def _cut(
    state: _Beams, cut: list[int], beam: int, alpha: float, penalty: str
) -> list[list[Hypothesis]]:
    """The live beams of the sentences ``cut`` (they reached max_len) as hypotheses without EOS.
    Their beams come to the host in one copy of tokens and one of scores, whatever their number;
    the other sentences' stay on the device."""
    if not cut:
        return []
    t = state.tokens.size(1)
    divisor = float(length_penalty(t - 1, alpha, penalty))
    rows = state.tokens.reshape(-1, beam, t)[cut, :, 1:].tolist()  # (c, k, t - 1)
    scores = state.scores[cut].tolist()  # (c, k)
    return [
        [Hypothesis(r, s / divisor, s, False) for r, s in zip(beams, row) if s > float("-inf")]
        for beams, row in zip(rows, scores)
    ]


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
    eos_id: int,
    max_len: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_len: int = 0,
    pad_id: int = 0,
    rng: torch.Generator | None = None,
) -> list[Hypothesis]:
    """Ancestral sampling from a filtered distribution, for language models.

    Shape: prefix (B, t0) (a prompt, BOS first) -> B hypotheses of at most ``max_len`` new
    tokens; log_prob is the model's own (unfiltered) log-probability of the sampled tokens.
    """
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
