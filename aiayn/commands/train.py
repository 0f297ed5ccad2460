"""`aiayn train`: train a model from a TOML run config (see docs/training.md)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from aiayn.commands.options import add_sets
from aiayn.errors import ConfigError

log = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "train",
        description="Train from a TOML config with [model], [data] and [train] sections. "
        "Multi-process: torchrun --nproc_per_node=N -m aiayn train CONFIG.toml",
    )
    p.add_argument(
        "config",
        nargs="?",
        help="run config (.toml); optional with --resume, which "
        "then reads the run folder's config.json",
    )
    add_sets(p, "SECTION", "train.max_steps=1000")
    p.add_argument(
        "-o", "--out", metavar="RUN_DIR", help="the run folder (default: runs/<config name>)"
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its last checkpoint, exactly (a run stopped "
        "before its first checkpoint starts again from step 0 with its config)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace what --out holds (another run, a model folder) once the new run is "
        "ready to start; without it such a folder is refused (a folder holding the run's "
        "data, config or train.init_from is refused always)",
    )
    p.set_defaults(run=run)
    return p


def _resolve(args: argparse.Namespace):
    from aiayn.config import flatten_keys
    from aiayn.run_config import build_run_config, load_run_config, parse_sets, run_config_to_dict

    if args.config is None:
        if not (args.resume and args.out):
            raise ConfigError("give a CONFIG.toml (or --resume --out RUN_DIR to continue a run)")
        from aiayn.train.run import resume_config
        from aiayn.train.run_folder import RunFolder

        saved = flatten_keys(run_config_to_dict(resume_config(args.out)))
        preset = RunFolder(args.out).read_meta().preset
        cfg = build_run_config({**saved, **parse_sets(args.overrides)})
        return cfg, {"preset": preset}, Path(args.out), None
    cfg, values = load_run_config(args.config, args.overrides)
    out = Path(args.out) if args.out else Path("runs") / Path(args.config).stem
    return cfg, {"preset": values.get("model.preset")}, out, _model_keys(values)


def _model_keys(values: dict) -> set[str]:
    """The model settings a recipe and its --set give (a preset's too): what a fine-tune
    (train.init_from) must not change."""
    from aiayn.config import ModelConfig

    keys = {k.split(".", 1)[1] for k in values if k.startswith("model.")}
    if "preset" in keys:
        keys |= set(ModelConfig.PRESETS.get(str(values["model.preset"]), {}))
    return keys - {"preset"}


def run(args: argparse.Namespace) -> int:
    from aiayn.train.run import train_run

    cfg, extra, out, model_keys = _resolve(args)
    inputs = (args.config,) if args.config else ()
    result = train_run(
        cfg,
        out,
        resume=args.resume,
        extra_meta=extra,
        overwrite=args.overwrite,
        inputs=inputs,
        model_keys=model_keys,
    )
    best = f", best {cfg.train.best_metric} {result.best:.4f}" if result.best is not None else ""
    log.info("trained to step %d (%s)%s; run folder %s", result.step, result.stop_reason, best, out)
    return 0
