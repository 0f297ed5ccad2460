"""`aiayn generate`: continue a prompt with a trained language model, streaming the text.

Prints the prompt, then each token as it is sampled (temperature, top-k, top-p), using the KV
cache. ``--seed`` makes the output reproducible.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from aiayn.errors import CheckpointError, ConfigError

log = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "generate",
        help="generate text with a trained language model (sampling)",
        description="Continue --prompt with tokens sampled from a decoder-only "
        "model, printed as they are produced.",
    )
    p.add_argument("model", metavar="MODEL_DIR", help="a language-model folder, e.g. RUN/best")
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument("--max-new-tokens", type=int, default=500, help="tokens to add (default: 500)")
    p.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="divide the logits by this; < 1 is more conservative (default: 1.0)",
    )
    p.add_argument(
        "--top-k",
        type=int,
        default=0,
        help="sample among the k most probable tokens; 0 = all (default: 0)",
    )
    p.add_argument(
        "--top-p",
        type=float,
        default=1.0,
        help="sample from the smallest set with this much probability (default: 1.0)",
    )
    p.add_argument("--seed", type=int, help="random seed, for reproducible output")
    p.add_argument(
        "--no-cache",
        action="store_true",
        help="re-read the whole context at every step (slow; for checking the cache)",
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, … (default: cpu)")
    p.set_defaults(run=run)
    return p


def _check(args: argparse.Namespace) -> None:
    if args.max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if not args.temperature > 0:
        raise ConfigError(f"--temperature must be > 0, got {args.temperature}")
    if args.top_k < 0:
        raise ConfigError(f"--top-k must be >= 0, got {args.top_k}")
    if not 0 < args.top_p <= 1:
        raise ConfigError(f"--top-p must be in (0, 1], got {args.top_p}")
    if not args.prompt:
        raise ConfigError("--prompt is empty; give at least one character to continue")


class _Printer:
    """Writes the decoded text as tokens arrive (a token may end mid-character: wait for more)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.ids, self.shown = tokenizer, [], 0

    def __call__(self, token: int) -> None:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids)
        if not text.endswith("\ufffd"):
            sys.stdout.write(text[self.shown :])
            sys.stdout.flush()
            self.shown = len(text)


def run(args: argparse.Namespace) -> int:
    from aiayn.checkpoint import TOKENIZER_FILE, load_model_dir
    from aiayn.commands.translate import inference_device
    from aiayn.data import Tokenizer
    from aiayn.decode.generate import generate

    _check(args)
    device = inference_device(args.device)
    model, cfg, meta = load_model_dir(args.model, expect_kind="lm", map_location=device)
    if not (Path(args.model) / TOKENIZER_FILE).is_file():
        raise CheckpointError(f"{args.model}: no {TOKENIZER_FILE} (generation needs its tokenizer)")
    tokenizer = Tokenizer.from_file(Path(args.model) / TOKENIZER_FILE)
    prompt_ids = tokenizer.encode(args.prompt)
    if not prompt_ids:
        raise ConfigError("--prompt has no token the model's tokenizer knows")
    if tokenizer.unk_id in prompt_ids:
        log.warning("the prompt has characters the model never saw; they read as <unk>")
    window = min(int(meta.get("data", {}).get("max_len", cfg.max_len)), cfg.max_len)
    sys.stdout.write(args.prompt)
    printer = _Printer(tokenizer)
    generate(
        model,
        prompt_ids,
        args.max_new_tokens,
        window,
        args.temperature,
        args.top_k,
        args.top_p,
        args.seed,
        use_cache=not args.no_cache,
        on_token=printer,
    )
    sys.stdout.write("\n")
    sys.stdout.flush()
    return 0
