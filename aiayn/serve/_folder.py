"""Temporary adapter: the PLAN.md model-folder contract over today's loaders.

Deleted once ``aiayn.folder.load_model_folder`` is on main; the server only uses what the contract
names (kind, model, tokenizer, decode, translate_hypotheses, classify, generate, paths).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from aiayn.checkpoint import TOKENIZER_FILE, load_model_dir, read_config
from aiayn.decode import DecodeConfig
from aiayn.errors import CheckpointError, ConfigError

KIND_NAMES = {"seq2seq": "translation", "classifier": "classification"}


class LocalFolder:
    engine = "torch"

    def __init__(self, paths: list[Path], device: torch.device) -> None:
        from aiayn.data import Tokenizer

        self.paths, self.path, self.device = paths, paths[0], device
        self.meta = read_config(paths[0])
        self.kind = KIND_NAMES.get(self.meta["kind"], self.meta["kind"])
        if self.kind == "translation":
            from aiayn.decode import load_ensemble

            self.model, self.tokenizer, _ = load_ensemble([str(p) for p in paths], device)
            return
        if len(paths) > 1:
            raise CheckpointError("several model folders make an ensemble of translation models")
        self.model, _, _ = load_model_dir(paths[0], map_location=device)
        if not (paths[0] / TOKENIZER_FILE).is_file():
            raise CheckpointError(f"{paths[0]}: not a complete model folder (no {TOKENIZER_FILE})")
        self.tokenizer = Tokenizer.from_file(paths[0] / TOKENIZER_FILE)

    @property
    def config(self) -> dict[str, Any]:
        return self.meta

    @property
    def decode(self) -> DecodeConfig:
        names = {f.name for f in dataclasses.fields(DecodeConfig)}
        saved = self.meta.get("decode") or {}
        return DecodeConfig(**{k: v for k, v in saved.items() if k in names})

    def translate_hypotheses(self, texts: Sequence[str], decode: DecodeConfig | None = None):
        from aiayn.decode import translate_hypotheses

        return translate_hypotheses(self.model, self.tokenizer, texts, decode or self.decode)

    def classify(self, texts: Sequence[str]) -> list[dict]:
        from aiayn.decode.classify import encode_texts, label_names, predict_ids, text_limit

        limit = text_limit(self.model, self.meta)
        ids = [x[:limit] for x in encode_texts(self.tokenizer, texts)]
        probs = predict_ids(self.model, ids, device=self.device)
        names = label_names(self.meta, probs.size(1))
        out = []
        for row in probs.tolist():
            best = max(range(len(row)), key=row.__getitem__)
            out.append({"label": names[best], "probs": dict(zip(names, row))})
        return out

    def generate(
        self,
        prompt: str,
        max_new_tokens: int = 200,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        on_token: Callable[[str], Any] | None = None,
    ) -> str:
        """The contract's generate: ``on_token(text)`` gets each new piece of decoded text."""
        from aiayn.decode.generate import generate

        cfg = self.model.cfg
        window = min(int(self.meta.get("data", {}).get("max_len", cfg.max_len)), cfg.max_len)
        ids: list[int] = []
        shown = ""

        def stream(token: int) -> None:
            nonlocal shown
            ids.append(token)
            text = self.tokenizer.decode(ids)
            if on_token is not None and not text.endswith("\ufffd"):
                on_token(text[len(shown) :])
                shown = text

        generate(
            self.model,
            self.tokenizer.encode(prompt),
            max_new_tokens,
            window,
            temperature,
            top_k,
            top_p,
            seed,
            on_token=stream,
        )
        return self.tokenizer.decode(ids)


class ExportedFolder(LocalFolder):
    """The same contract over folders written by `aiayn export` (ONNX Runtime or CTranslate2
    engines, :mod:`aiayn.export.engines`): translation (one folder or an ONNX ensemble),
    classification and generation (ONNX). The model holds no PyTorch weights, so there is no
    attention to record."""

    def __init__(self, paths: list[Path], engine: str | None) -> None:
        from aiayn.export import normalise_kind
        from aiayn.export.engines import load_exported, load_translation

        self.paths, self.path, self.device = paths, paths[0], torch.device("cpu")
        self.meta = read_config(paths[0])
        self.kind = normalise_kind(self.meta["kind"])
        self.engine = str(self.meta.get("format", engine))
        if self.kind == "translation":
            self.model, self.tokenizer, _ = load_translation([str(p) for p in paths], "cpu", engine)
            return
        if len(paths) > 1:
            raise CheckpointError("several model folders make an ensemble of translation models")
        self.model, self.tokenizer, _ = load_exported(paths[0], engine=engine)

    def translate_hypotheses(self, texts: Sequence[str], decode: DecodeConfig | None = None):
        from aiayn.export.engines import translate_hypotheses

        return translate_hypotheses(self.model, self.tokenizer, texts, decode or self.decode)


def load_folder(paths: Sequence[str | Path], device: str = "cpu", engine: str | None = None) -> Any:
    """The contract's ``load_model_folder`` when it exists, else :class:`LocalFolder`; folders
    written by `aiayn export` (or ``engine`` onnx / ctranslate2) as :class:`ExportedFolder`.
    ``engine`` None: whatever the folders hold."""
    from aiayn.export.engines import is_exported

    folders = [Path(p) for p in paths]
    exported = any(is_exported(p) for p in folders)
    if exported or engine not in (None, "torch"):
        if engine == "torch":
            raise ConfigError(
                f"{folders[0]}: holds an exported model; --engine torch needs the model folder "
                "it was exported from"
            )
        if not all(is_exported(p) for p in folders):
            raise ConfigError(
                f"--engine {engine}: runs what `aiayn export MODEL_DIR --format {engine} -o OUT` "
                "writes; give that folder"
            )
        if torch.device(device).type != "cpu":
            raise ConfigError("exported models (ONNX, CTranslate2) run on the CPU")
        return ExportedFolder(folders, engine)
    try:
        from aiayn.folder import load_model_folder
    except ImportError:
        return LocalFolder(folders, torch.device(device))
    return load_model_folder(folders, device=device)
