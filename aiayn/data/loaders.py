"""From a :class:`DataConfig` to raw text, a tokenizer, and token-id examples ready to batch.

Raw text comes from a registered dataset (fetched and cached by :func:`~aiayn.data.registry.download_dataset`) or from the
user's own files (``dataset = ""``). Splits of the user's files are ``train`` and ``valid``
(the names in ``train_split`` / ``valid_split`` are accepted too).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aiayn.checksum import seal, seal_problem
from aiayn.data.build import (
    Cleaning,
    log_counts,
    reservoir_sample,
    running_pieces,
    write_examples,
    write_running_text,
)
from aiayn.data.clean import clean_text
from aiayn.data.config import DataConfig
from aiayn.data.images import scan_folder
from aiayn.data.readers import iter_labelled, iter_parallel, iter_text, read_parallel
from aiayn.data.registry import cache_dir, download_dataset, get_spec
from aiayn.data.store import TokenStore, cache_key, fingerprint, open_store
from aiayn.data.tokenizer import Tokenizer, tokenizer_digest, train_tokenizer
from aiayn.errors import DataError
from aiayn.kinds import CLASSIFICATION, IMAGE_CLASSIFICATION, LM, TRANSLATION, get_kind

__all__ = [
    "DataSource",
    "SOURCES",
    "data_source",
    "translation_files",
    "classification_source",
    "lm_file",
    "lm_blocks",
    "translation_store",
    "classification_store",
    "lm_store",
    "split_stores",
    "load_translation",
    "load_classification",
    "load_lm_text",
    "train_tokenizer_for",
    "training_texts",
    "prepare_translation",
    "prepare_classification",
    "prepare_lm",
]

log = logging.getLogger(__name__)

# IMDB has no validation split: every 10th review of the official training set (in its
# canonical order, negatives then positives by id) is held out as "val", 1,250 per class.
# Consecutive ids are mostly reviews of one movie, so "val" shares movies with "train", while the
# test set's movies are disjoint from training's. "val_tail" holds out the last 10% of each class
# by id instead (blocks of whole movies, but for the movies at the cut): "train_head" is the rest.
_IMDB_VAL_EVERY = 10
# Tiny Shakespeare has no official split: the usual first 90% / last 10% of the characters.
_LM_TRAIN_FRACTION = 0.9


def _registered(cfg: DataConfig, split: str) -> Path:
    spec = get_spec(cfg.dataset)
    task = data_source(cfg).name
    if spec.task != task:
        raise DataError(f"dataset '{cfg.dataset}' is for {spec.task}, not {task} (data.kind)")
    if split not in spec.splits:
        raise DataError(
            f"dataset '{cfg.dataset}' has no split '{split}'; splits: {', '.join(spec.splits)}"
        )
    return download_dataset(cfg.dataset)


def _own_split(cfg: DataConfig, split: str) -> str:
    """'train' or 'valid' for a split name of the user's own files."""
    if split in ("train", cfg.train_split):
        return "train"
    if split in ("valid", "val", "validation", cfg.valid_split):
        return "valid"
    raise DataError(f"your own data has splits 'train' and 'valid', not '{split}'")


def _own_path(cfg: DataConfig, key: str) -> str:
    path = getattr(cfg, key)
    if not path:
        raise DataError(f"data.{key} is not set (data.dataset is '', so your own files are read)")
    return path


def translation_files(cfg: DataConfig, split: str) -> tuple[Path, Path]:
    """The (source, target) files of ``split``."""
    if cfg.uses_own_files:
        which = _own_split(cfg, split)
        return Path(_own_path(cfg, f"{which}_src")), Path(_own_path(cfg, f"{which}_tgt"))
    folder = _registered(cfg, split)
    for lang in (cfg.src_lang, cfg.tgt_lang):
        if not (folder / f"{split}.{lang}.gz").is_file():
            raise DataError(
                f"dataset '{cfg.dataset}' has no language '{lang}' (data.src_lang / data.tgt_lang)"
            )
    return folder / f"{split}.{cfg.src_lang}.gz", folder / f"{split}.{cfg.tgt_lang}.gz"


def load_translation(cfg: DataConfig, split: str) -> tuple[list[str], list[str]]:
    """Raw (source sentences, target sentences) of ``split``."""
    return read_parallel(*translation_files(cfg, split))


def load_classification(cfg: DataConfig, split: str) -> tuple[list[str], list[int]]:
    """Raw (texts, integer labels) of ``split``, in memory (:func:`classification_source`
    streams them)."""
    texts: list[str] = []
    labels: list[int] = []
    for text, label in classification_source(cfg, split)[1]():
        texts.append(text)
        labels.append(label)
    return texts, labels


def classification_source(
    cfg: DataConfig, split: str
) -> tuple[list[Path], Callable[[], Iterator[tuple[str, int]]]]:
    """The files ``split`` is read from, and a function that yields its (text, label) items, read
    as it goes: never the whole split in memory."""
    if cfg.uses_own_files:
        path = Path(_own_path(cfg, f"{_own_split(cfg, split)}_file"))
        return [path], lambda: iter_labelled(path)
    folder = _registered(cfg, split)
    if split == "test":
        return [folder / "test.tsv.gz"], lambda: iter_labelled(folder / "test.tsv.gz")
    return [folder / "train.tsv.gz"], lambda: _imdb_training_split(folder / "train.tsv.gz", split)


def _imdb_training_split(path: Path, split: str) -> Iterator[tuple[str, int]]:
    """The items of a split carved from IMDB's official training set, in file order: ``val``
    every 10th, ``train`` the rest, ``val_tail`` the last 10% of each class, ``train_head`` the
    rest, ``train_full`` all. ``val_tail``/``train_head`` read the file twice (first to count
    each class); memory: a count per class."""
    every = _IMDB_VAL_EVERY
    if split in ("train_head", "val_tail"):
        total = Counter(label for _, label in iter_labelled(path))
        seen: Counter[int] = Counter()
        for text, label in iter_labelled(path):
            tail = seen[label] >= total[label] - total[label] // every
            seen[label] += 1
            if tail == (split == "val_tail"):
                yield text, label
        return
    for i, item in enumerate(iter_labelled(path)):
        if split == "train_full" or (i % every == every - 1) == (split == "val"):
            yield item


def lm_file(cfg: DataConfig, split: str) -> Path:
    """The file holding ``split``'s running text."""
    if cfg.uses_own_files:
        return Path(_own_path(cfg, f"{_own_split(cfg, split)}_file"))
    return _registered(cfg, split) / "input.txt"


def lm_blocks(cfg: DataConfig, split: str) -> Iterator[str]:
    """``split``'s running text in consecutive blocks, read as it goes (never whole). A
    registered dataset's split is its first 90% or last 10% of the characters: its file is read
    twice, first to count them."""
    path = lm_file(cfg, split)
    if cfg.uses_own_files:
        yield from iter_text(path)
        return
    total = sum(map(len, iter_text(path)))
    cut = int(total * _LM_TRAIN_FRACTION)
    lo, hi = (0, cut) if split == "train" else (cut, total)
    pos = 0
    for block in iter_text(path):
        if lo < pos + len(block) and pos < hi:
            yield block[max(lo - pos, 0) : hi - pos]
        pos += len(block)


def load_lm_text(cfg: DataConfig, split: str) -> str:
    """Raw running text of ``split``, in memory (:func:`lm_blocks` streams it)."""
    return "".join(lm_blocks(cfg, split))


def training_texts(cfg: DataConfig) -> list[str]:
    """The training split's text, both sides for translation: what the tokenizer learns from."""
    return data_source(cfg).texts(cfg)


def _pair_texts(cfg: DataConfig) -> list[str]:
    src, tgt = load_translation(cfg, cfg.train_split)
    return src + tgt


def train_tokenizer_for(cfg: DataConfig) -> Tokenizer:
    """The configured tokenizer (kind, vocab_size, lowercase) trained on the training split only:
    on a seeded sample of ``data.tokenizer_sample`` examples when the split has more (every
    example, in order, when it has fewer: the tokenizer of the whole split). Classification texts
    are cleaned first (as the task encodes them). A lower-casing translation tokenizer also
    learns to recase the output from the (sampled) training targets.

    Kept in the data cache by what it was trained from (the files' fingerprints and these
    settings), so a second run on the same files gets the same tokenizer without training."""
    source = data_source(cfg)
    key = {
        "format": source.tokenizer_format,
        "task": source.name,
        "dataset": cfg.dataset,
        "split": cfg.train_split,
        "langs": _langs(cfg),
        "tokenizer": [cfg.tokenizer, cfg.vocab_size, cfg.lowercase, cfg.tokenizer_sample],
        "sources": [fingerprint(p) for p in source.files(cfg, cfg.train_split)],
    }
    path = cache_dir() / "tokenizers" / f"{cfg.dataset or 'files'}-{cache_key(key)}.json"
    if path.is_file():
        tokenizer, problem = _cached_tokenizer(cfg, path, key)
        if tokenizer is not None:
            log.info("tokenizer: trained before on the same files, read from %s", path)
            return tokenizer
        log.warning("tokenizer cache: %s; training it again", problem)
    tokenizer = source.train_tokenizer(cfg)
    tokenizer.save(path)
    seal(path, key)
    return tokenizer


def _cached_tokenizer(
    cfg: DataConfig, path: Path, key: dict[str, Any]
) -> tuple[Tokenizer | None, str]:
    """The tokenizer cached at ``path`` when its record (:func:`aiayn.checksum.seal`) says it
    was trained for ``key`` and its content is unchanged, and it is of the configured kind; else
    (None, why not)."""
    problem = seal_problem(path, key)
    if problem:
        return None, problem
    try:
        tokenizer = Tokenizer.from_file(path)
    except DataError as err:
        return None, str(err)
    if tokenizer.kind != cfg.tokenizer:
        return None, f"{path} holds a {tokenizer.kind} tokenizer, not {cfg.tokenizer}"
    return tokenizer, ""


def _langs(cfg: DataConfig) -> list[str]:
    """The languages in a cache key: a translation dataset's two, else none."""
    return [cfg.src_lang, cfg.tgt_lang] if data_source(cfg).langs else []


def _train_pairs_tokenizer(cfg: DataConfig) -> Tokenizer:
    """Translation's tokenizer, from a sample of the training pairs (both sides); it learns to
    recase from the targets."""
    files = translation_files(cfg, cfg.train_split)
    pairs, n = reservoir_sample(iter_parallel(*files), cfg.tokenizer_sample)
    _log_sample(len(pairs), n, "pairs")
    src, tgt = [x for x, _ in pairs], [y for _, y in pairs]
    return train_tokenizer(
        src + tgt, cfg.tokenizer, cfg.vocab_size, cfg.lowercase, recase_texts=tgt
    )


def _train_texts_tokenizer(cfg: DataConfig) -> Tokenizer:
    """Classification's tokenizer, from a sample of the training texts, cleaned as the task
    encodes them."""
    items = classification_source(cfg, cfg.train_split)[1]()
    texts, n = reservoir_sample((clean_text(t) for t, _ in items), cfg.tokenizer_sample)
    _log_sample(len(texts), n, "texts")
    return train_tokenizer(texts, cfg.tokenizer, cfg.vocab_size, cfg.lowercase)


def _train_lm_tokenizer(cfg: DataConfig) -> Tokenizer:
    """The LM's tokenizer, from its training text streamed: characters counted over all of it; a
    subword model learnt from the whole text in pieces (the tokenizer of the text read whole)
    while it has at most ``data.tokenizer_sample`` lines, else from a seeded sample of that many
    lines (the text is read once more to count them)."""
    kind, size, lower = cfg.tokenizer, cfg.vocab_size, cfg.lowercase
    split, k = cfg.train_split, cfg.tokenizer_sample
    if kind != "char" and sum(b.count("\n") for b in lm_blocks(cfg, split)) >= k:
        lines, n = reservoir_sample(_lines(lm_blocks(cfg, split)), k)
        _log_sample(len(lines), n, "lines")
        return train_tokenizer(lines, kind, size, lower)
    pieces = running_pieces(lm_blocks(cfg, split))
    return train_tokenizer(pieces, kind, size, lower, running=True)


def _lines(blocks: Iterable[str]) -> Iterator[str]:
    """The lines of the text of ``blocks`` (without their newlines), one at a time."""
    rest = ""
    for block in blocks:
        *complete, rest = (rest + block).split("\n")
        yield from complete
    yield rest


def _log_sample(k: int, n: int, what: str) -> None:
    if k < n:
        log.info(
            "tokenizer: trained on a sample of %d of the %d training %s (data.tokenizer_sample)",
            k,
            n,
            what,
        )


# ---- token stores ------------------------------------------------------------------------------


def _store(
    cfg: DataConfig,
    tokenizer: Tokenizer,
    split: str,
    settings: dict[str, Any],
    build: Callable[[Path], dict[str, Any]],
) -> TokenStore:
    """The token store of ``split`` made with ``settings`` by ``build`` (on first use; see
    :mod:`aiayn.data.store`)."""
    source = data_source(cfg)
    key = {
        "task": source.name,
        "dataset": cfg.dataset,
        "split": split,
        "langs": _langs(cfg),
        "tokenizer_sha256": tokenizer_digest(tokenizer.to_str()),
        **settings,
    }
    name = f"{cfg.dataset or 'files'}-{source.name}-{split}"
    return open_store(name, key, source.files(cfg, split), build)


def _examples_store(
    cfg: DataConfig,
    tokenizer: Tokenizer,
    split: str,
    cleaning: Cleaning,
    fields: tuple[str, ...],
    examples: Callable[[], Iterable[tuple[Sequence[str], int | None]]],
    prepare: Callable[[str], str] | None = None,
    settings: dict[str, Any] | None = None,
) -> TokenStore:
    """The store of ``split``'s examples (texts per field, label), cleaned as ``cleaning`` says
    (``settings``: more of what the store's ids depend on, in its key)."""

    def build(folder: Path) -> dict[str, Any]:
        return write_examples(folder, tokenizer, fields, examples(), cleaning, prepare)

    return _store(cfg, tokenizer, split, {"cleaning": asdict(cleaning), **(settings or {})}, build)


def translation_store(cfg: DataConfig, tokenizer: Tokenizer, split: str) -> TokenStore:
    """Token ids of ``split``'s pairs (fields ``src``, ``tgt``). The training split drops pairs
    with an empty side or a side longer than ``max_len`` tokens (the target counted with its
    BOS/EOS), and with ``max_len_ratio`` / ``dedup`` those; other splits keep every pair, cut to
    ``max_len``. What was dropped or cut is logged."""
    n, train = cfg.max_len, split == cfg.train_split
    cleaning = Cleaning(
        limits=(n, n - 1),
        cut=not train,
        drop_empty=train,
        max_ratio=cfg.max_len_ratio if train else 0.0,
        dedup=cfg.dedup and train,
    )
    files = translation_files(cfg, split)
    store = _examples_store(
        cfg,
        tokenizer,
        split,
        cleaning,
        ("src", "tgt"),
        lambda: ((pair, None) for pair in iter_parallel(*files)),
        # Marian's targets are the target SentencePiece model's pieces (encode_target_batch):
        # in the key, so that a store written before they were is never read
        settings={"targets": "target.spm"} if tokenizer.kind == "sentencepiece" else None,
    )
    log_counts(store.manifest, split, "training pairs" if train else "validation pairs")
    return store


def classification_store(cfg: DataConfig, tokenizer: Tokenizer, split: str) -> TokenStore:
    """Token ids (field ``text``) and labels of ``split``'s cleaned texts
    (:func:`~aiayn.data.clean.clean_text`). Texts longer than ``max_len`` are cut
    (``long_examples = "truncate"``, or any split but training) or dropped."""
    train = split == cfg.train_split
    cleaning = Cleaning(
        limits=(cfg.max_len,),
        cut=cfg.long_examples == "truncate" or not train,
        dedup=cfg.dedup and train,
    )
    items = classification_source(cfg, split)[1]
    store = _examples_store(
        cfg,
        tokenizer,
        split,
        cleaning,
        ("text",),
        lambda: (((text,), label) for text, label in items()),
        clean_text,
    )
    log_counts(store.manifest, split, "texts")
    return store


def lm_store(cfg: DataConfig, tokenizer: Tokenizer, split: str) -> TokenStore:
    """The token ids of ``split``'s running text: one example, field ``text``, never cut,
    streamed into the store in pieces (:func:`~aiayn.data.build.write_running_text`): the text
    is never in memory whole."""

    def build(folder: Path) -> dict[str, Any]:
        return write_running_text(folder, tokenizer, running_pieces(lm_blocks(cfg, split)))

    return _store(cfg, tokenizer, split, {"running_text": 1}, build)


def split_stores(cfg: DataConfig, tokenizer: Tokenizer) -> dict[str, TokenStore]:
    """The token stores of the training and validation splits (``"train"``, ``"valid"``) of
    ``data.kind``, built on first use."""
    make = data_source(cfg).store
    return {
        "train": make(cfg, tokenizer, cfg.train_split),
        "valid": make(cfg, tokenizer, cfg.valid_split),
    }


# ---- the data sources: what Kind.reads names --------------------------------------------------


@dataclass(frozen=True)
class DataSource:
    """How one shape of examples is read and stored: sentence pairs, labelled texts or a running
    text. A kind names the one it trains on (:attr:`aiayn.kinds.Kind.reads`); everything above
    asks it (:func:`data_source`) instead of the kind."""

    # Its name in aiayn.kinds.DATA_SOURCES: also the task of the datasets it reads (DatasetSpec)
    # and part of its stores' and tokenizers' cache keys.
    name: str
    langs: bool  # whether data.src_lang / data.tgt_lang pick its files (and key its caches)
    files: Callable[[DataConfig, str], list[Path]]  # the files a split is read from
    texts: Callable[[DataConfig], list[str]]  # the training split's text, in memory
    train_tokenizer: Callable[[DataConfig], Tokenizer]  # on (a sample of) the training split
    store: Callable[[DataConfig, Tokenizer, str], TokenStore]  # a split's token store
    # per example of a store, the lengths batches are planned on (source, target or None);
    # None: one running text, cut into blocks, not batched by examples
    example_lengths: Callable[[TokenStore], tuple[np.ndarray, np.ndarray | None]] | None
    tokenizer_format: int = 1  # in the tokenizer cache's key: 2 when its sampling changed


PAIRS = DataSource(
    TRANSLATION,
    langs=True,
    files=lambda cfg, split: list(translation_files(cfg, split)),
    texts=_pair_texts,
    train_tokenizer=_train_pairs_tokenizer,
    store=translation_store,
    example_lengths=lambda s: (s.lengths("src"), s.lengths("tgt") + 1),  # target: BOS/EOS
)
LABELLED = DataSource(
    CLASSIFICATION,
    langs=False,
    files=lambda cfg, split: classification_source(cfg, split)[0],
    texts=lambda cfg: load_classification(cfg, cfg.train_split)[0],
    train_tokenizer=_train_texts_tokenizer,
    store=classification_store,
    example_lengths=lambda s: (s.lengths("text"), None),
)
RUNNING_TEXT = DataSource(
    LM,
    langs=False,
    files=lambda cfg, split: [lm_file(cfg, split)],
    texts=lambda cfg: [load_lm_text(cfg, cfg.train_split)],
    train_tokenizer=_train_lm_tokenizer,
    store=lm_store,
    example_lengths=None,
    tokenizer_format=2,  # 2: a language model's tokenizer samples lines past the bound
)


def _no_text(cfg: DataConfig, *_: Any) -> Any:
    """What the image source answers when asked for text, a tokenizer or a token store."""
    raise DataError(
        f"data.kind = '{cfg.kind}' reads images: it has no text, tokenizer or token store "
        "(its images are decoded once into an image store when `aiayn train` starts)"
    )


def _image_files(cfg: DataConfig, split: str) -> list[Path]:
    """The files of an image split: its class folder's images, or the dataset's IDX files."""
    if cfg.uses_own_files:
        valid = split not in ("train", cfg.train_split) and cfg.valid_dir
        root = Path(cfg.valid_dir if valid else _own_path(cfg, "train_dir"))
        return [path for path, _ in scan_folder(root)[1]]
    folder = _registered(cfg, split)
    stem = "t10k" if split == "test" else "train"
    return [folder / f"{stem}-images-idx3-ubyte", folder / f"{stem}-labels-idx1-ubyte"]


IMAGES = DataSource(
    IMAGE_CLASSIFICATION,
    langs=False,
    files=_image_files,
    texts=_no_text,
    train_tokenizer=_no_text,
    store=_no_text,
    example_lengths=None,
)
#: the data sources by name (Kind.reads)
SOURCES: dict[str, DataSource] = {s.name: s for s in (PAIRS, LABELLED, RUNNING_TEXT, IMAGES)}


def data_source(cfg: DataConfig) -> DataSource:
    """The data source ``data.kind`` reads (its Kind says which)."""
    return SOURCES[get_kind(cfg.kind).reads]


# ---- the examples as lists (small data, tests, benchmarks) ------------------------------------

Pair = tuple[list[int], list[int]]
Item = tuple[list[int], int]


def prepare_translation(cfg: DataConfig, tokenizer: Tokenizer) -> tuple[list[Pair], list[Pair]]:
    """Token-id (source, target) pairs of the training and validation splits, as lists: the
    stores of :func:`translation_store` read whole."""
    return (
        _pairs(translation_store(cfg, tokenizer, cfg.train_split)),
        _pairs(translation_store(cfg, tokenizer, cfg.valid_split)),
    )


def _pairs(store: TokenStore) -> list[Pair]:
    n = range(len(store))
    return [(x.tolist(), y.tolist()) for x, y in zip(store.rows("src", n), store.rows("tgt", n))]


def prepare_classification(cfg: DataConfig, tokenizer: Tokenizer) -> tuple[list[Item], list[Item]]:
    """Token-id (ids, label) items of the training and validation splits, as lists (the stores
    of :func:`classification_store` read whole)."""
    result = []
    for split in (cfg.train_split, cfg.valid_split):
        store = classification_store(cfg, tokenizer, split)
        rows = store.rows("text", range(len(store)))
        result.append([(ids.tolist(), int(y)) for ids, y in zip(rows, store.labels)])
    return result[0], result[1]


def prepare_lm(cfg: DataConfig, tokenizer: Tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """The training and validation text as 1-D LongTensors of token ids."""
    train, valid = (
        torch.from_numpy(lm_store(cfg, tokenizer, split).mapped("text").astype(np.int64))
        for split in (cfg.train_split, cfg.valid_split)
    )
    return train, valid
