"""benchmarks/gpu_check.py, the one command of a GPU slot, checked on the CPU so that it cannot rot:
it refuses clearly without a GPU, its dry run goes through every stage with the GPU run's
arguments shrunk to tiny sizes (two presets stay two), a failing stage is recorded and the next
one still runs, a stage over its time is killed."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import mirror_or_skip

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
_spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
gpu_check = sys.modules.setdefault("gpu_check", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(gpu_check)


def run_script(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, **(env or {})}, timeout=600)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_a_gpu_it_says_so_in_one_line_and_fails(tmp_path):
    r = run_script("--out", str(tmp_path / "out"))
    assert r.returncode == 2
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA GPU" in lines[0] and "--dry-run" in lines[0], r.stderr


def test_a_stage_over_its_time_is_killed_and_reported(tmp_path):
    ctx = gpu_check.Context(tmp_path, tmp_path, True, None, io.StringIO(), 0.0)
    ctx.log = open(tmp_path / "log", "w")  # noqa: SIM115 (closed below)
    start = time.monotonic()
    with pytest.raises(gpu_check.StageFailed, match="timed out after 1 s"):
        gpu_check.run_command(ctx, "sleep", [sys.executable, "-c", "import time; time.sleep(60)"], 1)
    ctx.log.close()
    assert time.monotonic() - start < 30


def test_a_failed_stage_is_recorded_and_the_next_runs(tmp_path, monkeypatch):
    def fails(ctx, seconds):
        raise gpu_check.StageFailed("exit status 3 (see gpu_check.log)")

    def crashes(ctx, seconds):
        raise KeyError("rows")

    monkeypatch.setattr(gpu_check, "STAGES", [
        gpu_check.Stage("bench_train", 10, 10, fails),
        gpu_check.Stage("decode", 10, 10, crashes),
        gpu_check.Stage("tests", 10, 10, lambda ctx, s: {"passed": 2, "failed": 0, "skipped": 1}),
        gpu_check.Stage("train", 10, 10, lambda ctx, s: {}, needs_data=True)])
    ctx = gpu_check.Context(tmp_path, tmp_path, True, None, io.StringIO(), time.monotonic() + 60)
    stages = gpu_check.run_stages(ctx, ["bench_train", "decode", "tests", "train"])
    assert [s["status"] for s in stages.values()] == ["failed", "failed", "passed", "failed"]
    assert stages["bench_train"]["error"] == "exit status 3 (see gpu_check.log)"
    assert stages["decode"]["error"] == "KeyError: 'rows'"  # a bug of the script: recorded too
    assert "no data" in stages["train"]["error"]
    table = gpu_check.table({"meta": {"dry_run": True, "device_name": "CPU", "torch": "t",
                                      "commit": "c", "date": "d"}, "stages": stages})
    assert "| bench_train | failed |" in table and "| tests | passed |" in table
    assert "2 passed, 0 failed, 1 skipped" in table


def test_the_results_keys_come_from_the_stages_that_passed():
    stages = {
        "wmt": {"status": "passed", "summary": {"tokens_per_s": 1_000_000,
                                                "projected_hours_to_recipe_steps": 1.1,
                                                "first_epoch_ratio": 1.3}},
        "bench_train": {"status": "failed", "summary": {"rows": [
            {"system": "aiayn", "precision": "bf16", "preset": "small", "speedup": 1.6}]}},
    }
    assert gpu_check.results(stages) == {
        "gpu.wmt_base.tokens_per_s": 1_000_000, "gpu.wmt_base.hours_to_100k": 1.1,
        "gpu.wmt_base.first_epoch_ratio": 1.3, "gpu.train.small_bf16_speedup": None,
        "gpu.train.base_bf16_speedup": None}
    stages["bench_train"]["status"] = "passed"
    assert gpu_check.results(stages)["gpu.train.small_bf16_speedup"] == 1.6


def test_every_option_of_the_gpu_run_has_a_tiny_stand_in():
    """The dry run's commands are the GPU run's, each option's values mapped to tiny ones: the
    same options in the same order, as many values each (two presets stay two presets)."""
    def options(args):
        out, name = [], None
        for a in args:
            if a.startswith("--"):
                out.append([a])
                name = a
            elif name:
                out[-1].append(a)
        return [(o[0], len(o)) for o in out]

    for command, real in gpu_check.REAL_ARGS.items():
        dry = gpu_check.shrink(real)
        assert options(dry) == options(real), command
        assert dry[0] == real[0]  # a positional argument (the config file) is kept
        assert "cuda" not in " ".join(dry), command
    bench = gpu_check.shrink(gpu_check.REAL_ARGS["bench_train"])
    assert bench[bench.index("--presets") + 1:][:2] == ["dry", "dry-base"]
    with pytest.raises(ValueError, match="--new-size has no dry-run value"):
        gpu_check.shrink(["--new-size", "8"])
    with pytest.raises(ValueError, match="--max-tokens 32768 has no dry-run value"):
        gpu_check.shrink(["--max-tokens", "32768"])
    with pytest.raises(ValueError, match="train.new=1 has no dry-run value"):
        gpu_check.shrink(["--set", "train.new=1"])


def test_a_gpu_option_without_a_stand_in_stops_the_dry_run_before_it_starts(tmp_path, monkeypatch,
                                                                           capsys):
    monkeypatch.setitem(gpu_check.REAL_ARGS, "decode", ["--device", "cuda", "--beams", "1", "5"])
    assert gpu_check.main(["--dry-run", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "gpu_check: option --beams has no dry-run value (DRY_VALUES)"
    assert not (tmp_path / "out").exists()


def test_the_gpu_settings_make_valid_configs():
    """What only a GPU run uses: the train stage's overrides of the headline config (the time
    budget and the time clock of the cosine) and the decode stage's model shapes."""
    from aiayn.run_config import load_run_config

    config, *sets = gpu_check.REAL_ARGS["train"]
    sets += gpu_check.train_sets({"train.max_time": gpu_check.TRAIN_SECONDS})
    cfg, _ = load_run_config(ROOT / config, sets[1::2])
    assert cfg.train.device == "cuda" and cfg.train.max_time == 180
    assert cfg.train.schedule_clock == "time" and cfg.data.max_tokens == 8192
    assert cfg.train.precision == "auto"  # bf16 autocast on a GPU that supports it
    sets = gpu_check.REAL_ARGS["wmt"]
    sets = [v for k, v in zip(sets, sets[1:]) if k == "--set"]
    cfg, _ = load_run_config(ROOT / "configs" / "wmt14_en_de_base.toml", sets)
    assert cfg.data.max_tokens == 12500 and cfg.train.warm_shapes == 60
    assert gpu_check.REAL_ARGS["profile"][gpu_check.REAL_ARGS["profile"].index("--max-tokens") + 1] == "12500"
    shapes = gpu_check.DECODE_SHAPES
    assert shapes["tiny"] == ("tiny", {"norm_first": True}, 8000)
    assert shapes["base"] == ("base", {}, 32000)


def test_the_whole_dry_run_passes(tmp_path):
    """Every stage on the CPU with tiny shapes, on real Multi30k data: bench_train with two
    presets in one run, decoding of two shapes."""
    mirror = mirror_or_skip()
    out = tmp_path / "out"
    r = run_script("--dry-run", "--out", str(out), env={"AIAYN_DATA_MIRROR": mirror})
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads((out / "gpu_check.json").read_text())
    assert list(report["stages"]) == [s.name for s in gpu_check.STAGES]
    assert [s["status"] for s in report["stages"].values()] == ["passed"] * 6, report
    # profile_step.py's smoke run (tests/test_scripts_smoke.py points here): both targets on the
    # CPU, the per-update figures and the top ops as JSON and a table (CUDA-only figures n/a)
    profile = report["stages"]["profile"]["summary"]
    assert list(profile["targets"]) == ["wmt", "bench"]  # the WMT base recipe, bench_train's BASE
    for r in profile["targets"].values():
        assert r["updates"] == 2 and r["tokens_per_s"] > 0 and r["s_per_update"] > 0 and r["top"]
        assert 0 < r["cpu_op_share"] <= 1 and r["launches_per_update"] > 0
        assert r["syncs_per_update"].startswith("n/a")
    assert profile["about"]["bench"]["preset"] == "dry-base"
    assert profile["about"]["wmt"]["micro_batches_per_update"] == 2 and "| wmt |" in profile["table"]
    # wmt_projection.py --minutes (its smoke run covers the table and --steps): a few epochs,
    # batches in at most 4 bucket widths up to the token budget, each shape warmed first
    wmt = report["stages"]["wmt"]["summary"]
    assert wmt["updates"] > 0 and wmt["projected_hours_to_recipe_steps"] > 0
    widths = wmt["bucket_widths"]
    assert 1 <= len(widths) <= 4 and widths[-1] == 256 and widths == sorted(widths)
    warm = wmt["warm_shapes"]
    assert warm["shapes"] == warm["listed"] > 0 and not warm["stopped"] and warm["seconds"] >= 0
    assert wmt["first_epoch_ratio"] is None or wmt["first_epoch_ratio"] > 0
    assert (out / "wmt_metrics.jsonl").read_text().count("tokens_per_s") >= 2
    results = report["results"]  # issue 57's keys, all filled from the stages
    assert set(results) == {"gpu.wmt_base.tokens_per_s", "gpu.wmt_base.hours_to_100k",
                            "gpu.wmt_base.first_epoch_ratio", "gpu.train.small_bf16_speedup",
                            "gpu.train.base_bf16_speedup"}
    assert results["gpu.wmt_base.tokens_per_s"] == wmt["tokens_per_s"]
    assert all(results[f"gpu.train.{p}_bf16_speedup"] > 0 for p in ("small", "base"))
    assert "Issue 57's docs/results.json keys" in (out / "gpu_check.md").read_text()
    tests = report["stages"]["tests"]["summary"]
    assert tests["passed"] >= 8 and tests["failed"] == 0
    # bench_train.py's smoke run (tests/test_scripts_smoke.py points here): two presets, aiayn
    # beside nn.Transformer and Marian, the same loss as nn.Transformer with aiayn's weights, the
    # warm pass (every timed batch stepped through once before, its seconds kept apart)
    rows = report["stages"]["bench_train"]["summary"]["rows"]
    systems = ("aiayn", "torch") + (("marian",) if gpu_check.have_transformers() else ())
    assert {(r["preset"], r["system"]) for r in rows} == {
        (p, s) for p in ("dry", "dry-base") for s in systems}
    assert all(r["tokens_per_s"] > 0 and r["first_sight_step_s"] > 0 for r in rows)
    run = next(iter(json.loads((out / "bench_train.json").read_text())["runs"].values()))
    assert all(run["same_math"][p]["abs_diff"] < 1e-4 for p in ("dry", "dry-base"))
    assert run["meta"]["warm_pass"] is True
    assert all(r["first_sight_ratio"] > 0 for g in run["groups"] for r in g["systems"].values())
    text = (out / "bench_train.md").read_text()
    assert "| dry-base | bf16 | aiayn |" in text and "a warm pass" in text
    rows = report["stages"]["decode"]["summary"]["rows"]
    assert {(r["shape"], r["beam"], r["bf16"]) for r in rows} == {
        (s, b, f) for s in ("dry", "dry-base") for b in (1, 5) for f in (False, True)}
    train = report["stages"]["train"]["summary"]
    assert train["updates"] == 3 and train["eval_sentences"] == 20
    for name in ("gpu_check.json", "gpu_check.md", "gpu_check.log", "tests.xml",
                 "bench_train.json", "bench_train.md", "train_metrics.jsonl", "wmt_metrics.jsonl"):
        assert (out / name).is_file(), name
    assert len(list(out.iterdir())) <= 8  # a device call returns at most 8 files
