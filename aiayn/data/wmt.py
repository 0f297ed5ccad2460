"""WMT 2014 English-German, the paper's data (Vaswani et al. 2017, §5.1): where its files are, and
how the official archives become the plain-text splits the loaders read.

Training: the three parallel corpora of the WMT14 shared task for En-De (Europarl v7, Common
Crawl, News Commentary v9; 4.5 M sentence pairs), the archives and inner paths that fairseq's
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
from pathlib import Path
from typing import IO, Any

from aiayn.errors import DataError
from aiayn.io import atomic_path

__all__ = [
    "WMT14_ARCHIVES",
    "WMT14_SPLITS",
    "WMT14_CANONICAL",
    "WMT14_TERMS",
    "wmt14_extract",
    "sgml_segments",
]

log = logging.getLogger(__name__)
_CHUNK = 1 << 20
LANGS = ("en", "de")

# name -> (official URL, md5 stated by sacreBLEU or "")
WMT14_ARCHIVES: dict[str, tuple[str, str]] = {
    "training-parallel-europarl-v7.tgz": (
        "https://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz",
        "",
    ),
    "training-parallel-commoncrawl.tgz": (
        "https://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz",
        "",
    ),
    "training-parallel-nc-v9.tgz": ("https://www.statmt.org/wmt14/training-parallel-nc-v9.tgz", ""),
    "test.tgz": ("https://statmt.org/wmt13/test.tgz", "48eca5d02f637af44e85186847141f67"),
    "test-full.tgz": ("https://statmt.org/wmt14/test-full.tgz", "a8cd784e006feb32ac6f3d9ec7eb389a"),
}

# The training corpora, in the order they are joined: archive -> member prefix (+ ".en" / ".de").
_TRAIN = {
    "training-parallel-europarl-v7.tgz": "training/europarl-v7.de-en",
    "training-parallel-commoncrawl.tgz": "commoncrawl.de-en",
    "training-parallel-nc-v9.tgz": "training/news-commentary-v9.de-en",
}
# The test sets: split -> (archive, {language: SGML member}).
_SGML = {
    "newstest2013": (
        "test.tgz",
        {"en": "test/newstest2013-src.en.sgm", "de": "test/newstest2013-src.de.sgm"},
    ),
    "newstest2014": (
        "test-full.tgz",
        {
            "en": "test-full/newstest2014-deen-src.en.sgm",
            "de": "test-full/newstest2014-deen-ref.de.sgm",
        },
    ),
}
WMT14_SPLITS = ("train", *_SGML)
WMT14_CANONICAL = tuple(f"{split}.{lang}.gz" for split in WMT14_SPLITS for lang in LANGS)
WMT14_TERMS = (
    "WMT14 shared task data (statmt.org/wmt14/translation-task.html): research use, cite Bojar "
    "et al. 2014 (W14-3302) and each corpus; Europarl v7 (Koehn 2005, MT Summit): freely "
    "available, statmt.org/europarl; Common Crawl (Smith et al. 2013, ACL): text crawled from the "
    "web, its pages' owners' terms apply; News Commentary v9 (statmt.org, from Project "
    "Syndicate): research use; newstest2013/2014: WMT evaluation data, cite the findings papers; "
    "any other use: ask the owners"
)


def wmt14_extract(folder: Path) -> None:
    """Write ``train``, ``newstest2013`` and ``newstest2014`` ``.{en,de}.gz`` from the archives
    in ``folder``: the training corpora joined line by line in a fixed order (each checked to have
    as many English as German lines), the test sets' segments from their SGML."""
    with atomic_path(folder / "train.en.gz") as en, atomic_path(folder / "train.de.gz") as de:
        with _gz(en) as out_en, _gz(de) as out_de:
            for archive, prefix in _TRAIN.items():
                outputs = {f"{prefix}.{lang}": out for lang, out in zip(LANGS, (out_en, out_de))}
                counts = _copy_members(folder / archive, outputs)
                if counts[f"{prefix}.en"] != counts[f"{prefix}.de"]:
                    raise DataError(
                        f"{folder / archive}: {prefix}.en has {counts[f'{prefix}.en']} lines, "
                        f"{prefix}.de {counts[f'{prefix}.de']}: the corpus is not parallel"
                    )
                log.info("%s: %d sentence pairs", prefix, counts[f"{prefix}.en"])
    for split, (archive, members) in _SGML.items():
        texts = _read_members(folder / archive, set(members.values()))
        segs = {lang: sgml_segments(texts[member]) for lang, member in members.items()}
        if len(segs["en"]) != len(segs["de"]) or not segs["en"]:
            raise DataError(
                f"{folder / archive}: {split} has {len(segs['en'])} English and "
                f"{len(segs['de'])} German segments"
            )
        for lang, lines in segs.items():
            with atomic_path(folder / f"{split}.{lang}.gz") as tmp, _gz(tmp) as gz:
                gz.write("".join(line + "\n" for line in lines).encode("utf-8"))


def _gz(path: Path) -> IO[bytes]:
    return gzip.GzipFile(path, "wb", compresslevel=6, mtime=0)  # type: ignore[return-value]


def _open_tar(archive: Path) -> tarfile.TarFile:
    try:
        return tarfile.open(archive, "r:*")
    except (tarfile.TarError, OSError, EOFError) as err:
        raise DataError(f"{archive}: cannot read the archive ({err})") from None


def _copy_members(archive: Path, outputs: dict[str, Any]) -> dict[str, int]:
    """Stream the named members of ``archive`` into their outputs (a final newline added where
    missing); returns each member's line count. DataError naming a member that is absent."""
    counts: dict[str, int] = {}
    try:
        with _open_tar(archive) as tar:
            for member in tar:
                if member.name in outputs and member.isfile():
                    counts[member.name] = _copy_lines(tar.extractfile(member), outputs[member.name])
    except (tarfile.TarError, OSError, EOFError) as err:
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
