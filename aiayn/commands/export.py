"""`aiayn export`: a model folder as ONNX graphs or a CTranslate2 model (docs/export.md)."""

from __future__ import annotations

import argparse
import logging

from aiayn.commands.options import add_output_folder_options
from aiayn.export import EXPORTERS, QUANTIZATIONS

log = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "export",
        description="Write MODEL_DIR as ONNX graphs (encoder + a decoder step with its cache as "
        "inputs/outputs; classifier and LM graphs too) or as a CTranslate2 model, with "
        "tokenizer.json and config.json, into OUT_DIR. `aiayn translate OUT_DIR` and "
        "`aiayn evaluate OUT_DIR` run it.",
    )
    p.add_argument(
        "model",
        metavar="MODEL_DIR",
        help="a model folder (config.json, model.safetensors, tokenizer.json)",
    )
    p.add_argument(
        "--format",
        required=True,
        choices=tuple(EXPORTERS),
        help="onnx (run by ONNX Runtime through aiayn's search), ctranslate2, or hf (a Hugging "
        "Face MarianMTModel folder for transformers)",
    )
    p.add_argument(
        "--quantization",
        choices=QUANTIZATIONS,
        help="CTranslate2 weight type (default: float32); int8 is the fast one on CPUs",
    )
    add_output_folder_options(p, "MODEL_DIR", "the folder to write (a new one)")
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    from aiayn.export import export_model

    out = export_model(args.model, args.format, args.out, args.quantization, args.overwrite)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    log.info("wrote %s (%s, %.1f MB)", out, args.format, size / 1e6)
    return 0
