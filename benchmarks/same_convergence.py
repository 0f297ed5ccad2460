"""Same convergence: aiayn's trainer and the plain ``nn.Transformer`` baseline of
``bench_train.py``, started from the same weights and trained on the same real batches.

The speed-ups of docs/performance.md come from computing the same thing differently (the output
projection fused into the loss, explicit attention for short keys, a cheaper dropout mask, fused
Q/K/V, the fused optimizer, ...). This script checks that training still goes the same way:
the baseline's initial weights are copied into aiayn's model (as ``same_math`` does for one
batch), dropout is off so that both are deterministic functions of weights and batches, and
both take the same AdamW updates (betas (0.9, 0.98), eps 1e-9, weight decay 0.01, no clipping)
under the same inverse-sqrt schedule on the same real Multi30k batches. What may differ is
rounding (bf16 autocast, summation order). Reported: the training loss of every update for both,
and the float32 loss of both on held-out batches (the batches after the training ones) at the
start and at the end.

    python benchmarks/same_convergence.py [--preset small] [--precision bf16] [--steps 100]

writes docs/experiments/convergence.json; docs/performance.md quotes it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from datetime import date
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_train as bt  # noqa: E402

from aiayn.env import cpu_name  # noqa: E402
from aiayn.train.schedule import inverse_sqrt_lr  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="small", choices=list(bt.PRESETS))
    p.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    p.add_argument("--steps", type=int, default=100, help="updates")
    p.add_argument("--held-out", type=int, default=4, help="batches after the training ones")
    p.add_argument("--lr", type=float, default=1e-3, help="inverse-sqrt peak")
    p.add_argument("--warmup", type=int, default=40)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(bt.ROOT / "docs" / "experiments" / "convergence.json"))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.time()

    s = replace(bt.PRESETS[args.preset], dropout=0.0)
    pairs, batches, info = bt.multi30k_batches(s, 4096, args.steps + args.held_out)
    train, held = batches[:args.steps], batches[args.steps:]
    with tempfile.TemporaryDirectory() as folder:
        ref = bt.PeerSystem("torch", s, args.precision)
        ours = bt.AiaynSystem(s, args.precision, pairs, folder, lr_schedule="inverse_sqrt",
                              lr=args.lr, warmup_steps=args.warmup, clip_norm=0.0)
        bt.copy_plain_to_aiayn(ref.model, ours.model)
        def held_out() -> list[tuple[float, float]]:
            """Both in float32 with dropout off (aiayn's eval_loss runs without autocast)."""
            dtype, ref.dtype = ref.dtype, None
            try:
                return [(ref.eval_loss(b), ours.eval_loss(b)) for b in held]
            finally:
                ref.dtype = dtype

        start = held_out()
        curve = []
        for k, batch in enumerate(train, 1):
            for group in ref.optimizer.param_groups:
                group["lr"] = inverse_sqrt_lr(k, args.lr, args.warmup)
            a, b = ref.step(batch), ours.step(batch)
            curve.append({"step": k, "torch": a, "aiayn": b})
            if k % 10 == 0 or k == 1:
                print(f"step {k:4d}: nn.Transformer {a:.4f}  aiayn {b:.4f}  diff {b - a:+.4f}", flush=True)
        end = held_out()

    diffs = [abs(c["aiayn"] - c["torch"]) for c in curve]
    last10 = curve[-10:]
    report = {
        "command": "python benchmarks/same_convergence.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "date": str(date.today()), "hardware": cpu_name(), "torch": torch.__version__,
        "aiayn": bt.aiayn_version(),
        "preset": args.preset, "precision": args.precision, "steps": args.steps,
        "lr": args.lr, "warmup": args.warmup, "data": info,
        "held_out_start": {"torch": statistics.mean(a for a, _ in start), "aiayn": statistics.mean(b for _, b in start)},
        "held_out_end": {"torch": statistics.mean(a for a, _ in end), "aiayn": statistics.mean(b for _, b in end)},
        "train_last10": {"torch": statistics.mean(c["torch"] for c in last10),
                         "aiayn": statistics.mean(c["aiayn"] for c in last10)},
        "max_abs_diff": max(diffs), "median_abs_diff": statistics.median(diffs),
        "wall_s": round(time.time() - started, 1), "curve": curve,
    }
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    h0, h1 = report["held_out_start"], report["held_out_end"]
    print(f"held-out loss at start: nn.Transformer {h0['torch']:.4f}, aiayn {h0['aiayn']:.4f}; "
          f"after {args.steps} updates: {h1['torch']:.4f}, {h1['aiayn']:.4f}")
    print(f"training loss |diff| per update: median {report['median_abs_diff']:.4f}, "
          f"max {report['max_abs_diff']:.4f}; wrote {args.out}")


if __name__ == "__main__":
    main()
