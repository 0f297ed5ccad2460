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

from dataclasses import dataclass, field

import torch
from torch import Tensor

from aiayn.model.packed import PackedLinear


@dataclass
class LayerCache:
    """One decoder layer's keys and values, each (B, H, ·, K or Kv).

    Self-attention keys/values live in buffers with room for more positions (doubling when
    full): ``self_k``/``self_v`` are views of their first t positions, so appending a step
    writes only the new position, and a reorder copies each kept row once, straight into the
    new buffers, instead of a concatenation and then a selection copying everything twice.
    A reorder writes into the buffers the keys/values left at the previous reorder (when they
    have the room and enough rows), so the two buffers of each alternate instead of a new one
    being allocated and first written at every step.
    Two caches must not share a buffer (a shallow copy that both append to would write the same
    positions), and a view taken from a cache is valid until the second reorder after it.
    """

    self_k: Tensor | None = None
    self_v: Tensor | None = None
    cross_k: Tensor | None = None
    cross_v: Tensor | None = None
    # The buffers self_k/self_v lived in before the last reorder: the next reorder's destination.
    spare: list[Tensor | None] = field(default_factory=lambda: [None, None], repr=False)

    def append_self(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add this step's self-attention keys/values; return all of them so far."""
        self.self_k = _append(self.self_k, k)  # (B, H, t + new, K)
        self.self_v = _append(self.self_v, v)
        return self.self_k, self.self_v

    def reorder_self(self, index: Tensor) -> None:
        """Keep self-attention rows ``index`` (with their room to grow)."""
        self.self_k, self.spare[0] = _select_rows(self.self_k, index, self.spare[0])
        self.self_v, self.spare[1] = _select_rows(self.self_v, index, self.spare[1])


MIN_ROOM = 16  # positions a self-attention buffer holds at first


def _room(t: Tensor) -> int:
    """Positions the (B, H, room, K) buffer behind a (B, H, t, K) view of its first t positions
    holds; 0 when t is not such a view (a tensor set by hand): nothing may be written past it."""
    B, H, _, K = t.shape
    room = t.stride(1) // K if K else 0
    return room if room >= t.size(2) and t.stride() == (H * room * K, room * K, K, 1) else 0


def _buffer_like(t: Tensor, rows: int, room: int) -> Tensor:
    """An empty (rows, H, room, K) buffer for t's keys or values."""
    return t.new_empty(rows, t.size(1), room, t.size(3))


def _append(cached: Tensor | None, new: Tensor) -> Tensor:
    """cached (B, H, t, K) + new (B, H, n, K) -> a view of (B, H, t + n, K) positions."""
    t = 0 if cached is None else cached.size(2)
    n = new.size(2)
    if cached is None or t + n > _room(cached):
        buf = _buffer_like(new, new.size(0), max(MIN_ROOM, 2 * (t + n)))
        if cached is not None:
            buf[:, :, :t] = cached
        cached = buf[:, :, :t]
    out = cached.as_strided(
        (cached.size(0), cached.size(1), t + n, cached.size(3)), cached.stride()
    )
    out[:, :, t:] = new
    return out


def _select_rows(
    cached: Tensor | None, index: Tensor, spare: Tensor | None
) -> tuple[Tensor | None, Tensor | None]:
    """Rows ``index`` of a (B, H, t, K) view, copied once into a buffer of the same room: the
    first rows of ``spare`` (B'', H, room, K) when it fits, else a new one. Returns the copy and
    the next spare (the whole buffer behind ``cached``)."""
    if cached is None:
        return None, spare
    ours = _room(cached)
    rows, room = index.numel(), ours or cached.size(2)
    shape = (cached.size(1), room, cached.size(3))
    if (
        spare is None
        or spare.size(0) < rows
        or spare.shape[1:] != shape
        or spare.dtype != cached.dtype
        or spare.device != cached.device
    ):
        spare = _buffer_like(cached, rows, room)
    out = spare[:rows, :, : cached.size(2)]
    torch.index_select(cached, 0, index, out=out)
    if not ours:  # not a buffer of ours: nothing to reuse
        return out, None
    B, H, _, K = cached.shape
    return out, cached.as_strided((B, H, room, K), cached.stride())


@dataclass
class DecoderCache:
    """Everything the decoder needs to continue from position ``length``."""

    layers: list[LayerCache]
    memory_mask: Tensor | None = None  # (B, 1, 1, S), True = real source token
    length: int = 0  # tokens decoded so far (the position of the next token)
    beam: int = 1  # decoder rows per source row (memory, cross K/V, memory_mask)
    # The output projection packed for this decoding (aiayn/model/packed.py), made at the first
    # step; None until then, and where no packed linear can run.
    output: PackedLinear | None = field(default=None, repr=False)

    @classmethod
    def empty(cls, n_layers: int, memory_mask: Tensor | None = None) -> DecoderCache:
        return cls([LayerCache() for _ in range(n_layers)], memory_mask)

    def with_beam(self, beam: int) -> DecoderCache:
        """Decode ``beam`` rows per source row (before the first step); returns self."""
        if self.length or any(layer.self_k is not None for layer in self.layers):
            raise ValueError("with_beam() must be called on an empty cache")
        if beam < 1:
            raise ValueError(f"beam must be >= 1, got {beam}")
        self.beam = beam
        return self

    def reorder(self, index: Tensor) -> DecoderCache:
        """Keep decoder rows ``index`` (LongTensor (N',)), in that order; in place, returns self.

        With ``beam = k`` each consecutive group of k indices must come from one source row
        (beam moves, sentences leaving); cross-attention state is then copied only when the set
        of source rows changes.
        """
        source = self._source_rows(index)
        for layer in self.layers:
            layer.reorder_self(index)
            if source is not None:
                layer.cross_k, layer.cross_v = (
                    _select(layer.cross_k, source),
                    _select(layer.cross_v, source),
                )
        if source is not None:
            self.memory_mask = _select(self.memory_mask, source)
        return self

    def _source_rows(self, index: Tensor) -> Tensor | None:
        """The source rows ``index`` keeps, (N'/k,); None when they are unchanged.

        The decoder rows so far are k per source row, or one per source row after a first step
        fed that way (then ``index`` expands them to k).
        """
        if self.beam == 1:
            return index
        if index.numel() % self.beam:
            raise ValueError(
                f"reorder index of {index.numel()} rows is not a multiple of beam={self.beam}"
            )
        known = [
            t
            for t in (self.memory_mask, self.layers[0].cross_k if self.layers else None)
            if t is not None
        ]
        n_source = known[0].size(0) if known else None
        rows = (
            self.layers[0].self_k.size(0)
            if self.layers and self.layers[0].self_k is not None
            else None
        )
        per_source = 1 if rows is not None and rows == n_source else self.beam
        groups = index.view(-1, self.beam) // per_source  # (N'/k, k)
        source = groups[:, 0]
        # Both checks come to the host in one copy: one host-device sync per reorder.
        checks = [(groups != groups[:, :1]).any()]
        if n_source == source.numel():
            checks.append((source == torch.arange(n_source, device=source.device)).all())
        mixed, *unchanged = torch.stack(checks).tolist()
        if mixed:
            raise ValueError("reorder index mixes rows of different source sentences")
        return None if unchanged and unchanged[0] else source


def _select(t: Tensor | None, index: Tensor) -> Tensor | None:
    return None if t is None else t.index_select(0, index)
