"""The model folder, opened: one loader for every kind of model, and what a loaded model can do.

A model folder (written by ``aiayn train``, ``aiayn average`` or
:func:`aiayn.folder.checkpoint.save_model_dir`) holds config.json, model.safetensors and
tokenizer.json. :func:`load_model_folder` (``aiayn.load``) parses config.json once into the typed
:class:`~aiayn.run_config.RunConfig` (through :mod:`aiayn.folder.config`, its only reader), opens
the backend that runs it (:func:`aiayn.folder.open.open_backend`: the parts checked, the model of
the recorded shape built, the weights and tokenizer loaded) and returns a :class:`ModelFolder`::

    import aiayn
    model = aiayn.load("runs/demo/m1/avg5")
    model.translate(["A man rides a bike."])          # with the folder's decoding settings
    model.score(split="test_2016_flickr")              # BLEU/chrF (accuracy for a classifier)

Several translation folders load as one :class:`~aiayn.decode.ensemble.Ensemble`. Every command
that opens a model folder (translate, evaluate, classify, generate, plot attention, summary) goes
through here, so they share one set of error messages.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast, overload

import torch
from torch import nn

from aiayn import threads
from aiayn.checks import as_texts, check_device
from aiayn.config import ModelConfig
from aiayn.data import Tokenizer
from aiayn.decode.align import align
from aiayn.decode.classify import LABEL_NAMES, encode_texts
from aiayn.decode.config import DecodeConfig, SamplingConfig, merge_decode
from aiayn.decode.generate import TextStream
from aiayn.decode.images import model_images
from aiayn.decode.images import top_k as top_k_classes
from aiayn.decode.search import Hypothesis
from aiayn.decode.translate import encode_sources
from aiayn.errors import CheckpointError, ConfigError
from aiayn.folder.checkpoint import WEIGHTS_FILE
from aiayn.folder.config import read_folder_config
from aiayn.folder.open import build_model, open_backend
from aiayn.folder.score import score_classifier, score_images, score_translations
from aiayn.kinds import KINDS, Kind, get_kind, kind_name
from aiayn.memory import keep_freed_memory
from aiayn.run_config import RunConfig
from aiayn.runtime import Backend, require
from aiayn.runtime.backend import Attention, Module

log = logging.getLogger(__name__)

__all__ = ["ModelFolder", "load_model_dir", "load_model_folder", "precision"]


def load_model_dir(
    folder: str | Path,
    weights_name: str = WEIGHTS_FILE,
    expect_kind: str | None = None,
    map_location: str | torch.device = "cpu",
) -> tuple[nn.Module, ModelConfig, dict[str, Any]]:
    """The model alone, no tokenizer needed (what ``aiayn average`` checks its output with):
    (model in eval mode, its ModelConfig, config.json as :meth:`aiayn.folder.config.FolderConfig.to_dict` writes it,
    for its provenance keys such as ``averaged``). :func:`load_model_folder` opens the whole
    folder, typed."""
    folder = Path(folder)
    parsed = read_folder_config(folder, expect_kind)
    model = build_model(folder, parsed, torch.device(map_location), weights_name)
    return model, parsed.config.model, parsed.to_dict()


def load_model_folder(
    paths: str | Path | Sequence[str | Path],
    device: str | torch.device = "cpu",
    expect_kind: str | None = None,
    engine: str | None = None,
    workers: int | None = None,
) -> ModelFolder:
    """Open one model folder, or several translation folders as an ensemble (their next-token
    probabilities averaged; one shared tokenizer), or several text classifier folders (their class
    probabilities averaged; PyTorch models). Every folder's config.json is checked (kind
    included) before any weights are read. CheckpointError names the folder and what is wrong;
    ``paths`` that are not a path or a list of paths (None, say) are a TypeError that says so.

    Folders written by ``aiayn export`` open the same way, run by their backend (ONNX Runtime,
    CTranslate2) on the CPU (:func:`aiayn.folder.open.open_backend`); ``engine`` ('torch', 'onnx',
    'ctranslate2'), when given, must be what the folders hold; ``workers`` is the number of
    batches an exported model decodes at once (default: chosen for the machine and the engine,
    :func:`aiayn.threads.default_workers`; a PyTorch model takes it per call, ``decode.workers``).

    On the CPU under glibc this sets the allocator of the whole Python process, once, to keep
    freed memory instead of returning it to the kernel (:func:`aiayn.memory.keep_freed_memory`:
    no page faults for what each decoding step frees, docs/performance.md#in-short; the
    process keeps its peak memory until it exits). Set
    ``AIAYN_MALLOC=default`` (or any ``MALLOC_*`` variable) before the call to keep glibc's own
    settings."""
    folders = _folder_paths(paths)
    device = check_device(str(device), "device")  # mps, xpu, meta…: one line, not a traceback
    if expect_kind is not None:
        expect_kind = kind_name(expect_kind)
    parsed = [read_folder_config(f, expect_kind) for f in folders]  # kinds checked, no weights
    if device.type == "cpu":
        keep_freed_memory()  # no page faults for what each decoding step frees (aiayn/memory.py)
    backend, tokenizer = open_backend(folders, parsed, engine, device, workers)
    first = parsed[0]
    return ModelFolder(
        folders[0], folders, first.kind, backend, tokenizer, first.config, first.has_data
    )


def _folder_paths(paths: Any) -> list[Path]:
    """``paths`` (one path, or a list of them) as a list of Paths. TypeError that says what
    ``aiayn.load`` takes for anything else (None, a number, a list holding one); ConfigError
    for an empty list."""
    taken = "aiayn.load takes a model folder (a str or os.PathLike path) or a list of them"
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    elif not isinstance(paths, (list, tuple)):
        raise TypeError(f"{taken}, got {type(paths).__name__}")
    for p in paths:
        if not isinstance(p, (str, os.PathLike)):
            raise TypeError(f"{taken}, got a list holding {type(p).__name__}")
    if not paths:
        raise ConfigError("no model folder given")
    return [Path(p) for p in paths]


@contextlib.contextmanager
def precision(device: torch.device, bf16: bool) -> Iterator[None]:
    """bfloat16 autocast when asked, else nothing. A CPU without native bf16 matrix instructions
    (AVX512-BF16 or AMX) runs bf16 matmuls in a slow fallback: said in a warning, not refused."""
    if not bf16:
        yield
        return
    if device.type == "cpu":
        if not threads.cpu_has_bf16():
            log.warning(
                "bf16: this CPU has no native bf16 matrix instructions (AVX512-BF16 or AMX): "
                "bf16 matmuls run in a fallback far slower than fp32 here; leave out --bf16"
            )
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
        yield


@dataclass
class ModelFolder:
    """A loaded model folder (or an ensemble of translation folders): the backend that runs it,
    tokenizer, typed run config, and the one way to use them (:meth:`translate`,
    :meth:`classify`, :meth:`generate`, :meth:`score`); exporters take its PyTorch module
    (:meth:`torch_module`)."""

    path: Path  # the folder (the first one, for an ensemble)
    paths: list[Path]  # all folders (ensemble members)
    kind: str  # one of aiayn.kinds.KINDS
    backend: Backend  # what runs it: PyTorch, ONNX Runtime or CTranslate2 (aiayn.runtime)
    # None for a kind that reads no text (an image classifier): :attr:`tokenizer` says so
    text_tokenizer: Tokenizer | None
    config: RunConfig  # the first folder's config.json, typed
    has_data: bool = True  # config.json records the training data (data.* are not defaults)

    @property
    def engine(self) -> str:
        """The backend's name: torch, onnx or ctranslate2."""
        return self.backend.name

    @property
    def device(self) -> torch.device:
        return self.backend.device

    def torch_module(self) -> nn.Module:
        """The PyTorch module (an Ensemble for several folders): what exporters convert.
        :class:`~aiayn.runtime.Unsupported` for an exported folder."""
        require(self.backend, "module", f"{self.path} holds a '{self.engine}' export")
        return cast(Module, self.backend).torch_module()

    def parameters(self) -> list[torch.Tensor]:
        """The torch weights (none for an exported model)."""
        return self.backend.parameters()

    @property
    def decode(self) -> DecodeConfig:
        """The folder's recommended decoding (config.json "decode", written by train from the
        recipe's [decode] section and kept by average), else the DecodeConfig defaults."""
        return self.config.decode

    def decode_config(self, decode: DecodeConfig | None = None, **overrides: Any) -> DecodeConfig:
        """``decode`` (default: the folder's) with ``overrides`` (None values ignored) applied,
        through the one merge of decoding settings (:func:`~aiayn.decode.config.merge_decode`:
        an unknown keyword is a ConfigError naming the nearest setting)."""
        return merge_decode(decode or self.decode, overrides)

    @property
    def text_limit(self) -> int:
        """The longest input in tokens: the run's data.max_len (what training cut to) when
        recorded, never beyond the model's positional table."""
        limit = self.config.model.max_len
        return min(self.config.data.max_len, limit) if self.has_data else limit

    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer; CheckpointError for a model that reads no text."""
        if self.text_tokenizer is None:
            raise CheckpointError(f"{self.path}: holds a '{self.kind}' model, which reads no text")
        return self.text_tokenizer

    @property
    def kind_info(self) -> Kind:
        """What :mod:`aiayn.kinds` declares about this folder's kind."""
        return get_kind(self.kind)

    def _need(self, use: str) -> None:
        """CheckpointError naming the kinds that do ``use`` when this folder's does not."""
        if not self.kind_info.does(use):
            able = " or ".join(f"'{k.name}'" for k in KINDS.values() if k.does(use))
            raise CheckpointError(f"{self.path}: holds a '{self.kind}' model, {use} needs {able}")

    # ---- translation -----------------------------------------------------------------------
    def translate_hypotheses(
        self,
        texts: Sequence[str],
        decode: DecodeConfig | None = None,
        progress: Callable[[int], None] | None = None,
        prefixes: Sequence[str | None] | None = None,
        **overrides: Any,
    ) -> list[list[tuple[str, Hypothesis]]]:
        """Per text its ``nbest`` (translation, hypothesis) pairs, best first ([] for a blank line).

        ``prefixes``: per text the start its translation must have (interactive translation;
        None or "" for none), forced, then search goes on; the translation holds it. With
        ``alignments=True`` each hypothesis carries its source–target token alignment
        (:func:`aiayn.decode.align.align`; a PyTorch model's)."""
        self._need("translate")
        cfg = self.decode_config(decode, **overrides)
        self._require_options(cfg)
        sources = encode_sources(self.tokenizer, texts, self.backend.cfg.max_len)
        forced = self._prefix_ids(texts, prefixes)
        with precision(self.device, cfg.bf16):
            hyps = self.backend.translate_ids(sources, cfg, progress, forced)
            if cfg.alignments:
                hyps = [
                    [
                        replace(h, alignment=align(cast(Attention, self.backend), src, h))
                        for h in line
                    ]
                    for src, line in zip(sources, hyps)
                ]
        return [[(self.tokenizer.decode(h.tokens), h) for h in line] for line in hyps]

    def _require_options(self, cfg: DecodeConfig) -> None:
        """:class:`~aiayn.runtime.Unsupported`, naming the backend, for an option it lacks."""
        if cfg.nbest > 1:
            require(self.backend, "nbest")
        if cfg.bf16:
            require(
                self.backend,
                "bf16",
                f"--bf16 applies to PyTorch models; {self.path} holds a '{self.engine}' export: "
                "export with --quantization instead",
            )
        if cfg.alignments:
            require(
                self.backend,
                "attention",
                "alignments are read from a PyTorch model's cross-attention: use the model "
                "folder it was exported from, with --engine torch",
            )
        if cfg.compile:
            require(
                self.backend,
                "compile",
                f"--compile applies to PyTorch models; {self.path} holds a '{self.engine}' export",
            )

    def _prefix_ids(
        self, texts: Sequence[str], prefixes: Sequence[str | None] | None
    ) -> list[list[int]] | None:
        """The token ids of each text's target prefix ([] for none); ConfigError for a list of
        another length, a prefix the decoder cannot hold, or one the tokenizer cannot represent
        exactly (:meth:`~aiayn.data.tokenizer.Tokenizer.encode_prefix`)."""
        if prefixes is None:
            return None
        if len(prefixes) != len(texts):
            raise ConfigError(f"{len(prefixes)} prefixes for {len(texts)} texts: give one per text")
        ids = [self.tokenizer.encode_prefix(p) if p and p.strip() else [] for p in prefixes]
        limit = self.backend.cfg.max_len - 1
        for n, prefix in enumerate(ids, 1):
            if len(prefix) > limit:
                raise ConfigError(
                    f"prefix {n} has {len(prefix)} tokens; the decoder holds at most {limit}"
                )
        return ids if any(ids) else None

    @overload
    def translate(
        self,
        texts: str,
        decode: DecodeConfig | None = None,
        prefixes: str | None = None,
        **overrides: Any,
    ) -> str: ...
    @overload
    def translate(
        self,
        texts: Sequence[str],
        decode: DecodeConfig | None = None,
        prefixes: Sequence[str | None] | None = None,
        **overrides: Any,
    ) -> list[str]: ...
    def translate(
        self,
        texts: str | Sequence[str],
        decode: DecodeConfig | None = None,
        prefixes: str | Sequence[str | None] | None = None,
        **overrides: Any,
    ) -> str | list[str]:
        """One translation per text ("" for a blank line), with the folder's decoding settings
        unless ``decode`` or keyword overrides (``beam=1``, ``no_repeat_ngram_size=3`` …) say
        otherwise; ``prefixes``: per text the start its translation must have. A str is one
        text (its translation, a str, comes back), as a Hugging Face pipeline takes it; a list
        gives a list."""
        batch, one = as_texts(texts)
        if isinstance(prefixes, str):  # the prefix of one text
            if not one:
                raise ConfigError("prefixes: give one per text, as a list (a str goes with a str)")
            prefixes = [prefixes]
        results = self.translate_hypotheses(batch, decode, prefixes=prefixes, **overrides)
        out = [line[0][0] if line else "" for line in results]
        return out[0] if one else out

    # ---- classification --------------------------------------------------------------------
    def label_names(self) -> list[str]:
        """Printable labels: the dataset's names when known, else the class ids."""
        n = self.config.model.n_classes
        if self.config.model.class_names:
            return list(self.config.model.class_names)
        names = LABEL_NAMES.get(self.config.data.dataset) if self.has_data else None
        return list(names) if names and len(names) == n else [str(i) for i in range(n)]

    def class_probs(self, texts: Sequence[str], batch_tokens: int | None = None) -> torch.Tensor:
        """(N, C) class probabilities of non-blank ``texts``, cleaned and cut as in training."""
        self._need("classify")
        limit = self.text_limit
        ids = [x[:limit] for x in encode_texts(self.tokenizer, texts)]
        return self.backend.class_probs(ids, batch_tokens)

    @overload
    def classify(  # type: ignore[overload-overlap]  # a str is a Sequence[str] too
        self, texts: str, batch_tokens: int | None = None
    ) -> dict: ...
    @overload
    def classify(self, texts: Sequence[str], batch_tokens: int | None = None) -> list[dict]: ...
    def classify(
        self, texts: str | Sequence[str], batch_tokens: int | None = None
    ) -> dict | list[dict]:
        """Per text ``{"label": name, "probs": {name: p}}`` ({"label": "", "probs": {}} for a
        blank text); a str is one text, whose one result comes back (a list gives a list)."""
        batch, one = as_texts(texts)
        filled = [i for i, text in enumerate(batch) if text.strip()]
        probs = self.class_probs([batch[i] for i in filled], batch_tokens)
        names = self.label_names()
        out: list[dict] = [{"label": "", "probs": {}} for _ in batch]
        for i, row in zip(filled, probs.tolist()):
            best = max(range(len(row)), key=row.__getitem__)
            out[i] = {"label": names[best], "probs": dict(zip(names, row))}
        return out[0] if one else out

    # ---- image classification --------------------------------------------------------------
    def image_probs(self, images: Sequence[Any]) -> torch.Tensor:
        """(N, K) class probabilities of images: file paths (PNG, JPEG) or arrays ((H, W),
        (H, W, C) or (C, H, W), uint8 or floats in [0, 1]), each converted as the training
        images were (grey or RGB, resized; said in one line per image converted)."""
        self._need("classify_images")
        cfg = self.config.model
        return self.backend.image_probs(model_images(images, cfg.image_size, cfg.channels))

    def classify_images(self, images: Sequence[Any], top_k: int = 1) -> list[dict]:
        """Per image ``{"label": name, "top": [{"label", "prob"}, …]}``, its ``top_k`` likeliest
        classes, best first."""
        probs = self.image_probs(images)
        return [
            {"label": best[0][0], "top": [{"label": n, "prob": p} for n, p in best]}
            for best in top_k_classes(probs, self.label_names(), top_k)
        ]

    # ---- generation ------------------------------------------------------------------------
    def generate(
        self,
        prompt: str,
        sampling: SamplingConfig | None = None,
        *,
        on_token: Callable[[str], Any] | None = None,
        use_cache: bool = True,
        **settings: Any,
    ) -> str:
        """The text sampled after ``prompt`` (prompt excluded), with ``sampling`` (default:
        :class:`~aiayn.decode.config.SamplingConfig`'s defaults) and ``settings``, further
        SamplingConfig fields (``max_new_tokens=50``, ``temperature=0.8``, ``seed=3`` …),
        applied. ``on_token(text)`` receives the new text as soon as it decodes (streaming; a
        token ending mid-character waits)."""
        sampling = (sampling or SamplingConfig()).replace(**settings)
        self._need("generate")
        prompt_ids = self.tokenizer.encode(prompt)
        if not prompt_ids:
            raise ConfigError("--prompt has no token the model's tokenizer knows")
        if self.tokenizer.unk_id in prompt_ids:
            log.warning("the prompt has characters the model never saw; they read as <unk>")
        stream = TextStream(self.tokenizer, on_token) if on_token is not None else None
        tokens = self.backend.generate_ids(
            prompt_ids, self.text_limit, sampling, use_cache=use_cache, on_token=stream
        )
        return self.tokenizer.decode(tokens)

    # ---- scoring ---------------------------------------------------------------------------
    def score(
        self,
        split: str | None = None,
        src: str | Path | None = None,
        ref: str | Path | None = None,
        limit: int = 0,
        decode: DecodeConfig | None = None,
        paper_bleu: bool = False,
        **overrides: Any,
    ) -> dict[str, Any]:
        """Score the model on a split of its dataset or on files: sacreBLEU (cased, -lc) and chrF
        of its translations (and, with ``paper_bleu``, the paper's tokenised BLEU in the target
        language), or a classifier's accuracy (``src`` a label<TAB>text .tsv or
        .jsonl). One evaluator for all kinds; the result says what it measured (``test_set``,
        counts, timing, settings). ``limit`` N scores the first N examples only; the result then
        says so (``"limit": N``), as a score of part of the test set, not of the set."""
        if limit < 0:
            raise ConfigError(f"--limit must be >= 0, got {limit}")
        if self.kind_info.does("classify_images"):
            return score_images(self, split, src, limit)
        if self.kind_info.does("classify"):
            if paper_bleu:
                raise ConfigError(
                    f"{self.path}: --paper-bleu scores translations; this is a classifier"
                )
            return score_classifier(self, split, src, limit, overrides.get("batch_tokens"))
        self._need("translate")
        return score_translations(self, split, src, ref, limit, decode, paper_bleu, overrides)
