"""The model kinds: each declared once, here, and looked up everywhere else.

A kind is what a model folder holds (config.json ``kind``) and what a recipe trains
(``data.kind``): translation, classification, lm (a language model) and masked_lm (BERT-style
pre-training of an encoder) and image_classification (the Vision Transformer). Its :class:`Kind` says everything the rest of aiayn needs: the model
class, the training task (a dotted path, imported only when training asks for it, so that
loading a model for inference never imports :mod:`aiayn.train`), what a loaded model of the kind
does (the :class:`~aiayn.folder.ModelFolder` methods it answers), the routes a server answers,
the data source its examples are read and stored with, the kind-specific settings it takes
(which the config checks ask about), the export formats that write it (and what writes it in
each), and the words of its model card.

Nothing else in aiayn spells a kind's name or compares one: other modules ask the :class:`Kind`
(``tests/test_kinds_registry.py`` counts the literals). Adding a kind is one Task module and one
entry here (or :func:`register_kind` from outside aiayn; ``tests/test_toy_kind.py`` does it).
Names older model folders wrote (``seq2seq``, ``classifier``) still load: :func:`kind_name` maps
them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from aiayn.config import ModelConfig
from aiayn.errors import ConfigError
from aiayn.model import (
    Transformer,
    TransformerClassifier,
    TransformerLM,
    TransformerMaskedLM,
    VisionTransformer,
)

__all__ = [
    "TRANSLATION",
    "CLASSIFICATION",
    "LM",
    "MASKED_LM",
    "IMAGE_CLASSIFICATION",
    "TOKENS",
    "PIXELS",
    "OLD_NAMES",
    "DATA_SOURCES",
    "SETTINGS",
    "Kind",
    "KINDS",
    "kind_name",
    "get_kind",
    "kinds_taking",
    "register_kind",
    "check_kind",
]

TRANSLATION = "translation"
CLASSIFICATION = "classification"
LM = "lm"
MASKED_LM = "masked_lm"
IMAGE_CLASSIFICATION = "image_classification"

#: what a kind's model reads (:attr:`Kind.input`): token ids (B, S), or pixels (B, C, H, W)
TOKENS, PIXELS = "tokens", "pixels"

#: names older model folders wrote in config.json "kind" -> today's name
OLD_NAMES: Mapping[str, str] = {"seq2seq": TRANSLATION, "classifier": CLASSIFICATION}

#: the data sources a kind may read (:attr:`Kind.reads`; aiayn.data.loaders reads and stores
#: each), named after the kind whose data they are: the user's own files of a split each reads,
#: ``data.train_<f>`` and ``data.valid_<f>``
DATA_SOURCES: Mapping[str, tuple[str, ...]] = {
    TRANSLATION: ("src", "tgt"),  # sentence pairs
    CLASSIFICATION: ("file",),  # labelled texts
    LM: ("file",),  # one running text
    IMAGE_CLASSIFICATION: ("dir",),  # folders of images, one subfolder per class
}

#: the settings that only some kinds take (:attr:`Kind.takes`): a config check refuses a run that
#: sets one its kind does not take (aiayn/run_config.py, aiayn/data/config.py)
SETTINGS: Mapping[str, str] = {
    "bleu": "validation BLEU: train.best_metric = 'valid_bleu', train.bleu_beam",
    "output_vocab": "model.output_vocab: the output layer keeps the training targets' tokens",
    "pad_to_multiple": "data.pad_to_multiple: source and target batch widths padded",
    "bucket_widths": "data.bucket_widths: batch widths padded to a few fixed buckets",
    "bpe_dropout": "data.bpe_dropout: training pairs re-segmented",
    "langs": "data.src_lang, data.tgt_lang: a dataset's two languages",
    "adversarial_eps": "train.adversarial_eps: perturbed token embeddings",
    "rdrop": "train.rdrop_alpha: R-Drop, two dropout passes kept consistent",
    "long_examples": "data.long_examples = 'truncate': long texts cut, not dropped",
    "augment": "data.augment: training images randomly cropped, flipped or erased",
}


def _resolve(path: str) -> Any:
    """The object a ``"module:name"`` path names, its module imported now."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Kind:
    """One model kind (see the module docstring)."""

    name: str  # config.json "kind", data.kind, the API and the docs: one word everywhere
    model_class: Callable[[ModelConfig], nn.Module]
    task: str  # "module:Class" of its training Task (aiayn.train.task), imported on first use
    uses: tuple[str, ...]  # what a loaded folder does: its ModelFolder methods (translate, …)
    routes: tuple[str, ...]  # what `aiayn serve` answers, /v1/<route>
    # `aiayn export --format` value -> "module:function" that writes it in that format
    # (imported on use; the format calls it)
    exporters: Mapping[str, str]
    # The data source its examples are read and stored with (DATA_SOURCES: sentence pairs,
    # labelled texts, a running text); masked_lm reads classification's.
    reads: str
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
    takes: frozenset[str] = frozenset()  # the kind-specific SETTINGS it takes
    # exported format -> "module:Class" that runs this kind's export (ONNX: one engine per kind)
    engines: Mapping[str, str] = field(default_factory=dict)
    input: str = TOKENS  # what its model reads: TOKENS (B, S) ids, or PIXELS (B, C, H, W)
    # whether its folders hold a tokenizer.json (an image model has none: it reads pixels)
    tokenized: bool = True

    def __post_init__(self) -> None:
        if self.reads not in DATA_SOURCES:
            raise ConfigError(
                f"kind '{self.name}': no data source '{self.reads}' (have: {list(DATA_SOURCES)})"
            )
        unknown = sorted(self.takes - SETTINGS.keys())
        if unknown:
            raise ConfigError(
                f"kind '{self.name}': unknown settings {unknown} (have: {list(SETTINGS)})"
            )

    @property
    def data_files(self) -> tuple[str, ...]:
        """The user's files of a split it reads: ``data.train_<f>``, ``data.valid_<f>``."""
        return DATA_SOURCES[self.reads]

    def does(self, use: str) -> bool:
        """Whether a loaded folder of this kind answers ``use`` (translate, classify, generate,
        score)."""
        return use in self.uses

    def task_class(self) -> type:
        """The training Task class, imported now (aiayn.train stays unimported until asked)."""
        return _resolve(self.task)

    def exporter(self, fmt: str) -> Callable[..., Any]:
        """What writes this kind as ``aiayn export --format fmt``, imported now (ConfigError
        when no such format writes it: :func:`check_kind`)."""
        check_kind(fmt, self.name)
        return _resolve(self.exporters[fmt])

    def engine(self, fmt: str) -> type | None:
        """The class that runs this kind exported as ``fmt``, imported now; None when none does."""
        path = self.engines.get(fmt)
        return None if path is None else _resolve(path)


KINDS: dict[str, Kind] = {
    kind.name: kind
    for kind in (
        Kind(
            TRANSLATION,
            Transformer,
            "aiayn.train.translation:TranslationTask",
            uses=("translate", "score"),
            routes=("translate", "attention"),
            exporters={
                "onnx": "aiayn.export.onnx:export_translation",
                "ctranslate2": "aiayn.export.ctranslate2:translation_spec",
                "hf": "aiayn.export.hf:write_folder",
            },
            reads=TRANSLATION,
            stack={},
            title="translation",
            summary="translates {langs}",
            example=(
                'echo "A man rides a bike." | aiayn translate {f}{engine}',
                '.translate(["A man rides a bike."])',
            ),
            own_files="aiayn evaluate {f} --src test.{src} --ref test.{tgt}{engine}   # your own test files",
            takes=frozenset(
                {
                    "bleu",
                    "output_vocab",
                    "pad_to_multiple",
                    "bucket_widths",
                    "bpe_dropout",
                    "langs",
                    "rdrop",
                }
            ),
            engines={"onnx": "aiayn.runtime.onnx_backend:OnnxTranslator"},
        ),
        Kind(
            CLASSIFICATION,
            TransformerClassifier,
            "aiayn.train.classification:ClassificationTask",
            uses=("classify", "score"),
            routes=("classify",),
            exporters={"onnx": "aiayn.export.onnx:export_classifier"},
            reads=CLASSIFICATION,
            stack={"n_decoder_layers": 0},
            title="classification",
            summary="classifies texts into {n_classes} classes",
            example=(
                'echo "A wonderful, moving film." | aiayn classify {f}',
                '.classify(["A wonderful, moving film."])',
            ),
            own_files="aiayn evaluate {f} --src test.tsv{engine}   # label<TAB>text lines, or .jsonl",
            takes=frozenset({"adversarial_eps", "long_examples", "rdrop"}),
            engines={"onnx": "aiayn.runtime.onnx_backend:OnnxClassifier"},
        ),
        Kind(
            LM,
            TransformerLM,
            "aiayn.train.lm:LanguageModelTask",
            uses=("generate",),
            routes=("generate",),
            exporters={
                "onnx": "aiayn.export.onnx:export_lm",
                "ctranslate2": "aiayn.export.ctranslate2:lm_spec",
            },
            reads=LM,
            stack={"n_encoder_layers": 0},
            title="language model",
            summary="continues a text, one token at a time",
            example=(
                'aiayn generate {f} --prompt "ROMEO:" --max-new-tokens 200 --seed 1',
                '.generate("ROMEO:", max_new_tokens=200, seed=1)',
            ),
            engines={"onnx": "aiayn.runtime.onnx_backend:OnnxLM"},
        ),
        Kind(
            MASKED_LM,
            TransformerMaskedLM,
            "aiayn.train.mlm:MaskedLMTask",
            uses=(),
            routes=(),
            exporters={},
            reads=CLASSIFICATION,
            stack={"n_decoder_layers": 0},
            title="masked language model (pre-training)",
            summary="predicts masked tokens (for `train.init_from`)",
            note="Start a classifier from it: `aiayn train CONFIG --set train.init_from={f} --out RUN`.",
            takes=frozenset({"long_examples"}),
        ),
        Kind(
            IMAGE_CLASSIFICATION,
            VisionTransformer,
            "aiayn.train.images:ImageClassificationTask",
            uses=("classify_images", "score"),
            routes=("classify",),  # images (base64 files or arrays), not texts
            exporters={"onnx": "aiayn.export.onnx:export_image_classifier"},
            reads=IMAGE_CLASSIFICATION,
            stack={"n_decoder_layers": 0},
            title="image classification (Vision Transformer)",
            summary="classifies images into {n_classes} classes",
            example=(
                "aiayn classify {f} --image picture.png{engine}",
                '.classify_images(["picture.png"])',
            ),
            own_files="aiayn evaluate {f} --src test_images/{engine}   # one subfolder per class",
            takes=frozenset({"augment"}),
            engines={"onnx": "aiayn.runtime.onnx_backend:OnnxImageClassifier"},
            input=PIXELS,
            tokenized=False,
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


def kinds_taking(setting: str) -> str:
    """The kinds that take ``setting`` (one of :data:`SETTINGS`), quoted, for an error line:
    ``'translation'``, ``'classification' or 'masked_lm'``."""
    return " or ".join(f"'{k.name}'" for k in KINDS.values() if setting in k.takes)


def register_kind(kind: Kind) -> Kind:
    """Add ``kind`` to :data:`KINDS`: a kind defined outside aiayn (a plugin, a test), its Task
    module named by ``kind.task``. ConfigError when the name is taken. Returns ``kind``."""
    if kind.name in KINDS or kind.name in OLD_NAMES:
        raise ConfigError(f"model kind '{kind.name}' is already registered")
    KINDS[kind.name] = kind
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
