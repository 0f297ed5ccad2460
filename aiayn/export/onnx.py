"""Write a model as ONNX graphs (``aiayn export --format onnx``), run by ONNX Runtime.

A translation model becomes two graphs: ``encoder.onnx`` (src ids -> memory and every decoder
layer's cross-attention keys/values) and ``decoder.onnx`` (one step: new tokens, the source
padding mask, the cross-attention and past self-attention keys/values -> logits and the present
keys/values). A language model becomes one step graph, ``decoder.onnx``, without the
cross-attention inputs; a classifier one graph, ``classifier.onnx`` (ids -> logits). Batch,
source length, new tokens and past length are dynamic axes. The graphs and their cache layout
are described in :mod:`aiayn.export.graphs`.

Exported with ``torch.onnx.export(..., dynamo=False)``, torch's TorchScript-based exporter: it
traces the graph modules on example inputs and maps ``dynamic_axes`` onto named dimensions, and
needs nothing beyond ``onnx`` (the torch.export-based exporter would also need ``onnxscript``).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from aiayn.export.exporter import ExportOptions, FolderExporter
from aiayn.export.graphs import (
    ClassifierGraph,
    DecoderStepGraph,
    EncoderGraph,
    ImageClassifierGraph,
    LMStepGraph,
)
from aiayn.kinds import check_kind, get_kind
from aiayn.runtime.onnx_backend import CLASSIFIER, DECODER, ENCODER, state_names

OPSET = 17  # LayerNormalization is a single op from opset 17 on
ENCODER_FILE, DECODER_FILE, CLASSIFIER_FILE = "encoder.onnx", "decoder.onnx", "classifier.onnx"


def _export(
    module: nn.Module,
    args: tuple,
    path: Path,
    inputs: list[str],
    outputs: list[str],
    axes: dict[str, dict[int, str]],
) -> None:
    with warnings.catch_warnings(), torch.no_grad():
        # The TorchScript exporter announces its deprecation (and traces tensor shapes it knows
        # to be dynamic); neither concerns the user of `aiayn export`.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            args,
            str(path),
            dynamo=False,
            input_names=inputs,
            output_names=outputs,
            dynamic_axes=axes,
            opset_version=OPSET,
            do_constant_folding=True,
        )


def _example_ids(cfg, vocab_size: int) -> torch.Tensor:
    """Two example rows of 4 tokens, the second ending in 2 padding tokens. -> (2, 4)."""
    ids = torch.full((2, 4), vocab_size - 1, dtype=torch.long)
    ids[1, 2:] = cfg.pad_id
    return ids


def _example_state(model: Any, rows: int, length: int) -> list[torch.Tensor]:
    """Zero keys/values (rows, H, length, K or Kv) for every decoder layer."""
    state = []
    for layer in model.decoder.layers:
        attn = layer.self_attn
        state += [
            torch.zeros(rows, attn.n_heads, length, attn.d_k),
            torch.zeros(rows, attn.n_heads, length, attn.d_v),
        ]
    return state


def export_translation(model: Any, folder: Path) -> dict[str, str]:
    """encoder.onnx and decoder.onnx of a :class:`~aiayn.model.Transformer` into ``folder``."""
    n = len(model.decoder.layers)
    cross, past, present = (
        state_names("cross", n),
        state_names("past", n),
        state_names("present", n),
    )
    src = _example_ids(model.cfg, model.cfg.src_vocab_size)  # (B=2, S=4)
    _export(
        EncoderGraph(model),
        (src,),
        folder / ENCODER_FILE,
        ["src"],
        ["memory", *cross],
        {
            "src": {0: "batch", 1: "src_len"},
            "memory": {0: "batch", 1: "src_len"},
            **{name: {0: "batch", 2: "src_len"} for name in cross},
        },
    )
    # Example step: 2 sentences × 2 beams, 3 positions decoded, 2 new tokens.
    cross_state = [
        torch.zeros(2, layer.cross_attn.n_heads, 4, d)
        for layer in model.decoder.layers
        for d in (layer.cross_attn.d_k, layer.cross_attn.d_v)
    ]
    step_args = (
        _example_ids(model.cfg, model.cfg.tgt_vocab_size)[:1, :2].repeat(4, 1),
        src != model.cfg.pad_id,
        *cross_state,
        *_example_state(model, 4, 3),
    )
    axes = {
        **_step_axes(past, present),
        "src_mask": {0: "batch", 1: "src_len"},
        **{name: {0: "batch", 2: "src_len"} for name in cross},
    }
    _export(
        DecoderStepGraph(model),
        step_args,
        folder / DECODER_FILE,
        ["tokens", "src_mask", *cross, *past],
        ["logits", *present],
        axes,
    )
    return {ENCODER: ENCODER_FILE, DECODER: DECODER_FILE}


def _step_axes(past: list[str], present: list[str]) -> dict[str, dict[int, str]]:
    """The dynamic axes of a cached decoder step: rows, new tokens, and the cache's length before
    (past) and after (present) the step."""
    return {
        "tokens": {0: "rows", 1: "new"},
        "logits": {0: "rows", 1: "new"},
        **{name: {0: "rows", 2: "past"} for name in past},
        **{name: {0: "rows", 2: "total"} for name in present},
    }


def export_lm(model: Any, folder: Path) -> dict[str, str]:
    """decoder.onnx (one cached step) of a :class:`~aiayn.model.TransformerLM` into ``folder``."""
    n = len(model.decoder.layers)
    past, present = state_names("past", n), state_names("present", n)
    args = (
        _example_ids(model.cfg, model.cfg.tgt_vocab_size)[:1, :2].repeat(2, 1),
        *_example_state(model, 2, 3),
    )
    _export(
        LMStepGraph(model),
        args,
        folder / DECODER_FILE,
        ["tokens", *past],
        ["logits", *present],
        _step_axes(past, present),
    )
    return {DECODER: DECODER_FILE}


def export_classifier(model: Any, folder: Path) -> dict[str, str]:
    """classifier.onnx of a :class:`~aiayn.model.TransformerClassifier` into ``folder``."""
    ids = _example_ids(model.cfg, model.cfg.src_vocab_size)
    _export(
        ClassifierGraph(model),
        (ids,),
        folder / CLASSIFIER_FILE,
        ["ids"],
        ["logits"],
        {"ids": {0: "batch", 1: "len"}, "logits": {0: "batch"}},
    )
    return {CLASSIFIER: CLASSIFIER_FILE}


def export_image_classifier(model: Any, folder: Path) -> dict[str, str]:
    """classifier.onnx of a :class:`~aiayn.model.VisionTransformer` into ``folder``: pixels
    (B, C, H, W) float32 in [0, 1] -> logits (B, K), any batch size."""
    cfg = model.cfg
    pixels = torch.rand(2, cfg.channels, cfg.image_size, cfg.image_size)
    _export(
        ImageClassifierGraph(model),
        (pixels,),
        folder / CLASSIFIER_FILE,
        ["pixels"],
        ["logits"],
        {"pixels": {0: "batch"}, "logits": {0: "batch"}},
    )
    return {CLASSIFIER: CLASSIFIER_FILE}


class OnnxExporter(FolderExporter):
    """``aiayn export --format onnx``: the graphs of a translation model, a language model or a
    classifier."""

    name = "onnx"
    dependency = ("onnx", "export")

    def check(self, model: Any, kind: str, tokenizer: Any) -> None:
        """ConfigError when there is no ONNX graph for this kind of model."""
        check_kind(self.name, kind)

    def write(
        self, model: Any, kind: str, tokenizer: Any, folder: Path, options: ExportOptions
    ) -> dict:
        """The graphs of ``model`` into ``folder``; the config.json entries that name them."""
        model.eval()
        files = get_kind(kind).exporter(self.name)(model, folder)  # export_translation, …
        return {"files": files, "onnx_opset": OPSET, "torch_version": torch.__version__}
