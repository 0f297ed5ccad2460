"""Named datasets: where their files come from, their checksums, and how to fetch them into the cache.

``download_dataset(name)`` downloads a dataset's files into ``$AIAYN_CACHE/datasets/NAME`` (default cache
``~/.cache/aiayn``), verifies each sha256, writes atomically and records what it verified in
``prepared.json`` (each file's sha256, size and mtime), so a second call hashes nothing unless a
file's size or mtime changed. ``$AIAYN_DATA_MIRROR`` (a folder or a base URL
laid out as ``FOLDER/FILE``) replaces the official sources: nothing is then fetched from anywhere
else. A mirror may offer a dataset in another layout (IMDB as two TSV files instead of the
official tarball); layouts are tried in order.
"""

from __future__ import annotations

import difflib
import gzip
import json
import logging
import os
import re
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiayn.data.download import SourceMissing, fetch, is_url, sha256_of
from aiayn.data.wmt import WMT14_EN_DE, WMT14_EN_FR, WmtData
from aiayn.errors import DataError
from aiayn.io import atomic_path, write_json
from aiayn.kinds import CLASSIFICATION, IMAGE_CLASSIFICATION, LM, TRANSLATION

__all__ = [
    "RemoteFile",
    "Layout",
    "DatasetSpec",
    "DATASETS",
    "get_spec",
    "download_dataset",
    "cache_dir",
    "mirror_location",
    "mirror_files",
    "is_downloaded",
]

log = logging.getLogger(__name__)
_MARKER = "prepared.json"


@dataclass(frozen=True)
class RemoteFile:
    """One file of a dataset: its name in the dataset folder, its sha256, its official URL."""

    name: str
    sha256: str  # "" when no citable source publishes it: recorded on the first download
    url: str = ""  # "" when only mirrors carry this file (a converted layout)
    md5: str = ""  # where a cited table (sacreBLEU's) states one, checked as well


@dataclass(frozen=True)
class Layout:
    """A set of files that together make a dataset, plus the step turning them into its canonical files."""

    files: tuple[RemoteFile, ...]
    derive: Callable[[Path], None] | None = None

    @property
    def official(self) -> bool:
        return all(f.url for f in self.files)


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    folder: str  # FOLDER in a mirror's FOLDER/FILE layout
    task: str  # translation | classification | lm
    splits: tuple[str, ...]
    description: str
    terms: str
    layouts: tuple[Layout, ...]
    canonical: tuple[str, ...]  # the files the loaders read, whichever layout was fetched


# ---- Multi30k task 1 (Elliott et al. 2016), pinned to the commit the checksums were taken at ------
_M30K_BASE = (
    "https://raw.githubusercontent.com/multi30k/dataset/"
    "a3d2e0d26b56f3846f66a952536ffed4e401d05a/data/task1/raw/"
)
_M30K_SHA = {
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2017_flickr.de.gz": "a2c89666db00c495cd8513b9d708d5a3acc205d7de312ef2bf5fb7ebc1540aee",
    "test_2017_flickr.en.gz": "76a444ee25172e72695cddb13ae4a3bda59430617be88e0bb46b60504f054074",
}

# ---- IMDB, Large Movie Review Dataset v1.0 (Maas et al. 2011) -----------------------------------
_IMDB_TARBALL = RemoteFile(
    "aclImdb_v1.tar.gz",
    "c40f74a18d3b61f90feba1e17730e0d38e8b97c05fde7008942e91923d1658fe",
    "https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz",
)
_IMDB_TSV = (
    RemoteFile("train.tsv.gz", "7b18f9ec167646508321b9c3a21e9570970acf15e94e876291f46d735745303b"),
    RemoteFile("test.tsv.gz", "3849c4e532a2ee7d9198adf8d1ab8ade49475662989d771aea3281de65b041af"),
)

# ---- Tiny Shakespeare (Karpathy's char-rnn) -----------------------------------------------------
_SHAKESPEARE = RemoteFile(
    "input.txt",
    "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
    "https://raw.githubusercontent.com/karpathy/char-rnn/"
    "6f9487a6fe5b420b7ca9afb0d7c078e37c1d1b4e/data/tinyshakespeare/input.txt",
)

# ---- Fashion-MNIST (Xiao et al. 2017), the four IDX files ---------------------------------------
_FASHION_BASE = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
# sha256 of the decompressed files: a mirror may compress them again (other .gz bytes, the same
# contents), so the .gz files are recorded on first download and their contents checked here.
FASHION_MNIST_SHA = {
    "train-images-idx3-ubyte": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
    "train-labels-idx1-ubyte": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
    "t10k-images-idx3-ubyte": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
    "t10k-labels-idx1-ubyte": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
}


def fashion_mnist_decompress(folder: Path) -> None:
    """Decompress the four .gz files of Fashion-MNIST beside them, each checked against the
    sha256 of the upstream contents (DataError naming the file when it differs)."""
    for name, sha256 in FASHION_MNIST_SHA.items():
        with atomic_path(folder / name) as tmp:
            try:
                with gzip.open(folder / f"{name}.gz", "rb") as src, open(tmp, "wb") as dst:
                    while block := src.read(1 << 20):
                        dst.write(block)
            except (OSError, EOFError) as err:
                raise DataError(f"{folder / name}.gz: cannot decompress ({err})") from None
            if sha256_of(tmp) != sha256:
                raise DataError(
                    f"{folder / name}.gz: its contents are not Fashion-MNIST's {name} (sha256 "
                    f"differs from {sha256[:12]}…); delete it and download again"
                )


_IMDB_MEMBER = re.compile(r"^aclImdb/(train|test)/(pos|neg)/(\d+)_\d+\.txt$")


def imdb_tarball_to_tsv(folder: Path) -> None:
    """Convert the official aclImdb tarball into ``train.tsv.gz`` / ``test.tsv.gz`` (``label<TAB>text``).

    Same conversion as the shared mirror: label 1 = pos, 0 = neg; negatives first, then
    positives, by review id; TABs and line breaks inside a review become spaces; stripped.
    """
    rows: dict[str, list[tuple[int, int, str]]] = {"train": [], "test": []}
    tarball = folder / _IMDB_TARBALL.name
    log.info("converting %s to train.tsv.gz and test.tsv.gz", tarball)
    try:
        with tarfile.open(tarball, "r:gz") as tar:
            for member in tar:
                match = _IMDB_MEMBER.match(member.name)
                if not match or not member.isfile():
                    continue
                split, polarity, review_id = match.groups()
                handle = tar.extractfile(member)
                if handle is None:  # not a regular file after all
                    continue
                raw = handle.read()
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError:
                    raise DataError(f"{tarball}: {member.name}:1: not valid UTF-8") from None
                text = re.sub(r"[\t\r\n]", " ", text).strip()
                rows[split].append((int(polarity == "pos"), int(review_id), text))
    except (tarfile.TarError, OSError, EOFError) as err:
        raise DataError(f"{tarball}: cannot read the tarball ({err})") from None
    for split, items in rows.items():
        if not items:
            raise DataError(f"{tarball}: no reviews under aclImdb/{split}/pos or neg")
        items.sort()
        body = "".join(f"{label}\t{text}\n" for label, _, text in items).encode("utf-8")
        with atomic_path(folder / f"{split}.tsv.gz") as tmp:
            with gzip.GzipFile(tmp, "wb", mtime=0) as f:
                f.write(body)


def _wmt_spec(name: str, data: WmtData, description: str) -> DatasetSpec:
    """A WMT14 pair: a mirror may carry the extracted splits, else the official archives
    (sha256 of either recorded on first download, md5 checked where sacreBLEU states one)."""
    return DatasetSpec(
        name=name,
        folder=name,
        task=TRANSLATION,
        splits=data.splits,
        description=description,
        terms=data.terms,
        layouts=(
            Layout(tuple(RemoteFile(n, "") for n in data.canonical)),
            Layout(
                tuple(RemoteFile(n, "", url, md5) for n, (url, md5) in data.archives.items()),
                derive=data.extract,
            ),
        ),
        canonical=data.canonical,
    )


DATASETS: dict[str, DatasetSpec] = {
    "multi30k": DatasetSpec(
        name="multi30k",
        folder="multi30k",
        task=TRANSLATION,
        splits=("train", "val", "test_2016_flickr", "test_2017_flickr"),
        description="Multi30k task 1, English-German image captions (29,000 training pairs)",
        terms="non-commercial research and education; cite Elliott et al. 2016 (W16-3210)",
        layouts=(Layout(tuple(RemoteFile(n, h, _M30K_BASE + n) for n, h in _M30K_SHA.items())),),
        canonical=tuple(_M30K_SHA),
    ),
    "imdb": DatasetSpec(
        name="imdb",
        folder="imdb",
        task=CLASSIFICATION,
        splits=("train", "val", "train_full", "test", "train_head", "val_tail"),
        description="IMDB movie reviews, positive/negative (25,000 train, 25,000 test)",
        terms="cite Maas et al., ACL 2011",
        layouts=(Layout(_IMDB_TSV), Layout((_IMDB_TARBALL,), derive=imdb_tarball_to_tsv)),
        canonical=("train.tsv.gz", "test.tsv.gz"),
    ),
    "tiny_shakespeare": DatasetSpec(
        name="tiny_shakespeare",
        folder="shakespeare",
        task=LM,
        splits=("train", "val"),
        description="Tiny Shakespeare, 1.1M characters for character-level language modelling",
        terms="public-domain text (char-rnn repository: MIT)",
        layouts=(Layout((_SHAKESPEARE,)),),
        canonical=("input.txt",),
    ),
    "fashion_mnist": DatasetSpec(
        name="fashion_mnist",
        folder="fashion_mnist",
        task=IMAGE_CLASSIFICATION,
        splits=("train", "val", "train_full", "test"),
        description="Fashion-MNIST, 28x28 grey images of clothes in 10 classes (60,000 train, "
        "10,000 test); val: a seeded data.valid_fraction of train",
        terms="MIT (Zalando SE 2017); cite Xiao, Rasul, Vollgraf 2017 (arXiv:1708.07747)",
        layouts=(
            Layout(
                tuple(
                    RemoteFile(f"{n}.gz", "", f"{_FASHION_BASE}{n}.gz") for n in FASHION_MNIST_SHA
                ),
                derive=fashion_mnist_decompress,
            ),
        ),
        canonical=tuple(FASHION_MNIST_SHA),
    ),
    "wmt14": _wmt_spec(
        "wmt14",
        WMT14_EN_DE,
        "WMT 2014 English-German, the paper's data: 4.5M training pairs (Europarl v7, Common "
        "Crawl, News Commentary v9), newstest2013 (val), newstest2014 (test)",
    ),
    "wmt14_en_fr": _wmt_spec(
        "wmt14_en_fr",
        WMT14_EN_FR,
        "WMT 2014 English-French, the paper's data: ~36M training pairs (the En-De corpora + UN "
        "+ 10^9 French-English), newstest2013 (val), newstest2014 (test); ~7 GB of archives",
    ),
}


def get_spec(name: str) -> DatasetSpec:
    if name not in DATASETS:
        close = difflib.get_close_matches(name, list(DATASETS), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise DataError(f"unknown dataset '{name}'{hint}; known: {', '.join(DATASETS)}")
    return DATASETS[name]


def cache_dir() -> Path:
    """``$AIAYN_CACHE`` or ``~/.cache/aiayn``."""
    return Path(os.environ.get("AIAYN_CACHE") or Path.home() / ".cache" / "aiayn").expanduser()


def mirror_location(mirror: str, spec: DatasetSpec, name: str) -> str:
    """Where FILE of a dataset lies in a mirror (a folder or a base URL)."""
    if is_url(mirror):
        return f"{mirror.rstrip('/')}/{spec.folder}/{name}"
    return str(Path(mirror).expanduser() / spec.folder / name)


def mirror_files(spec: DatasetSpec) -> str:
    """What a mirror must hold for ``spec``: ``FOLDER/`` and the files of one of its layouts
    (``a, b or: c, d``), for `aiayn data list` and the errors of a failed download."""
    layouts = " or: ".join(", ".join(f.name for f in layout.files) for layout in spec.layouts)
    return f"{spec.folder}/ with {layouts}"


def mirror_hint(spec: DatasetSpec, mirror: str) -> str:
    """How to fetch ``spec`` from elsewhere, said after a failed download."""
    if mirror:
        return f" (AIAYN_DATA_MIRROR={mirror} must hold {mirror_files(spec)})"
    return (
        f"; without network, set AIAYN_DATA_MIRROR to a folder or URL holding "
        f"{mirror_files(spec)} (`aiayn data list` names every dataset's files)"
    )


def _read_marker(folder: Path) -> dict[str, Any]:
    try:
        record = json.loads((folder / _MARKER).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _stat(path: Path) -> list[int]:
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns]


def is_downloaded(folder: Path) -> bool:
    """True when ``folder`` holds every file its ``prepared.json`` lists, with the sha256 recorded
    (a file whose size and mtime are those recorded when it was verified is not hashed again)."""
    record = _read_marker(folder)
    try:
        files, stats = record["files"], record.get("stat", {})
        return all(
            (folder / n).is_file()
            and (_stat(folder / n) == stats.get(n) or sha256_of(folder / n) == h)
            for n, h in files.items()
        )
    except (AttributeError, KeyError, TypeError):
        return False


def download_dataset(
    name: str,
    *,
    mirror: str | None = None,
    cache: str | os.PathLike | None = None,
    progress: bool | None = None,
    force: bool = False,
) -> Path:
    """Fetch, verify and cache dataset ``name``; return its folder. Idempotent.

    ``mirror``: a folder or base URL (default ``$AIAYN_DATA_MIRROR``; "" for the official
    sources). ``cache``: default :func:`cache_dir`. ``force``: fetch again even when cached.
    """
    spec = get_spec(name)
    folder = Path(cache).expanduser() if cache is not None else cache_dir()
    folder = folder / "datasets" / spec.name
    if not force and is_downloaded(folder):
        log.debug("%s: already prepared in %s", name, folder)
        return folder
    mirror = os.environ.get("AIAYN_DATA_MIRROR", "") if mirror is None else mirror
    if mirror and not is_url(mirror) and not Path(mirror).expanduser().is_dir():
        raise DataError(f"data mirror {mirror}: no such folder (AIAYN_DATA_MIRROR)")
    try:
        layout = _fetch_layout(spec, folder, mirror, progress)
    except DataError as err:
        raise DataError(f"{err}{mirror_hint(spec, mirror)}") from None
    if layout.derive is not None:
        layout.derive(folder)
    _write_marker(folder, spec, layout)
    log.info("%s: ready in %s", name, folder)
    return folder


def _fetch_layout(spec: DatasetSpec, folder: Path, mirror: str, progress: bool | None) -> Layout:
    """Fetch the first layout whose first file the source has; DataError naming what is missing."""
    layouts = spec.layouts if mirror else tuple(lay for lay in spec.layouts if lay.official)
    where = f"data mirror {mirror}" if mirror else "the official source"
    missing: list[str] = []
    for layout in layouts:
        first, *rest = layout.files
        try:
            _fetch_one(spec, first, folder, mirror, progress)
        except SourceMissing as err:
            missing.append(str(err))
            continue
        for remote in rest:
            try:
                _fetch_one(spec, remote, folder, mirror, progress)
            except SourceMissing as err:
                raise DataError(f"{err} ({where} lacks a file of dataset '{spec.name}')") from None
        return layout
    raise DataError(f"{'; '.join(missing)} ({where} lacks dataset '{spec.name}')")


def _fetch_one(
    spec: DatasetSpec, remote: RemoteFile, folder: Path, mirror: str, progress: bool | None
) -> None:
    dest = folder / remote.name
    first = _read_marker(folder).get("fetched", {}).get(remote.name, {})
    sha256 = remote.sha256 or first.get("sha256")
    if dest.is_file() and sha256 and sha256_of(dest) == sha256:
        return
    source = mirror_location(mirror, spec, remote.name) if mirror else remote.url
    log.info("fetching %s", source)
    fetch(source, dest, sha256, md5=remote.md5 or None, progress=progress)
    if not remote.sha256 and not first:  # trust on first use: what later downloads must match
        _update_marker(
            folder,
            fetched={
                **_read_marker(folder).get("fetched", {}),
                remote.name: {"sha256": sha256_of(dest), "size": dest.stat().st_size},
            },
        )


def _update_marker(folder: Path, **entries: Any) -> None:
    write_json(folder / _MARKER, {**_read_marker(folder), **entries})


def _write_marker(folder: Path, spec: DatasetSpec, layout: Layout) -> None:
    names = [f.name for f in layout.files] + [
        n for n in spec.canonical if n not in {f.name for f in layout.files}
    ]
    hashes = {n: sha256_of(folder / n) for n in names}
    _update_marker(
        folder,
        dataset=spec.name,
        files=hashes,
        stat={n: _stat(folder / n) for n in names},
    )
