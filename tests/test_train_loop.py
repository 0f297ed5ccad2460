"""The training loop on a tiny reversal task: run folder, metrics, learning, accumulation,
keep-best, early stopping, limits, non-finite losses."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from aiayn.folder import load_model_dir
from aiayn.run_config import build_run_config
from aiayn.train.distributed import DistContext
from aiayn.train.run import train_run
from aiayn.train.run_folder import RunFolder
from aiayn.train.schedule import time_cosine_lr
from aiayn.train.translation import TranslationTask
from aiayn.train.trainer import Trainer, TrainingDiverged
from trainutil import base_values, one_thread  # noqa: F401 (autouse fixture)


def _metrics(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_run_folder_is_a_loadable_model_and_resumable_state(tmp_path):
    cfg = build_run_config(base_values(tmp_path / "data", max_steps=8, keep_last=2, save_every=2))
    run = tmp_path / "run"
    result = train_run(cfg, run, extra_meta={"preset": None})
    assert result.step == 8 and result.stop_reason == "max_steps"
    for name in ("config.json", "tokenizer.json", "model.safetensors", "trainer_state.pt",
                 "metrics.jsonl", "best/model.safetensors", "best/config.json", "best/tokenizer.json"):
        assert (run / name).is_file(), name
    meta = json.loads((run / "config.json").read_text())
    assert meta["kind"] == "translation" and meta["train"]["max_steps"] == 8
    assert meta["data"]["tokenizer"] == "char" and meta["model"]["src_vocab_size"] < 40
    model, mcfg, _ = load_model_dir(run)
    assert mcfg.d_model == 16
    load_model_dir(run / "best")
    # The last K snapshots are kept, the last one equals model.safetensors.
    assert RunFolder(run).snapshot_steps() == [6, 8]
    last = load_file(str(run / "model.safetensors"))
    snap = load_file(str(run / "checkpoints/step_00000008.safetensors"))
    assert all(torch.equal(last[k], snap[k]) for k in last)
    state = torch.load(run / "trainer_state.pt", weights_only=True)
    assert state["step"] == 8 and "optimizer" in state and state["rng"][0]["torch"].dtype == torch.uint8
    best = json.loads((run / "best/config.json").read_text())["best"]
    assert best["step"] in (4, 8) and best["valid_loss"] == pytest.approx(result.best)


def test_metrics_lines_have_the_agreed_fields(tmp_path):
    cfg = build_run_config(base_values(tmp_path / "data", max_steps=8, log_every=2, valid_every=4))
    train_run(cfg, tmp_path / "run")
    lines = _metrics(tmp_path / "run")
    assert [r["step"] for r in lines] == [2, 4, 6, 8]
    for r in lines:
        for key in ("step", "wall", "epoch", "loss", "lr", "tokens_per_s"):
            assert isinstance(r[key], (int, float)) and math.isfinite(r[key]), key
        assert r["tokens_per_s"] > 0 and r["epoch"] >= 1
    assert [("valid_loss" in r) for r in lines] == [False, True, False, True]
    assert lines[0]["wall"] <= lines[-1]["wall"]
    assert lines[1]["lr"] == pytest.approx(3e-3)  # inverse_sqrt peak at warmup = 4


def test_training_learns(tmp_path):
    values = base_values(tmp_path / "data", max_steps=30, valid_every=10, log_every=1, lr=1e-2,
                         warmup_steps=10)
    values["model.dropout"] = 0.0
    train_run(build_run_config(values), tmp_path / "run")
    lines = _metrics(tmp_path / "run")
    assert lines[-1]["loss"] < 0.8 * lines[0]["loss"]
    valid = [r["valid_loss"] for r in lines if "valid_loss" in r]
    assert len(valid) == 3 and valid[-1] < valid[0]


def test_logged_validation_equals_a_fresh_evaluation_of_the_saved_weights(tmp_path):
    """The validation logged after several fused-optimizer updates is that of the current
    weights: a fresh trainer loaded with the saved model gets the same loss. (A cache of the
    stacked Q/K/V weights keyed on version counters, which the fused AdamW kernel does not bump,
    once made every validation use the weights of the first.)"""
    values = base_values(tmp_path / "data", max_steps=12, valid_every=4, log_every=4, lr=1e-2)
    values["model.dropout"] = 0.0
    train_run(build_run_config(values), tmp_path / "run")
    logged = [r["valid_loss"] for r in _metrics(tmp_path / "run") if "valid_loss" in r]
    assert len(logged) == 3
    fresh = _trainer(tmp_path / "fresh", max_steps=12, lr=1e-2)  # the same data, written again
    assert fresh.optimizer.defaults["fused"]  # the kernel the training above used
    saved, _, _ = load_model_dir(tmp_path / "run")
    fresh.model.load_state_dict(saved.state_dict())
    assert fresh._valid_loss()["valid_loss"] == pytest.approx(logged[-1], rel=1e-5)


def _trainer(tmp_path, **train) -> Trainer:
    values = base_values(tmp_path / "data", **train)
    values["model.dropout"] = 0.0
    cfg = build_run_config(values)
    task = TranslationTask(cfg)
    tok = task.setup(None)
    cfg = cfg.__class__(model=task.model_config(cfg.model), data=cfg.data, train=cfg.train)
    task.cfg = cfg
    folder = RunFolder(tmp_path / "run")
    folder.prepare(resume=False)
    return Trainer(cfg, task, folder, DistContext(), {}, tok, resume=False)


def _capture_grads(trainer: Trainer) -> list:
    """Replace the optimizer step by a copy of the gradients it would apply."""
    grads: list = []
    trainer.optimizer.step = lambda: grads.extend(
        p.grad.clone() for p in trainer.model.parameters())
    return grads


def test_accumulation_equals_one_big_batch(tmp_path):
    """Two micro-batches accumulated = their union in one batch (loss normalised by all targets)."""
    a, b = _trainer(tmp_path / "a"), _trainer(tmp_path / "b")
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))
    first, second = a.task.epoch_batches(1, 0, 1)[:2]
    ga, gb = _capture_grads(a), _capture_grads(b)
    assert a.update([first, second]) and b.update([first + second])
    assert len(ga) == len(gb) > 10
    for (name, _), x, y in zip(a.model.named_parameters(), ga, gb):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-6, msg=name)
    assert a._interval.loss == pytest.approx(b._interval.loss, rel=1e-5)


def test_gradient_clipping_caps_the_norm(tmp_path):
    t = _trainer(tmp_path, clip_norm=1e-3)
    batch = t.task.collate("train", t.task.epoch_batches(1, 0, 1)[0])
    stats = t.task.loss(t.model, batch, t.device)
    stats.loss.backward()
    before = t._grad_norm()
    after = torch.sqrt(sum((p.grad ** 2).sum() for p in t.model.parameters() if p.grad is not None))
    assert before > 1e-2 and after.item() == pytest.approx(1e-3, rel=1e-3)


class _NaNTask(TranslationTask):
    """Reports a NaN loss on the training updates listed in ``nan_calls`` (0-based loss calls)."""

    nan_calls: set[int] = set()

    def loss(self, model, batch, device):
        stats = super().loss(model, batch, device)
        if model.training:
            self.calls = getattr(self, "calls", 0) + 1
            if self.calls - 1 in self.nan_calls:
                stats.loss = stats.loss * float("nan")
        return stats


def test_nan_loss_is_skipped_and_counted(tmp_path):
    cfg = build_run_config(base_values(tmp_path / "data", max_steps=6, log_every=1))
    task = _NaNTask(cfg)
    task.nan_calls = {2}
    result = train_run(cfg, tmp_path / "run", task=task)
    lines = _metrics(tmp_path / "run")
    assert result.step == 6 and task.calls == 7  # one extra batch for the skipped update
    assert [r["skipped"] for r in lines] == [0, 0, 1, 1, 1, 1]
    assert all(math.isfinite(v) for v in load_file(str(tmp_path / "run/model.safetensors"))["src_embed.token.weight"].flatten().tolist())


def test_divergence_stops_with_last_good_checkpoint_intact(tmp_path):
    cfg = build_run_config(base_values(tmp_path / "data", max_steps=20, save_every=3,
                                       valid_every=0, max_bad_steps=3))
    task = _NaNTask(cfg)
    task.nan_calls = set(range(4, 100))
    run = tmp_path / "run"
    with pytest.raises(TrainingDiverged, match="3 consecutive updates had a non-finite loss.*intact"):
        train_run(cfg, run, task=task)
    state = torch.load(run / "trainer_state.pt", weights_only=True)
    assert state["step"] == 3
    weights = load_file(str(run / "model.safetensors"))
    assert all(torch.isfinite(t).all() for t in weights.values())
    load_model_dir(run)


class _WorseningTask(TranslationTask):
    """Validation loss that only gets worse: early stopping must fire."""

    def loss(self, model, batch, device):
        stats = super().loss(model, batch, device)
        if not model.training:
            self.valid_calls = getattr(self, "valid_calls", 0) + 1
            stats.nll = torch.tensor(float(self.valid_calls) * stats.n_targets)
        return stats


def test_early_stopping_with_patience(tmp_path):
    cfg = build_run_config(base_values(tmp_path / "data", max_steps=100, valid_every=2, patience=2))
    result = train_run(cfg, tmp_path / "run", task=_WorseningTask(cfg))
    assert result.stop_reason == "early_stopping" and result.step == 6
    assert json.loads((tmp_path / "run/best/config.json").read_text())["best"]["step"] == 2


def test_epoch_and_time_limits(tmp_path):
    cfg = build_run_config(base_values(tmp_path / "data", max_steps=0, max_epochs=1, valid_every=0))
    result = train_run(cfg, tmp_path / "a")
    assert result.stop_reason == "max_epochs" and result.epoch == 1
    assert _metrics(tmp_path / "a")[-1]["epoch"] == 1 and "valid_loss" in _metrics(tmp_path / "a")[-1]
    cfg = build_run_config(base_values(tmp_path / "data", max_steps=1000, max_time=1e-3))
    result = train_run(cfg, tmp_path / "b")
    assert result.stop_reason == "max_time" and result.step == 1
    assert (tmp_path / "b/trainer_state.pt").is_file()
    again = train_run(cfg, tmp_path / "b", resume=True)  # the time is used up: no more updates
    assert again.stop_reason == "max_time" and again.step == 1


def test_cosine_over_time_reaches_its_floor_when_the_time_budget_ends(tmp_path, monkeypatch):
    # A clock on which every update takes 10 s: the budget of 100 s ends after update 11 (its
    # update starts at 100 s); the warm-up ends at update 2 (10 s), so the decay spans 90 s.
    monkeypatch.setattr(Trainer, "_wall", lambda self: 10.0 * self.progress.step)
    cfg = build_run_config(base_values(tmp_path / "data", lr_schedule="cosine", lr=1e-3, min_lr=1e-5,
                                       warmup_steps=2, warmup_init_lr=0.0, schedule_clock="time",
                                       max_time=100.0, max_steps=0, log_every=1, valid_every=0))
    result = train_run(cfg, tmp_path / "run")
    assert result.stop_reason == "max_time" and result.step == 11
    lrs = [r["lr"] for r in _metrics(tmp_path / "run")]
    expected = [time_cosine_lr(k, (10.0 * (k - 1) - 10.0) / 90.0, 1e-3, 2, 1e-5) for k in range(1, 12)]
    assert lrs == pytest.approx(expected, rel=1e-12)
    assert lrs[1] == pytest.approx(1e-3) and lrs[-1] == pytest.approx(1e-5)
    assert lrs[0] == pytest.approx(5e-4)


def test_bf16_autocast_trains_with_fp32_master_weights(tmp_path):
    cfg = build_run_config(base_values(tmp_path / "data", max_steps=2, precision="bf16"))
    train_run(cfg, tmp_path / "run")
    weights = load_file(str(tmp_path / "run/model.safetensors"))
    assert all(t.dtype == torch.float32 for t in weights.values())
    assert math.isfinite(_metrics(tmp_path / "run")[-1]["loss"])


def test_bpe_dropout_re_encodes_training_batches_only(tmp_path):
    """data.bpe_dropout: training batches are new segmentations of the same text (decoding back
    to it), the plain pairs and validation batches are untouched, and a run trains."""
    values = base_values(tmp_path / "data", max_steps=4)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta"]
    for split in ("train", "valid"):  # words of several letters, so that BPE has merges to skip
        lines = [" ".join(words[(i + j) % 7] for j in range(2 + i % 4)) for i in range(120)]
        for side, text in (("src", lines), ("tgt", [" ".join(reversed(t.split())) for t in lines])):
            (tmp_path / "data" / f"{split}.{side}").write_text("\n".join(text) + "\n", encoding="utf-8")
    values.update({"data.tokenizer": "bpe", "data.vocab_size": 300, "data.bpe_dropout": 0.5,
                   "model.max_len": 128, "data.max_len": 128, "data.max_tokens": 800})
    cfg = build_run_config(values)
    task = TranslationTask(cfg)
    task.setup(None)
    store = task.stores["train"]
    plain = [(x.tolist(), y.tolist()) for x, y in zip(store.rows("src", range(40)), store.rows("tgt", range(40)))]
    first = task._noisy_pairs(list(range(40)))
    assert first != plain  # at p = 0.5 some of 40 pairs are segmented differently
    for (x, y), (src, tgt) in zip(first, task.train_texts[:40]):
        assert task.tokenizer.decode(x) == src and task.tokenizer.decode(y) == tgt
    assert sum(len(x) for x, _ in first) > sum(len(x) for x, _ in plain)  # fewer merges
    assert [(x.tolist(), y.tolist()) for x, y in zip(store.rows("src", range(40)), store.rows("tgt", range(40)))] == plain
    valid = task.collate("valid", [0, 1, 2])
    assert valid.src.tolist() == task.collate("valid", [0, 1, 2]).src.tolist()
    train_run(cfg, tmp_path / "run")
    assert (tmp_path / "run" / "model.safetensors").is_file()


def test_bpe_dropout_needs_a_bpe_translation_tokenizer(tmp_path):
    values = base_values(tmp_path / "data")
    values["data.bpe_dropout"] = 0.1  # the tiny task's tokenizer is "char"
    with pytest.raises(Exception, match="bpe_dropout needs"):
        build_run_config(values)
    values.update({"data.tokenizer": "bpe", "data.bpe_dropout": 1.0})
    with pytest.raises(Exception, match=r"bpe_dropout must be in \[0, 1\)"):
        build_run_config(values)


def test_checkpoints_every_n_minutes_of_training(tmp_path, monkeypatch):
    # A clock on which every update takes 4 minutes (update k starts at 240·(k-1) s): with
    # save_every_minutes = 10 the snapshots fall after updates 4 (12 min) and 7 (24 min, 12 after
    # the last save), then at the end (8); no step-based or validation checkpoints.
    monkeypatch.setattr(Trainer, "_wall", lambda self: 240.0 * self.progress.step)
    cfg = build_run_config(base_values(tmp_path / "data", max_steps=8, save_every=0, valid_every=0,
                                       save_every_minutes=10, keep_last=10))
    train_run(cfg, tmp_path / "run")
    snapshots = sorted(p.name for p in (tmp_path / "run/checkpoints").glob("step_*.safetensors"))
    assert snapshots == [f"step_{s:08d}.safetensors" for s in (4, 7, 8)]


def test_tokens_per_update_sets_the_micro_batches_per_update(tmp_path):
    from aiayn.errors import ConfigError
    from aiayn.run_config import micro_batches_per_update

    trainer = _trainer(tmp_path, tokens_per_update=400)  # data.max_tokens = 160: ⌈400/160⌉ = 3
    assert trainer.update_freq == 3
    assert micro_batches_per_update(trainer.cfg, 2) == 2 and micro_batches_per_update(trainer.cfg, 4) == 1
    batches = trainer.task.epoch_batches(1, 0, 1)
    trainer.progress.position = 0
    trainer.update = lambda group: groups.append(len(group)) or False
    groups: list[int] = []
    trainer._limit_reached = lambda check_time=True: "stop" if len(groups) == 2 else None
    trainer._run_epoch()
    assert groups == [3, 3] and len(batches) > 6
    with pytest.raises(ConfigError, match="tokens_per_update .* leave train.update_freq at 1"):
        build_run_config(base_values(tmp_path / "d2", tokens_per_update=400, update_freq=2))
