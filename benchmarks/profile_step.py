"""Where the time of a training update goes: ``torch.profiler`` over steady updates (issue 57).

Two targets, each a few updates run three times over the same batches — once to see every shape
(a GPU's first sight of a shape costs ~0.27 s: docs/gpu.md), once timed without the profiler, once
under it — so that what is profiled is the steady step a long run settles into:

* ``wmt``   configs/wmt14_en_de_base.toml (the base model, BPE 37,000, the recipe's 25,000 tokens
            per update in micro-batches of ``--max-tokens``: 12,500 makes 2 on one GPU) on
            synthetic pairs of WMT-like lengths, written and tokenized into a token store as
            ``wmt_projection.py --measure`` does; ``--set`` adds overrides (bucket widths, …);
* ``bench`` bench_train.py's ``--bench-preset`` (BASE) through its aiayn system (the trainer's
            own update) on the first full real Multi30k batches of ``--bench-max-tokens``.

Per update it reports: the wall-clock without the profiler and the real tokens/s; the share of the
profiled wall the GPU is busy (the union of its kernels' and copies' intervals; on the CPU "n/a",
and the share of the wall some aten op runs instead); the host's time (the profiled wall less the
time it waits in synchronising calls); kernel launches (``cudaLaunchKernel``-like runtime calls;
on the CPU the aten ops, nested ones included); host-device syncs (``cuda*Synchronize`` calls
and device-to-host copies; "n/a" on the CPU); and the top kernels by device time (on the CPU the
aten ops by self time). Written as JSON and a markdown table into ``--out``.

    python benchmarks/profile_step.py --device cuda --out DIR      # ~1 minute on a GPU
    python benchmarks/profile_step.py --device cpu --updates 2 --pairs 60 --max-tokens 256 \\
        --bench-preset dry-base --bench-max-tokens 512 --set model.d_model=32 ...  # a dry run
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for place in (ROOT, ROOT / "benchmarks"):  # a checkout without `pip install -e .`; bench_train
    if str(place) not in sys.path:
        sys.path.insert(0, str(place))

import torch  # noqa: E402

# Runtime calls that launch work on the device, and those that make the host wait for it.
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
            "cudaLaunchCooperativeKernel", "cudaGraphLaunch")
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


# --------------------------------------------------------------------------------------------
# The two targets: (a function running one update, the updates' inputs, real tokens per update)
# --------------------------------------------------------------------------------------------


def wmt_target(args: argparse.Namespace, work: Path) -> tuple[Callable[[Any], Any], list, float, dict]:
    """The WMT base recipe's trainer on synthetic pairs, and its first ``--updates`` updates."""
    from wmt_projection import write_synthetic_pairs

    from aiayn.run_config import load_run_config
    from aiayn.train.distributed import DistContext
    from aiayn.train.run_folder import RunFolder
    from aiayn.train.task import build_task
    from aiayn.train.trainer import Trainer

    sets = [*write_synthetic_pairs(work, args.pairs), f"train.device={args.device}",
            f"data.max_tokens={args.max_tokens}", "train.valid_every=0",
            "train.save_every_minutes=0", *args.extra]
    cfg, _ = load_run_config(ROOT / "configs" / "wmt14_en_de_base.toml", sets)
    task = build_task(cfg)
    tokenizer_json = task.setup(None)
    cfg = replace(cfg, model=task.model_config(cfg.model))
    task.cfg = cfg
    folder = RunFolder(work / "run")
    folder.prepare(resume=False)
    trainer = Trainer(cfg, task, folder, DistContext(device=torch.device(args.device)), {},
                      tokenizer_json, resume=False)
    k = trainer.update_freq
    batches = task.epoch_batches(1, 0, 1)
    groups = [batches[i * k:(i + 1) * k] for i in range(min(args.updates, len(batches) // k))]
    tokens = sum(b.n_src_tokens + b.n_tgt_tokens for g in groups
                 for b in (task.collate("train", i) for i in g))
    about = {"config": "configs/wmt14_en_de_base.toml", "overrides": [f"data.max_tokens={args.max_tokens}", *args.extra],
             "micro_batches_per_update": k, "vocab": cfg.model.tgt_vocab_size,
             "precision": str(trainer.setup.autocast_dtype or "fp32"), "pairs": args.pairs}
    return trainer.update, groups, tokens / max(len(groups), 1), about


def bench_target(args: argparse.Namespace, work: Path) -> tuple[Callable[[Any], Any], list, float, dict]:
    """bench_train.py's aiayn system of ``--bench-preset`` on its real Multi30k batches."""
    import bench_train

    shape = bench_train.PRESETS[args.bench_preset]
    pairs, batches, info = bench_train.multi30k_batches(shape, args.bench_max_tokens, args.updates)
    system = bench_train.AiaynSystem(shape, "auto", pairs, str(work / "bench_run"),
                                     device=args.device)
    about = {"preset": args.bench_preset, **info,
             "precision": str(system.trainer.setup.autocast_dtype or "fp32")}
    return system.step, batches, sum(b.n_tokens for b in batches) / max(len(batches), 1), about


TARGETS = {"wmt": wmt_target, "bench": bench_target}


# --------------------------------------------------------------------------------------------
# Profiling and the figures
# --------------------------------------------------------------------------------------------


def profile_updates(step: Callable[[Any], Any], items: Sequence, device: torch.device) -> dict:
    """Every update once (first sights), again timed, again under the profiler."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def run_all() -> float:
        sync()
        start = time.perf_counter()
        for item in items:
            step(item)
        sync()
        return time.perf_counter() - start

    first = run_all()
    clean = run_all()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        profiled = run_all()
    return {"first_s": first, "clean_s": clean, "profiled_s": profiled, "events": prof.events()}


def union_us(intervals: list[tuple[float, float]]) -> float:
    """Total length of the union of (start, end) intervals."""
    total, end = 0.0, -float("inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def figures(run: dict, n: int, tokens: float, cuda: bool, top: int) -> dict[str, Any]:
    """Per-update figures from the profiler's events (see the module docstring)."""
    from torch.autograd import DeviceType

    events = run["events"]
    wall_us = run["profiled_s"] * 1e6
    on_device = [e for e in events if e.device_type != DeviceType.CPU]
    on_host = [e for e in events if e.device_type == DeviceType.CPU]
    out: dict[str, Any] = {
        "updates": n, "tokens_per_update": round(tokens),
        "first_sight_s_per_update": round(run["first_s"] / n, 4),
        "s_per_update": round(run["clean_s"] / n, 4),
        "tokens_per_s": round(tokens * n / run["clean_s"]),
        "profiled_s_per_update": round(run["profiled_s"] / n, 4),
    }
    aten = [e for e in on_host if e.name.startswith("aten::")]
    if cuda:
        busy = union_us([(e.time_range.start, e.time_range.end) for e in on_device])
        waits = [e for e in on_host if e.name in SYNCS]
        blocked_us = sum(e.time_range.end - e.time_range.start for e in waits)
        kinds = defaultdict(list)
        for e in on_device:
            kinds[e.name].append(e.time_range.end - e.time_range.start)
        device_us = sum(sum(v) for v in kinds.values())
        out.update({
            "device_busy_share": round(busy / wall_us, 4),
            "host_s_per_update": round((wall_us - blocked_us) / 1e6 / n, 4),
            "launches_per_update": round(sum(e.name in LAUNCHES for e in on_host) / n, 1),
            # the two synchronizes around the updates are the benchmark's own
            "syncs_per_update": round(max(len(waits) - 2, 0) / n, 2),
            "dtoh_copies_per_update": round(sum("DtoH" in e.name for e in on_device) / n, 2),
            "top": [{"name": name, "calls_per_update": round(len(v) / n, 1),
                     "ms_per_update": round(sum(v) / 1e3 / n, 3),
                     "share": round(sum(v) / max(device_us, 1e-9), 4)}
                    for name, v in sorted(kinds.items(), key=lambda kv: -sum(kv[1]))[:top]],
        })
    else:
        self_us: dict[str, list[float]] = defaultdict(list)
        for e in aten:
            self_us[e.name].append(e.self_cpu_time_total)
        total = sum(sum(v) for v in self_us.values())
        out.update({
            "device_busy_share": "n/a (CPU: no device; cpu_op_share is the share of the wall "
                                 "some aten op runs)",
            "cpu_op_share": round(union_us([(e.time_range.start, e.time_range.end) for e in aten])
                                  / wall_us, 4),
            "host_s_per_update": round(run["profiled_s"] / n, 4),
            "launches_per_update": round(len(aten) / n, 1),  # aten ops, nested ones included
            "syncs_per_update": "n/a (CPU)",
            "dtoh_copies_per_update": "n/a (CPU)",
            "top": [{"name": name, "calls_per_update": round(len(v) / n, 1),
                     "ms_per_update": round(sum(v) / 1e3 / n, 3),
                     "share": round(sum(v) / max(total, 1e-9), 4)}
                    for name, v in sorted(self_us.items(), key=lambda kv: -sum(kv[1]))[:top]],
        })
    return out


def markdown(report: dict[str, Any]) -> str:
    m = report["meta"]
    lines = [f"profile_step — {m['device_name']}, torch {m['torch']}, {m['date']}", "",
             "| target | tokens / update | s / update | tokens/s | first sight s / update | "
             "device busy | host s / update | launches / update | syncs / update | "
             "DtoH / update |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def pct(x: Any) -> str:
        return f"{100 * x:.1f}%" if isinstance(x, float) else "n/a"

    for name, r in report["targets"].items():
        busy = pct(r["device_busy_share"]) if "cpu_op_share" not in r else \
            f"n/a (aten ops {pct(r['cpu_op_share'])})"
        lines.append(f"| {name} | {r['tokens_per_update']} | {r['s_per_update']:.4f} | "
                     f"{r['tokens_per_s']} | {r['first_sight_s_per_update']:.4f} | {busy} | "
                     f"{r['host_s_per_update']:.4f} | {r['launches_per_update']} | "
                     f"{r['syncs_per_update']} | {r['dtoh_copies_per_update']} |")
    for name, r in report["targets"].items():
        what = "aten ops by self CPU time" if "cpu_op_share" in r else "kernels by device time"
        lines += ["", f"Top {what}, {name}:", "", "| name | calls / update | ms / update | share |",
                  "|---|---:|---:|---:|"]
        lines += [f"| `{t['name'][:80]}` | {t['calls_per_update']} | {t['ms_per_update']:.3f} | "
                  f"{100 * t['share']:.1f}% |" for t in r["top"]]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--targets", nargs="+", choices=list(TARGETS), default=list(TARGETS))
    p.add_argument("--updates", type=int, default=8, help="updates per pass (three passes)")
    p.add_argument("--pairs", type=int, default=30_000, help="synthetic WMT-like training pairs")
    p.add_argument("--max-tokens", type=int, default=12_500, help="wmt: data.max_tokens")
    p.add_argument("--bench-preset", default="base", help="bench: a bench_train.py preset")
    p.add_argument("--bench-max-tokens", type=int, default=16_384)
    p.add_argument("--top", type=int, default=15, help="kernels listed per target")
    p.add_argument("--set", dest="extra", action="append", default=[],
                   help="wmt: more overrides of the recipe (key=value)")
    p.add_argument("--out", type=Path, default=Path("profile_step"),
                   help="folder for profile.json and profile.md")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"profile_step: --device {args.device}: CUDA is not available here", file=sys.stderr)
        return 2
    report: dict[str, Any] = {"meta": {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda"
        else f"CPU ({platform.processor() or platform.machine()}), {torch.get_num_threads()} threads",
        "command": "python benchmarks/profile_step.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "method": "each update run once (first sights), again timed, again under torch.profiler"},
        "targets": {}, "about": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.targets:
            work = Path(tmp) / name
            work.mkdir()
            step, items, tokens, about = TARGETS[name](args, work)
            run = profile_updates(step, items, device)
            report["targets"][name] = figures(run, len(items), tokens, device.type == "cuda", args.top)
            report["about"][name] = about
            r = report["targets"][name]
            print(f"profile_step {name}: {r['s_per_update']:.4f} s / update, "
                  f"{r['tokens_per_s']} tokens/s, device busy {r['device_busy_share']}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "profile.json").write_text(json.dumps(report, indent=1) + "\n")
    text = markdown(report)
    (args.out / "profile.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
