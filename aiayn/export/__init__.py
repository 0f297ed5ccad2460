"""Deployment: export a model folder to ONNX or CTranslate2, and run what was exported.

``aiayn export MODEL_DIR --format onnx|ctranslate2 -o OUT_DIR`` writes a folder that holds the
graphs (or the CTranslate2 model), ``tokenizer.json`` and ``config.json``: the model's kind,
config and decoding settings, plus ``"format"`` (what wrote it). ``aiayn translate OUT_DIR`` and
``aiayn evaluate OUT_DIR`` then run it (:mod:`aiayn.runtime`), once the folder's parts
are checked against the record ``"parts"`` of config.json (:mod:`aiayn.folder.parts`). The
exporters need the extras ``export`` (onnx, onnxruntime) and ``ctranslate2``; the core package
does not.
"""

from __future__ import annotations

from pathlib import Path

from aiayn.errors import ConfigError, require
from aiayn.export.ctranslate2 import Ct2Exporter
from aiayn.export.exporter import QUANTIZATIONS, Exporter, ExportOptions
from aiayn.export.hf import HfExporter
from aiayn.export.onnx import OnnxExporter
from aiayn.runtime import ENGINES

__all__ = [
    "EXPORTERS",
    "FORMATS",
    "QUANTIZATIONS",
    "ExportOptions",
    "Exporter",
    "export_model",
    "require",
]

#: "torch" is a plain model folder; the others are written by `aiayn export`
FORMATS = ENGINES
#: the export formats, by `--format` name
EXPORTERS: dict[str, Exporter] = {e.name: e for e in (OnnxExporter(), Ct2Exporter(), HfExporter())}


def export_model(
    source: str | Path,
    fmt: str,
    out: str | Path,
    quantization: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Export the model folder ``source`` as ``fmt`` ('onnx', 'ctranslate2' or 'hf': a Hugging
    Face Marian folder, :mod:`aiayn.export.hf`) into ``out`` (:meth:`Exporter.export`).

    ``quantization`` (CTranslate2 only) is one of :data:`QUANTIZATIONS` (default float32). An
    option the format cannot express is a ConfigError that names it. Returns ``out``.
    """
    if fmt not in EXPORTERS:
        raise ConfigError(f"--format must be one of {', '.join(EXPORTERS)}, got '{fmt}'")
    return EXPORTERS[fmt].export(source, out, ExportOptions(quantization, overwrite))
