"""Scaled dot-product attention and multi-head attention (Vaswani et al. 2017, §3.2).

Shape legend: B batch · H heads · Tq query len · Tk key len · D d_model · K d_k · Kv d_v.

Tested against ``torch.nn.MultiheadAttention`` (outputs and gradients, weights copied across);
the fast path (``F.scaled_dot_product_attention``) is tested against the explicit math.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# On CPU the explicit math beats the fused kernel for short key sequences (Multi30k sentences are
# ~15 tokens): faster forward+backward up to 64 keys, slower at 256
# (docs/experiments/training_speed.md#what-was-tried-and-what-it-gave). Longer sequences, and
# every CUDA call, take the fused kernel.
EXPLICIT_MAX_KEYS_CPU = 64


def attention_weights(q: Tensor, k: Tensor, mask: Tensor | None = None) -> Tensor:
    """softmax(Q Kᵀ / √d_k) with masked keys removed (Eq. 1). (B,H,Tq,K),(B,H,Tk,K) -> (B,H,Tq,Tk).

    The softmax runs in at least float32. A query row that may attend to nothing
    gets all-zero weights, never NaN.
    """
    scores = (q * q.size(-1) ** -0.5) @ k.transpose(-2, -1)  # (B, H, Tq, Tk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.promote_types(q.dtype, torch.float32))
    weights = weights.to(q.dtype)
    if mask is None:
        return weights
    return weights.masked_fill(dead_queries(mask), 0.0)  # their softmax was NaN


def dead_queries(mask: Tensor) -> Tensor:
    """Queries that may attend to nothing (a fully padded row). (B|1, H|1, Tq|1, Tk) -> same, Tk = 1.

    Always applied, never tested with ``if``: asking whether any row is dead would copy a flag
    from the device to the host, a sync per layer per step (docs/gpu.md).
    """
    return ~mask.any(-1, keepdim=True)


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
    need_weights: bool = False,
    fused: bool | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V (§3.2.1, Eq. 1).

    Shape:
        q (B, H, Tq, K), k (B, H, Tk, K), v (B, H, Tk, Kv),
        mask bool broadcastable to (B, H, Tq, Tk), True = may attend.
        -> output (B, H, Tq, Kv), weights (B, H, Tq, Tk) or None.

    Two paths compute the same thing: the explicit math (which can return the weights) and the
    fused ``F.scaled_dot_product_attention`` kernel. ``fused=None`` picks the faster one for the
    device and length; ``need_weights=True`` forces the explicit path. Either way a query that may
    attend to nothing (a fully padded row) outputs zeros.
    """
    if fused is None:
        fused = not need_weights and (q.device.type != "cpu" or k.size(-2) > EXPLICIT_MAX_KEYS_CPU)
    if not fused:
        weights = attention_weights(q, k, mask)
        if dropout_p > 0.0:
            weights = F.dropout(weights, p=dropout_p)
        return weights @ v, (weights if need_weights else None)  # (B, H, Tq, Kv)
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p), None
    dead = dead_queries(mask)  # (B|1, H|1, Tq|1, 1)
    # Let dead rows attend everywhere (finite), then zero them.
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask | dead, dropout_p=dropout_p)
    return out.masked_fill(dead, 0.0), None


def _stack(projections: tuple[nn.Linear, ...]) -> tuple[Tensor, Tensor | None]:
    """Several linear layers' weights (and biases) stacked, for one matrix multiply.

    Rebuilt on every call in training and for the encoder: a stack kept on the module would need
    to know when the weights change, and the fused AdamW kernel updates them in place without
    bumping their version counter (a cache keyed on it served stale weights to validation). A
    decoding makes its stack once (``LayerCache.qkv``) and drops it with its cache.
    """
    weight = torch.cat([p.weight for p in projections])
    bias = None if projections[0].bias is None else torch.cat([p.bias for p in projections])
    return weight, bias


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, …, head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    Vaswani et al. 2017, §3.2.2. ``d_k`` and ``d_v`` are independent of ``d_model / n_heads``.
    Keys/values can be projected once and reused (:meth:`project_kv`), which is how the decoder
    cache avoids recomputing them. Reference: ``torch.nn.MultiheadAttention``.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_k: int | None = None,
        d_v: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        if d_k is None:
            if d_model % n_heads:
                raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
            d_k = d_model // n_heads
        d_v = d_k if d_v is None else d_v
        self.n_heads, self.d_k, self.d_v, self.dropout = n_heads, d_k, d_v, dropout
        self.q_proj = nn.Linear(d_model, n_heads * d_k, bias=bias)
        self.k_proj = nn.Linear(d_model, n_heads * d_k, bias=bias)
        self.v_proj = nn.Linear(d_model, n_heads * d_v, bias=bias)
        self.out_proj = nn.Linear(n_heads * d_v, d_model, bias=bias)

    def _split(self, x: Tensor, d_head: int) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, d_head).transpose(1, 2)  # (B, H, T, d_head)

    def project_q(self, query: Tensor) -> Tensor:
        """(B, Tq, D) -> (B, H, Tq, K)."""
        return self._split(self.q_proj(query), self.d_k)

    def project_kv(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """(B, Tk, D), (B, Tk, D) -> k (B, H, Tk, K), v (B, H, Tk, Kv).

        When ``key is value`` (self-attention, the decoder's memory) both projections run as one
        matrix multiply over the stacked weights: the same values, one GEMM instead of two.
        """
        if key is not value:
            return self._split(self.k_proj(key), self.d_k), self._split(
                self.v_proj(value), self.d_v
            )
        k, v = self._fused(key, (self.k_proj, self.v_proj))
        return self._split(k, self.d_k), self._split(v, self.d_v)

    def project_qkv(
        self, x: Tensor, stacked: tuple[Tensor, Tensor | None] | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention's three projections of x as one matrix multiply, over ``stacked``
        (:meth:`stacked_qkv`, made once by a decoding) when given.
        (B, T, D) -> q (B, H, T, K), k (B, H, T, K), v (B, H, T, Kv)."""
        weight, bias = stacked or self.stacked_qkv()
        q, k, v = F.linear(x, weight, bias).split(self._qkv_sizes(), dim=-1)
        return self._split(q, self.d_k), self._split(k, self.d_k), self._split(v, self.d_v)

    def stacked_qkv(self) -> tuple[Tensor, Tensor | None]:
        """The q, k, v projections' weights (3 · H · K, D) and biases stacked: one GEMM."""
        return _stack((self.q_proj, self.k_proj, self.v_proj))

    def _qkv_sizes(self) -> list[int]:
        return [self.q_proj.out_features, self.k_proj.out_features, self.v_proj.out_features]

    @staticmethod
    def _fused(x: Tensor, projections: tuple[nn.Linear, ...]) -> tuple[Tensor, ...]:
        """x through several linear layers at once: weights stacked, output split back."""
        weight, bias = _stack(projections)
        return F.linear(x, weight, bias).split([p.out_features for p in projections], dim=-1)

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attention over projected heads, then the output projection.

        Shape: q (B, H, Tq, K), k (B, H, Tk, K), v (B, H, Tk, Kv) -> (B, Tq, D), weights or None.
        """
        p = self.dropout if self.training else 0.0
        heads, weights = scaled_dot_product_attention(q, k, v, mask, p, need_weights)
        B, _, Tq, _ = heads.shape
        concat = heads.transpose(1, 2).reshape(B, Tq, self.n_heads * self.d_v)  # (B, Tq, H*Kv)
        return self.out_proj(concat), weights

    def forward(
        self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None
    ) -> Tensor:
        """Shape: query (B, Tq, D), key/value (B, Tk, D), mask -> (B, Tq, D)."""
        out, _ = self.attend(self.project_q(query), *self.project_kv(key, value), mask)
        return out
