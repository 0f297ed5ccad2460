"""Shared fixtures of the data tests: a local HTTP server, a toy dataset, the real-data mirror."""

from __future__ import annotations

import hashlib
import http.server
import io
import os
import tarfile
import threading
from pathlib import Path

import pytest

MIRROR = os.environ.get("AIAYN_DATA_MIRROR", "")
needs_mirror = pytest.mark.skipif(
    not MIRROR, reason="real data: set AIAYN_DATA_MIRROR to a data mirror (make test sets it to "
                       "../shared/data when present); skipped so that a plain test run never downloads")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class FileServer:
    """Serves ``routes`` (URL path -> bytes) on 127.0.0.1; paths in ``truncate`` are cut in half
    after a full Content-Length header; anything else is a 404. Counts requests per path.

    Like a real file server it sends an ETag (but not for paths in ``no_etag``) and answers a
    ``Range: bytes=N-`` request with 206 from byte N when its ``If-Range`` (if any) is that ETag;
    the Range headers received are listed per path in ``ranges``."""

    def __init__(self) -> None:
        self.routes: dict[str, bytes] = {}
        self.truncate: set[str] = set()
        self.no_etag: set[str] = set()
        self.hits: dict[str, int] = {}
        self.ranges: dict[str, list[str]] = {}
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                server.hits[self.path] = server.hits.get(self.path, 0) + 1
                body = server.routes.get(self.path)
                if body is None:
                    self.send_error(404, "Not Found")
                    return
                etag = f'"{sha256(body)[:16]}"'
                start = self._range_start(etag)
                self.send_response(206 if start else 200)
                if self.path not in server.no_etag:
                    self.send_header("ETag", etag)
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                body = body[start:]
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.path in server.truncate:
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body)

            def _range_start(self, etag: str) -> int:
                wanted = self.headers.get("Range")
                if not wanted:
                    return 0
                server.ranges.setdefault(self.path, []).append(wanted)
                if_range = self.headers.get("If-Range")
                if self.path in server.no_etag or (if_range and if_range != etag):
                    return 0  # the whole file, as a server does when the file changed
                return int(wanted.removeprefix("bytes=").rstrip("-"))

            def log_message(self, *args) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    srv = FileServer()
    yield srv
    srv.close()


def imdb_tarball(reviews: dict[str, str]) -> bytes:
    """A small aclImdb-style .tar.gz: member path (under aclImdb/) -> review text."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in reviews.items():
            data = text.encode("utf-8")
            info = tarfile.TarInfo(f"aclImdb/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def files_in(folder: Path) -> list[str]:
    """Every file under ``folder`` (relative names, sorted): checks that nothing stray was left."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def mirrored(datasets) -> list[str]:
    """The registered datasets the real mirror carries (it has no WMT14: 1.5 GB of archives)."""
    return [name for name, spec in datasets.items() if Path(MIRROR, spec.folder).is_dir()]


_SHARED: dict[str, object] = {}  # module-level, so every test module shares one copy


@pytest.fixture
def real_cache(tmp_path_factory):
    """A cache folder holding all registered datasets, prepared once (per session) from the mirror."""
    if not MIRROR:
        pytest.skip("real data: AIAYN_DATA_MIRROR is not set")
    if "cache" not in _SHARED:
        from aiayn.data import DATASETS, download_dataset

        cache = tmp_path_factory.mktemp("aiayn_cache")
        for name in mirrored(DATASETS):
            download_dataset(name, mirror=MIRROR, cache=cache, progress=False)
        _SHARED["cache"] = cache
    return _SHARED["cache"]


@pytest.fixture
def use_real_cache(real_cache, monkeypatch):
    """Point AIAYN_CACHE at the prepared real-data cache for one test."""
    monkeypatch.setenv("AIAYN_CACHE", str(real_cache))
    return real_cache


@pytest.fixture
def multi30k_bpe(use_real_cache):
    """The default BPE tokenizer (8000) trained on Multi30k train, trained once per session."""
    if "bpe" not in _SHARED:
        from aiayn.data import DataConfig, train_tokenizer_for

        _SHARED["bpe"] = train_tokenizer_for(DataConfig(dataset="multi30k", vocab_size=8000))
    return _SHARED["bpe"]
