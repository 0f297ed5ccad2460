"""benchmarks/gpu_check.py, the one command of a GPU slot, checked on the CPU so that it cannot rot:
it refuses clearly without a GPU, its dry run goes through the same stages with tiny shapes, a
failing stage is recorded and the next one still runs, a stage over its time is killed."""

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
    ctx = gpu_check.Context(tmp_path, tmp_path, True, "cpu", None, io.StringIO(), 0.0)
    ctx.log = open(tmp_path / "log", "w")  # noqa: SIM115 (closed below)
    start = time.monotonic()
    with pytest.raises(gpu_check.StageFailed, match="timed out after 1 s"):
        gpu_check.run_command(ctx, "sleep", [sys.executable, "-c", "import time; time.sleep(60)"], 1)
    ctx.log.close()
    assert time.monotonic() - start < 30


def test_dry_run_records_a_failed_stage_and_runs_the_next(tmp_path):
    """bench_train fails (the data mirror named does not exist); decode still runs and passes."""
    out = tmp_path / "out"
    r = run_script("--dry-run", "--stages", "bench_train", "decode", "--out", str(out),
                   env={"AIAYN_DATA_MIRROR": str(tmp_path / "no_such_mirror")})
    assert r.returncode == 1, r.stdout + r.stderr
    report = json.loads((out / "gpu_check.json").read_text())
    stages = report["stages"]
    assert stages["bench_train"]["status"] == "failed"
    assert "exit status" in stages["bench_train"]["error"]
    assert stages["decode"]["status"] == "passed"
    rows = stages["decode"]["summary"]["rows"]
    assert {(r["beam"], r["bf16"]) for r in rows} == {(1, False), (1, True), (5, False), (5, True)}
    assert all(r["sentences_per_s"] > 0 for r in rows)
    assert report["meta"]["dry_run"] is True
    table = (out / "gpu_check.md").read_text()
    assert "| bench_train | failed |" in table and "| decode | passed |" in table
    assert "no_such_mirror" in (out / "gpu_check.log").read_text()  # the failing stage's output


def test_the_gpu_settings_make_valid_configs():
    """What only a GPU run uses: the train stage's overrides of the headline config (the time
    budget and the time clock of the cosine) and the decode stage's model shapes."""
    from aiayn.train.config import load_run_config

    settings = {**gpu_check.GPU_TRAIN, "train.max_time": gpu_check.TRAIN_SECONDS}
    sets = gpu_check.train_sets(settings)[1::2]
    cfg, _ = load_run_config(ROOT / "configs" / "multi30k_en_de.toml", sets)
    assert cfg.train.device == "cuda" and cfg.train.max_time == 180
    assert cfg.train.schedule_clock == "time" and cfg.data.max_tokens == 8192
    assert cfg.train.precision == "auto"  # bf16 autocast on a GPU that supports it
    shapes = gpu_check.decode_shapes(dry=False)
    assert shapes["tiny"].d_model == 128 and shapes["tiny"].norm_first
    assert shapes["base"].d_model == 512 and shapes["base"].tgt_vocab_size == 32000


@pytest.mark.slow
def test_the_whole_dry_run_passes(tmp_path):
    """Every stage on the CPU with tiny shapes, on real Multi30k data (~1 minute on an idle
    2-core machine, about 3 when five other jobs share it)."""
    mirror = mirror_or_skip()
    out = tmp_path / "out"
    r = run_script("--dry-run", "--out", str(out), env={"AIAYN_DATA_MIRROR": mirror})
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads((out / "gpu_check.json").read_text())
    assert [s["status"] for s in report["stages"].values()] == ["passed"] * 4, report
    tests = report["stages"]["tests"]["summary"]
    assert tests["passed"] >= 8 and tests["failed"] == 0
    train = report["stages"]["train"]["summary"]
    assert train["updates"] == 3 and train["eval_sentences"] == 20
    for name in ("gpu_check.json", "gpu_check.md", "gpu_check.log", "tests.xml",
                 "bench_train.json", "bench_train.md", "train_metrics.jsonl"):
        assert (out / name).is_file(), name
    assert len(list(out.iterdir())) <= 8  # a device call returns at most 8 files
