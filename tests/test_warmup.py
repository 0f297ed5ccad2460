"""train.warm_shapes (aiayn/train/warmup.py): one batch of each shape run forward and backward
before training changes nothing the run computes — the losses of every update and the final
weights equal those of the same run without it, bit for bit (CPU, fp32, dropout on) — and it
stops at its time bound and says so in one log line. And train.compile (slow) gives the eager
losses."""

from __future__ import annotations

import contextlib
import json
import logging

import pytest
import torch
from safetensors.torch import load_file
from trainutil import base_values, one_thread  # noqa: F401 (autouse fixture)

import aiayn.train.trainer as trainer_module
from aiayn.run_config import build_run_config
from aiayn.train.run import train_run

BUCKETS = "8,12,16,24,32"  # the reversal data's widths reach data.max_len = 32


def run(tmp_path, name: str, dropout: float = 0.1, **train) -> tuple[list[float], dict]:
    values = base_values(tmp_path / "data", **{"max_steps": 6, "log_every": 1, "valid_every": 0,
                                               "save_every": 0, **train})
    values["data.bucket_widths"] = BUCKETS
    values["model.dropout"] = dropout
    train_run(build_run_config(values), tmp_path / name)
    lines = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in lines if "tokens_per_s" in r], load_file(tmp_path / name / "model.safetensors")


def test_warming_every_shape_leaves_the_losses_and_weights_unchanged(tmp_path, caplog, monkeypatch):
    plain, plain_weights = run(tmp_path, "plain")
    with caplog.at_level(logging.INFO, logger="aiayn.train.warmup"):
        warmed, warmed_weights = run(tmp_path, "warmed", warm_shapes=60)
    lines = [r.getMessage() for r in caplog.records if r.name == "aiayn.train.warmup"]
    assert len(lines) == 1 and lines[0].startswith("train.warm_shapes: ")
    done, listed = (int(x) for x in lines[0].split(": ")[1].split(" batch")[0].split(" of "))
    assert done == listed > 3 and "stopped" not in lines[0]
    assert len(plain) == 6 and warmed == plain  # exactly: the same floats
    assert all(torch.equal(plain_weights[k], warmed_weights[k]) for k in plain_weights)
    # The check can fail: a warm-up that left the RNGs moved draws other dropout masks.
    monkeypatch.setattr(trainer_module, "rng_untouched", contextlib.nullcontext)
    moved, _ = run(tmp_path, "moved", warm_shapes=60)
    assert moved != plain


def test_the_warm_up_stops_at_its_bound(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="aiayn.train.warmup"):
        losses, _ = run(tmp_path, "bounded", warm_shapes=1e-9)
    line = next(r.getMessage() for r in caplog.records if r.name == "aiayn.train.warmup")
    assert line.startswith("train.warm_shapes: 0 of ") and line.endswith("stopped at the 1e-09 s bound")
    assert len(losses) == 6


@pytest.mark.slow  # torch.compile on the CPU: ~4 minutes here (a graph per shape, then dynamic)
def test_the_compiled_forward_gives_the_eager_losses(tmp_path):
    """train.compile: the losses of 4 updates (bucketed widths, several shapes, dropout off: the
    compiled dropout draws other masks) equal the eager run's to 1e-5 relative (1.1e-7 measured
    here, 2026-11-29), and its final weights to 1e-4 (3e-8 measured) — but the key projections'
    biases: their exact gradient is 0 (a constant added to every key's score of a query leaves
    its softmax unchanged), so each run's is rounding noise, which Adam scales up to steps of
    about the learning rate in either direction (2-4e-3 apart here after 4 updates)."""
    eager, eager_weights = run(tmp_path, "eager", max_steps=4, dropout=0.0)
    compiled, compiled_weights = run(tmp_path, "compiled", max_steps=4, dropout=0.0, compile=True)
    assert len(eager) == 4 and compiled == pytest.approx(eager, rel=1e-5)
    for k in eager_weights:
        if k.endswith("k_proj.bias"):
            assert (compiled_weights[k] - eager_weights[k]).abs().max() < 4 * 3e-3 * 2
            continue
        torch.testing.assert_close(compiled_weights[k], eager_weights[k], rtol=1e-4, atol=1e-6)
