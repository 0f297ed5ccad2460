"""From a :class:`DataConfig` to raw text, a tokenizer, and token-id examples ready to batch.

Raw text comes from a registered dataset (fetched and cached by :func:`~aiayn.data.registry.download_dataset`) or from the
user's own files (``dataset = ""``). Splits of the user's files are ``train`` and ``valid``
(the names in ``train_split`` / ``valid_split`` are accepted too).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from aiayn.data.config import DataConfig
from aiayn.data.readers import read_labelled, read_parallel, read_text
from aiayn.data.registry import download_dataset, get_spec
from aiayn.data.tokenizer import Tokenizer, train_tokenizer
from aiayn.errors import DataError

__all__ = [
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


def _registered(cfg: DataConfig, task: str, split: str) -> Path:
    spec = get_spec(cfg.dataset)
    if spec.task != task:
        raise DataError(f"dataset '{cfg.dataset}' is for {spec.task}, not {task} (data.task)")
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


def load_translation(cfg: DataConfig, split: str) -> tuple[list[str], list[str]]:
    """Raw (source sentences, target sentences) of ``split``."""
    if cfg.uses_own_files:
        which = _own_split(cfg, split)
        return read_parallel(_own_path(cfg, f"{which}_src"), _own_path(cfg, f"{which}_tgt"))
    folder = _registered(cfg, "translation", split)
    for lang in (cfg.src_lang, cfg.tgt_lang):
        if not (folder / f"{split}.{lang}.gz").is_file():
            raise DataError(
                f"dataset '{cfg.dataset}' has no language '{lang}' (data.src_lang / data.tgt_lang)"
            )
    return read_parallel(
        folder / f"{split}.{cfg.src_lang}.gz", folder / f"{split}.{cfg.tgt_lang}.gz"
    )


def load_classification(cfg: DataConfig, split: str) -> tuple[list[str], list[int]]:
    """Raw (texts, integer labels) of ``split``."""
    if cfg.uses_own_files:
        return read_labelled(_own_path(cfg, f"{_own_split(cfg, split)}_file"))
    folder = _registered(cfg, "classification", split)
    if split == "test":
        return read_labelled(folder / "test.tsv.gz")
    texts, labels = read_labelled(folder / "train.tsv.gz")
    if split == "train_full":
        return texts, labels
    if split in ("train_head", "val_tail"):
        tail: set[int] = set()
        for label in sorted(set(labels)):
            ids = [i for i, y in enumerate(labels) if y == label]
            tail.update(ids[len(ids) - len(ids) // _IMDB_VAL_EVERY :])
        keep = [i for i in range(len(texts)) if (i in tail) == (split == "val_tail")]
    else:
        held_out = split == "val"
        keep = [
            i for i in range(len(texts)) if (i % _IMDB_VAL_EVERY == _IMDB_VAL_EVERY - 1) == held_out
        ]
    return [texts[i] for i in keep], [labels[i] for i in keep]


def load_lm_text(cfg: DataConfig, split: str) -> str:
    """Raw running text of ``split``."""
    if cfg.uses_own_files:
        return read_text(_own_path(cfg, f"{_own_split(cfg, split)}_file"))
    text = read_text(_registered(cfg, "lm", split) / "input.txt")
    cut = int(len(text) * _LM_TRAIN_FRACTION)
    return text[:cut] if split == "train" else text[cut:]


def training_texts(cfg: DataConfig) -> list[str]:
    """The training split's text, both sides for translation: what the tokenizer learns from."""
    if cfg.task == "translation":
        src, tgt = load_translation(cfg, cfg.train_split)
        return src + tgt
    if cfg.task == "classification":
        return load_classification(cfg, cfg.train_split)[0]
    return [load_lm_text(cfg, cfg.train_split)]


def train_tokenizer_for(cfg: DataConfig) -> Tokenizer:
    """Train the configured tokenizer (kind, vocab_size) on the training split only. A lower-casing
    translation tokenizer also learns to recase the output from the training targets."""
    if cfg.task == "translation":
        src, tgt = load_translation(cfg, cfg.train_split)
        return train_tokenizer(
            src + tgt, cfg.tokenizer, cfg.vocab_size, cfg.lowercase, recase_texts=tgt
        )
    return train_tokenizer(training_texts(cfg), cfg.tokenizer, cfg.vocab_size, cfg.lowercase)


Pair = tuple[list[int], list[int]]


def prepare_translation(cfg: DataConfig, tokenizer: Tokenizer) -> tuple[list[Pair], list[Pair]]:
    """Token-id (source, target) pairs of the training and validation splits.

    Training pairs with an empty side, or with a side longer than ``max_len`` tokens (the target
    counted with its BOS/EOS), are dropped and counted in the log; validation pairs are all kept
    (cut to ``max_len``, counted in the log).
    """
    train, valid, _ = prepare_translation_texts(cfg, tokenizer)
    return train, valid


def prepare_translation_texts(
    cfg: DataConfig, tokenizer: Tokenizer
) -> tuple[list[Pair], list[Pair], list[tuple[str, str]]]:
    """:func:`prepare_translation`, plus the (source, target) texts of the kept training pairs
    (what BPE-dropout re-encodes)."""
    n = cfg.max_len
    src, tgt = load_translation(cfg, cfg.train_split)
    # A pair too long for max_len whatever its segmentation is dropped without being encoded
    # (a 10 MB line takes seconds to encode).
    texts = [
        (x, y)
        for x, y in zip(src, tgt)
        if tokenizer.min_tokens(x) <= n and tokenizer.min_tokens(y) + 1 <= n
    ]
    train = list(
        zip(
            tokenizer.encode_batch([x for x, _ in texts]),
            tokenizer.encode_batch([y for _, y in texts]),
        )
    )
    kept = [i for i, (x, y) in enumerate(train) if x and y and len(x) <= n and len(y) + 1 <= n]
    if len(kept) < len(src):
        empty = sum(1 for x, y in train if not x or not y)
        log.warning(
            "dropped %d of %d training pairs: %d longer than max_len=%d tokens, %d empty",
            len(src) - len(kept),
            len(src),
            len(src) - len(kept) - empty,
            n,
            empty,
        )
    src, tgt = load_translation(cfg, cfg.valid_split)
    valid = list(zip(tokenizer.encode_batch(src), tokenizer.encode_batch(tgt)))
    n_long = sum(1 for x, y in valid if len(x) > n or len(y) + 1 > n)
    if n_long:  # kept (the validation set is not changed), cut to what the model can take
        log.warning("cut %d of %d validation pairs to max_len=%d tokens", n_long, len(valid), n)
        valid = [(x[:n], y[: n - 1]) for x, y in valid]
    return [train[i] for i in kept], valid, [texts[i] for i in kept]


Item = tuple[list[int], int]


def prepare_classification(cfg: DataConfig, tokenizer: Tokenizer) -> tuple[list[Item], list[Item]]:
    """Token-id (ids, label) items of the training and validation splits.

    Texts longer than ``max_len`` are dropped (``long_examples="filter"``, training split only)
    or cut to ``max_len`` (``"truncate"``, both splits); either way the count is logged.
    """
    result = []
    for split in (cfg.train_split, cfg.valid_split):
        texts, labels = load_classification(cfg, split)
        items = list(zip(tokenizer.encode_batch(texts), labels))
        n_long = sum(1 for ids, _ in items if len(ids) > cfg.max_len)
        if n_long and cfg.long_examples == "truncate":
            log.warning(
                "%s: cut %d of %d texts to max_len=%d tokens",
                split,
                n_long,
                len(items),
                cfg.max_len,
            )
            items = [(ids[: cfg.max_len], label) for ids, label in items]
        elif n_long and split == cfg.train_split:
            log.warning(
                "%s: dropped %d of %d texts longer than max_len=%d tokens",
                split,
                n_long,
                len(items),
                cfg.max_len,
            )
            items = [(ids, label) for ids, label in items if len(ids) <= cfg.max_len]
        result.append(items)
    return result[0], result[1]


def prepare_lm(cfg: DataConfig, tokenizer: Tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """The training and validation text as 1-D LongTensors of token ids."""
    train, valid = (
        torch.tensor(tokenizer.encode(load_lm_text(cfg, split)), dtype=torch.long)
        for split in (cfg.train_split, cfg.valid_split)
    )
    return train, valid
