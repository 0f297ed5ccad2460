"""One trained model, five ways to run it: speed, BLEU, peak memory and size on disk.

Native PyTorch fp32, native bf16 autocast, ONNX Runtime fp32 (aiayn's search over the exported
graphs), CTranslate2 float32 and int8 (its own beam search) translate the same test set with the
same beam and length penalty. Each engine runs in a subprocess of its own, so that its peak RSS
is its own; the exports are written first to a temporary folder (their size is the size on disk).
Every engine ranks finished hypotheses by log P / |Y| (length penalty "average"), the setting
under which CTranslate2's beam search is aiayn's (docs/export.md), so that BLEU differences come
from the numerics alone.

    make bench-engines                      # runs/demo/avg5, test_2016_flickr, beam 5, 2 threads
    python benchmarks/bench_engines.py --model RUN/avg5 --limit 200

Writes docs/experiments/engines.json and the table between the markers in docs/decoding.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENGINES = (
    "native fp32",
    "native bf16",
    "onnxruntime fp32",
    "ctranslate2 float32",
    "ctranslate2 int8",
)
BEGIN, END = "<!-- engines:begin (benchmarks/bench_engines.py) -->", "<!-- engines:end -->"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(ROOT / "runs" / "demo" / "avg5"))
    p.add_argument("--split", default="test_2016_flickr")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--length-penalty", default="average", choices=("average", "gnmt", "none"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--workers",
        type=int,
        default=2,
        help="batches at once, each on threads/workers threads (aiayn workers, "
        "CTranslate2 inter_threads)",
    )
    p.add_argument("--limit", type=int, default=0, help="first N sentences only")
    p.add_argument("--engines", nargs="*", default=list(ENGINES))
    p.add_argument("--note", default="", help="what else ran on the machine")
    p.add_argument("--out", default=str(ROOT / "docs" / "experiments" / "engines.json"))
    p.add_argument("--doc", default=str(ROOT / "docs" / "decoding.md"))
    p.add_argument("--worker", help=argparse.SUPPRESS)  # internal: run one engine, print JSON
    p.add_argument("--folder", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def folder_size(path: Path) -> int:
    return sum(
        f.stat().st_size
        for f in path.rglob("*")
        if f.is_file()
        and f.name != "tokenizer.json"
        and not f.name.startswith("eval_")
        and f.suffix != ".md"
    )


def run_one(args: argparse.Namespace) -> dict:
    """In the subprocess: load one engine, translate the test set, score it."""
    import torch

    from aiayn.data import load_translation
    from aiayn.decode import DecodeConfig
    from aiayn.eval import corpus_scores
    from aiayn.folder import load_model_folder
    from aiayn.folder_config import read_folder_config
    from aiayn.train.allocator import keep_freed_memory

    torch.set_num_threads(args.threads)
    keep_freed_memory()
    src, ref = load_translation(read_folder_config(args.model).config.data, args.split)
    if args.limit:
        src, ref = src[: args.limit], ref[: args.limit]
    cfg = DecodeConfig(
        beam=args.beam,
        length_penalty=args.length_penalty,
        workers=args.workers,
        bf16=args.worker == "native bf16",
    )
    start = time.perf_counter()
    folder = load_model_folder([args.folder], "cpu", workers=args.workers)  # any engine
    loaded = time.perf_counter() - start
    folder.translate_hypotheses(src[:16], cfg)  # warm-up (allocations, kernels)
    start = time.perf_counter()
    hyps = folder.translate_hypotheses(src, cfg)
    seconds = time.perf_counter() - start
    scores = corpus_scores([h[0][0] if h else "" for h in hyps], ref)
    return {
        "sentences": len(src),
        "seconds": round(seconds, 2),
        "sentences_per_s": round(len(src) / seconds, 1),
        "load_seconds": round(loaded, 2),
        "bleu": round(scores["bleu"], 2),
        "bleu_lc": round(scores["bleu_lc"], 2),
        "chrf": round(scores["chrf"], 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def export_all(model: Path, tmp: Path, engines: list[str]) -> dict[str, tuple[Path, int]]:
    """Engine -> (folder, model bytes on disk), exporting what the engines need."""
    from aiayn.export import export_model

    folders = {"native fp32": model, "native bf16": model}
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
    native = report["engines"].get("native fp32")
    lines = [
        f"Measured {report['date']} on {report['hardware']}, commit {report['commit']}, "
        f"`{report['command']}`: {report['model']}, {report['split']} "
        f"({report['sentences']} sentences), beam {report['beam']}, length penalty "
        f"{report['length_penalty']}, {report['threads']} threads, {report['workers']} workers. "
        f"Load average before/after {report['load_before']} / {report['load_after']}"
        f"{'; ' + report['note'] if report['note'] else ''}.",
        "",
        "| engine | sentences/s | × native fp32 | BLEU | BLEU-lc | chrF | peak RSS (MB) | model on disk (MB) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in report["engines"].items():
        ratio = r["sentences_per_s"] / native["sentences_per_s"] if native else float("nan")
        lines.append(
            f"| {name} | {r['sentences_per_s']} | {ratio:.2f} | {r['bleu']} | {r['bleu_lc']} | "
            f"{r['chrf']} | {r['peak_rss_mb']} | {r['size_mb']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(run_one(args)))
        return
    from aiayn.env import cpu_name
    from aiayn.io import write_json, write_section

    model = Path(args.model)
    command = " ".join(["python benchmarks/bench_engines.py", *(sys.argv[1:] if argv is None else argv)])
    report = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "hardware": cpu_name(),
        "commit": commit(),
        "command": command,
        "model": str(model),
        "split": args.split,
        "beam": args.beam,
        "length_penalty": args.length_penalty,
        "threads": args.threads,
        "workers": args.workers,
        "note": args.note,
        "load_before": [round(x, 1) for x in os.getloadavg()],
        "engines": {},
    }
    # OpenMP threads that sleep instead of spinning while they wait: on a machine shared with other
    # jobs, spinning threads of torch's pool made native decoding 14x slower (2 threads, load 11:
    # 28.5 s instead of 2.0 s for 60 sentences); it changes nothing on an idle machine.
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(args.threads),
        "OMP_WAIT_POLICY": "PASSIVE",
        "PYTHONPATH": str(ROOT),
    }
    with tempfile.TemporaryDirectory(prefix="bench-engines-") as tmp:
        folders = export_all(model, Path(tmp), args.engines)
        for name in args.engines:
            folder, size = folders[name]
            cmd = [
                sys.executable,
                __file__,
                "--worker",
                name,
                "--folder",
                str(folder),
                "--model",
                str(model),
                "--split",
                args.split,
                "--beam",
                str(args.beam),
                "--length-penalty",
                args.length_penalty,
                "--threads",
                str(args.threads),
                "--workers",
                str(args.workers),
                "--limit",
                str(args.limit),
            ]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if out.returncode:
                sys.exit(f"{name} failed:\n{out.stderr[-3000:]}")
            result = json.loads(out.stdout.strip().splitlines()[-1])
            result["size_mb"] = round(size / 1e6, 1)
            report["engines"][name] = result
            report["sentences"] = result["sentences"]
            print(name, result, flush=True)
    report["load_after"] = [round(x, 1) for x in os.getloadavg()]
    write_json(args.out, report)
    write_section(args.doc, BEGIN, END, table(report))
    print(table(report))


if __name__ == "__main__":
    main()
