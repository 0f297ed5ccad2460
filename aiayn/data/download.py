"""Fetching one file: from an HTTP(S) URL or a local path, with a progress bar, a sha256 check and
an atomic write. A failed or corrupt transfer never leaves a file behind.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import BinaryIO

from tqdm import tqdm

from aiayn.errors import DataError
from aiayn.io import atomic_path

__all__ = ["fetch", "sha256_of", "is_url", "SourceMissing"]

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


def _open(source: str, timeout: float) -> tuple[BinaryIO, int | None]:
    """An open binary stream for ``source`` (URL or path) and its size when known."""
    if not is_url(source) or source.startswith("file:"):
        path = Path(
            urllib.request.url2pathname(urllib.parse.urlsplit(source).path)
            if source.startswith("file:")
            else source
        )
        if not path.is_file():
            raise SourceMissing(f"{path}: no such file")
        return open(path, "rb"), path.stat().st_size
    request = urllib.request.Request(source, headers={"User-Agent": "aiayn"})
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as err:
        cls = SourceMissing if err.code in (404, 410) else DataError
        raise cls(f"{source}: HTTP {err.code} {err.reason}") from None
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise DataError(f"{source}: cannot download ({reason})") from None
    length = response.headers.get("Content-Length")
    return response, int(length) if length and length.isdigit() else None


def fetch(
    source: str,
    dest: str | os.PathLike,
    sha256: str | None,
    *,
    progress: bool | None = None,
    timeout: float = 60.0,
) -> Path:
    """Copy ``source`` (URL or path) to ``dest`` atomically, checking its length and sha256.

    ``progress``: show a progress bar on stderr (None: only when stderr is a terminal). On a
    truncated transfer or a checksum mismatch, raises DataError and leaves ``dest`` untouched.
    """
    dest = Path(dest)
    stream, total = _open(source, timeout)
    digest = hashlib.sha256()
    received = 0
    bar = tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=dest.name,
        disable=(not progress) if progress is not None else None,
        leave=False,
    )
    try:
        with stream, bar, atomic_path(dest) as tmp:
            with open(tmp, "wb") as out:
                received = _copy(stream, out, digest, bar, source)
            os.chmod(tmp, 0o644)  # a shared cache: readable like any downloaded file
            if total is not None and received != total:
                raise DataError(
                    f"{source}: truncated transfer, got {received} of {total} bytes; "
                    "nothing was saved"
                )
            if sha256 is not None and digest.hexdigest() != sha256:
                raise DataError(
                    f"{source}: checksum mismatch (sha256 {digest.hexdigest()}, expected {sha256}); "
                    "the download was removed"
                )
    except OSError as err:
        raise DataError(f"{dest}: cannot write ({err})") from None
    log.debug("fetched %s -> %s (%d bytes)", source, dest, received)
    return dest


def _copy(stream: BinaryIO, out: BinaryIO, digest, bar: tqdm, source: str) -> int:
    """Stream ``stream`` into ``out``; a failing read becomes a DataError, a failing write stays OSError."""
    received = 0
    while True:
        try:
            chunk = stream.read(_CHUNK)
        except http.client.IncompleteRead as err:
            got = received + len(err.partial)
            raise DataError(
                f"{source}: truncated transfer, got {got} of {got + (err.expected or 0)} "
                "bytes; nothing was saved"
            ) from None
        except (OSError, http.client.HTTPException) as err:
            raise DataError(
                f"{source}: transfer failed after {received} bytes ({err}); nothing was saved"
            ) from None
        if not chunk:
            return received
        out.write(chunk)
        digest.update(chunk)
        received += len(chunk)
        bar.update(len(chunk))
