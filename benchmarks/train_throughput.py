"""Training throughput, fp32 vs bf16 autocast, on the same batches in the same process.

    AIAYN_DATA_MIRROR=/work/shared/data python benchmarks/train_throughput.py \
        [--config configs/multi30k_tiny.toml] [--updates 20] [--repeats 3] [--set KEY=VALUE ...]

Trains the config's tokenizer once, then alternates fp32 and bf16 over the same first
``--updates`` updates of epoch 1 (after 3 warm-up updates), each from the same initial weights, and
prints tokens/s (source + target tokens, no padding) per repeat and the median ratio.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time

import torch

from aiayn.train.config import load_run_config
from aiayn.train.distributed import DistContext, cpu_has_bf16
from aiayn.train.run_folder import RunFolder
from aiayn.train.tasks import build_task
from aiayn.train.trainer import Trainer


def tokens_per_s(cfg, task, tok, groups, precision: str) -> float:
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, precision=precision))
    task.cfg = cfg
    with tempfile.TemporaryDirectory() as tmp:
        folder = RunFolder(tmp)
        folder.prepare(resume=False)
        trainer = Trainer(cfg, task, folder, DistContext(), {}, tok, resume=False)
        for group in groups[:3]:
            trainer.update(group)  # warm-up (allocator, autocast caches)
        counted = [task.collate("train", b) for g in groups[3:] for b in g]
        tokens = sum(b.n_src_tokens + b.n_tgt_tokens for b in counted)
        start = time.perf_counter()
        for group in groups[3:]:
            trainer.update(group)
        return tokens / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/multi30k_tiny.toml")
    p.add_argument("--updates", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--set", dest="overrides", action="append", default=[])
    args = p.parse_args()
    cfg, _ = load_run_config(args.config, args.overrides)
    task = build_task(cfg)
    tok = task.setup(None)
    cfg = dataclasses.replace(cfg, model=task.model_config(cfg.model))
    batches = task.epoch_batches(1, 0, 1)
    f = cfg.train.update_freq
    groups = [batches[i * f:(i + 1) * f] for i in range(args.updates + 3)]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"CPU bf16 support: {cpu_has_bf16()}, model d_model={cfg.model.d_model}, "
          f"max_tokens={cfg.data.max_tokens}, update_freq={f}, {args.updates} timed updates")
    results: dict[str, list[float]] = {"fp32": [], "bf16": []}
    for r in range(args.repeats):
        for precision in ("fp32", "bf16"):
            results[precision].append(tokens_per_s(cfg, task, tok, groups, precision))
            print(f"repeat {r + 1}: {precision}: {results[precision][-1]:,.0f} tokens/s", flush=True)
    fp32, bf16 = statistics.median(results["fp32"]), statistics.median(results["bf16"])
    print(f"median: fp32 {fp32:,.0f} tokens/s, bf16 {bf16:,.0f} tokens/s, bf16/fp32 = {bf16 / fp32:.2f}x")


if __name__ == "__main__":
    main()
