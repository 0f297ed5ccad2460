"""The ``aiayn`` command line: a thin layer over the library.

Each sub-command lives in ``aiayn/commands/<name>.py`` and defines ``add_parser(subparsers)``
returning its parser, with ``parser.set_defaults(run=callable)``. Errors caused by user input
(:class:`aiayn.errors.AiaynError`) print one line ``aiayn: error: …`` and exit 2, without a
traceback.

A run imports the module of the command it names and no other: ``aiayn --help``, ``aiayn
--version`` and a bare ``aiayn`` import none, and so neither torch nor numpy (tests/test_cli_help.py
holds it). The line ``aiayn --help`` gives each command lives in :data:`COMMANDS`, for that reason.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Iterable
from typing import Any

from aiayn.errors import AiaynError

# Sub-command modules, in the order `aiayn --help` lists them, each with its line there (the one
# home of that line: the list is printed without importing the modules).
COMMANDS: dict[str, str] = {
    "data": "list, download and inspect datasets; train a tokenizer",
    "plot": "draw positional encodings, attention maps or learning curves (PNG)",
    "summary": "print a Keras-style parameter summary",
    "train": "train a model (the paper's recipe; resumable; torchrun for DDP)",
    "average": "average a run's last N checkpoints (paper: 5)",
    "translate": "translate text with a trained model (beam search)",
    "evaluate": "BLEU/chrF of a model on a test split or your files (accuracy for a classifier)",
    "classify": "label texts with a trained classifier (IMDB sentiment)",
    "generate": "generate text with a trained language model (sampling)",
    "serve": "serve a model over HTTP: JSON API with dynamic batching, and a web page",
    "export": "export a model folder to ONNX, CTranslate2 or Hugging Face (for --engine)",
    "import": "import a Hugging Face Marian (OPUS-MT) model folder",
}


# One example per command, the last line of its --help (a command's own epilog= wins).
EXAMPLES: dict[str, str] = {
    "data": "aiayn data prepare multi30k",
    "plot": "aiayn plot curves runs/demo/m1 -o curves.png",
    "summary": "aiayn summary base --set model.src_vocab_size=37000 --set model.d_model=256",
    "train": "aiayn train configs/multi30k_demo.toml --out runs/demo/m1",
    "average": "aiayn average runs/demo/m1 --last 5 -o runs/demo/m1/avg5",
    "translate": 'echo "A dog is running through the snow." | aiayn translate runs/demo/m1/avg5',
    "evaluate": "aiayn evaluate runs/demo/m1/avg5 --split test_2016_flickr",
    "classify": 'echo "A wonderful, moving film." | aiayn classify runs/imdb/avg5',
    "generate": 'aiayn generate runs/shakespeare_char/best --prompt "ROMEO:" --seed 1',
    "serve": "aiayn serve runs/demo/m1/avg5",
    "export": "aiayn export runs/demo/m1/avg5 --format onnx -o runs/demo/onnx",
    "import": "aiayn import hf opus-mt-en-de -o models/opus-mt-en-de",
}
FIRST_STEPS = """first steps:
  source .venv/bin/activate  in a checkout, after make: puts aiayn on PATH (or run .venv/bin/aiayn)
  make quick                 a first model in 3 minutes and two translations
  make demo && make test     train, translate and score a 15-minute model; run the tests
  aiayn train configs/multi30k_demo.toml --out runs/x
  aiayn translate runs/x/best

'aiayn COMMAND --help' lists a command's options; the guide is docs/index.md.

Example: echo "A man rides a bike." | aiayn translate runs/x/best"""


class _HelpFormatter(argparse.HelpFormatter):
    """Wraps descriptions as usual but prints an epilog (the example, the first steps) as written:
    a command must not be broken across lines."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith(("Example:", "first steps:")):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def version() -> str:
    """``aiayn X.Y.Z``, from the installed package's metadata."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return f"aiayn {installed('aiayn')}"
    except PackageNotFoundError:  # run from a checkout that was never installed
        from aiayn import __version__

        return f"aiayn {__version__}"


def add_global_flags(parser: argparse.ArgumentParser, top: bool) -> None:
    """-v/-q, before the command (``top``) or after it: a sub-command's own copy sets them only
    when given, so that it never resets what was said before the command."""
    group: Any = parser if top else parser.add_argument_group("global options")
    default = False if top else argparse.SUPPRESS
    group.add_argument(
        "-v", "--verbose", action="store_true", default=default, help="log debug lines too"
    )
    group.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=default,
        help="log warnings only (no progress lines or bars)",
    )


def sub_parsers(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    """Every command's parser, nested ones too (``data prepare``), as ("data prepare", parser)."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.append((name, sub))
                found += [(f"{name} {n}", p) for n, p in sub_parsers(sub)]
    return found


class _Commands(argparse._SubParsersAction):
    """The sub-commands' action: each command is listed with its line of :data:`COMMANDS`."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        kwargs.setdefault("help", COMMANDS[name])
        return super().add_parser(name, **kwargs)


def build_parser(load: Iterable[str] | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``load``, only those commands' parsers (and modules): the
    others are listed, as in ``aiayn --help``, by name and line, and take no arguments."""
    parser = argparse.ArgumentParser(
        prog="aiayn",
        description="The Transformer of 'Attention Is All You Need', as tools.",
        epilog=FIRST_STEPS,
        formatter_class=_HelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=version(), help="print aiayn's version and exit"
    )
    add_global_flags(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, action=_Commands)
    loaded = set(COMMANDS if load is None else load)
    for name in COMMANDS:
        if name not in loaded:
            sub.add_parser(name)
            continue
        command = importlib.import_module(f"aiayn.commands.{name}").add_parser(sub)
        if command.epilog is None and name in EXAMPLES:
            command.epilog = f"Example: {EXAMPLES[name]}"
    for _, command in sub_parsers(parser):
        if command.formatter_class is argparse.HelpFormatter:
            command.formatter_class = _HelpFormatter
        add_global_flags(command, top=False)
    return parser


# Options that name an output file, in every command that has them: checked before any work.
OUTPUT_FILES = {"output": "--out", "hyps": "--hyps"}
# Options that name what a command reads (files and folders): no output may be one of them.
INPUT_PATHS = ("model", "model_dir", "run_dir", "input", "src", "ref", "prefixes", "config")


def command_inputs(args: argparse.Namespace) -> list[str]:
    """The files and folders the command line names as inputs (each of :data:`INPUT_PATHS`)."""
    found: list[str] = []
    for name in INPUT_PATHS:
        value = getattr(args, name, None)
        found += [value] if isinstance(value, str) else list(value or [])
    return [v for v in found if isinstance(v, str)]


def check_outputs(args: argparse.Namespace) -> None:
    """Refuse an output file that cannot be written (a folder, a path under a file, an
    unwritable place), or that is one of the command's inputs or a part of a model folder
    (:func:`aiayn.io.check_not_input`), before a model is loaded or a step trained."""
    from aiayn.io import check_not_input, check_output_file

    for name, flag in OUTPUT_FILES.items():
        path = getattr(args, name, None)
        if isinstance(path, str) and path != "-":
            check_output_file(path, flag)
            check_not_input(path, command_inputs(args), flag, file=True)


def main(argv: list[str] | None = None) -> int:
    """Run the command ``argv`` (default: this process's arguments); returns the exit code.

    A ``torchrun`` worker (WORLD_SIZE > 1) run as a process of its own leaves at once, its output
    flushed, without the interpreter's teardown: a 2-rank gloo run that had trained, saved and
    left its process group once aborted there ("terminate called without an active exception",
    SIGABRT, after "trained to step 3"), which turned a finished run into a failed one.
    """
    code = _run(argv)
    if argv is None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def log_level(args: argparse.Namespace) -> int:
    """-v: debug lines too; -q: warnings only (-v wins when both are given); else info."""
    return logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO


def named_command(words: list[str]) -> str | None:
    """The command ``words`` name: the first word that is not a flag (the top-level flags take
    no value), when it is one of :data:`COMMANDS`."""
    first = next((w for w in words if not w.startswith("-")), None)
    return first if first in COMMANDS else None


def _run(argv: list[str] | None) -> int:
    words = sys.argv[1:] if argv is None else argv
    command = named_command(words)
    parser = build_parser([command] if command else [])
    if not words:  # bare `aiayn`: the commands and first steps
        print(parser.format_help(), end="")
        return 0
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=log_level(args),
        format="%(message)s",
        stream=sys.stderr,
    )
    try:
        check_outputs(args)
        return int(args.run(args) or 0)
    except AiaynError as err:
        print(f"aiayn: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("aiayn: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as err:  # a read or write that no command turned into an AiaynError
        where = f"{err.filename}: " if err.filename else ""
        print(f"aiayn: error: {where}{err.strerror or err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
