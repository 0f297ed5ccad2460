"""The data path at scale: the token store's one-time build, and training from it, on synthetic
parallel corpora of WMT-like lengths. Not a test: a measurement for docs/data.md.

    python benchmarks/bench_data_scale.py [--sizes 100000 1000000 5000000] [--steps 30] [--ddp]
    python benchmarks/bench_data_scale.py --smoke      # tiny sizes, every code path, seconds

With ``--work DIR`` the corpora stay in DIR, and a later run with the same DIR reuses them; with
``--keep-stores`` too, their token stores stay in DIR's data cache, and a later run measures
training on them without building again (its build record then says ``"reused": true`` and keeps
only what the store's manifest recorded of its build).

For each size N it writes N training pairs (and 1,000 validation pairs) as your own files: words
drawn from a Zipf-distributed 60,000-word vocabulary, source lengths log-normal with a mean of
~25 words (WMT14 En-De's is ~23 for English), the target 0.8-1.25 times as long. Then:

1. ``aiayn data build`` (the demo recipe's BPE 8,000, on a bounded sample of the pairs): build
   seconds of the stores and of the tokenizer, pairs/s per core, peak RSS of the process;
2. ``aiayn train`` with the stores built: seconds from start to the first update (the first line
   of metrics.jsonl), peak RSS of the process — with ``--ddp`` also of two ranks (torchrun,
   gloo), per rank and summed;
3. in this process, the demo model trained on the same first batches collated from the store
   and from lists of ids in RAM (the in-memory path): training tokens/s of each (after a warm-up
   pass, alternated runs, the better of two each).

Peak RSS is sampled every 0.1 s over the process tree (/proc): all resident pages (VmRSS), and
the anonymous ones (RssAnon), without the store's mapped file pages, which the kernel can drop. Results: a table on stdout and JSON
(``--json``, default docs/experiments/data_scale.json; the smoke run writes to a temporary
folder). Timings are only comparable on an idle machine: the script prints the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from aiayn.env import cpu_name  # noqa: E402

FULL_SIZES = (100_000, 1_000_000, 5_000_000)
SMOKE_SIZES = (300, 600)
N_VALID = 1_000  # validation pairs
RECIPE = str(ROOT / "configs/multi30k_demo.toml")


# ---- corpus ---------------------------------------------------------------------------------------

def write_corpus(folder: Path, n: int, n_valid: int = N_VALID, seed: int = 0) -> dict[str, str]:
    """N synthetic pairs of WMT-like lengths as own files; returns the data.* keys. A corpus that
    an earlier run wrote into the same ``--work`` folder with the same sizes and seed is reused
    (``corpus.json`` is written last, so a half-written corpus is written again)."""
    record = folder / "corpus.json"
    wanted = {"pairs": n, "valid": n_valid, "seed": seed}
    keys = {f"data.{split}_{side}": str(folder / f"{split}.{side}")
            for split in ("train", "valid") for side in ("src", "tgt")}
    if record.is_file() and json.loads(record.read_text()) == wanted:
        return keys
    record.unlink(missing_ok=True)
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = ["".join(rng.choice(letters, size=k)) for k in rng.integers(2, 10, size=60_000)]
    for split, count in (("train", n), ("valid", n_valid)):
        paths = {side: folder / f"{split}.{side}" for side in ("src", "tgt")}
        with open(paths["src"], "w", encoding="utf-8") as fs, open(paths["tgt"], "w", encoding="utf-8") as ft:
            for start in range(0, count, 50_000):
                m = min(50_000, count - start)
                src_len = np.clip(rng.lognormal(3.1, 0.5, size=m), 1, 200).astype(int)
                tgt_len = np.clip(src_len * rng.uniform(0.8, 1.25, size=m), 1, 250).astype(int)
                for lengths, f in ((src_len, fs), (tgt_len, ft)):
                    ids = (rng.zipf(1.3, size=int(lengths.sum())) - 1) % len(words)
                    cuts = np.cumsum(lengths)[:-1]
                    f.write("".join(" ".join(words[i] for i in row) + "\n" for row in np.split(ids, cuts)))
    record.write_text(json.dumps(wanted))
    return keys


# ---- processes and their memory -----------------------------------------------------------------

def _tree_rss(root: int) -> dict[int, tuple[int, int]]:
    """(VmRSS, RssAnon) in bytes of ``root`` and every descendant: all resident pages, and those
    that are not file pages (a mapped store's pages are file pages, which the kernel can drop)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        try:
            fields = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status"))
            out[pid] = tuple(int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "RssAnon"))
        except (OSError, KeyError, ValueError):
            pass
        todo += children.get(pid, [])
    return out


def run_measured(args: list[str], env: dict, first_line: Path | None = None, timeout: float = 3600) -> dict:
    """Run a command; its seconds, peak RSS (largest process, and the tree's sum), stderr, and
    the seconds until ``first_line`` had a line."""
    start = time.monotonic()
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = {"max": 0, "sum": 0, "anon": 0}
    first: list[float] = []

    def watch() -> None:
        while proc.poll() is None:
            rss = _tree_rss(proc.pid)
            if rss:
                peak["max"] = max(peak["max"], max(r for r, _ in rss.values()))
                # the ranks, without torchrun's launcher (the root) when it has children
                ranks = [r for pid, (r, _) in rss.items() if pid != proc.pid or len(rss) == 1]
                peak["sum"] = max(peak["sum"], sum(ranks))
                peak["anon"] = max(peak["anon"], max(a for _, a in rss.values()))
            if first_line is not None and not first and first_line.is_file() and first_line.stat().st_size:
                first.append(time.monotonic() - start)
            time.sleep(0.1)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    out, err = proc.communicate(timeout=timeout)
    thread.join()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args[:6])} ... failed:\n{err[-3000:]}")
    return {"seconds": time.monotonic() - start, "peak_rss": peak["max"], "peak_rss_sum": peak["sum"],
            "peak_rss_anon": peak["anon"],
            "first": first[0] if first else None, "stdout": out, "stderr": err}


def aiayn(*args: str) -> list[str]:
    return [sys.executable, "-m", "aiayn", *args]


# ---- the measurements ---------------------------------------------------------------------------

def config_values(keys: dict[str, str], smoke: bool, steps: int) -> list[str]:
    sets = {**keys, "data.dataset": "", "train.max_steps": steps, "train.valid_every": 10**6,
            "train.save_every": 10**6, "train.log_every": 1,
            "train.max_time": 0, "train.warmup_steps": 1,
            # the demo recipe as the records were made with (2026-11-26): a cosine over updates,
            # 4,096-token batches, the full softmax
            "train.schedule_clock": "updates", "data.max_tokens": 4096, "model.output_vocab": "all"}
    if smoke:
        sets.update({"data.vocab_size": 300, "model.d_model": 32,
                     "model.n_heads": 2, "model.d_ff": 64, "model.n_encoder_layers": 1,
                     "model.n_decoder_layers": 1, "data.max_tokens": 512})
    return [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]


def measure_build(sets: list[str], env: dict, n: int) -> dict:
    data_sets = [a for k, v in zip(sets[::2], sets[1::2]) if v.startswith("data.") for a in (k, v)]
    run = run_measured(aiayn("data", "build", "--config", RECIPE, *data_sets), env)
    manifest = json.loads((Path(run["stdout"].split()[1].rstrip(":")) / "manifest.json").read_text())
    store_s = manifest["build_seconds"]
    built = {"pairs": n, "seconds_store": store_s, "pairs_per_s_per_core": round(n / store_s / (os.cpu_count() or 1)),
             "store_mib": _store_mib(run["stdout"]), "counts": manifest["counts"]}
    if "built before, reused" in run["stderr"]:  # a store kept by an earlier --keep-stores run
        return {**built, "reused": True}
    return {**built, "seconds_total": round(run["seconds"], 1), "peak_rss_mib": round(run["peak_rss"] / 2**20),
            "peak_rss_anon_mib": round(run["peak_rss_anon"] / 2**20)}


def _store_mib(stdout: str) -> float:
    return round(sum(float(line.split(" MiB")[0].rsplit(", ", 1)[1]) for line in stdout.splitlines()), 1)


def measure_train(sets: list[str], env: dict, work: Path, ddp: bool) -> dict:
    out = work / ("ddp" if ddp else "run")
    shutil.rmtree(out, ignore_errors=True)
    args = ["train", RECIPE, "--out", str(out), *sets]
    command = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                "-m", "aiayn", *args] if ddp else aiayn(*args))
    run = run_measured(command, env, first_line=out / "metrics.jsonl")
    if "built in" in run["stderr"]:
        raise SystemExit("aiayn train built a store: the stores of `aiayn data build` were not reused")
    return {"seconds_to_first_update": round(run["first"], 1) if run["first"] else None,
            "peak_rss_mib": round(run["peak_rss"] / 2**20),
            "peak_rss_anon_mib": round(run["peak_rss_anon"] / 2**20),
            "peak_rss_sum_mib": round(run["peak_rss_sum"] / 2**20)}


def measure_tokens_per_s(keys: dict[str, str], smoke: bool, steps: int) -> dict:
    """The demo model on the same first batches, collated from the store and from id lists.
    oneDNN keeps every kernel of these few batch shapes (as the trainer does for few shapes), so
    that both paths run on warm kernels: with torch's 1,024 the cache sat near its capacity and
    evictions made the ratio swing (0.88 and 0.98 in two calls in one process)."""
    from aiayn.train.allocator import cache_cpu_kernels

    cache_cpu_kernels()  # before the first matmul of this process
    import torch

    from aiayn.data import collate_translation, train_tokenizer_for, translation_store
    from aiayn.run_config import load_run_config
    from aiayn.train.task import build_task

    overrides = config_values(keys, smoke, steps)[1::2]
    cfg, _ = load_run_config(RECIPE, overrides)
    tok = train_tokenizer_for(cfg.data)
    store = translation_store(cfg.data, tok, cfg.data.train_split)
    task = build_task(cfg)
    task.setup(tok.to_str())
    model = task.build_model(task.model_config(cfg.model))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    batches = task.epoch_batches(1, 0, 1)[:steps]
    lists = {i: (store.row("src", i).tolist(), store.row("tgt", i).tolist()) for b in batches for i in b}
    m = cfg.model

    def collate_store(indices):
        return task.collate("train", indices)

    def collate_lists(indices):
        return collate_translation([lists[i] for i in indices], m.pad_id, m.bos_id, m.eos_id)

    def run(collate) -> float:
        tokens, start = 0, time.perf_counter()
        for indices in batches:
            batch = collate(indices)
            stats = task.loss(model, batch, torch.device("cpu"))
            optimizer.zero_grad()
            (stats.loss / stats.n_targets).backward()
            optimizer.step()
            tokens += stats.n_tokens
        return tokens / (time.perf_counter() - start)

    run(collate_lists)  # warm-up: first-call paths, oneDNN kernels
    speeds: dict[str, list[float]] = {"store": [], "in_memory": []}
    for i in range(4):  # alternated, the better of two each
        which = ("store", collate_store) if i % 2 else ("in_memory", collate_lists)
        speeds[which[0]].append(run(which[1]))
    best = {k: max(v) for k, v in speeds.items()}
    return {"tokens_per_s_store": round(best["store"]), "tokens_per_s_in_memory": round(best["in_memory"]),
            "ratio": round(best["store"] / best["in_memory"], 3), "batches": len(batches)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", help=f"pairs (default {FULL_SIZES})")
    parser.add_argument("--steps", type=int, default=30, help="training updates per measurement")
    parser.add_argument("--ddp", action="store_true", help="also train with two ranks (torchrun)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes and model, seconds")
    parser.add_argument("--work", help="folder for corpora and runs (default: a temporary one)")
    parser.add_argument("--keep-stores", action="store_true",
                        help="with --work: keep the token stores for the next run (which then skips the build)")
    parser.add_argument("--json", help="where to write results (default docs/experiments/data_scale.json)")
    args = parser.parse_args(argv)
    sizes = args.sizes or (SMOKE_SIZES if args.smoke else FULL_SIZES)
    steps = 3 if args.smoke else args.steps
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-data-scale-"))
    cache = work / "cache"
    os.environ["AIAYN_CACHE"] = str(cache)  # a fresh data cache: every store is built here
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    results = {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "cpu": cpu_name(),
               "cores": os.cpu_count(), "load_average_start": os.getloadavg(), "sizes": []}
    for i, n in enumerate(sizes):
        folder = work / f"corpus_{n}"
        folder.mkdir(parents=True, exist_ok=True)
        keys = write_corpus(folder, n, 100 if args.smoke else N_VALID)
        sets = config_values(keys, args.smoke, steps)
        row = {"pairs": n, "build": measure_build(sets, env, n), "train": measure_train(sets, env, folder, False)}
        # the smoke run trains two ranks once (not again on a store a --keep-stores run kept)
        if args.ddp or (args.smoke and i == 0 and not row["build"].get("reused")):
            row["train_ddp"] = measure_train(sets, env, folder, True)
        row["speed"] = measure_tokens_per_s(keys, args.smoke, steps)
        results["sizes"].append(row)
        print(json.dumps(row), flush=True)
        if not args.work:  # a --work folder keeps its corpora for the next run
            shutil.rmtree(folder, ignore_errors=True)
        if not (args.keep_stores and args.work):
            shutil.rmtree(cache / "stores", ignore_errors=True)
    results["load_average_end"] = os.getloadavg()
    default = work / "data_scale.json" if args.smoke else ROOT / "docs/experiments/data_scale.json"
    out = Path(args.json or default)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print_table(results)
    print(f"wrote {out}")
    if args.smoke and not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def print_table(results: dict) -> None:
    print(f"\n{results['cpu']}, {results['cores']} cores, load average {results['load_average_start']}")
    print("| pairs | build s | pairs/s/core | build RSS MiB | store MiB | first update s | train RSS (anon) MiB "
          "| 2 ranks RSS MiB | tokens/s store / in memory |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in results["sizes"]:
        b, t, s = row["build"], row["train"], row["speed"]
        ddp = row.get("train_ddp", {}).get("peak_rss_sum_mib", "-")
        print(f"| {row['pairs']:,} | {b['seconds_store']} | {b['pairs_per_s_per_core']:,} "
              f"| {'(reused)' if b.get('reused') else b['peak_rss_mib']} "
              f"| {b['store_mib']} | {t['seconds_to_first_update']} | {t['peak_rss_mib']} ({t['peak_rss_anon_mib']}) | {ddp} "
              f"| {s['tokens_per_s_store']} / {s['tokens_per_s_in_memory']} ({s['ratio']:.3f}) |")


if __name__ == "__main__":
    sys.exit(main())
