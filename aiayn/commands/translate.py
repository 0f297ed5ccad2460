"""`aiayn translate`: raw text in, one translation per line out (see docs/decoding.md).

Reads a file, stdin, or (when stdin is a terminal) an interactive prompt. Every input line gives
exactly one output line, blank lines included; with ``--nbest K`` each input line gives K lines
``LINE_NO<TAB>SCORE<TAB>TEXT``.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from aiayn.commands.options import (
    add_decode_options,
    add_device,
    add_model_dirs,
    decode_overrides,
    inference_device,
    open_models,
    read_input_lines,
)
from aiayn.kinds import TRANSLATION

if TYPE_CHECKING:
    from aiayn.decode.config import DecodeConfig
    from aiayn.folder import ModelFolder


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "translate",
        help="translate text with a trained model (beam search)",
        description="Translate one sentence per line. Blank lines stay blank.",
    )
    add_model_dirs(p)
    add_decode_options(p)
    add_device(p)
    p.add_argument(
        "--input",
        "-i",
        default="-",
        metavar="FILE|-",
        help="UTF-8 text, one sentence per line (default: stdin; a prompt on a terminal)",
    )
    p.add_argument(
        "--output", "-o", metavar="FILE", help="write here (atomically) instead of stdout"
    )
    p.add_argument(
        "--nbest",
        type=int,
        help="hypotheses per line, as LINE_NO<TAB>SCORE<TAB>TEXT lines (default: 1)",
    )
    p.set_defaults(run=run)
    return p


def one_line(text: str) -> str:
    """``text`` with any line break (\\n, \\r, U+2028, …) replaced by a space."""
    return " ".join(text.splitlines())


def format_output(results: list[list[tuple[str, Any]]], nbest: int) -> list[str]:
    """One line per input line, or ``nbest`` numbered lines per input line (line breaks inside a
    translation become spaces, so that lines stay aligned)."""
    out = []
    for n, hyps in enumerate(results, 1):
        texts = [(one_line(t), h.score) for t, h in hyps] or [("", float("nan"))]
        if nbest == 1:
            out.append(texts[0][0])
        else:
            out += [f"{n}\t{score:.4f}\t{text}" for text, score in (texts * nbest)[:nbest]]
    return out


def interactive(model: ModelFolder, cfg: DecodeConfig) -> int:
    """Translate each line typed at the prompt until end of input."""
    print("Type a sentence and press Enter (Ctrl-D to quit).", file=sys.stderr)
    while True:
        sys.stderr.write("> ")  # the prompt goes to stderr: stdout carries translations only
        sys.stderr.flush()
        line = sys.stdin.readline()
        if not line:
            print(file=sys.stderr)
            return 0
        result = model.translate_hypotheses([line.rstrip("\r\n")], cfg)
        print("\n".join(format_output(result, cfg.nbest)), flush=True)


def run(args: argparse.Namespace) -> int:
    from aiayn.io import write_text

    model = open_models(args, inference_device(args.device), TRANSLATION)
    cfg = model.decode_config(**decode_overrides(args))
    if args.input == "-" and sys.stdin.isatty():
        return interactive(model, cfg)
    results = model.translate_hypotheses(read_input_lines(args.input), cfg)
    text = "".join(line + "\n" for line in format_output(results, cfg.nbest))
    if args.output:
        write_text(args.output, text)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    return 0
