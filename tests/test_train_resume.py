"""Exact resume: a run killed with SIGKILL at an arbitrary moment and restarted with --resume ends
with weights bit-identical to an uninterrupted run (CPU, fp32, dropout on). And resume refusals."""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import time

import pytest
import torch
from safetensors.torch import load_file

from aiayn.cli import main
from aiayn.io import describe_folder
from trainutil import ROOT, aiayn_command, base_values, one_thread, run_aiayn, subprocess_env, write_toml  # noqa: F401
from trainutil import fails as _fails
from trainutil import torch_threads


def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen(aiayn_command(*args), cwd=ROOT, env=subprocess_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _lines(path) -> int:
    try:
        return path.read_text().count("\n")
    except FileNotFoundError:
        return 0


def _steps_and_losses(run) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())]


def test_sigkill_then_resume_is_bit_identical(tmp_path):
    values = base_values(tmp_path / "data", max_steps=30, save_every=3, valid_every=10,
                         log_every=1, keep_last=3)
    cfg = write_toml(tmp_path / "run.toml", values)
    full, killed = tmp_path / "full", tmp_path / "killed"
    reference = _start("train", str(cfg), "--out", str(full))
    victim = _start("train", str(cfg), "--out", str(killed))
    rng = random.Random()
    kill_after = rng.randint(4, 20)  # metrics lines (= updates) seen before the kill
    deadline = time.monotonic() + 120
    while _lines(killed / "metrics.jsonl") < kill_after and victim.poll() is None:
        assert time.monotonic() < deadline, "the run to be killed made no progress"
        time.sleep(0.01)
    time.sleep(rng.uniform(0.0, 0.05))  # land anywhere inside an update or a checkpoint write
    assert victim.poll() is None, f"finished before the kill: {victim.communicate()[1][-2000:]}"
    victim.send_signal(signal.SIGKILL)
    victim.communicate()
    assert victim.returncode == -signal.SIGKILL
    state = torch.load(killed / "trainer_state.pt", weights_only=True)
    assert state["step"] < 30

    resumed = run_aiayn("train", str(cfg), "--out", str(killed), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed {killed} at step {state['step']}" in resumed.stderr
    _, err = reference.communicate(timeout=120)
    assert reference.returncode == 0, err[-3000:]

    a = load_file(str(full / "model.safetensors"))
    b = load_file(str(killed / "model.safetensors"))
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs after resume (killed after {kill_after})"
    # The metrics log is continuous (lines past the checkpoint were dropped and re-written) and the
    # losses of every update agree exactly.
    assert _steps_and_losses(full) == _steps_and_losses(killed)
    assert [s for s, _ in _steps_and_losses(killed)] == list(range(1, 31))


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resume")
    values = base_values(tmp / "data", max_steps=4, save_every=2, valid_every=2)
    cfg = write_toml(tmp / "run.toml", values)
    run = tmp / "run"
    with torch_threads(1):
        assert main(["train", str(cfg), "--out", str(run)]) == 0
    return cfg, run


def _snapshot(run) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def test_resume_continues_to_a_larger_max_steps(finished_run, tmp_path, capsys):
    cfg, run = finished_run
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    assert main(["train", "--resume", "--out", str(copy), "--set", "train.max_steps=6"]) == 0
    assert torch.load(copy / "trainer_state.pt", weights_only=True)["step"] == 6
    assert json.loads((copy / "config.json").read_text())["train"]["max_steps"] == 6


def test_resume_continues_the_moving_average_of_the_weights_exactly(tmp_path):
    """train.ema_decay: the average is saved with the checkpoint, so a run stopped at update 3 and
    resumed to 6 ends with the same average (the run folder's weights) and trained weights as
    one run of 6 updates."""
    values = base_values(tmp_path / "data", max_steps=6, save_every=3, valid_every=3,
                         ema_decay=0.9)
    whole, halves = tmp_path / "whole", tmp_path / "halves"
    with torch_threads(1):
        assert main(["train", str(write_toml(tmp_path / "a.toml", values)), "--out", str(whole)]) == 0
        values["train.max_steps"] = 3
        assert main(["train", str(write_toml(tmp_path / "b.toml", values)), "--out", str(halves)]) == 0
        assert "ema" in torch.load(halves / "trainer_state.pt", weights_only=True)
        assert main(["train", "--resume", "--out", str(halves), "--set", "train.max_steps=6"]) == 0
    a, b = (torch.load(run / "trainer_state.pt", weights_only=True) for run in (whole, halves))
    assert a["step"] == b["step"] == 6
    assert a["ema"].keys() == b["ema"].keys()
    for name in a["ema"]:
        assert torch.equal(a["ema"][name], b["ema"][name]), name
    for file in ("model.safetensors", "checkpoints/step_00000006.safetensors"):
        x, y = load_file(str(whole / file)), load_file(str(halves / file))
        assert all(torch.equal(x[k], y[k]) for k in x), file
    averaged, trained = (load_file(str(whole / f)) for f in ("model.safetensors", "checkpoints/step_00000006.safetensors"))
    assert any(not torch.equal(averaged[k], trained[k]) for k in averaged)


def test_resume_of_a_state_saved_before_the_fused_optimizer_uses_the_fused_kernel(finished_run, tmp_path):
    cfg, run = finished_run
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    state = torch.load(copy / "trainer_state.pt", weights_only=True)
    assert state["optimizer"]["param_groups"][0]["fused"] is True
    for group in state["optimizer"]["param_groups"]:  # as saved by the foreach optimizer
        group["fused"], group["foreach"] = None, None
    torch.save(state, copy / "trainer_state.pt")
    assert main(["train", "--resume", "--out", str(copy), "--set", "train.max_steps=6"]) == 0
    resumed = torch.load(copy / "trainer_state.pt", weights_only=True)
    assert resumed["step"] == 6 and resumed["optimizer"]["param_groups"][0]["fused"] is True


def test_resume_refuses_a_different_model_and_keeps_files(finished_run, capsys):
    cfg, run = finished_run
    _fails(capsys, ["train", str(cfg), "--out", str(run), "--resume", "--set", "model.d_ff=64"],
           "model.d_ff: run has 32, config says 64", unchanged=[run])
    _fails(capsys, ["train", str(cfg), "--out", str(run), "--resume", "--set", "data.max_len=20"],
           "data.max_len", unchanged=[run])


def test_training_into_an_existing_run_needs_resume(finished_run, capsys):
    cfg, run = finished_run
    _fails(capsys, ["train", str(cfg), "--out", str(run)],
           f"already holds {describe_folder(run)}; pass --resume", unchanged=[run])
    assert describe_folder(run).startswith("a training run with ")


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty", "foreign"])
def test_corrupt_trainer_state_is_a_clear_error(finished_run, tmp_path, capsys, damage):
    cfg, run = finished_run
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    state = copy / "trainer_state.pt"
    data = state.read_bytes()
    if damage == "foreign":
        torch.save({"step": 3, "weights": torch.zeros(2)}, state)
    else:
        state.write_bytes({"truncate": data[: len(data) // 2], "garbage": b"not a checkpoint" * 10,
                           "empty": b""}[damage])
    _fails(capsys, ["train", str(cfg), "--out", str(copy), "--resume"],
           "not an aiayn trainer state" if damage == "foreign" else "corrupt or truncated trainer state",
           unchanged=[copy])


def test_corrupt_weight_snapshot_is_a_clear_error(finished_run, tmp_path, capsys):
    cfg, run = finished_run
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    snap = copy / "checkpoints" / torch.load(copy / "trainer_state.pt", weights_only=True)["snapshot"]
    snap.write_bytes(snap.read_bytes()[:100])
    _fails(capsys, ["train", str(cfg), "--out", str(copy), "--resume"], "not a readable safetensors file")


def test_resume_without_a_run(tmp_path, capsys):
    _fails(capsys, ["train", "--resume", "--out", str(tmp_path / "nothing")], "no run to resume")
    (tmp_path / "empty").mkdir()
    values = base_values(tmp_path / "data")
    cfg = write_toml(tmp_path / "run.toml", values)
    _fails(capsys, ["train", str(cfg), "--resume", "--out", str(tmp_path / "empty")],
           "nothing to resume")


def test_a_run_resumes_from_another_directory_and_moved(tmp_path, capsys, monkeypatch):
    """A recipe's relative data paths (against the directory training started in) are recorded
    absolute in the run's config.json: --resume from another directory, and of a moved run
    folder, read the same files (both failed: 'data/train.src: no such file'). A data file gone
    since is named, with its key and how to give its place now (which --resume accepts)."""
    start = tmp_path / "project"
    values = base_values(start / "data", max_steps=2, save_every=2, valid_every=2)
    for key in ("train_src", "train_tgt", "valid_src", "valid_tgt"):
        values[f"data.{key}"] = f"data/{key.replace('_', '.')}"
    for name in ("train.src", "train.tgt", "valid.src", "valid.tgt"):
        assert (start / "data" / name).is_file()
    write_toml(start / "run.toml", values)
    monkeypatch.chdir(start)
    with torch_threads(1):
        assert main(["train", "run.toml", "--out", "runs/r"]) == 0
    recorded = json.loads((start / "runs" / "r" / "config.json").read_text())["data"]
    assert recorded["train_src"] == str(start / "data" / "train.src")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    with torch_threads(1):
        assert main(["train", "--resume", "--out", str(start / "runs" / "r"),
                     "--set", "train.max_steps=3"]) == 0
        shutil.move(start / "runs" / "r", elsewhere / "moved")
        assert main(["train", "--resume", "--out", "moved", "--set", "train.max_steps=4"]) == 0
    assert torch.load(elsewhere / "moved" / "trainer_state.pt", weights_only=True)["step"] == 4
    shutil.move(start / "data", tmp_path / "data2")
    _fails(capsys, ["train", "--resume", "--out", "moved", "--set", "train.max_steps=5"],
           f"{start / 'data' / 'train.src'}: no such file (data.train_src; --set "
           "data.train_src=PATH gives its place now)", unchanged=[elsewhere / "moved"])
    moved = [f"--set=data.{key}={tmp_path / 'data2' / key.replace('_', '.')}"
             for key in ("train_src", "train_tgt", "valid_src", "valid_tgt")]
    with torch_threads(1):
        assert main(["train", "--resume", "--out", "moved", "--set", "train.max_steps=5", *moved]) == 0
