"""The ``aiayn`` command line: a thin layer over the library.

Each sub-command lives in ``aiayn/commands/<name>.py`` and defines ``add_parser(subparsers)``
returning its parser, with ``parser.set_defaults(run=callable)``. Errors caused by user input
(:class:`aiayn.errors.AiaynError`) print one line ``aiayn: error: …`` and exit 2, without a
traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from aiayn.errors import AiaynError

# Sub-command modules, in the order `aiayn --help` lists them.
COMMANDS: list[str] = [
    "data",
    "plot",
    "summary",
    "train",
    "average",
    "translate",
    "evaluate",
    "classify",
    "generate",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aiayn", description="The Transformer of 'Attention Is All You Need', as tools."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"aiayn.commands.{name}").add_parser(sub)
    return parser


# Options that name an output file, in every command that has them: checked before any work.
OUTPUT_FILES = {"output": "--output", "hyps": "--hyps"}


def check_outputs(args: argparse.Namespace) -> None:
    """Refuse an output file that cannot be written (a folder, a path under a file, an
    unwritable place) before a model is loaded or a step trained."""
    from aiayn.io import check_output_file

    for name, flag in OUTPUT_FILES.items():
        path = getattr(args, name, None)
        if isinstance(path, str):
            check_output_file(path, flag)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
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
