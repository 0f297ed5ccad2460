"""`aiayn summary`: the parameter table of a preset, a config file or a trained model folder."""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

import torch

from aiayn.config import ModelConfig, apply_overrides, parse_override
from aiayn.errors import ConfigError


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("summary", help="print a Keras-style parameter summary",
                       description="Parameter table (module, output shape, parameters) and totals.")
    p.add_argument("model", help="a preset (base, big, small, tiny), a TOML config with a [model] "
                                 "section, or a model folder")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a model field, e.g. --set d_model=256 (repeatable)")
    p.add_argument("--batch", type=int, default=2, help="batch size of the example forward pass")
    p.add_argument("--src-len", type=int, default=16, help="source length of the example batch")
    p.add_argument("--tgt-len", type=int, default=16, help="target length of the example batch")
    p.add_argument("--depth", type=int, default=1, help="module depth shown (layers always listed)")
    p.set_defaults(run=run)
    return p


def resolve_model_config(spec: str, overrides: list[str]) -> ModelConfig:
    """A ModelConfig from a preset name, a TOML file ([model] section, optional `preset` key) or a
    model folder's config.json, then `--set` overrides."""
    sets = dict(parse_override(o) for o in overrides)
    sets = {k.removeprefix("model."): v for k, v in sets.items()}
    path = Path(spec)
    if path.is_dir():
        from aiayn.checkpoint import read_config
        from aiayn.config import from_dict

        return apply_overrides(from_dict(ModelConfig, read_config(path)["model"]), sets)
    if path.suffix == ".toml" or path.is_file():
        if not path.is_file():
            raise ConfigError(f"{path}: config file not found")
        try:
            section = dict(tomllib.loads(path.read_text(encoding="utf-8")).get("model", {}))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
            raise ConfigError(f"{path}: not valid TOML ({err})") from None
        preset = section.pop("preset", None)
        base = ModelConfig.preset(preset) if preset else ModelConfig()
        return apply_overrides(base, {**section, **sets})
    return apply_overrides(ModelConfig.preset(spec), sets)


def run(args: argparse.Namespace) -> int:
    from aiayn.model import Transformer
    from aiayn.model.summary import format_summary, summarize

    for name in ("batch", "src_len", "tgt_len"):
        if getattr(args, name) <= 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be positive")
    cfg = resolve_model_config(args.model, args.overrides)
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    low = max(cfg.pad_id, cfg.bos_id, cfg.eos_id, cfg.unk_id) + 1
    src = torch.randint(low, cfg.src_vocab_size, (args.batch, args.src_len))
    tgt = torch.randint(low, cfg.tgt_vocab_size, (args.batch, args.tgt_len))
    rows, total = summarize(model, lambda: model(src, tgt), depth=args.depth)
    print(format_summary(rows, total, title=f"Transformer: {args.model}"))
    return 0
