"""What search needs from a model: the :class:`Seq2SeqModel` protocol and its step function.

Shape legend: B sentences · N decoder rows (B, or B·k with a beam of k) · T new tokens · S source
len · D d_model · V vocab.

A :class:`~aiayn.model.Transformer`, an :class:`~aiayn.decode.ensemble.Ensemble` of them and an
exported engine (ONNX) all satisfy :class:`Seq2SeqModel`; :func:`transformer_step` turns one into
the ``(tokens, cache) -> (log_probs, cache)`` function that :mod:`aiayn.decode.search` takes.
Search asks the model for normalised log-probabilities (fairseq's ``get_normalized_probs``); it
never probes it for flags.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.decode.search import StepFn

__all__ = ["Seq2SeqModel", "transformer_step", "decoding_device", "PrefixCache", "force_prefix"]


class Seq2SeqModel(Protocol):
    """An encoder–decoder that search can drive, one step at a time."""

    #: special ids (pad/bos/eos) and the longest position (max_len) the decoder can read
    cfg: ModelConfig

    def encode(self, src: Tensor) -> Any:
        """Shape: src (B, S) -> memory (for a Transformer (B, S, D); opaque to search)."""
        ...

    def init_cache(self, memory: Any, src: Tensor | None = None) -> Any:
        """An empty decoder cache for ``memory``: ``.length``, ``.reorder(index)``,
        ``.with_beam(k)``."""
        ...

    def log_probs(self, tgt: Tensor, memory: Any, cache: Any) -> Tensor:
        """Shape: tgt (N, T) tokens the cache has not seen -> (N, T, V) float32 normalised
        next-token log-probabilities; extends the cache in place."""
        ...


def transformer_step(model: Seq2SeqModel, memory: Any) -> StepFn:
    """The step function of an encoder–decoder with a cache.

    Shape: tokens (N, t) -> log_probs (N, V); only tokens the cache has not seen are fed. ``memory``
    is read on the first call only (cross-attention keys/values are then cached).
    """

    def step(tokens: Tensor, cache: Any) -> tuple[Tensor, Any]:
        new = tokens[:, cache.length :]
        return model.log_probs(new, memory, cache)[:, -1], cache  # (N, V), a fresh tensor

    return step


class PrefixCache:
    """A decoder cache and each row's forced target prefix, reordered together.

    Shape: forced (N, P) token ids, -1 past the end of a row's prefix (rows without one: all -1).
    """

    def __init__(self, inner: Any, forced: Tensor) -> None:
        self.inner, self.forced = inner, forced

    def reorder(self, index: Tensor) -> PrefixCache:
        inner = self.inner.reorder(index) if self.inner is not None else None
        return PrefixCache(inner, self.forced[index.to(self.forced.device)])


def force_prefix(step: StepFn, cache: Any, forced: Tensor) -> tuple[StepFn, PrefixCache]:
    """A step function that forces each row's prefix (interactive translation, CTranslate2's
    ``target_prefix``): while a row is within its prefix, every token but the prefix's next one
    is at -inf, and that one keeps the model's log-probability, so scores stay the model's own.
    Search then goes on from the prefix, and the output holds it.

    Shape: forced (N, P), -1 past the end of a row's prefix; the returned cache wraps ``cache``
    (search reorders both). A token is forced at generated position g = tokens.size(1) - 1.
    """

    def step_forced(tokens: Tensor, cache: PrefixCache) -> tuple[Tensor, PrefixCache]:
        log_probs, inner = step(tokens, cache.inner)  # (N, V)
        g = tokens.size(1) - 1
        if g < cache.forced.size(1):
            token = cache.forced[:, g : g + 1]  # (N, 1)
            index = token.clamp(min=0)
            only = torch.full_like(log_probs, float("-inf"))
            only.scatter_(1, index, log_probs.gather(1, index))
            log_probs = torch.where(token >= 0, only, log_probs)
        return log_probs, PrefixCache(inner, cache.forced)

    return step_forced, PrefixCache(cache, forced.to(torch.long))


def decoding_device(model: Any, device: torch.device | None = None) -> torch.device:
    """Where ``model`` decodes: ``device`` when given (a runtime without torch weights says it),
    else the device of its weights. A torch module is put in eval mode."""
    if isinstance(model, nn.Module):
        model.eval()
    return device if device is not None else next(model.parameters()).device
