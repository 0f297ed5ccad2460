"""Options and helpers shared by the commands: ``-i/--input``, ``-o/--out``,
``--set SECTION.KEY=VALUE``, the "advanced options" group; and, for the commands that use a
trained model (translate, evaluate, classify, generate, serve), the model folders, decoding
flags, the engine, the device and input lines. Each flag has one spelling: a flag renamed or
retired is gone, not rewritten.

Decoding flags default to None: a flag (or ``--set decode.KEY=VALUE``) given overrides the model
folder's ``decode`` settings, which override :class:`~aiayn.decode.config.DecodeConfig`'s
defaults (the only home of them), through :func:`aiayn.decode.config.merge_decode`.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from aiayn.errors import ConfigError

# torch, and the modules that hold the defaults shown in --help, are imported where they are
# used: a command's parser is built without them where it can be (aiayn/cli.py).
if TYPE_CHECKING:
    import torch

    from aiayn.folder.load import ModelFolder


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
        "next-token probabilities averaged, or a text classifier's class "
        "probabilities; one shared tokenizer)",
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
    """``-o/--out FILE``: the one spelling of a command's output."""
    p.add_argument(
        "-o",
        "--out",
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


def add_sets(
    p: argparse.ArgumentParser, section: str, example: str, what: str = "override a recipe key"
) -> None:
    """``--set SECTION.KEY=VALUE``, the one syntax of a config override (as in recipes)."""
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar=f"{section}.KEY=VALUE",
        help=f"{what}, e.g. --set {example} (repeatable; every key: docs/reference/cli.md)",
    )


def section_sets(overrides: list[str], section: str) -> dict[str, str]:
    """``--set SECTION.KEY=VALUE`` of one section -> ``{KEY: VALUE}``; ConfigError for a key of
    another section or none."""
    from aiayn.config import parse_override

    values = {}
    for text in overrides:
        key, value = parse_override(text)
        head, dot, rest = key.partition(".")
        if not (dot and head == section):
            raise ConfigError(f"--set {text}: this command takes {section}.KEY=VALUE")
        values[rest] = value
    return values


ENGINE_HELP = (
    "what runs the model: torch runs a model folder, the others a folder written by "
    "`aiayn export` (docs/export.md); default: what MODEL_DIR holds"
)


def add_engine(p: Any) -> None:
    from aiayn.engines import ENGINES

    p.add_argument("--engine", choices=ENGINES, help=ENGINE_HELP)


def add_decode_options(p: argparse.ArgumentParser) -> None:
    """Decoding flags; each defaults to the model folder's setting, else DecodeConfig's. The
    common settings are flags (fairseq's and Hugging Face's: beam, α, the batch, the speed
    switches); every other decoding setting is ``--set decode.KEY=VALUE``, its recipe key. A
    setting has one spelling: ``--set decode.beam`` is refused (:func:`decode_overrides`)."""
    from aiayn.decode.config import DecodeConfig

    d = DecodeConfig()
    p.add_argument("--beam", type=int, help=f"beam size; 1 = greedy (default: {d.beam}, §6.1)")
    p.add_argument("--alpha", type=float, help=f"GNMT length penalty α (default: {d.alpha}, §6.1)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="decode.KEY=VALUE",
        help="a decoding setting without a flag, by its recipe key: e.g. --set "
        "decode.length_penalty=average, decode.max_len_b=100, decode.no_repeat_ngram_size=3 "
        "(repeatable; every key: docs/reference/cli.md, [decode])",
    )
    add_engine(p)
    add_batch_tokens(advanced(p), d.batch_tokens, "sentences × longest padded source length")
    _add_speed_options(advanced(p))
    p.description = (p.description or "") + (
        " Decoding settings left out take the model folder's (config.json 'decode', "
        "from the recipe's [decode] section), else the defaults shown."
    )


def add_batch_tokens(g: Any, default: int, measure: str) -> None:
    """``--batch-tokens N``: the token budget of one decoding batch (``decode.batch_tokens``), the
    one name for it in every inference command (``data.max_tokens`` is a training batch's)."""
    g.add_argument(
        "--batch-tokens",
        type=int,
        metavar="N",
        help=f"token budget of one decoding batch: {measure}; more holds more memory, "
        f"rarely more speed on a CPU (default: {default})",
    )


def _add_speed_options(g: Any) -> None:
    """How the decoding runs: parallel batches, bf16, the compiled step."""
    from aiayn.engines import MOST_WORKERS

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
    from aiayn.folder.load import load_model_folder

    return load_model_folder(args.model, device, expect_kind, args.engine, args.workers)


def decode_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The DecodeConfig fields given on the command line (settings left out are not included):
    its flags and ``--set decode.KEY=VALUE``. A setting has one spelling: ``--set`` of a key
    this command has a flag for is refused, naming the flag."""
    from aiayn.config import coerce_keys
    from aiayn.decode.config import DecodeConfig
    from aiayn.run_config import REMOVED, RENAMED

    check_batch_tokens(args)
    sets = section_sets(args.overrides, "decode")
    names = [f.name for f in fields(DecodeConfig)]
    for key in sets:
        now = RENAMED.get(f"decode.{key}", f"decode.{key}").removeprefix("decode.")
        if now in names and hasattr(args, now):
            flag = "--" + now.replace("_", "-")
            raise ConfigError(f"--set decode.{key}: this command's flag for it is {flag}")
        if now != key:
            raise ConfigError(f"--set decode.{key}: it is now called decode.{now}")
        if f"decode.{key}" in REMOVED:
            raise ConfigError(f"--set decode.{key}: {REMOVED[f'decode.{key}']}")
    chosen = coerce_keys(DecodeConfig, sets, prefix="decode.")
    chosen.update({n: getattr(args, n) for n in names if getattr(args, n, None) is not None})
    return chosen


def check_batch_tokens(args: argparse.Namespace) -> None:
    """``--batch-tokens`` below 1, named as the user typed it."""
    if args.batch_tokens is not None and args.batch_tokens < 1:
        raise ConfigError(f"--batch-tokens must be >= 1, got {args.batch_tokens}")


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
