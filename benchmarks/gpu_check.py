"""One command for a short GPU slot: prove and measure every CUDA path of aiayn (issue 37).

Six stages, each in its own process with its own time budget; a stage that fails or runs out of
time is recorded and the next one still runs:

1. ``tests``        tests/test_cuda.py: a training step, greedy and beam decoding, cached = uncached
                    decoding, the fused and explicit attention paths and the trainer's bf16 autocast
                    on ``cuda``, each against the CPU result of the same weights, and the
                    host-device sync counts under ``torch.cuda.set_sync_debug_mode``;
2. ``profile``      benchmarks/profile_step.py: torch.profiler over steady updates of the WMT base
                    recipe (synthetic store) and of bench_train's BASE: the share of each update the
                    GPU is busy, host time, kernel launches, syncs, the top kernels;
3. ``wmt``          benchmarks/wmt_projection.py: a minute of the WMT base recipe with 16 fitted
                    bucket widths and each batch shape warmed first (train.warm_shapes): the steady
                    tokens/s, the hours to 100k updates and the first epoch ÷ steady seconds per update;
4. ``bench_train``  benchmarks/bench_train.py on ``cuda``: SMALL and BASE in bf16, aiayn beside
                    ``nn.Transformer`` and Hugging Face Marian, every timed batch seen once before (a
                    warm pass; its first-sight seconds beside), tokens/s, MFU against the bf16 matmul
                    peak measured in the same run, peak GPU memory;
5. ``decode``       decoding speed on ``cuda`` (random weights, forced output length): greedy and
                    beam 5, fp32 and bf16, the headline shape and BASE, and the syncs per step;
6. ``train``        3 minutes of training of the headline model (configs/multi30k_en_de.toml with GPU
                    batch sizes) and ``aiayn evaluate`` on test2016 (beam 5, α 1.4).

It prints one summary table and writes, into one folder (``--out``, default ``$OUT`` when set, else
``gpu_check/``): gpu_check.json (everything, for the docs to quote, with the docs/results.json keys
of issue 57 under "results"), gpu_check.md (the table, and the profile's tables),
gpu_check.log (every stage's output), tests.xml, bench_train.json, bench_train.md,
train_metrics.jsonl and wmt_metrics.jsonl (eight files: what one device call returns). Bulky files (the run folder, dataset cache) go to ``--work`` (default: a
temporary folder), so that the output folder stays small.

Nothing is downloaded: the data come from ``$AIAYN_DATA_MIRROR``, else ``shared/data`` or
``.gpu_data`` inside the checkout, else ``../shared/data`` beside it (docs/gpu.md).

    python benchmarks/gpu_check.py                # on a machine with a CUDA GPU, ~9 minutes
    python benchmarks/gpu_check.py --dry-run      # the same code paths on the CPU, tiny shapes
    python benchmarks/gpu_check.py --stages decode train   # some stages only

Without CUDA (and without ``--dry-run``) it says so in one line and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # runs from a checkout without `pip install -e .`

# Where the data mirror is looked for, in order, after $AIAYN_DATA_MIRROR.
MIRROR_PLACES = (ROOT / "shared" / "data", ROOT / ".gpu_data", ROOT.parent / "shared" / "data")
TOTAL_BUDGET_S = 570  # the whole check; a device call may run 600 s


@dataclass
class Context:
    out: Path  # the small output folder
    work: Path  # bulky files
    dry: bool
    mirror: str | None
    log: Any  # the open gpu_check.log
    deadline: float  # time.monotonic() by which everything must be done

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        env["PYTHONUNBUFFERED"] = "1"
        env["AIAYN_CACHE"] = str(self.work / "cache")
        if self.mirror:
            env["AIAYN_DATA_MIRROR"] = self.mirror
        if self.dry:
            env["AIAYN_CUDA_TEST_DEVICE"] = "cpu"  # tests/test_cuda.py runs on the CPU
            env["OMP_NUM_THREADS"] = "1"  # tiny shapes: one thread is faster, more so on a busy CPU
        return env

    def args(self, command: str) -> list[str]:
        """The arguments of one of a stage's commands (REAL_ARGS): the real run's, or in the dry
        run the same options with tiny values (:func:`shrink`) and the dry run's additions."""
        if not self.dry:
            return list(REAL_ARGS[command])
        return shrink(REAL_ARGS[command]) + DRY_EXTRA.get(command, [])


@dataclass
class Stage:
    name: str
    budget_s: float  # on a GPU
    dry_budget_s: float
    run: Callable[[Context, float], dict[str, Any]]  # (context, seconds) -> summary
    needs_data: bool = False


class StageFailed(Exception):
    """A stage's command failed; the message says how (its output is in gpu_check.log)."""


# --------------------------------------------------------------------------------------------
# The stages' arguments: written once for the GPU run; the dry run shrinks them
# --------------------------------------------------------------------------------------------

# The headline recipe (configs/multi30k_en_de.toml) on a GPU: updates of ~8k tokens (Wu et al.'s;
# the config's ~2k suit a 2-core CPU) with the warm-up over the same tokens, the cosine over the
# time budget (train.max_time, set from the stage's budget), validation every 500 updates, no BLEU
# during training.
GPU_TRAIN = {"train.device": "cuda", "data.max_tokens": 8192, "train.warmup_steps": 400,
             "train.schedule_clock": "time", "train.max_steps": 1_000_000,
             "train.valid_every": 500, "train.save_every": 500, "train.metrics_every": 0,
             "train.log_every": 100}


def train_sets(settings: dict[str, Any]) -> list[str]:
    """The ``--set key=value`` arguments of ``aiayn train``."""
    return [a for k, v in settings.items() for a in ("--set", f"{k}={v}")]


# The WMT base recipe on one GPU (configs/wmt14_en_de_base.toml): micro-batches of 12,500 tokens,
# two per 25,000-token update; the synthetic pairs of wmt_projection.py, the same in both stages
# (each writes and tokenizes them anew: ~16 s on an H100 machine, 2026-11-26).
WMT_PAIRS = "60000"

# Every size of the GPU run, per command: the stage functions read them through Context.args.
REAL_ARGS: dict[str, list[str]] = {
    "profile": ["--device", "cuda", "--updates", "5", "--pairs", WMT_PAIRS, "--max-tokens", "12500",
                "--bench-preset", "base", "--bench-max-tokens", "16384"],
    # a minute: ~100 updates an epoch, so ~5 epochs, the steady rate from the second half
    "wmt": ["--measure", "base", "--device", "cuda", "--minutes", "1", "--pairs", WMT_PAIRS,
            "--buckets", "16", "--set", "data.max_tokens=12500", "--set", "train.warm_shapes=60"],
    # GPU batches: ~16k padded tokens (the paper's were ~25k source + 25k target tokens); every
    # timed batch stepped through once before (the warm pass), one warm-up step before that.
    "bench_train": ["--device", "cuda", "--presets", "small", "base", "--precisions", "bf16",
                    "--steps", "1", "12", "--max-tokens", "16384", "--peak-sizes", "4096", "8192",
                    "--warm-pass", "on"],
    "decode": ["--device", "cuda", "--shapes", "tiny", "base", "--sentences", "1000",
               "--length", "25", "--rounds", "2"],
    "train": ["configs/multi30k_en_de.toml", *train_sets(GPU_TRAIN)],
    "evaluate": ["--split", "test_2016_flickr", "--beam", "5", "--alpha", "1.4", "--device",
                 "cuda"],
}
KEEP = "keep"  # an option whose values the dry run keeps
# The dry run's value of every option of REAL_ARGS: KEEP, or each real value's tiny stand-in (an
# option with several values keeps their number: two presets stay two). An option or a value
# missing here stops the dry run (tests/test_gpu_check.py checks them all), so that nothing added
# to the GPU run goes untried on the CPU or runs there at full size.
DRY_VALUES: dict[str, Any] = {
    "--device": {"cuda": "cpu"},
    "--presets": {"small": "dry", "base": "dry-base"},  # bench_train.PRESETS
    "--shapes": {"tiny": "dry", "base": "dry-base"},  # DECODE_SHAPES
    "--precisions": KEEP,
    "--steps": {"1": "1", "12": "1"},
    "--max-tokens": {"16384": "512", "12500": "256"},
    "--warm-pass": KEEP,
    "--updates": {"5": "2"},
    "--pairs": {WMT_PAIRS: "40"},
    "--bench-preset": {"base": "dry-base"},
    "--bench-max-tokens": {"16384": "512"},
    "--measure": KEEP,
    "--minutes": {"1": "0.05"},
    "--buckets": {"16": "4"},
    "--peak-sizes": {"4096": "64", "8192": "128"},
    "--sentences": {"1000": "16"},
    "--length": {"25": "8"},
    "--rounds": {"2": "1"},
    "--set": {"train.device=cuda": "train.device=cpu", "data.max_tokens=8192": "data.max_tokens=512",
              "train.warmup_steps=400": "train.warmup_steps=1",
              "train.schedule_clock=time": KEEP, "train.max_steps=1000000": "train.max_steps=3",
              "train.valid_every=500": "train.valid_every=3",
              "train.save_every=500": "train.save_every=3", "train.metrics_every=0": KEEP,
              "train.log_every=100": "train.log_every=1",
              "data.max_tokens=12500": "data.max_tokens=256", "train.warm_shapes=60": KEEP},
    "--split": KEEP,
    "--beam": {"5": "2"},
    "--alpha": KEEP,
}
# What the dry run adds: the model's size, which the GPU run takes from the config file; one
# thread; 20 test sentences.
# The WMT recipe's model made tiny, with 2 micro-batches of 256 tokens per update.
DRY_WMT = train_sets({"model.d_model": 32, "model.n_heads": 2, "model.d_ff": 64,
                      "model.n_encoder_layers": 1, "model.n_decoder_layers": 1,
                      "data.vocab_size": 300, "train.tokens_per_update": 512})
DRY_EXTRA: dict[str, list[str]] = {
    "profile": DRY_WMT,
    "wmt": DRY_WMT,
    "bench_train": ["--threads", "1"],
    "train": train_sets({"model.d_model": 32, "model.n_heads": 2, "model.d_ff": 64,
                         "model.n_encoder_layers": 1, "model.n_decoder_layers": 1,
                         "data.vocab_size": 500}),
    "evaluate": ["--limit", "20"],
}


def shrink(args: list[str]) -> list[str]:
    """``args`` with every option's values replaced by their DRY_VALUES (positional arguments
    before the first option are kept). ValueError for an option or value with no dry stand-in."""
    out: list[str] = []
    option = None
    for arg in args:
        if arg.startswith("--"):
            if arg not in DRY_VALUES:
                raise ValueError(f"gpu_check: option {arg} has no dry-run value (DRY_VALUES)")
            option = arg
            out.append(arg)
            continue
        rule = DRY_VALUES[option] if option else KEEP
        if rule != KEEP and rule.get(arg) is None:
            raise ValueError(f"gpu_check: {option} {arg} has no dry-run value (DRY_VALUES)")
        out.append(arg if rule == KEEP or rule[arg] == KEEP else rule[arg])
    return out


def run_command(ctx: Context, name: str, cmd: list[str], seconds: float) -> None:
    """Run ``cmd`` with its output appended to the log; StageFailed on a non-zero exit or after
    ``seconds`` (the whole process group is killed then)."""
    ctx.log.write(f"\n===== {name}: {' '.join(cmd)}\n")
    ctx.log.flush()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ctx.env(), stdout=ctx.log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        code = proc.wait(timeout=max(seconds, 1.0))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise StageFailed(f"timed out after {seconds:.0f} s") from None
    if code != 0:
        raise StageFailed(f"exit status {code} (see gpu_check.log)")


# --------------------------------------------------------------------------------------------
# Stage 1: the CUDA tests
# --------------------------------------------------------------------------------------------


def stage_tests(ctx: Context, seconds: float) -> dict[str, Any]:
    xml = ctx.out / "tests.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-o", "addopts=",
           "tests/test_cuda.py", f"--junitxml={xml}"]
    failure = None
    try:
        run_command(ctx, "tests", cmd, seconds)
    except StageFailed as err:
        failure = err
    summary = junit_summary(xml) if xml.exists() else {}
    if failure is not None:
        failed = ", ".join(summary.get("failed_tests", [])[:5])
        raise StageFailed(f"{failure}{'; failed: ' + failed if failed else ''}")
    if summary.get("passed", 0) == 0:
        raise StageFailed(f"no test passed ({summary})")
    return summary


def junit_summary(path: Path) -> dict[str, Any]:
    """Counts and the names of failed / skipped tests from pytest's JUnit XML."""
    root = ET.parse(path).getroot()
    cases = root.iter("testcase")
    out: dict[str, Any] = {"passed": 0, "failed": 0, "skipped": 0, "failed_tests": [],
                           "skipped_tests": []}
    for case in cases:
        name = case.get("name", "?")
        if case.find("failure") is not None or case.find("error") is not None:
            out["failed"] += 1
            out["failed_tests"].append(name)
        elif case.find("skipped") is not None:
            out["skipped"] += 1
            out["skipped_tests"].append(f"{name}: {case.find('skipped').get('message', '')}")
        else:
            out["passed"] += 1
    return out


# --------------------------------------------------------------------------------------------
# Stage 2: where a steady update's time goes
# --------------------------------------------------------------------------------------------


def stage_profile(ctx: Context, seconds: float) -> dict[str, Any]:
    target = ctx.work / "profile"
    cmd = [sys.executable, "benchmarks/profile_step.py", *ctx.args("profile"), "--out", str(target)]
    run_command(ctx, "profile", cmd, seconds)
    report = json.loads((target / "profile.json").read_text())
    report["table"] = (target / "profile.md").read_text()  # appended to gpu_check.md
    return report


# --------------------------------------------------------------------------------------------
# Stage 3: the WMT base recipe with bucket widths, each shape warmed first
# --------------------------------------------------------------------------------------------


def stage_wmt(ctx: Context, seconds: float) -> dict[str, Any]:
    target = ctx.work / "wmt"
    cmd = [sys.executable, "benchmarks/wmt_projection.py", *ctx.args("wmt"), "--out", str(target)]
    run_command(ctx, "wmt", cmd, seconds)
    shutil.copy(target / "wmt_metrics_base.jsonl", ctx.out / "wmt_metrics.jsonl")
    return json.loads((target / "wmt_measure.json").read_text())[0]


# --------------------------------------------------------------------------------------------
# Stage 4: bench_train on the device
# --------------------------------------------------------------------------------------------


def have_transformers() -> bool:
    import importlib.util

    return importlib.util.find_spec("transformers") is not None


def stage_bench_train(ctx: Context, seconds: float) -> dict[str, Any]:
    target = ctx.work / "bench_train"
    args = ctx.args("bench_train")
    systems = ["aiayn", "torch"] + (["marian"] if have_transformers() else [])
    cmd = [sys.executable, "benchmarks/bench_train.py", *args, "--systems", *systems,
           "--out", str(target)]
    run_command(ctx, "bench_train", cmd, seconds)
    for suffix in (".json", ".md"):
        shutil.copy(target.with_suffix(suffix), ctx.out / f"bench_train{suffix}")
    report = json.loads(target.with_suffix(".json").read_text())
    run = next(iter(report["runs"].values()))
    rows = []
    for g in run["groups"]:
        for system, r in g["systems"].items():
            rows.append({"preset": g["preset"], "precision": g["precision"], "system": system,
                         "tokens_per_s": r["tokens_per_s"], "step_s": r["step_s"], "mfu": r["mfu"],
                         "peak_gpu_mib": r.get("max_gpu_mib"), "peak_rss_mib": r["max_rss_mib"],
                         "speedup": r.get("speedup"), "speedup_vs": r.get("speedup_vs"),
                         "first_sight_step_s": r.get("first_sight_step_s")})
    summary: dict[str, Any] = {"rows": rows, "matmul_peak_gflops": run["meta"]["peak_gflops"],
                               "hardware": run["meta"]["hardware"]}
    if "marian" not in systems:
        summary["note"] = "marian left out: transformers is not installed"
    return summary


# --------------------------------------------------------------------------------------------
# Stage 5: decoding speed
# --------------------------------------------------------------------------------------------


def stage_decode(ctx: Context, seconds: float) -> dict[str, Any]:
    result = ctx.work / "decode.json"
    cmd = [sys.executable, __file__, "--decode-bench", str(result), *ctx.args("decode")]
    run_command(ctx, "decode", cmd, seconds)
    return json.loads(result.read_text())


def decode_bench(out: Path, device_name: str, shapes: list[str], n_sentences: int, length: int,
                 rounds: int) -> None:
    """Sentences/s and generated tokens/s of aiayn's search on ``device``; writes ``out`` (JSON).

    Random weights and random sources (8-24 tokens); every sentence generates exactly ``length``
    tokens (the output mask leaves EOS out), so every configuration does the same number of
    decoder steps, whatever the weights.
    """
    import random

    import torch

    from aiayn.config import ModelConfig
    from aiayn.model import Transformer

    device = torch.device(device_name)
    rng = random.Random(0)
    rows = []
    for name in shapes:
        preset, overrides, vocab = DECODE_SHAPES[name]
        cfg = ModelConfig.preset(preset, src_vocab_size=vocab, tgt_vocab_size=vocab,
                                 output_vocab="targets", **overrides)
        torch.manual_seed(0)
        model = Transformer(cfg).eval()
        model.output_mask[cfg.eos_id] = False  # no EOS: every sentence runs to the length cap
        model = model.to(device)
        sources = [[rng.randrange(4, vocab) for _ in range(rng.randint(8, 24))]
                   for _ in range(n_sentences)]
        rows += [decode_row(model, sources, length, rounds, beam, bf16) | {"shape": name}
                 for beam in (1, 5) for bf16 in (False, True)]
    summary: dict[str, Any] = {"sentences": n_sentences, "generated_tokens": length,
                               "max_tokens": decode_max_tokens(device), "rows": rows}
    if device.type == "cuda":
        summary["syncs_per_step"] = cuda_syncs_per_step(model, sources[:32], length)
    out.write_text(json.dumps(summary, indent=1) + "\n")


def decode_max_tokens(device: Any) -> int:
    return 8192 if device.type == "cuda" else 1024


def decode_row(model: Any, sources: list[list[int]], length: int, rounds: int, beam: int,
               bf16: bool) -> dict[str, Any]:
    """One configuration: a warm-up, then the best of ``rounds`` timed decodings of ``sources``."""
    import statistics

    import torch

    from aiayn.decode import DecodeConfig, translate_ids

    device = next(model.parameters()).device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    dc = DecodeConfig(beam=beam, max_len_a=0.0, max_len_b=length,
                      batch_tokens=decode_max_tokens(device))
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)
    with autocast:
        translate_ids(model, sources[:8], dc)  # warm-up
    times = []
    for _ in range(rounds):
        sync()
        start = time.perf_counter()
        with autocast:
            translate_ids(model, sources, dc)
        sync()
        times.append(time.perf_counter() - start)
    best = min(times)
    print(f"decode beam {beam} {'bf16' if bf16 else 'fp32'}: {len(sources) / best:.0f} "
          "sentences/s", flush=True)
    return {"beam": beam, "bf16": bf16, "sentences_per_s": len(sources) / best,
            "tokens_per_s": len(sources) * length / best, "seconds": statistics.median(times)}


# The model shapes of the decode stage: (ModelConfig preset, overrides, vocabulary); EOS is then
# masked out of the output. "dry" and "dry-base" stand in for "tiny" and "base" in the dry run.
DECODE_SHAPES: dict[str, tuple[str, dict[str, Any], int]] = {
    "tiny": ("tiny", dict(norm_first=True), 8000),  # the headline model's shape
    "base": ("base", {}, 32000),
    "dry": ("tiny", dict(norm_first=True, d_model=32, n_heads=2, d_ff=64, n_encoder_layers=1,
                         n_decoder_layers=1), 500),
    "dry-base": ("base", dict(d_model=48, n_heads=4, d_ff=96, n_encoder_layers=2,
                              n_decoder_layers=2), 600),
}


def cuda_syncs_per_step(model: Any, sources: list[list[int]], length: int) -> dict[str, float]:
    """Host-device syncs that ``torch.cuda.set_sync_debug_mode("warn")`` reports while decoding one
    batch, divided by the decoder steps (``length``)."""
    import warnings

    import torch

    from aiayn.decode import DecodeConfig, translate_ids

    out = {}
    for beam in (1, 5):
        dc = DecodeConfig(beam=beam, max_len_a=0.0, max_len_b=length)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                translate_ids(model, sources, dc)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        syncs = sum("synchroniz" in str(w.message) for w in caught)
        out[f"beam{beam}"] = syncs / length
    return out


# --------------------------------------------------------------------------------------------
# Stage 6: 3 minutes of the headline model, then test2016
# --------------------------------------------------------------------------------------------

TRAIN_SECONDS = 180
EVAL_RESERVE_S = 50  # start-up, the last validation and evaluate after the training time (18 s
# in the 2026-11-26 slots: 198 s for the stage)


def stage_train(ctx: Context, seconds: float) -> dict[str, Any]:
    run = ctx.work / "run"
    train_s = min(TRAIN_SECONDS, int(seconds - EVAL_RESERVE_S))
    if train_s < 30:
        raise StageFailed(f"only {seconds:.0f} s left: too little for the training run")
    summary: dict[str, Any] = {"max_time_s": train_s}
    started = time.monotonic()
    run_command(ctx, "train", [sys.executable, "-m", "aiayn", "train", *ctx.args("train"),
                               *train_sets({"train.max_time": train_s}), "--out", str(run)],
                seconds)
    summary["train_wall_s"] = round(time.monotonic() - started, 1)
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line]
    shutil.copy(run / "metrics.jsonl", ctx.out / "train_metrics.jsonl")
    trained = [m for m in metrics if "tokens_per_s" in m]
    last = metrics[-1]
    summary.update({"updates": last["step"], "train_s": last.get("wall"),
                    "tokens_per_s": sorted(m["tokens_per_s"] for m in trained)[len(trained) // 2]
                    if trained else None,
                    "valid_loss": min((m["valid_loss"] for m in metrics if "valid_loss" in m),
                                      default=None)})
    scores = ctx.work / "eval_test2016.json"
    evaluate = [sys.executable, "-m", "aiayn", "evaluate", str(run / "best"),
                *ctx.args("evaluate"), "--out", str(scores)]
    left = seconds - (time.monotonic() - started)
    run_command(ctx, "evaluate", evaluate, left)
    s = json.loads(scores.read_text())
    summary.update({"test2016_bleu": s.get("bleu"), "test2016_bleu_lc": s.get("bleu_lc"),
                    "test2016_chrf": s.get("chrf"), "eval_sentences": s.get("n"),
                    "eval_sentences_per_s": s.get("sentences_per_s")})
    return summary


# Budgets on a GPU: the four 2026-11-26 stages took 20-24, 88-118, 30-36 and 196-198 s on an H100;
# profile and wmt are estimates (set-up ~20 s each, then ~40 s and the minute of training + ~20 s
# of warm-up). Expected ~540 s in all; the total (TOTAL_BUDGET_S) bounds the last stage.
STAGES = [
    Stage("tests", 45, 60, stage_tests),
    Stage("profile", 90, 90, stage_profile, needs_data=True),
    Stage("wmt", 130, 90, stage_wmt),
    Stage("bench_train", 130, 120, stage_bench_train, needs_data=True),
    Stage("decode", 40, 30, stage_decode),
    Stage("train", 230, 120, stage_train, needs_data=True),
]


# --------------------------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------------------------


def _k(x: float | None) -> str:
    if x is None:
        return "?"
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.1f}k" if x >= 1e3 else f"{x:.0f}"


def _share(x: Any) -> str:
    return f"{100 * x:.0f}%" if isinstance(x, float) else "n/a"


def figures(name: str, s: dict[str, Any]) -> str:
    """The stage's key figures in one cell of the summary table."""
    if name == "tests":
        return f"{s['passed']} passed, {s['failed']} failed, {s['skipped']} skipped"
    if name == "profile":
        return "; ".join(
            f"{t} {r['s_per_update']:.3f} s/update, GPU busy {_share(r['device_busy_share'])}, "
            f"{r['launches_per_update']} launches, {r['syncs_per_update']} syncs"
            for t, r in s["targets"].items())
    if name == "wmt":
        return (f"{_k(s.get('tokens_per_s'))} tok/s, {s.get('seconds_per_update')} s/update, "
                f"{s.get('projected_hours_to_recipe_steps')} h to 100k, first epoch "
                f"{s.get('first_epoch_ratio')}x steady, warm-up {s.get('warm_shapes')}")
    if name == "bench_train":
        return "; ".join(
            f"{r['preset']} {r['system']} {_k(r['tokens_per_s'])} tok/s MFU {100 * r['mfu']:.0f}%"
            + (f" {r['peak_gpu_mib']:.0f} MiB" if r.get("peak_gpu_mib") else "")
            + (f" first sight {r['first_sight_step_s']:.2f} s" if r.get("first_sight_step_s") else "")
            for r in s["rows"])
    if name == "decode":
        return "; ".join(f"{r['shape']} beam {r['beam']} {'bf16' if r['bf16'] else 'fp32'} "
                         f"{r['sentences_per_s']:.0f} sent/s" for r in s["rows"])
    if name == "train":
        bleu = s.get("test2016_bleu")
        return (f"{s.get('updates')} updates, {_k(s.get('tokens_per_s'))} tok/s, best valid loss "
                f"{s.get('valid_loss') or float('nan'):.3f}, test2016 BLEU "
                f"{bleu if bleu is None else f'{bleu:.2f}'} (lc {s.get('test2016_bleu_lc')}), "
                f"{s.get('eval_sentences_per_s') or 0:.0f} sent/s")
    return ""


def table(report: dict[str, Any]) -> str:
    m = report["meta"]
    lines = [f"gpu_check {'(dry run, CPU) ' if m['dry_run'] else ''}— {m['device_name']}, "
             f"torch {m['torch']}, aiayn {m['commit']}, {m['date']}", "",
             "| stage | status | seconds | figures |", "|---|---|---:|---|"]
    for name, st in report["stages"].items():
        cell = figures(name, st["summary"]) if st["status"] == "passed" else st.get("error", "")
        lines.append(f"| {name} | {st['status']} | {st['seconds']:.0f} | {cell} |")
    lines += ["", "Issue 57's docs/results.json keys (not written there: a dry run or one check):", ""]
    lines += [f"- `{k}`: {v}" for k, v in report.get("results", {}).items()]
    profile = report["stages"].get("profile", {}).get("summary", {})
    if profile.get("table"):
        lines += ["", profile["table"]]
    return "\n".join(lines) + "\n"


# The presets of bench_train's GPU run and their dry-run stand-ins.
PRESET_OF = {"small": "small", "dry": "small", "base": "base", "dry-base": "base"}


def results(stages: dict[str, Any]) -> dict[str, Any]:
    """The docs/results.json keys of issue 57 from the stages that passed (None where not)."""
    def summary(name: str) -> dict[str, Any]:
        st = stages.get(name, {})
        return st.get("summary", {}) if st.get("status") == "passed" else {}

    wmt = summary("wmt")
    out: dict[str, Any] = {
        "gpu.wmt_base.tokens_per_s": wmt.get("tokens_per_s"),
        "gpu.wmt_base.hours_to_100k": wmt.get("projected_hours_to_recipe_steps"),
        "gpu.wmt_base.first_epoch_ratio": wmt.get("first_epoch_ratio"),
        "gpu.train.small_bf16_speedup": None,
        "gpu.train.base_bf16_speedup": None,
    }
    for r in summary("bench_train").get("rows", []):
        if r["system"] == "aiayn" and r["precision"] == "bf16" and r["preset"] in PRESET_OF:
            out[f"gpu.train.{PRESET_OF[r['preset']]}_bf16_speedup"] = r.get("speedup")
    return out


def commit() -> str:
    """The commit checked, "+dirty" with uncommitted changes to aiayn/ or benchmarks/. A copy of
    the checkout without git (a lent GPU machine) reads .gpu_data/commit.txt (`make gpu-data`)."""
    def git(*a: str) -> str:
        try:
            r = subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True)
        except OSError:
            return ""
        return r.stdout.strip() if r.returncode == 0 else ""
    c = git("rev-parse", "--short", "HEAD")
    noted_file = ROOT / ".gpu_data" / "commit.txt"
    noted = noted_file.read_text().strip() if noted_file.is_file() else ""
    if not c:
        return noted or "unknown"
    c += "+dirty" if git("status", "--porcelain", "--", "aiayn", "benchmarks") else ""
    # A lent machine may rebuild a git history of its own under the copy (its HEAD is not the
    # commit that was sent): the commit `make gpu-data` noted then names the code.
    if noted and not c.startswith(noted.split("+")[0]):
        return f"{noted} (noted by make gpu-data; git here says {c})"
    return c


def meta(args: argparse.Namespace, device: str) -> dict[str, Any]:
    import torch

    cuda = device == "cuda"
    return {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": commit(), "dry_run": args.dry_run,
            "device_name": torch.cuda.get_device_name(0) if cuda else f"CPU ({platform.processor() or platform.machine()})",
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version(), "command": " ".join(sys.argv),
            "data_mirror": args.mirror}


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def find_mirror() -> str | None:
    env = os.environ.get("AIAYN_DATA_MIRROR")
    if env:
        return env
    for place in MIRROR_PLACES:
        if (place / "multi30k").is_dir():
            return str(place)
    return None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "gpu_check"),
                   help="output folder (default: $OUT when set, else gpu_check/)")
    p.add_argument("--work", help="folder for bulky files (default: a temporary folder)")
    p.add_argument("--dry-run", action="store_true",
                   help="the same code paths on the CPU with tiny shapes (under a minute idle)")
    p.add_argument("--stages", nargs="+", choices=[s.name for s in STAGES],
                   default=[s.name for s in STAGES])
    p.add_argument("--budget", type=float, default=TOTAL_BUDGET_S,
                   help=f"seconds for the whole check (default {TOTAL_BUDGET_S})")
    # The decode stage's own process: --decode-bench JSON and the sizes of REAL_ARGS["decode"].
    p.add_argument("--decode-bench", metavar="JSON", help=argparse.SUPPRESS)
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    p.add_argument("--shapes", nargs="+", choices=list(DECODE_SHAPES), default=["dry"],
                   help=argparse.SUPPRESS)
    p.add_argument("--sentences", type=int, default=16, help=argparse.SUPPRESS)
    p.add_argument("--length", type=int, default=8, help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.mirror = find_mirror()
    return args


def run_stages(ctx: Context, names: list[str]) -> dict[str, Any]:
    results = {}
    for stage in STAGES:
        if stage.name not in names:
            continue
        budget = stage.dry_budget_s if ctx.dry else stage.budget_s
        seconds = min(budget, ctx.deadline - time.monotonic())
        start = time.monotonic()
        entry: dict[str, Any] = {"budget_s": budget, "summary": {}}
        print(f"gpu_check: {stage.name} (at most {seconds:.0f} s) ...", flush=True)
        try:
            if stage.needs_data and not ctx.mirror:
                raise StageFailed("no data: set AIAYN_DATA_MIRROR or put the mirror in "
                                  + ", ".join(str(p) for p in MIRROR_PLACES))
            if seconds < 5:
                raise StageFailed("no time left in the overall budget")
            entry["summary"] = stage.run(ctx, seconds)
            entry["status"] = "passed"
        except StageFailed as err:
            entry["status"], entry["error"] = "failed", str(err)
        except Exception as err:  # a bug in this script's own parsing: record it, go on
            entry["status"], entry["error"] = "failed", f"{type(err).__name__}: {err}"
        entry["seconds"] = round(time.monotonic() - start, 1)
        results[stage.name] = entry
        print(f"gpu_check: {stage.name} {entry['status']} in {entry['seconds']:.0f} s"
              + (f": {entry['error']}" if "error" in entry else ""), flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.decode_bench:
        decode_bench(Path(args.decode_bench), args.device, args.shapes, args.sentences,
                     args.length, args.rounds)
        return 0
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print(f"gpu_check: no CUDA GPU here (torch {torch.__version__}, "
              f"torch.cuda.is_available() is False); `--dry-run` runs the same paths on the CPU",
              file=sys.stderr)
        return 2
    if args.dry_run:
        try:  # every option of the GPU run has its tiny stand-in, before anything runs
            for real in REAL_ARGS.values():
                shrink(real)
        except ValueError as err:
            print(err, file=sys.stderr)
            return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="aiayn_gpu_check_"))
    work.mkdir(parents=True, exist_ok=True)
    device = "cpu" if args.dry_run else "cuda"
    print(f"gpu_check: output in {out}, work files in {work}, data mirror: "
          f"{args.mirror or 'none found (the bench_train and train stages will fail)'}", flush=True)
    started = time.monotonic()
    with open(out / "gpu_check.log", "w", encoding="utf-8") as log:
        ctx = Context(out, work, args.dry_run, args.mirror, log,
                      started + args.budget)
        report = {"meta": meta(args, device), "stages": run_stages(ctx, args.stages)}
        report["results"] = results(report["stages"])
    report["meta"]["wall_s"] = round(time.monotonic() - started, 1)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1) + "\n")
    text = table(report)
    (out / "gpu_check.md").write_text(text)
    print("\n" + text)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(s["status"] == "passed" for s in report["stages"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
