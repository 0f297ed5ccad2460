"""Regularisation options of a training run: R-Drop (train.rdrop_alpha) and the moving average of
the weights (train.ema_decay). BPE-dropout (data.bpe_dropout) is tested in test_train_loop.py and
test_data_tokenizer.py."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from torch.nn import functional as F

from aiayn.errors import ConfigError
from aiayn.run_config import build_run_config
from aiayn.train import ema as ema_module
from aiayn.train.classification import ClassificationTask
from aiayn.train.ema import WeightAverage
from aiayn.train.loss import projected_label_smoothed_nll_loss, rdrop_loss
from aiayn.train.run import train_run
from aiayn.train.translation import TranslationTask
from trainutil import SHAPE_TRAIN, base_values, one_thread, reviews, write_tsv  # noqa: F401

CPU = torch.device("cpu")


def _with_alpha(task, alpha: float) -> None:
    task.cfg = replace(task.cfg, train=replace(task.cfg.train, rdrop_alpha=alpha))


def _kl(log_p, log_q):
    """KL(p ‖ q) summed over rows, written out."""
    return (log_p.exp() * (log_p - log_q)).sum()


def _by_hand(l1, l2, gold, eps, alpha):
    """R-Drop's loss (Liang et al. 2021, Eq. 3) halved, and the mean NLL, from two passes."""
    ce = sum(F.cross_entropy(z, gold, label_smoothing=eps, reduction="sum") for z in (l1, l2))
    nll = sum(F.cross_entropy(z, gold, reduction="sum") for z in (l1, l2))
    p1, p2 = l1.log_softmax(-1), l2.log_softmax(-1)
    return 0.5 * (ce + alpha * 0.5 * (_kl(p1, p2) + _kl(p2, p1))), 0.5 * nll, _kl(p1, p2)


@pytest.fixture
def translation(tmp_path):
    cfg = build_run_config(base_values(tmp_path / "data", label_smoothing=0.1))
    task = TranslationTask(cfg)
    task.setup(None)
    torch.manual_seed(0)
    model = task.build_model(task.model_config(cfg.model)).train()
    return task, model, task.collate("train", list(range(8)))


def test_rdrop_loss_of_logits_is_the_formula():
    torch.manual_seed(0)
    logits = torch.randn(10, 7, dtype=torch.float64, requires_grad=True)  # two passes of 5 rows
    gold = torch.tensor([1, 4, -1, 0, 6])
    keep = gold != -1
    loss, nll = rdrop_loss(logits, gold, 0.1, -1, alpha=3.0)
    expected, expected_nll, _ = _by_hand(logits[:5][keep], logits[5:][keep], gold[keep], 0.1, 3.0)
    assert torch.allclose(loss, expected) and torch.allclose(nll, expected_nll)
    (grad,) = torch.autograd.grad(loss, logits)
    (expected_grad,) = torch.autograd.grad(expected, logits)
    assert torch.allclose(grad, expected_grad)
    assert grad[2].abs().max() == 0 and grad[7].abs().max() == 0  # padding: no loss
    same, _ = rdrop_loss(torch.cat([logits[:5], logits[:5]]), gold, 0.1, -1, alpha=3.0)
    assert torch.allclose(same, rdrop_loss(logits[:5].repeat(2, 1), gold, 0.1, -1, 0.0)[0])


def test_rdrop_translation_loss_is_the_formula_over_two_dropout_passes(translation):
    task, model, batch = translation
    _with_alpha(task, 2.0)
    torch.manual_seed(5)
    stats = task.loss(model, batch, CPU)
    torch.manual_seed(5)  # the same dropout masks: the batch twice in one forward pass
    logits = model(torch.cat([batch.src] * 2), torch.cat([batch.tgt_in] * 2))  # (2B, T, V)
    B, keep = batch.src.size(0), batch.tgt_out != task.cfg.model.pad_id
    expected, nll, kl = _by_hand(logits[:B][keep], logits[B:][keep], batch.tgt_out[keep], 0.1, 2.0)
    assert kl > 1e-4  # the two passes saw other masks
    assert torch.allclose(stats.loss, expected, rtol=1e-5)
    assert torch.allclose(stats.nll, nll, rtol=1e-5)
    assert stats.n_targets == batch.n_tgt_tokens
    stats.loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_rdrop_alpha_zero_is_todays_loss_and_validation_is_the_plain_loss(translation):
    task, model, batch = translation
    torch.manual_seed(5)
    off = task.loss(model, batch, CPU)
    torch.manual_seed(5)
    hidden = model(batch.src, batch.tgt_in, features_only=True)
    loss, nll = projected_label_smoothed_nll_loss(
        hidden, model.generator.weight, batch.tgt_out, 0.1, task.cfg.model.pad_id
    )
    assert torch.equal(off.loss, loss) and torch.equal(off.nll, nll)
    model.eval()
    with torch.no_grad():
        plain = task.loss(model, batch, CPU)
        _with_alpha(task, 2.0)
        assert torch.equal(task.loss(model, batch, CPU).loss, plain.loss)


def test_rdrop_classification_loss_is_the_formula(tmp_path):
    values = {
        "model.d_model": 16, "model.n_heads": 2, "model.d_ff": 32, "model.n_encoder_layers": 1,
        "model.n_decoder_layers": 0, "model.dropout": 0.2, "model.max_len": 100,
        "data.kind": "classification", "data.dataset": "",
        "data.train_file": write_tsv(tmp_path / "train.tsv", reviews(16, 0)),
        "data.valid_file": write_tsv(tmp_path / "valid.tsv", reviews(4, 1)),
        "data.tokenizer": "char", "data.vocab_size": 60, "data.max_len": 90,
        "data.max_tokens": 1200, **SHAPE_TRAIN, "train.label_smoothing": 0.1,
        "train.rdrop_alpha": 1.5,
    }
    cfg = build_run_config(values)
    task = ClassificationTask(cfg)
    task.setup(None)
    torch.manual_seed(0)
    model = task.build_model(task.model_config(cfg.model)).train()
    batch = task.collate("train", list(range(6)))
    torch.manual_seed(3)
    stats = task.loss(model, batch, CPU)
    torch.manual_seed(3)
    logits = model(torch.cat([batch.tokens] * 2))  # (2B, C)
    expected, nll, kl = _by_hand(logits[:6], logits[6:], batch.labels, 0.1, 1.5)
    assert kl > 0
    assert torch.allclose(stats.loss, expected, rtol=1e-5)
    assert torch.allclose(stats.nll, nll, rtol=1e-5)


def test_rdrop_and_ema_settings_are_checked(tmp_path):
    values = base_values(tmp_path / "data")
    for key, value, message in [
        ("train.rdrop_alpha", -1.0, "train.rdrop_alpha must be >= 0"),
        ("train.ema_decay", 1.0, r"train.ema_decay must be in \[0, 1\)"),
        ("train.ema_decay", -0.5, r"train.ema_decay must be in \[0, 1\)"),
    ]:
        with pytest.raises(ConfigError, match=message):
            build_run_config({**values, key: value})
    lm = {"data.kind": "lm", "data.dataset": "tiny_shakespeare", "train.rdrop_alpha": 1.0}
    with pytest.raises(ConfigError, match="train.rdrop_alpha applies to data.kind = "):
        build_run_config(lm)
    both = {"train.rdrop_alpha": 1.0, "train.adversarial_eps": 0.1}
    with pytest.raises(ConfigError, match="set one of them"):
        build_run_config({"data.kind": "classification", **both})


def test_weight_average_is_the_closed_form_over_the_weights():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2)).double()
    model[1].register_buffer("count", torch.zeros((), dtype=torch.long))
    decay, opt = 0.8, torch.optim.SGD(model.parameters(), lr=0.1)
    average = WeightAverage(model, decay)
    weights = [[p.detach().clone() for p in model.parameters()]]  # w_0
    for step in range(6):
        opt.zero_grad()
        model(torch.randn(5, 3, dtype=torch.float64)).square().sum().backward()
        opt.step()
        model[1].count += 1
        average.update(model)
        weights.append([p.detach().clone() for p in model.parameters()])
    n = len(weights) - 1
    for i, p in enumerate(average.model.parameters()):
        closed = decay**n * weights[0][i] + (1 - decay) * sum(
            decay ** (n - k) * weights[k][i] for k in range(1, n + 1)
        )
        assert torch.allclose(p, closed, rtol=0, atol=1e-12)
        assert not torch.allclose(p, weights[-1][i])
    assert int(average.model[1].count) == 6  # integer buffers: copied
    assert not any(p.requires_grad for p in average.model.parameters())


def test_ema_run_validates_and_writes_the_average(tmp_path, monkeypatch):
    """A run with train.ema_decay: the run folder's and best/'s weights are the closed-form
    average over the weights after each update; the snapshots keep the trained weights."""
    seen = []
    start, update = WeightAverage.__init__, WeightAverage.update

    def record(model):
        seen.append({k: v.detach().double().clone() for k, v in model.state_dict().items()})

    monkeypatch.setattr(ema_module.WeightAverage, "__init__",
                        lambda self, model, decay: (record(model), start(self, model, decay))[1])
    monkeypatch.setattr(ema_module.WeightAverage, "update",
                        lambda self, model: (update(self, model), record(model))[0])
    decay = 0.7
    cfg = build_run_config(base_values(tmp_path / "data", max_steps=4, save_every=4,
                                       valid_every=4, ema_decay=decay))
    train_run(cfg, tmp_path / "run")
    assert len(seen) == 5  # w_0 and the weights after updates 1-4
    folder = load_file(str(tmp_path / "run/model.safetensors"))
    best = load_file(str(tmp_path / "run/best/model.safetensors"))
    trained = load_file(str(tmp_path / "run/checkpoints/step_00000004.safetensors"))
    assert folder.keys() == trained.keys() and set(folder) <= set(seen[0])
    for name in folder:
        closed = decay**4 * seen[0][name] + (1 - decay) * sum(
            decay ** (4 - k) * seen[k][name] for k in range(1, 5)
        )
        assert torch.allclose(folder[name].double(), closed, rtol=0, atol=1e-6), name
        assert torch.equal(best[name], folder[name])
        assert torch.equal(trained[name], seen[4][name].to(trained[name].dtype))
    name = "encoder.layers.0.self_attn.q_proj.weight"
    assert not torch.allclose(folder[name], trained[name])


def test_ema_changes_validation_not_training(tmp_path):
    """The average is what validation sees; the trained weights, and so the training losses, are
    those of a run without it."""
    runs = {}
    for decay in (0.0, 0.99):
        values = base_values(tmp_path / "data", max_steps=4, valid_every=2, log_every=1,
                             ema_decay=decay)
        train_run(build_run_config(values), tmp_path / str(decay))
        lines = [json.loads(line) for line in (tmp_path / str(decay) / "metrics.jsonl").read_text().splitlines()]
        weights = load_file(str(tmp_path / str(decay) / "checkpoints/step_00000004.safetensors"))
        runs[decay] = lines, weights
    (plain, w_plain), (averaged, w_averaged) = runs[0.0], runs[0.99]
    assert [r["loss"] for r in plain] == [r["loss"] for r in averaged]
    assert all(torch.equal(w_plain[k], w_averaged[k]) for k in w_plain)
    valid = [(r["valid_loss"], s["valid_loss"]) for r, s in zip(plain, averaged) if "valid_loss" in r]
    assert len(valid) == 2 and all(a != b for a, b in valid)
