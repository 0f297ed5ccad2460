"""Parity with PyTorch's own implementation: nn.MultiheadAttention and nn.Transformer."""

import pytest
import torch
from torch import nn

from aiayn import ModelConfig
from aiayn.model import Decoder, Encoder, MultiHeadAttention
from aiayn.model.attention import scaled_dot_product_attention
from aiayn.model.masks import causal_mask, padding_mask

D, H = 32, 4


def copy_mha(ours: MultiHeadAttention, ref: nn.MultiheadAttention) -> None:
    """nn.MultiheadAttention packs q, k, v projections in one in_proj."""
    wq, wk, wv = ref.in_proj_weight.chunk(3)
    bq, bk, bv = ref.in_proj_bias.chunk(3)
    with torch.no_grad():
        for lin, w, b in ((ours.q_proj, wq, bq), (ours.k_proj, wk, bk), (ours.v_proj, wv, bv)):
            lin.weight.copy_(w)
            lin.bias.copy_(b)
        ours.out_proj.weight.copy_(ref.out_proj.weight)
        ours.out_proj.bias.copy_(ref.out_proj.bias)


@pytest.mark.parametrize("masking", ["none", "padding", "causal", "both"])
def test_multihead_attention_matches_torch_outputs_and_gradients(masking):
    B, Tq, Tk = 3, 5, 7
    ref = nn.MultiheadAttention(D, H, batch_first=True)
    ours = MultiHeadAttention(D, H)
    copy_mha(ours, ref)
    q = torch.randn(B, Tq, D, requires_grad=True)
    kv = torch.randn(B, Tk, D, requires_grad=True)
    q_ref, kv_ref = q.detach().clone().requires_grad_(), kv.detach().clone().requires_grad_()
    lengths = torch.tensor([7, 4, 2])
    keep = torch.arange(Tk)[None, :] < lengths[:, None]  # (B, Tk) True = real
    causal = causal_mask(Tq, offset=Tk - Tq)[0, 0]  # (Tq, Tk)

    mask, kpm, am = None, None, None
    if masking in ("padding", "both"):
        mask, kpm = keep[:, None, None, :], ~keep  # torch: True = ignore
    if masking in ("causal", "both"):
        mask = causal[None, None] if mask is None else mask & causal[None, None]
        am = ~causal
    out = ours(q, kv, kv, mask)
    expected, _ = ref(q_ref, kv_ref, kv_ref, key_padding_mask=kpm, attn_mask=am, need_weights=False)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)

    grad = torch.randn_like(out)
    out.backward(grad)
    expected.backward(grad)
    torch.testing.assert_close(q.grad, q_ref.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(kv.grad, kv_ref.grad, atol=1e-5, rtol=1e-4)
    wq_ref = ref.in_proj_weight.grad.chunk(3)[0]
    torch.testing.assert_close(ours.q_proj.weight.grad, wq_ref, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(ours.out_proj.weight.grad, ref.out_proj.weight.grad, atol=1e-5, rtol=1e-4)


def copy_layer_weights(ours_layer, ref_layer, decoder: bool) -> None:
    copy_mha(ours_layer.self_attn, ref_layer.self_attn)
    blocks = [ours_layer.self_block if decoder else ours_layer.attn_block]
    if decoder:
        copy_mha(ours_layer.cross_attn, ref_layer.multihead_attn)
        blocks.append(ours_layer.cross_block)
    blocks.append(ours_layer.ff_block)
    refs = [ref_layer.norm1, ref_layer.norm2] + ([ref_layer.norm3] if decoder else [])
    with torch.no_grad():
        for block, norm in zip(blocks, refs):
            block.norm.load_state_dict(norm.state_dict())
        ours_layer.feed_forward.linear1.load_state_dict(ref_layer.linear1.state_dict())
        ours_layer.feed_forward.linear2.load_state_dict(ref_layer.linear2.state_dict())


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_decoder_stack_matches_nn_transformer(norm_first):
    cfg = ModelConfig(src_vocab_size=50, tgt_vocab_size=50, d_model=D, n_heads=H, d_ff=64,
                      n_encoder_layers=2, n_decoder_layers=3, dropout=0.0, norm_first=norm_first)
    ref = nn.Transformer(D, H, 2, 3, 64, dropout=0.0, batch_first=True, norm_first=norm_first)
    if not norm_first:
        # The paper's post-LN stack has no final LayerNorm; nn.Transformer always adds one.
        ref.encoder.norm, ref.decoder.norm = nn.Identity(), nn.Identity()
    enc, dec = Encoder(cfg), Decoder(cfg)
    for ours, theirs in zip(enc.layers, ref.encoder.layers):
        copy_layer_weights(ours, theirs, decoder=False)
    for ours, theirs in zip(dec.layers, ref.decoder.layers):
        copy_layer_weights(ours, theirs, decoder=True)
    if norm_first:
        enc.norm.load_state_dict(ref.encoder.norm.state_dict())
        dec.norm.load_state_dict(ref.decoder.norm.state_dict())

    B, S, T = 3, 6, 5
    src, tgt = torch.randn(B, S, D), torch.randn(B, T, D)
    src_ids = torch.tensor([[5] * 6, [5] * 4 + [0] * 2, [5] * 1 + [0] * 5])
    tgt_ids = torch.tensor([[5] * 5, [5] * 3 + [0] * 2, [5] * 5])
    src_keep, tgt_keep = src_ids != 0, tgt_ids != 0
    memory = enc(src, padding_mask(src_ids, 0))
    out = dec(tgt, memory, causal_mask(T) & padding_mask(tgt_ids, 0), padding_mask(src_ids, 0))
    expected = ref(src, tgt, tgt_mask=~causal_mask(T)[0, 0], src_key_padding_mask=~src_keep,
                   tgt_key_padding_mask=~tgt_keep, memory_key_padding_mask=~src_keep)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("with_mask", [False, True])
def test_fast_attention_path_equals_explicit_math(with_mask):
    B, Tq, Tk, K = 2, 4, 6, 8
    q, k, v = torch.randn(B, H, Tq, K), torch.randn(B, H, Tk, K), torch.randn(B, H, Tk, 5)
    mask = (torch.rand(B, 1, Tq, Tk) > 0.3) if with_mask else None
    fast, none = scaled_dot_product_attention(q, k, v, mask, fused=True)
    slow, weights = scaled_dot_product_attention(q, k, v, mask, need_weights=True)
    assert none is None and weights.shape == (B, H, Tq, Tk)
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)
    rows = weights.sum(-1)  # (B, H, Tq): each row of weights sums to 1 where anything is visible
    alive = mask.any(-1).expand_as(rows) if with_mask else torch.ones_like(rows, dtype=torch.bool)
    torch.testing.assert_close(rows[alive], torch.ones_like(rows[alive]))


def test_independent_head_dims():
    mha = MultiHeadAttention(d_model=24, n_heads=3, d_k=5, d_v=7)
    assert mha.q_proj.out_features == 15 and mha.v_proj.out_features == 21
    assert mha(torch.randn(2, 4, 24), torch.randn(2, 6, 24), torch.randn(2, 6, 24)).shape == (2, 4, 24)
