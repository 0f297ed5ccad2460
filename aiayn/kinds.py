"""The model kinds: each declared once, here, and looked up everywhere else.

A kind is what a model folder holds (config.json ``kind``) and what a recipe trains
(``data.kind``): translation, classification, lm (a language model) and masked_lm (BERT-style
pre-training of an encoder). Its :class:`Kind` says everything the rest of aiayn needs: the model
class, the training task (a dotted path, imported only when training asks for it, so that
loading a model for inference never imports :mod:`aiayn.train`), what a loaded model of the kind
does (the :class:`~aiayn.folder.ModelFolder` methods it answers), the routes a server answers,
the export formats that write it, and the words of its model card.

Nothing else in aiayn spells a kind's name: other modules use the constants below or ask the
:class:`Kind` (``tests/test_kinds_registry.py`` counts the literals). Names older model folders
wrote (``seq2seq``, ``classifier``) still load: :func:`kind_name` maps them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from torch import nn

from aiayn.config import ModelConfig
from aiayn.errors import ConfigError
from aiayn.model import Transformer, TransformerClassifier, TransformerLM, TransformerMaskedLM

__all__ = [
    "TRANSLATION",
    "CLASSIFICATION",
    "LM",
    "MASKED_LM",
    "OLD_NAMES",
    "Kind",
    "KINDS",
    "kind_name",
    "get_kind",
    "check_kind",
]

TRANSLATION = "translation"
CLASSIFICATION = "classification"
LM = "lm"
MASKED_LM = "masked_lm"

#: names older model folders wrote in config.json "kind" -> today's name
OLD_NAMES: Mapping[str, str] = {"seq2seq": TRANSLATION, "classifier": CLASSIFICATION}


@dataclass(frozen=True)
class Kind:
    """One model kind (see the module docstring)."""

    name: str  # config.json "kind", data.kind, the API and the docs: one word everywhere
    model_class: Callable[[ModelConfig], nn.Module]
    task: str  # "module:Class" of its training Task (aiayn.train.task), imported on first use
    uses: tuple[str, ...]  # what a loaded folder does: its ModelFolder methods (translate, …)
    routes: tuple[str, ...]  # what `aiayn serve` answers, /v1/<route>
    exporters: tuple[str, ...]  # the `aiayn export --format` values that write it
    reads: str  # the examples it trains on: a kind's data (masked_lm reads classification's)
    stack: Mapping[str, int]  # ModelConfig fields its model fixes (no decoder, no encoder)
    title: str  # model card: what the model is called
    summary: str  # model card: "A Transformer that …" ({langs}, {n_classes} filled in)
    example: tuple[str, str] | None = (
        None  # model card: a shell line, a Python call ({f}, {engine})
    )
    note: str = ""  # model card: what to do with it when there is no example
    own_files: str = (
        ""  # model card: `aiayn evaluate` on files of one's own ({f}, {src}, {tgt}, {engine})
    )

    def does(self, use: str) -> bool:
        """Whether a loaded folder of this kind answers ``use`` (translate, classify, generate,
        score)."""
        return use in self.uses

    def task_class(self) -> type:
        """The training Task class, imported now (aiayn.train stays unimported until asked)."""
        module, _, name = self.task.partition(":")
        return getattr(importlib.import_module(module), name)


KINDS: dict[str, Kind] = {
    kind.name: kind
    for kind in (
        Kind(
            TRANSLATION,
            Transformer,
            "aiayn.train.translation:TranslationTask",
            uses=("translate", "score"),
            routes=("translate", "attention"),
            exporters=("onnx", "ctranslate2", "hf"),
            reads=TRANSLATION,
            stack={},
            title="translation",
            summary="translates {langs}",
            example=(
                'echo "A man rides a bike." | aiayn translate {f}{engine}',
                '.translate(["A man rides a bike."])',
            ),
            own_files="aiayn evaluate {f} --src test.{src} --ref test.{tgt}{engine}   # your own test files",
        ),
        Kind(
            CLASSIFICATION,
            TransformerClassifier,
            "aiayn.train.classification:ClassificationTask",
            uses=("classify", "score"),
            routes=("classify",),
            exporters=("onnx",),
            reads=CLASSIFICATION,
            stack={"n_decoder_layers": 0},
            title="classification",
            summary="classifies texts into {n_classes} classes",
            example=(
                'echo "A wonderful, moving film." | aiayn classify {f}',
                '.classify(["A wonderful, moving film."])',
            ),
            own_files="aiayn evaluate {f} --src test.tsv{engine}   # label<TAB>text lines, or .jsonl",
        ),
        Kind(
            LM,
            TransformerLM,
            "aiayn.train.lm:LanguageModelTask",
            uses=("generate",),
            routes=("generate",),
            exporters=("onnx", "ctranslate2"),
            reads=LM,
            stack={"n_encoder_layers": 0},
            title="language model",
            summary="continues a text, one token at a time",
            example=(
                'aiayn generate {f} --prompt "ROMEO:" --max-new-tokens 200 --seed 1',
                '.generate("ROMEO:", max_new_tokens=200, seed=1)',
            ),
        ),
        Kind(
            MASKED_LM,
            TransformerMaskedLM,
            "aiayn.train.mlm:MaskedLMTask",
            uses=(),
            routes=(),
            exporters=(),
            reads=CLASSIFICATION,
            stack={"n_decoder_layers": 0},
            title="masked language model (pre-training)",
            summary="predicts masked tokens (for `train.init_from`)",
            note="Start a classifier from it: `aiayn train CONFIG --set train.init_from={f} --out RUN`.",
        ),
    )
}


def kind_name(name: str) -> str:
    """Today's name of a kind (the names older folders wrote mapped); unknown names unchanged."""
    return OLD_NAMES.get(name, name)


def get_kind(name: str) -> Kind:
    """The :class:`Kind` called ``name`` (or an old name of it); ConfigError naming the kinds."""
    kind = KINDS.get(kind_name(name))
    if kind is None:
        raise ConfigError(f"unknown model kind '{name}' (have: {', '.join(KINDS)})")
    return kind


def check_kind(fmt: str, kind: str, hint: str = "") -> None:
    """ConfigError when ``aiayn export --format fmt`` writes no model of ``kind`` (``hint``: what
    to do instead, appended)."""
    able = [k.name for k in KINDS.values() if fmt in k.exporters]
    if fmt not in get_kind(kind).exporters:
        raise ConfigError(
            f"--format {fmt} exports {', '.join(able)} models; this one is '{kind}'"
            + (f" ({hint})" if hint else "")
        )
