"""`make demo`'s shell: two models trained side by side, resumed where they stopped, averaged,
then decoded as an ensemble; a failed training stops the other and make. A fake `aiayn` records
the calls, so nothing is trained."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")

FAKE_AIAYN = """#!/bin/sh
echo "$OMP_NUM_THREADS $*" >> "$CALLS"
case "$1" in
  train)
    case "$*" in *"seed=$FAIL_SEED"*) exit 3;; esac
    case "$*" in *"seed=$SLOW_SEED"*) echo $$ >> "$CALLS.slow"; exec sleep 60;; esac;;
  average) mkdir -p "$6" && touch "$6/model.safetensors";;
esac
"""


def _fake_venv(tmp_path: Path) -> Path:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    (venv / "bin" / "python").touch()
    fake = venv / "bin" / "aiayn"
    fake.write_text(FAKE_AIAYN)
    fake.chmod(0o755)
    (venv / ".installed-demo").touch()  # newer than pyproject.toml: nothing is installed
    return venv


def _make_args(tmp_path: Path, **env: str) -> dict:
    venv = _fake_venv(tmp_path)
    return dict(
        args=["make", "-s", "demo", f"VENV={venv}", f"DEMO_RUN={tmp_path / 'demo'}"], cwd=ROOT,
        env={**os.environ, "CALLS": str(tmp_path / "calls"), "FAIL_SEED": "none",
             "SLOW_SEED": "none", **env})


def _make_demo(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    run = subprocess.run(**_make_args(tmp_path, **env), capture_output=True, text=True, timeout=60)
    calls = tmp_path / "calls"
    return run, calls.read_text().splitlines() if calls.exists() else []


def _gone(pids: list[int]) -> bool:
    deadline = time.monotonic() + 5
    while any(Path(f"/proc/{p}").exists() for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(Path(f"/proc/{p}").exists() for p in pids)


def test_make_demo_trains_two_models_side_by_side_then_decodes_them_as_an_ensemble(tmp_path):
    run, calls = _make_demo(tmp_path)
    assert run.returncode == 0, run.stderr
    d, threads = tmp_path / "demo", str(max(1, os.cpu_count() // 2))
    assert sorted(calls[:2]) == [
        f"{threads} train configs/multi30k_demo.toml --out {d}/m{s} --set train.seed={s}"
        for s in (1, 2)]
    models = f"{d}/m1/avg5 {d}/m2/avg5"
    assert [c.split(" ", 1)[1] for c in calls[2:]] == [
        f"average {d}/m1 --last 5 -o {d}/m1/avg5", f"average {d}/m2 --last 5 -o {d}/m2/avg5",
        f"translate {models}", f"evaluate {models} --split test_2016_flickr"]


def test_make_demo_resumes_a_stopped_training_and_keeps_a_finished_model(tmp_path):
    d = tmp_path / "demo"
    (d / "m1").mkdir(parents=True)
    (d / "m1" / "trainer_state.pt").touch()
    (d / "m2" / "avg5").mkdir(parents=True)
    (d / "m2" / "avg5" / "model.safetensors").touch()
    run, calls = _make_demo(tmp_path)
    assert run.returncode == 0, run.stderr
    assert [c.split(" ", 1)[1] for c in calls[:2]] == [
        f"train --resume --out {d}/m1", f"average {d}/m1 --last 5 -o {d}/m1/avg5"]
    assert not any(f"{d}/m2 " in c or c.endswith(f"{d}/m2") for c in calls)


def test_a_failed_training_stops_the_other_and_make(tmp_path):
    start = time.monotonic()
    run, calls = _make_demo(tmp_path, FAIL_SEED="2", SLOW_SEED="1")
    assert run.returncode != 0 and time.monotonic() - start < 30  # model 1 did not run its 60 s
    assert "make demo: a training failed" in run.stderr
    assert not any(" average " in f" {c}" or " translate " in f" {c}" for c in calls)
    assert _gone([int(p) for p in (tmp_path / "calls.slow").read_text().split()]), (
        "model 1's training was left running")


def test_ctrl_c_stops_both_trainings(tmp_path):
    """The trainings run in the background, where a non-interactive shell ignores SIGINT: the
    recipe's trap passes Ctrl-C on to them."""
    make = subprocess.Popen(
        **_make_args(tmp_path, SLOW_SEED=""), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    slow = tmp_path / "calls.slow"
    deadline = time.monotonic() + 10
    while (not slow.exists() or len(slow.read_text().split()) < 2) and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = [int(p) for p in slow.read_text().split()]
    os.killpg(make.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    assert make.wait(timeout=20) != 0
    assert len(pids) == 2 and _gone(pids), "a training was left running after Ctrl-C"
