"""The paper's recipe against closed forms: label-smoothed loss, the §5.3 and inverse-sqrt
schedules, the optimizer settings, and the run config (one override mechanism)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from trainutil import tiny_model_config

from aiayn.config import ModelConfig
from aiayn.errors import ConfigError
from aiayn.run_config import TrainConfig, build_run_config, load_run_config
from aiayn.train import loss as loss_module
from aiayn.train.loss import label_smoothed_nll_loss, projected_label_smoothed_nll_loss
from aiayn.train.schedule import cosine_lr, inverse_sqrt_lr, make_schedule, noam_lr, time_cosine_lr

# ---- label-smoothed cross-entropy --------------------------------------------------------------


def test_label_smoothing_two_class_closed_form():
    # p = (1/4, 3/4); gold = 1: loss = (1-ε)(-log 3/4) + ε · (-(log 1/4 + log 3/4) / 2)
    logits = torch.tensor([[0.0, math.log(3.0)]])
    eps = 0.1
    loss, nll = label_smoothed_nll_loss(logits, torch.tensor([1]), eps, ignore_index=-100)
    expected = (1 - eps) * -math.log(0.75) + eps * -(math.log(0.25) + math.log(0.75)) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert nll.item() == pytest.approx(-math.log(0.75), rel=1e-6)


def test_label_smoothing_uniform_logits_is_log_v_for_any_epsilon():
    logits = torch.zeros(2, 3, 11)
    target = torch.tensor([[4, 5, 6], [7, 8, 9]])
    for eps in (0.0, 0.1, 0.5):
        loss, _ = label_smoothed_nll_loss(logits, target, eps, ignore_index=0)
        assert loss.item() == pytest.approx(6 * math.log(11), rel=1e-6)


def test_label_smoothing_matches_explicit_sum_and_torch_cross_entropy():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 7, dtype=torch.float64)
    target = torch.randint(1, 7, (3, 5))
    target[0, 3:] = 0  # padding
    target[2, 1:] = 0
    eps = 0.1
    loss, nll = label_smoothed_nll_loss(logits, target, eps, ignore_index=0)
    log_p = torch.log_softmax(logits, -1)
    expected = 0.0
    expected_nll = 0.0
    for b in range(3):
        for t in range(5):
            y = int(target[b, t])
            if y == 0:
                continue
            q = torch.full((7,), eps / 7, dtype=torch.float64)
            q[y] += 1 - eps
            expected += float(-(q * log_p[b, t]).sum())
            expected_nll += float(-log_p[b, t, y])
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert nll.item() == pytest.approx(expected_nll, rel=1e-6)
    ref = F.cross_entropy(logits.reshape(-1, 7).float(), target.reshape(-1), ignore_index=0,
                          label_smoothing=eps, reduction="sum")
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)


def test_padding_is_never_a_target():
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 6)
    target = torch.tensor([[3, 4, 0, 0], [5, 0, 0, 0]])
    changed = logits.clone()
    changed[target == 0] = 100.0 * torch.randn_like(changed[target == 0])
    a, _ = label_smoothed_nll_loss(logits, target, 0.1, ignore_index=0)
    b, _ = label_smoothed_nll_loss(changed, target, 0.1, ignore_index=0)
    assert torch.equal(a, b)


def test_loss_gradient_flows_and_is_finite_in_bf16():
    logits = torch.randn(2, 3, 9, requires_grad=True)
    loss, _ = label_smoothed_nll_loss(logits.bfloat16(), torch.tensor([[1, 2, 3], [4, 0, 0]]), 0.1, 0)
    loss.backward()
    assert loss.dtype == torch.float32 and torch.isfinite(logits.grad).all()


# ---- schedules ---------------------------------------------------------------------------------


def test_noam_schedule_closed_form():
    d, w = 512, 4000
    assert noam_lr(1, d, w) == pytest.approx(d ** -0.5 * w ** -1.5)
    assert noam_lr(w, d, w) == pytest.approx(d ** -0.5 * w ** -0.5)  # the peak, ~7.0e-4
    assert noam_lr(w, d, w) == pytest.approx(6.987712429686844e-4)
    assert noam_lr(4 * w, d, w) == pytest.approx(noam_lr(w, d, w) / 2)
    assert noam_lr(w // 2, d, w) == pytest.approx(noam_lr(w, d, w) / 2)  # linear warm-up
    assert noam_lr(w, d, w, scale=2.0) == pytest.approx(2 * noam_lr(w, d, w))
    peak = max(range(1, 3 * w), key=lambda s: noam_lr(s, d, w))
    assert peak == w


def test_inverse_sqrt_schedule_closed_form():
    peak, w = 5e-3, 2000
    assert inverse_sqrt_lr(1, peak, w) == pytest.approx(peak / w)
    assert inverse_sqrt_lr(w // 4, peak, w) == pytest.approx(peak / 4)
    assert inverse_sqrt_lr(w, peak, w) == pytest.approx(peak)
    assert inverse_sqrt_lr(4 * w, peak, w) == pytest.approx(peak / 2)
    assert inverse_sqrt_lr(100 * w, peak, w) == pytest.approx(peak / 10)
    assert inverse_sqrt_lr(w // 2, peak, w, init=1e-7) == pytest.approx(1e-7 + (peak - 1e-7) / 2)


def test_cosine_schedule_closed_form():
    peak, w, total, floor = 3e-3, 400, 2400, 1e-4
    assert cosine_lr(w // 2, peak, w, total, floor) == pytest.approx(peak / 2)
    assert cosine_lr(w, peak, w, total, floor) == pytest.approx(peak)
    assert cosine_lr((w + total) // 2, peak, w, total, floor) == pytest.approx((peak + floor) / 2)
    assert cosine_lr(total, peak, w, total, floor) == pytest.approx(floor)
    assert cosine_lr(2 * total, peak, w, total, floor) == pytest.approx(floor)
    rates = [cosine_lr(s, peak, w, total, floor) for s in range(w, total + 1)]
    assert all(a >= b for a, b in zip(rates, rates[1:]))  # decays monotonically after warm-up


def test_cosine_needs_a_budget_of_updates():
    with pytest.raises(ConfigError, match="max_steps"):
        TrainConfig(lr_schedule="cosine", warmup_steps=400, max_steps=400)


def test_cosine_over_time_closed_form():
    peak, w, floor = 3e-3, 400, 1e-4
    for step in (1, w // 2, w):  # the warm-up counts updates, whatever the clock says
        assert time_cosine_lr(step, 0.7, peak, w, floor) == cosine_lr(step, peak, w, 2400, floor)
    assert time_cosine_lr(w + 1, 0.0, peak, w, floor) == pytest.approx(peak)
    assert time_cosine_lr(w + 1, 0.5, peak, w, floor) == pytest.approx((peak + floor) / 2)
    assert time_cosine_lr(w + 1, 1.0, peak, w, floor) == pytest.approx(floor)
    assert time_cosine_lr(10 * w, 3.0, peak, w, floor) == pytest.approx(floor)
    rates = [time_cosine_lr(w + 1, u / 100, peak, w, floor) for u in range(101)]
    assert all(a >= b for a, b in zip(rates, rates[1:]))
    cos = make_schedule(TrainConfig(lr_schedule="cosine", lr=1e-3, min_lr=1e-5, warmup_steps=10,
                                    schedule_clock="time", max_time=60, max_steps=0), 64)
    assert cos(11, 0.0) == pytest.approx(1e-3) and cos(11, 1.0) == pytest.approx(1e-5)
    steps = make_schedule(TrainConfig(lr_schedule="cosine", lr=1e-3, warmup_steps=10,
                                      max_steps=110), 64)
    assert steps(60, 0.0) == steps(60, 1.0)  # the updates clock ignores the time


def test_cosine_over_time_needs_cosine_and_a_time_budget():
    with pytest.raises(ConfigError, match="max_time"):
        TrainConfig(lr_schedule="cosine", schedule_clock="time", max_time=0)
    with pytest.raises(ConfigError, match="lr_schedule = 'inverse_sqrt'"):
        TrainConfig(lr_schedule="inverse_sqrt", schedule_clock="time", max_time=60)
    TrainConfig(lr_schedule="cosine", schedule_clock="time", max_time=60, max_steps=0)  # no step cap


def test_make_schedule_picks_by_name():
    noam = make_schedule(TrainConfig(lr_schedule="noam", warmup_steps=10), d_model=64)
    assert noam(10) == pytest.approx(64 ** -0.5 * 10 ** -0.5)
    inv = make_schedule(TrainConfig(lr_schedule="inverse_sqrt", lr=1e-3, warmup_steps=10), 64)
    assert inv(40) == pytest.approx(5e-4)
    cos = make_schedule(TrainConfig(lr_schedule="cosine", lr=1e-3, min_lr=1e-5, warmup_steps=10,
                                    max_steps=110), 64)
    assert cos(10) == pytest.approx(1e-3) and cos(110) == pytest.approx(1e-5)
    const = make_schedule(TrainConfig(lr_schedule="constant", lr=1e-3), 64)
    assert const(1) == const(10_000) == 1e-3


def test_paper_defaults():
    t = TrainConfig()
    assert t.adam_betas == (0.9, 0.98) and t.adam_eps == 1e-9
    assert t.label_smoothing == 0.1 and t.lr_schedule == "noam" and t.warmup_steps == 4000


# ---- run config --------------------------------------------------------------------------------


def test_toml_and_set_take_the_same_path(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[model]\npreset = "tiny"\nd_ff = 200\n[train]\nlr = 0.001\n'
                    '[data]\nvocab_size = 1000\n', encoding="utf-8")
    cfg, values = load_run_config(path, ["train.lr=5e-3", "model.n_heads=2"])
    assert cfg.model.d_model == ModelConfig.preset("tiny").d_model  # from the preset
    assert cfg.model.d_ff == 200 and cfg.model.n_heads == 2  # file and --set both override it
    assert cfg.train.lr == 5e-3 and cfg.data.vocab_size == 1000
    assert values["model.preset"] == "tiny"
    assert build_run_config(values) == cfg


def test_unknown_key_has_did_you_mean(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown config key 'train.warmup_step' \(did you mean 'train.warmup_steps'\?\)"):
        load_run_config(None, ["train.warmup_step=10"])
    path = tmp_path / "bad.toml"
    path.write_text("[trian]\nlr = 1.0\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="did you mean 'train'"):
        load_run_config(path)


def test_wrong_value_type_is_named(tmp_path):
    with pytest.raises(ConfigError, match="train.max_steps: expected an integer"):
        load_run_config(None, ["train.max_steps=lots"])
    path = tmp_path / "bad.toml"
    path.write_text('[train]\nlr = "fast"\n', encoding="utf-8")
    with pytest.raises(ConfigError, match="train.lr: expected a number"):
        load_run_config(path)


@pytest.mark.parametrize("override, message", [
    ("train.precision=fp8", "not one of"),
    ("train.label_smoothing=1.5", "label_smoothing must be in"),
    ("train.update_freq=0", "update_freq must be >= 1"),
    ("train.best_metric=valid_bleu", "needs train.metrics_every > 0"),
    ("model.preset=huge", "unknown preset 'huge'"),
    ("lr=1", "name the section"),
])
def test_invalid_values(override, message):
    with pytest.raises(ConfigError, match=message):
        load_run_config(None, [override])


def test_invalid_toml_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_run_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[train\nlr = 1", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_run_config(bad)
    bare = tmp_path / "bare.toml"
    bare.write_text("lr = 1\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="must be a \\[section\\]"):
        load_run_config(bare)


def test_label_smoothed_loss_gradient_gradcheck_and_torch():
    """The fused loss's hand-written backward: float64 gradcheck, and equal to autograd through
    F.cross_entropy(label_smoothing=ε) in float32."""
    z = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    t = torch.tensor([1, 2, 0, 3, 4, 1])
    assert torch.autograd.gradcheck(lambda z: label_smoothed_nll_loss(z, t, 0.2, 0)[0], (z,))
    logits = torch.randn(40, 33, requires_grad=True)
    target = torch.randint(0, 33, (40,))
    loss, _ = label_smoothed_nll_loss(logits, target, 0.1, ignore_index=0)
    (ours,) = torch.autograd.grad(loss, logits)
    ref = torch.nn.functional.cross_entropy(logits, target, ignore_index=0, label_smoothing=0.1,
                                            reduction="sum")
    (theirs,) = torch.autograd.grad(ref, logits)
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-5)


def test_projected_loss_equals_the_loss_of_the_projected_logits(monkeypatch):
    """Output projection fused into the loss (chunks of rows, the (N, V) logits never built):
    value, NLL and gradients for the hidden states and the weight equal the plain path, across
    chunk boundaries, with padding rows dropped and an upstream gradient other than 1."""
    monkeypatch.setattr(loss_module, "PROJECT_ROWS", 4)  # 3 chunks of rows and a remainder
    monkeypatch.setattr(loss_module, "CHUNK_BYTES", 4 * 13 * 3)  # float32 passes of 3 rows
    torch.manual_seed(0)
    h = torch.randn(3, 5, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(13, 8, dtype=torch.float64, requires_grad=True)
    target = torch.randint(1, 13, (3, 5))
    target[1, 2:] = 0
    target[2, 4] = 0
    ref, ref_nll = label_smoothed_nll_loss(F.linear(h, w), target, 0.1, ignore_index=0)
    ref_grads = torch.autograd.grad(2.5 * ref, (h, w))
    ours, ours_nll = projected_label_smoothed_nll_loss(h, w, target, 0.1, ignore_index=0)
    grads = torch.autograd.grad(2.5 * ours, (h, w))
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(ours_nll, ref_nll)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b)
    assert float(grads[0][1, 3].abs().sum()) == 0.0  # a padding row gets no gradient
    assert torch.autograd.gradcheck(
        lambda h, w: projected_label_smoothed_nll_loss(h, w, target, 0.2, 0)[0], (h, w))
    with torch.no_grad():  # evaluation: the same value, no gradient work kept
        torch.testing.assert_close(projected_label_smoothed_nll_loss(h, w, target, 0.1, 0)[0], ref)
    frozen, _ = projected_label_smoothed_nll_loss(h, w.detach(), target, 0.1, ignore_index=0)
    (only_h,) = torch.autograd.grad(2.5 * frozen, (h,))  # a frozen output projection
    torch.testing.assert_close(only_h, ref_grads[0])
    empty, _ = projected_label_smoothed_nll_loss(h, w, torch.zeros_like(target), 0.1, 0)
    assert float(empty.detach()) == 0.0  # padding only: no loss and zero gradients
    assert all(float(g.abs().sum()) == 0.0 for g in torch.autograd.grad(empty, (h, w)))


def test_a_gpu_takes_the_loss_in_few_large_passes():
    """On the CPU the per-row passes stay in cache (2 MiB: 14 rows at the paper's 37,000 BPE
    vocabulary); on a GPU each pass is kernel launches, so a micro-batch of the paper's recipe
    (3,125 tokens) is one projection chunk of few passes (docs/scaling.md measured the CPU
    sizes at 14x the time of one pass on an H100)."""
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert loss_module.rows_per_pass(37_000, cpu) == 14
    assert loss_module.rows_per_pass(37_000, gpu) >= 1_024
    assert loss_module.rows_per_projection(cpu) == 1_024
    assert loss_module.rows_per_projection(gpu) >= 3_125


def test_projected_loss_under_bf16_autocast_is_close_to_float32():
    torch.manual_seed(0)
    h = torch.randn(64, 32, requires_grad=True)
    w = (0.2 * torch.randn(500, 32)).requires_grad_()
    target = torch.randint(0, 500, (64,))
    ref, _ = label_smoothed_nll_loss(F.linear(h, w), target, 0.1, ignore_index=0)
    ref_grads = torch.autograd.grad(ref, (h, w))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours, _ = projected_label_smoothed_nll_loss(h, w, target, 0.1, ignore_index=0)
    grads = torch.autograd.grad(ours, (h, w))
    assert ours.dtype == torch.float32 and grads[1].dtype == torch.float32
    assert abs(ours.item() - ref.item()) < 2e-3 * abs(ref.item())
    for a, b in zip(grads, ref_grads):
        assert float((a - b).norm() / b.norm()) < 2e-2


@pytest.mark.parametrize("tied", [True, False])
def test_task_loss_through_the_model_equals_the_logits_path(tied):
    """What the trainer computes (hidden states + the generator's weight, projected in the loss)
    equals the loss of the model's own logits, with gradients for every parameter, whether the
    generator shares the embedding or has its own weight."""
    from aiayn.model import Transformer
    from aiayn.train.task import output_weight

    torch.manual_seed(0)
    cfg = tiny_model_config(vocab=31, max_len=1024, d_model=16, n_heads=2, d_ff=32,
                            n_encoder_layers=1, n_decoder_layers=1, share_embeddings=tied,
                            tie_output=tied)
    model = Transformer(cfg).double()
    assert (model.generator.weight is model.tgt_embed.token.weight) == tied
    src = torch.randint(3, 31, (3, 7))
    tgt = torch.randint(3, 31, (3, 6))
    tgt[1, 4:] = cfg.pad_id
    target = torch.roll(tgt, -1, 1)
    target[:, -1] = cfg.pad_id
    params = [p for p in model.parameters() if p.requires_grad]
    ref, _ = label_smoothed_nll_loss(model(src, tgt), target, 0.1, cfg.pad_id)
    ref_grads = torch.autograd.grad(ref, params)
    ours, _ = projected_label_smoothed_nll_loss(model(src, tgt, features_only=True),
                                                output_weight(model), target, 0.1, cfg.pad_id)
    grads = torch.autograd.grad(ours, params)
    torch.testing.assert_close(ours, ref)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b)
