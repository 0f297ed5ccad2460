"""Building token stores: examples streamed from their files, cleaned, encoded in parallel
chunks and appended to a :class:`~aiayn.data.store.StoreWriter`; a running text (the language
model's) streamed in pieces into a store of one example; and the bounded, seeded sample a
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
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from aiayn.data.store import StoreWriter
from aiayn.data.tokenizer import Tokenizer
from aiayn.progress import progress_bar

__all__ = [
    "Cleaning",
    "write_examples",
    "running_pieces",
    "write_running_text",
    "reservoir_sample",
    "log_counts",
    "CHUNK",
    "PIECE",
]

log = logging.getLogger(__name__)

# Examples read, encoded (tokenizers' encode_batch: Rust threads on every core) and written at a
# time: the most text held in memory while building.
CHUNK = 20_000
# Characters of a running text (LM) per piece, and pieces encoded at a time (tokenizers' threads
# take one piece each): the most text held in memory while building is PIECE * PIECES.
PIECE = 1 << 16
PIECES = 16
# Where a running text may be cut: before a run of whitespace that follows a non-space character.
_BREAK = re.compile(r"\S(?=[ \t\n\r])")

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
    bar = progress_bar(None, "token store", "ex")
    try:
        numbered = enumerate(examples)
        while chunk := list(itertools.islice(numbered, CHUNK)):
            has_labels = chunk[0][1][1] is not None
            _write_chunk(writer, tokenizer, chunk, cleaning, counts, prepare)
            bar.update(len(chunk))
        drop = writer.duplicates() if cleaning.dedup else None
        counts["duplicate"] = int(drop.sum()) if drop is not None else 0
        counts["kept"] = writer.finish(drop)
    finally:
        bar.close()
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
        (tokenizer.encode_target_batch if name == "tgt" else tokenizer.encode_batch)(
            [texts[f] for _, texts, _ in rows]
        )
        for f, name in enumerate(writer.fields)
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


def running_pieces(blocks: Iterable[str], size: int | None = None) -> Iterator[str]:
    """The text of ``blocks`` (consecutive parts of one text) in pieces of about ``size``
    characters (default :data:`PIECE`), each after the first beginning at a run of ASCII
    whitespace that follows a non-space character: there the byte-level pre-tokenizer breaks and
    whitespace collapses the same in a piece as in the whole text, so that the pieces encode to
    the whole text's ids (:meth:`~aiayn.data.tokenizer.Tokenizer.encode_running`). A stretch of
    ``8 * size`` characters without such a place is cut where it is (logged: a subword tokenizer
    may segment the word there otherwise). Memory: a block and the rest of the one before."""
    size, carry = size or PIECE, ""
    for block in blocks:
        text, pos = carry + block, 0
        while len(text) - pos >= size:
            cut = _break(text, pos, pos + size)
            if cut is None and len(text) - pos < 8 * size:
                break  # wait for more text
            if cut is None:
                log.warning("running text: %d characters without a space, cut there", 8 * size)
                cut = pos + size
            yield text[pos:cut]
            pos = cut
        carry = text[pos:]
    if carry:
        yield carry


def _break(text: str, lo: int, hi: int) -> int | None:
    """The last place to cut ``text`` in (lo, hi], else the first after hi, else None."""
    for start in (max(lo, hi - 4096), lo):
        last = None
        for last in _BREAK.finditer(text, start, hi + 1):  # noqa: B007 (the last one is wanted)
            pass
        if last is not None and last.end() > lo:
            return last.end()
    after = _BREAK.search(text, hi)
    return after.end() if after else None


def write_running_text(folder: Path, tokenizer: Tokenizer, pieces: Iterable[str]) -> dict[str, Any]:
    """Encode one running text, given as consecutive :func:`running_pieces`, into a store of one
    example (field ``text``) in ``folder``, :data:`PIECES` pieces at a time (in parallel for a
    subword tokenizer, vectorised for characters); the manifest's entries."""
    writer = StoreWriter(folder, ("text",), tokenizer.vocab_size)
    characters, start = 0, True
    it = iter(pieces)
    groups = iter(lambda: list(itertools.islice(it, PIECES)), [])
    bar = progress_bar(None, "token store", "char", unit_scale=True)
    try:
        group = next(groups, None)
        while group is not None:
            following = next(groups, None)
            writer.append("text", tokenizer.encode_running(group, start, following is None))
            characters += sum(map(len, group))
            bar.update(sum(map(len, group)))
            group, start = following, False
        writer.end_example(0)
        writer.finish()
    finally:
        bar.close()
        writer.close()
    return {
        "fields": ["text"],
        "dtype": writer.dtype.name,
        "examples": 1,
        "tokens": dict(writer.tokens_written),
        "labels": False,
        "counts": {"characters": characters, "kept": 1},
    }


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
