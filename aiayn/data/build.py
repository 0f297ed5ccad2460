"""Building token stores: examples streamed from their files, cleaned, encoded in parallel
chunks and appended to a :class:`~aiayn.data.store.StoreWriter`; and the bounded, seeded sample a
tokenizer is trained on.

Cleaning (recorded in the store's manifest with what it dropped): an example longer than the
limits is dropped (training) or cut (validation, ``long_examples = "truncate"``); a translation
pair with an empty side is dropped; with ``data.max_len_ratio`` a pair whose longer side has more
than that many times the tokens of the shorter one is dropped; with ``data.dedup`` an exact
repeat of an earlier example (same texts, same label) is dropped, found by an 8-byte hash per
example (memory: 8 bytes per example, not its text).
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import random
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from aiayn.data.store import StoreWriter
from aiayn.data.tokenizer import Tokenizer

__all__ = ["Cleaning", "write_examples", "reservoir_sample", "log_counts", "CHUNK"]

log = logging.getLogger(__name__)

# Examples read, encoded (tokenizers' encode_batch: Rust threads on every core) and written at a
# time: the most text held in memory while building.
CHUNK = 20_000

T = TypeVar("T")
# (texts of the example's fields, label or None)
Example = tuple[Sequence[str], int | None]


@dataclass(frozen=True)
class Cleaning:
    """What building a store drops or cuts."""

    # Most tokens per field (translation: source max_len, target max_len - 1 for its BOS/EOS).
    limits: tuple[int, ...]
    # Cut longer examples to the limits (validation; long_examples = "truncate") or drop them.
    cut: bool = False
    # Drop an example with an empty field (translation training pairs).
    drop_empty: bool = False
    # Drop a pair whose longer side has more than this many times the tokens of the shorter (0: off).
    max_ratio: float = 0.0
    # Drop exact repeats of an earlier example.
    dedup: bool = False


def write_examples(
    folder: Path,
    tokenizer: Tokenizer,
    fields: Sequence[str],
    examples: Iterable[Example],
    cleaning: Cleaning,
    prepare: Callable[[str], str] | None = None,
) -> dict[str, Any]:
    """Encode ``examples`` (texts per field, label) into a store in ``folder``; the manifest's
    entries (``counts``: read, kept and every reason an example was dropped or cut)."""
    writer = StoreWriter(folder, fields, tokenizer.vocab_size)
    counts: Counter[str] = Counter()
    has_labels = False
    try:
        numbered = enumerate(examples)
        while chunk := list(itertools.islice(numbered, CHUNK)):
            has_labels = chunk[0][1][1] is not None
            _write_chunk(writer, tokenizer, chunk, cleaning, counts, prepare)
        drop = writer.duplicates() if cleaning.dedup else None
        counts["duplicate"] = int(drop.sum()) if drop is not None else 0
        counts["kept"] = writer.finish(drop)
    finally:
        writer.close()
    return {
        "fields": list(fields),
        "dtype": writer.dtype.name,
        "examples": counts["kept"],
        "tokens": dict(writer.tokens_written),
        "labels": has_labels,
        "cleaning": asdict(cleaning),
        "counts": {
            k: counts[k] for k in ("read", "kept", "too_long", "empty", "ratio", "duplicate", "cut")
        },
    }


def _write_chunk(
    writer: StoreWriter,
    tokenizer: Tokenizer,
    chunk: list[tuple[int, Example]],
    cleaning: Cleaning,
    counts: Counter[str],
    prepare: Callable[[str], str] | None,
) -> None:
    counts["read"] += len(chunk)
    rows = [
        (line, [prepare(t) for t in texts] if prepare else texts, label)
        for line, (texts, label) in chunk
    ]
    if not cleaning.cut:  # too long whatever the segmentation: dropped without being encoded
        fits = [
            all(tokenizer.min_tokens(t) <= n for t, n in zip(texts, cleaning.limits))
            for _, texts, _ in rows
        ]
        counts["too_long"] += fits.count(False)
        rows = [row for row, ok in zip(rows, fits) if ok]
    encoded = [
        tokenizer.encode_batch([texts[f] for _, texts, _ in rows])
        for f in range(len(writer.fields))
    ]
    kept: list[int] = []
    for i in range(len(rows)):
        ids = [column[i] for column in encoded]
        reason = _rejected(ids, cleaning)
        if reason == "cut":
            for column, n in zip(encoded, cleaning.limits):
                column[i] = column[i][:n]
        elif reason:
            counts[reason] += 1
            continue
        counts["cut"] += reason == "cut"
        kept.append(i)
    writer.add(
        {f: [encoded[j][i] for i in kept] for j, f in enumerate(writer.fields)},
        [rows[i][0] for i in kept],
        [int(rows[i][2] or 0) for i in kept] if chunk[0][1][1] is not None else None,
        [_hash(rows[i][1], rows[i][2]) for i in kept] if cleaning.dedup else None,
    )


def _rejected(ids: list[list[int]], cleaning: Cleaning) -> str:
    """'' to keep an example as it is, 'cut' to cut it, else why it is dropped."""
    if cleaning.drop_empty and not all(ids):
        return "empty"
    if any(len(x) > n for x, n in zip(ids, cleaning.limits)):
        return "cut" if cleaning.cut else "too_long"
    if cleaning.max_ratio and len(ids) > 1:
        lengths = [len(x) for x in ids]
        if max(lengths) > cleaning.max_ratio * max(min(lengths), 1):
            return "ratio"
    return ""


def _hash(texts: Sequence[str], label: int | None) -> int:
    joined = "\x00".join(texts) + ("" if label is None else f"\x00{label}")
    return int.from_bytes(hashlib.blake2b(joined.encode("utf-8"), digest_size=8).digest(), "little")


def log_counts(manifest: dict[str, Any], split: str, what: str) -> None:
    """Log what building a store dropped and cut (from its manifest)."""
    counts, cleaning = manifest["counts"], manifest["cleaning"]
    limit = cleaning["limits"][0]
    parts = {
        "too_long": f"longer than max_len={limit} tokens",
        "empty": "with an empty side",
        "ratio": f"over max_len_ratio={cleaning['max_ratio']}",
        "duplicate": "repeating an earlier one (dedup)",
    }
    dropped = sum(counts[k] for k in parts)
    if dropped:
        log.warning(
            "%s: dropped %d of %d %s: %s",
            split,
            dropped,
            counts["read"],
            what,
            ", ".join(f"{counts[k]} {text}" for k, text in parts.items() if counts[k]),
        )
    if counts["cut"]:
        log.warning(
            "%s: cut %d of %d %s to max_len=%d tokens",
            split,
            counts["cut"],
            counts["read"],
            what,
            limit,
        )


def reservoir_sample(items: Iterable[T], k: int, seed: int = 0) -> tuple[list[T], int]:
    """A uniform sample of ``k`` of ``items`` in their original order (all of them when there are
    at most ``k``), drawn while streaming (Vitter's algorithm R) from ``seed``; and how many
    items there were. Memory: the ``k`` items."""
    rng = random.Random(seed)
    sample: list[tuple[int, T]] = []
    n = 0
    for n, item in enumerate(items, start=1):
        if n <= k:
            sample.append((n, item))
        else:
            j = rng.randrange(n)
            if j < k:
                sample[j] = (n, item)
    sample.sort(key=lambda pair: pair[0])
    return [item for _, item in sample], n
