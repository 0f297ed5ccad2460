"""The training loss (output projection fused with label-smoothed cross-entropy) against its
plain form, and its pass sizes: the device's (what training uses) against the CPU's cache-sized
ones, forward + backward, bf16 autocast where the device has it.

    python benchmarks/bench_loss.py --device cuda            # V 37,000, D 512, 3,000 rows
    python benchmarks/bench_loss.py --device cpu --rows 600 --vocab 8000

Prints one JSON line (also written to ``--out`` when given): median milliseconds of each form,
the relative difference of the loss values and the peak GPU memory. The H100 figures of its
one-off predecessor are in docs/experiments/gpu_2026-11-26.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from aiayn.train import loss as L  # noqa: E402
from aiayn.train.distributed import resolve_precision  # noqa: E402


def timed(fn: Callable[[], None], device: torch.device, repeats: int) -> float:
    """Median milliseconds of fn over ``repeats`` runs, after 3 warm-up runs."""
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(3):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def measure(device: torch.device, vocab: int, d_model: int, rows: int, repeats: int) -> dict:
    torch.manual_seed(0)
    h = torch.randn(rows, d_model, device=device, requires_grad=True)  # (N, D)
    w = (0.02 * torch.randn(vocab, d_model, device=device)).requires_grad_()  # (V, D)
    gold = torch.randint(1, vocab, (rows,), device=device)
    bf16 = resolve_precision("auto", device) == torch.bfloat16  # as training decides

    def fused() -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            return L.projected_label_smoothed_nll_loss(h, w, gold, 0.1, 0)[0]

    def plain() -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = F.linear(h, w).float()  # (N, V)
        return F.cross_entropy(logits, gold, ignore_index=0, label_smoothing=0.1, reduction="sum")

    out = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
           "torch": torch.__version__, "vocab": vocab, "d_model": d_model, "rows": rows,
           "bf16_autocast": bf16,
           "ms_device_passes": timed(lambda: fused().backward(), device, repeats)}
    on_cpu = torch.device("cpu")
    own = L.rows_per_pass, L.rows_per_projection
    L.rows_per_pass = lambda v, d: own[0](v, on_cpu)  # the CPU's cache-sized passes
    L.rows_per_projection = lambda d: own[1](on_cpu)
    try:
        out["ms_cpu_sized_passes"] = timed(lambda: fused().backward(), device, repeats)
    finally:
        L.rows_per_pass, L.rows_per_projection = own
    out["ms_plain_cross_entropy"] = timed(lambda: plain().backward(), device, repeats)
    with torch.no_grad():
        a, b = float(fused()), float(plain())
    out["loss_rel_diff"] = abs(a - b) / abs(b)
    if device.type == "cuda":
        out["peak_gpu_mib"] = round(torch.cuda.max_memory_allocated() / 2**20)
    return {k: round(v, 3) if isinstance(v, float) and k.startswith("ms") else v
            for k, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--vocab", type=int, default=37_000, help="V (the paper's shared BPE: 37,000)")
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--rows", type=int, default=3_000, help="target tokens of one micro-batch")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", help="also write the JSON here")
    args = p.parse_args(argv)
    result = measure(torch.device(args.device), args.vocab, args.d_model, args.rows, args.repeats)
    if not result["loss_rel_diff"] < 1e-3:
        print(f"bench_loss: the fused loss differs from the plain one by {result['loss_rel_diff']:.2e}",
              file=sys.stderr)
        return 1
    line = json.dumps(result)
    print(line)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(line + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
