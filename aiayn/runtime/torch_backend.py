"""The PyTorch backend: aiayn's own model (or an ensemble of translation models), on any device.

It runs everything: aiayn's search over the model's encode and step, n-best lists, ensembles,
attention weights (the attention view records them from the model's layers), bf16 autocast,
sampling from a language model, a classifier's probabilities, and the translations that the
server's requests join between decoder steps (step-level batching).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.decode.classify import predict_ids
from aiayn.decode.config import DecodeConfig
from aiayn.decode.continuous import RunningTranslation
from aiayn.decode.generate import generate
from aiayn.decode.search import Hypothesis
from aiayn.decode.translate import translate_ids

__all__ = ["TorchBackend"]


class TorchBackend:
    """A loaded PyTorch model: a Transformer, an Ensemble of them, a TransformerLM, a
    TransformerClassifier or a TransformerMaskedLM, in eval mode on ``device``."""

    name = "torch"
    capabilities = frozenset(
        {"translate", "nbest", "ensemble", "attention", "bf16", "generate", "classify", "steps"}
    )

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self.model = model
        self.device = device
        self.cfg: ModelConfig = model.cfg  # type: ignore[assignment]

    def parameters(self) -> list[Tensor]:
        return list(self.model.parameters())

    def translate_ids(
        self,
        sources: Sequence[list[int]],
        cfg: DecodeConfig,
        progress: Callable[[int], None] | None = None,
    ) -> list[list[Hypothesis]]:
        return translate_ids(self.model, sources, cfg, progress)  # type: ignore[arg-type]

    def running_translation(self, cfg: DecodeConfig) -> RunningTranslation:
        """A translation that sentences join between decoder steps (a Transformer or an
        Ensemble of them)."""
        return RunningTranslation(self.model, cfg, self.device)  # type: ignore[arg-type]

    def class_probs(self, ids: Sequence[Sequence[int]], max_tokens: int | None) -> Tensor:
        return predict_ids(self.model, ids, max_tokens, self.device)  # type: ignore[arg-type]

    def generate_ids(self, prompt_ids: list[int], window: int, **options: Any) -> list[int]:
        return generate(self.model, prompt_ids, window=window, **options)  # type: ignore[arg-type]
