"""Content checksums of what aiayn keeps in its cache (``$AIAYN_CACHE``): checked before it is
trusted, as SQLite and PostgreSQL check their pages.

A cached thing records what it was built from (its key) and a CRC-32 of each of its files,
written when it is built. Opening it checks both: a file whose bytes changed since (overwritten
with random bytes or with other valid ids of the same size, swapped with another cache entry's,
cut short) is found and the thing is rebuilt, never read.

Cost: CRC-32 (zlib, read 4 MiB at a time), the cheapest of the checksums timed, still reads the
whole file (docs/experiments/code_notes.md#cache-checksums-crc-32-against-blake2b-and-sha256).
So a file is checked in full once per process: the first open reads it whole, later opens of the
same file (same inode, size and mtime) in that process trust the first check. From a cold disk,
the disk's read rate bounds that first check instead.

Single-file entries (a cached tokenizer, a compiled package) carry their record beside them, in
``NAME.sum.json`` (:func:`seal`, :func:`seal_problem`); a folder entry (a token store) keeps its
checksums in its own manifest (:func:`checksums`, :func:`checksum_problem`).
"""

from __future__ import annotations

import json
import os
import threading
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from aiayn.io import write_json

__all__ = [
    "ALGORITHM",
    "file_checksum",
    "checksums",
    "checksum_problem",
    "seal",
    "seal_path",
    "seal_problem",
]

ALGORITHM = "crc32"
_CHUNK = 1 << 22
_SEAL_FORMAT = "aiayn-cache-seal/1"


class _Verified:
    """The files this process has checked in full, by (device, inode, size, mtime_ns, checksum):
    a file renamed since (a folder swapped in) is the same file; one written since has another
    mtime (or inode, or size) and is checked again."""

    def __init__(self) -> None:
        self._seen: set[tuple[int, int, int, int, str]] = set()
        self._lock = threading.Lock()

    @staticmethod
    def _key(path: Path, expected: str) -> tuple[int, int, int, int, str] | None:
        try:
            st = path.stat()
        except OSError:
            return None
        return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, expected

    def seen(self, path: Path, expected: str) -> bool:
        key = self._key(path, expected)
        with self._lock:
            return key is not None and key in self._seen

    def add(self, path: Path, expected: str) -> None:
        key = self._key(path, expected)
        if key is not None:
            with self._lock:
                self._seen.add(key)


_VERIFIED = _Verified()


def file_checksum(path: str | os.PathLike) -> str:
    """``crc32:XXXXXXXX`` of the file's bytes, read 4 MiB at a time (OSError when unreadable)."""
    crc = 0
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            crc = zlib.crc32(view[:n], crc)
    return f"{ALGORITHM}:{crc:08x}"


def checksums(folder: str | os.PathLike, names: Iterable[str]) -> dict[str, str]:
    """``{name: checksum}`` of the files ``names`` of ``folder`` (what a manifest records); each
    counts as checked in this process."""
    folder = Path(folder)
    out = {}
    for name in names:
        out[name] = file_checksum(folder / name)
        _VERIFIED.add(folder / name, out[name])
    return out


def checksum_problem(folder: str | os.PathLike, recorded: Mapping[str, Any]) -> str:
    """'' when every file of ``recorded`` ({name: checksum}) still has its checksum, else what
    differs (naming the file). Files checked before in this process and unchanged since are not
    read again."""
    folder = Path(folder)
    for name, expected in recorded.items():
        path = folder / name
        if _VERIFIED.seen(path, str(expected)):
            continue
        try:
            found = file_checksum(path)
        except OSError as err:
            return f"{path}: cannot be read ({err.strerror or err})"
        if found != expected:
            return f"{path}: its content changed since it was built (checksum {found}, recorded {expected})"
        _VERIFIED.add(path, found)
    return ""


def seal_path(path: str | os.PathLike) -> Path:
    """Where the record of a single-file cache entry lives: ``NAME.sum.json`` beside it."""
    path = Path(path)
    return path.with_name(f"{path.name}.sum.json")


def seal(path: str | os.PathLike, built_from: Any) -> None:
    """Record beside the finished file ``path`` what it was built from and its checksum."""
    path = Path(path)
    record = {
        "format": _SEAL_FORMAT,
        "built_from": json.loads(json.dumps(built_from)),
        "size": path.stat().st_size,
        "checksum": checksums(path.parent, [path.name])[path.name],
    }
    write_json(seal_path(path), record)


def seal_problem(path: str | os.PathLike, built_from: Any) -> str:
    """'' when ``path`` is what :func:`seal` recorded for ``built_from`` and its bytes are
    unchanged; else why it cannot be trusted (naming the file)."""
    path, record_path = Path(path), seal_path(path)
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"{record_path} is missing (built before checksums were recorded)"
    except (OSError, ValueError) as err:
        return f"{record_path}: unreadable ({err})"
    if not isinstance(record, dict) or record.get("format") != _SEAL_FORMAT:
        return f"{record_path}: not a cache record"
    if record.get("built_from") != json.loads(json.dumps(built_from)):
        return f"{path} was built with other settings ({record_path} says so)"
    try:
        size = path.stat().st_size
    except OSError as err:
        return f"{path}: cannot be read ({err.strerror or err})"
    if size != record.get("size"):
        return f"{path} has {size} bytes, {record.get('size')} when it was built"
    return checksum_problem(path.parent, {path.name: record.get("checksum")})
