"""Training throughput, fp32 vs bf16 autocast, on the same batches in the same process.

    AIAYN_DATA_MIRROR=/work/shared/data python benchmarks/train_throughput.py \
        [--config configs/multi30k_tiny.toml] [--updates 20] [--threads N] [--set KEY=VALUE ...]

Trains the config's tokenizer once and builds two trainers from the same initial weights, one
fp32 and one bf16 autocast. Then, update by update over the first batches of epoch 1, it times an
fp32 update and a bf16 update of the same batch back to back, so that load from other processes
hits both alike. Prints tokens/s (source + target tokens, no padding) of each precision over all
timed updates, the median of the per-update ratios, and both losses at the end.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time

import torch

from aiayn.run_config import load_run_config, micro_batches_per_update
from aiayn.train.distributed import DistContext, cpu_has_bf16
from aiayn.train.run_folder import RunFolder
from aiayn.train.task import build_task
from aiayn.train.trainer import Trainer


def make_trainer(cfg, task, tok, precision: str, folder: str) -> Trainer:
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, precision=precision))
    run = RunFolder(folder)
    run.prepare(resume=False)
    return Trainer(cfg, task, run, DistContext(), {}, tok, resume=False)


def timed_update(trainer: Trainer, group: list[list[int]]) -> float:
    start = time.perf_counter()
    trainer.update(group)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/multi30k_tiny.toml")
    p.add_argument("--updates", type=int, default=20)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads (0 = torch's default); 1 avoids stalls on a shared CPU")
    p.add_argument("--set", dest="overrides", action="append", default=[])
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg, _ = load_run_config(args.config, args.overrides)
    task = build_task(cfg)
    tok = task.setup(None)
    cfg = dataclasses.replace(cfg, model=task.model_config(cfg.model))
    task.cfg = cfg
    f = micro_batches_per_update(cfg, 1)
    batches = task.epoch_batches(1, 0, 1)
    groups = [batches[i * f:(i + 1) * f] for i in range(args.warmup + args.updates)]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU bf16: {cpu_has_bf16()}, "
          f"d_model={cfg.model.d_model}, layers={cfg.model.n_encoder_layers}+"
          f"{cfg.model.n_decoder_layers}, vocab={cfg.model.tgt_vocab_size}, "
          f"max_tokens={cfg.data.max_tokens}, update_freq={f}", flush=True)
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        trainers = {"fp32": make_trainer(cfg, task, tok, "fp32", a),
                    "bf16": make_trainer(cfg, task, tok, "bf16", b)}
        seconds = {"fp32": [], "bf16": []}
        tokens = []
        for i, group in enumerate(groups):
            n = sum(task.collate("train", x).n_src_tokens + task.collate("train", x).n_tgt_tokens
                    for x in group)
            for name, trainer in trainers.items():
                dt = timed_update(trainer, group)
                if i >= args.warmup:
                    seconds[name].append(dt)
            if i >= args.warmup:
                tokens.append(n)
                print(f"update {i - args.warmup + 1}: {n} tokens, fp32 {n / seconds['fp32'][-1]:,.0f} "
                      f"tok/s, bf16 {n / seconds['bf16'][-1]:,.0f} tok/s", flush=True)
        loss = {k: t._interval.loss / t._interval.targets for k, t in trainers.items()}
    total = sum(tokens)
    fp32, bf16 = total / sum(seconds["fp32"]), total / sum(seconds["bf16"])
    ratio = statistics.median(x / y for x, y in zip(seconds["fp32"], seconds["bf16"]))
    print(f"over {len(tokens)} updates ({total:,} tokens): fp32 {fp32:,.0f} tokens/s, "
          f"bf16 {bf16:,.0f} tokens/s; median per-update speed-up bf16/fp32 = {ratio:.2f}x; "
          f"mean loss fp32 {loss['fp32']:.4f}, bf16 {loss['bf16']:.4f}")


if __name__ == "__main__":
    main()
