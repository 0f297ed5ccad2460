"""Options and helpers shared by the commands that use a trained model (translate, evaluate,
classify, generate): the model folders, decoding flags, the device and input lines.

Decoding flags default to None: a flag given overrides the model folder's ``decode`` settings,
which override :class:`~aiayn.decode.config.DecodeConfig`'s defaults (the only home of them).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from typing import TYPE_CHECKING, Any

import torch

from aiayn.decode.config import DecodeConfig
from aiayn.errors import ConfigError

if TYPE_CHECKING:
    from aiayn.folder import ModelFolder

DEFAULTS = DecodeConfig()


def add_model_dirs(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "model",
        metavar="MODEL_DIR",
        nargs="+",
        help="a model folder (config.json, model.safetensors, tokenizer.json), e.g. a "
        "run folder or RUN/best; several folders decode as an ensemble (their "
        "next-token probabilities averaged; one shared tokenizer)",
    )


def add_output_folder_options(p: argparse.ArgumentParser, source: str) -> None:
    """``--out/-o OUT_DIR`` and ``--overwrite`` of a command that writes a folder from
    ``source`` (the metavar of what it reads)."""
    p.add_argument("--out", "-o", required=True, metavar="OUT_DIR", help="the folder to write")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help=f"replace OUT_DIR if it exists (never {source} or a folder holding it)",
    )


def add_decode_options(p: argparse.ArgumentParser) -> None:
    """Decoding flags; each defaults to the model folder's setting, else DecodeConfig's."""
    d = DEFAULTS
    p.add_argument("--beam", type=int, help=f"beam size; 1 = greedy (default: {d.beam}, §6.1)")
    p.add_argument("--alpha", type=float, help=f"GNMT length penalty α (default: {d.alpha}, §6.1)")
    p.add_argument(
        "--length-penalty",
        choices=("gnmt", "average", "none", "power"),
        help="normalise scores by the GNMT penalty, by length, not at all, or by length^α "
        "(Hugging Face's) "
        f"(default: {d.length_penalty})",
    )
    p.add_argument(
        "--max-len-a", type=float, help=f"output cap a·src_len + b: a (default: {d.max_len_a})"
    )
    p.add_argument(
        "--max-len-b", type=int, help=f"output cap a·src_len + b: b (default: {d.max_len_b})"
    )
    p.add_argument(
        "--repetition-penalty",
        type=float,
        metavar="P",
        help="make tokens already in the output less likely, Hugging Face's way (1: off, 1.2 is "
        f"typical; default: {d.repetition_penalty})",
    )
    p.add_argument(
        "--no-repeat-ngram-size",
        type=int,
        metavar="N",
        help="no N-gram of tokens twice in an output (0: off; 3 stops a loop of repeated "
        f"syllables; default: {d.no_repeat_ngram_size})",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        help=f"batch budget: sentences × padded source length (default: {d.max_tokens})",
    )
    p.add_argument(
        "--workers",
        type=int,
        help="batches decoded at once, sharing the CPU threads (like CTranslate2's "
        "inter_threads; 2 on a 2-core CPU is fastest, docs/decoding.md; "
        f"default: {d.workers})",
    )
    p.add_argument(
        "--engine",
        choices=("torch", "onnx", "ctranslate2"),
        help="what runs the model: torch (a model folder), onnx or ctranslate2 (a folder "
        "written by `aiayn export`; docs/export.md); default: what MODEL_DIR holds",
    )
    p.add_argument(
        "--bf16",
        action=argparse.BooleanOptionalAction,
        help="run matmuls in bfloat16 autocast (faster on CPUs with AVX-512 BF16/AMX)",
    )
    p.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        help="run the decoder step as one compiled call (CPU, float32, one model; compiled "
        "once into $AIAYN_CACHE/compiled, ~1 minute; docs/decoding.md)",
    )
    p.description = (p.description or "") + (
        " Decoding flags left out take the model folder's settings (config.json 'decode', "
        "from the recipe's [decode] section), else the defaults shown."
    )


def open_models(
    args: argparse.Namespace, device: torch.device, expect_kind: str | None = None
) -> ModelFolder:
    """MODEL_DIR(s) through the one loader (:func:`aiayn.folder.load_model_folder`), with the
    engine asked for (``--engine``; default: what the folders hold)."""
    from aiayn.folder import load_model_folder

    return load_model_folder(args.model, device, expect_kind, args.engine, args.workers)


def decode_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The DecodeConfig fields given on the command line (flags left out are not included)."""
    names = [f.name for f in fields(DecodeConfig)]
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def add_device(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, … (default: cpu)")


def inference_device(name: str) -> torch.device:
    """The device an inference command runs on; a clear error for an unknown or unavailable one.
    On the CPU it also sets glibc to keep freed memory (``keep_freed_memory``): every decoding
    step frees and reallocates the same large buffers."""
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"--device: unknown device '{name}'") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is available")
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
