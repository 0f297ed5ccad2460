"""An ensemble: several translation models decoding as one (fairseq's ``--path a.pt:b.pt``), or
several text classifiers whose class probabilities are averaged (:class:`ClassifierEnsemble`).

Shape legend: B sentences · N decoder rows (B, or B·k with a beam of k) · T new tokens · V vocab.

At every step each model gives its next-token distribution and the ensemble's is their mean,
p(y) = 1/n Σᵢ pᵢ(y), computed in log space: log p = logsumexp_i(log pᵢ) - log n. Each model keeps
its own encoder memory and decoder cache, so search (:mod:`aiayn.decode.search`) sees one model:
:class:`Ensemble` has the ``encode`` / ``init_cache`` / ``log_probs`` of a
:class:`~aiayn.model.Transformer` (the :class:`~aiayn.decode.step.Seq2SeqModel` protocol). An
ensemble of one model decodes exactly as that model (tested).

The models must share their vocabulary: one tokenizer, the same special ids, the same output size.
They may differ in everything else (size, depth, pre/post-LN).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from aiayn.errors import CheckpointError
from aiayn.model import Transformer, TransformerClassifier

__all__ = ["ClassifierEnsemble", "Ensemble", "EnsembleCache", "ensemble_of"]


def _shared(models: Sequence[Any], names: Sequence[str], what: str) -> Any:
    """The first model's config, once every model has the same ``names`` in its config
    (ValueError naming the first that differs, and ``what`` ensembled models must share)."""
    if not models:
        raise ValueError("an ensemble needs at least one model")
    first = models[0].cfg
    for n, model in enumerate(models[1:], 2):
        for name in names:
            if getattr(model.cfg, name) != getattr(first, name):
                raise ValueError(
                    f"model {n} has {name}={getattr(model.cfg, name)}, model 1 "
                    f"{getattr(first, name)}: ensembled models must share {what}"
                )
    return first


class EnsembleCache:
    """One decoder cache per model, moved together (``reorder``, ``with_beam``)."""

    def __init__(self, caches: list[Any]) -> None:
        self.caches = caches

    @property
    def length(self) -> int:
        """Tokens decoded so far (every model has seen the same)."""
        return self.caches[0].length

    def with_beam(self, beam: int) -> EnsembleCache:
        for cache in self.caches:
            cache.with_beam(beam)
        return self

    def reorder(self, index: Tensor) -> EnsembleCache:
        for cache in self.caches:
            cache.reorder(index)
        return self

    def extend(self, other: EnsembleCache) -> EnsembleCache:
        """Rows that join (DecoderCache.extend), model by model."""
        for cache, new in zip(self.caches, other.caches):
            cache.extend(new)
        return self

    def trim(self, n: int) -> EnsembleCache:
        for cache in self.caches:
            cache.trim(n)
        return self


class Ensemble(nn.Module):
    """Translation models whose next-token probabilities are averaged.

    ``cfg`` is the first model's config with ``max_len`` the smallest of all (the positional
    table every model can read); the special ids and output size are the same in all (checked).
    """

    def __init__(self, models: Sequence[Transformer]) -> None:
        super().__init__()
        first = _shared(
            models, ("tgt_vocab_size", "pad_id", "bos_id", "eos_id"), "their vocabulary"
        )
        # the torch models registered (.to(), .eval() and parameters reach them); an ONNX model
        # has no weights to register
        self.models = nn.ModuleList(m for m in models if isinstance(m, nn.Module))
        self.members = list(models)  # every model, typed
        self.cfg = dataclasses.replace(first, max_len=min(m.cfg.max_len for m in models))

    def encode(self, src: Tensor) -> list[Tensor]:
        """Shape: src (B, S) -> one memory (B, S, D_i) per model."""
        return [model.encode(src) for model in self.members]

    def init_cache(self, memory: list[Tensor], src: Tensor | None = None) -> EnsembleCache:
        return EnsembleCache(
            [model.init_cache(m, src=src) for model, m in zip(self.members, memory)]
        )

    def project_memory(self, cache: EnsembleCache, memory: list[Tensor]) -> EnsembleCache:
        """Each model's cross-attention keys/values into its cache now (rows that join)."""
        for model, m, c in zip(self.members, memory, cache.caches):
            model.project_memory(c, m)
        return cache

    def log_probs(self, tgt: Tensor, memory: list[Tensor] | None, cache: EnsembleCache) -> Tensor:
        """Shape: tgt (N, T) new tokens -> (N, T, V) float32 log-probabilities of the mean
        distribution. Incremental only (a cache from :meth:`init_cache`); ``memory`` None once
        the caches hold the cross-attention keys/values."""
        total: Tensor | None = None  # log Σ_i p_i so far, (N, T, V); one logaddexp per model
        memories = memory if memory is not None else [None] * len(self.members)
        for model, m, c in zip(self.members, memories, cache.caches):
            log_probs = model.log_probs(tgt, m, c)
            total = log_probs if total is None else torch.logaddexp(total, log_probs)
        assert total is not None  # at least one model (checked in __init__)
        return total - math.log(len(self.members))


class ClassifierEnsemble(nn.Module):
    """Text classifiers whose class probabilities are averaged: ``forward`` gives the log of the
    mean, p(c) = 1/n Σᵢ pᵢ(c), so its softmax is the mean (what :func:`predict_ids` takes).

    ``cfg`` is the first model's with ``max_len`` the smallest of all; the number of classes and
    the padding id are the same in all (checked)."""

    def __init__(self, models: Sequence[TransformerClassifier]) -> None:
        super().__init__()
        first = _shared(models, ("n_classes", "pad_id"), "their classes and padding id")
        self.models = nn.ModuleList(models)
        self.cfg = dataclasses.replace(first, max_len=min(m.cfg.max_len for m in models))

    def forward(self, ids: Tensor) -> Tensor:
        """Shape: ids (B, S) -> (B, C) float32 log-probabilities of the mean distribution."""
        total: Tensor | None = None
        for model in self.models:
            log_probs = model(ids).float().log_softmax(-1)
            total = log_probs if total is None else torch.logaddexp(total, log_probs)
        assert total is not None  # at least one model (checked in __init__)
        return total - math.log(len(self.models))


def ensemble_of(folders: Sequence[Any], models: Sequence[Any], tokenizers: Sequence[Any]) -> Any:
    """The models read from ``folders`` as one model: the only one, or an :class:`Ensemble` of
    translation models (PyTorch or ONNX alike) or a :class:`ClassifierEnsemble` of PyTorch text
    classifiers. CheckpointError naming the folder when a tokenizer differs from the first
    folder's, or when the models cannot be averaged."""
    if len(models) == 1:
        return models[0]
    for folder, other in zip(folders[1:], tokenizers[1:]):
        if other.to_str() != tokenizers[0].to_str():
            raise CheckpointError(
                f"{folder}: its tokenizer differs from {folders[0]}'s; an ensemble's models "
                "must share one vocabulary"
            )
    try:
        if isinstance(models[0], TransformerClassifier):
            return ClassifierEnsemble(models)
        return Ensemble(models)
    except ValueError as err:
        raise CheckpointError(str(err)) from None
