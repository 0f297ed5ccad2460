"""`aiayn translate`: raw text in, one translation per line out (see docs/decoding.md).

Reads a file, stdin, or (when stdin is a terminal) an interactive prompt. Every input line gives
exactly one output line, blank lines included; with ``--nbest K`` each input line gives K lines
``LINE_NO<TAB>SCORE<TAB>TEXT``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Iterator
from typing import Any

import torch

from aiayn.errors import ConfigError

log = logging.getLogger(__name__)


def add_decode_options(p: argparse.ArgumentParser) -> None:
    """Options shared by `translate` and `evaluate`."""
    p.add_argument(
        "model",
        metavar="MODEL_DIR",
        nargs="+",
        help="a model folder (config.json, model.safetensors, tokenizer.json), e.g. a "
        "run folder or RUN/best; several folders decode as an ensemble (their "
        "next-token probabilities averaged; one shared tokenizer)",
    )
    p.add_argument("--beam", type=int, default=4, help="beam size; 1 = greedy (default: 4, §6.1)")
    p.add_argument(
        "--alpha", type=float, default=0.6, help="GNMT length penalty α (default: 0.6, §6.1)"
    )
    p.add_argument(
        "--length-penalty",
        choices=("gnmt", "average", "none"),
        default="gnmt",
        help="normalise scores by the GNMT penalty, by length, or not at all",
    )
    p.add_argument("--max-len-a", type=float, default=1.0, help="output cap a·src_len + b: a")
    p.add_argument("--max-len-b", type=int, default=50, help="output cap a·src_len + b: b")
    p.add_argument(
        "--max-tokens",
        type=int,
        default=4096,
        help="batch budget: sentences × padded source length (default: 4096)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="batches decoded at once, sharing the CPU threads (like CTranslate2's "
        "inter_threads; 2 on a 2-core CPU is fastest, docs/decoding.md; default: 1)",
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, … (default: cpu)")
    p.add_argument(
        "--engine",
        choices=("torch", "onnx", "ctranslate2"),
        help="what runs the model: torch (a model folder), onnx or ctranslate2 (a folder "
        "written by `aiayn export`; docs/export.md); default: what MODEL_DIR holds",
    )
    p.add_argument(
        "--bf16",
        action="store_true",
        help="run matmuls in bfloat16 autocast (faster on CPUs with AVX-512 BF16/AMX)",
    )


def decode_config(args: argparse.Namespace, nbest: int = 1):
    from aiayn.decode import DecodeConfig

    return DecodeConfig(
        beam=args.beam,
        alpha=args.alpha,
        length_penalty=args.length_penalty,
        max_len_a=args.max_len_a,
        max_len_b=args.max_len_b,
        nbest=nbest,
        max_tokens=args.max_tokens,
        workers=args.workers,
    )


def inference_device(name: str) -> torch.device:
    """The device an inference command (translate, evaluate, classify, generate) runs on; a clear
    error for an unknown or unavailable one. On the CPU it also sets glibc to keep freed memory
    (``keep_freed_memory``): every decoding step frees and reallocates the same large buffers."""
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"--device: unknown device '{name}'") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is available")
    if device.type == "cpu":
        from aiayn.threads import threads_for_load
        from aiayn.train.allocator import keep_freed_memory

        keep_freed_memory()
        threads_for_load()  # 1 thread when another process keeps a core of 2 busy
    return device


@contextlib.contextmanager
def precision(device: torch.device, bf16: bool) -> Iterator[None]:
    """bfloat16 autocast when asked, else nothing. A CPU without native bf16 matrix instructions
    (AVX512-BF16 or AMX) runs bf16 matmuls in a slow fallback: said in a warning, not refused."""
    if not bf16:
        yield
        return
    if device.type == "cpu":
        from aiayn.train.distributed import cpu_has_bf16

        if not cpu_has_bf16():
            log.warning(
                "--bf16: this CPU has no native bf16 matrix instructions (AVX512-BF16 or "
                "AMX): bf16 matmuls run in a fallback far slower than fp32 here; leave out "
                "--bf16"
            )
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
        yield


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "translate",
        help="translate text with a trained model (beam search)",
        description="Translate one sentence per line. Blank lines stay blank.",
    )
    add_decode_options(p)
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
        default=1,
        help="hypotheses per line, as LINE_NO<TAB>SCORE<TAB>TEXT lines (default: 1)",
    )
    p.set_defaults(run=run)
    return p


def read_input_lines(name: str) -> list[str]:
    """Lines of a file or of stdin ("-"), blank ones kept; DataError with the line number when
    the text is not UTF-8."""
    from aiayn.data.readers import _decode, _read_bytes

    data = sys.stdin.buffer.read() if name == "-" else _read_bytes(name)
    text = _decode("<stdin>" if name == "-" else name, data)
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    return [line[:-1] if line.endswith("\r") else line for line in lines]


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


def load_for_decoding(args: argparse.Namespace, device: torch.device) -> tuple[Any, Any, dict]:
    """(model, tokenizer, meta) of MODEL_DIR(s) for the engine asked for (or the one they hold)."""
    from aiayn.export.engines import load_translation

    model, tokenizer, meta = load_translation(args.model, device, args.engine, args.workers)
    if args.bf16 and "format" in meta:
        raise ConfigError(
            f"--bf16 applies to PyTorch models; {args.model[0]} holds a "
            f"'{meta['format']}' export (export with --quantization instead)"
        )
    return model, tokenizer, meta


def interactive(model: Any, tokenizer: Any, cfg: Any, device: torch.device, bf16: bool) -> int:
    """Translate each line typed at the prompt until end of input."""
    from aiayn.export.engines import translate_hypotheses

    print("Type a sentence and press Enter (Ctrl-D to quit).", file=sys.stderr)
    while True:
        sys.stderr.write("> ")  # the prompt goes to stderr: stdout carries translations only
        sys.stderr.flush()
        line = sys.stdin.readline()
        if not line:
            print(file=sys.stderr)
            return 0
        line = line.rstrip("\r\n")
        with precision(device, bf16):
            result = translate_hypotheses(model, tokenizer, [line], cfg)
        print("\n".join(format_output(result, cfg.nbest)), flush=True)


def run(args: argparse.Namespace) -> int:
    from aiayn.export.engines import translate_hypotheses
    from aiayn.io import write_text

    cfg, device = decode_config(args, args.nbest), inference_device(args.device)
    model, tokenizer, _ = load_for_decoding(args, device)
    if args.input == "-" and sys.stdin.isatty():
        return interactive(model, tokenizer, cfg, device, args.bf16)
    lines = read_input_lines(args.input)
    with precision(device, args.bf16):
        results = translate_hypotheses(model, tokenizer, lines, cfg)
    text = "".join(line + "\n" for line in format_output(results, cfg.nbest))
    if args.output:
        write_text(args.output, text)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    return 0
