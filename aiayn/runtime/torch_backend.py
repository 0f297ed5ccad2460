"""The PyTorch backend: aiayn's own model (or an ensemble of translation models), on any device.

It runs everything: aiayn's search over the model's encode and step, n-best lists, ensembles,
attention weights (the attention view records them from the model's layers), bf16 autocast,
sampling from a language model, a classifier's probabilities, and the translations that the
server's requests join between decoder steps (step-level batching).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.data.registry import cache_dir
from aiayn.decode.align import AttentionMaps, record_attention
from aiayn.decode.classify import predict_ids
from aiayn.decode.config import DecodeConfig, SamplingConfig
from aiayn.decode.continuous import RunningTranslation
from aiayn.decode.ensemble import Ensemble
from aiayn.decode.generate import generate
from aiayn.decode.images import image_probs
from aiayn.decode.packed import prepacked, state_of
from aiayn.decode.search import Hypothesis
from aiayn.decode.translate import translate_ids
from aiayn.errors import AiaynError, ConfigError
from aiayn.model import Transformer
from aiayn.model.lm import TransformerLM
from aiayn.runtime.compiled import CompiledDecoding, compiled_step
from aiayn.threads import default_workers

__all__ = ["TorchBackend"]


class TorchBackend:
    """A loaded PyTorch model: a Transformer, an Ensemble of them, a TransformerLM, a
    TransformerClassifier or a TransformerMaskedLM, in eval mode on ``device``."""

    name = "torch"
    capabilities = frozenset(
        {
            "translate",
            "nbest",
            "ensemble",
            "attention",
            "bf16",
            "compile",
            "generate",
            "classify",
            "classify_images",
            "steps",
            "module",
        }
    )

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self.model = model
        # what translations run: its output projections packed and kept across decodings while
        # the weights stay as they are (aiayn/decode/packed.py)
        self.decoder = prepacked(model, keep=True)
        self.device = device
        self.cfg: ModelConfig = model.cfg  # type: ignore[assignment]
        # (threads, workers) -> (the weights' states it was compiled from, the compiled model)
        self._compiled: dict[tuple[int, int], tuple[tuple, CompiledDecoding]] = {}
        self._compiling = threading.Lock()

    def parameters(self) -> list[Tensor]:
        return list(self.model.parameters())

    def torch_module(self) -> nn.Module:
        return self.model

    def attention(self, src_ids: Sequence[int], tgt_ids: Sequence[int]) -> AttentionMaps:
        """The attention weights of the model reading ``tgt_ids`` after ``src_ids``; an
        ensemble's first model reads them (an ensemble translates as one model)."""
        reader = self.model.models[0] if isinstance(self.model, Ensemble) else self.model
        if not isinstance(reader, Transformer):
            raise AiaynError(f"attention weights need a Transformer, got {type(reader).__name__}")
        return record_attention(reader, src_ids, list(tgt_ids))

    def translate_ids(
        self,
        sources: Sequence[list[int]],
        cfg: DecodeConfig,
        progress: Callable[[int], None] | None = None,
        prefixes: Sequence[list[int]] | None = None,
    ) -> list[list[Hypothesis]]:
        cfg = self.placed(cfg)
        model = self.compiled(cfg) if cfg.compile else self.decoder
        return translate_ids(model, sources, cfg, progress, None, prefixes)

    def placed(self, cfg: DecodeConfig) -> DecodeConfig:
        """``cfg`` with its ``workers`` chosen for the machine when 0 (the default:
        :func:`aiayn.threads.default_workers`)."""
        if cfg.workers:
            return cfg
        return replace(cfg, workers=default_workers(self.name, device=self.device.type))

    def compiled(self, cfg: DecodeConfig) -> CompiledDecoding:
        """The model with its decoder step compiled (``decode.compile``) for ``cfg.workers``
        decoding threads of an equal share of torch's threads; compiled into
        ``$AIAYN_CACHE/compiled`` on first use, loaded once per backend."""
        if cfg.bf16 or self.device.type != "cpu" or not isinstance(self.model, Transformer):
            raise ConfigError(
                "decode.compile runs one float32 translation model on the CPU "
                "(not with bf16, an ensemble or a GPU)"
            )
        cfg = self.placed(cfg)
        threads = max(1, torch.get_num_threads() // cfg.workers)  # as in_workers shares them
        # The package holds the weights as they were: weights changed since (load_state_dict,
        # an in-place update) are compiled again (found on disk when compiled before)
        weights = tuple(state_of(t) for t in (*self.model.parameters(), *self.model.buffers()))
        with self._compiling:
            key = (threads, cfg.workers)
            kept = self._compiled.get(key)
            if kept is None or kept[0] != weights:
                step = compiled_step(self.model, cache_dir() / "compiled", threads, cfg.workers)
                self._compiled[key] = (weights, CompiledDecoding(self.model, step))
            return self._compiled[key][1]

    def running_translation(self, cfg: DecodeConfig) -> RunningTranslation:
        """A translation that sentences join between decoder steps (a Transformer or an
        Ensemble of them)."""
        return RunningTranslation(self.decoder, cfg, self.device)

    def class_probs(self, ids: Sequence[Sequence[int]], max_tokens: int | None) -> Tensor:
        return predict_ids(self.model, ids, max_tokens, self.device)  # type: ignore[arg-type]

    def generate_ids(
        self,
        prompt_ids: list[int],
        window: int,
        sampling: SamplingConfig,
        use_cache: bool = True,
        on_token: Callable[[int], Any] | None = None,
    ) -> list[int]:
        model = cast(TransformerLM, self.model)
        return generate(model, prompt_ids, window, sampling, use_cache, on_token)

    def image_probs(self, images: np.ndarray) -> Tensor:
        return image_probs(self.model, images, self.device)
