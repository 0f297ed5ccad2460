"""Options and helpers shared by the commands: renamed and retired flags (an old spelling still
works, with one warning), ``-i/--input``, ``-o/--out``, ``--set SECTION.KEY=VALUE``, the
"advanced options" group; and, for the commands that use a trained model (translate, evaluate,
classify, generate, serve), the model folders, decoding flags, the engine, the device and input
lines.

Decoding flags default to None: a flag (or ``--set decode.KEY=VALUE``) given overrides the model
folder's ``decode`` settings, which override :class:`~aiayn.decode.config.DecodeConfig`'s
defaults (the only home of them).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from typing import TYPE_CHECKING, Any

import torch

from aiayn.decode.config import DecodeConfig
from aiayn.errors import ConfigError
from aiayn.threads import MOST_WORKERS

if TYPE_CHECKING:
    from aiayn.folder import ModelFolder

DEFAULTS = DecodeConfig()


# ---- flags renamed or retired since: the old spelling still works, with one warning line ------


class _Renamed(argparse.Action):
    """Mixed into a flag's argparse action: an old spelling (``old_spellings``) still works and
    says once, on stderr, what the flag is called now. --help shows the new spellings only."""

    old_spellings: tuple[str, ...] = ()
    warned = False

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        if option_string in self.old_spellings and not self.warned:
            self.warned = True
            new = max((s for s in self.option_strings if s not in self.old_spellings), key=len)
            warn(f"{option_string} is now called {new}")
        super().__call__(parser, namespace, values, option_string)


class _Retired(argparse.Action):
    """Mixed into the action of a flag no longer offered (merged into another, or a setting now
    given another way): it still works, hidden from --help, and says once, on stderr, what to
    write instead (``now``; ``{value}`` stands for the value given)."""

    now = ""
    warned = False

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        if not self.warned:
            self.warned = True
            warn(f"{option_string} is now {self.now.format(value=values)}")
        super().__call__(parser, namespace, values, option_string)


_MIXED: dict[tuple[type, type], type] = {}


def _mix(action: argparse.Action, mixin: type) -> None:
    """Give ``action`` the behaviour of ``mixin`` before that of its own argparse class."""
    base = type(action)
    if (mixin, base) not in _MIXED:
        _MIXED[mixin, base] = type(f"{mixin.__name__[1:]}{base.__name__}", (mixin, base), {})
    action.__class__ = _MIXED[mixin, base]


def warn(message: str) -> None:
    """One line ``aiayn: warning: …`` on stderr (the command line's, before logging is set up)."""
    print(f"aiayn: warning: {message}", file=sys.stderr)


def flag(group: Any, *names: str, old: tuple[str, ...] = (), **kwargs: Any) -> argparse.Action:
    """``group.add_argument(*names, **kwargs)``, also accepting the ``old`` spellings of the flag
    (each with one warning naming the new one)."""
    action = group.add_argument(*names, *old, **kwargs)
    if old:
        _mix(action, _Renamed)
        action.old_spellings = old
    return action


def retired(group: Any, name: str, now: str, **kwargs: Any) -> argparse.Action:
    """A flag taken out of --help that still works (``group.add_argument(name, **kwargs)``) with
    one warning saying what to write instead: ``now``, e.g. "--set decode.min_len={value}"."""
    action = group.add_argument(name, help=argparse.SUPPRESS, **kwargs)
    _mix(action, _Retired)
    action.now = now
    return action


def advanced(p: argparse.ArgumentParser) -> Any:
    """The command's "advanced options" group (expert and benchmark flags), made on first use."""
    for group in p._action_groups:
        if group.title == ADVANCED:
            return group
    return p.add_argument_group(
        ADVANCED, "expert and benchmark settings; the defaults are the measured best"
    )


ADVANCED = "advanced options"


# ---- options shared by several commands -----------------------------------------------------


def add_model_dirs(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "model",
        metavar="MODEL_DIR",
        nargs="+",
        help="a model folder (config.json, model.safetensors, tokenizer.json), e.g. a "
        "run folder or RUN/best; several folders decode as an ensemble (their "
        "next-token probabilities averaged; one shared tokenizer)",
    )


def add_input_file(p: argparse.ArgumentParser, what: str) -> None:
    """``-i/--input FILE|-``: the one name for a file of inputs, one per line."""
    p.add_argument(
        "-i",
        "--input",
        default="-",
        metavar="FILE|-",
        help=f"UTF-8 text, {what} per line (default: stdin)",
    )


def add_output_file(p: Any, what: str, default: str | None = None, shown: str = "stdout") -> None:
    """``-o/--out FILE``: the one spelling of a command's output (was ``--output`` in some)."""
    flag(
        p,
        "-o",
        "--out",
        old=("--output",),
        dest="output",
        metavar="FILE",
        default=default,
        help=f"{what} (default: {default or shown})",
    )


def add_output_folder_options(p: argparse.ArgumentParser, source: str, what: str) -> None:
    """``-o/--out OUT_DIR`` and ``--overwrite`` of a command that writes a folder from
    ``source`` (the metavar of what it reads)."""
    p.add_argument("-o", "--out", required=True, metavar="OUT_DIR", help=what)
    p.add_argument(
        "--overwrite",
        action="store_true",
        help=f"replace OUT_DIR if it exists (never {source} or a folder holding it)",
    )


def add_sets(p: argparse.ArgumentParser, section: str, example: str) -> None:
    """``--set SECTION.KEY=VALUE``, the one syntax of a config override (as in recipes)."""
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar=f"{section}.KEY=VALUE",
        help=f"override a recipe key, e.g. --set {example} (repeatable; every key: "
        "docs/reference/cli.md)",
    )


def section_sets(overrides: list[str], section: str, bare: bool = True) -> dict[str, str]:
    """``--set SECTION.KEY=VALUE`` of one section -> ``{KEY: VALUE}``. A bare ``KEY=VALUE`` (the
    older spelling of `aiayn data` and `aiayn summary`; ``bare``) is taken with one warning."""
    from aiayn.config import parse_override

    values = {}
    for text in overrides:
        key, value = parse_override(text)
        head, dot, rest = key.partition(".")
        if dot and head == section:
            key = rest
        elif dot or not bare:
            raise ConfigError(f"--set {text}: this command takes {section}.KEY=VALUE")
        else:
            warn(f"--set {text} is now --set {section}.{text} (the recipes' SECTION.KEY)")
        values[key] = value
    return values


ENGINE_HELP = (
    "what runs the model: torch runs a model folder, the others a folder written by "
    "`aiayn export` (docs/export.md); default: what MODEL_DIR holds"
)


def add_engine(p: Any) -> None:
    from aiayn.runtime import ENGINES

    p.add_argument("--engine", choices=ENGINES, help=ENGINE_HELP)


def add_decode_options(p: argparse.ArgumentParser) -> None:
    """Decoding flags; each defaults to the model folder's setting, else DecodeConfig's. The
    paper's two (beam, α) are flags; every other search setting is ``--set decode.KEY=VALUE``,
    the recipe's name for it (also the HTTP API's and the Python keyword's)."""
    d = DEFAULTS
    p.add_argument("--beam", type=int, help=f"beam size; 1 = greedy (default: {d.beam}, §6.1)")
    p.add_argument("--alpha", type=float, help=f"GNMT length penalty α (default: {d.alpha}, §6.1)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="decode.KEY=VALUE",
        help="any other decoding setting, by its recipe key: e.g. --set "
        "decode.length_penalty=average, decode.max_len_b=100, decode.no_repeat_ngram_size=3 "
        "(repeatable; every key: docs/reference/cli.md, [decode])",
    )
    add_engine(p)
    _add_retired_decode_flags(p)
    add_batch_tokens(advanced(p), d.max_tokens, "sentences × longest padded source length")
    _add_speed_options(advanced(p))
    p.description = (p.description or "") + (
        " Decoding settings left out take the model folder's (config.json 'decode', "
        "from the recipe's [decode] section), else the defaults shown."
    )


# Search controls that were flags of their own, now --set decode.KEY=VALUE (what the recipe, the
# HTTP API and Python call them): (flag, DecodeConfig field, argparse keywords).
RETIRED_DECODE_FLAGS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("--length-penalty", "length_penalty", {"choices": ("gnmt", "average", "none", "power")}),
    ("--max-len-a", "max_len_a", {"type": float}),
    ("--max-len-b", "max_len_b", {"type": int}),
    ("--repetition-penalty", "repetition_penalty", {"type": float}),
    ("--no-repeat-ngram-size", "no_repeat_ngram_size", {"type": int}),
)


def _add_retired_decode_flags(p: argparse.ArgumentParser) -> None:
    for name, key, kwargs in RETIRED_DECODE_FLAGS:
        retired(p, name, f"--set decode.{key}={{value}}", dest=key, **kwargs)


def add_batch_tokens(g: Any, default: int, measure: str) -> None:
    """``--batch-tokens N``: the token budget of one decoding batch, the one name for it in every
    inference command (was ``--max-tokens``; the recipe's ``data.max_tokens`` is the training
    batch's)."""
    flag(
        g,
        "--batch-tokens",
        old=("--max-tokens",),
        dest="max_tokens",
        type=int,
        metavar="N",
        help=f"token budget of one decoding batch: {measure}; more holds more memory, "
        f"rarely more speed on a CPU (default: {default})",
    )


def _add_speed_options(g: Any) -> None:
    """How the decoding runs: parallel batches, bf16, the compiled step."""
    g.add_argument(
        "--workers",
        type=int,
        help="batches decoded at once, sharing the CPU threads (like CTranslate2's "
        "inter_threads; default: one per core that is not busy, each on 1 thread, at most "
        f"{MOST_WORKERS['torch']} for aiayn's search and {MOST_WORKERS['ctranslate2']} for "
        "CTranslate2; 1 on a GPU; docs/decoding.md)",
    )
    g.add_argument(
        "--bf16",
        action=argparse.BooleanOptionalAction,
        help="run matmuls in bfloat16 autocast (faster on CPUs with AVX-512 BF16/AMX)",
    )
    g.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        help="run the decoder step as one compiled call (CPU, float32, one model; compiled "
        "once into $AIAYN_CACHE/compiled, ~1 minute; docs/decoding.md)",
    )


def open_models(
    args: argparse.Namespace, device: torch.device, expect_kind: str | None = None
) -> ModelFolder:
    """MODEL_DIR(s) through the one loader (:func:`aiayn.folder.load_model_folder`), with the
    engine asked for (``--engine``; default: what the folders hold)."""
    from aiayn.folder import load_model_folder

    return load_model_folder(args.model, device, expect_kind, args.engine, args.workers)


def decode_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The DecodeConfig fields given on the command line (settings left out are not included):
    ``--set decode.KEY=VALUE``, then the flags (which win)."""
    from aiayn.config import coerce_keys
    from aiayn.run_config import REMOVED

    check_batch_tokens(args)
    sets = section_sets(args.overrides, "decode", bare=False)
    for key in sets:
        if f"decode.{key}" in REMOVED:
            raise ConfigError(f"--set decode.{key}: {REMOVED[f'decode.{key}']}")
    chosen = coerce_keys(DecodeConfig, sets, prefix="decode.")
    names = [f.name for f in fields(DecodeConfig)]
    chosen.update({n: getattr(args, n) for n in names if getattr(args, n, None) is not None})
    return chosen


def check_batch_tokens(args: argparse.Namespace) -> None:
    """``--batch-tokens`` below 1, named as the user typed it (the library says max_tokens)."""
    if args.max_tokens is not None and args.max_tokens < 1:
        raise ConfigError(f"--batch-tokens must be >= 1, got {args.max_tokens}")


DEVICE_HELP = (
    "auto (cuda when there is one, else cpu; the default, as in training), cpu, cuda, cuda:1, …"
)


def add_device(p: Any) -> None:
    p.add_argument("--device", default="auto", help=DEVICE_HELP)


def inference_device(name: str) -> torch.device:
    """The device an inference command runs on (``auto``: CUDA when available, else the CPU); a
    clear error for an unknown or unavailable one. On the CPU it also sets glibc to keep freed
    memory (``keep_freed_memory``): every decoding step frees and reallocates the same large
    buffers."""
    from aiayn.checks import check_device

    device = check_device(name, "--device")
    if device.type == "cpu":
        from aiayn.memory import keep_freed_memory
        from aiayn.threads import threads_for_load

        keep_freed_memory()
        threads_for_load()  # 1 thread when another process keeps a core of 2 busy
    return device


def read_input_lines(name: str) -> list[str]:
    """Lines of a file or of stdin ("-"), blank ones kept; DataError with the line number when
    the text is not UTF-8."""
    from aiayn.data.readers import decode_utf8, read_bytes

    data = sys.stdin.buffer.read() if name == "-" else read_bytes(name)
    text = decode_utf8("<stdin>" if name == "-" else name, data)
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    return [line[:-1] if line.endswith("\r") else line for line in lines]
