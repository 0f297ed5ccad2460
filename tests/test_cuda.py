"""aiayn on a CUDA GPU against aiayn on the CPU, with the same weights (issue 37).

A training step, greedy and beam decoding, cached against uncached decoding, the fused
(``F.scaled_dot_product_attention``: flash / memory-efficient kernels) and explicit attention
paths, and the trainer's bf16 autocast, each compared with the CPU result; and the host-device
syncs under ``torch.cuda.set_sync_debug_mode``.

Tolerances: fp32 on the GPU differs from fp32 on the CPU by summation order (and by TF32 if a
user turns it on: ~1e-3 relative), so fp32 comparisons use relative errors of 1e-3 to 1e-2; bf16
(8 bits of mantissa) against fp32 uses 2e-2 to 5e-2.

Without CUDA every test skips with its reason. ``AIAYN_CUDA_TEST_DEVICE=cpu`` runs them with the
CPU standing in for the GPU (the dry run of benchmarks/gpu_check.py does this), so that this file
cannot rot between GPU slots; the sync-debug tests need real CUDA and still skip then.
"""

from __future__ import annotations

import copy
import os
import random
import warnings

import pytest
import torch
from trainutil import tiny_model_config

from aiayn.config import ModelConfig
from aiayn.decode import DecodeConfig, translate_ids
from aiayn.model import Transformer
from aiayn.model.attention import scaled_dot_product_attention
from aiayn.train.loss import projected_label_smoothed_nll_loss

DEVICE = os.environ.get("AIAYN_CUDA_TEST_DEVICE", "cuda")
REAL_CUDA = torch.device(DEVICE).type == "cuda"

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.usefixtures("one_thread"),  # the CPU side is tiny: one thread is faster
    pytest.mark.skipif(REAL_CUDA and not torch.cuda.is_available(),
                       reason="needs a CUDA GPU (benchmarks/gpu_check.py runs these on one; "
                       "AIAYN_CUDA_TEST_DEVICE=cpu runs them on the CPU)"),
]
needs_real_cuda = pytest.mark.skipif(not (REAL_CUDA and torch.cuda.is_available()),
                                     reason="torch.cuda.set_sync_debug_mode needs a CUDA GPU")

V = 97


def config(layers: int = 2, **overrides) -> ModelConfig:
    return tiny_model_config(vocab=V, max_len=64, d_model=64, d_ff=128, n_encoder_layers=layers,
                             n_decoder_layers=layers, **overrides)


def pairs(n: int = 12, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    rng = random.Random(seed)
    return [([rng.randrange(4, V) for _ in range(rng.randint(3, 14))],
             [rng.randrange(4, V) for _ in range(rng.randint(3, 14))]) for _ in range(n)]


def batch(n: int = 12):
    from aiayn.data import collate_translation

    return collate_translation(pairs(n), 0, 1, 2)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64, on the CPU."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def grad_errors(grads: dict, ref: dict) -> dict[str, float]:
    """Per parameter ||g - g_ref|| / (||g_ref|| + 1e-3 ||all of g_ref||): the floor keeps
    gradients that are zero in exact arithmetic (the key projection's bias: softmax ignores a
    constant added to every score) from dividing rounding noise by rounding noise."""
    total = torch.cat([g.detach().double().cpu().flatten() for g in ref.values()]).norm()
    return {n: float((grads[n].detach().double().cpu() - ref[n].double().cpu()).norm()
                     / (ref[n].double().cpu().norm() + 1e-3 * total)) for n in ref}


def loss_and_grads(model, b, device, autocast_dtype=None):
    """The label-smoothed loss of batch ``b`` and the gradient of every parameter."""
    model.zero_grad(set_to_none=True)
    b = b.to(device)
    with torch.autocast(torch.device(device).type, dtype=autocast_dtype or torch.bfloat16,
                        enabled=autocast_dtype is not None):
        hidden = model(b.src, b.tgt_in, features_only=True)
        loss, _ = projected_label_smoothed_nll_loss(hidden, model.generator.weight, b.tgt_out,
                                                    0.1, 0)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("norm_first", [False, True])
def test_forward_backward_matches_cpu(norm_first):
    torch.manual_seed(0)
    cpu = Transformer(config(norm_first=norm_first))
    dev = copy.deepcopy(cpu).to(DEVICE)
    b = batch()
    loss_c, grads_c = loss_and_grads(cpu, b, "cpu")
    loss_d, grads_d = loss_and_grads(dev, b, DEVICE)
    assert rel_err(loss_d, loss_c) < 1e-3
    assert grads_c.keys() == grads_d.keys()
    errors = grad_errors(grads_d, grads_c)
    assert max(errors.values()) < 1e-2, max(errors.items(), key=lambda kv: kv[1])


def test_bf16_autocast_is_close_to_fp32_on_cpu():
    torch.manual_seed(0)
    cpu = Transformer(config())
    dev = copy.deepcopy(cpu).to(DEVICE)
    b = batch()
    loss_c, grads_c = loss_and_grads(cpu, b, "cpu")
    loss_d, grads_d = loss_and_grads(dev, b, DEVICE, torch.bfloat16)
    assert rel_err(loss_d, loss_c) < 2e-2
    # bf16 rounds every matmul input to 8 bits: ~5% per tensor, ~3% over all of them.
    errors = grad_errors(grads_d, grads_c)
    assert max(errors.values()) < 0.15, max(errors.items(), key=lambda kv: kv[1])
    everything = [torch.cat([g[n].flatten() for n in grads_c]) for g in (grads_d, grads_c)]
    assert rel_err(*everything) < 5e-2
    assert all(g.dtype == torch.float32 for g in grads_d.values())  # fp32 master weights


def _trainer(tmp_path, device: str, precision: str, name: str, layers: int = 2, **train):
    from aiayn.data import DataConfig, pair_store
    from aiayn.run_config import RunConfig, TrainConfig
    from aiayn.train.distributed import DistContext
    from aiayn.train.run_folder import RunFolder
    from aiayn.train.translation import TranslationTask
    from aiayn.train.trainer import Trainer

    cfg = RunConfig(model=config(layers), data=DataConfig(),
                    train=TrainConfig(precision=precision, device=device, seed=1,
                                      lr=1e-3, warmup_steps=1, lr_schedule="constant",
                                      **train))
    task = TranslationTask(cfg)
    task.stores = {"train": pair_store(pairs(24)), "valid": pair_store([])}
    folder = RunFolder(str(tmp_path / name))
    folder.prepare(resume=False)
    return Trainer(cfg, task, folder, DistContext(device=torch.device(device)), {}, "",
                   resume=False)


def test_trainer_update_matches_cpu(tmp_path):
    """One optimizer update (fp32) through the trainer on each device, from the same weights.

    Adam's first step is lr·g/(|g| + ε): with the usual ε it is ±lr for any gradient above ε,
    rounding noise included (the key bias's gradient is zero but for noise), so the devices'
    steps would differ in sign there. With ε = 1 the step is about lr·g: comparable."""
    cpu, dev = (_trainer(tmp_path, d, "fp32", f"run_{i}", adam_eps=1.0)
                for i, d in enumerate(("cpu", DEVICE)))
    for name, p in dev.model.named_parameters():
        assert torch.equal(p.detach().cpu(), dict(cpu.model.named_parameters())[name].detach())
    before = {n: p.detach().clone() for n, p in cpu.model.named_parameters()}
    group = [list(range(12)), list(range(12, 24))]  # two micro-batches
    assert cpu.update(group) and dev.update(group)
    assert dev._interval.loss == pytest.approx(cpu._interval.loss, rel=1e-3)
    assert dev._interval.grad_norm == pytest.approx(cpu._interval.grad_norm, rel=1e-2)
    ref = dict(cpu.model.named_parameters())
    steps_c = {n: ref[n].detach() - before[n] for n in before}
    steps_d = {n: p.detach().cpu() - before[n] for n, p in dev.model.named_parameters()}
    assert any(s.abs().max() > 0 for s in steps_c.values())
    # Weights 1e-6 apart (1 and 2 CPU threads) gave 3e-3 here; a lost micro-batch gives ~0.5.
    errors = grad_errors(steps_d, steps_c)
    assert max(errors.values()) < 2e-2, max(errors.items(), key=lambda kv: kv[1])


def test_trainer_takes_bf16_autocast_on_the_gpu(tmp_path):
    trainer = _trainer(tmp_path, DEVICE, "auto", "auto")
    if REAL_CUDA:
        assert trainer.setup.autocast_dtype == (torch.bfloat16 if torch.cuda.is_bf16_supported() else None)
    assert trainer.update([list(range(12))])
    assert trainer._interval.loss > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_and_explicit_attention_agree_with_the_cpu(dtype):
    """Padded keys, causal masks and a fully masked query row (it must output zeros)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 4, 7, 16, generator=g) for _ in range(3))
    mask = torch.ones(3, 1, 7, 7, dtype=torch.bool).tril()
    mask[1, :, :, 5:] = False  # padded keys
    mask[2, :, 3] = False  # a query that may attend to nothing
    ref, _ = scaled_dot_product_attention(q, k, v, mask, fused=False)  # CPU fp32, explicit
    on = [t.to(DEVICE, dtype) for t in (q, k, v)]
    tol = 1e-3 if dtype == torch.float32 else 3e-2
    for fused in (False, True):
        out, _ = scaled_dot_product_attention(*on, mask.to(DEVICE), fused=fused)
        assert out.dtype == dtype
        assert rel_err(out, ref) < tol, f"fused={fused}"
        assert torch.all(out[2, :, 3] == 0)
        assert torch.isfinite(out).all()


@pytest.mark.skipif(not REAL_CUDA, reason="the CUDA SDPA kernels need a GPU")
@pytest.mark.parametrize("backend", ["FLASH_ATTENTION", "EFFICIENT_ATTENTION"])
def test_each_fused_kernel_runs_our_attention(backend):
    """Flash takes no mask (unmasked or causal attention), memory-efficient takes our bool mask:
    both compute what the explicit math does."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 9, 64, generator=g) for _ in range(3))
    mask = None if backend == "FLASH_ATTENTION" else torch.rand(2, 1, 9, 9, generator=g) > 0.3
    ref, _ = scaled_dot_product_attention(q, k, v, mask, fused=False)
    on = [t.to(DEVICE, torch.bfloat16) for t in (q, k, v)]
    with sdpa_kernel([getattr(SDPBackend, backend)]):
        out, _ = scaled_dot_product_attention(*on, None if mask is None else mask.to(DEVICE),
                                              fused=True)
    assert rel_err(out, ref) < 3e-2


def _decode_on(model, device, cfg):
    model = copy.deepcopy(model).to(device)
    return translate_ids(model, [s for s, _ in pairs(10, seed=3)], cfg)


@pytest.mark.parametrize("beam", [1, 4])
def test_decoding_matches_cpu(beam):
    torch.manual_seed(0)
    model = Transformer(config(layers=2)).eval()
    cfg = DecodeConfig(beam=beam, max_len_a=1.0, max_len_b=5)
    cpu, dev = _decode_on(model, "cpu", cfg), _decode_on(model, DEVICE, cfg)
    same = [c[0].tokens == d[0].tokens for c, d in zip(cpu, dev)]
    # fp32 on two devices: a near-tie can flip a token in a random model, rarely.
    assert sum(same) >= len(same) - 1, same
    for c, d, s in zip(cpu, dev, same):
        if s:
            assert d[0].score == pytest.approx(c[0].score, abs=1e-3)


def test_cached_decoding_equals_full_decoding_on_the_device():
    torch.manual_seed(0)
    model = Transformer(config()).to(DEVICE).eval()
    b = batch(6).to(DEVICE)
    with torch.no_grad():
        memory = model.encode(b.src)
        full = model.decode(b.tgt_in, memory, src_mask=b.src != 0, tgt_mask=None)  # (B, T, V)
        cache = model.init_cache(memory, src=b.src)
        steps = [model.decode(b.tgt_in[:, t : t + 1], memory, cache=cache)
                 for t in range(b.tgt_in.size(1))]
    cached = torch.cat(steps, dim=1)
    real = (b.tgt_in != 0)[..., None]  # padded positions differ by design (no padding mask)
    assert rel_err(cached * real, full * real) < 1e-4


# --------------------------------------------------------------------------------------------
# Host-device syncs (tests/test_syncs.py counts the same on the CPU)
# --------------------------------------------------------------------------------------------


@needs_real_cuda
def test_model_forward_backward_and_decode_step_make_no_sync():
    torch.manual_seed(0)
    model = Transformer(config(dropout=0.1)).to(DEVICE).train()
    b = batch().to(DEVICE)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        model(b.src, b.tgt_in).float().logsumexp(-1).sum().backward()
        model.eval()
        with torch.no_grad():
            memory = model.encode(b.src)
            cache = model.init_cache(memory, src=b.src)
            for t in range(3):
                model.decode(b.tgt_in[:, t : t + 1], memory, cache=cache)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def _cuda_syncs(fn) -> int:
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


@needs_real_cuda
def test_a_training_update_syncs_a_fixed_few_times(tmp_path):
    """Per update: the trainer's one copy of loss/NLL/grad norm; per micro-batch the loss's
    count of non-padding rows (docs/gpu.md). The same for 1 and 3 layers."""
    counts = {}
    for layers in (1, 3):
        t = _trainer(tmp_path, DEVICE, "bf16", f"sync{layers}", layers=layers)
        t.update([list(range(12))])  # warm-up
        counts[layers] = _cuda_syncs(lambda t=t: t.update([list(range(12)), list(range(12, 24))]))
    assert counts[1] == counts[3], counts
    assert counts[1] <= 1 + 2 * 2, counts


@needs_real_cuda
@pytest.mark.parametrize("beam", [1, 4])
def test_decoding_syncs_a_fixed_few_times_per_step(beam):
    """The difference between decoding 12 and 6 tokens is 6 steps' syncs: at most 1 per step for
    greedy, 3 for beam search, whatever the layers."""
    torch.manual_seed(0)
    per_step = {}
    for layers in (1, 3):
        model = Transformer(config(layers=layers, output_vocab="targets")).eval()
        model.output_mask[model.cfg.eos_id] = False  # no EOS: every sentence runs to the cap
        model = model.to(DEVICE)
        sources = [s for s, _ in pairs(8, seed=5)]

        def run(n, model=model, sources=sources):
            cfg = DecodeConfig(beam=beam, max_len_a=0.0, max_len_b=n)
            return lambda: translate_ids(model, sources, cfg)

        run(4)()  # warm-up
        per_step[layers] = (_cuda_syncs(run(12)) - _cuda_syncs(run(6))) / 6
    assert per_step[1] == per_step[3], per_step
    assert per_step[1] <= (1 if beam == 1 else 3), per_step
