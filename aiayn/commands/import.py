"""`aiayn import hf`: a Hugging Face Marian (OPUS-MT) folder as an aiayn model folder
(docs/huggingface.md)."""

from __future__ import annotations

import argparse
import logging

from aiayn.commands.options import add_output_folder_options

log = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "import",
        description="Turn a local Hugging Face Marian folder (config.json, model.safetensors or "
        "pytorch_model.bin, source.spm, target.spm, vocab.json, generation_config.json) into an "
        "aiayn model folder that translate, evaluate, serve, export and aiayn.load open "
        "unchanged. Its generation settings become the folder's decoding settings.",
    )
    p.add_argument("source_format", choices=("hf",), help="hf: a Hugging Face MarianMTModel")
    p.add_argument("source", metavar="PATH", help="the Hugging Face model folder")
    add_output_folder_options(p, "PATH", "the aiayn model folder to write (a new one)")
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    from aiayn.interop.marian import import_marian

    out = import_marian(args.source, args.out, args.overwrite)
    log.info("wrote %s (imported from %s)", out, args.source)
    return 0
