"""The ONNX Runtime backend: graphs written by ``aiayn export --format onnx``, behind aiayn's search.

Shape legend: B sentences · N decoder rows (B, or B·k with a beam of k) · S source len · T new
tokens · V vocab · C classes.

An ONNX model has the methods aiayn's decoding code calls on a model (no weights: it runs on the
CPU, and says so through :class:`OnnxBackend`'s ``device``), so that greedy search, beam search,
n-best lists, ensembles (:class:`~aiayn.decode.ensemble.Ensemble`), classification and sampling
run unchanged:

- :class:`OnnxTranslator`: ``encode(src)``, ``init_cache(memory, src)`` and
  ``decode(tgt, memory, cache)`` of a :class:`~aiayn.model.Transformer`. Its cache *is* a
  :class:`~aiayn.model.cache.DecoderCache` holding the ONNX outputs as tensors (so ``length``,
  ``with_beam`` and ``reorder`` behave exactly as for the PyTorch model);
- :class:`OnnxLM`: ``forward(ids, cache)`` and ``init_cache()`` of a
  :class:`~aiayn.model.TransformerLM`;
- :class:`OnnxClassifier`: ``forward(ids) -> logits`` of a
  :class:`~aiayn.model.TransformerClassifier`.

It has no attention weights and no bf16 autocast (quantise at export instead).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from aiayn.config import ModelConfig
from aiayn.decode.classify import predict_ids
from aiayn.decode.config import DecodeConfig, SamplingConfig
from aiayn.decode.generate import generate
from aiayn.decode.images import image_probs
from aiayn.decode.search import Hypothesis
from aiayn.decode.translate import translate_ids
from aiayn.errors import CheckpointError, require
from aiayn.kinds import get_kind
from aiayn.model.cache import DecoderCache, LayerCache

log = logging.getLogger(__name__)

#: the keys of config.json "files" that name an exported folder's graphs
ENCODER, DECODER, CLASSIFIER = "encoder", "decoder", "classifier"

__all__ = [
    "OnnxTranslator",
    "OnnxLM",
    "OnnxClassifier",
    "OnnxImageClassifier",
    "OnnxBackend",
    "open_onnx",
]


class _Engine:
    """What an ONNX model shares: its config (special ids, sizes)."""

    def __init__(self, cfg: ModelConfig) -> None:
        self.cfg = cfg


def state_names(prefix: str, n_layers: int) -> list[str]:
    """[prefix_k.0, prefix_v.0, prefix_k.1, …]: one key and one value tensor per layer."""
    return [f"{prefix}_{kv}.{i}" for i in range(n_layers) for kv in ("k", "v")]


def _session(path: Path, threads: int | None) -> Any:
    """An ONNX Runtime session of one graph; CheckpointError when the file is missing or corrupt."""
    ort = require("onnxruntime", "export", "running an ONNX model")
    if not path.is_file():
        raise CheckpointError(f"{path}: not found (the exported folder is incomplete)")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or torch.get_num_threads()
    options.inter_op_num_threads = 1
    options.log_severity_level = 4  # errors come back as exceptions, not as log lines
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime raises its own Fail/InvalidGraph/… types
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"{path}: not a readable ONNX graph ({first[:200]})") from None


def _check_graph(
    session: Any,
    path: Path,
    checks: dict[str, dict[int, tuple[str, int]]],
    state: tuple[str, int] | None = None,
) -> None:
    """CheckpointError when config.json's model section does not describe the graph at ``path``
    (an edited config.json, or a graph from another export). ``checks`` maps an input or output
    to ``{axis: (config field, value)}`` for its fixed axes; ``state`` is the prefix of the
    per-layer key/value tensors and the number of decoder layers config.json gives."""
    shapes = {a.name: a.shape for a in (*session.get_inputs(), *session.get_outputs())}
    found: list[tuple[str, int, int]] = []
    if state is not None:
        prefix, layers = state
        found.append(
            ("n_decoder_layers", layers, sum(n.startswith(f"{prefix}_k.") for n in shapes))
        )
    for name, axes in checks.items():
        shape = shapes.get(name)
        if shape is None:
            raise CheckpointError(f"{path}: has no '{name}' (not a graph of this kind of model)")
        found += [(field, value, shape[axis]) for axis, (field, value) in axes.items()]
    for field, value, got in found:
        if isinstance(got, int) and got != value:  # a named (dynamic) axis fits any value
            raise CheckpointError(
                f"{path.parent}: config.json says {field} = {value}, {path.name} was exported "
                f"with {got} (the folder's parts come from different models)"
            )


def _head_checks(cfg: ModelConfig, prefix: str) -> dict[str, dict[int, tuple[str, int]]]:
    """The fixed axes of layer 0's keys and values (rows, H, length, K or Kv)."""
    return {
        f"{prefix}_k.0": {1: ("n_heads", cfg.n_heads), 3: ("d_k", cfg.head_dim_k)},
        f"{prefix}_v.0": {3: ("d_v", cfg.head_dim_v)},
    }


def _run(session: Any, feeds: dict[str, np.ndarray]) -> list[Tensor]:
    """Run a session; its outputs as CPU tensors sharing the numpy buffers."""
    return [torch.from_numpy(out) for out in session.run(None, feeds)]


def _numpy(t: Any) -> np.ndarray:
    return np.ascontiguousarray(t.detach().cpu().numpy())


def _past(layer: LayerCache, rows: int, heads: int, d_k: int, d_v: int) -> tuple[np.ndarray, ...]:
    """A layer's cached self-attention keys/values, or empty ones (rows, H, 0, K) at the start."""
    if layer.self_k is None:
        return (
            np.zeros((rows, heads, 0, d_k), np.float32),
            np.zeros((rows, heads, 0, d_v), np.float32),
        )
    return _numpy(layer.self_k), _numpy(layer.self_v)


@dataclass
class OnnxMemory:
    """What the encoder graph gives the decoder: the source mask and cross-attention keys/values."""

    mask: Tensor  # (B, 1, 1, S) True at real source tokens
    cross: list[Tensor]  # [k0, v0, k1, v1, …] each (B, H, S, K)


class OnnxTranslator(_Engine):
    """A translation model exported by :func:`aiayn.export.onnx.export_translation`."""

    def __init__(
        self, folder: Path, cfg: ModelConfig, files: dict[str, str], threads: int | None = None
    ) -> None:
        super().__init__(cfg)
        self.encoder = _session(folder / files[ENCODER], threads)
        self.decoder = _session(folder / files[DECODER], threads)
        self.n_layers = cfg.n_decoder_layers
        memory = {"memory": {2: ("d_model", cfg.d_model)}}
        logits = {"logits": {2: ("tgt_vocab_size", cfg.tgt_vocab_size)}}
        cross, past = ("cross", self.n_layers), ("past", self.n_layers)
        _check_graph(
            self.encoder, folder / files[ENCODER], memory | _head_checks(cfg, "cross"), cross
        )
        _check_graph(
            self.decoder, folder / files[DECODER], logits | _head_checks(cfg, "past"), past
        )
        self._past_names = state_names("past", self.n_layers)
        self._cross_names = state_names("cross", self.n_layers)

    def encode(self, src: Tensor) -> OnnxMemory:
        """Shape: src (B, S) -> the source mask and every layer's cross-attention K/V."""
        memory_and_cross = _run(self.encoder, {"src": _numpy(src.long())})
        return OnnxMemory((src != self.cfg.pad_id)[:, None, None, :].cpu(), memory_and_cross[1:])

    def init_cache(self, memory: OnnxMemory, src: Tensor | None = None) -> DecoderCache:
        layers = [
            LayerCache(cross_k=memory.cross[2 * i], cross_v=memory.cross[2 * i + 1])
            for i in range(self.n_layers)
        ]
        return DecoderCache(layers, memory.mask)

    def log_probs(self, tgt: Tensor, memory: OnnxMemory, cache: DecoderCache) -> Tensor:
        """The :class:`~aiayn.decode.step.Seq2SeqModel` step: (N, T, V) float32 normalised
        log-probabilities of :meth:`decode`'s logits."""
        return torch.log_softmax(self.decode(tgt, memory, cache).float(), dim=-1)

    def decode(self, tgt: Tensor, memory: OnnxMemory, cache: DecoderCache) -> Tensor:
        """Shape: tgt (N, T) tokens after the cache's ``length`` -> logits (N, T, V); the cache
        is extended (in place) by the step's present keys/values."""
        mask: Any = cache.memory_mask  # (B, 1, 1, S), set by init_cache
        feeds = {"tokens": _numpy(tgt.long()), "src_mask": _numpy(mask[:, 0, 0, :])}
        for i, layer in enumerate(cache.layers):
            feeds[self._cross_names[2 * i]] = _numpy(layer.cross_k)
            feeds[self._cross_names[2 * i + 1]] = _numpy(layer.cross_v)
        return _cached_step(self, self.decoder, feeds, tgt, cache)


def _cached_step(
    engine: Any, session: Any, feeds: dict[str, Any], tokens: Tensor, cache: DecoderCache
) -> Tensor:
    """One decoder step of an ONNX graph whose self-attention cache is explicit: ``feeds`` with
    every layer's past keys/values added, run, the present ones stored back in ``cache``.
    Shape: tokens (N, T) -> logits (N, T, V)."""
    heads, d_k, d_v = engine.cfg.n_heads, engine.cfg.head_dim_k, engine.cfg.head_dim_v
    for i, layer in enumerate(cache.layers):
        past = _past(layer, tokens.size(0), heads, d_k, d_v)
        feeds[engine._past_names[2 * i]], feeds[engine._past_names[2 * i + 1]] = past
    logits, *present = _run(session, feeds)
    for i, layer in enumerate(cache.layers):
        layer.self_k, layer.self_v = present[2 * i], present[2 * i + 1]
    cache.length += tokens.size(1)
    return logits


class OnnxLM(_Engine):
    """A language model exported by :func:`aiayn.export.onnx.export_lm`."""

    def __init__(
        self, folder: Path, cfg: ModelConfig, files: dict[str, str], threads: int | None = None
    ) -> None:
        super().__init__(cfg)
        self.decoder = _session(folder / files[DECODER], threads)
        self._past_names = state_names("past", cfg.n_decoder_layers)
        logits = {"logits": {2: ("tgt_vocab_size", cfg.tgt_vocab_size)}}
        past = ("past", cfg.n_decoder_layers)
        _check_graph(
            self.decoder, folder / files[DECODER], logits | _head_checks(cfg, "past"), past
        )

    def init_cache(self) -> DecoderCache:
        return DecoderCache.empty(self.cfg.n_decoder_layers)

    def __call__(self, ids: Tensor, cache: DecoderCache | None = None) -> Tensor:
        """Shape: ids (N, T) -> logits (N, T, V). Without a cache the sequence starts at position 0
        (no padding mask: a generated text has none)."""
        cache = self.init_cache() if cache is None else cache
        return _cached_step(self, self.decoder, {"tokens": _numpy(ids.long())}, ids, cache)


class OnnxClassifier(_Engine):
    """A classifier exported by :func:`aiayn.export.onnx.export_classifier`."""

    def __init__(
        self, folder: Path, cfg: ModelConfig, files: dict[str, str], threads: int | None = None
    ) -> None:
        super().__init__(cfg)
        self.session = _session(folder / files[CLASSIFIER], threads)
        logits = {"logits": {1: ("n_classes", cfg.n_classes)}}
        _check_graph(self.session, folder / files[CLASSIFIER], logits)

    def __call__(self, ids: Tensor) -> Tensor:
        """Shape: ids (B, S) padded with ``cfg.pad_id`` -> logits (B, C)."""
        return _run(self.session, {"ids": _numpy(ids.long())})[0]


class OnnxImageClassifier(_Engine):
    """A Vision Transformer exported by :func:`aiayn.export.onnx.export_image_classifier`."""

    def __init__(
        self, folder: Path, cfg: ModelConfig, files: dict[str, str], threads: int | None = None
    ) -> None:
        super().__init__(cfg)
        self.session = _session(folder / files[CLASSIFIER], threads)
        side = ("image_size", cfg.image_size)
        checks = {
            "logits": {1: ("n_classes", cfg.n_classes)},
            "pixels": {1: ("channels", cfg.channels), 2: side, 3: side},
        }
        _check_graph(self.session, folder / files[CLASSIFIER], checks)

    def __call__(self, pixels: Tensor) -> Tensor:
        """Shape: pixels (B, C, H, W) float32 in [0, 1] -> logits (B, K)."""
        return _run(self.session, {"pixels": _numpy(pixels.float())})[0]


class OnnxBackend:
    """An ONNX model (or an ensemble of ONNX translation models), run by ONNX Runtime on the CPU
    behind aiayn's own search."""

    name = "onnx"
    capabilities = frozenset(
        {"translate", "nbest", "ensemble", "generate", "classify", "classify_images"}
    )
    device = torch.device("cpu")

    def __init__(self, model: Any) -> None:
        self.model = model  # OnnxTranslator, an Ensemble of them, OnnxLM or OnnxClassifier
        self.cfg: ModelConfig = model.cfg

    def parameters(self) -> list[Tensor]:
        return []

    def translate_ids(
        self,
        sources: Sequence[list[int]],
        cfg: DecodeConfig,
        progress: Callable[[int], None] | None = None,
        prefixes: Sequence[list[int]] | None = None,
    ) -> list[list[Hypothesis]]:
        return translate_ids(self.model, sources, cfg, progress, self.device, prefixes)

    def class_probs(self, ids: Sequence[Sequence[int]], max_tokens: int | None) -> Tensor:
        return predict_ids(self.model, ids, max_tokens, self.device)

    def generate_ids(
        self,
        prompt_ids: list[int],
        window: int,
        sampling: SamplingConfig,
        use_cache: bool = True,
        on_token: Callable[[int], Any] | None = None,
    ) -> list[int]:
        return generate(self.model, prompt_ids, window, sampling, use_cache, on_token, self.device)

    def image_probs(self, images: np.ndarray) -> Tensor:
        return image_probs(self.model, images)


def open_onnx(
    folder: Path, kind: str, cfg: ModelConfig, files: dict[str, str], threads: int
) -> Any:
    """The ONNX model of ``kind`` in ``folder`` (its graphs named by config.json "files"), its
    sessions on ``threads`` intra-op threads; CheckpointError when a graph is missing or does not
    fit config.json."""
    engine = get_kind(kind).engine("onnx")  # OnnxTranslator, OnnxLM, OnnxClassifier
    if engine is None:
        raise CheckpointError(f"{folder}: no ONNX engine for a '{kind}' model")
    try:
        return engine(folder, cfg, files, threads)
    except KeyError as err:
        raise CheckpointError(f"{folder / 'config.json'}: 'files' lacks {err}") from None
