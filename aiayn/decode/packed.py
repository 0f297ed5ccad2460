"""A linear layer's weight prepacked for oneDNN: the output projection of CPU decoding.

Shape legend: N rows · D in features · V out features (the vocabulary).

torch runs an fp32 ``F.linear`` on the CPU through MKL's sgemm, which on non-Intel CPUs takes a
generic code path; oneDNN picks its kernels by instruction set (CTranslate2 makes the same choice
on such CPUs: "SGEMM backend: DNNL"). oneDNN is fastest with the weight reordered once into its
blocked layout, which is what :func:`pack` does. The decoder's output projection, (N, D) × (D, V)
at every step, ran faster packed than through MKL on a 2-core AMD EPYC (several times at one
sentence, less at a thousand rows), with identical outputs
(docs/experiments/decoding_speed.md#native-decoding-against-ctranslate2-where-the-time-and-the-memory-went-2026-11-26).
Under bf16 autocast the packed weight is bf16, which also saves
autocast's cast of the whole (V, D) weight at every step.

The model knows nothing of this: a decoding gives its cache the packed copy
(:class:`Prepacked`, at the first step; :func:`prepacked` wraps a Transformer or an ensemble's
members), and the model uses the cache's ``output`` in place of its own layer. A packed weight is
a copy, made for one decoding call, that never outlives the weights it was made from. The torch
backend (:mod:`aiayn.runtime.torch_backend`) keeps its models' packed copies across decodings
instead (``keep``, :func:`pack_kept`): packing takes milliseconds, and one-sentence
translations ran a little faster with the same output
(docs/experiments/decoding_speed.md#the-decoder-step-compiled-2026-11-26).
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from aiayn.decode.ensemble import Ensemble
from aiayn.model import Transformer

__all__ = ["PackedLinear", "Prepacked", "pack", "pack_kept", "prepacked", "available", "state_of"]


def available(device: torch.device) -> bool:
    """Whether this torch build can run a packed oneDNN linear on ``device``."""
    return (
        device.type == "cpu"
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


@dataclass(frozen=True)
class PackedLinear:
    """``F.linear(x, weight, bias)`` with the weight in oneDNN's layout, computed in ``dtype``."""

    weight: Tensor  # opaque: oneDNN's blocked layout of the (V, D) weight
    bias: Tensor | None  # (V,) in dtype
    dtype: torch.dtype

    def __call__(self, x: Tensor) -> Tensor:
        """Shape: x (..., D) -> (..., V) in ``dtype`` (as autocast's linear returns)."""
        return torch.ops.mkldnn._linear_pointwise(
            x.to(self.dtype), self.weight, self.bias, "none", [], ""
        )


def pack(weight: Tensor, bias: Tensor | None = None) -> PackedLinear | None:
    """``weight`` (V, D) packed for the precision in force (bf16 under CPU autocast, else the
    weight's own); None where a packed linear cannot run (not a CPU tensor, no oneDNN, a dtype
    other than float32 or bfloat16, or gradients wanted: oneDNN's op has no backward): the
    caller then runs the layer itself."""
    dtype = _precision(weight)
    if dtype is None:
        return None
    w = weight.detach().to(dtype)
    b = None if bias is None else bias.detach().to(dtype)
    return PackedLinear(torch.ops.mkldnn._reorder_linear_weight(w), b, dtype)


def _precision(weight: Tensor) -> torch.dtype | None:
    """The dtype of ``weight``'s packed copy now; None where none can run (see :func:`pack`)."""
    if not available(weight.device) or (torch.is_grad_enabled() and weight.requires_grad):
        return None
    dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else weight.dtype
    if dtype == torch.bfloat16 and not bf16_packing():
        return None  # oneDNN packs bf16 only with AVX512-BW/VL/DQ or AVX-NE-CONVERT (e.g. not AVX2)
    return dtype if dtype in (torch.float32, torch.bfloat16) else None


def bf16_packing() -> bool:
    """Whether this CPU runs oneDNN's bf16 packed linear (AVX-512 BW/VL/DQ or AVX-NE-CONVERT):
    where it does not, bf16 decoding runs the output projection unpacked."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


# id(weight) -> {precision: (the state of weight and bias it was made from, the packed copy, the
# tensors' storage held so that no other tensor takes their addresses while the entry is kept)};
# an entry leaves with its weight (by id: a tensor's == is elementwise, so no WeakKeyDictionary)
_KEPT: dict[int, dict[torch.dtype, tuple[tuple, PackedLinear, tuple]]] = {}
_KEPT_LOCK = threading.Lock()  # decoding workers run on threads of their own


def pack_kept(weight: Tensor, bias: Tensor | None = None) -> PackedLinear | None:
    """:func:`pack`, kept with ``weight`` and given again while neither tensor has changed: an
    in-place update (an optimizer step, ``load_state_dict``, ``copy_`` under ``no_grad``) bumps
    a tensor's version, new storage (``.to``, ``.data =``) changes its address, and the next call
    packs anew. An in-place change made through ``.data`` bypasses the version counter and is
    not seen: this is for weights that stay as loaded (inference). Tensors made under
    ``torch.inference_mode`` have no version counter: they are packed at each call."""
    dtype = _precision(weight)
    if dtype is None or weight.is_inference() or (bias is not None and bias.is_inference()):
        return pack(weight, bias)
    state = (state_of(weight), state_of(bias))
    with _KEPT_LOCK:
        kept = _KEPT.get(id(weight), {}).get(dtype)
    if kept is not None and kept[0] == state:
        return kept[1]
    packed = pack(weight, bias)
    if packed is not None:
        held = (weight.detach(), None if bias is None else bias.detach())
        with _KEPT_LOCK:
            if id(weight) not in _KEPT:
                weakref.finalize(weight, _forget, id(weight))
            _KEPT.setdefault(id(weight), {})[dtype] = (state, packed, held)
    return packed


def _forget(key: int) -> None:
    with _KEPT_LOCK:
        _KEPT.pop(key, None)


def state_of(t: Tensor | None) -> tuple[int, int] | None:
    """A tensor's address and version: what an in-place change (the version) or new storage
    (the address) changes. Tensors made under ``torch.inference_mode`` have no version: -1."""
    if t is None:
        return None
    return t.data_ptr(), -1 if t.is_inference() else t._version


class Prepacked(nn.Module):
    """A :class:`~aiayn.model.Transformer` that decodes with its output projection packed (a
    :class:`~aiayn.decode.step.Seq2SeqModel`, as the model itself is): packed at each decoding's
    first step, in the precision in force then, or with ``keep`` once while the weights stay as
    they are (:func:`pack_kept`: models opened for inference). The weights are the model's own
    (a submodule: ``.eval()``, ``.to()`` and ``parameters()`` reach them)."""

    def __init__(self, model: Transformer, keep: bool = False) -> None:
        super().__init__()
        self.model, self.keep, self.cfg = model, keep, model.cfg
        self.train(model.training)  # a wrapper of an eval-mode model is one (no dropout after
        # a decoding that restores the mode it found)

    def encode(self, src: Tensor) -> Tensor:
        return self.model.encode(src)

    def init_cache(self, memory: Tensor, src: Tensor | None = None) -> Any:
        return self.model.init_cache(memory, src=src)

    def project_memory(self, cache: Any, memory: Tensor) -> Any:
        return self.model.project_memory(cache, memory)

    def log_probs(self, tgt: Tensor, memory: Tensor | None, cache: Any) -> Tensor:
        """Shape: tgt (N, T) -> (N, T, V) float32, as :meth:`Transformer.log_probs`."""
        if cache.length == 0 and cache.output is None:  # the bias is final_logits_bias
            packing = pack_kept if self.keep else pack
            cache.output = packing(self.model.generator.weight, self.model.generator.bias)
        return self.model.log_probs(tgt, memory, cache)


def prepacked(model: Any, keep: bool = False) -> Any:
    """``model`` decoding with packed output projections: a Transformer as :class:`Prepacked`,
    an ensemble with each Transformer member so; any other model (already prepacked, compiled,
    an exported engine) as it is."""
    if isinstance(model, Transformer):
        return Prepacked(model, keep)
    if isinstance(model, Ensemble) and any(isinstance(m, Transformer) for m in model.members):
        return Ensemble([prepacked(m, keep) for m in model.members])
    return model
