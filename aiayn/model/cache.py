"""The decoder's incremental-decoding cache: an explicit object, never hidden module state.

Shape legend: B batch (× beams) · H heads · t tokens decoded so far · S source len · K/Kv head dims.

Self-attention keys/values grow by the new tokens at every step; cross-attention keys/values are
projected from the encoder memory once. ``reorder(index)`` selects batch rows, which is how beam
search follows the surviving hypotheses.

Beams share their source: with ``beam = k`` the cache holds B·k self-attention rows (rows
b·k … b·k + k-1 belong to sentence b) but only B rows of cross-attention keys/values and memory
mask, and the decoder attends the k beams of a sentence as k queries over that one memory. Beam
moves then copy no cross-attention state; only sentences leaving the batch do.
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
    beam: int = 1  # decoder rows per source row (memory, cross K/V, memory_mask)

    @classmethod
    def empty(cls, n_layers: int, memory_mask: Tensor | None = None) -> "DecoderCache":
        return cls([LayerCache() for _ in range(n_layers)], memory_mask)

    def with_beam(self, beam: int) -> "DecoderCache":
        """Decode ``beam`` rows per source row (before the first step); returns self."""
        if self.length or any(layer.self_k is not None for layer in self.layers):
            raise ValueError("with_beam() must be called on an empty cache")
        if beam < 1:
            raise ValueError(f"beam must be >= 1, got {beam}")
        self.beam = beam
        return self

    def reorder(self, index: Tensor) -> "DecoderCache":
        """Keep decoder rows ``index`` (LongTensor (N',)), in that order; in place, returns self.

        With ``beam = k`` each consecutive group of k indices must come from one source row
        (beam moves, sentences leaving); cross-attention state is then copied only when the set
        of source rows changes.
        """
        source = self._source_rows(index)
        for layer in self.layers:
            layer.self_k, layer.self_v = _select(layer.self_k, index), _select(layer.self_v, index)
            if source is not None:
                layer.cross_k, layer.cross_v = _select(layer.cross_k, source), _select(layer.cross_v, source)
        if source is not None:
            self.memory_mask = _select(self.memory_mask, source)
        return self

    def _source_rows(self, index: Tensor) -> Tensor | None:
        """The source rows ``index`` keeps, (N'/k,); None when they are unchanged."""
        if self.beam == 1:
            return index
        if index.numel() % self.beam:
            raise ValueError(f"reorder index of {index.numel()} rows is not a multiple of beam={self.beam}")
        groups = index.view(-1, self.beam) // self.beam  # (N'/k, k)
        if not bool((groups == groups[:, :1]).all()):
            raise ValueError("reorder index mixes rows of different source sentences")
        source = groups[:, 0]
        known = [t for t in (self.memory_mask, self.layers[0].cross_k if self.layers else None)
                 if t is not None]
        n_source = known[0].size(0) if known else None
        if n_source == source.numel() and bool((source == torch.arange(n_source, device=source.device)).all()):
            return None
        return source


def _select(t: Tensor | None, index: Tensor) -> Tensor | None:
    return None if t is None else t.index_select(0, index)
