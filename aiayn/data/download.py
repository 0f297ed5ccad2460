"""Fetching one file: from an HTTP(S) URL or a local path, with a progress bar, length, sha256
(and md5, where a cited source states one) checks and an atomic rename into place.

An interrupted transfer keeps what it received beside the destination (``.NAME.part``, with the
source and its validator in ``.NAME.part.json``), and the next fetch of the same source resumes
it: an HTTP ``Range`` request guarded by ``If-Range`` (the server's ETag or Last-Modified), so
bytes of two different versions of a file are never joined; a server that ignores the range, a
changed file, another source or a missing validator start over. A checksum mismatch removes the
partial download; nothing but a complete, verified file ever takes the destination's name.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import http.client
import json
import logging
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from aiayn.errors import DataError
from aiayn.io import write_error, write_json
from aiayn.progress import progress_bar

__all__ = ["fetch", "sha256_of", "is_url", "part_path", "SourceMissing"]

log = logging.getLogger(__name__)
_CHUNK = 1 << 20


class SourceMissing(DataError):
    """The source (a URL answering 404, or a path) does not exist."""


def is_url(location: str) -> bool:
    return urllib.parse.urlsplit(location).scheme in ("http", "https", "file")


def sha256_of(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def part_path(dest: str | os.PathLike) -> Path:
    """Where an interrupted download of ``dest`` waits to be resumed."""
    dest = Path(dest)
    return dest.parent / f".{dest.name}.part"


@dataclass
class _Source:
    """An open source: its stream, the offset it starts at, the full size and a validator."""

    stream: BinaryIO
    offset: int
    total: int | None
    validator: str


def _local_path(source: str) -> Path | None:
    if source.startswith("file:"):
        return Path(urllib.request.url2pathname(urllib.parse.urlsplit(source).path))
    return None if is_url(source) else Path(source)


def _open(source: str, timeout: float, offset: int, validator: str) -> _Source:
    """``source`` (URL or path) opened at ``offset`` when its validator is still ``validator``
    (else at 0)."""
    path = _local_path(source)
    if path is not None:
        if not path.is_file():
            raise SourceMissing(f"{path}: no such file")
        stat = path.stat()
        now = f"{stat.st_size}:{stat.st_mtime_ns}"
        offset = offset if offset and now == validator and offset <= stat.st_size else 0
        stream = open(path, "rb")
        stream.seek(offset)
        return _Source(stream, offset, stat.st_size, now)
    headers = {"User-Agent": "aiayn"}
    if offset and validator:
        headers.update({"Range": f"bytes={offset}-", "If-Range": validator})
    try:
        response = urllib.request.urlopen(
            urllib.request.Request(source, headers=headers), timeout=timeout
        )
    except urllib.error.HTTPError as err:
        if err.code == 416 and offset:  # the part is no prefix of the file any more
            return _open(source, timeout, 0, "")
        cls = SourceMissing if err.code in (404, 410) else DataError
        raise cls(f"{source}: HTTP {err.code} {err.reason}") from None
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise DataError(f"{source}: cannot download ({reason})") from None
    return _http_source(response, offset)


def _http_source(response: Any, offset: int) -> _Source:
    headers = response.headers
    validator = headers.get("ETag") or headers.get("Last-Modified") or ""
    if response.status == 206:
        match = re.fullmatch(r"bytes (\d+)-\d+/(\d+)", headers.get("Content-Range", ""))
        if match and int(match[1]) == offset:
            return _Source(response, offset, int(match[2]), validator)
        response.close()
        raise DataError(f"{response.url}: the server answered a resume with another range")
    length = headers.get("Content-Length")
    return _Source(response, 0, int(length) if length and length.isdigit() else None, validator)


@contextlib.contextmanager
def _claimed(part: Path) -> Iterator[bool]:
    """Hold ``part`` for this process; while another process downloads the same file, wait for
    it. Yields whether it waited (the other process may have put the file in place)."""
    part.parent.mkdir(parents=True, exist_ok=True)
    waited = False
    while True:
        with open(part, "ab") as handle:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                log.warning("%s: another process is downloading this file; waiting for it", part)
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
                waited = True
            if not _same_file(handle, part):  # renamed into place or removed: claim anew
                continue
            yield waited
            return


def _same_file(handle: BinaryIO, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(handle.fileno()), path.stat())
    except OSError:
        return False


@contextlib.contextmanager
def _drop_if_empty(part: Path) -> Iterator[None]:
    """On a failure before the first byte arrived, leave no empty part behind."""
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            if part.exists() and part.stat().st_size == 0:
                part.unlink()
                Path(f"{part}.json").unlink(missing_ok=True)


def _resume_point(part: Path, source: str) -> tuple[int, str]:
    """Bytes already in ``part`` and their validator, when they came from ``source``."""
    try:
        record = json.loads(Path(f"{part}.json").read_text())
        if record["source"] == source and record["validator"]:
            return part.stat().st_size, str(record["validator"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return 0, ""


def _digests(part: Path, size: int) -> list[Any]:
    """sha256 and md5 of the first ``size`` bytes of ``part`` (what a resume continues)."""
    digests = [hashlib.sha256(), hashlib.md5(usedforsecurity=False)]
    with open(part, "rb") as f:
        left = size
        while left and (chunk := f.read(min(_CHUNK, left))):
            left -= len(chunk)
            for d in digests:
                d.update(chunk)
    return digests


def fetch(
    source: str,
    dest: str | os.PathLike,
    sha256: str | None,
    *,
    md5: str | None = None,
    progress: bool | None = None,
    timeout: float = 60.0,
) -> Path:
    """Copy ``source`` (URL or path) to ``dest``, checking its length, sha256 and md5 (each when
    given); an interrupted transfer is resumed by the next call (see the module docstring).

    ``progress``: show a progress bar on stderr (None: only when stderr is a terminal). On a
    checksum mismatch, raises DataError and removes the download; ``dest`` is never touched
    unless the new file is complete and verified.
    """
    dest, part = Path(dest), part_path(dest)
    try:
        with _claimed(part) as waited, _drop_if_empty(part):
            if waited and dest.is_file() and (sha256 is None or sha256_of(dest) == sha256):
                return dest  # the process waited for fetched it
            src = _start(source, part, timeout)
            digests = _digests(part, src.offset)
            with src.stream, open(part, "r+b") as out:
                out.truncate(src.offset)
                out.seek(src.offset)
                received = _copy(src, out, digests, progress, source, part)
                out.flush()
                os.fsync(out.fileno())
            _verify(source, part, src, received, digests, sha256, md5)
            os.chmod(part, 0o644)  # a shared cache: readable like any downloaded file
            os.replace(part, dest)
            Path(f"{part}.json").unlink(missing_ok=True)
    except OSError as err:
        raise write_error(dest, err) from None
    log.debug("fetched %s -> %s (%d bytes)", source, dest, received)
    return dest


def _start(source: str, part: Path, timeout: float) -> _Source:
    """Open ``source`` where ``part`` left off (or at 0) and record where the part comes from."""
    offset, validator = _resume_point(part, source)
    src = _open(source, timeout, offset, validator)
    if src.offset:
        log.info("resuming %s at byte %d", source, src.offset)
    write_json(f"{part}.json", {"source": source, "validator": src.validator})
    return src


def _verify(
    source: str,
    part: Path,
    src: _Source,
    received: int,
    digests: list[Any],
    sha256: str | None,
    md5: str | None,
) -> None:
    """DataError when the transfer is short (the part is kept to resume) or a checksum differs
    (the part is removed)."""
    got = src.offset + received
    if src.total is not None and got != src.total:
        raise DataError(
            f"{source}: truncated transfer, got {got} of {src.total} bytes; kept in {part}, "
            "run again to resume"
        )
    for name, want, digest in (("sha256", sha256, digests[0]), ("md5", md5, digests[1])):
        if want and digest.hexdigest() != want:
            part.unlink(missing_ok=True)
            Path(f"{part}.json").unlink(missing_ok=True)
            raise DataError(
                f"{source}: checksum mismatch ({name} {digest.hexdigest()}, expected {want}); "
                "the download was removed"
            )


def _copy(
    src: _Source, out: BinaryIO, digests: list[Any], progress: bool | None, source: str, part: Path
) -> int:
    """Stream the source into ``out``; a failing read becomes a DataError (the bytes so far stay
    in the part, to resume), a failing write stays OSError."""
    bar = progress_bar(
        src.total,
        part.name[1:].removesuffix(".part"),
        "B",
        shown=progress,
        initial=src.offset,
        unit_scale=True,
        unit_divisor=1024,
    )
    received = 0
    with bar:
        while True:
            try:
                chunk = src.stream.read(_CHUNK)
            except (OSError, http.client.HTTPException) as err:
                if isinstance(err, http.client.IncompleteRead):
                    out.write(err.partial)
                    received += len(err.partial)
                    for d in digests:
                        d.update(err.partial)
                got = src.offset + received
                raise DataError(
                    f"{source}: transfer failed after {got} bytes ({type(err).__name__}); kept in "
                    f"{part}, run again to resume"
                ) from None
            if not chunk:
                return received
            out.write(chunk)
            for d in digests:
                d.update(chunk)
            received += len(chunk)
            bar.update(len(chunk))
