"""Download, verification, cache and mirror: against a local HTTP server and the shared mirror."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from _data_helpers import (MIRROR, files_in, imdb_tarball, mirrored, needs_mirror,  # noqa: F401
                           real_cache, server, sha256, use_real_cache)
from aiayn.data import DATASETS, DataConfig, download_dataset, load_classification
from aiayn.data.download import SourceMissing, fetch
from aiayn.data.registry import DatasetSpec, Layout, RemoteFile
from aiayn.errors import DataError

GOOD = b"line one\nline two\n" * 1000


# ---- fetch: one file ------------------------------------------------------------------------


def test_fetch_good_file_writes_it_and_shows_progress(server, tmp_path, capsys):
    server.routes["/good.txt"] = GOOD
    dest = fetch(f"{server.url}/good.txt", tmp_path / "good.txt", sha256(GOOD), progress=True)
    assert dest.read_bytes() == GOOD
    assert files_in(tmp_path) == ["good.txt"]
    assert "good.txt" in capsys.readouterr().err  # the progress bar names the file


def test_fetch_checksum_mismatch_removes_the_download(server, tmp_path):
    server.routes["/good.txt"] = GOOD
    with pytest.raises(DataError, match=r"good\.txt: checksum mismatch.*the download was removed"):
        fetch(f"{server.url}/good.txt", tmp_path / "good.txt", "0" * 64, progress=False)
    assert files_in(tmp_path) == []


def test_fetch_failure_leaves_an_existing_file_untouched(server, tmp_path):
    (tmp_path / "good.txt").write_bytes(b"old content")
    server.routes["/good.txt"] = GOOD
    with pytest.raises(DataError, match="checksum mismatch"):
        fetch(f"{server.url}/good.txt", tmp_path / "good.txt", "0" * 64, progress=False)
    assert (tmp_path / "good.txt").read_bytes() == b"old content"
    assert files_in(tmp_path) == ["good.txt"]


def test_fetch_404_is_a_missing_source(server, tmp_path):
    with pytest.raises(SourceMissing, match=r"/nothing\.txt: HTTP 404"):
        fetch(f"{server.url}/nothing.txt", tmp_path / "x", None, progress=False)
    assert files_in(tmp_path) == []


def test_fetch_truncated_transfer_keeps_the_part_and_resumes_it(server, tmp_path):
    server.routes["/cut.txt"] = GOOD
    server.truncate.add("/cut.txt")
    with pytest.raises(DataError, match=r"cut\.txt: truncated transfer.*kept in .*run again to resume"):
        fetch(f"{server.url}/cut.txt", tmp_path / "cut.txt", sha256(GOOD), progress=False)
    assert files_in(tmp_path) == [".cut.txt.part", ".cut.txt.part.json"]  # no cut.txt
    assert (tmp_path / ".cut.txt.part").read_bytes() == GOOD[: len(GOOD) // 2]
    server.truncate.clear()
    fetch(f"{server.url}/cut.txt", tmp_path / "cut.txt", sha256(GOOD), progress=False)
    assert (tmp_path / "cut.txt").read_bytes() == GOOD
    assert files_in(tmp_path) == ["cut.txt"]
    assert server.ranges["/cut.txt"] == [f"bytes={len(GOOD) // 2}-"]  # only the rest was asked


def _interrupted(server, tmp_path, body: bytes = GOOD) -> str:
    server.routes["/f.txt"] = body
    server.truncate.add("/f.txt")
    with pytest.raises(DataError, match="truncated transfer"):
        fetch(f"{server.url}/f.txt", tmp_path / "f.txt", None, progress=False)
    server.truncate.clear()
    return f"{server.url}/f.txt"


def test_fetch_starts_over_when_the_file_changed_meanwhile(server, tmp_path):
    url = _interrupted(server, tmp_path)
    changed = b"another version\n" * 900
    server.routes["/f.txt"] = changed  # a new ETag: If-Range fails, the server sends it whole
    fetch(url, tmp_path / "f.txt", sha256(changed), progress=False)
    assert (tmp_path / "f.txt").read_bytes() == changed  # never old bytes joined to new ones


def test_fetch_without_a_validator_or_from_another_source_starts_over(server, tmp_path):
    url = _interrupted(server, tmp_path)
    server.routes["/g.txt"] = GOOD
    fetch(f"{server.url}/g.txt", tmp_path / "f.txt", sha256(GOOD), progress=False)
    assert "/g.txt" not in server.ranges  # the part came from /f.txt: not resumed from /g.txt
    (tmp_path / "f.txt").unlink()
    server.no_etag.add("/f.txt")
    _interrupted(server, tmp_path)
    fetch(url, tmp_path / "f.txt", sha256(GOOD), progress=False)
    assert (tmp_path / "f.txt").read_bytes() == GOOD and "/f.txt" not in server.ranges


def test_fetch_checks_an_md5(server, tmp_path):
    import hashlib

    server.routes["/good.txt"] = GOOD
    with pytest.raises(DataError, match=r"checksum mismatch \(md5 .*expected 0+\)"):
        fetch(f"{server.url}/good.txt", tmp_path / "good.txt", None, md5="0" * 32, progress=False)
    assert files_in(tmp_path) == []
    fetch(f"{server.url}/good.txt", tmp_path / "good.txt", None,
          md5=hashlib.md5(GOOD).hexdigest(), progress=False)
    assert (tmp_path / "good.txt").read_bytes() == GOOD


@pytest.mark.parametrize("other_succeeds", [True, False])
def test_fetch_waits_for_another_process_downloading_the_same_file(
    server, tmp_path, caplog, other_succeeds
):
    """Two runs started at once on a fresh machine (the headline's two seeds): the second waits
    for the first's download and uses its file, or downloads it itself when the first failed."""
    import fcntl
    import threading
    import time

    dest, part = tmp_path / "good.txt", tmp_path / ".good.txt.part"
    if not other_succeeds:
        server.routes["/good.txt"] = GOOD  # with the file in place no request may be made
    got: dict = {}
    waiter = threading.Thread(
        target=lambda: got.update(path=fetch(f"{server.url}/good.txt", dest, sha256(GOOD),
                                             progress=False)))
    with open(part, "ab") as other:  # the other process, mid-download
        fcntl.flock(other.fileno(), fcntl.LOCK_EX)
        caplog.set_level("WARNING", logger="aiayn.data.download")
        waiter.start()
        deadline = time.monotonic() + 10
        while "waiting for it" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "another process is downloading this file; waiting for it" in caplog.text
        assert waiter.is_alive()
        if other_succeeds:
            other.write(GOOD)
            other.flush()
            part.replace(dest)
        else:
            part.unlink()  # a checksum mismatch: the other process removed its download
    waiter.join(10)
    assert got["path"] == dest and dest.read_bytes() == GOOD
    assert files_in(tmp_path) == ["good.txt"]


def test_fetch_unreachable_host(tmp_path, server):
    url = server.url
    server.close()
    with pytest.raises(DataError, match="cannot download"):
        fetch(f"{url}/x", tmp_path / "x", None, progress=False, timeout=5)


def test_fetch_from_a_local_path(tmp_path):
    (tmp_path / "src.txt").write_bytes(GOOD)
    fetch(str(tmp_path / "src.txt"), tmp_path / "out" / "dst.txt", sha256(GOOD), progress=False)
    assert (tmp_path / "out" / "dst.txt").read_bytes() == GOOD
    with pytest.raises(SourceMissing, match="no such file"):
        fetch(str(tmp_path / "absent.txt"), tmp_path / "out" / "x", None, progress=False)


# ---- prepare: a registered dataset ----------------------------------------------------------

A, B = b"alpha\n", b"beta\n"


@pytest.fixture
def toy(monkeypatch, server):
    """A two-file dataset 'toy' (mirror folder 'toyfolder') whose official URLs are on the server."""
    spec = DatasetSpec(
        name="toy", folder="toyfolder", task="lm", splits=("train",), description="toy",
        terms="none", canonical=("a.txt", "b.txt"),
        layouts=(Layout((RemoteFile("a.txt", sha256(A), f"{server.url}/official/a.txt"),
                         RemoteFile("b.txt", sha256(B), f"{server.url}/official/b.txt"))),))
    monkeypatch.setitem(DATASETS, "toy", spec)
    return spec


def test_prepare_from_official_urls_is_idempotent(toy, server, tmp_path):
    server.routes.update({"/official/a.txt": A, "/official/b.txt": B})
    folder = download_dataset("toy", mirror="", cache=tmp_path, progress=False)
    assert folder == tmp_path / "datasets" / "toy"
    assert (folder / "a.txt").read_bytes() == A and (folder / "b.txt").read_bytes() == B
    record = json.loads((folder / "prepared.json").read_text())
    assert record["files"] == {"a.txt": sha256(A), "b.txt": sha256(B)}
    stamps = {p: p.stat().st_mtime_ns for p in folder.iterdir()}
    assert download_dataset("toy", mirror="", cache=tmp_path) == folder
    assert server.hits == {"/official/a.txt": 1, "/official/b.txt": 1}  # nothing fetched again
    assert {p: p.stat().st_mtime_ns for p in folder.iterdir()} == stamps


def test_prepare_refetches_a_corrupted_cache_file(toy, server, tmp_path):
    server.routes.update({"/official/a.txt": A, "/official/b.txt": B})
    folder = download_dataset("toy", mirror="", cache=tmp_path, progress=False)
    (folder / "b.txt").write_bytes(b"damaged")
    download_dataset("toy", mirror="", cache=tmp_path, progress=False)
    assert (folder / "b.txt").read_bytes() == B
    assert server.hits == {"/official/a.txt": 1, "/official/b.txt": 2}


def test_a_prepared_dataset_is_not_hashed_again_until_a_file_changes(toy, server, tmp_path, monkeypatch):
    from aiayn.data import registry

    server.routes.update({"/official/a.txt": A, "/official/b.txt": B})
    folder = download_dataset("toy", mirror="", cache=tmp_path, progress=False)
    hashed = []
    real = registry.sha256_of
    monkeypatch.setattr(registry, "sha256_of", lambda path: hashed.append(path.name) or real(path))
    assert registry.is_downloaded(folder) and hashed == []  # size and mtime as recorded
    (folder / "b.txt").write_bytes(B[:-1] + b"?")  # the same size, a new mtime
    assert not registry.is_downloaded(folder) and hashed == ["b.txt"]


def test_prepare_uses_the_environment_mirror_url(toy, server, tmp_path, monkeypatch):
    server.routes.update({"/m/toyfolder/a.txt": A, "/m/toyfolder/b.txt": B})
    monkeypatch.setenv("AIAYN_DATA_MIRROR", f"{server.url}/m/")
    monkeypatch.setenv("AIAYN_CACHE", str(tmp_path))
    folder = download_dataset("toy", progress=False)
    assert folder == tmp_path / "datasets" / "toy" and (folder / "a.txt").read_bytes() == A
    assert not any(path.startswith("/official") for path in server.hits)


def test_prepare_from_a_folder_mirror(toy, tmp_path):
    (tmp_path / "mirror" / "toyfolder").mkdir(parents=True)
    (tmp_path / "mirror" / "toyfolder" / "a.txt").write_bytes(A)
    (tmp_path / "mirror" / "toyfolder" / "b.txt").write_bytes(B)
    folder = download_dataset("toy", mirror=str(tmp_path / "mirror"), cache=tmp_path / "cache")
    assert files_in(folder) == ["a.txt", "b.txt", "prepared.json"]


def test_mirror_missing_a_file_names_it(toy, tmp_path):
    (tmp_path / "mirror" / "toyfolder").mkdir(parents=True)
    (tmp_path / "mirror" / "toyfolder" / "a.txt").write_bytes(A)
    with pytest.raises(DataError, match=r"toyfolder/b\.txt: no such file.*lacks a file of dataset 'toy'"):
        download_dataset("toy", mirror=str(tmp_path / "mirror"), cache=tmp_path / "cache")
    assert not (tmp_path / "cache" / "datasets" / "toy" / "prepared.json").exists()


def test_mirror_without_the_dataset(toy, server, tmp_path):
    with pytest.raises(DataError, match=r"/m/toyfolder/a\.txt: HTTP 404.*lacks dataset 'toy'"):
        download_dataset("toy", mirror=f"{server.url}/m", cache=tmp_path)


def test_a_failed_download_says_how_a_mirror_serves_instead(toy, server, tmp_path, capsys,
                                                           monkeypatch):
    """A download that fails names AIAYN_DATA_MIRROR and the files a mirror must hold (it named
    neither), and `aiayn data list` names them for every dataset."""
    with pytest.raises(DataError, match=r"/official/a\.txt: HTTP 404.*the official source.*"
                       r"without network, set AIAYN_DATA_MIRROR to a folder or URL holding "
                       r"toyfolder/ with a\.txt, b\.txt \(`aiayn data list`"):
        download_dataset("toy", mirror="", cache=tmp_path)
    server.routes["/official/a.txt"] = A  # the second file fails: named the same way
    with pytest.raises(DataError, match=r"b\.txt: HTTP 404.*AIAYN_DATA_MIRROR"):
        download_dataset("toy", mirror="", cache=tmp_path)
    with pytest.raises(DataError, match=r"lacks dataset 'toy'.*AIAYN_DATA_MIRROR=.*/m must hold "
                       r"toyfolder/ with a\.txt, b\.txt"):
        download_dataset("toy", mirror=f"{server.url}/m", cache=tmp_path / "c2")
    from aiayn.cli import main

    monkeypatch.setenv("AIAYN_CACHE", str(tmp_path / "c3"))
    capsys.readouterr()
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    assert "a mirror (AIAYN_DATA_MIRROR) holds toyfolder/ with a.txt, b.txt" in out
    assert "holds imdb/ with train.tsv.gz, test.tsv.gz or: aclImdb_v1.tar.gz" in out


def test_mirror_folder_that_does_not_exist(toy, tmp_path):
    with pytest.raises(DataError, match=r"data mirror .*nowhere: no such folder"):
        download_dataset("toy", mirror=str(tmp_path / "nowhere"), cache=tmp_path)


def test_checksum_mismatch_in_the_mirror(toy, server, tmp_path):
    server.routes.update({"/m/toyfolder/a.txt": A, "/m/toyfolder/b.txt": b"tampered\n"})
    with pytest.raises(DataError, match=r"b\.txt: checksum mismatch"):
        download_dataset("toy", mirror=f"{server.url}/m", cache=tmp_path, progress=False)
    assert files_in(tmp_path) == ["datasets/toy/a.txt"]  # the bad file removed, no record written


def test_unknown_dataset_name():
    with pytest.raises(DataError, match=r"unknown dataset 'multi30' \(did you mean 'multi30k'\?\)"):
        download_dataset("multi30")


# ---- IMDB: the official tarball layout, converted to TSV --------------------------------------


def test_imdb_official_tarball_is_parsed_to_label_text(server, tmp_path, monkeypatch):
    tarball = imdb_tarball({
        "train/pos/10_9.txt": "Great\tfilm.<br />Loved it ",
        "train/pos/2_8.txt": "Fine.",
        "train/neg/5_1.txt": "Awful.",
        "train/unsup/0_0.txt": "ignored",
        "test/neg/1_2.txt": "Bad.",
        "test/pos/3_10.txt": "Good.",
        "imdb.vocab": "ignored",
    })
    spec = DATASETS["imdb"]
    official = dataclasses.replace(spec.layouts[1].files[0], sha256=sha256(tarball),
                                   url=f"{server.url}/aclImdb_v1.tar.gz")
    layouts = (spec.layouts[0], dataclasses.replace(spec.layouts[1], files=(official,)))
    monkeypatch.setitem(DATASETS, "imdb", dataclasses.replace(spec, layouts=layouts))
    server.routes["/aclImdb_v1.tar.gz"] = tarball
    monkeypatch.setenv("AIAYN_CACHE", str(tmp_path))
    monkeypatch.setenv("AIAYN_DATA_MIRROR", "")

    texts, labels = load_classification(DataConfig(kind="classification", dataset="imdb"), "train_full")
    assert texts == ["Awful.", "Fine.", "Great film.<br />Loved it"]  # neg first, then pos by id
    assert labels == [0, 1, 1]
    assert load_classification(DataConfig(kind="classification", dataset="imdb"), "test") == (
        ["Bad.", "Good."], [0, 1])
    folder = tmp_path / "datasets" / "imdb"
    assert files_in(folder) == ["aclImdb_v1.tar.gz", "prepared.json", "test.tsv.gz", "train.tsv.gz"]

    # A mirror with the tarball but without the TSV layout: the TSVs are tried first, then it.
    (folder / "prepared.json").unlink()
    server.routes["/m/imdb/aclImdb_v1.tar.gz"] = tarball
    download_dataset("imdb", mirror=f"{server.url}/m", cache=tmp_path / "second", progress=False)
    assert server.hits["/m/imdb/train.tsv.gz"] == 1 and server.hits["/m/imdb/aclImdb_v1.tar.gz"] == 1


# ---- the real mirror -------------------------------------------------------------------------


@needs_mirror
def test_real_mirror_prepares_every_dataset(real_cache):
    assert files_in(real_cache / "datasets" / "multi30k") == sorted(
        [f"{s}.{lang}.gz" for s in ("train", "val", "test_2016_flickr", "test_2017_flickr")
         for lang in ("de", "en")] + ["prepared.json"])
    assert files_in(real_cache / "datasets" / "imdb") == ["prepared.json", "test.tsv.gz", "train.tsv.gz"]
    assert files_in(real_cache / "datasets" / "tiny_shakespeare") == ["input.txt", "prepared.json"]
    stamps = {p: p.stat().st_mtime_ns for p in real_cache.rglob("*")}
    for name in mirrored(DATASETS):  # idempotent: nothing rewritten
        download_dataset(name, mirror=MIRROR, cache=real_cache)
    assert {p: p.stat().st_mtime_ns for p in real_cache.rglob("*")} == stamps


@needs_mirror
def test_real_mirror_missing_a_file(tmp_path):
    mirror = tmp_path / "mirror" / "multi30k"
    mirror.mkdir(parents=True)
    for src in Path(MIRROR, "multi30k").glob("*.gz"):
        if src.name != "val.de.gz":
            (mirror / src.name).symlink_to(src)
    with pytest.raises(DataError, match=r"multi30k/val\.de\.gz: no such file"):
        download_dataset("multi30k", mirror=str(tmp_path / "mirror"), cache=tmp_path / "cache")


def test_cli_prepare_checksum_mismatch_exits_2_and_removes_the_file(toy, server, tmp_path, capsys,
                                                                   monkeypatch):
    from aiayn.cli import main

    server.routes.update({"/m/toyfolder/a.txt": b"tampered\n", "/m/toyfolder/b.txt": B})
    monkeypatch.setenv("AIAYN_DATA_MIRROR", f"{server.url}/m")
    monkeypatch.setenv("AIAYN_CACHE", str(tmp_path))
    rc = main(["data", "prepare", "toy"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("aiayn: error: ")
    assert "/m/toyfolder/a.txt: checksum mismatch" in err and "Traceback" not in err
    assert files_in(tmp_path) == []
    server.routes["/m/toyfolder/a.txt"] = A
    assert main(["data", "prepare", "toy"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "datasets" / "toy")
    # the flags they replaced (issue 64) are gone: one spelling, the environment's
    with pytest.raises(SystemExit):
        main(["data", "prepare", "toy", "--mirror", f"{server.url}/m"])
    assert "unrecognized arguments: --mirror" in capsys.readouterr().err


def test_unchanged_files_are_not_hashed_again(toy, server, tmp_path, monkeypatch):
    """prepared.json records each file's size and mtime with its sha256: a file whose stat is
    unchanged is taken as verified (a 1.5 GB WMT cache is not re-hashed by every process of every
    run); one touched or rewritten is hashed again."""
    import os

    import aiayn.data.registry as registry

    server.routes.update({"/official/a.txt": A, "/official/b.txt": B})
    folder = download_dataset("toy", mirror="", cache=tmp_path, progress=False)
    hashed: list[str] = []
    real = registry.sha256_of
    monkeypatch.setattr(registry, "sha256_of", lambda p: hashed.append(Path(p).name) or real(p))
    assert registry.is_downloaded(folder) and hashed == []
    os.utime(folder / "b.txt", ns=(0, 0))
    assert registry.is_downloaded(folder) and hashed == ["b.txt"]
    (folder / "a.txt").write_bytes(b"alphA\n")  # same size, new mtime, other bytes
    assert not registry.is_downloaded(folder)
