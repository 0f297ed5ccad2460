"""The decoder's incremental-decoding cache: an explicit object, never hidden module state.

Shape legend: B batch (× beams) · H heads · t tokens decoded so far · S source len · K/Kv head dims.

Self-attention keys/values grow by the new tokens at every step; cross-attention keys/values are
projected from the encoder memory once. ``reorder(index)`` selects batch rows, which is how beam
search follows the surviving hypotheses.

Beams share their source: with ``beam = k`` the cache holds B·k self-attention rows (rows
b·k … b·k + k-1 belong to sentence b) but only B rows of cross-attention keys/values and memory
mask, and the decoder attends the k beams of a sentence as k queries over that one memory. Beam
moves then copy no cross-attention state; only sentences leaving the batch do.

Rows may join a cache that is running (the server's step-level batching, :meth:`DecoderCache.
extend`): a row that joins at length t has offset t, reads position ``length - offset`` from the
positional table, and its self-attention keys before its offset (zeros) are masked; its
cross-attention keys/values and memory mask are padded to the longest source (masked). Once the
rows that joined first have left, :meth:`DecoderCache.trim` drops the positions no row reads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from aiayn.model.masks import causal_mask


@dataclass
class LayerCache:
    """One decoder layer's keys and values, each (B, H, ·, K or Kv).

    Self-attention keys/values live in buffers with room for more positions: ``self_k``/``self_v``
    are views of their first t positions, so appending a step writes only the new position. A
    reorder (beam search's every step) copies the kept rows once, straight into new buffers with
    room for exactly one more position (the next step's), and drops the old ones: the cache holds
    what it has decoded and no more, and a reorder's transient is one layer's keys or values.
    (Keeping the old buffers for the next reorder to write into, and doubling the room, had held
    up to 4x that, a large share of a 2-worker decoding's peak RSS:
    docs/experiments/decoding_speed.md#native-decoding-against-ctranslate2-where-the-time-and-the-memory-went-2026-11-26.)
    Appends that outgrow the room (greedy search, several tokens at once) double it.
    Two caches must not share a buffer (a shallow copy that both append to would write the same
    positions).
    """

    self_k: Tensor | None = None
    self_v: Tensor | None = None
    cross_k: Tensor | None = None
    cross_v: Tensor | None = None
    # The self-attention q/k/v weights and biases stacked, made at the first step of a decoding
    # (MultiHeadAttention.stacked_qkv) instead of at every step.
    qkv: tuple[Tensor, Tensor | None] | None = field(default=None, repr=False)

    def append_self(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add this step's self-attention keys/values; return all of them so far."""
        self.self_k = _append(self.self_k, k)  # (B, H, t + new, K)
        self.self_v = _append(self.self_v, v)
        return self.self_k, self.self_v

    def reorder_self(self, index: Tensor, spare: int = 0) -> None:
        """Keep self-attention rows ``index``, with room for one more position (and ``spare``
        more rows, for rows that join: DecoderCache.extend)."""
        self.self_k = _select_rows(self.self_k, index, spare)
        self.self_v = _select_rows(self.self_v, index, spare)


MIN_ROOM = 16  # positions a self-attention buffer holds at first
NARROW_AT = 4  # padded source positions that DecoderCache.reorder lets pile up before dropping


def _room(t: Tensor) -> int:
    """Positions the (B, H, room, K) buffer behind a (B, H, t, K) view of its first t positions
    holds; 0 when t is not such a view (a tensor set by hand): nothing may be written past it."""
    B, H, _, K = t.shape
    room = t.stride(1) // K if K else 0
    return room if room >= t.size(2) and t.stride() == (H * room * K, room * K, K, 1) else 0


def whole_buffer(t: Tensor) -> Tensor:
    """The contiguous (B, H, R, K) buffer whose first t positions the (B, H, t, K) view ``t``
    is, R its room; a contiguous copy of ``t`` when it is no such view (a tensor set by hand)."""
    room = _room(t)
    if not room:
        return t.contiguous()
    return t.as_strided((t.size(0), t.size(1), room, t.size(3)), t.stride())


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


def _with_rows(cached: Tensor | None, rows: int) -> Tensor | None:
    """``cached`` (N, H, t, K) followed by ``rows`` rows of zeros (keys that no query reads:
    masked, and zeros so that their weight 0 never meets a NaN), in a new buffer with room for
    one more position; returns the view of its first t positions."""
    if cached is None:
        return None
    n, t = cached.size(0), cached.size(2)
    if _room(cached) > t and _rows(cached) >= n + rows:  # the buffer's spare rows: no copy
        out = cached.as_strided((n + rows, *cached.shape[1:]), cached.stride())
    else:
        out = _buffer_like(cached, n + rows, t + 1)[:, :, :t]
        out[:n] = cached
    out[n:] = 0
    return out


def _rows(t: Tensor) -> int:
    """Rows the buffer behind a (N, H, t, K) view holds from its first row on."""
    return (t.untyped_storage().nbytes() // t.element_size() - t.storage_offset()) // t.stride(0)


def _keep_positions(cached: Tensor | None, first: int) -> Tensor | None:
    """Positions ``first`` … t-1 of a (N, H, t, K) view, copied into a new buffer with room for
    one more (a slice of the old buffer would have no room behind it)."""
    if cached is None:
        return None
    t = cached.size(2) - first
    out = _buffer_like(cached, cached.size(0), t + 1)[:, :, :t]
    out.copy_(cached[:, :, first:])
    return out


def _pad_source(t: Tensor, dim: int, length: int, value: float | bool) -> Tensor:
    """``t`` padded with ``value`` along ``dim`` to ``length`` source positions."""
    if t.size(dim) == length:
        return t
    shape = list(t.shape)
    shape[dim] = length - t.size(dim)
    return torch.cat([t, t.new_full(shape, value)], dim=dim)


def _select_rows(cached: Tensor | None, index: Tensor, spare: int = 0) -> Tensor | None:
    """Rows ``index`` of a (B, H, t, K) view, copied once into a new (B' + spare, H, t + 1, K)
    buffer; returns the view of its first B' rows and t positions."""
    if cached is None:
        return None
    t = cached.size(2)
    out = _buffer_like(cached, index.numel() + spare, t + 1)[: index.numel(), :, :t]
    return torch.index_select(cached, 0, index, out=out)


@dataclass
class DecoderCache:
    """Everything the decoder needs to continue from position ``length``."""

    layers: list[LayerCache]
    memory_mask: Tensor | None = None  # (B, 1, 1, S), True = real source token
    length: int = 0  # tokens decoded so far (the position of the next token)
    beam: int = 1  # decoder rows per source row (memory, cross K/V, memory_mask)
    # The output projection as this decoding computes it (the same values: a copy packed for
    # oneDNN, aiayn/decode/packed.py), given by the decoding at its first step; None: the
    # model's own layer.
    output: Callable[[Tensor], Tensor] | None = field(default=None, repr=False)
    # (N,) per decoder row, on the device: the length at which the row joined (extend); None
    # while every row started at 0
    offsets: Tensor | None = None

    def positions(self) -> int | Tensor:
        """The position of each row's next token: ``length``, or (N,) ``length - offsets``."""
        return self.length if self.offsets is None else self.length - self.offsets

    def self_mask(self, new: int, device: torch.device) -> Tensor | None:
        """The self-attention mask of ``new`` tokens fed now, (N, 1, new, length + new): causal,
        and no key before its row's offset; None for one token when no row joined later."""
        mask = None if new == 1 else causal_mask(new, device, self.length)  # (1, 1, new, t)
        if self.offsets is not None:
            keys = torch.arange(self.length + new, device=device)
            joined = (keys >= self.offsets[:, None])[:, None, None, :]  # (N, 1, 1, t)
            mask = joined if mask is None else mask & joined
        return mask

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
        if self.offsets is not None:
            self.offsets = self.offsets.index_select(0, index)
        # A cache that rows join keeps spare rows for the next ones (a quarter more): joining
        # then writes into them instead of copying every row (DecoderCache.extend)
        spare = 0 if self.offsets is None else max(index.numel() // 4, 8 * self.beam)
        for layer in self.layers:
            layer.reorder_self(index, spare)
            if source is not None:
                layer.cross_k, layer.cross_v = (
                    _select(layer.cross_k, source),
                    _select(layer.cross_v, source),
                )
        if source is not None:
            self.memory_mask = _select(self.memory_mask, source)
            if self.offsets is not None:  # rows join and leave: the longest may have left
                self._narrow_source()
        return self

    def _narrow_source(self) -> None:
        """Drop the trailing source positions that are padding in every row (the rows with the
        longest sources have left), once they are a quarter of the width and at least
        ``NARROW_AT``: cross-attention then costs the longest source among the rows decoding,
        not the longest one this cache ever held (a server's running batch never empties under
        steady traffic). Padded positions are masked, so no row's output changes."""
        if self.memory_mask is None or not self.layers or self.layers[0].cross_k is None:
            return
        width = self.memory_mask.size(-1)
        read = self.memory_mask.reshape(-1, width).any(0).nonzero()  # (s, 1) positions read
        used = int(read[-1]) + 1 if read.numel() else width  # one copy to the host
        if width - used < max(NARROW_AT, width // 4):
            return
        for layer in self.layers:  # (B, H, S, K) -> (B, H, used, K)
            layer.cross_k = layer.cross_k[:, :, :used].contiguous()  # type: ignore[index]
            layer.cross_v = layer.cross_v[:, :, :used].contiguous()  # type: ignore[index]
        self.memory_mask = self.memory_mask[..., :used].contiguous()  # (B, 1, 1, used)

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
        k = self.beam
        per_source = 1 if rows is not None and rows == n_source else k
        # The index comes to the host in one copy (one host-device sync per reorder) and is
        # checked there: N' small ints, cheaper than the ~10 tensor ops of checking it on the
        # device (a beam step's reorder at batch 1, docs/experiments/decoding_speed.md).
        groups = [i // per_source for i in index.tolist()]  # each row's source row
        if any(g != groups[j - j % k] for j, g in enumerate(groups)):
            raise ValueError("reorder index mixes rows of different source sentences")
        if n_source is not None and groups[::k] == list(range(n_source)):
            return None
        return index.view(-1, k)[:, 0] // per_source  # (N'/k,)

    def extend(self, other: DecoderCache) -> DecoderCache:
        """Append ``other``'s rows, new sentences that join this decoding now (in place, returns
        self). ``other``: a cache of the same model and beam, at length 0, with its
        cross-attention keys/values already projected (``Transformer.project_memory``); it gets
        the same number of decoder rows per source row as this one has."""
        if other.length or other.beam != self.beam or len(other.layers) != len(self.layers):
            raise ValueError("extend() takes a fresh cache of the same model and beam")
        if any(layer.cross_k is None for layer in other.layers):
            raise ValueError("extend() needs the new rows' cross-attention keys/values")
        n_source = self.layers[0].cross_k.size(0) if self.layers[0].cross_k is not None else 0
        b = other.layers[0].cross_k.size(0)  # type: ignore[union-attr]
        first = self.layers[0].self_k
        per_source = 1 if first is None or not n_source else first.size(0) // n_source
        if first is not None:
            n, new = first.size(0), b * per_source
            joined = torch.full((new,), self.length, dtype=torch.long, device=first.device)
            before = self.offsets if self.offsets is not None else joined.new_zeros(n)
            self.offsets = torch.cat([before, joined])
        width = max(
            other.layers[0].cross_k.size(2),  # type: ignore[union-attr]
            0 if self.layers[0].cross_k is None else self.layers[0].cross_k.size(2),
        )
        for mine, theirs in zip(self.layers, other.layers):
            if first is not None:
                mine.self_k = _with_rows(mine.self_k, new)
                mine.self_v = _with_rows(mine.self_v, new)
            mine.cross_k, mine.cross_v = (
                _cat_padded(mine.cross_k, theirs.cross_k, 2, width, 0.0),
                _cat_padded(mine.cross_v, theirs.cross_v, 2, width, 0.0),
            )
        self.memory_mask = _cat_padded(self.memory_mask, other.memory_mask, 3, width, False)
        return self

    def trim(self, n: int) -> DecoderCache:
        """Drop the first ``n`` positions, which no row reads any more (every row joined at or
        after ``n``); in place, returns self. Positions stay those of each row's own tokens."""
        if n <= 0:
            return self
        if self.offsets is None or n > self.length:
            raise ValueError(f"trim({n}): rows of this cache read those positions")
        for layer in self.layers:
            layer.self_k = _keep_positions(layer.self_k, n)
            layer.self_v = _keep_positions(layer.self_v, n)
        self.length -= n
        self.offsets = self.offsets - n
        return self


def _cat_padded(
    a: Tensor | None, b: Tensor | None, dim: int, length: int, value: float | bool
) -> Tensor | None:
    """Rows of ``a`` then of ``b``, both padded with ``value`` to ``length`` along ``dim``."""
    if a is None or b is None:
        if a is None and b is None:
            return None
        raise ValueError(
            "extend(): one cache has a memory mask or cross-attention keys, the other not"
        )
    return torch.cat([_pad_source(a, dim, length, value), _pad_source(b, dim, length, value)])


def _select(t: Tensor | None, index: Tensor) -> Tensor | None:
    return None if t is None else t.index_select(0, index)
