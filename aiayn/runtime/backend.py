"""The one protocol every runtime implements: what running a model folder takes.

Shape legend: N texts · C classes.

A :class:`Backend` is what :func:`aiayn.load` puts behind a :class:`~aiayn.folder.ModelFolder`:
PyTorch (:mod:`aiayn.runtime.torch_backend`), ONNX Runtime (:mod:`aiayn.runtime.onnx_backend`)
and CTranslate2 (:mod:`aiayn.runtime.ct2_backend`) implement it. A backend declares what it can
do in ``capabilities``; the caller asks (:func:`require`), never checks a type or a format
string, and a missing capability is one line that names the backend (:class:`Unsupported`: exit 2
on the command line, 404 or 422 from the server). A capability beyond the protocol comes with
its methods: "steps" with :class:`Steps`, "attention" with :class:`Attention`, "module" with
:class:`Module`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NoReturn, Protocol

import numpy as np
import torch
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.decode.align import AttentionMaps
from aiayn.decode.config import DecodeConfig, SamplingConfig
from aiayn.decode.search import Hypothesis
from aiayn.engines import ENGINES
from aiayn.errors import ConfigError

__all__ = [
    "CAPABILITIES",
    "ENGINES",
    "Attention",
    "Backend",
    "Module",
    "Steps",
    "Unsupported",
    "require",
    "refuse",
]

#: what a backend may declare
CAPABILITIES = {
    "translate": "translations",
    "nbest": "n-best lists",
    "ensemble": "ensembles of several model folders",
    "attention": "attention weights",
    "bf16": "bf16 autocast (--bf16)",
    "compile": "compiled decoder step (--compile)",
    "generate": "language models",
    "classify": "classifiers",
    "classify_images": "image classifiers",
    "steps": "step-level batching (requests join a running translation between decoder steps)",
    "module": "PyTorch module (what `aiayn export` converts)",
}


class Unsupported(ConfigError):
    """A capability the backend does not have (one line naming the backend and what it lacks)."""


class Declares(Protocol):
    """What a backend (class or instance) declares about itself."""

    name: str
    capabilities: frozenset[str]


class Backend(Protocol):
    """A model folder (or an ensemble of translation folders), opened by one runtime."""

    name: str  # "torch", "onnx", "ctranslate2": what `--engine` and config.json "format" call it
    capabilities: frozenset[str]  # keys of CAPABILITIES
    cfg: ModelConfig  # special ids, max_len, n_classes (the first folder's, for an ensemble)
    device: torch.device

    def parameters(self) -> list[Tensor]:
        """The model's torch weights (an exported model has none)."""
        ...

    def translate_ids(
        self,
        sources: Sequence[list[int]],
        cfg: DecodeConfig,
        progress: Callable[[int], None] | None = None,
        prefixes: Sequence[list[int]] | None = None,
    ) -> list[list[Hypothesis]]:
        """Per source its ``cfg.nbest`` hypotheses, best first ([] for an empty source): aiayn's
        search over the model's encode and step (:class:`~aiayn.decode.step.Seq2SeqModel`), or
        the engine's own search. ``prefixes``: per source the target ids its output starts
        with (forced, then search goes on; [] for none)."""
        ...

    def class_probs(self, ids: Sequence[Sequence[int]], max_tokens: int | None) -> Tensor:
        """Shape: N id lists -> (N, C) float32 class probabilities."""
        ...

    def generate_ids(
        self,
        prompt_ids: list[int],
        window: int,
        sampling: SamplingConfig,
        use_cache: bool = True,
        on_token: Callable[[int], Any] | None = None,
    ) -> list[int]:
        """New token ids sampled after ``prompt_ids`` (:func:`aiayn.decode.generate.generate`)."""
        ...

    def image_probs(self, images: np.ndarray) -> Tensor:
        """Shape: uint8 images (N, C, H, W) -> (N, K) float32 class probabilities."""
        ...


class Steps(Protocol):
    """What a backend that declares "steps" has: a translation that sentences join and leave
    between decoder steps (:class:`~aiayn.decode.continuous.RunningTranslation`), for the
    server's step-level batching."""

    def running_translation(self, cfg: DecodeConfig) -> Any:
        """A new, empty running translation with the settings ``cfg``."""
        ...


class Attention(Protocol):
    """What a backend that declares "attention" has: the attention weights of its model reading
    a sentence pair (the attention view, alignments)."""

    cfg: ModelConfig

    def attention(self, src_ids: Sequence[int], tgt_ids: Sequence[int]) -> AttentionMaps:
        """Every layer's attention weights of the model reading ``tgt_ids`` (BOS first, teacher
        forced) after the source ``src_ids`` (:func:`~aiayn.decode.align.record_attention`)."""
        ...


class Module(Protocol):
    """What a backend that declares "module" has: the PyTorch module it runs."""

    def torch_module(self) -> nn.Module:
        """The model (an Ensemble of them for several folders), in eval mode."""
        ...


def require(backend: Declares, capability: str, hint: str = "") -> None:
    """:class:`Unsupported` naming the backend when it lacks ``capability`` (``hint``: what to do
    instead, appended)."""
    if capability not in backend.capabilities:
        refuse(backend, capability, hint)


def refuse(backend: Declares, capability: str, hint: str = "") -> NoReturn:
    """Raise :class:`Unsupported`: the backend has no ``capability``."""
    raise Unsupported(
        f"the {backend.name} backend has no {CAPABILITIES[capability]}"
        + (f" ({hint})" if hint else "")
    )
