"""One trained model, seven ways to run it: speed, latency, BLEU, peak memory and size on disk.

Native PyTorch fp32, native fp32 with the decoder step compiled (``decode.compile``: AOTInductor,
compiled before the rounds and cached in $AIAYN_CACHE), native bf16 autocast, native int8 (dynamic quantization of the linear layers
that run as modules; measured, not shipped: docs/decoding.md), ONNX Runtime fp32 (aiayn's search
over the exported graphs), CTranslate2 float32 and int8 (its own beam search) translate the same
test set with the same beam and length penalty. Every engine ranks finished hypotheses by
log P / |Y| (length penalty "average"), the setting under which CTranslate2's beam search is
aiayn's (docs/export.md), so that BLEU differences come from the numerics alone.

Each measurement runs in a subprocess of its own, so that its peak RSS is its own, and the engines
alternate within each of ``--repeats`` rounds (the machine's load moves all of them alike); the
table gives medians over the rounds and the median of the per-round ratios to CTranslate2
float32. Two measurements per engine and round: the whole test set in token-bounded batches
(sentences/s, ``--threads`` × ``--workers``), and the first ``--latency`` sentences one at a time
(batch 1, ``--latency-threads``, one worker). The RSS of the batch process is read after
``import torch``, after loading the model and after the warm-up batch, and its peak at the end.

``--sweep`` asks another question: is each engine's default the fastest setting of this machine?
It measures native fp32, ONNX Runtime fp32 (when onnxruntime is installed), CTranslate2 float32
and int8 over a small grid of W workers × T threads each (W × T at most the cores: on 2 cores
1×1, 1×2, 2×1; :func:`grid`) and at the engine's default: no ``--workers``, the threads left to
aiayn, no OMP_NUM_THREADS (what `aiayn translate` does with no flags). Per engine: each setting's
sentences/s, the best, the setting the default chose, and the median per-round ratio of the
default to the best; a WARNING line when the default runs more than 10% slower than the best.
Settings alternate within each round, like the engines. OMP_WAIT_POLICY is left unset (as a
user's is) unless ``--omp-wait-policy`` says otherwise.

    make bench-engines                      # runs/demo/m1/avg5, test_2016_flickr, beam 5, 5 rounds
    python benchmarks/bench_engines.py --model RUN/avg5 --limit 200 --repeats 3
    make bench-sweep                        # --sweep: the defaults against the grid, 3 rounds

Writes docs/experiments/engines.json and the table between the markers in docs/experiments/engines.md
(``--sweep``: docs/experiments/engines_sweep.json and its own markers in the same page).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENGINES = (
    "native fp32",
    "native fp32 compiled",
    "native bf16",
    "native int8",
    "onnxruntime fp32",
    "ctranslate2 float32",
    "ctranslate2 int8",
)
NATIVE = ("native fp32", "native fp32 compiled", "native bf16", "native int8")
COMPILED = "native fp32 compiled"  # decode.compile: its package is compiled before the rounds
REFERENCE = "ctranslate2 float32"  # the engine the ratios are taken against
BEGIN, END = "<!-- engines:begin (benchmarks/bench_engines.py) -->", "<!-- engines:end -->"
# --sweep: the engines a user picks between (the other native settings are options of the first)
SWEEP_ENGINES = ("native fp32", "onnxruntime fp32", "ctranslate2 float32", "ctranslate2 int8")
# its own section, which ends at the next end marker (one "engines" name: a generated section)
SWEEP_BEGIN, SWEEP_END = "<!-- engines:begin (benchmarks/bench_engines.py --sweep) -->", END
LIBRARY = {"native": "torch", "onnxruntime": "onnx", "ctranslate2": "ctranslate2"}  # aiayn's names
WARN_BELOW = 0.9  # a default under 0.9× the best setting measured is a regression


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(ROOT / "runs" / "demo" / "m1" / "avg5"))
    p.add_argument("--split", default="test_2016_flickr")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--length-penalty", default="average", choices=("average", "gnmt", "none"))
    p.add_argument("--threads", type=int, default=2, help="0: aiayn's choice for the machine")
    p.add_argument(
        "--workers",
        type=int,
        default=2,
        help="batches at once, each on threads/workers threads (aiayn workers, "
        "CTranslate2 inter_threads); 0: aiayn's choice for the engine",
    )
    p.add_argument(
        "--sweep",
        action="store_true",
        help="each engine over a grid of workers × threads and at its default (no flags): the "
        "default's ratio to the best setting",
    )
    p.add_argument(
        "--grid",
        nargs="+",
        metavar="WxT",
        help="--sweep's settings, W workers of T threads each (default: 1x1 and the cores split "
        "into 1, 2, 4 … workers)",
    )
    p.add_argument(
        "--max-tokens", type=int, default=0, help="tokens per batch (0: DecodeConfig's default)"
    )
    p.add_argument("--limit", type=int, default=0, help="first N sentences only")
    p.add_argument("--repeats", type=int, default=5, help="rounds; medians are reported")
    p.add_argument(
        "--latency", type=int, default=100, help="sentences decoded one at a time (0: none)"
    )
    p.add_argument("--latency-threads", type=int, default=1)
    p.add_argument(
        "--engines", nargs="*", help="default: all seven (--sweep: the four a user picks between)"
    )
    p.add_argument(
        "--omp-wait-policy",
        help="OMP_WAIT_POLICY of every engine's process (default PASSIVE: sleeping threads, safe "
        "on a shared machine; --sweep: unset, as a user's); '' leaves OpenMP's default (spinning)",
    )
    p.add_argument("--note", default="", help="what else ran on the machine")
    p.add_argument(
        "--out", help="default: docs/experiments/engines.json (--sweep: engines_sweep.json)"
    )
    p.add_argument("--doc", default=str(ROOT / "docs" / "experiments" / "engines.md"))
    p.add_argument("--worker", help=argparse.SUPPRESS)  # internal: run one engine, print JSON
    p.add_argument("--mode", default="batch", help=argparse.SUPPRESS)  # batch | latency | prepare
    p.add_argument("--folder", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return args
    if args.engines is None:
        args.engines = list(SWEEP_ENGINES if args.sweep else ENGINES)
        if args.sweep and importlib.util.find_spec("onnxruntime") is None:
            args.engines.remove("onnxruntime fp32")  # optional (the export extra)
    if unknown := [e for e in args.engines if e not in ENGINES]:
        p.error(f"--engines: unknown {unknown}; choose from {', '.join(ENGINES)}")
    if args.omp_wait_policy is None:
        args.omp_wait_policy = "" if args.sweep else "PASSIVE"
    if args.out is None:
        args.out = str(
            ROOT / "docs" / "experiments" / f"engines{'_sweep' if args.sweep else ''}.json"
        )
    try:
        args.grid = [parse_setting(s) for s in args.grid] if args.grid else grid(cores())
    except ValueError as err:
        p.error(f"--grid: {err}")
    if args.sweep and args.latency:
        args.latency = 0  # the sweep measures the test set in batches only
    return args


def cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def grid(n: int) -> list[tuple[int, int]]:
    """--sweep's (workers, threads per worker) settings on ``n`` cores, every product at most
    ``n``: 1×1, and the cores split into 1, 2, 4 … workers (2 cores: 1×1, 1×2, 2×1; 8 cores:
    1×1, 1×8, 2×4, 4×2, 8×1)."""
    settings, workers = {(1, 1)}, 1
    while workers <= n:
        settings.add((workers, n // workers))
        workers *= 2
    return sorted(settings, key=lambda s: (s[0] * s[1], s))


def parse_setting(text: str) -> tuple[int, int]:
    """'2x1' (or '2×1') -> (2, 1): 2 workers of 1 thread each."""
    w, sep, t = text.replace("×", "x").partition("x")
    if not (sep and w.isdigit() and t.isdigit() and int(w) > 0 and int(t) > 0):
        raise ValueError(f"'{text}' is not WxT (workers x threads per worker, e.g. 2x1)")
    return int(w), int(t)


def label(workers: int, threads: int) -> str:
    return f"{workers}×{threads}"


def default_vs_best(settings: dict[str, list[float]], default: list[float]) -> tuple[str, float]:
    """The fastest setting (highest median sentences/s over the rounds) and the median over the
    rounds of the default's sentences/s ÷ that setting's in the same round."""
    best = max(settings, key=lambda s: statistics.median(settings[s]))
    ratios = [d / b for d, b in zip(default, settings[best])]
    return best, round(statistics.median(ratios), 2)


def default_warning(what: str, default: str, best: str, ratio: float) -> str | None:
    """The warning line when ``what``'s default runs more than 10% slower than the best setting
    measured (ratio default ÷ best under :data:`WARN_BELOW`); None otherwise."""
    if ratio >= WARN_BELOW:
        return None
    return (
        f"WARNING: {what}: the default ({default}) runs at {ratio:.2f}× the best setting "
        f"({best}) measured"
    )


def folder_size(path: Path) -> int:
    return sum(
        f.stat().st_size
        for f in path.rglob("*")
        if f.is_file()
        and f.name != "tokenizer.json"
        and not f.name.startswith("eval_")
        and f.suffix != ".md"
    )


def rss_mb() -> float:
    """This process's resident memory now (/proc/self/statm), MB."""
    with open("/proc/self/statm", encoding="ascii") as f:
        return round(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6, 1)


def quantize_int8(model):
    """Dynamic int8 quantization (torch.ao) of the linear layers aiayn runs as modules: the
    attention output projections, cross-attention queries and the feed-forward layers. The
    stacked self-attention projections and the output projection read their weights directly
    and stay in float32."""
    import torch
    from torch import nn

    as_modules = ("out_proj", "linear1", "linear2", "cross_attn.q_proj")
    names = {
        name
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and name.endswith(as_modules)
    }
    return torch.ao.quantization.quantize_dynamic(model, names, dtype=torch.qint8)


def run_one(args: argparse.Namespace) -> dict:
    """In the subprocess: load one engine, translate the test set (or its first sentences one at
    a time), score it."""
    import torch

    after_import = rss_mb()
    from aiayn.data import load_translation
    from aiayn.decode import DecodeConfig
    from aiayn.eval import corpus_scores
    from aiayn.folder import load_model_folder
    from aiayn.folder.config import read_folder_config
    from aiayn.memory import keep_freed_memory
    from aiayn.threads import default_workers, threads_for_load

    latency = args.mode == "latency"
    threads, workers = (args.latency_threads, 1) if latency else (args.threads, args.workers)
    if threads:
        torch.set_num_threads(threads)
    else:  # aiayn's choice for the machine's load, as `aiayn translate` makes it
        threads_for_load()
    keep_freed_memory()
    # the threads the engine is opened with (CTranslate2 splits them between its translators
    # then, and may leave this thread's OpenMP count at its own intra_threads afterwards)
    opened_with = torch.get_num_threads()
    src, ref = load_translation(read_folder_config(args.model).config.data, args.split)
    if args.limit:
        src, ref = src[: args.limit], ref[: args.limit]
    cfg = DecodeConfig(
        beam=args.beam,
        length_penalty=args.length_penalty,
        workers=workers,
        bf16=args.worker == "native bf16",
        compile=args.worker == COMPILED,
        **({"batch_tokens": args.max_tokens} if args.max_tokens else {}),
    )
    start = time.perf_counter()
    folder = load_model_folder([args.folder], "cpu", workers=workers or None)  # any engine
    if args.worker == "native int8":
        from aiayn.runtime.torch_backend import TorchBackend

        # the torch backend runs it
        folder.backend = TorchBackend(quantize_int8(folder.torch_module()), folder.device)
    loaded = time.perf_counter() - start
    if args.mode == "prepare":  # compile the decoder step into $AIAYN_CACHE (or load it)
        folder.backend.compiled(cfg)  # for the batches' threads per worker
        torch.set_num_threads(args.latency_threads)
        folder.backend.compiled(replace(cfg, workers=1))  # and for batch 1's
        return {"compile_seconds": round(time.perf_counter() - start - loaded, 1)}
    after_load = rss_mb()
    folder.translate_hypotheses(src[:16], cfg)  # warm-up (allocations, kernels)
    after_warmup = rss_mb()
    if latency:
        times = []
        for text in src[: args.latency]:
            start = time.perf_counter()
            folder.translate_hypotheses([text], cfg)
            times.append(time.perf_counter() - start)
        return {
            "sentences": len(times),
            "sentences_per_s": round(len(times) / sum(times), 1),
            "median_ms": round(statistics.median(times) * 1e3, 2),
        }
    start = time.perf_counter()
    hyps = folder.translate_hypotheses(src, cfg)
    seconds = time.perf_counter() - start
    scores = corpus_scores([h[0][0] if h else "" for h in hyps], ref)
    threads = opened_with  # as the run used them (workers 0: chosen from these)
    workers = workers or default_workers(LIBRARY[args.worker.split()[0]], threads)
    return {
        "workers": workers,
        "threads_per_worker": max(1, threads // workers),
        "sentences": len(src),
        "seconds": round(seconds, 2),
        "sentences_per_s": round(len(src) / seconds, 1),
        "load_seconds": round(loaded, 2),
        "bleu": round(scores["bleu"], 2),
        "bleu_lc": round(scores["bleu_lc"], 2),
        "chrf": round(scores["chrf"], 2),
        "rss_after_import_mb": after_import,
        "rss_after_load_mb": after_load,
        "rss_after_warmup_mb": after_warmup,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def export_all(model: Path, tmp: Path, engines: list[str]) -> dict[str, tuple[Path, int]]:
    """Engine -> (folder, model bytes on disk), exporting what the engines need."""
    from aiayn.export import export_model

    folders = {name: model for name in NATIVE}
    if "onnxruntime fp32" in engines:
        folders["onnxruntime fp32"] = export_model(model, "onnx", tmp / "onnx")
    for q in ("float32", "int8"):
        if f"ctranslate2 {q}" in engines:
            folders[f"ctranslate2 {q}"] = export_model(
                model, "ctranslate2", tmp / q, quantization=q
            )
    return {e: (folders[e], folder_size(folders[e])) for e in engines}


def commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
        return out + ("+uncommitted" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def table(report: dict) -> str:
    lines = [
        f"Measured {report['date']} on {report['hardware']}, commit {report['commit']}, "
        f"`{report['command']}`: {report['model']}, {report['split']} "
        f"({report['sentences']} sentences), beam {report['beam']}, length penalty "
        f"{report['length_penalty']}, {report['max_tokens']} tokens per batch, {report['threads']} "
        f"threads × {report['workers']} workers "
        f"(batch 1: the first {report['latency_sentences']} sentences one at a time, "
        f"{report['latency_threads']} thread), medians of {report['repeats']} rounds with the "
        f"engines alternating, each run in a process of its own. Load average before/after "
        f"{report['load_before']} / {report['load_after']}"
        f"{'; ' + report['note'] if report['note'] else ''}."
        + (
            f" The compiled decoder step was compiled (or loaded from the cache) in "
            f"{report['compile_seconds']} s before the rounds."
            if "compile_seconds" in report
            else ""
        ),
        "",
        f"| engine | sentences/s | × {REFERENCE} | batch 1: sentences/s | × {REFERENCE} | "
        "BLEU | BLEU-lc | chrF | peak RSS (MB) | RSS after import torch / load / warm-up (MB) "
        "| model on disk (MB) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in report["engines"].items():
        name = engine_label(report, name)
        lat = r.get("latency") or {}
        lines.append(
            f"| {name} | {r['sentences_per_s']} | {fmt(r.get('ratio'))} | "
            f"{lat.get('sentences_per_s', '–')} | {fmt(lat.get('ratio'))} | {r['bleu']} | "
            f"{r['bleu_lc']} | {r['chrf']} | {r['peak_rss_mb']} | {r['rss_after_import_mb']} / "
            f"{r['rss_after_load_mb']} / {r['rss_after_warmup_mb']} | {r['size_mb']} |"
        )
    return "\n".join(lines)


def fmt(ratio: float | None) -> str:
    return "–" if ratio is None else f"{ratio:.2f}"


def worker(
    args: argparse.Namespace,
    name: str,
    folder: Path,
    mode: str,
    env: dict,
    setting: tuple[int, int] | None = None,
) -> dict:
    """One engine, one measurement, in a subprocess of its own; its JSON result. ``setting``:
    (workers, threads in all) instead of ``--workers`` and ``--threads``; 0 threads leaves them
    to aiayn (no OMP_NUM_THREADS), 0 workers too."""
    workers, threads = setting or (args.workers, args.threads)
    cmd = [sys.executable, __file__, "--worker", name, "--mode", mode, "--folder", str(folder)]
    cmd += ["--threads", str(threads), "--workers", str(workers)]
    for flag in ("model", "split", "beam", "length_penalty", "limit", "latency",
                 "latency_threads", "max_tokens"):  # fmt: skip
        cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    threads = args.latency_threads if mode == "latency" else threads
    env = {k: v for k, v in env.items() if k not in ("OMP_NUM_THREADS", "AIAYN_THREADS")}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"{name} ({mode}) failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def median_ratio(rounds: list[dict], reference: list[dict] | None) -> float | None:
    """The median over rounds of this engine's sentences/s ÷ the reference's in the same round."""
    if not reference:
        return None
    pairs = zip(rounds, reference)
    return round(
        statistics.median(r["sentences_per_s"] / q["sentences_per_s"] for r, q in pairs), 2
    )


def summarise(batch: list[dict], latency: list[dict], ref: tuple[list, list], size: int) -> dict:
    """An engine's rounds -> medians (BLEU: the first round's; the decoding is deterministic)."""
    out = dict(batch[0])
    for key in ("seconds", "sentences_per_s", "load_seconds", "peak_rss_mb",
                "rss_after_import_mb", "rss_after_load_mb", "rss_after_warmup_mb"):  # fmt: skip
        out[key] = round(statistics.median(r[key] for r in batch), 2)
    out["rounds"] = [r["sentences_per_s"] for r in batch]
    out["ratio"] = median_ratio(batch, ref[0])
    out["size_mb"] = round(size / 1e6, 1)
    if latency:
        out["latency"] = {
            "sentences": latency[0]["sentences"],
            "sentences_per_s": round(statistics.median(r["sentences_per_s"] for r in latency), 1),
            "median_ms": round(statistics.median(r["median_ms"] for r in latency), 2),
            "rounds": [r["sentences_per_s"] for r in latency],
            "ratio": median_ratio(latency, ref[1]),
        }
    return out


def sweep_engine(rounds: dict[str, list[dict]], default: list[dict]) -> dict:
    """One engine's --sweep rounds (per setting, and at its default) -> medians, the best
    setting, the setting the default chose, its ratio to the best and the warning, if any."""
    rates = {s: [r["sentences_per_s"] for r in rs] for s, rs in rounds.items()}
    chosen = [label(r["workers"], r["threads_per_worker"]) for r in default]
    out: dict = {
        "settings": {
            s: {
                "workers": rs[0]["workers"],
                "threads_per_worker": rs[0]["threads_per_worker"],
                "sentences_per_s": round(statistics.median(rates[s]), 1),
                "rounds": rates[s],
                "bleu": rs[0]["bleu"],
            }
            for s, rs in rounds.items()
        },
        "default": {
            "setting": max(set(chosen), key=chosen.count),  # the one it chose most often
            "chosen": chosen,
            "sentences_per_s": round(statistics.median(r["sentences_per_s"] for r in default), 1),
            "rounds": [r["sentences_per_s"] for r in default],
            "bleu": default[0]["bleu"],
        },
    }
    best, ratio = default_vs_best(rates, out["default"]["rounds"])
    out["best"], out["default_vs_best"] = best, ratio
    return out


def engine_label(report: dict, name: str) -> str:
    """An engine's name in a table, with the type its int8 weights ran in where not int8."""
    computed = report.get("int8_computed_as", "int8")
    return f"{name} (in {computed})" if name == "ctranslate2 int8" and computed != "int8" else name


def sweep_table(report: dict) -> str:
    """The --sweep section: engine × setting, the default (and what it chose), default ÷ best."""
    settings = [label(w, t) for w, t in report["grid"]]
    lines = [
        f"Measured {report['date']} on {report['hardware']} ({report['cores']} cores), commit "
        f"{report['commit']}, `{report['command']}`: {report['model']}, {report['split']} "
        f"({report['sentences']} sentences), beam {report['beam']}, length penalty "
        f"{report['length_penalty']}, {report['max_tokens']} tokens per batch. Sentences/s with "
        f"W workers × T threads each (`--workers W`, W × T threads), and at each engine's default "
        f"(no `--workers`, threads left to aiayn, no OMP_NUM_THREADS: `aiayn translate` with no "
        f"flags; in parentheses the setting it chose); OMP_WAIT_POLICY {report['omp_wait_policy']}; "
        f"medians of {report['repeats']} rounds with engines and settings alternating, each run "
        f"in a process of its own; default ÷ best: the median per-round ratio of the default to "
        f"the fastest setting (bold). Load average before/after {report['load_before']} / "
        f"{report['load_after']}{'; ' + report['note'] if report['note'] else ''}.",
        "",
        "| engine | " + " | ".join(settings) + " | default | default ÷ best |",
        "|---|" + "---:|" * (len(settings) + 2),
    ]
    for name, r in report["engines"].items():
        name = engine_label(report, name)
        cells = []
        for s in settings:
            rate = r["settings"][s]["sentences_per_s"]
            cells.append(f"**{rate}**" if s == r["best"] else str(rate))
        d = r["default"]
        lines.append(
            f"| {name} | {' | '.join(cells)} | {d['sentences_per_s']} ({d['setting']}) | "
            f"{r['default_vs_best']:.2f} |"
        )
    warnings = [r["warning"] for r in report["engines"].values() if r.get("warning")]
    lines += [
        "",
        "\n\n".join(warnings)
        if warnings
        else "No default ran more than 10% slower than the best setting measured.",
    ]
    return "\n".join(lines)


def run_sweep(args: argparse.Namespace, model: Path, env: dict, report: dict) -> None:
    """--sweep: every engine at every setting of the grid and at its default, alternating within
    each round; the report's engines and its warnings."""
    settings = {label(w, t): (w, w * t) for w, t in args.grid}
    rounds: dict[str, dict[str, list[dict]]] = {n: {s: [] for s in settings} for n in args.engines}
    default: dict[str, list[dict]] = {name: [] for name in args.engines}
    with tempfile.TemporaryDirectory(prefix="bench-engines-") as tmp:
        folders = export_all(model, Path(tmp), args.engines)
        for round_ in range(args.repeats):
            for name in args.engines:
                folder = folders[name][0]
                for s, setting in settings.items():
                    rounds[name][s].append(worker(args, name, folder, "batch", env, setting))
                default[name].append(worker(args, name, folder, "batch", env, (0, 0)))
                rates = {s: r[-1]["sentences_per_s"] for s, r in rounds[name].items()}
                rates["default"] = default[name][-1]["sentences_per_s"]
                print(f"round {round_ + 1}", name, rates, flush=True)
    for name in args.engines:
        r = report["engines"][name] = sweep_engine(rounds[name], default[name])
        r["warning"] = default_warning(
            name, r["default"]["setting"], r["best"], r["default_vs_best"]
        )
        report["sentences"] = default[name][0]["sentences"]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(run_one(args)))
        return
    from aiayn.decode import DecodeConfig
    from aiayn.env import cpu_name
    from aiayn.io import write_json, write_section
    from aiayn.runtime.ct2_backend import computed_as

    model = Path(args.model)
    command = " ".join(
        ["python benchmarks/bench_engines.py", *(sys.argv[1:] if argv is None else argv)]
    )
    report = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "hardware": cpu_name(),
        "commit": commit(),
        "command": command,
        "model": str(model),
        "split": args.split,
        "beam": args.beam,
        "length_penalty": args.length_penalty,
        **(
            {"grid": args.grid, "cores": cores()}
            if args.sweep
            else {"threads": args.threads, "workers": args.workers}
        ),
        "omp_wait_policy": args.omp_wait_policy or "(unset: spinning)",
        "int8_computed_as": computed_as("int8"),  # CTranslate2 int8 runs in float32 on some CPUs
        "max_tokens": args.max_tokens or DecodeConfig().batch_tokens,
        "repeats": args.repeats,
        **(
            {}
            if args.sweep
            else {"latency_sentences": args.latency, "latency_threads": args.latency_threads}
        ),
        "note": args.note,
        "load_before": [round(x, 1) for x in os.getloadavg()],
        "engines": {},
    }
    # OpenMP threads that sleep instead of spinning while they wait (--omp-wait-policy): on a
    # machine shared with other jobs, spinning threads of torch's pool made native decoding 14x
    # slower (2 threads, load 11: 28.5 s instead of 2.0 s for 60 sentences). On an idle machine it
    # changes little at 2 workers of 1 thread (the default: native 0.70x CTranslate2 float32
    # sleeping, 0.75x spinning) but at 1 worker of 2 threads it cut native to 0.54x and
    # CTranslate2 to 0.28x of their spinning speed
    # (docs/experiments/decoding_speed.md#the-openmp-wait-policy-2026-11-26).
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("OMP_WAIT_POLICY", None)
    if args.omp_wait_policy:
        env["OMP_WAIT_POLICY"] = args.omp_wait_policy
    if args.sweep:
        run_sweep(args, model, env, report)
        report["load_after"] = [round(x, 1) for x in os.getloadavg()]
        write_json(args.out, report)
        write_section(args.doc, SWEEP_BEGIN, SWEEP_END, sweep_table(report))
        print(sweep_table(report))
        return
    batch: dict[str, list[dict]] = {name: [] for name in args.engines}
    latency: dict[str, list[dict]] = {name: [] for name in args.engines}
    with tempfile.TemporaryDirectory(prefix="bench-engines-") as tmp:
        folders = export_all(model, Path(tmp), args.engines)
        if COMPILED in args.engines:  # compiled once (cached), so that no round times it
            prepared = worker(args, COMPILED, model, "prepare", env)
            report["compile_seconds"] = prepared["compile_seconds"]
        for round_ in range(args.repeats):
            for name in args.engines:  # alternating: every engine once per round
                batch[name].append(worker(args, name, folders[name][0], "batch", env))
                if args.latency:
                    latency[name].append(worker(args, name, folders[name][0], "latency", env))
                print(f"round {round_ + 1}", name, batch[name][-1], flush=True)
    ref = (batch.get(REFERENCE, []), latency.get(REFERENCE, []))
    for name in args.engines:
        report["engines"][name] = summarise(batch[name], latency[name], ref, folders[name][1])
        report["sentences"] = batch[name][0]["sentences"]
    report["load_after"] = [round(x, 1) for x in os.getloadavg()]
    write_json(args.out, report)
    write_section(args.doc, BEGIN, END, table(report))
    print(table(report))


if __name__ == "__main__":
    main()
