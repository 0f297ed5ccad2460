"""Invariants of the Transformer: causality, padding and batch invariance, NaN-free masking,
the positional-encoding formula, float64 gradcheck, and learning the copy task."""

import math

import pytest
import torch
from trainutil import tiny_model_config

from aiayn import ModelConfig, Transformer
from aiayn.model import sinusoidal_table
from aiayn.model.attention import MultiHeadAttention, scaled_dot_product_attention

PAD, BOS, EOS = 0, 1, 2


def tiny_cfg(**kw) -> ModelConfig:
    return tiny_model_config(20, 1024, **{"d_model": 16, "n_heads": 2, "d_ff": 32, **kw})


@pytest.fixture(params=[False, True], ids=["post-LN", "pre-LN"])
def model(request):
    return Transformer(tiny_cfg(norm_first=request.param)).eval()


def test_causality_future_target_tokens_change_no_earlier_output(model):
    src = torch.randint(4, 20, (2, 6))
    tgt = torch.randint(4, 20, (2, 7))
    base = model(src, tgt)
    for t in range(tgt.size(1) - 1):
        changed = tgt.clone()
        changed[:, t + 1:] = torch.randint(4, 20, changed[:, t + 1:].shape)
        out = model(src, changed)
        torch.testing.assert_close(out[:, : t + 1], base[:, : t + 1], atol=1e-6, rtol=1e-6)
        assert not torch.allclose(out[:, t + 1:], base[:, t + 1:])  # the future does matter


def test_padding_invariance_extra_padding_changes_no_real_output(model):
    src = torch.randint(4, 20, (2, 5))
    tgt = torch.randint(4, 20, (2, 4))
    base = model(src, tgt)
    padded = model(torch.cat([src, torch.full((2, 3), PAD)], 1),
                   torch.cat([tgt, torch.full((2, 2), PAD)], 1))
    torch.testing.assert_close(padded[:, :4], base, atol=1e-5, rtol=1e-5)


def test_batch_invariance_a_sentence_alone_equals_inside_a_batch(model):
    srcs = [torch.randint(4, 20, (n,)) for n in (3, 7, 5)]
    tgts = [torch.randint(4, 20, (n,)) for n in (4, 2, 6)]
    pad = lambda xs: torch.nn.utils.rnn.pad_sequence(xs, batch_first=True, padding_value=PAD)
    batch = model(pad(srcs), pad(tgts))
    for i, (s, t) in enumerate(zip(srcs, tgts)):
        alone = model(s[None], t[None])
        torch.testing.assert_close(batch[i, : len(t)], alone[0], atol=1e-5, rtol=1e-5)


def test_fully_padded_row_gives_no_nan(model):
    src = torch.tensor([[5, 6, 7], [PAD, PAD, PAD]])
    tgt = torch.tensor([[BOS, 5], [BOS, 6]])
    out = model(src, tgt)
    assert torch.isfinite(out).all()
    q = k = v = torch.randn(1, 1, 3, 4)
    dead = torch.zeros(1, 1, 3, 3, dtype=torch.bool)
    for fused in (False, True):
        o, _ = scaled_dot_product_attention(q, k, v, dead, fused=fused)
        assert torch.equal(o, torch.zeros_like(o))


def test_positional_encoding_equals_closed_formula():
    L, D = 50, 16
    table = sinusoidal_table(L, D)
    for pos in (0, 1, 17, 49):
        for i in range(D // 2):
            angle = pos / 10000 ** (2 * i / D)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_embeddings_are_scaled_and_shared():
    m = Transformer(tiny_cfg())
    assert m.src_embed.token is m.tgt_embed.token
    assert m.generator.weight is m.src_embed.token.weight
    ids = torch.tensor([[5]])
    pe0 = sinusoidal_table(1, 16)[0]
    expected = m.src_embed.token.weight[5] * 4.0 + pe0  # sqrt(16) = 4
    torch.testing.assert_close(m.src_embed(ids)[0, 0], expected)
    separate = Transformer(tiny_cfg(share_embeddings=False, tgt_vocab_size=30))
    assert separate.src_embed.token is not separate.tgt_embed.token
    assert separate.generator.weight is separate.tgt_embed.token.weight  # tie_output


def test_gradcheck_float64():
    cfg = tiny_cfg(d_model=8, n_heads=2, d_ff=8, n_encoder_layers=1, n_decoder_layers=1,
                   src_vocab_size=10, tgt_vocab_size=10)
    model = Transformer(cfg).double().eval()
    src = torch.tensor([[4, 5, 6, PAD]])
    tgt = torch.tensor([[BOS, 7, 8]])
    memory = torch.randn(1, 4, 8, dtype=torch.float64, requires_grad=True)
    x = torch.randn(1, 3, 8, dtype=torch.float64, requires_grad=True)

    def f(x, memory):
        mask = model.src_mask(src)
        enc = model.encoder(memory, mask)
        from aiayn.model.masks import target_mask
        return model.decoder(x, enc, target_mask(tgt, PAD), mask)

    assert torch.autograd.gradcheck(f, (x, memory), eps=1e-6, atol=1e-4)


def greedy(model, src, max_len):
    memory = model.encode(src)
    ys = torch.full((src.size(0), 1), BOS)
    for _ in range(max_len):
        logits = model.decode(ys, memory, model.src_mask(src))
        ys = torch.cat([ys, logits[:, -1].argmax(-1, keepdim=True)], 1)
    return ys[:, 1:]


def test_learns_the_copy_task():
    """The Annotated Transformer's learning check: copy random sequences; greedy output must
    reproduce held-out sources exactly."""
    torch.manual_seed(0)
    V, L = 12, 8
    cfg = tiny_cfg(src_vocab_size=V, tgt_vocab_size=V, d_model=64, n_heads=4, d_ff=128)
    model = Transformer(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98), eps=1e-9)
    loss_fn = torch.nn.CrossEntropyLoss()
    # 300 updates: the held-out copies are exact from 250 on (loss 0.006; 0.003 at 300, 2026-11-29)
    schedule = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=300, pct_start=0.2)
    for step in range(300):
        src = torch.randint(4, V, (64, L))
        tgt_in = torch.cat([torch.full((64, 1), BOS), src], 1)
        tgt_out = torch.cat([src, torch.full((64, 1), EOS)], 1)
        loss = loss_fn(model(src, tgt_in).reshape(-1, V), tgt_out.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        schedule.step()
    model.eval()
    held_out = torch.randint(4, V, (32, L), generator=torch.Generator().manual_seed(123))
    with torch.no_grad():
        out = greedy(model, held_out, L)
    assert torch.equal(out, held_out), f"final loss {loss.item():.3f}"


def test_residual_dropout_placement_section_5_4():
    """§5.4: dropout on every sub-layer output (before the residual add) and on embeddings +
    positions; none anywhere else by default; off in eval mode."""
    cfg = tiny_cfg(dropout=0.5)
    model = Transformer(cfg)
    drops = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Dropout) and m.p == 0.5}
    per_enc = {f"encoder.layers.{i}.{b}.dropout" for i in range(2) for b in ("attn_block", "ff_block")}
    per_dec = {f"decoder.layers.{i}.{b}.dropout" for i in range(2)
               for b in ("self_block", "cross_block", "ff_block")}
    assert drops == per_enc | per_dec | {"src_embed.dropout", "tgt_embed.dropout"}
    # The residual block drops the sub-layer branch only, never the residual path itself.
    block = model.encoder.layers[0].ff_block.train()
    x = torch.randn(4, 3, 16)
    out = block(x, lambda h: torch.zeros_like(h))
    torch.testing.assert_close(out, block.norm(x))  # a zero branch leaves LayerNorm(x) exactly
    src, tgt = torch.randint(4, 20, (2, 5)), torch.randint(4, 20, (2, 4))
    model.train()
    assert not torch.allclose(model(src, tgt), model(src, tgt))
    model.eval()
    torch.testing.assert_close(model(src, tgt), model(src, tgt))


def test_dropout_keeps_1_minus_p_and_scales():
    from aiayn.model.dropout import Dropout

    drop = Dropout(0.3)
    x = torch.ones(3, 133_335)  # not a multiple of 4 elements: the mask is drawn 4 at a time
    y = drop(x)
    kept = y != 0
    assert abs(kept.float().mean().item() - 0.7) < 0.005
    # each of the 4 pieces of a 64-bit draw keeps 1 - p (the top piece has 15 random bits)
    pieces = kept.flatten()[: kept.numel() // 4 * 4].view(-1, 4).float().mean(0)
    assert ((pieces - 0.7).abs() < 0.01).all(), pieces
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], 1 / 0.7))
    assert torch.equal(drop.eval()(x), x)
    torch.manual_seed(5)
    a = drop.train()(x)
    torch.manual_seed(5)
    assert torch.equal(a, drop(x))  # drawn from torch's seeded generator


def test_fused_projections_equal_the_separate_ones():
    """project_qkv (one GEMM over stacked weights) and project_kv(x, x) give what the three
    separate nn.Linear layers give; gradients reach each layer's own weights."""
    from aiayn.model.attention import MultiHeadAttention

    mha = MultiHeadAttention(32, 4, d_v=6)
    x = torch.randn(3, 5, 32, requires_grad=True)
    q, k, v = mha.project_qkv(x)
    split = lambda t, d: t.view(3, 5, 4, d).transpose(1, 2)  # noqa: E731
    torch.testing.assert_close(q, split(mha.q_proj(x), 8))
    torch.testing.assert_close(k, split(mha.k_proj(x), 8))
    torch.testing.assert_close(v, split(mha.v_proj(x), 6))
    k2, v2 = mha.project_kv(x, x)
    torch.testing.assert_close(k2, k)
    torch.testing.assert_close(v2, v)
    (q.sum() + 2 * k.sum() + 3 * v.sum()).backward()
    torch.testing.assert_close(mha.k_proj.bias.grad, torch.full((32,), 2.0 * 15))
    torch.testing.assert_close(mha.v_proj.bias.grad, torch.full((24,), 3.0 * 15))


def test_evaluation_after_a_fused_adamw_step_sees_the_new_weights():
    """The fused AdamW kernel updates weights in place without bumping their version counter, so
    nothing may cache a function of the weights across steps by version: a no-grad pass after
    an update must equal a fresh model with the updated weights (a cached Q/K/V stack once served
    validation the weights of its first call)."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4)
    x = torch.randn(2, 5, 16)
    opt = torch.optim.AdamW(mha.parameters(), lr=0.1, fused=True)
    with torch.no_grad():
        mha(x, x, x)  # an evaluation before the update
    mha(x, x, x).sum().backward()
    opt.step()
    fresh = MultiHeadAttention(16, 4)
    fresh.load_state_dict(mha.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(mha(x, x, x), fresh(x, x, x), rtol=0, atol=0)
