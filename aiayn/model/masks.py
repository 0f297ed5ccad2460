"""Attention masks, built in one place.

Shape legend: B batch · S source len · T target len · H heads.

One convention across aiayn: a mask is a bool tensor, ``True`` = may attend, broadcastable to
``(B, H, Tq, Tk)`` — the convention of ``torch.nn.functional.scaled_dot_product_attention``.
(``torch.nn.MultiheadAttention`` uses the opposite meaning; convert only when comparing with it.)
"""

from __future__ import annotations

import torch
from torch import Tensor


def padding_mask(ids: Tensor, pad_id: int) -> Tensor:
    """Keys that are real tokens. ``ids`` (B, S) -> (B, 1, 1, S)."""
    return (ids != pad_id)[:, None, None, :]  # (B, 1, 1, S)


def causal_mask(length: int, device: torch.device | None = None, offset: int = 0) -> Tensor:
    """Query i (absolute position offset + i) may attend keys 0 … offset + i (§3.2.3).

    Returns (1, 1, length, offset + length).
    """
    q = torch.arange(offset, offset + length, device=device)[:, None]
    k = torch.arange(offset + length, device=device)[None, :]
    return (k <= q)[None, None]  # (1, 1, T, offset + T)


def target_mask(tgt: Tensor, pad_id: int) -> Tensor:
    """Decoder self-attention mask: causal and no padded keys. ``tgt`` (B, T) -> (B, 1, T, T)."""
    return causal_mask(tgt.size(1), tgt.device) & padding_mask(tgt, pad_id)


def as_attention_mask(mask: Tensor | None) -> Tensor | None:
    """Accept a key mask (B, Tk) or any 4-d mask, and return it broadcastable to (B, H, Tq, Tk)."""
    if mask is None:
        return None
    if mask.dtype != torch.bool:
        raise ValueError(f"masks are bool (True = may attend), got dtype {mask.dtype}")
    if mask.dim() == 2:
        return mask[:, None, None, :]  # (B, 1, 1, Tk)
    if mask.dim() == 3:
        return mask[:, None]  # (B, 1, Tq, Tk)
    if mask.dim() == 4:
        return mask
    raise ValueError(f"a mask must have 2, 3 or 4 dimensions, got shape {tuple(mask.shape)}")
