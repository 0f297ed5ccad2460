"""Deployment: export a model folder to ONNX or CTranslate2, and run what was exported.

``aiayn export MODEL_DIR --format onnx|ctranslate2 -o OUT_DIR`` writes a folder that holds the
graphs (or the CTranslate2 model), ``tokenizer.json`` and ``config.json``: the model's kind,
config and decoding settings, plus ``"format"`` (what wrote it). ``aiayn translate OUT_DIR`` and
``aiayn evaluate OUT_DIR`` then run it (:mod:`aiayn.export.engines`), once the folder's parts
are checked against the record ``"parts"`` of config.json (:mod:`aiayn.folder_parts`). The
exporters need the extras ``export`` (onnx, onnxruntime) and ``ctranslate2``; the core package
does not.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from aiayn.errors import CheckpointError, ConfigError

if TYPE_CHECKING:
    from aiayn.folder_config import FolderConfig

# "torch" is a plain model folder; the others are written by `aiayn export`.
FORMATS = ("torch", "onnx", "ctranslate2")
# What `aiayn export --format` writes: the engines' formats, and a Hugging Face folder (which
# aiayn runs again only through `aiayn import hf`).
EXPORT_FORMATS = (*FORMATS[1:], "hf")
# CTranslate2's weight types (`ctranslate2.specs.model_spec.ACCEPTED_MODEL_TYPES`) that run on a CPU.
QUANTIZATIONS = ("float32", "int8", "int8_float32", "bfloat16", "int8_bfloat16", "int16")


def require(module: str, extra: str, purpose: str) -> ModuleType:
    """Import an optional dependency, or a one-line ConfigError naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(
            f"{purpose} needs the '{extra}' extra: pip install 'aiayn[{extra}]'"
        ) from None


def _load_source(folder: Path) -> tuple[Any, str, Any, FolderConfig]:
    """(model, kind, tokenizer, parsed config.json) of a plain model folder, with the loader's
    own errors."""
    from aiayn.folder import load_model_folder
    from aiayn.folder_config import read_folder_config

    parsed = read_folder_config(folder)
    if parsed.format is not None:
        raise CheckpointError(
            f"{folder}: already an exported '{parsed.format}' model; export the model "
            "folder it was written from"
        )
    loaded = load_model_folder(folder)  # the one loader: its checks and messages
    return loaded.model, loaded.kind, loaded.tokenizer, parsed


def export_model(
    source: str | Path,
    fmt: str,
    out: str | Path,
    quantization: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Export the model folder ``source`` as ``fmt`` ('onnx', 'ctranslate2' or 'hf': a Hugging
    Face Marian folder, :mod:`aiayn.export.hf`) into ``out``.

    ``quantization`` (CTranslate2 only) is one of :data:`QUANTIZATIONS` (default float32). An
    option the format cannot express is a ConfigError that names it. Returns ``out``.
    """
    from aiayn.card import write_model_card
    from aiayn.folder_config import parse_folder_config, write_folder_config
    from aiayn.folder_parts import record_parts
    from aiayn.io import check_not_input, check_output_folder, new_folder

    source, out = Path(source), Path(out)
    if fmt not in EXPORT_FORMATS:
        raise ConfigError(f"--format must be one of {', '.join(EXPORT_FORMATS)}, got '{fmt}'")
    if quantization is not None and fmt != "ctranslate2":
        raise ConfigError("--quantization applies to --format ctranslate2 only")
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ConfigError(
            f"--quantization must be one of {', '.join(QUANTIZATIONS)}, got '{quantization}'"
        )
    check_not_input(out, [source], "-o")  # --overwrite would delete the model being exported
    check_output_folder(out, overwrite)  # before any work
    if fmt == "onnx":
        require("onnx", "export", "--format onnx")
    elif fmt == "ctranslate2":
        require("ctranslate2", "ctranslate2", "--format ctranslate2")
    model, kind, tokenizer, meta = _load_source(source)
    if fmt == "hf":  # a transformers folder, not an aiayn one: its own config.json and card
        from aiayn.export import hf

        hf.check_exportable(model, kind, tokenizer)
        with new_folder(out, overwrite) as tmp:
            hf.write_folder(model, tokenizer, meta.config.decode, tmp, source)
        return out
    if fmt == "onnx":
        from aiayn.export import onnx as writer
    else:
        from aiayn.export import ctranslate2 as writer  # type: ignore[no-redef]
    writer.check_exportable(model, kind)  # before touching the output folder
    with new_folder(out, overwrite) as tmp:
        extra = writer.write(model, kind, tokenizer, tmp, quantization)
        tokenizer.save(tmp / "tokenizer.json")
        # the source's sections as the loader read them (renamed keys under their new names; a
        # section it did not record stays unrecorded), its provenance, and what the writer says
        parts = record_parts(tmp, meta.config.model)  # checked whenever the folder is opened
        written = {**meta.to_dict(), **extra, "exported_from": str(source), "parts": parts}
        written = {"format": fmt, **written, "kind": kind}
        if written.get("decode"):  # bf16 is PyTorch's autocast; an engine runs as exported
            written["decode"] = {**written["decode"], "bf16": False}
        write_folder_config(tmp, parse_folder_config(written, tmp))
        write_model_card(tmp, shown_as=out)  # README.md; a failure is logged, not raised
    return out
