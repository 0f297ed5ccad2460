"""Time and cost of the paper's WMT14 recipes to their step counts, from a stated model of per-GPU
throughput (docs/scaling.md); optionally one measured calibration point.

    python benchmarks/wmt_projection.py                 # the projection table (no GPU needed)
    python benchmarks/wmt_projection.py --measure base big [--steps 50] [--out DIR]

The model. Training FLOPs of one update = 3 x forward (the backward pass costs about twice the
forward), forward = 2 x (source tokens x encoder matmul weights + target tokens x (decoder +
output projection matmul weights)) + the attention scores (QK^T and AV: 4·L·d per token and
attention, L = 30, a typical WMT sentence in BPE tokens). Time of an update on n GPUs =
FLOPs / (n x peak x MFU) + a fixed cost per micro-batch (kernel launches, Python, collation) + a
fixed cost per update with n > 1 (the part of the all-reduce not hidden behind the backward pass,
the optimizer). Each constant is an assumption named in ASSUMPTIONS; the paper's own 0.4 s and
1.0 s per step on 8 P100s are the check (`--check`: the MFU they imply).

``--measure`` trains each named recipe (configs/wmt14_en_de_RECIPE.toml) for ``--steps`` updates
on synthetic sentence pairs of WMT-like lengths (no download: the update's shape is what matters,
not the words), on this machine's first GPU, and prints the seconds per update and the MFU it
implies, as JSON lines (and into ``--out``/wmt_measure.json). ``--minutes M`` trains for M minutes
of wall-clock instead (``train.max_time``; a run long enough to see its batches' shapes again, as a
real run does) and adds the seconds per update of each epoch, the steady rate over the run's second
half (from the second epoch at the earliest: the first sees every batch shape new), the MFU it
implies and the projected hours to the recipe's step count on one such GPU; the training log goes
to ``--out``/wmt_metrics_RECIPE.jsonl. Records of intervals that end in a validation pass are left
out of every rate. It reports too the first epoch's seconds per update counted from update 0
divided by the steady ones (``first_epoch_ratio``: the first sight of every batch shape is paid in
the first epoch; issue 57 asks for at most 1.5).

``--buckets N`` pads the batches to the N bucket widths that waste the least padding on the
synthetic store's lengths (``fit_bucket_widths``, ``data.bucket_widths``), and ``--set
train.warm_shapes=60`` runs each of their shapes once before the clock starts; its seconds and
shapes are reported (``warm_shapes``), apart from the training time.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # runs from a checkout without `pip install -e .` (a lent GPU)

ASSUMPTIONS = {
    "tokens_per_side": 25_000,  # §5.1: ~25,000 source and 25,000 target tokens per update
    "vocab": 37_000,  # §5.1: shared BPE vocabulary
    "attention_len": 30,  # L in the attention-score FLOPs
    "h100_peak_flops": 989e12,  # H100 SXM dense bf16 tensor-core peak (NVIDIA's data sheet)
    "p100_peak_flops": 9.5e12,  # the paper's own figure for a P100 (Table 2 footnote)
    "mfu": (0.2, 0.4),  # share of the peak the matmuls reach: a low and a high case
    "fixed_per_micro_batch_s": 0.005,  # launches + Python + collation per micro-batch
    "fixed_per_update_multi_gpu_s": 0.003,  # un-hidden all-reduce + optimizer, n > 1
    "usd_per_gpu_hour": 2.5,  # an H100 hour (cloud prices vary ~2x either way: scale linearly)
}
RECIPES = {"base": (512, 2048, 100_000, 0.4), "big": (1024, 4096, 300_000, 1.0)}  # d, d_ff, steps, paper s/step


def matmul_weights(d: int, d_ff: int, layers: int = 6, vocab: int = 37_000) -> dict[str, int]:
    """Weights every source / target token multiplies (biases, norms and embeddings lookups aside)."""
    return {
        "encoder": layers * (4 * d * d + 2 * d * d_ff),  # Q, K, V, O + the two FFN matrices
        "decoder": layers * (8 * d * d + 2 * d * d_ff),  # self- and cross-attention + FFN
        "output": d * vocab,  # the pre-softmax projection (tied with the embeddings)
    }


def update_flops(d: int, d_ff: int, tokens: int, layers: int = 6) -> float:
    """Training FLOPs of one update of ``tokens`` source and ``tokens`` target tokens."""
    w = matmul_weights(d, d_ff, layers, ASSUMPTIONS["vocab"])
    forward = 2 * tokens * (w["encoder"] + w["decoder"] + w["output"])
    attention = tokens * 3 * layers * 4 * ASSUMPTIONS["attention_len"] * d  # enc self, dec self + cross
    return 3 * (forward + attention)


def update_seconds(flops: float, gpus: int, micro_batches: int, mfu: float) -> float:
    a = ASSUMPTIONS
    fixed = micro_batches * a["fixed_per_micro_batch_s"]
    fixed += a["fixed_per_update_multi_gpu_s"] if gpus > 1 else 0.0
    return flops / (gpus * a["h100_peak_flops"] * mfu) + fixed


def projection() -> list[dict]:
    """One row per recipe, GPU count and MFU case: seconds per update, hours, GPU-hours, dollars."""
    rows = []
    tokens = ASSUMPTIONS["tokens_per_side"]
    for name, (d, d_ff, steps, _) in RECIPES.items():
        flops = update_flops(d, d_ff, tokens)
        for gpus in (1, 8, 16):
            micro = max(1, 8 // gpus)  # data.max_tokens 3125 (1,563 on 16 GPUs): 25,000 per update
            for mfu in ASSUMPTIONS["mfu"]:
                step = update_seconds(flops, gpus, micro, mfu)
                hours = steps * step / 3600
                rows.append(
                    dict(recipe=name, gpus=gpus, micro_batches=micro, mfu=mfu,
                         tflop_per_update=round(flops / 1e12, 2), ms_per_update=round(1e3 * step, 1),
                         hours=round(hours, 2), gpu_hours=round(gpus * hours, 1),
                         usd=round(gpus * hours * ASSUMPTIONS["usd_per_gpu_hour"]))
                )
    return rows


def check_against_the_paper() -> dict[str, float]:
    """The MFU the paper's step times on 8 P100s imply under this FLOPs model."""
    out = {}
    for name, (d, d_ff, _, seconds) in RECIPES.items():
        flops = update_flops(d, d_ff, ASSUMPTIONS["tokens_per_side"])
        out[name] = round(flops / seconds / (8 * ASSUMPTIONS["p100_peak_flops"]), 3)
    return out


# ---- the measured calibration point ----------------------------------------------------------


def write_synthetic_pairs(folder: Path, n: int, seed: int = 0) -> list[str]:
    """``n`` training and 200 validation pairs of Zipf-distributed made-up words, 8-45 words a
    sentence (WMT-like lengths); returns the data.* overrides that read them."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyzäöü"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 11))) for _ in range(60_000)]
    cum, total = [], 0.0
    for rank in range(len(words)):
        total += 1 / (rank + 1)
        cum.append(total)

    def sentence() -> str:
        return " ".join(rng.choices(words, cum_weights=cum, k=rng.randint(8, 45)))

    sets = []
    for split, count in (("train", n), ("valid", 200)):
        for side in ("src", "tgt"):
            path = folder / f"{split}.{side}"
            path.write_text("".join(sentence() + "\n" for _ in range(count)), encoding="utf-8")
            sets.append(f"data.{split}_{side}={path}")
    return ["data.dataset=", *sets]


def rate(lines: list[dict]) -> tuple[float, float]:
    """Seconds per update and mean tokens/s between the first and the last of ``lines`` (log records)."""
    if len(lines) < 2:
        raise SystemExit(f"wmt_projection: {len(lines)} log record(s) to time: train longer")
    seconds = (lines[-1]["wall"] - lines[0]["wall"]) / (lines[-1]["step"] - lines[0]["step"])
    tokens_per_s = sum(r["tokens_per_s"] for r in lines[1:]) / (len(lines) - 1)
    return seconds, tokens_per_s


def fitted_buckets(config: Path, sets: list[str], n: int) -> str:
    """``data.bucket_widths=...``: the ``n`` widths that pad the run's training pairs least (its
    tokenizer and token store are built here, into the data cache the run then reads)."""
    import numpy as np

    from aiayn.data.batching import fit_bucket_widths
    from aiayn.run_config import load_run_config
    from aiayn.train.task import build_task

    cfg, _ = load_run_config(config, sets)
    task = build_task(cfg)
    task.setup(None)
    src, tgt = task.example_lengths("train")
    widths = fit_bucket_widths(np.maximum(src, tgt), n, cfg.data.max_len)
    return "data.bucket_widths=" + ",".join(map(str, widths))


class _WarmupRecord(logging.Handler):
    """Keeps what train.warm_shapes logged: shapes run, shapes listed, seconds."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict = {}

    def emit(self, record: logging.LogRecord) -> None:
        shapes, listed, seconds, stopped = record.args
        self.seen = dict(shapes=shapes, listed=listed, seconds=round(seconds, 1),
                         stopped=bool(stopped))


def measure(recipe: str, steps: int, pairs: int, device: str, extra: list[str],
            minutes: float | None = None, out: Path | None = None, buckets: int = 0) -> dict:
    import torch

    from aiayn.run_config import load_run_config, micro_batches_per_update
    from aiayn.train.run import train_run

    started = time.perf_counter()
    warmup = _WarmupRecord()
    with tempfile.TemporaryDirectory() as tmp:
        data = write_synthetic_pairs(Path(tmp), pairs)
        stop = [f"train.max_time={60 * minutes}"] if minutes else [f"train.max_steps={steps}"]
        sets = [*data, *stop, "train.valid_every=0", "train.log_every=10",
                "train.save_every_minutes=0", f"train.device={device}",
                *extra]
        config = ROOT / f"configs/wmt14_en_de_{recipe}.toml"
        if buckets:
            sets.append(fitted_buckets(config, sets, buckets))
        cfg, _ = load_run_config(config, sets)
        logger = logging.getLogger("aiayn.train.warmup")
        level = logger.level
        logger.addHandler(warmup)
        logger.setLevel(logging.INFO)
        try:
            train_run(cfg, Path(tmp) / "run")
        finally:
            logger.removeHandler(warmup)
            logger.setLevel(level)
        text = (Path(tmp) / "run/metrics.jsonl").read_text()
    # training records only: an interval that ends in a validation pass (the run's last) is slower
    lines = [r for r in map(json.loads, text.splitlines()) if "tokens_per_s" in r and "valid_loss" not in r]
    if minutes:  # the rate a long run settles at: the run's second half, after its first epoch
        later = [r["wall"] for r in lines if r["epoch"] > 1]  # (every batch shape new in epoch 1)
        if not later:
            raise SystemExit("wmt_projection: the run never left its first epoch: train longer")
        timed = [r for r in lines if r["wall"] >= max(lines[-1]["wall"] / 2, later[0])]
    else:
        timed = [r for r in lines if 10 <= r["step"] <= steps - 10]  # no warm-up, no final validation
    seconds, tokens_per_s = rate(timed)
    d, d_ff, recipe_steps, _ = RECIPES[recipe]
    w = matmul_weights(d, d_ff, vocab=cfg.data.vocab_size)
    per_pair_token = 6 * sum(w.values())  # 6·N per (source, target) token pair
    achieved = tokens_per_s / 2 * per_pair_token
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu (a dry run)"
    result = dict(recipe=recipe, device=name, torch=torch.__version__,
                  micro_batches=micro_batches_per_update(cfg, 1), max_tokens=cfg.data.max_tokens,
                  seconds_per_update=round(seconds, 4), tokens_per_s=round(tokens_per_s),
                  mfu_vs_h100_peak=round(achieved / ASSUMPTIONS["h100_peak_flops"], 3),
                  date=time.strftime("%Y-%m-%d"))
    if minutes:
        epochs = {}
        for e in sorted({r["epoch"] for r in lines}):
            of_epoch = [r for r in lines if r["epoch"] == e]
            if len(of_epoch) > 1:
                epochs[e] = round(rate(of_epoch)[0], 4)
        first = [r for r in lines if r["epoch"] == 1]
        from_zero = first[-1]["wall"] / first[-1]["step"] if first else None  # update 0 at wall 0
        result.update(first_epoch_s_per_update_from_update_0=from_zero and round(from_zero, 4),
                      first_epoch_ratio=from_zero and round(from_zero / seconds, 2),
                      bucket_widths=list(cfg.data.bucket_widths), warm_shapes=warmup.seen)
        result.update(minutes=minutes, pairs=pairs, updates=lines[-1]["step"],
                      train_wall_s=lines[-1]["wall"], setup_and_train_s=round(time.perf_counter() - started, 1),
                      first_loss=round(lines[0]["loss"], 3), last_loss=round(lines[-1]["loss"], 3),
                      seconds_per_update_by_epoch=epochs,
                      projected_hours_to_recipe_steps=round(seconds * recipe_steps / 3600, 1),
                      recipe_steps=recipe_steps)
        if out:
            out.mkdir(parents=True, exist_ok=True)
            (out / f"wmt_metrics_{recipe}.jsonl").write_text(text)
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--measure", nargs="*", choices=sorted(RECIPES), default=[])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--pairs", type=int, default=60_000)
    p.add_argument("--minutes", type=float, help="train for this long instead of --steps updates")
    p.add_argument("--out", type=Path)
    p.add_argument("--device", default="cuda")
    p.add_argument("--set", dest="extra", action="append", default=[], help="more overrides (a dry run)")
    p.add_argument("--buckets", type=int, default=0,
                   help="pad batches to this many bucket widths fitted to the pairs' lengths")
    args = p.parse_args(argv)
    if not args.measure:
        print(json.dumps({"assumptions": ASSUMPTIONS, "paper_implied_mfu_p100": check_against_the_paper()}))
        for row in projection():
            print(json.dumps(row))
        return
    results = []
    for recipe in args.measure:
        results.append(measure(recipe, args.steps, args.pairs, args.device, args.extra, args.minutes,
                               args.out, args.buckets))
        print(json.dumps(results[-1]), flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "wmt_measure.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
