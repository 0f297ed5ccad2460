"""DDP: `torchrun --nproc_per_node=2 -m aiayn train` on CPU (gloo) computes the same updates as one
process accumulating the same global batch (update_freq 2), and only rank 0 writes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from trainutil import ROOT, base_values, run_aiayn, subprocess_env, write_toml


def _metrics(run) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_two_cpu_ranks_match_one_process_with_the_same_global_batch(tmp_path):
    values = base_values(tmp_path / "data", max_steps=4, log_every=1, valid_every=2, save_every=2)
    values["model.dropout"] = 0.0
    cfg = write_toml(tmp_path / "run.toml", values)
    ddp = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "-m", "aiayn", "train", str(cfg), "--out", str(tmp_path / "ddp")],
        cwd=ROOT, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    single = run_aiayn("train", str(cfg), "--out", str(tmp_path / "single"),
                       "--set", "train.update_freq=2")
    _, err = ddp.communicate(timeout=180)
    assert ddp.returncode == 0, err[-3000:]
    assert single.returncode == 0, single.stderr[-3000:]

    a, b = _metrics(tmp_path / "ddp"), _metrics(tmp_path / "single")
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3, 4]  # rank 0 logs, once
    for x, y in zip(a, b):
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-5)
        assert x["grad_norm"] == pytest.approx(y["grad_norm"], rel=1e-4)
        assert ("valid_loss" in x) == ("valid_loss" in y) == (x["step"] % 2 == 0)
        if "valid_loss" in x:
            assert x["valid_loss"] == pytest.approx(y["valid_loss"], rel=1e-5)
    wa = load_file(str(tmp_path / "ddp/model.safetensors"))
    wb = load_file(str(tmp_path / "single/model.safetensors"))
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], rtol=1e-4, atol=1e-5, msg=name)
    state = torch.load(tmp_path / "ddp/trainer_state.pt", weights_only=True)
    assert state["world_size"] == 2 and len(state["rng"]) == 2  # every rank's RNG is saved
