"""How aiayn's training cost grows with sequence length and with batch size (issue 7, point 5).

    OMP_NUM_THREADS=1 python benchmarks/bench_scaling.py [--preset small] [--precision bf16]

aiayn's real ``Trainer.update`` (the SMALL shape of bench_train.py, AdamW, label smoothing,
dropout 0.1) on synthetic batches of equal-length sentences (source = target length, no padding):

* **length sweep** — a fixed budget of ``--tokens`` tokens per side, split into sentences of
  L = 8 … 256 tokens (B = tokens / L): the per-token cost of everything but attention is flat, so
  the growth of ms/step with L is the attention's L² term (and the switch from the explicit
  attention to the fused kernel above 64 keys);
* **batch sweep** — L fixed (the Multi30k-like ``--length``), 512 … 16,384 tokens per side: the
  fixed per-step cost (optimizer, Python, kernel launches) against the per-token work.

Each point: ``--warmup`` updates, then the median of ``--steps`` timed updates; tokens/s counts
source + target tokens, FLOPs use bench_train's formula, MFU is against the matmul peak measured
in the same run. Writes the marked section of docs/experiments/performance.md and docs/experiments/scaling.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_train as bt  # noqa: E402  (the shapes, FLOP formula and aiayn system of the main bench)

from aiayn.env import cpu_name  # noqa: E402
from aiayn.io import write_section  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- bench_scaling:begin -->", "<!-- bench_scaling:end -->"


def synthetic(s: bt.Shape, length: int, sentences: int, start: int, seed: int) -> tuple[list, bt.Batch]:
    """``sentences`` pairs of ``length`` random tokens each side, as pairs and one Batch."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, s.vocab_size, (sentences, length), generator=g)
    tgt = torch.randint(4, s.vocab_size, (sentences, length), generator=g)
    pairs = list(zip(src.tolist(), tgt.tolist()))
    bos = torch.full((sentences, 1), s.bos_id)
    eos = torch.full((sentences, 1), s.eos_id)
    batch = bt.Batch(list(range(start, start + sentences)), src, torch.cat([bos, tgt], 1),
                     torch.cat([tgt, eos], 1), sentences * length, sentences * (length + 1))
    return pairs, batch


def measure(s: bt.Shape, precision: str, points: list[tuple[int, int]], warmup: int, steps: int,
            peak: float) -> list[dict]:
    """One trainer over all points' pairs; per point (length, sentences) the step statistics."""
    pairs, batches = [], []
    for k, (length, sentences) in enumerate(points):
        for r in range(warmup + steps):
            p, b = synthetic(s, length, sentences, len(pairs), seed=1000 * k + r)
            pairs += p
            batches.append(b)
    system = bt.AiaynSystem(s, precision, pairs, tempfile.mkdtemp(prefix="bench_scaling_"))
    out, i = [], 0
    for length, sentences in points:
        times = []
        for r in range(warmup + steps):
            start = time.perf_counter()
            system.step(batches[i])
            if r >= warmup:
                times.append(time.perf_counter() - start)
            i += 1
        b = batches[i - 1]
        t = statistics.median(times)
        flops = bt.train_flops(s, [length] * sentences, [length + 1] * sentences)
        out.append({"length": length, "sentences": sentences, "tokens": b.n_tokens, "step_s": t,
                    "tokens_per_s": b.n_tokens / t, "mfu": flops / t / (peak * 1e9),
                    "attention_share_of_flops": attention_flops(s, length, sentences) / flops})
        print(f"L={length:4d} B={sentences:5d}: {1000 * t:8.1f} ms/step, "
              f"{b.n_tokens / t:8.0f} tok/s, MFU {100 * out[-1]['mfu']:.1f}%", flush=True)
    return out


def attention_flops(s: bt.Shape, length: int, sentences: int) -> float:
    """The L² terms of bt.train_flops (QKᵀ and AV of all three attentions), training."""
    d, n_s, n_t = s.d_model, length, length + 1
    enc = 4 * n_s * n_s * d
    dec = 2 * n_t * n_t * d + 4 * n_t * n_s * d
    return 3.0 * (s.n_encoder_layers * enc + s.n_decoder_layers * dec) * sentences


def markdown(report: dict) -> str:
    m = report["meta"]
    lines = [f"*Written by `benchmarks/bench_scaling.py`; edit outside the markers.* "
             f"`{m['command']}` — {m['date']}, {m['hardware']}, {m['threads']} thread(s), torch "
             f"{m['torch']}, {m['preset'].upper()} {m['precision']}, load average "
             f"{m['load_start']:.1f} → {m['load_end']:.1f}; matmul peak {m['peak_gflops']:.0f} "
             "GFLOP/s.",
             ""]
    for name, title in (("length", f"Sequence length, {m['tokens']:,} tokens per side per step"),
                        ("batch", f"Batch size, sentences of {m['length']} tokens")):
        lines += [f"**{title}**", "", "| length | sentences | tokens/step | ms/step | tokens/s | "
                  "MFU | attention share of FLOPs |", "|---:|---:|---:|---:|---:|---:|---:|"]
        for p in report[name]:
            lines.append(f"| {p['length']} | {p['sentences']} | {p['tokens']:,} | "
                         f"{1000 * p['step_s']:.0f} | {p['tokens_per_s']:,.0f} | "
                         f"{100 * p['mfu']:.1f}% | {100 * p['attention_share_of_flops']:.1f}% |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="small", choices=list(bt.PRESETS))
    p.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    p.add_argument("--tokens", type=int, default=4096, help="tokens per side per step (length sweep)")
    p.add_argument("--length", type=int, default=16, help="sentence length of the batch sweep")
    p.add_argument("--lengths", type=int, nargs="+", default=[8, 16, 32, 64, 128, 256])
    p.add_argument("--batch-tokens", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--peak-sizes", type=int, nargs="+", default=[1024, 2048], metavar="N",
                   help="n of the n×n×n matmuls of the peak (default 1024 2048)")
    p.add_argument("--out", default=str(ROOT / "docs" / "experiments" / "scaling.json"))
    p.add_argument("--doc", default=str(ROOT / "docs" / "experiments" / "performance.md"))
    args = p.parse_args(argv)
    torch.manual_seed(0)
    s = dataclasses.replace(bt.PRESETS[args.preset], max_len=max(args.lengths + [args.length]) + 2)
    load_start = os.getloadavg()[0]
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    peak = bt.matmul_peak(dtype, tuple(args.peak_sizes))
    length_points = [(L, max(1, args.tokens // L)) for L in args.lengths]
    batch_points = [(args.length, max(1, n // args.length)) for n in args.batch_tokens]
    report = {
        "length": measure(s, args.precision, length_points, args.warmup, args.steps, peak),
        "batch": measure(s, args.precision, batch_points, args.warmup, args.steps, peak),
        "meta": {"date": str(date.today()), "hardware": cpu_name(), "threads": torch.get_num_threads(),
                 "torch": torch.__version__, "preset": args.preset, "precision": args.precision,
                 "tokens": args.tokens, "length": args.length, "peak_gflops": peak,
                 "load_start": load_start, "load_end": os.getloadavg()[0],
                 "command": "python benchmarks/bench_scaling.py "
                 + " ".join(sys.argv[1:] if argv is None else argv)},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    write_section(args.doc, BEGIN, END, markdown(report))
    print(f"-> {args.out}, {args.doc}")


if __name__ == "__main__":
    main()
