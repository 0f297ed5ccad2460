"""The rules search applies to each step's log-probabilities before it chooses: Hugging Face's
logits processors, each written once, for greedy search, beam search and sampling alike.

Shape legend: N rows fed to the model · t tokens so far (BOS or the prompt first) · V vocab.

In their order: ``repetition_penalty`` on the tokens so far, ``no_repeat_ngram_size`` bans,
``bad_ids`` to -inf, EOS to -inf before ``min_len``, ``forced_eos`` at a row's last allowed
token (EOS at log-probability 0, everything else -inf), then ``renormalize`` (log-softmax again).
A forced target prefix is the one rule that is not here: it needs each row's own prefix, which
moves with the rows, so it wraps the step function (:func:`aiayn.decode.step.force_prefix`) and
so reaches every search too.

The names are DecodeConfig's (:mod:`aiayn.decode.config`), which documents each setting.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["Rules", "Rows"]


@dataclass(frozen=True)
class Rows:
    """What the rules read of one step's rows.

    Shape: tokens (N, t), each row's tokens so far; a row that joined a running search is
    left-filled with BOS up to the common width, so its own tokens are the last
    ``start + generated`` columns. ``generated`` and ``caps`` are per sentence (N is a whole
    number of rows per sentence): the tokens each has generated before this step, and its
    max_len (None: no cap). None for ``generated``: every row has generated t - ``start``.
    """

    tokens: Tensor
    eos_id: int
    generated: list[int] | None = None
    caps: list[int] | None = None
    start: int = 1  # tokens a row starts with: BOS, or a prompt

    def counts(self) -> list[int]:
        """Per sentence, the tokens it has generated before this step."""
        if self.generated is not None:
            return self.generated
        return [self.tokens.size(1) - self.start] * self.tokens.size(0)

    def per_row(self, flags: list[bool]) -> bool | Tensor:
        """Per-sentence flags as one bool when all agree (nothing copied to the device), else
        as an (N,) bool on the device."""
        if all(flags) or not any(flags):
            return all(flags)
        rows_each = self.tokens.size(0) // len(flags)
        out = torch.tensor(flags).repeat_interleave(rows_each)
        return out.to(self.tokens.device, non_blocking=True)

    def fill(self) -> Tensor | None:
        """(N,) where each row's own tokens begin, when some row is left-filled (it joined a
        running search); None when every row's begin at column 0."""
        width = self.tokens.size(1)
        begin = [width - self.start - g for g in self.counts()]
        if not any(begin):
            return None
        rows_each = self.tokens.size(0) // len(begin)
        out = torch.tensor(begin).repeat_interleave(rows_each)
        return out.to(self.tokens.device, non_blocking=True)


@dataclass(frozen=True)
class Rules:
    """The per-step rules of one search; every one off by default."""

    # Hugging Face's RepetitionPenaltyLogitsProcessor (Keskar et al. 2019): the score of every
    # token already in the row (BOS and a prompt included, as HF's input_ids) times the penalty
    # when negative, over it when positive; 1 is off. Search sees log-probabilities, so a penalty
    # > 1 always lowers a repeated token (HF applies it to log-probabilities in beam search too).
    repetition_penalty: float = 1.0
    # Hugging Face's NoRepeatNGramLogitsProcessor: a token that would complete an n-gram already
    # in the row is banned (-inf); 0 is off. A row whose every allowed token would be banned
    # (a forced prefix token, a tiny vocabulary) keeps its scores instead of dying.
    no_repeat_ngram_size: int = 0
    bad_ids: tuple[int, ...] = ()  # never output
    min_len: int = 0  # EOS is forbidden before this many generated tokens
    forced_eos: bool = False  # EOS is the last token a row's cap allows
    renormalize: bool = False  # log-softmax again after the rules

    def apply(self, log_probs: Tensor, rows: Rows) -> Tensor:
        """(N, V) -> (N, V) float32 after the rules; in place when already float32 (step
        functions return fresh tensors)."""
        log_probs = log_probs.float()
        if self.repetition_penalty != 1.0:  # the fill repeats BOS: no change
            penalize_repeats(log_probs, rows.tokens, self.repetition_penalty)
        if self.no_repeat_ngram_size > 0:
            ban_repeated_ngrams(log_probs, rows.tokens, self.no_repeat_ngram_size, rows.fill())
        if self.bad_ids:
            log_probs[:, list(self.bad_ids)] = float("-inf")
        if self.min_len > 0:
            forbid = rows.per_row([g < self.min_len for g in rows.counts()])
            forbid_eos(log_probs, rows.eos_id, forbid)
        if self.forced_eos and rows.caps is not None:
            last = rows.per_row([c <= g + 1 for c, g in zip(rows.caps, rows.counts())])
            force_eos(log_probs, rows.eos_id, last)
        if self.renormalize:
            log_probs = log_probs.log_softmax(-1)
        return log_probs


def penalize_repeats(log_probs: Tensor, tokens: Tensor, penalty: float) -> None:
    """In place: the scores of the tokens in each row divided by ``penalty`` where positive,
    multiplied where negative (Hugging Face's RepetitionPenaltyLogitsProcessor).

    Shape: log_probs (N, V), tokens (N, t)."""
    score = log_probs.gather(1, tokens)  # (N, t); a repeated token gathers the same value
    score = torch.where(score < 0, score * penalty, score / penalty)
    log_probs.scatter_(1, tokens, score)


def ban_repeated_ngrams(
    log_probs: Tensor, tokens: Tensor, n: int, begin: Tensor | None = None
) -> None:
    """In place: -inf for every token that would complete an n-gram already in its row (Hugging
    Face's NoRepeatNGramLogitsProcessor), unless that bans every token the row still allows.

    Shape: log_probs (N, V), tokens (N, t), begin (N,) or None; nothing is banned before the row
    holds an n-gram. The n-grams that start left of where a row's own tokens ``begin`` (the fill
    of a row that joined a running search) are not its own and ban nothing."""
    t = tokens.size(1)
    if t < n:
        return
    grams = tokens.unfold(1, n, 1)  # (N, t - n + 1, n): every n-gram of each row
    tail = tokens[:, t - n + 1 :]  # (N, n - 1): what the next token would extend
    match = (grams[:, :, :-1] == tail[:, None, :]).all(-1)  # (N, t - n + 1)
    if begin is not None:
        match &= torch.arange(t - n + 1, device=match.device) >= begin[:, None]
    hits = torch.zeros_like(log_probs).scatter_add_(1, grams[:, :, -1], match.float())
    banned = hits > 0  # (N, V)
    allowed = log_probs > float("-inf")
    keep = ~(allowed & ~banned).any(-1, keepdim=True)  # (N, 1): the ban would empty the row
    log_probs.masked_fill_(banned & ~keep, float("-inf"))


def forbid_eos(log_probs: Tensor, eos_id: int, forbid: bool | Tensor) -> None:
    """In place: EOS at -inf in every row (``forbid`` True) or in the rows of an (N,) bool."""
    if isinstance(forbid, Tensor):
        log_probs[:, eos_id].masked_fill_(forbid, float("-inf"))
    elif forbid:
        log_probs[:, eos_id] = float("-inf")


def force_eos(log_probs: Tensor, eos_id: int, last: bool | Tensor) -> None:
    """In place: in every row (``last`` True) or in the rows of an (N,) bool, EOS at
    log-probability 0 and every other token at -inf."""
    if isinstance(last, Tensor):
        log_probs.masked_fill_(last[:, None], float("-inf"))
        log_probs[:, eos_id] = torch.where(last, 0.0, log_probs[:, eos_id])
    elif last:
        log_probs.fill_(float("-inf"))
        log_probs[:, eos_id] = 0.0
