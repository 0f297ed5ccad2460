"""Encoder and decoder layers (Vaswani et al. 2017, §3.1, Figure 1).

Shape legend: B batch · S source len · T target len · D d_model.

Each sub-layer is wrapped in a residual connection with dropout and layer normalisation.
Post-LN (the paper, and ``torch.nn.TransformerEncoderLayer`` by default):
``LayerNorm(x + Dropout(Sublayer(x)))``. Pre-LN (``norm_first=True``):
``x + Dropout(Sublayer(LayerNorm(x)))``. Tested against ``torch.nn.Transformer``.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.model.attention import MultiHeadAttention
from aiayn.model.cache import LayerCache
from aiayn.model.dropout import Dropout
from aiayn.model.feedforward import PositionwiseFeedForward


class Residual(nn.Module):
    """A residual connection around one sub-layer, post-LN or pre-LN (§3.1, §5.4)."""

    def __init__(self, d_model: int, dropout: float, norm_first: bool, eps: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.dropout = Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


def _attention(cfg: ModelConfig) -> MultiHeadAttention:
    return MultiHeadAttention(
        cfg.d_model, cfg.n_heads, cfg.head_dim_k, cfg.head_dim_v, cfg.attn_dropout, cfg.bias
    )


def _feed_forward(cfg: ModelConfig) -> PositionwiseFeedForward:
    return PositionwiseFeedForward(
        cfg.d_model, cfg.d_ff, cfg.activation, cfg.activation_dropout, cfg.bias
    )


def _residual(cfg: ModelConfig) -> Residual:
    return Residual(cfg.d_model, cfg.dropout, cfg.norm_first, cfg.layer_norm_eps)


class EncoderLayer(nn.Module):
    """Self-attention, then the feed-forward network, each in a residual block (§3.1)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = _attention(cfg)
        self.feed_forward = _feed_forward(cfg)
        self.attn_block, self.ff_block = _residual(cfg), _residual(cfg)

    def forward(
        self, x: Tensor, mask: Tensor | None = None, attn_record: list | None = None
    ) -> Tensor:
        """Shape: x (B, S, D), mask broadcastable to (B, H, S, S) -> (B, S, D).

        When ``attn_record`` is a list, the attention weights (B, H, S, S) are appended to it.
        """

        def self_attention(h: Tensor) -> Tensor:
            q, k, v = self.self_attn.project_qkv(h)
            out, w = self.self_attn.attend(q, k, v, mask, need_weights=attn_record is not None)
            if attn_record is not None:
                attn_record.append(("self", w))
            return out

        x = self.attn_block(x, self_attention)
        return self.ff_block(x, self.feed_forward)


def attend_shared_memory(
    attn: MultiHeadAttention, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, need: bool
) -> tuple[Tensor, Tensor | None]:
    """Cross-attention where g = N / B consecutive query rows (beams) share one memory row.

    Shape: q (N, H, T, K), k/v (B, H, S, K), mask (B, 1, 1, S) -> (N, T, D), weights (N, H, T, S).
    The g beams of a source are attended as g·T queries over its single memory (no copies).
    """
    N, H, T, K = q.shape
    B = k.size(0)
    if N == B:
        return attn.attend(q, k, v, mask, need)
    if N % B:
        raise ValueError(f"{N} decoder rows cannot share {B} memory rows")
    g = N // B
    q = q.view(B, g, H, T, K).transpose(1, 2).reshape(B, H, g * T, K)  # (B, H, g·T, K)
    out, w = attn.attend(q, k, v, mask, need)  # (B, g·T, D)
    out = out.view(N, T, out.size(-1))  # (N, T, D): query rows were (g, T)-ordered
    if w is not None:
        w = w.view(B, H, g, T, -1).transpose(1, 2).reshape(N, H, T, w.size(-1))  # (N, H, T, S)
    return out, w


class DecoderLayer(nn.Module):
    """Masked self-attention, attention over the encoder output, feed-forward (§3.1).

    With ``cross_attention=False`` it is the layer of a decoder-only language model.
    """

    def __init__(self, cfg: ModelConfig, cross_attention: bool = True) -> None:
        super().__init__()
        self.self_attn = _attention(cfg)
        self.self_block = _residual(cfg)
        self.cross_attn = _attention(cfg) if cross_attention else None
        self.cross_block = _residual(cfg) if cross_attention else None
        self.feed_forward = _feed_forward(cfg)
        self.ff_block = _residual(cfg)

    def memory_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Cross-attention keys/values of ``memory`` for a cache: (B, S, D) -> (B, H, S, K) each,
        contiguous, so that every later step's attention matmul reads them as they are (split
        heads of the stacked K/V projection are not)."""
        if self.cross_attn is None:
            raise ValueError("a decoder layer without cross-attention has no memory keys")
        k, v = self.cross_attn.project_kv(memory, memory)
        return k.contiguous(), v.contiguous()

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None,
        tgt_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        cache: LayerCache | None = None,
        attn_record: list | None = None,
    ) -> Tensor:
        """Shape: x (B, T, D), memory (B, S, D), tgt_mask → (B, H, T, t+T), memory_mask → (B, H, T, S)
        -> (B, T, D).

        With a ``cache``, x holds only the new positions; their keys/values are appended to it
        and cross-attention keys/values are projected from ``memory`` only on the first call.
        """
        need = attn_record is not None

        def self_attention(h: Tensor) -> Tensor:
            if cache is not None and cache.qkv is None:
                cache.qkv = self.self_attn.stacked_qkv()  # once per decoding
            q, k, v = self.self_attn.project_qkv(h, cache.qkv if cache is not None else None)
            if cache is not None:
                k, v = cache.append_self(k, v)  # (B, H, t + T, K)
            out, w = self.self_attn.attend(q, k, v, tgt_mask, need_weights=need)
            if attn_record is not None:
                attn_record.append(("self", w))
            return out

        def cross_attention(h: Tensor) -> Tensor:
            assert cross_attn is not None  # called only when there is one
            if cache is not None and cache.cross_k is not None and cache.cross_v is not None:
                k, v = cache.cross_k, cache.cross_v
            elif cache is not None:
                assert memory is not None, "the first cached step needs the memory"
                k, v = cache.cross_k, cache.cross_v = self.memory_kv(memory)
            else:
                assert memory is not None, "the decoder needs the memory"
                k, v = cross_attn.project_kv(memory, memory)  # (B, H, S, K)
            out, w = attend_shared_memory(
                cross_attn, cross_attn.project_q(h), k, v, memory_mask, need
            )
            if attn_record is not None:
                attn_record.append(("cross", w))
            return out

        x = self.self_block(x, self_attention)
        cross_attn, cross_block = self.cross_attn, self.cross_block
        if cross_block is not None:
            x = cross_block(x, cross_attention)
        return self.ff_block(x, self.feed_forward)
