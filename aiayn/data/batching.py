"""Token-budget batching (Vaswani et al. 2017, §5.1: "batched together by approximate sequence
length ... approximately 25000 source tokens and 25000 target tokens") and collate functions.

Shapes: B batch · S source length · T target length (BOS/EOS included).

:class:`TokenBatchSampler` sorts examples by length (ties broken at random per epoch), cuts the
sorted list greedily into batches whose *padded* size ``B × max(S, T)`` stays within
``max_tokens``, and shuffles the batch order per epoch from ``(seed, epoch)``. The cut points
depend only on the lengths, so every epoch has the same number of batches. It yields lists of
example indices, to be collated by the caller (or used as a DataLoader ``batch_sampler``); an
epoch's batches are held as one index array (:class:`Batches`), a list each only when taken.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np
import torch

__all__ = [
    "Batches",
    "round_up",
    "bucket_width",
    "padded_width",
    "fit_bucket_widths",
    "TokenBatchSampler",
    "pair_lengths",
    "Seq2SeqBatch",
    "ClassificationBatch",
    "collate_translation",
    "collate_classification",
    "pad_sequences",
    "padding_fraction",
]

log = logging.getLogger(__name__)

#: one example's token ids: a list, or a row of a token store (a 1-D array)
Ids = Sequence[int] | np.ndarray


def round_up(n: Any, multiple: int) -> Any:
    """``n`` (an int or an integer array) rounded up to a multiple of ``multiple``: the width a
    batch's tensors get with ``data.pad_to_multiple``."""
    return n if multiple == 1 else -(-n // multiple) * multiple


def bucket_width(n: Any, widths: Sequence[int]) -> Any:
    """``n`` (an int or an integer array) rounded up to the smallest of the ascending ``widths``
    that holds it (``data.bucket_widths``); a width above the largest is left as it is."""
    if not len(widths):
        return n
    table = np.asarray(widths, dtype=np.int64)
    at = np.searchsorted(table, n)  # the first bucket >= n
    out = np.where(at < len(table), table[np.minimum(at, len(table) - 1)], n)
    return out if isinstance(n, np.ndarray) else int(out)


def padded_width(n: Any, multiple: int = 1, widths: Sequence[int] = ()) -> Any:
    """The width a batch of longest sequence ``n`` gets: its bucket (``data.bucket_widths``) when
    there are buckets, else ``n`` rounded up to ``data.pad_to_multiple``."""
    return bucket_width(n, widths) if len(widths) else round_up(n, multiple)


def fit_bucket_widths(widths: Sequence[int] | np.ndarray, n: int, largest: int) -> tuple[int, ...]:
    """The ``n`` bucket widths, the last one ``largest``, that round the examples' ``widths``
    (each its longer side, as the sampler's budget counts it) up by the fewest padding tokens in
    all: a dynamic programme over the length histogram, exact for that cost (a batch's padding
    within its bucket comes on top, as without buckets). For ``data.bucket_widths``."""
    w = np.minimum(np.asarray(widths, dtype=np.int64), largest)
    hist = np.bincount(w, minlength=largest + 1).astype(np.float64)
    count, total = np.cumsum(hist), np.cumsum(hist * np.arange(largest + 1))
    a, b = np.arange(largest + 1)[:, None], np.arange(largest + 1)[None, :]
    # cost[a, b]: the examples of width in (a, b] padded to b; a bucket needs a < b
    cost = np.where(a < b, b * (count[b] - count[a]) - (total[b] - total[a]), np.inf)
    best = np.full(largest + 1, np.inf)
    best[0] = 0.0
    cuts = []
    for _ in range(min(n, largest)):
        paths = best[:, None] + cost  # (a, b): the best way to end the last bucket at b from a
        cuts.append(paths.argmin(0))
        best = paths.min(0)
    out, end = [], largest
    for cut in reversed(cuts):
        out.append(end)
        end = int(cut[end])
        if end == 0:
            break
    # a bucket that holds no example (with more buckets than lengths) is left out
    kept = [x for x, before in zip(out, [*out[1:], 0]) if x == largest or count[x] > count[before]]
    return tuple(sorted(kept))


class Batches(Sequence[list[int]]):
    """An epoch's batches in iteration order: batch ``i`` is ``order[bounds[j]:bounds[j + 1]]``
    for ``j = pick[i]``, handed out as a list of ints. One int64 array instead of a list of lists
    of Python ints, which took several times the memory (docs/experiments/log.md#data-at-scale).
    Slices are Batches too; a Batches equals any sequence of the same lists."""

    def __init__(self, order: np.ndarray, bounds: np.ndarray, pick: np.ndarray) -> None:
        self._order, self._bounds, self._pick = order, bounds, pick

    def __len__(self) -> int:
        return len(self._pick)

    @overload
    def __getitem__(self, i: int) -> list[int]: ...
    @overload
    def __getitem__(self, i: slice) -> Batches: ...
    def __getitem__(self, i: int | slice) -> list[int] | Batches:
        if isinstance(i, slice):
            return Batches(self._order, self._bounds, self._pick[i])
        j = int(self._pick[i])
        return self._order[self._bounds[j] : self._bounds[j + 1]].tolist()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or len(other) != len(self):
            return False
        return all(list(a) == list(b) for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]  # mutable-looking equality, like a list

    def __repr__(self) -> str:
        return f"Batches({len(self)} batches, {int(self._bounds[-1])} examples)"


class TokenBatchSampler:
    """Length-bucketed batches of indices under a padded-token budget, deterministic and resumable.

    ``src_lengths[i]``/``tgt_lengths[i]``: lengths of example i *as they will be in the batch
    tensors* (for translation the target side gains BOS or EOS: pass ``len(y) + 1``, as
    :func:`pair_lengths` does). ``tgt_lengths=None`` for single-sequence tasks.

    With ``world_size > 1`` each rank gets every ``world_size``-th batch of the shuffled order;
    the few batches left over (fewer than ``world_size``) are dropped from that epoch, so all
    ranks take the same number of steps and no example is seen twice. An example longer than
    ``max_tokens`` on its own forms a batch of one (filter training data by length beforehand;
    ``warn_long=False`` for inference, where such a sentence is simply decoded alone).
    """

    def __init__(
        self,
        src_lengths: Sequence[int] | np.ndarray,
        tgt_lengths: Sequence[int] | np.ndarray | None = None,
        max_tokens: int = 4096,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        max_batch_size: int | None = None,
        warn_long: bool = True,
        pad_to_multiple: int = 1,
        bucket_widths: Sequence[int] = (),
    ) -> None:
        # int32: a length fits, in half the memory of int64
        src = np.asarray(src_lengths, dtype=np.int32)
        tgt = src if tgt_lengths is None else np.asarray(tgt_lengths, dtype=np.int32)
        if src.ndim != 1 or tgt.shape != src.shape:
            raise ValueError(
                f"src_lengths and tgt_lengths must be 1-D of equal length, "
                f"got {src.shape} and {tgt.shape}"
            )
        if max_tokens <= 0:
            raise ValueError(f"max_tokens must be positive, got {max_tokens}")
        if not 0 <= rank < world_size:
            raise ValueError(
                f"rank must be in [0, world_size), got rank={rank}, world_size={world_size}"
            )
        self.src, self.tgt = src, tgt
        self.max_tokens, self.shuffle, self.seed = int(max_tokens), bool(shuffle), int(seed)
        self.rank, self.world_size = int(rank), int(world_size)
        self.max_batch_size = max_batch_size
        if pad_to_multiple < 1:
            raise ValueError(f"pad_to_multiple must be >= 1, got {pad_to_multiple}")
        self.multiple = int(pad_to_multiple)  # batch widths are rounded up to a multiple of it
        # or to the smallest of these that holds them (a batch then never spans two buckets)
        self.buckets = tuple(int(w) for w in bucket_widths)
        if list(self.buckets) != sorted(set(self.buckets)) or any(w < 1 for w in self.buckets):
            raise ValueError(f"bucket_widths must be positive and ascending, got {self.buckets}")
        self.epoch = 0
        self.position = 0  # batches of this epoch already handed out (by this rank)
        self._width = np.maximum(self.pad(src), self.pad(tgt))
        order = self._sort_keys(None)
        self._bounds = np.asarray(self._cut(self._width[order]), np.int64)
        self._shapes = self._count_shapes(order)
        n_over = int((self._width > self.max_tokens).sum())
        if n_over and warn_long:
            log.warning(
                "%d examples exceed max_tokens=%d and form batches of one", n_over, max_tokens
            )

    def pad(self, n: Any) -> Any:
        """The padded width of a batch whose longest sequence is ``n`` (an int or an array)."""
        return padded_width(n, self.multiple, self.buckets)

    # ---- batch construction -------------------------------------------------------------------
    def _sort_keys(self, rng: np.random.Generator | None) -> np.ndarray:
        """Indices sorted by (max length, source length, target length, random tie-break)."""
        noise = rng.random(len(self.src)) if rng is not None else np.arange(len(self.src))
        return np.lexsort((noise, self.tgt, self.src, self._width))

    def _cut(self, widths: np.ndarray) -> list[int]:
        """Batch boundaries over widths sorted ascending: each batch has B × max width ≤ budget.

        In a sorted run the last element is the widest, so ``fits(end) = (end - start) *
        widths[end - 1] <= max_tokens`` is monotone in ``end``: binary-search the largest end.
        With bucket widths a batch ends where its bucket ends, so that every batch of a bucket
        but its last has the same number of rows (the same tensor shape but for its widths).
        """
        bounds, start, n = [0], 0, len(widths)
        cap = self.max_batch_size or n
        while start < n:
            end = int(np.searchsorted(widths, widths[start], "right")) if self.buckets else n
            lo, hi = start + 1, min(start + cap, end)  # lo always kept: a batch has >= 1 example
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if (mid - start) * int(widths[mid - 1]) <= self.max_tokens:
                    lo = mid
                else:
                    hi = mid - 1
            bounds.append(lo)
            start = lo
        return bounds

    def batches(self, epoch: int | None = None) -> Batches:
        """This rank's batches for ``epoch`` (default: the current one), in iteration order."""
        epoch = self.epoch if epoch is None else epoch
        rng = np.random.default_rng([self.seed, epoch]) if self.shuffle else None
        order = self._sort_keys(rng)
        n = len(self._bounds) - 1
        pick = rng.permutation(n) if rng is not None else np.arange(n)
        per_rank = n // self.world_size if self.world_size > 1 else n
        return Batches(order, self._bounds, pick[self.rank :: self.world_size][:per_rank])

    def _shapes_of(self, order: np.ndarray) -> np.ndarray:
        """(rows, source width, target width) of each batch of the cut, over ``order``."""
        starts = self._bounds[:-1]
        if not len(starts):
            return np.zeros((0, 3), np.int64)
        rows = np.diff(self._bounds)
        src = self.pad(np.maximum.reduceat(self.src[order], starts))
        tgt = self.pad(np.maximum.reduceat(self.tgt[order], starts))
        return np.stack([rows, src, tgt], axis=1)

    def _count_shapes(self, order: np.ndarray) -> int:
        return len(np.unique(self._shapes_of(order), axis=0))

    def distinct_shapes(self) -> int:
        """How many distinct (rows, source width, target width) an epoch's batches have (the cut
        is the same every epoch; the widths counted in the unshuffled order)."""
        return self._shapes

    def shape_batches(self) -> list[tuple[tuple[int, int, int], list[int]]]:
        """One batch of each distinct (rows, source width, target width) of an epoch, over all
        ranks, the most padded cells first: what a warm-up runs once (aiayn/train/warmup.py).
        The sort order puts the same examples in the same batches every epoch, up to examples of
        equal lengths, so an epoch's shapes are those of every epoch."""
        order = self._sort_keys(None)
        shapes = self._shapes_of(order)
        if not len(shapes):
            return []
        _, firsts = np.unique(shapes, axis=0, return_index=True)
        first = sorted(
            firsts.tolist(), key=lambda j: -int(shapes[j, 0] * (shapes[j, 1] + shapes[j, 2]))
        )
        return [
            (
                (int(shapes[j, 0]), int(shapes[j, 1]), int(shapes[j, 2])),
                order[self._bounds[j] : self._bounds[j + 1]].tolist(),
            )
            for j in first
        ]

    def __len__(self) -> int:
        n = len(self._bounds) - 1
        return n // self.world_size if self.world_size > 1 else n

    def __iter__(self) -> Iterator[list[int]]:
        """Yield the rest of the current epoch, then move on to the next epoch."""
        batches = self.batches()
        while self.position < len(batches):
            self.position += 1
            yield batches[self.position - 1]
        self.epoch += 1
        self.position = 0

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` (from its beginning, unless it is the epoch a loaded state is in)."""
        if epoch != self.epoch:
            self.epoch, self.position = int(epoch), 0

    # ---- resume -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, int]:
        """Plain ints (loadable with ``torch.load(weights_only=True)``): where the epoch stands."""
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "num_examples": len(self.src),
            "num_batches": len(self),
            "rank": self.rank,
            "world_size": self.world_size,
            "max_tokens": self.max_tokens,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue exactly where :meth:`state_dict` was taken; ValueError if the data differs."""
        for key in ("seed", "num_examples", "num_batches", "world_size", "max_tokens"):
            mine = self.state_dict()[key]
            if int(state[key]) != mine:
                raise ValueError(f"cannot resume batching: {key} was {int(state[key])}, now {mine}")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


def pair_lengths(
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
) -> tuple[list[int], list[int]]:
    """Batch-tensor lengths of (source, target) id pairs: ``len(x)`` and ``len(y) + 1`` (BOS/EOS)."""
    return [len(x) for x, _ in pairs], [len(y) + 1 for _, y in pairs]


# ---- collate ----------------------------------------------------------------------------------


def pad_sequences(
    seqs: Sequence[Ids],
    pad_id: int,
    prefix: int | None = None,
    suffix: int | None = None,
    multiple: int = 1,
    widths: Sequence[int] = (),
) -> torch.Tensor:
    """Right-padded (B, L) LongTensor of ``[prefix] + seq + [suffix]`` for each sequence, L
    rounded up to a multiple of ``multiple`` or to its bucket among ``widths``."""
    extra = (prefix is not None) + (suffix is not None)
    width = padded_width(max((len(s) for s in seqs), default=0) + extra, multiple, widths)
    out = np.full((len(seqs), width), pad_id, dtype=np.int64)
    start = int(prefix is not None)
    for i, seq in enumerate(seqs):
        if prefix is not None:
            out[i, 0] = prefix
        out[i, start : start + len(seq)] = seq
        if suffix is not None:
            out[i, start + len(seq)] = suffix
    return torch.from_numpy(out)


@dataclass
class Seq2SeqBatch:
    """A translation batch. ``tgt_in = [BOS] + y`` is fed to the decoder, ``tgt_out = y + [EOS]`` predicted."""

    src: torch.Tensor  # (B, S)
    tgt_in: torch.Tensor  # (B, T)
    tgt_out: torch.Tensor  # (B, T)
    n_src_tokens: int  # non-pad source tokens
    n_tgt_tokens: int  # non-pad target tokens (= tokens predicted, EOS included)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Seq2SeqBatch:
        move = lambda t: t.to(device, non_blocking=non_blocking)  # noqa: E731
        return Seq2SeqBatch(
            move(self.src),
            move(self.tgt_in),
            move(self.tgt_out),
            self.n_src_tokens,
            self.n_tgt_tokens,
        )

    def __len__(self) -> int:
        return self.src.size(0)


def collate_translation(
    pairs: Sequence[tuple[Ids, Ids]],
    pad_id: int = 0,
    bos_id: int = 1,
    eos_id: int = 2,
    multiple: int = 1,
    widths: Sequence[int] = (),
) -> Seq2SeqBatch:
    """Pad (source ids, target ids) pairs into a :class:`Seq2SeqBatch` (no BOS/EOS on the
    source), the widths rounded up to a multiple of ``multiple`` (data.pad_to_multiple) or to
    the smallest of ``widths`` that holds them (data.bucket_widths)."""
    if not pairs:
        raise ValueError("collate_translation needs at least one pair")
    src = [x for x, _ in pairs]
    tgt = [y for _, y in pairs]
    return Seq2SeqBatch(
        src=pad_sequences(src, pad_id, multiple=multiple, widths=widths),
        tgt_in=pad_sequences(tgt, pad_id, prefix=bos_id, multiple=multiple, widths=widths),
        tgt_out=pad_sequences(tgt, pad_id, suffix=eos_id, multiple=multiple, widths=widths),
        n_src_tokens=sum(len(x) for x in src),
        n_tgt_tokens=sum(len(y) + 1 for y in tgt),
    )


@dataclass
class ClassificationBatch:
    tokens: torch.Tensor  # (B, S) right-padded
    labels: torch.Tensor  # (B,)
    n_tokens: int  # non-pad tokens

    def to(self, device: torch.device | str, non_blocking: bool = False) -> ClassificationBatch:
        return ClassificationBatch(
            self.tokens.to(device, non_blocking=non_blocking),
            self.labels.to(device, non_blocking=non_blocking),
            self.n_tokens,
        )

    def __len__(self) -> int:
        return self.tokens.size(0)


def collate_classification(
    items: Sequence[tuple[Ids, int]], pad_id: int = 0, bos_id: int | None = None
) -> ClassificationBatch:
    """Pad (ids, label) items; ``bos_id`` prepends a summary token (a [CLS]-style position)."""
    if not items:
        raise ValueError("collate_classification needs at least one item")
    seqs = [ids for ids, _ in items]
    return ClassificationBatch(
        tokens=pad_sequences(seqs, pad_id, prefix=bos_id),
        labels=torch.tensor([label for _, label in items], dtype=torch.long),
        n_tokens=sum(len(s) for s in seqs) + len(seqs) * (bos_id is not None),
    )


def padding_fraction(sampler: TokenBatchSampler, epoch: int = 0) -> float:
    """Share of the padded source+target tensor cells that are padding, over one epoch."""
    real = padded = 0
    for batch in sampler.batches(epoch):
        src, tgt = sampler.src[batch], sampler.tgt[batch]
        real += int(src.sum()) + int(tgt.sum())
        padded += len(batch) * (sampler.pad(int(src.max())) + sampler.pad(int(tgt.max())))
    return 1.0 - real / padded if padded else 0.0
