"""`aiayn average`: average the last N checkpoints of a training run into a model folder."""

from __future__ import annotations

import argparse
import logging

log = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "average",
        description="Element-wise mean of the last N weight snapshots in "
        "RUN_DIR/checkpoints/, written as a loadable model folder.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="a training run folder")
    p.add_argument(
        "--last", type=int, default=5, help="how many of the latest checkpoints (default 5)"
    )
    p.add_argument(
        "--until",
        type=int,
        metavar="STEP",
        help="only checkpoints at this update or before (e.g. the end of an epoch)",
    )
    p.add_argument(
        "-o",
        "--out",
        required=True,
        metavar="OUT_DIR",
        help="the model folder to write (a new one)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the folder -o names when it exists (swapped in whole, once written); "
        "never the run's checkpoints/ or a folder holding them",
    )
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    from aiayn.train.average import average_checkpoints

    steps = average_checkpoints(args.run_dir, args.last, args.out, args.until, args.overwrite)
    log.info("averaged steps %s into %s", ", ".join(map(str, steps)), args.out)
    return 0
