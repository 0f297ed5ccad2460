"""Micro-benchmarks behind the speed choices in aiayn (docs/performance.md, "Components").

    OMP_NUM_THREADS=1 python benchmarks/bench_components.py [--repeats 15] [--out docs/experiments/components.md]
    python benchmarks/bench_components.py --smoke --repeats 1 --out /tmp/components.md   # tiny shapes

Each row times forward + backward of one component, alternatives interleaved round-robin in the
same process on the same inputs, median of repeats (warm-up excluded):
  attention: aiayn's explicit math vs F.scaled_dot_product_attention (fused), bf16, 4 heads × 64;
  loss:      label-smoothed CE as log_softmax + gather + mean (the textbook form, and what
             F.cross_entropy(label_smoothing=…) does) vs aiayn's chunked logsumexp form;
  dropout:   F.dropout vs a uniform-compare mask (not adopted: same math, small gain).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from datetime import date
from pathlib import Path

import torch
import torch.nn.functional as F

from aiayn.env import cpu_name
from aiayn.model.attention import scaled_dot_product_attention
from aiayn.train.loss import label_smoothed_nll_loss

ROOT = Path(__file__).resolve().parent.parent
# The shapes timed: attention (B, T) pairs, loss (tokens, vocabulary), dropout (B, T, D); --smoke
# takes tiny ones (the code paths in a second, no timing worth reading).
SHAPES = {
    "full": {"attention": ((256, 16), (64, 64), (16, 256)), "loss": (7200, 10000),
             "dropout": (400, 18, 128)},
    "smoke": {"attention": ((4, 8), (2, 16)), "loss": (64, 100), "dropout": (4, 3, 8)},
}


def textbook_ls_loss(logits, target, eps, pad):
    log_probs = F.log_softmax(logits.float(), dim=-1)
    keep = target != pad
    nll = -log_probs.gather(1, target[:, None]).squeeze(1)
    smooth = -log_probs.mean(-1)
    return (((1 - eps) * nll + eps * smooth) * keep).sum()


def fwd_bwd(fn, *leaves):
    def run():
        for t in leaves:
            t.grad = None
        fn().float().sum().backward()
    return run


def time_round_robin(cases: dict, repeats: int) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in cases}
    for r in range(repeats + 2):
        for name, run in cases.items():
            t = time.perf_counter()
            run()
            if r >= 2:
                times[name].append(time.perf_counter() - t)
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def attention_rows(repeats, shapes=SHAPES["full"]["attention"]):
    rows = []
    for B, T in shapes:
        q, k, v = (torch.randn(B, 4, T, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        mask = torch.ones(B, 1, 1, T, dtype=torch.bool)
        mask[::3, ..., T * 2 // 3:] = False
        cases = {"explicit": fwd_bwd(lambda: scaled_dot_product_attention(q, k, v, mask, fused=False)[0], q, k, v),
                 "fused": fwd_bwd(lambda: scaled_dot_product_attention(q, k, v, mask, fused=True)[0], q, k, v)}
        ms = time_round_robin(cases, repeats)
        rows.append((f"attention B={B} T={T} (bf16)", ms["fused"], ms["explicit"]))
    return rows


def loss_rows(repeats, shape=SHAPES["full"]["loss"]):
    n, vocab = shape
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        logits = torch.randn(n, vocab, dtype=dtype, requires_grad=True)
        target = torch.randint(4, vocab, (n,))
        target[::15] = 0
        cases = {"textbook": fwd_bwd(lambda: textbook_ls_loss(logits, target, 0.1, 0), logits),
                 "aiayn": fwd_bwd(lambda: label_smoothed_nll_loss(logits, target, 0.1, 0)[0], logits)}
        ms = time_round_robin(cases, repeats)
        rows.append((f"label-smoothed CE {n}×{vocab} ({str(dtype)[6:]})", ms["textbook"], ms["aiayn"]))
    return rows


def dropout_rows(repeats, shape=SHAPES["full"]["dropout"]):
    x = torch.randn(*shape, dtype=torch.bfloat16, requires_grad=True)
    cases = {"F.dropout": fwd_bwd(lambda: F.dropout(x, 0.3, True), x),
             "rand<p": fwd_bwd(lambda: x * (torch.rand(x.shape) >= 0.3) * (1 / 0.7), x)}
    ms = time_round_robin(cases, repeats)
    return [(f"dropout p=0.3 on {'×'.join(map(str, shape))} (bf16)", ms["F.dropout"], ms["rand<p"])]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--smoke", action="store_true", help="tiny shapes: the code paths, not timings")
    p.add_argument("--out", default=str(ROOT / "docs" / "experiments" / "components.md"))
    args = p.parse_args(argv)
    load0 = os.getloadavg()[0]
    shapes = SHAPES["smoke" if args.smoke else "full"]
    rows = (attention_rows(args.repeats, shapes["attention"]) + loss_rows(args.repeats, shapes["loss"])
            + dropout_rows(args.repeats, shapes["dropout"]))
    lines = [
        "# Component timings (forward + backward)",
        "",
        f"`OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')} python benchmarks/bench_components.py "
        f"--repeats {args.repeats}{' --smoke' if args.smoke else ''}` — {date.today()}, {cpu_name()}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), load average "
        f"{load0:.1f} → {os.getloadavg()[0]:.1f} (shared machine). Median of {args.repeats}, interleaved.",
        "",
        "| component | baseline (ms) | alternative (ms) | speed-up |",
        "|---|---:|---:|---:|",
    ]
    names = {"attention": ("fused SDPA", "explicit math"), "label": ("log_softmax+gather+mean", "aiayn chunked"),
             "dropout": ("F.dropout", "rand < p mask")}
    for label, base, alt in rows:
        b, a = names[label.split()[0].split("-")[0]]
        lines.append(f"| {label}: {b} → {a} | {base:.1f} | {alt:.1f} | {base / alt:.2f}× |")
    text = "\n".join(lines) + "\n"
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
