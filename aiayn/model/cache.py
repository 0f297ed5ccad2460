"""The decoder's incremental-decoding cache: an explicit object, never hidden module state.

Shape legend: B batch (× beams) · H heads · t tokens decoded so far · S source len · K/Kv head dims.

Self-attention keys/values grow by the new tokens at every step; cross-attention keys/values are
projected from the encoder memory once. ``reorder(index)`` selects batch rows, which is how beam
search follows the surviving hypotheses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class LayerCache:
    """One decoder layer's keys and values, each (B, H, ·, K or Kv)."""

    self_k: Tensor | None = None
    self_v: Tensor | None = None
    cross_k: Tensor | None = None
    cross_v: Tensor | None = None

    def append_self(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add this step's self-attention keys/values; return all of them so far."""
        if self.self_k is not None:
            k = torch.cat([self.self_k, k], dim=2)  # (B, H, t + new, K)
            v = torch.cat([self.self_v, v], dim=2)
        self.self_k, self.self_v = k, v
        return k, v


@dataclass
class DecoderCache:
    """Everything the decoder needs to continue from position ``length``."""

    layers: list[LayerCache]
    memory_mask: Tensor | None = None  # (B, 1, 1, S), True = real source token
    length: int = 0  # tokens decoded so far (the position of the next token)

    @classmethod
    def empty(cls, n_layers: int, memory_mask: Tensor | None = None) -> "DecoderCache":
        return cls([LayerCache() for _ in range(n_layers)], memory_mask)

    def reorder(self, index: Tensor) -> "DecoderCache":
        """Keep batch rows ``index`` (LongTensor (B',)), in that order; in place, returns self."""
        for layer in self.layers:
            for name in ("self_k", "self_v", "cross_k", "cross_v"):
                t = getattr(layer, name)
                if t is not None:
                    setattr(layer, name, t.index_select(0, index))
        if self.memory_mask is not None:
            self.memory_mask = self.memory_mask.index_select(0, index)
        return self
