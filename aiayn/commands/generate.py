"""`aiayn generate`: continue a prompt with a trained language model, streaming the text.

Prints the prompt, then each token as it is sampled (temperature, top-k, top-p), using the KV
cache. ``--seed`` makes the output reproducible.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from aiayn.commands.options import add_device, advanced, inference_device
from aiayn.errors import ConfigError

if TYPE_CHECKING:
    from aiayn.decode.config import SamplingConfig


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "generate",
        description="Continue --prompt with tokens sampled from a decoder-only "
        "model, printed as they are produced.",
    )
    p.add_argument("model", metavar="MODEL_DIR", help="a language-model folder, e.g. RUN/best")
    p.add_argument(
        "--prompt",
        required=True,
        metavar="TEXT",
        help="the start of the text, which the model continues (given on the command line)",
    )
    p.add_argument("--max-new-tokens", type=int, default=500, help="tokens to add (default: 500)")
    # The sampling settings: aiayn.decode.config.SamplingConfig checks them (sampling_config)
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
    p.add_argument(
        "--seed", type=int, help="random seed (-2**63 to 2**64-1), for reproducible output"
    )
    add_device(p)
    advanced(p).add_argument(
        "--no-cache",
        action="store_true",
        help="re-read the whole context at every step (slow; for checking the cache)",
    )
    p.set_defaults(run=run)
    return p


def sampling_config(args: argparse.Namespace) -> SamplingConfig:
    """The flags as one SamplingConfig; a value it refuses is its one line, naming the flag."""
    from aiayn.decode.config import SamplingConfig

    try:
        return SamplingConfig(
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            seed=args.seed,
        )
    except ConfigError as err:  # "temperature must be ..." -> "--temperature must be ..."
        name = str(err).split(" ", 1)[0]
        raise ConfigError(f"--{name.replace('_', '-')}{str(err)[len(name) :]}") from None


def run(args: argparse.Namespace) -> int:
    from aiayn.folder.load import load_model_folder
    from aiayn.kinds import LM

    sampling = sampling_config(args)
    if not args.prompt:
        raise ConfigError("--prompt is empty; give at least one character to continue")
    model = load_model_folder(args.model, inference_device(args.device), LM)

    def show(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    show(args.prompt)
    model.generate(args.prompt, sampling, on_token=show, use_cache=not args.no_cache)
    show("\n")
    return 0
