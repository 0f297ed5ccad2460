"""WMT 2014 English-German, the paper's data (Vaswani et al. 2017, §5.1): where its files are, and
how the official archives become the plain-text splits the loaders read.

Training: the three parallel corpora of the WMT14 shared task for En-De (Europarl v7, Common
Crawl, News Commentary v9; 4.5 M sentence pairs; En-Fr adds the UN and 10^9 corpora), the archives and inner paths that fairseq's
``examples/translation/prepare-wmt14en2de.sh --icml17`` uses. Validation:
newstest2013; test: newstest2014, the full 3,003-sentence release (sacreBLEU's ``wmt14/full``,
the set fairseq's script evaluates on). The test sets are SGML; a segment's text is taken as
sacreBLEU takes it (``<seg id=...>TEXT</seg>``, whitespace runs to one space, ends stripped), so
the references are sacreBLEU's. md5s of the two test archives are sacreBLEU's
(``sacrebleu/dataset/__init__.py``, entries ``wmt13`` and ``wmt14/full``); no source states a
checksum of the training archives, so their size and sha256 are recorded on first download
(:mod:`aiayn.data.registry`).
"""

from __future__ import annotations

import gzip
import logging
import re
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from aiayn.errors import DataError
from aiayn.io import atomic_path

__all__ = ["WmtData", "WMT14_EN_DE", "WMT14_EN_FR", "sgml_segments"]

log = logging.getLogger(__name__)
_CHUNK = 1 << 20

_STATMT = "https://www.statmt.org/"
# The test archives, with the md5s sacreBLEU states for them (its "wmt13" and "wmt14/full").
_TESTS = {
    "test.tgz": ("https://statmt.org/wmt13/test.tgz", "48eca5d02f637af44e85186847141f67"),
    "test-full.tgz": ("https://statmt.org/wmt14/test-full.tgz", "a8cd784e006feb32ac6f3d9ec7eb389a"),
}
_TERMS = (
    "WMT14 shared task data (statmt.org/wmt14/translation-task.html): research use, cite Bojar "
    "et al. 2014 (W14-3302) and each corpus; Europarl v7 (Koehn 2005, MT Summit): freely "
    "available, statmt.org/europarl; Common Crawl (Smith et al. 2013, ACL): text crawled from the "
    "web, its pages' owners' terms apply; News Commentary v9 (statmt.org, from Project "
    "Syndicate): research use; newstest2013/2014: WMT evaluation data, cite the findings papers; "
)


@dataclass(frozen=True)
class WmtData:
    """One WMT14 language pair: its archives, how they join into ``train`` and where the test
    sets' SGML lies. English is the source side of every file name (``train.en.gz``)."""

    other: str  # the language paired with English
    # name -> (official URL, md5 stated by sacreBLEU or "")
    archives: dict[str, tuple[str, str]]
    # the training corpora, in the order they are joined: archive -> member prefix (+ ".en" /
    # ".OTHER", then ".gz" when the members are gzipped inside the archive)
    train: dict[str, str]
    # the test sets: split -> (archive, {language: SGML member})
    sgml: dict[str, tuple[str, dict[str, str]]]
    terms: str
    gzipped_members: tuple[str, ...] = ()  # archives whose members are .gz files

    @property
    def langs(self) -> tuple[str, str]:
        return ("en", self.other)

    @property
    def splits(self) -> tuple[str, ...]:
        return ("train", *self.sgml)

    @property
    def canonical(self) -> tuple[str, ...]:
        return tuple(f"{split}.{lang}.gz" for split in self.splits for lang in self.langs)

    def extract(self, folder: Path) -> None:
        """Write ``train`` and the test splits, ``.{en,OTHER}.gz``, from the archives in
        ``folder``: the training corpora joined line by line in a fixed order (each checked to
        have as many lines on both sides), the test sets' segments from their SGML."""
        en, other = self.langs
        with (
            atomic_path(folder / f"train.{en}.gz") as a,
            atomic_path(folder / f"train.{other}.gz") as b,
        ):
            with _gz(a) as out_a, _gz(b) as out_b:
                for archive, prefix in self.train.items():
                    gz = ".gz" if archive in self.gzipped_members else ""
                    names = [f"{prefix}.{lang}{gz}" for lang in self.langs]
                    counts = _copy_members(folder / archive, dict(zip(names, (out_a, out_b))))
                    if counts[names[0]] != counts[names[1]]:
                        raise DataError(
                            f"{folder / archive}: {names[0]} has {counts[names[0]]} lines, "
                            f"{names[1]} {counts[names[1]]}: the corpus is not parallel"
                        )
                    log.info("%s: %d sentence pairs", prefix, counts[names[0]])
        for split, (archive, members) in self.sgml.items():
            texts = _read_members(folder / archive, set(members.values()))
            segs = [sgml_segments(texts[members[lang]]) for lang in self.langs]
            if len(segs[0]) != len(segs[1]) or not segs[0]:
                raise DataError(
                    f"{folder / archive}: {split} has {len(segs[0])} {en} and {len(segs[1])} "
                    f"{other} segments"
                )
            for lang, lines in zip(self.langs, segs):
                with atomic_path(folder / f"{split}.{lang}.gz") as tmp, _gz(tmp) as out:
                    out.write("".join(line + "\n" for line in lines).encode("utf-8"))


def _newstests(other: str) -> dict[str, tuple[str, dict[str, str]]]:
    """newstest2013 (WMT13's test.tgz) and the full newstest2014 (WMT14's test-full.tgz) of
    English and ``other``, as sacreBLEU's ``wmt13`` and ``wmt14/full`` name their members."""
    year14 = f"test-full/newstest2014-{other}en"
    return {
        "newstest2013": (
            "test.tgz",
            {"en": "test/newstest2013-src.en.sgm", other: f"test/newstest2013-src.{other}.sgm"},
        ),
        "newstest2014": (
            "test-full.tgz",
            {"en": f"{year14}-src.en.sgm", other: f"{year14}-ref.{other}.sgm"},
        ),
    }


WMT14_EN_DE = WmtData(
    other="de",
    archives={
        "training-parallel-europarl-v7.tgz": (
            _STATMT + "wmt13/training-parallel-europarl-v7.tgz",
            "",
        ),
        "training-parallel-commoncrawl.tgz": (
            _STATMT + "wmt13/training-parallel-commoncrawl.tgz",
            "",
        ),
        "training-parallel-nc-v9.tgz": (_STATMT + "wmt14/training-parallel-nc-v9.tgz", ""),
        **_TESTS,
    },
    train={
        "training-parallel-europarl-v7.tgz": "training/europarl-v7.de-en",
        "training-parallel-commoncrawl.tgz": "commoncrawl.de-en",
        "training-parallel-nc-v9.tgz": "training/news-commentary-v9.de-en",
    },
    sgml=_newstests("de"),
    terms=_TERMS + "any other use: ask the owners",
)

# The paper's En-Fr data (§5.1: 36 M sentence pairs): the same three corpora plus the UN corpus
# and the 10^9 French-English corpus, as in fairseq's examples/translation/prepare-wmt14en2fr.sh.
WMT14_EN_FR = WmtData(
    other="fr",
    archives={
        **{k: v for k, v in WMT14_EN_DE.archives.items() if k.startswith("training")},
        "training-parallel-un.tgz": (_STATMT + "wmt13/training-parallel-un.tgz", ""),
        "training-giga-fren.tar": (_STATMT + "wmt10/training-giga-fren.tar", ""),
        **_TESTS,
    },
    train={
        "training-parallel-europarl-v7.tgz": "training/europarl-v7.fr-en",
        "training-parallel-commoncrawl.tgz": "commoncrawl.fr-en",
        "training-parallel-un.tgz": "un/undoc.2000.fr-en",
        "training-parallel-nc-v9.tgz": "training/news-commentary-v9.fr-en",
        "training-giga-fren.tar": "giga-fren.release2.fixed",
    },
    sgml=_newstests("fr"),
    terms=_TERMS + "UN corpus (undoc.2000, WMT13 release): United Nations documents; 10^9 "
    "French-English corpus (WMT10 release): web-crawled text; any other use: ask the owners",
    gzipped_members=("training-giga-fren.tar",),
)


def _gz(path: Path) -> IO[bytes]:
    return gzip.GzipFile(path, "wb", compresslevel=6, mtime=0)  # type: ignore[return-value]


def _open_tar(archive: Path) -> tarfile.TarFile:
    try:
        return tarfile.open(archive, "r:*")
    except (tarfile.TarError, OSError, EOFError) as err:
        raise DataError(f"{archive}: cannot read the archive ({err})") from None


def _copy_members(archive: Path, outputs: dict[str, Any]) -> dict[str, int]:
    """Stream the named members of ``archive`` into their outputs (``.gz`` members
    decompressed, a final newline added where missing); returns each member's line count.
    DataError naming a member that is absent or unreadable."""
    counts: dict[str, int] = {}
    try:
        with _open_tar(archive) as tar:
            for member in tar:
                if member.name in outputs and member.isfile():
                    handle = tar.extractfile(member)
                    if handle is not None and member.name.endswith(".gz"):
                        handle = gzip.GzipFile(fileobj=handle)  # type: ignore[assignment]
                    counts[member.name] = _copy_lines(handle, outputs[member.name])
    except (tarfile.TarError, OSError, EOFError, zlib.error) as err:
        raise DataError(f"{archive}: cannot read the archive ({err})") from None
    missing = sorted(set(outputs) - set(counts))
    if missing:
        raise DataError(f"{archive}: no member {missing[0]}")
    return counts


def _copy_lines(source: IO[bytes] | None, out: Any) -> int:
    lines, last = 0, b"\n"
    while source is not None and (chunk := source.read(_CHUNK)):
        out.write(chunk)
        lines += chunk.count(b"\n")
        last = chunk[-1:]
    if last != b"\n":
        out.write(b"\n")
        lines += 1
    return lines


def _read_members(archive: Path, names: set[str]) -> dict[str, str]:
    """The named (small) members of ``archive`` as text; DataError naming one absent or not UTF-8."""
    texts: dict[str, str] = {}
    try:
        with _open_tar(archive) as tar:
            for member in tar:
                handle = tar.extractfile(member) if member.name in names else None
                if handle is not None:
                    data = handle.read()
                    try:
                        texts[member.name] = data.decode("utf-8")
                    except UnicodeDecodeError:
                        raise DataError(f"{archive}: {member.name}: not valid UTF-8") from None
    except (tarfile.TarError, OSError, EOFError) as err:
        raise DataError(f"{archive}: cannot read the archive ({err})") from None
    missing = sorted(names - set(texts))
    if missing:
        raise DataError(f"{archive}: no member {missing[0]}")
    return texts


_SEG = re.compile(r"<seg.*?>(.*)</seg>.*?")


def sgml_segments(text: str) -> list[str]:
    """The segments of a WMT SGML file, exactly as sacreBLEU extracts them (its
    ``FakeSGMLDataset``: the text between the tags, whitespace runs to one space, ends stripped)."""
    return [
        re.sub(r"\s+", " ", _SEG.sub(r"\1", line).strip())
        for line in text.splitlines()
        if line.startswith("<seg ")
    ]
