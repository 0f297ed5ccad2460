"""`aiayn translate`: raw text in, one translation per line out (see docs/decoding.md).

Reads a file, stdin, or (when stdin is a terminal) an interactive prompt. Every input line gives
exactly one output line, blank lines included; with ``--nbest K`` each input line gives K lines
``LINE_NO<TAB>SCORE<TAB>TEXT``. ``--alignments`` appends a TAB and the alignment in Pharaoh
format (``0-0 1-2 …``: source token - output token, 0-based) to each line; ``--prefixes FILE``
forces, per input line, the start of its translation (docs/decoding.md).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from aiayn.commands.options import (
    add_decode_options,
    add_device,
    add_input_file,
    add_model_dirs,
    add_output_file,
    decode_overrides,
    inference_device,
    open_models,
    read_input_lines,
)
from aiayn.errors import ConfigError

if TYPE_CHECKING:
    from aiayn.decode.config import DecodeConfig
    from aiayn.folder.load import ModelFolder


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "translate",
        description="Translate one sentence per line (of --input, a pipe, or typed at the "
        "prompt on a terminal). Blank lines stay blank.",
    )
    add_model_dirs(p)
    add_input_file(p, "one sentence")
    add_output_file(p, "write the translations here, atomically")
    add_decode_options(p)
    add_device(p)
    p.add_argument(
        "--nbest",
        type=int,
        help="hypotheses per line, as LINE_NO<TAB>SCORE<TAB>TEXT lines (default: 1)",
    )
    p.add_argument(
        "--prefixes",
        metavar="FILE",
        help="UTF-8 text, one line per input line: the start each translation must have "
        "(forced, then search goes on; a blank line: none)",
    )
    p.add_argument(
        "--alignments",
        action="store_true",
        default=None,
        help="append TAB and the source-output token alignment (Pharaoh 'i-j' pairs, read "
        "from cross-attention; docs/decoding.md) to each line",
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
        texts = [(one_line(t) + _alignment(h), h.score) for t, h in hyps] or [("", float("nan"))]
        if nbest == 1:
            out.append(texts[0][0])
        else:
            out += [f"{n}\t{score:.4f}\t{text}" for text, score in (texts * nbest)[:nbest]]
    return out


def _alignment(hyp: Any) -> str:
    """TAB and the hypothesis's alignment as Pharaoh pairs ("0-0 1-2"), when it has one."""
    if hyp.alignment is None:
        return ""
    return "\t" + " ".join(f"{i}-{j}" for i, j in hyp.alignment)


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
    from aiayn.kinds import TRANSLATION

    overrides = decode_overrides(args)  # a bad --set before the model is loaded
    model = open_models(args, inference_device(args.device), TRANSLATION)
    cfg = model.decode_config(**overrides)
    if args.input == "-" and sys.stdin.isatty():
        if args.prefixes:
            raise ConfigError("--prefixes pairs with the lines of --input FILE or a pipe")
        return interactive(model, cfg)
    lines = read_input_lines(args.input)
    prefixes = read_input_lines(args.prefixes) if args.prefixes else None
    if prefixes is not None and len(prefixes) != len(lines):
        raise ConfigError(
            f"--prefixes {args.prefixes}: {len(prefixes)} lines for {len(lines)} input lines "
            "(one prefix per input line, a blank line for none)"
        )
    results = model.translate_hypotheses(lines, cfg, prefixes=prefixes)
    text = "".join(line + "\n" for line in format_output(results, cfg.nbest))
    if args.output:
        write_text(args.output, text)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    return 0
