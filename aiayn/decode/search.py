"""Search strategies: greedy, beam and sampling behind one step interface (fairseq's
``search.py``); :mod:`aiayn.decode.generator` drives them with one loop.

Shape legend: b sentences · r live rows each sentence has now (1 on its first step, then k) ·
k beam size · n candidates per sentence · V vocab.

A strategy sees only log-probabilities: those of each sentence's live rows, after the rules
(:mod:`aiayn.decode.rules`), and the rows' cumulative scores. :meth:`Search.step` returns each
sentence's candidate extensions, best first; the loop ends a hypothesis at an EOS candidate
among the first k and continues with the k best others. A strategy also says how a finished
hypothesis is ranked (:meth:`Search.rank`) and whether a sentence stops at k finished ones.

:class:`SearchSettings` is what the loop and its strategy are told besides the step function,
the cache and each sentence's length cap; :func:`aiayn.decode.translate.search_settings` makes it
from a DecodeConfig, :func:`aiayn.decode.generate.generate` from a SamplingConfig.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.decode.config import SamplingConfig
from aiayn.decode.rules import Rules

StepFn = Callable[[Tensor, Any], tuple[Tensor, Any]]

__all__ = [
    "Hypothesis",
    "StepFn",
    "SearchSettings",
    "Candidates",
    "Search",
    "GreedySearch",
    "BeamSearch",
    "Sampling",
    "search_for",
    "length_penalty",
    "filter_log_probs",
]


@dataclass
class Hypothesis:
    """One output sequence."""

    tokens: list[int]  # generated tokens, without BOS (or the prompt) and without EOS
    score: float  # what hypotheses are ranked by: log_prob over the length penalty (beam)
    log_prob: float  # sum of the token log-probabilities after the rules, EOS included
    finished: bool  # True when it ended with EOS, False when cut at max_len
    # (source token, output token) index pairs, when alignments were asked for (DecodeConfig)
    alignment: list[tuple[int, int]] | None = None


@dataclass(frozen=True)
class SearchSettings:
    """What search is told besides the step function, the cache and each sentence's length
    cap: the special ids, the rules, and how to choose (each strategy reads its part)."""

    bos_id: int
    eos_id: int
    rules: Rules = Rules()  # the per-step adjustments of the log-probabilities (every search)
    # Beam search: k, the length penalty (length_penalty's alpha and kind), hypotheses returned,
    # and whether a sentence stops at k finished ones (BeamSearch)
    beam: int = 1
    alpha: float = 0.6
    penalty: str = "gnmt"
    nbest: int = 1
    early_stopping: bool = True
    # Sampling instead of search (temperature, top-k, top-p, seed: Sampling); None: search
    sampling: SamplingConfig | None = None


class Candidates(NamedTuple):
    """Each sentence's candidate extensions, best first. Shape: each (b, n)."""

    scores: Tensor  # cumulative log-probabilities, the extension's included
    rows: Tensor  # the row (of the b·r fed to the step) each extends
    tokens: Tensor  # the token it adds


class Search:
    """A strategy: which extensions of each sentence's live rows go on (fairseq's Search)."""

    moves_rows = False  # candidates may extend another row than their own (the cache follows)

    @property
    def beam(self) -> int:
        """Live rows a sentence keeps after its first step."""
        return 1

    @property
    def early_stopping(self) -> bool:
        """Whether a sentence stops at ``beam`` finished hypotheses."""
        return True

    def step(self, log_probs: Tensor, scores: Tensor) -> Candidates:
        """Shape: log_probs (b·r, V) after the rules, scores (b, r) cumulative (-inf: a dead
        row) -> candidates (b, n), best first."""
        raise NotImplementedError

    def rank(self, log_prob: float, length: int) -> float:
        """The score a hypothesis of ``length`` tokens (EOS included) is ranked by."""
        return log_prob


class GreedySearch(Search):
    """The most probable token: one candidate per sentence."""

    def step(self, log_probs: Tensor, scores: Tensor) -> Candidates:
        best, token = log_probs.max(-1)  # (b,)
        rows = torch.arange(token.size(0), device=token.device)
        return Candidates((scores[:, 0] + best)[:, None], rows[:, None], token[:, None])


class BeamSearch(Search):
    """The 2k best extensions of each sentence's k rows (fairseq); a finished hypothesis is
    ranked by log P / lp(|Y|) (:func:`length_penalty`)."""

    moves_rows = True

    def __init__(self, settings: SearchSettings) -> None:
        self.settings = settings

    @property
    def beam(self) -> int:
        return self.settings.beam

    @property
    def early_stopping(self) -> bool:
        return self.settings.early_stopping

    def step(self, log_probs: Tensor, scores: Tensor) -> Candidates:
        return Candidates(*_top_candidates(scores, log_probs, 2 * self.beam))

    def rank(self, log_prob: float, length: int) -> float:
        s = self.settings
        return log_prob / float(length_penalty(length, s.alpha, s.penalty))


class Sampling(Search):
    """Ancestral sampling from the filtered distribution (temperature, top-k, nucleus:
    :func:`filter_log_probs`): one candidate per sentence, scored with the unfiltered
    log-probability. ``rng``: where the draws come from (default: from ``config.seed``, else
    torch's global generator)."""

    def __init__(
        self, config: SamplingConfig, rng: torch.Generator | None = None, device: Any = None
    ) -> None:
        self.config = config
        if rng is None and config.seed is not None:
            rng = torch.Generator(device or "cpu").manual_seed(config.seed)
        self.rng = rng

    def step(self, log_probs: Tensor, scores: Tensor) -> Candidates:
        c = self.config
        probs = filter_log_probs(log_probs, c.temperature, c.top_k, c.top_p).exp()
        token = torch.multinomial(probs, 1, generator=self.rng)  # (b, 1)
        rows = torch.arange(token.size(0), device=token.device)[:, None]
        return Candidates(scores[:, :1] + log_probs.gather(1, token), rows, token)


def search_for(settings: SearchSettings, device: Any = None) -> Search:
    """The strategy ``settings`` ask for: sampling, greedy (beam 1) or beam search."""
    if settings.sampling is not None:
        return Sampling(settings.sampling, device=device)
    return GreedySearch() if settings.beam == 1 else BeamSearch(settings)


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


def _top_candidates(scores: Tensor, log_probs: Tensor, n: int) -> tuple[Tensor, Tensor, Tensor]:
    """The n best one-token extensions of each sentence's r live rows (r = 1 on its first step).

    Shape: scores (b, r), log_probs (b·r, V) -> scores, source rows (into b·r), tokens, each
    (b, n). Where fewer than n extensions exist (r·V < n) the rest are -inf, as dead beams are,
    on the sentence's own first row (so a cache reorder never mixes sentences).
    """
    (b, k), V = scores.shape, log_probs.size(-1)
    if k * V < n:
        top, rows, tokens = _top_candidates(scores, log_probs, k * V)
        pad = n - k * V
        own = torch.arange(b, device=rows.device)[:, None].expand(b, pad) * k
        return (
            F.pad(top, (0, pad), value=float("-inf")),
            torch.cat([rows, own], dim=1),
            F.pad(tokens, (0, pad), value=0),
        )
    if V >= 4 * TOPK_BLOCK and k * (V // TOPK_BLOCK) >= n:  # at least n blocks to rank
        return _top_candidates_blocked(scores, log_probs, n)
    total = (scores[:, :, None] + log_probs.view(b, k, V)).view(b, k * V)  # (b, k·V)
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
