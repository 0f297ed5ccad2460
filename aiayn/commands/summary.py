"""`aiayn summary`: the parameter table of a preset, a config file or a trained model folder."""

from __future__ import annotations

import argparse
import os
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING

from aiayn.commands.options import add_sets, advanced, section_sets
from aiayn.config import ModelConfig, apply_overrides
from aiayn.errors import ConfigError

if TYPE_CHECKING:
    import torch


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "summary",
        description="Parameter table (module, output shape, parameters) and totals.",
    )
    p.add_argument(
        "model",
        help="a preset (base, big, small, tiny), a TOML config with a [model] "
        "section, or a model folder",
    )
    add_sets(p, "model", "model.d_model=256")
    p.add_argument(
        "--vocab",
        type=int,
        metavar="N",
        help="the vocabulary size to count the embeddings with (source and target; default: "
        "the folder's, the config's data.vocab_size, else 37,000 as the paper's WMT14 BPE)",
    )
    p.add_argument(
        "--depth",
        type=int,
        default=1,
        help="how deep the table goes into nested modules (layers always listed; default: 1)",
    )
    advanced(p).add_argument(
        "--shape",
        metavar="B,S,T",
        default="2,16,16",
        help="the example forward pass's batch size, source and target length (default: 2,16,16)",
    )
    p.set_defaults(run=run)
    return p


def resolve_model_config(spec: str, overrides: list[str]) -> tuple[ModelConfig, str]:
    """(ModelConfig, model kind) from a preset name (translation), a TOML file ([model] section,
    optional `preset` key; the kind from data.kind, the vocabulary from data.vocab_size) or a
    model folder's config.json, then `--set model.KEY=VALUE` overrides."""
    from aiayn.kinds import KINDS, TRANSLATION
    from aiayn.run_config import data_keys

    sets = section_sets(overrides, "model")
    path = Path(spec)
    if path.is_dir():
        from aiayn.folder.config import read_folder_config

        parsed = read_folder_config(path)
        return apply_overrides(parsed.config.model, sets), parsed.kind
    if path.suffix == ".toml" or path.is_file():
        if not path.is_file():
            raise ConfigError(f"{path}: config file not found")
        try:
            table = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
            raise ConfigError(f"{path}: not valid TOML ({err})") from None
        section = dict(table.get("model", {}))
        preset = section.pop("preset", None)
        base = ModelConfig.preset(preset) if preset else ModelConfig()
        data = data_keys(table.get("data", {}), str(path))
        kind = data.get("kind", TRANSLATION)
        if "vocab_size" in data:  # what a subword tokenizer trains to (for char: an upper bound)
            section = {
                "src_vocab_size": data["vocab_size"],
                "tgt_vocab_size": data["vocab_size"],
                **section,
            }
        if not isinstance(kind, str) or kind not in KINDS:
            raise ConfigError(f"{path}: data.kind = {kind!r} is not one of {', '.join(KINDS)}")
        # The stack the kind's model has (as the trainer's Task.model_config sets it).
        stack = dict(KINDS[kind].stack)
        return apply_overrides(base, {**section, **sets, **stack}), kind
    if spec not in ModelConfig.PRESETS:
        if os.sep in spec or path.suffix:
            raise ConfigError(
                f"{spec}: not found (neither a model folder, a config file nor a preset: "
                f"{', '.join(ModelConfig.PRESETS)})"
            )
        try:
            ModelConfig.preset(spec)
        except ConfigError as err:
            raise ConfigError(f"{err}; and no folder or file is named '{spec}'") from None
    return apply_overrides(ModelConfig.preset(spec), sets), TRANSLATION


def example_shape(args: argparse.Namespace) -> tuple[int, int, int]:
    """``--shape B,S,T`` as three positive integers."""
    parts = args.shape.split(",")
    try:
        shape = [int(x) for x in parts] if len(parts) == 3 else []
    except ValueError:
        shape = []
    if not shape or min(shape) <= 0:
        raise ConfigError(f"--shape must be three positive integers B,S,T, got '{args.shape}'")
    return shape[0], shape[1], shape[2]


def vocabulary_origin(spec: str, overrides: list[str], vocab: int | None) -> str:
    """Where ``aiayn summary`` took the vocabulary size from, in words."""
    if vocab is not None:
        return "--vocab"
    if any(text.split("=")[0].strip().endswith("_vocab_size") for text in overrides):
        return "--set"
    path = Path(spec)
    if path.is_dir():
        return "the model folder's"
    if path.is_file():
        data = tomllib.loads(path.read_text(encoding="utf-8")).get("data", {})
        if "vocab_size" in data:
            return f"data.vocab_size of {path}"
    return "the default, the paper's WMT14 BPE; give yours with --vocab N"


def vocabulary_line(cfg: ModelConfig, origin: str) -> str:
    """The vocabulary the table counted, and where its size came from."""
    src, tgt = cfg.src_vocab_size, cfg.tgt_vocab_size
    sizes = f"{src:,} tokens" if src == tgt else f"{src:,} source, {tgt:,} target tokens"
    return f"Vocabulary: {sizes} ({origin})"


def run(args: argparse.Namespace) -> int:
    import torch

    from aiayn.kinds import KINDS, PIXELS
    from aiayn.model.summary import format_summary, summarize

    batch, src_len, tgt_len = example_shape(args)
    if args.vocab is not None and args.vocab < 5:
        raise ConfigError(
            f"--vocab must be at least 5 (4 special tokens and one), got {args.vocab}"
        )
    cfg, kind = resolve_model_config(args.model, args.overrides)
    if args.vocab is not None:
        cfg = apply_overrides(cfg, {"src_vocab_size": args.vocab, "tgt_vocab_size": args.vocab})
    torch.manual_seed(0)
    model = KINDS[kind].model_class(cfg).eval()
    low = max(cfg.pad_id, cfg.bos_id, cfg.eos_id, cfg.unk_id) + 1
    src = torch.randint(low, cfg.src_vocab_size, (batch, src_len))
    tgt = torch.randint(low, cfg.tgt_vocab_size, (batch, tgt_len))
    if KINDS[kind].input == PIXELS:  # an image model reads (B, C, H, W) pixels
        return _image_summary(model, cfg, batch, args)
    # an encoder and a decoder read both sides; a decoder alone the target; an encoder the source
    forward = (
        (lambda: model(src, tgt))
        if cfg.n_encoder_layers and cfg.n_decoder_layers
        else (lambda: model(tgt))
        if cfg.n_decoder_layers
        else (lambda: model(src))
    )
    rows, total = summarize(model, forward, depth=args.depth)
    print(format_summary(rows, total, title=f"{type(model).__name__}: {args.model}"))
    print(vocabulary_line(cfg, vocabulary_origin(args.model, args.overrides, args.vocab)))
    return 0


def _image_summary(
    model: torch.nn.Module, cfg: ModelConfig, batch: int, args: argparse.Namespace
) -> int:
    """The table of an image model over ``batch`` random images, and its FLOPs per image."""
    import torch

    from aiayn.model.summary import format_summary, summarize
    from aiayn.model.vision import flops_per_image, n_patches

    pixels = torch.rand(batch, cfg.channels, cfg.image_size, cfg.image_size)
    rows, total = summarize(model, lambda: model(pixels), depth=args.depth)
    print(format_summary(rows, total, title=f"{type(model).__name__}: {args.model}"))
    flops = flops_per_image(cfg)
    print(
        f"FLOPs per image: {_si(flops)} ({flops:,}; a {cfg.image_size}x{cfg.image_size}"
        f"x{cfg.channels} image, {n_patches(cfg)} patches of {cfg.patch_size}x{cfg.patch_size}; a multiply-add "
        "counts 2; norms, softmax and activations left out)"
    )
    return 0


def _si(n: int) -> str:
    """12345678 -> '12.3 M'."""
    for unit, size in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return str(n)
