"""Scoring a model folder on a test set: what :meth:`aiayn.folder.load.ModelFolder.score` runs.

A translation model is scored by sacreBLEU and chrF of its translations (:func:`aiayn.eval.
corpus_scores`), a classifier by its accuracy; the test set is a split of the folder's recorded
dataset or the files given. The result says what it measured: the test set, counts, timing and
the decoding settings.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from aiayn.data import (
    Tokenizer,
    load_classification,
    load_translation,
    read_labelled,
    read_parallel,
)
from aiayn.data.images import scan_folder, split_images
from aiayn.decode.classify import evaluate_classifier
from aiayn.decode.config import DecodeConfig
from aiayn.decode.images import evaluate_images, model_images
from aiayn.decode.search import Hypothesis
from aiayn.errors import ConfigError
from aiayn.eval import corpus_scores
from aiayn.kinds import Kind
from aiayn.progress import progress_bar
from aiayn.run_config import RunConfig
from aiayn.runtime import Backend

__all__ = ["Scored", "score_translations", "score_classifier", "score_images"]


class Scored(Protocol):
    """What scoring reads of a loaded model folder: :class:`aiayn.folder.load.ModelFolder`, which
    imports this module (so this module names the shape it needs instead of importing it back)."""

    path: Path
    paths: list[Path]
    backend: Backend
    config: RunConfig
    has_data: bool

    @property
    def tokenizer(self) -> Tokenizer: ...

    @property
    def engine(self) -> str: ...
    @property
    def device(self) -> torch.device: ...
    @property
    def text_limit(self) -> int: ...
    @property
    def kind_info(self) -> Kind: ...
    def decode_config(
        self, decode: DecodeConfig | None = None, **overrides: Any
    ) -> DecodeConfig: ...
    def label_names(self) -> list[str]: ...
    def translate_hypotheses(
        self,
        texts: Sequence[str],
        decode: DecodeConfig | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> list[list[tuple[str, Hypothesis]]]: ...


def score_translations(
    folder: Scored,
    split: str | None,
    src: str | Path | None,
    ref: str | Path | None,
    limit: int,
    decode: DecodeConfig | None,
    paper_bleu: bool,
    overrides: dict[str, Any],
) -> dict[str, Any]:
    """BLEU and chrF of ``folder``'s translations of a split or of ``src`` against ``ref`` (the
    first ``limit`` sentences when 0 < limit), decoded with ``decode`` and ``overrides``."""
    sources, refs, name = _test_set(folder, split, src, ref)
    limited = 0 < limit < len(sources)
    sources, refs = (sources[:limit], refs[:limit]) if limited else (sources, refs)
    cfg = folder.decode_config(decode, **overrides)
    start = time.perf_counter()
    with progress_bar(len(sources), "translate", "sent") as bar:
        results = folder.translate_hypotheses(sources, cfg, progress=bar.update)
    hyps = [line[0][0] if line else "" for line in results]
    seconds = time.perf_counter() - start
    scores = corpus_scores(hyps, refs, _target_lang(folder) if paper_bleu else None)
    scores.update(
        test_set=name,
        seconds=round(seconds, 3),
        sentences_per_s=round(len(sources) / max(seconds, 1e-9), 2),
        decoding={**vars(cfg), "device": str(folder.device), "engine": folder.engine},
        model=_model_name(folder),
        hyps=hyps,
        **({"limit": limit} if limited else {}),
    )
    return scores


def score_classifier(
    folder: Scored,
    split: str | None,
    src: str | Path | None,
    limit: int,
    max_tokens: int | None,
) -> dict[str, Any]:
    """The accuracy of ``folder``'s classifier on a split or on ``src`` (label<TAB>text .tsv or
    .jsonl), the first ``limit`` texts when 0 < limit."""
    if bool(split) == bool(src):
        raise ConfigError("give either --split NAME or --src FILE (label<TAB>text .tsv or .jsonl)")
    if src:
        texts, labels = read_labelled(src)
        name = Path(src).stem
    else:
        assert split is not None
        texts, labels = load_classification(_dataset(folder), split)
        name = split
    limited = 0 < limit < len(texts)
    texts, labels = (texts[:limit], labels[:limit]) if limited else (texts, labels)
    scores = evaluate_classifier(
        folder.backend.class_probs,
        folder.tokenizer,
        texts,
        labels,
        folder.text_limit,
        max_tokens,
    )
    scores.update(test_set=name, model=_model_name(folder), device=str(folder.device))
    if limited:
        scores["limit"] = limit
    return scores


def score_images(
    folder: Scored, split: str | None, src: str | Path | None, limit: int
) -> dict[str, Any]:
    """The accuracy of ``folder``'s image classifier on a split of its dataset or on ``src`` (a
    folder with one subfolder of images per class, named as the model's classes), the first
    ``limit`` images when 0 < limit."""
    if bool(split) == bool(src):
        raise ConfigError("give either --split NAME or --src FOLDER (one subfolder per class)")
    cfg = folder.config.model
    if src:
        classes, items = scan_folder(Path(src))
        names = folder.label_names()
        unknown = [c for c in classes if c not in names]
        if unknown:
            raise ConfigError(
                f"{Path(src) / unknown[0]}: the model has no class '{unknown[0]}' "
                f"(its classes: {', '.join(names)})"
            )
        items = items[:limit] if 0 < limit < len(items) else items
        images = model_images([p for p, _ in items], cfg.image_size, cfg.channels)
        labels = np.array([names.index(classes[label]) for _, label in items], dtype=np.int64)
        name, total = Path(src).name, len(scan_folder(Path(src))[1])
    else:
        assert split is not None
        store, rows = split_images(_dataset(folder), split, cfg.image_size, cfg.channels)
        total = len(rows)
        rows = rows[:limit] if 0 < limit < len(rows) else rows
        images, labels, name = store.images[rows], store.labels[rows], split
    scores = evaluate_images(folder.backend.image_probs, images, labels)
    scores.update(test_set=name, model=_model_name(folder), device=str(folder.device))
    if 0 < limit < total:
        scores["limit"] = limit
    return scores


def _target_lang(folder: Scored) -> str:
    """The language the paper's BLEU tokenises in: the target of the training data."""
    if not folder.has_data:
        raise ConfigError(
            f"{folder.path}: --paper-bleu needs the target language; the model "
            "folder records no training data"
        )
    return folder.config.data.tgt_lang


def _model_name(folder: Scored) -> str | list[str]:
    return str(folder.path) if len(folder.paths) == 1 else [str(p) for p in folder.paths]


def _dataset(folder: Scored) -> Any:
    if not folder.has_data:
        what = "--src/--ref" if folder.kind_info.does("translate") else "--src"
        raise ConfigError(f"{folder.path}: the model folder records no dataset; use {what}")
    return folder.config.data


def _test_set(
    folder: Scored, split: str | None, src: str | Path | None, ref: str | Path | None
) -> tuple[list[str], list[str], str]:
    if bool(split) == bool(src or ref):
        raise ConfigError("give either --split NAME or --src FILE --ref FILE")
    if src or ref:
        if not (src and ref):
            raise ConfigError("--src and --ref go together")
        sources, refs = read_parallel(src, ref)
        return sources, refs, Path(src).stem
    assert split is not None
    sources, refs = load_translation(_dataset(folder), split)
    return sources, refs, split
