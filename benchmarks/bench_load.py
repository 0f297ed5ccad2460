"""Speed under load: `aiayn train` (tokens/s) and `aiayn evaluate` (sentences/s) with 0, 1 and 2
other busy processes on the machine, each with the default thread setting (aiayn/threads.py),
AIAYN_THREADS=1 and AIAYN_THREADS=<cores>. Not a test: a measurement for docs/reliability.md.

    python benchmarks/bench_load.py [--data ../shared/data/multi30k] [--steps 60] [--limit 100]
    python benchmarks/bench_load.py --smoke --steps 2 --limit 3 --busy 0,1 --settings default,1 \
        --json /tmp/load.json        # the code paths in seconds: no figures worth reading

The demo recipe's model (Transformer-tiny, pre-LN, one BPE vocabulary) on the first 4,000
Multi30k En-De training pairs (read from --data, as your own files): a base run of 20 updates is
trained once; each measurement resumes a copy of it for --steps updates (tokens/s from its
metrics.jsonl, the first 10 updates not counted) and evaluates the base model on the first
--limit val sentences (beam 4; sentences/s as evaluate reports it). Busy processes are
`python -c "while True: pass"`. Prints a markdown table and writes JSON.

``--smoke`` shrinks the work, not the code paths: 200 training pairs, a vocabulary of 300, a base
run of 4 updates of a model of d_model 32 and one layer per stack, every resumed update counted,
no settling time, and busy processes that sleep
(started and stopped as the real ones, without taking a core from a shared test machine).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from aiayn.env import cpu_name  # noqa: E402
from aiayn.threads import cores  # noqa: E402


def aiayn(args: list[str], threads: str | None, timeout: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("AIAYN_THREADS", "OMP_NUM_THREADS")}
    if threads is not None:
        env["AIAYN_THREADS"] = threads
    return subprocess.run([sys.executable, "-m", "aiayn", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


# The work of a measurement, and of --smoke: training / val pairs, BPE vocabulary, updates of the
# base run and its logging interval, resumed updates not counted, seconds for the busy processes
# to settle.
SIZES = {"full": {"train": 4000, "val": 500, "vocab": 8000, "base_steps": 20, "log_every": 5,
                  "skip": 10, "settle_s": 2.0, "model": ""},
         "smoke": {"train": 200, "val": 20, "vocab": 300, "base_steps": 4, "log_every": 1,
                   "skip": 0, "settle_s": 0.0,
                   "model": "d_model = 32\nn_heads = 2\nd_ff = 64\nn_encoder_layers = 1\n"
                            "n_decoder_layers = 1\n"}}
BUSY = {"full": "while True: pass", "smoke": "import time; time.sleep(3600)"}


def prepare(data: Path, work: Path, sizes: dict) -> tuple[Path, Path, Path]:
    """Own-files data, a config and a base run; returns (run, val.en, val.de)."""
    import gzip

    files = {}
    for split, n in (("train", sizes["train"]), ("val", sizes["val"])):
        for lang in ("en", "de"):
            with gzip.open(data / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
                lines = [next(f) for _ in range(n)]
            files[f"{split}.{lang}"] = work / f"{split}.{lang}"
            files[f"{split}.{lang}"].write_text("".join(lines), encoding="utf-8")
    cfg = work / "bench.toml"
    cfg.write_text(
        f'[model]\npreset = "tiny"\nnorm_first = true\ndropout = 0.1\n{sizes["model"]}\n'
        f'[data]\ndataset = ""\ntrain_src = "{files["train.en"]}"\n'
        f'train_tgt = "{files["train.de"]}"\nvalid_src = "{files["val.en"]}"\n'
        f'valid_tgt = "{files["val.de"]}"\ntokenizer = "bpe"\nvocab_size = {sizes["vocab"]}\n'
        "max_tokens = 4096\nmax_len = 128\n\n"
        '[train]\nlr_schedule = "inverse_sqrt"\nlr = 1e-3\n'
        f"warmup_steps = {sizes['base_steps'] // 2}\nmax_steps = {sizes['base_steps']}\n"
        f"valid_every = 0\nsave_every = {sizes['base_steps']}\nlog_every = {sizes['log_every']}\n",
        encoding="utf-8",
    )
    run = work / "base"
    proc = aiayn(["train", str(cfg), "--out", str(run)], None, 1800)
    if proc.returncode != 0:
        raise SystemExit(f"base run failed: {proc.stderr[-2000:]}")
    return run, files["val.en"], files["val.de"]


def train_rate(run: Path, steps: int, threads: str | None, work: Path, skip: int) -> float:
    """tokens/s of `steps` updates resumed from a copy of `run` (the first `skip` not counted)."""
    copy = work / "run"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(run, copy)
    start = json.loads((copy / "metrics.jsonl").read_text().splitlines()[-1])["step"]
    sets = [f"train.max_steps={start + steps}", f"train.save_every={start + steps}"]
    proc = aiayn(["train", "--resume", "--out", str(copy)]
                 + [x for s in sets for x in ("--set", s)], threads, 1800)
    if proc.returncode != 0:
        raise SystemExit(f"train failed: {proc.stderr[-2000:]}")
    records = [json.loads(x) for x in (copy / "metrics.jsonl").read_text().splitlines()]
    after = [r for r in records if r["step"] > start + skip and "tokens_per_s" in r]
    return statistics.fmean(r["tokens_per_s"] for r in after)


def evaluate_rate(model: Path, val: tuple[Path, Path], limit: int, threads: str | None,
                  work: Path) -> float:
    out = work / "eval.json"
    proc = aiayn(["evaluate", str(model), "--src", str(val[0]), "--ref", str(val[1]), "--limit",
                  str(limit), "-o", str(out)], threads, 1800)
    if proc.returncode != 0:
        raise SystemExit(f"evaluate failed: {proc.stderr[-2000:]}")
    return json.loads(out.read_text())["sentences_per_s"]


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def thread_settings(names: str, n: int) -> dict[str, str | None]:
    """--settings "default,1,N" -> {name: AIAYN_THREADS or None}; N is this machine's cores."""
    out: dict[str, str | None] = {}
    for name in names.split(","):
        if name == "default":
            out["default"] = None
        else:
            threads = str(n) if name == "N" else name
            out[f"{threads} thread{'s' if threads != '1' else ''}"] = threads
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared/data/multi30k",
                    help="a folder with Multi30k's train/val .en.gz/.de.gz")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--busy", default="0,1,2", help="numbers of busy processes to try")
    ap.add_argument("--settings", default="default,1,N",
                    help="thread settings to try: default (aiayn/threads.py), or AIAYN_THREADS "
                    "values; N = this machine's cores")
    ap.add_argument("--smoke", action="store_true", help="tiny work, every code path (see above)")
    ap.add_argument("--json", type=Path, default=Path("bench_load.json"))
    ap.add_argument("--doc", type=Path, help="also write the table into this markdown file "
                    "(between its bench-load markers), e.g. docs/reliability.md")
    ap.add_argument("--note", default="", help="what else ran on the machine (for the doc)")
    args = ap.parse_args(argv)
    n = cores()
    settings = thread_settings(args.settings, n)
    mode = "smoke" if args.smoke else "full"
    sizes = SIZES[mode]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        run, *val = prepare(args.data, work, sizes)
        for busy in map(int, args.busy.split(",")):
            hogs = [subprocess.Popen([sys.executable, "-c", BUSY[mode]])
                    for _ in range(busy)]
            try:
                time.sleep(sizes["settle_s"])
                for name, threads in settings.items():
                    row = {"busy": busy, "setting": name, "loadavg_before": loadavg()}
                    row["train_tok_s"] = train_rate(run, args.steps, threads, work, sizes["skip"])
                    row["eval_sent_s"] = evaluate_rate(run, tuple(val), args.limit, threads, work)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            finally:
                for hog in hogs:
                    hog.kill()
                    hog.wait()
    meta = {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "cpu": cpu_name(),
            "cores": n, "steps": args.steps, "limit": args.limit, "smoke": args.smoke,
            "command": " ".join(["benchmarks/bench_load.py", *(sys.argv[1:] if argv is None else argv)])}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    print(table(rows))
    if args.doc:
        from aiayn.io import write_section

        head = (f"Measured {meta['date']} on a {meta['cpu']}; `{meta['command']}` "
                f"({args.steps} updates of the demo model resumed, the first {sizes['skip']} not "
                "counted; "
                f"evaluate: {args.limit} val sentences, beam 4). {args.note}")
        write_section(args.doc, "<!-- bench-load:begin -->", "<!-- bench-load:end -->",
                      head + "\n\n" + table(rows))


def table(rows: list[dict]) -> str:
    lines = ["| other busy processes | setting | train tokens/s | evaluate sentences/s |",
             "|---|---|---|---|"]
    for busy in sorted({r["busy"] for r in rows}):
        group = [r for r in rows if r["busy"] == busy]
        best_t = max(r["train_tok_s"] for r in group)
        best_e = max(r["eval_sent_s"] for r in group)
        for r in group:
            lines.append(f"| {busy} | {r['setting']} | {r['train_tok_s']:,.0f} "
                         f"({r['train_tok_s'] / best_t:.0%} of best) | {r['eval_sent_s']:.1f} "
                         f"({r['eval_sent_s'] / best_e:.0%}) |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
