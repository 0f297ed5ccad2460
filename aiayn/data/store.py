"""The token store: a corpus tokenized once into flat arrays on disk, read by offset.

What fairseq-preprocess (``.bin``/``.idx``), Megatron's indexed datasets and Hugging Face
``datasets`` (Arrow) give their users: the text is read and encoded once, streaming, and every
later run — ``--resume``, each DDP rank, a new run on the same files with the same tokenizer —
opens the same files instead of encoding again. Only the per-example lengths and offsets are read
into RAM (what batching needs); a batch's ids are read from the file by offset (``pread``) when it
is collated, so they pass through the page cache, which the kernel shares between processes and
can drop, and never count in a process's RSS. (A memory mapping did: on Linux 6.x a fault maps the
whole page-cache folio of a freshly written file, so random batches mapped nearly all of a store
into each rank's RSS; docs/design/data.md#the-token-store.)

A store is a folder in the data cache, ``$AIAYN_CACHE/stores/NAME-DIGEST/``::

    manifest.json    what it was built from (tokenizer sha256, source files with size, mtime and
                     a sampled sha256, cleaning settings), what building kept and dropped, and a
                     CRC-32 of every other file (``checksums``); written last, so a folder
                     without it is no store
    FIELD.bin        the token ids of every example's FIELD (src and tgt; text) one after
                     another: uint16 when the vocabulary has at most 65,536 tokens, else uint32
    FIELD.idx.npy    int64, where each example starts in FIELD.bin
    FIELD.len.npy    int32, each example's length in tokens
    lines.npy        int64, the 0-based example (line) of the source each example came from
    labels.npy       int64 class ids (classification only)

DIGEST is a hash of what the store holds (the settings above, the source paths). Opening checks
the manifest against the files as they are now: a store whose sources changed, whose arrays do
not match its manifest, or whose files' content is not what was written (a ``src.bin``
overwritten with other bytes of the same size; :mod:`aiayn.checksum`, checked in full at a
process's first open) is rebuilt (one log line says why),
never read; a store built before checksums were recorded is rebuilt once. Building takes a lock
beside the folder (one process builds, the others wait, then read) and writes through
:func:`aiayn.io.new_folder`, so a kill mid-build leaves no folder that looks complete.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import json
import logging
import os
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from aiayn.checksum import checksum_problem, checksums
from aiayn.data.readers import existing_file
from aiayn.data.registry import cache_dir
from aiayn.errors import DataError, OutputError
from aiayn.io import new_folder, recover_folder, write_all, write_error, write_json

__all__ = [
    "FORMAT",
    "TokenStore",
    "pair_store",
    "StoreWriter",
    "token_dtype",
    "fingerprint",
    "cache_key",
    "open_store",
]

log = logging.getLogger(__name__)

FORMAT = "aiayn-token-store/1"
# The manifest's record of each file's content (aiayn.checksum); a manifest without it is rebuilt.
_CHECKSUMS = "checksums"
_MANIFEST = "manifest.json"
# A file up to this size is hashed whole; a larger one by _SAMPLES blocks spread over it.
_SAMPLE_BLOCK = 1 << 16
_SAMPLES = 64


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype that holds every id of a ``vocab_size`` vocabulary."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def fingerprint(path: str | os.PathLike) -> dict[str, Any]:
    """What a store records of a source file: path, size, mtime and a sha256 of the whole file
    (up to 4 MiB) or of 64 blocks of 64 KiB spread over it (cheap at every start, and a changed
    size, mtime or sampled block marks the store stale)."""
    path = existing_file(path)
    try:
        stat = path.stat()
        digest = hashlib.sha256(str(stat.st_size).encode())
        with open(path, "rb") as f:
            if stat.st_size <= _SAMPLE_BLOCK * _SAMPLES:
                digest.update(f.read())
            else:
                step = (stat.st_size - _SAMPLE_BLOCK) // (_SAMPLES - 1)
                for i in range(_SAMPLES):
                    f.seek(i * step)
                    digest.update(f.read(_SAMPLE_BLOCK))
    except OSError as err:
        raise DataError(f"{path}: cannot read ({err.strerror or err})") from None
    return {
        "path": str(path.resolve()),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "sampled_sha256": digest.hexdigest(),
    }


def cache_key(obj: Any) -> str:
    """16 hex digits of the sha256 of ``obj`` as canonical JSON."""
    text = json.dumps(obj, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


class StoreWriter:
    """Appends encoded examples to a store folder being built; :meth:`finish` writes the index.

    Memory: the ids of one chunk, plus per example a few integers (start, length, line, and an
    8-byte hash when duplicates are removed): never the corpus.
    """

    def __init__(self, folder: Path, fields: Sequence[str], vocab_size: int) -> None:
        self.folder, self.fields, self.dtype = folder, tuple(fields), token_dtype(vocab_size)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        self._files = {f: os.open(folder / f"{f}.bin", flags, 0o666) for f in self.fields}
        self.tokens_written = dict.fromkeys(self.fields, 0)  # ids in each FIELD.bin so far
        self._chunks: dict[str, list[np.ndarray]] = {
            name: [] for name in ("lines", "labels", "hashes")
        }
        self._chunks.update({f"{f}.idx": [] for f in self.fields})
        self._chunks.update({f"{f}.len": [] for f in self.fields})
        self._open = dict.fromkeys(self.fields, 0)  # ids appended to the example not yet ended

    def append(self, field: str, ids: np.ndarray) -> None:
        """Append ``ids`` to the example being written, one piece at a time (a running text);
        :meth:`end_example` ends it."""
        self._write(field, ids.astype(self.dtype, copy=False))
        self.tokens_written[field] += len(ids)
        self._open[field] += len(ids)

    def end_example(self, line: int) -> None:
        """End the example whose ids :meth:`append` wrote, taken from ``line`` of the source."""
        for field, n in self._open.items():
            if n >= 2**31:
                raise DataError(
                    f"an example of {n} tokens is more than a store holds (2**31 - 1); "
                    "split the text into several files"
                )
            self._chunks[f"{field}.idx"].append(np.array([self.tokens_written[field] - n]))
            self._chunks[f"{field}.len"].append(np.array([n], np.int32))
            self._open[field] = 0
        self._chunks["lines"].append(np.array([line], np.int64))

    def add(
        self,
        columns: dict[str, list[list[int]]],
        lines: Sequence[int],
        labels: Sequence[int] | None = None,
        hashes: Sequence[int] | None = None,
    ) -> None:
        """Append examples: ``columns[field][i]`` the ids of example i, taken from ``lines[i]``."""
        for field in self.fields:
            seqs = columns[field]
            lengths = np.fromiter(map(len, seqs), np.int64, len(seqs))
            total = int(lengths.sum())
            flat = np.fromiter(itertools.chain.from_iterable(seqs), self.dtype, total)
            self._write(field, flat)
            starts = self.tokens_written[field] + np.cumsum(lengths) - lengths
            self._chunks[f"{field}.idx"].append(starts)
            self._chunks[f"{field}.len"].append(lengths.astype(np.int32))
            self.tokens_written[field] += total
        self._chunks["lines"].append(np.asarray(lines, dtype=np.int64))
        if labels is not None:
            self._chunks["labels"].append(np.asarray(labels, dtype=np.int64))
        if hashes is not None:
            self._chunks["hashes"].append(np.asarray(hashes, dtype=np.uint64))

    def _write(self, field: str, ids: np.ndarray) -> None:
        """Append ``ids`` to FIELD.bin; a full disk is an OutputError that says so."""
        offset = self.tokens_written[field] * self.dtype.itemsize
        path = self.folder / f"{field}.bin"
        write_all(self._files[field], np.ascontiguousarray(ids), path, offset)

    def duplicates(self) -> np.ndarray:
        """Bool per example so far: True where an earlier example had the same hash."""
        if not self._chunks["hashes"]:
            return np.zeros(sum(map(len, self._chunks["lines"])), dtype=bool)
        hashes = np.concatenate(self._chunks["hashes"])
        _, first = np.unique(hashes, return_index=True)
        dup = np.ones(len(hashes), dtype=bool)
        dup[first] = False
        return dup

    def finish(self, drop: np.ndarray | None = None) -> int:
        """Close the token files and write the index of every example not in ``drop``; returns
        how many examples the store holds."""
        self.close()
        n = 0
        for name, chunks in self._chunks.items():
            if name == "hashes" or (name == "labels" and not chunks):
                continue
            array = np.concatenate(chunks) if chunks else np.zeros(0, np.int64)
            array = array[~drop] if drop is not None else array
            try:
                np.save(self.folder / f"{name}.npy", array, allow_pickle=False)
            except OSError as err:
                raise write_error(self.folder / f"{name}.npy", err) from None
            n = len(array)
        return n

    def close(self) -> None:
        for fd in self._files.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._files = {}


class _TokenFile:
    """The ids of one field on disk, read by offset (``os.pread``; no shared file position, so
    forked processes can share the descriptor)."""

    def __init__(self, path: Path, dtype: np.dtype) -> None:
        self.path, self.dtype = path, dtype
        self.size = path.stat().st_size // dtype.itemsize
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        weakref.finalize(self, os.close, self._fd)

    def read(self, start: int, stop: int) -> np.ndarray:
        """ids[start:stop], a read-only array."""
        want = (stop - start) * self.dtype.itemsize
        data = os.pread(self._fd, want, start * self.dtype.itemsize) if want else b""
        if len(data) != want:
            raise DataError(
                f"{self.path}: shorter than its manifest says (read {len(data)} of {want} bytes "
                f"at {start * self.dtype.itemsize}); delete the store folder"
            )
        return np.frombuffer(data, self.dtype)

    def chunks(self, size: int = 1 << 22) -> Iterator[np.ndarray]:
        """Every id, ``size`` at a time."""
        for start in range(0, self.size, size):
            yield self.read(start, min(start + size, self.size))


class _TokenArray:
    """The ids of one field held in memory, with :class:`_TokenFile`'s interface."""

    def __init__(self, ids: np.ndarray) -> None:
        self.ids, self.dtype, self.size = ids, ids.dtype, len(ids)

    def read(self, start: int, stop: int) -> np.ndarray:
        return self.ids[start:stop]

    def chunks(self, size: int = 1 << 22) -> Iterator[np.ndarray]:
        yield self.ids


class TokenStore:
    """A built store, opened read-only: lengths and offsets in RAM, ids read from disk by offset.

    ``rows(field, indices)`` gives the ids of those examples as 1-D read-only arrays;
    ``lengths(field)`` their lengths. Pickled objects are never loaded (``allow_pickle``
    stays off). :meth:`from_lists` makes the same object from examples in memory (tests,
    benchmarks).
    """

    path: Path | None

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        manifest = _read_manifest(self.path)
        if manifest is None:
            raise DataError(f"{self.path}: not a token store (no readable {_MANIFEST})")
        problem = _check_arrays(self.path, manifest) or _check_content(self.path, manifest)
        if problem:
            raise DataError(f"{self.path}: damaged token store ({problem}); delete the folder")
        self.manifest: dict[str, Any] = manifest
        self.fields: tuple[str, ...] = tuple(manifest["fields"])
        dtype = np.dtype(manifest["dtype"])
        self._tokens: dict[str, _TokenFile | _TokenArray] = {
            f: _TokenFile(self.path / f"{f}.bin", dtype) for f in self.fields
        }
        self._starts = {f: _load(self.path / f"{f}.idx.npy") for f in self.fields}
        self._lengths = {f: _load(self.path / f"{f}.len.npy") for f in self.fields}
        self.lines = _load(self.path / "lines.npy", mmap=True)
        labels = self.path / "labels.npy"
        self.labels = _load(labels, mmap=True) if manifest.get("labels") else np.zeros(0, np.int64)

    @classmethod
    def from_lists(
        cls, columns: dict[str, list[list[int]]], labels: Sequence[int] | None = None
    ) -> TokenStore:
        """A store held in memory of ``columns[field][i]``, the ids of example i."""
        store = cls.__new__(cls)
        n = len(next(iter(columns.values())))
        store.path, store.fields = None, tuple(columns)
        store.manifest = {"fields": list(columns), "examples": n, "counts": {}}
        store._lengths = {f: np.array([len(x) for x in c], np.int32) for f, c in columns.items()}
        store._starts = {f: np.cumsum(x, dtype=np.int64) - x for f, x in store._lengths.items()}
        store._tokens = {
            f: _TokenArray(np.fromiter(itertools.chain.from_iterable(c), np.int64))
            for f, c in columns.items()
        }
        store.lines = np.arange(n, dtype=np.int64)
        store.labels = np.asarray(labels if labels is not None else [], dtype=np.int64)
        return store

    def __len__(self) -> int:
        return int(self.manifest["examples"])

    @property
    def nbytes(self) -> int:
        """Size of the store's files on disk."""
        if self.path is None:
            return 0
        return sum(p.stat().st_size for p in self.path.iterdir() if p.is_file())

    def lengths(self, field: str) -> np.ndarray:
        """Every example's length in ``field``, int32 (in RAM)."""
        return self._lengths[field]

    def row(self, field: str, index: int) -> np.ndarray:
        start = int(self._starts[field][index])
        return self._tokens[field].read(start, start + int(self._lengths[field][index]))

    def rows(self, field: str, indices: Iterable[int]) -> list[np.ndarray]:
        index = np.fromiter(indices, np.int64)
        starts = self._starts[field][index]
        ends = (starts + self._lengths[field][index]).tolist()
        read = self._tokens[field].read
        return [read(a, b) for a, b in zip(starts.tolist(), ends)]

    def mapped(self, field: str) -> np.ndarray:
        """Every id of ``field``, memory-mapped read-only: for a running text read in windows (a
        language model's store holds one example, the whole text)."""
        tokens = self._tokens[field]
        return tokens.ids if isinstance(tokens, _TokenArray) else _map(tokens.path, tokens.dtype)

    def dtype(self, field: str) -> np.dtype:
        """The dtype of ``field``'s ids (on disk: the smallest that fits the vocabulary)."""
        return self._tokens[field].dtype

    def token_counts(self, field: str, minlength: int = 0) -> np.ndarray:
        """How often each id occurs in ``field`` (read in chunks; examples dropped as duplicates
        included), as ``np.bincount`` gives it."""
        counts = np.zeros(minlength, np.int64)
        for chunk in self._tokens[field].chunks():
            found = np.bincount(chunk, minlength=len(counts))
            counts = np.pad(counts, (0, len(found) - len(counts))) + found
        return counts

    def __repr__(self) -> str:
        return f"TokenStore({str(self.path)!r}, examples={len(self)})"


def pair_store(pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> TokenStore:
    """A translation store (fields ``src``, ``tgt``) held in memory, of (source, target) id pairs."""
    return TokenStore.from_lists(
        {"src": [list(x) for x, _ in pairs], "tgt": [list(y) for _, y in pairs]}
    )


def _map(path: Path, dtype: np.dtype) -> np.ndarray:
    if path.stat().st_size == 0:
        return np.zeros(0, dtype)  # np.memmap cannot map an empty file
    # a plain ndarray view of the mapping: slicing an np.memmap is slower (subclass hooks;
    # docs/experiments/code_notes.md#slicing-an-npmemmap)
    return np.asarray(np.memmap(path, dtype=dtype, mode="r"))


def _load(path: Path, mmap: bool = False) -> np.ndarray:
    array = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    return np.asarray(array)


def _read_manifest(path: Path) -> dict[str, Any] | None:
    try:
        manifest = json.loads((path / _MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("format") == FORMAT else None


def _check_arrays(path: Path, manifest: dict[str, Any]) -> str:
    """'' when the files agree with the manifest, else what is wrong."""
    try:
        n, dtype = int(manifest["examples"]), np.dtype(manifest["dtype"])
        names = ["lines.npy"] + ["labels.npy"] * bool(manifest.get("labels"))
        for field in manifest["fields"]:
            size = (path / f"{field}.bin").stat().st_size
            if size != int(manifest["tokens"][field]) * dtype.itemsize:
                return f"{field}.bin has {size} bytes"
            names += [f"{field}.idx.npy", f"{field}.len.npy"]
        for name in names:
            shape = _load(path / name, mmap=True).shape
            if shape != (n,):
                return f"{name} has shape {shape}, expected ({n},)"
    except (OSError, ValueError, KeyError, TypeError) as err:
        return str(err)
    return ""


def _check_content(path: Path, manifest: dict[str, Any]) -> str:
    """'' when every file has the checksum the manifest records, else what differs."""
    recorded = manifest.get(_CHECKSUMS)
    if not isinstance(recorded, dict) or not recorded:
        return "it was built before checksums were recorded"
    return checksum_problem(path, recorded)


def _stale_reason(path: Path, key: dict[str, Any], sources: list[dict[str, Any]]) -> str | None:
    """None when ``path`` is a complete store of ``key`` built from ``sources`` as they are now;
    '' when there is no store; else why it cannot be used."""
    manifest = _read_manifest(path)
    if manifest is None:
        return "" if not path.exists() else "its build did not finish"
    if manifest.get("key") != key:
        return "it was built with other settings"
    old = {s["path"]: s for s in manifest.get("sources", [])}
    for source in sources:
        if old.get(source["path"]) != source:
            return f"{source['path']} changed since it was built"
    return _check_arrays(path, manifest) or _check_content(path, manifest) or None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path``.lock: one process builds, the others wait for it."""
    lock = path.parent / f"{path.name}.lock"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as err:
        raise write_error(lock, err) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def open_store(
    name: str,
    key: dict[str, Any],
    sources: Sequence[str | os.PathLike],
    build: Callable[[Path], dict[str, Any]],
) -> TokenStore:
    """The store of ``key`` in the data cache, built first by ``build(folder)`` when it is missing
    or stale. ``build`` writes the arrays (a :class:`StoreWriter`) and returns the manifest's
    other entries (``fields``, ``dtype``, ``examples``, ``tokens``, ``labels``, counts)."""
    key = json.loads(json.dumps(key))  # as the manifest will hold it (tuples become lists)
    prints = [fingerprint(p) for p in sources]
    path = cache_dir() / "stores" / f"{name}-{cache_key([key, [p['path'] for p in prints]])}"
    with _locked(path):
        recover_folder(path)
        reason = _stale_reason(path, key, prints)
        if reason is None:
            store = TokenStore(path)
            log.info("token store %s: %d examples (built before, reused)", path, len(store))
            return store
        if reason:
            log.warning("token store %s: %s; building it again", path, reason)
        start = time.perf_counter()
        try:
            with new_folder(path, overwrite=True) as tmp:
                built = build(tmp)
                seconds = time.perf_counter() - start
                manifest = {"format": FORMAT, "key": key, "sources": prints, **built}
                files = sorted(p.name for p in tmp.iterdir() if p.is_file())
                manifest[_CHECKSUMS] = checksums(tmp, files)
                write_json(tmp / _MANIFEST, {**manifest, "build_seconds": round(seconds, 2)})
        except OSError as err:
            if isinstance(err, OutputError):
                raise
            raise write_error(path, err) from None
        store = TokenStore(path)
        log.info("token store %s: %d examples built in %.1f s", path, len(store), seconds)
        return store
