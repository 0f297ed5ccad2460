"""WMT14 En-De: the registered archives, their extraction and the trust-on-first-use checksums,
against a mirror of small fake archives with the official inner layout (no network)."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import tarfile

import pytest

from _data_helpers import files_in, server  # noqa: F401
from aiayn.data import DATASETS, DataConfig, download_dataset, load_translation
from aiayn.data.wmt import WMT14_EN_DE, WMT14_EN_FR, sgml_segments
from aiayn.errors import DataError


def _tar(members: dict[str, str | bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, text in members.items():
            data = text.encode("utf-8") if isinstance(text, str) else text
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _tgz(members: dict[str, str | bytes]) -> bytes:
    return gzip.compress(_tar(members), mtime=0)  # the same bytes at every call


def _sgml(lines: list[str]) -> str:
    segs = "".join(f'<seg id="{i}">{line}</seg>\n' for i, line in enumerate(lines, 1))
    return f'<srcset setid="x" srclang="any">\n<doc docid="d" genre="news">\n{segs}</doc>\n</srcset>\n'


def fake_archives() -> dict[str, bytes]:
    """The five WMT14 En-De archives, tiny, with the official member paths (and decoys)."""
    return {
        "training-parallel-europarl-v7.tgz": _tgz({
            "training/europarl-v7.de-en.en": "Resumption of the session\n\n",
            "training/europarl-v7.de-en.de": "Wiederaufnahme der Sitzungsperiode\n\n",
            "training/europarl-v7.fr-en.en": "decoy\n",
        }),
        "training-parallel-commoncrawl.tgz": _tgz({
            "commoncrawl.de-en.en": "Welcome home\n",
            "commoncrawl.de-en.de": "Willkommen daheim\n",
            "commoncrawl.de-en.annotation": "x\n",
        }),
        "training-parallel-nc-v9.tgz": _tgz({  # no final newline on either side
            "training/news-commentary-v9.de-en.en": "Gold at $10,000?",
            "training/news-commentary-v9.de-en.de": "Gold für 10.000 Dollar?",
        }),
        "test.tgz": _tgz({
            "test/newstest2013-src.en.sgm": _sgml(["A  republican   strategy ", "Two"]),
            "test/newstest2013-src.de.sgm": _sgml(["Eine republikanische Strategie", "Zwei"]),
            "test/newstest2013-src.fr.sgm": _sgml(["decoy"]),
        }),
        "test-full.tgz": _tgz({
            "test-full/newstest2014-deen-src.en.sgm": _sgml(["Gutach: Increased safety"]),
            "test-full/newstest2014-deen-ref.de.sgm": _sgml(["Gutach: Noch mehr Sicherheit"]),
        }),
    }


def _serve(server, monkeypatch, name: str, archives: dict[str, bytes]):
    """Dataset ``name``'s spec with the fake test archives' md5s, served from SERVER/m/NAME/."""
    spec = DATASETS[name]
    official = spec.layouts[1]
    files = tuple(
        dataclasses.replace(f, md5=hashlib.md5(archives[f.name]).hexdigest() if f.md5 else "")
        for f in official.files
    )
    layouts = (spec.layouts[0], dataclasses.replace(official, files=files))
    monkeypatch.setitem(DATASETS, name, dataclasses.replace(spec, layouts=layouts))
    server.routes.update({f"/m/{name}/{file}": data for file, data in archives.items()})
    return server


@pytest.fixture
def wmt(server, monkeypatch):
    return _serve(server, monkeypatch, "wmt14", fake_archives())


def test_the_registered_sources_are_the_official_ones():
    spec = DATASETS["wmt14"]
    assert spec.splits == ("train", "newstest2013", "newstest2014")
    assert [f.name for f in spec.layouts[1].files] == list(WMT14_EN_DE.archives)
    assert all(f.url.startswith(("https://www.statmt.org/", "https://statmt.org/"))
               for f in spec.layouts[1].files)
    md5 = {f.name: f.md5 for f in spec.layouts[1].files}  # sacreBLEU's wmt13 and wmt14/full
    assert md5["test.tgz"] == "48eca5d02f637af44e85186847141f67"
    assert md5["test-full.tgz"] == "a8cd784e006feb32ac6f3d9ec7eb389a"
    assert all(not f.sha256 for f in spec.layouts[1].files)  # none published: never invented


def test_prepare_extracts_the_splits_and_records_the_archives(wmt, tmp_path, monkeypatch):
    monkeypatch.setenv("AIAYN_CACHE", str(tmp_path))
    monkeypatch.setenv("AIAYN_DATA_MIRROR", f"{wmt.url}/m")
    cfg = DataConfig(dataset="wmt14", src_lang="en", tgt_lang="de", valid_split="newstest2013")
    src, tgt = load_translation(cfg, "train")
    assert src == ["Resumption of the session", "", "Welcome home", "Gold at $10,000?"]
    assert tgt == ["Wiederaufnahme der Sitzungsperiode", "", "Willkommen daheim",
                   "Gold für 10.000 Dollar?"]
    assert load_translation(cfg, "newstest2013") == (
        ["A republican strategy", "Two"], ["Eine republikanische Strategie", "Zwei"])
    assert load_translation(cfg, "newstest2014") == (
        ["Gutach: Increased safety"], ["Gutach: Noch mehr Sicherheit"])
    folder = tmp_path / "datasets" / "wmt14"
    record = json.loads((folder / "prepared.json").read_text())
    archives = fake_archives()
    assert record["fetched"] == {
        name: {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
        for name, data in archives.items()}
    assert set(record["files"]) == set(archives) | {
        f"{s}.{lang}.gz" for s in ("train", "newstest2013", "newstest2014") for lang in ("en", "de")}
    hits = dict(wmt.hits)
    download_dataset("wmt14", progress=False)
    assert wmt.hits == hits and "/m/wmt14/train.en.gz" in hits  # the extracted layout tried first


def test_a_later_download_must_match_the_first(wmt, tmp_path):
    folder = download_dataset("wmt14", mirror=f"{wmt.url}/m", cache=tmp_path, progress=False)
    (folder / "training-parallel-nc-v9.tgz").unlink()
    wmt.routes["/m/wmt14/training-parallel-nc-v9.tgz"] = _tgz({"other": "x\n"})
    with pytest.raises(DataError, match=r"nc-v9\.tgz: checksum mismatch \(sha256 .*expected "
                       + hashlib.sha256(fake_archives()["training-parallel-nc-v9.tgz"]).hexdigest()):
        download_dataset("wmt14", mirror=f"{wmt.url}/m", cache=tmp_path, progress=False)
    assert not (folder / "training-parallel-nc-v9.tgz").exists()


def test_a_cited_md5_is_checked(server, tmp_path):
    server.routes.update({f"/m/wmt14/{n}": d for n, d in fake_archives().items()})
    with pytest.raises(DataError, match=r"test\.tgz: checksum mismatch \(md5 .*expected "
                       "48eca5d02f637af44e85186847141f67"):
        download_dataset("wmt14", mirror=f"{server.url}/m", cache=tmp_path, progress=False)


def test_an_interrupted_archive_resumes(wmt, tmp_path):
    wmt.truncate.add("/m/wmt14/training-parallel-commoncrawl.tgz")
    with pytest.raises(DataError, match="commoncrawl.tgz: truncated transfer.*run again to resume"):
        download_dataset("wmt14", mirror=f"{wmt.url}/m", cache=tmp_path, progress=False)
    wmt.truncate.clear()
    folder = download_dataset("wmt14", mirror=f"{wmt.url}/m", cache=tmp_path, progress=False)
    assert len(wmt.ranges["/m/wmt14/training-parallel-commoncrawl.tgz"]) == 1
    assert wmt.hits["/m/wmt14/training-parallel-europarl-v7.tgz"] == 1  # not fetched again
    assert not [n for n in files_in(folder) if n.endswith((".part", ".part.json"))]


def test_a_corpus_that_is_not_parallel_is_refused(wmt, tmp_path):
    wmt.routes["/m/wmt14/training-parallel-commoncrawl.tgz"] = _tgz({
        "commoncrawl.de-en.en": "one\ntwo\n", "commoncrawl.de-en.de": "eins\n"})
    with pytest.raises(DataError, match=r"commoncrawl\.de-en\.en has 2 lines, commoncrawl\.de-en\.de "
                       "1: the corpus is not parallel"):
        download_dataset("wmt14", mirror=f"{wmt.url}/m", cache=tmp_path, progress=False)
    assert not (tmp_path / "datasets" / "wmt14" / "train.en.gz").exists()


def test_an_archive_without_its_member_is_named(wmt, tmp_path):
    wmt.routes["/m/wmt14/training-parallel-europarl-v7.tgz"] = _tgz({"training/other": "x"})
    with pytest.raises(DataError, match=r"europarl-v7\.tgz: no member training/europarl-v7\.de-en"):
        download_dataset("wmt14", mirror=f"{wmt.url}/m", cache=tmp_path, progress=False)


def test_en_fr_joins_five_corpora_with_gzipped_members(server, monkeypatch, tmp_path):
    fr_archives = {
        "training-parallel-europarl-v7.tgz": _tgz({
            "training/europarl-v7.fr-en.en": "Resumption\n", "training/europarl-v7.fr-en.fr": "Reprise\n"}),
        "training-parallel-commoncrawl.tgz": _tgz({
            "commoncrawl.fr-en.en": "Welcome\n", "commoncrawl.fr-en.fr": "Bienvenue\n"}),
        "training-parallel-nc-v9.tgz": _tgz({
            "training/news-commentary-v9.fr-en.en": "Gold\n",
            "training/news-commentary-v9.fr-en.fr": "Or\n"}),
        "training-parallel-un.tgz": _tgz({
            "un/undoc.2000.fr-en.en": "Resolution\n", "un/undoc.2000.fr-en.fr": "Résolution\n"}),
        "training-giga-fren.tar": _tar({  # an uncompressed tar of .gz members
            "giga-fren.release2.fixed.en.gz": gzip.compress(b"Canada\nWeb\n", mtime=0),
            "giga-fren.release2.fixed.fr.gz": gzip.compress(b"Le Canada\nLa Toile\n", mtime=0)}),
        "test.tgz": _tgz({"test/newstest2013-src.en.sgm": _sgml(["One"]),
                          "test/newstest2013-src.fr.sgm": _sgml(["Un"])}),
        "test-full.tgz": _tgz({"test-full/newstest2014-fren-src.en.sgm": _sgml(["Two"]),
                               "test-full/newstest2014-fren-ref.fr.sgm": _sgml(["Deux"])}),
    }
    assert set(fr_archives) == set(WMT14_EN_FR.archives)  # every official archive, faked
    _serve(server, monkeypatch, "wmt14_en_fr", fr_archives)
    monkeypatch.setenv("AIAYN_CACHE", str(tmp_path))
    monkeypatch.setenv("AIAYN_DATA_MIRROR", f"{server.url}/m")
    cfg = DataConfig(dataset="wmt14_en_fr", src_lang="en", tgt_lang="fr", valid_split="newstest2013")
    assert load_translation(cfg, "train") == (  # europarl, commoncrawl, UN, news commentary, giga
        ["Resumption", "Welcome", "Resolution", "Gold", "Canada", "Web"],
        ["Reprise", "Bienvenue", "Résolution", "Or", "Le Canada", "La Toile"])
    assert load_translation(cfg, "newstest2014") == (["Two"], ["Deux"])


def test_sgml_segments_as_sacrebleu_reads_them():
    text = '<doc>\n<seg id="1"> Ein  Satz\t mit &amp; Zeichen </seg>\n<p>\n<seg id="2">B</seg> \n'
    assert sgml_segments(text) == ["Ein Satz mit &amp; Zeichen", "B"]


def test_data_list_names_each_corpus_and_its_terms(capsys, tmp_path, monkeypatch):
    from aiayn.cli import main

    monkeypatch.setenv("AIAYN_CACHE", str(tmp_path))
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("wmt14"))
    assert "not cached" in lines[at] and "English-German" in lines[at]
    assert any(x.startswith("wmt14_en_fr") and "English-French" in x for x in lines)
    terms = lines[at + 1]
    for corpus in ("Europarl v7", "Common Crawl", "News Commentary v9", "newstest2013/2014"):
        assert corpus in terms
