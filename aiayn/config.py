"""Configuration: frozen dataclasses, named presets, one override mechanism.

Every configurable part of aiayn is a frozen dataclass. Values are changed in one way only:
dotted ``key=value`` overrides (``d_model=256``, ``train.lr=5e-4``) applied by
:func:`apply_overrides`, which rejects unknown keys (with a did-you-mean) and values of the wrong
type. A TOML file gives the same keys, section by section.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import tomllib
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

from aiayn.errors import ConfigError

__all__ = [
    "ModelConfig",
    "apply_overrides",
    "coerce_keys",
    "parse_override",
    "coerce_value",
    "to_dict",
    "from_dict",
    "flatten_keys",
]


# --------------------------------------------------------------------------------------------
# Generic machinery
# --------------------------------------------------------------------------------------------


def _did_you_mean(name: str, choices: typing.Iterable[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f" (did you mean '{prefix}{close[0]}'?)" if close else ""


def coerce_value(key: str, raw: Any, annotation: Any) -> Any:
    """Convert ``raw`` (a string from the command line or a TOML value) to ``annotation``.

    Raises ConfigError naming ``key`` when the value does not fit the type.
    """
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(key, raw, typing.get_args(annotation))
    if origin is Literal:
        args = typing.get_args(annotation)
        text = raw if not isinstance(raw, str) else raw.strip()
        if text in args:
            return text
        raise ConfigError(f"{key}: {raw!r} is not one of {', '.join(map(repr, args))}")
    if origin in (tuple, list):
        return _coerce_sequence(key, raw, origin, typing.get_args(annotation))
    if annotation in _SCALARS:
        return _SCALARS[annotation](key, raw)
    raise ConfigError(f"{key}: unsupported field type {annotation!r}")


def _coerce_union(key: str, raw: Any, args: tuple[Any, ...]) -> Any:
    """``int | None`` and the like: "none"/"null" for None, else the first type that fits."""
    if raw is None or (isinstance(raw, str) and raw.lower() in ("none", "null")):
        if type(None) in args:
            return None
    errors = []
    for arg in args:
        if arg is type(None):
            continue
        try:
            return coerce_value(key, raw, arg)
        except ConfigError as err:
            errors.append(str(err))
    raise ConfigError(errors[0] if errors else f"{key}: invalid value {raw!r}")


def _coerce_sequence(key: str, raw: Any, origin: type, args: tuple[Any, ...]) -> Any:
    """A tuple or list: a TOML array, or from the command line the same array as TOML writes it
    (``["crop", "flip"]``, ``[0.9, 0.98]``) or bare "a,b,c" (brackets optional)."""
    if isinstance(raw, str):
        try:  # the recipe's own spelling, quotes and all
            array = tomllib.loads(f"v = {raw.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            array = None
        if isinstance(array, list):
            raw = array
        else:
            raw = [p.strip() for p in raw.strip("()[] ").split(",") if p.strip()]
    if not isinstance(raw, (list, tuple)):
        raise ConfigError(f"{key}: expected a list, got {raw!r}")
    item_t = args[0] if args else str
    items = [coerce_value(key, r, item_t) for r in raw]
    return tuple(items) if origin is tuple else items


def _coerce_bool(key: str, raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in ("true", "1", "yes", "on"):
        return True
    if isinstance(raw, str) and raw.strip().lower() in ("false", "0", "no", "off"):
        return False
    raise ConfigError(f"{key}: expected true or false, got {raw!r}")


def _coerce_int(key: str, raw: Any) -> int:
    if isinstance(raw, bool):
        raise ConfigError(f"{key}: expected an integer, got {raw!r}")
    if isinstance(raw, int):
        return raw
    if isinstance(raw, float) and raw.is_integer():
        return int(raw)
    if isinstance(raw, str):
        try:
            return int(raw.strip().replace("_", ""))
        except ValueError:
            pass
    raise ConfigError(f"{key}: expected an integer, got {raw!r}")


def _coerce_float(key: str, raw: Any) -> float:
    if isinstance(raw, bool):
        raise ConfigError(f"{key}: expected a number, got {raw!r}")
    value = None
    if isinstance(raw, (int, float)):
        value = float(raw)
    elif isinstance(raw, str):
        try:
            value = float(raw.strip())
        except ValueError:
            pass
    if value is None:
        raise ConfigError(f"{key}: expected a number, got {raw!r}")
    if not math.isfinite(value):  # TOML and JSON (Python's) accept nan and inf
        raise ConfigError(f"{key}: expected a finite number, got {raw!r}")
    return value


def _coerce_str(key: str, raw: Any) -> str:
    if isinstance(raw, str):
        return raw
    raise ConfigError(f"{key}: expected a string, got {raw!r}")


_SCALARS: dict[Any, typing.Callable[[str, Any], Any]] = {
    bool: _coerce_bool,
    int: _coerce_int,
    float: _coerce_float,
    str: _coerce_str,
}


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def apply_overrides(obj: Any, overrides: dict[str, Any], prefix: str = "") -> Any:
    """Return a copy of dataclass ``obj`` with ``overrides`` (dotted keys) applied.

    Nested dataclass fields take dotted keys (``train.lr``). Unknown keys and wrong types raise
    ConfigError with the full key and a did-you-mean suggestion.
    """
    types_ = _field_types(type(obj))
    direct: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for key, raw in overrides.items():
        head, _, rest = key.partition(".")
        full = f"{prefix}{head}"
        if head not in types_:
            raise ConfigError(
                f"unknown config key '{prefix}{key}'{_did_you_mean(head, types_, prefix)}"
            )
        value = getattr(obj, head)
        if dataclasses.is_dataclass(value):
            if rest:
                nested.setdefault(head, {})[rest] = raw
            elif isinstance(raw, dict):
                nested.setdefault(head, {}).update(raw)
            else:
                raise ConfigError(f"'{full}' is a section; set its keys as '{full}.KEY=VALUE'")
        else:
            if rest:
                raise ConfigError(f"unknown config key '{prefix}{key}' ('{full}' has no sub-keys)")
            direct[head] = coerce_value(full, raw, types_[head])
    for head, sub in nested.items():
        direct[head] = apply_overrides(getattr(obj, head), sub, prefix=f"{prefix}{head}.")
    return dataclasses.replace(obj, **direct)


def coerce_keys(cls: type, values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``values`` (fields of dataclass ``cls``, as text or TOML values) typed as the fields are,
    without building ``cls``: for settings completed later (a model folder's decoding settings
    and the command line's). Unknown keys and wrong types raise ConfigError as in
    :func:`apply_overrides`."""
    types_ = _field_types(cls)
    typed = {}
    for key, raw in values.items():
        if key not in types_:
            raise ConfigError(
                f"unknown config key '{prefix}{key}'{_did_you_mean(key, types_, prefix)}"
            )
        typed[key] = coerce_value(f"{prefix}{key}", raw, types_[key])
    return typed


def parse_override(text: str) -> tuple[str, str]:
    """Split ``key=value`` from the command line."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override '{text}' is not of the form KEY=VALUE")
    return key.strip(), value.strip()


def to_dict(obj: Any) -> dict[str, Any]:
    """A JSON-ready dict of a (nested) config dataclass."""
    return dataclasses.asdict(obj)


def from_dict(cls: type, data: dict[str, Any]) -> Any:
    """Rebuild ``cls`` (all fields defaulted) from :func:`to_dict` output, checking every key."""
    return apply_overrides(cls(), flatten_keys(data))


def flatten_keys(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts -> dotted keys: ``{"train": {"lr": 1}}`` -> ``{"train.lr": 1}``."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(flatten_keys(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


# --------------------------------------------------------------------------------------------
# The model's configuration
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelConfig:
    """Shape and regularisation of a Transformer (Vaswani et al. 2017, §3 and Table 3).

    Defaults are the paper's base model; :meth:`preset` gives the named variants.
    """

    # Vocabulary sizes; equal when one joint subword vocabulary is shared (§3.4).
    src_vocab_size: int = 37000
    tgt_vocab_size: int = 37000
    # Width of every sub-layer output and embedding (§3.1, d_model = 512).
    d_model: int = 512
    # Number of attention heads h (§3.2.2).
    n_heads: int = 8
    # Per-head query/key width d_k; None means d_model / n_heads as in the paper.
    d_k: int | None = None
    # Per-head value width d_v; None means d_k.
    d_v: int | None = None
    # Inner width of the position-wise feed-forward network (§3.3, 2048).
    d_ff: int = 2048
    # Encoder and decoder depth N (§3.1, 6 each). 0 encoder layers = decoder-only model.
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    # Residual dropout P_drop on sub-layer outputs and on embeddings + positions (§5.4).
    dropout: float = 0.1
    # Dropout on attention weights; None means the same as `dropout` (tensor2tensor does this).
    attention_dropout: float | None = 0.0
    # Dropout after the FFN's inner activation; 0 as in the paper.
    activation_dropout: float = 0.0
    # FFN non-linearity: the paper's ReLU, GELU (BERT/GPT), or SiLU x·σ(x) ("swish": what
    # OPUS-MT's Marian models use; see docs/huggingface.md).
    activation: Literal["relu", "gelu", "silu"] = "relu"
    # Post-LN (the paper: LayerNorm(x + Sublayer(x))) or pre-LN (x + Sublayer(LayerNorm(x))).
    norm_first: bool = False
    # LayerNorm epsilon (PyTorch's default; the paper does not state one).
    layer_norm_eps: float = 1e-5
    # Positional information: the paper's fixed sinusoids, or learned embeddings (§3.5, Table 3 E).
    positional: Literal["sinusoidal", "learned"] = "sinusoidal"
    # How the fixed sinusoids are laid out over the D dimensions: the paper's interleaved
    # sin, cos, sin, cos … (§3.5), or all sines then all cosines ("halves": Marian, fairseq,
    # tensor2tensor). The same frequencies either way; imported Marian models need "halves".
    sinusoid_layout: Literal["interleaved", "halves"] = "interleaved"
    # Longest position the positional table covers.
    max_len: int = 1024
    # Share source embeddings, target embeddings and the output projection (§3.4). Needs one vocab.
    share_embeddings: bool = True
    # Tie the target embedding with the pre-softmax projection (§3.4) when not sharing all three.
    tie_output: bool = True
    # Translation only, not in the paper: the tokens the output softmax ranges over. "all": the
    # whole target vocabulary. "targets": only those that occur in the training targets (a
    # joint vocabulary also holds source-only subwords, a third of Multi30k's 8,000), recorded in
    # the model as the buffer `output_mask`; the others get probability 0, and the output
    # projection of training and its label smoothing cover the kept tokens only (less work).
    output_vocab: Literal["all", "targets"] = "all"
    # Multiply embeddings by sqrt(d_model) (§3.4).
    scale_embeddings: bool = True
    # Not in the paper: a bias on the pre-softmax projection (§3.4 has none). Marian's
    # `final_logits_bias`; imported models carry it, aiayn's own are trained without.
    final_logits_bias: bool = False
    # Biases in the linear projections (the paper's equations omit them; most code keeps them).
    bias: bool = True
    # Classifier head (encoder-only models): number of labels, and how token states are pooled
    # into one vector — mean over real tokens, max (the Keras IMDB tutorial), or a learned CLS token.
    n_classes: int = 2
    pooling: Literal["mean", "max", "cls"] = "mean"
    # Classifier training only: each real token is dropped (neither attended to nor pooled, as
    # if it were padding) with this probability; a text always keeps at least one token. The
    # "word dropout" of Iyyer et al. (2015) against a classifier learning a few words by heart.
    token_dropout: float = 0.0
    # Classifier only, not in the paper: each position also gets an embedding of the bigram
    # (previous token, this token), hashed into this many rows (fastText's bag of n-grams,
    # Joulin et al. 2017), added to the scaled token embedding before positions; 0 = off.
    bigram_buckets: int = 0
    # Classifier only, not in the paper: NBSVM (Wang & Manning 2012, with the logistic loss) over
    # each text's distinct word n-grams of orders 1 … nb_ngrams, hashed into nb_buckets rows,
    # fitted on the training split before the first update; outside training its class scores
    # (centred) times nb_scale join the logits (shallow fusion; the scale chosen on validation
    # data with scripts/nb_scale.py). 0 = off.
    nb_ngrams: int = 0
    nb_buckets: int = 8_388_608
    nb_scale: float = 1.0
    # Image classifier (the Vision Transformer, Dosovitskiy et al. 2021): images are resized to
    # image_size × image_size with `channels` colour channels (1 grey, 3 RGB) and cut into
    # (image_size / patch_size)² patches of patch_size × patch_size pixels, each one token.
    image_size: int = 28
    patch_size: int = 4
    channels: int = 1
    # How an image becomes its patch tokens: "patch", the ViT's linear map of each P × P patch;
    # or "conv", the paper's hybrid (§3.1) in the form of Xiao et al. (2021), "Early
    # Convolutions Help Transformers See Better": a 3 × 3 convolution, log2(P) more of stride 2
    # (each with GroupNorm, GELU), a 1 × 1 convolution to d_model: the same (H/P)² tokens.
    stem: Literal["patch", "conv"] = "patch"
    # stem = "conv": the 3 × 3 convolutions at each of its log2(P) + 1 resolutions, the full one
    # first (each stage as a ResNet's: its first convolution changes the width, and the stride
    # after the first stage, the others keep both); () = one at each, Xiao et al.'s stem.
    stem_depths: tuple[int, ...] = ()
    # The names of the classes, in label order, when the data gives them (image folders,
    # Fashion-MNIST): what `classify` prints. () = the class ids.
    class_names: tuple[str, ...] = ()
    # Special token ids; padding is never attended to and never predicted.
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    unk_id: int = 3

    PRESETS: typing.ClassVar[dict[str, dict[str, Any]]] = {
        # Vaswani et al. 2017, Table 3 "base".
        "base": dict(
            d_model=512, n_heads=8, d_ff=2048, n_encoder_layers=6, n_decoder_layers=6, dropout=0.1
        ),
        # Vaswani et al. 2017, Table 3 "big" (P_drop 0.3 for En-De).
        "big": dict(
            d_model=1024, n_heads=16, d_ff=4096, n_encoder_layers=6, n_decoder_layers=6, dropout=0.3
        ),
        # A CPU-sized model for experiments.
        "small": dict(
            d_model=256, n_heads=4, d_ff=1024, n_encoder_layers=3, n_decoder_layers=3, dropout=0.1
        ),
        # Transformer-tiny for Multi30k (Wu et al. 2021, "Good for Misconceived Reasons").
        "tiny": dict(
            d_model=128, n_heads=4, d_ff=256, n_encoder_layers=4, n_decoder_layers=4, dropout=0.3
        ),
    }

    def __post_init__(self) -> None:
        self.validate()

    # ---- derived sizes ---------------------------------------------------------------------
    @property
    def head_dim_k(self) -> int:
        return self.d_k if self.d_k is not None else self.d_model // self.n_heads

    @property
    def head_dim_v(self) -> int:
        return self.d_v if self.d_v is not None else self.head_dim_k

    @property
    def attn_dropout(self) -> float:
        return self.dropout if self.attention_dropout is None else self.attention_dropout

    # ---- construction ----------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str, **overrides: Any) -> ModelConfig:
        """A named preset (base, big, small, tiny) with keyword overrides."""
        if name not in cls.PRESETS:
            raise ConfigError(
                f"unknown preset '{name}'{_did_you_mean(name, cls.PRESETS)}; "
                f"choose one of {', '.join(cls.PRESETS)}"
            )
        values = {**cls.PRESETS[name], **overrides}
        return apply_overrides(cls(), values)

    def validate(self) -> None:
        """Raise ConfigError naming the field when a value makes no sense."""
        self._validate_sizes()
        self._validate_options()
        ids = {
            "pad_id": self.pad_id,
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
            "unk_id": self.unk_id,
        }
        for name, value in ids.items():
            if not 0 <= value < min(self.src_vocab_size, self.tgt_vocab_size):
                raise ConfigError(f"{name} ({value}) must be inside the vocabulary")

    def _validate_sizes(self) -> None:
        """Widths, depths and rates: positive, non-negative, in [0, 1)."""
        for name in (
            "src_vocab_size",
            "tgt_vocab_size",
            "d_model",
            "n_heads",
            "d_ff",
            "max_len",
            "n_classes",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("d_k", "d_v"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"{name} must be positive, got {value}")
        for name in ("n_encoder_layers", "n_decoder_layers"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.n_encoder_layers == 0 and self.n_decoder_layers == 0:
            raise ConfigError("n_encoder_layers and n_decoder_layers cannot both be 0")
        if self.d_k is None and self.d_model % self.n_heads != 0:
            raise ConfigError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads}) "
                "unless d_k is set"
            )
        for name in ("image_size", "patch_size"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.image_size % self.patch_size:
            raise ConfigError(
                f"patch_size ({self.patch_size}) must divide image_size ({self.image_size})"
            )
        if self.channels not in (1, 3):
            raise ConfigError(f"channels must be 1 (grey) or 3 (RGB), got {self.channels}")
        if self.stem == "conv" and (self.patch_size < 2 or self.patch_size & (self.patch_size - 1)):
            raise ConfigError(
                f"stem = 'conv' halves the image log2(patch_size) times: patch_size must be a "
                f"power of 2 (2, 4, 8, …), got {self.patch_size}"
            )
        stages = self.patch_size.bit_length()  # log2(P) + 1 for a power of 2
        if self.stem_depths and (
            self.stem != "conv" or len(self.stem_depths) != stages or min(self.stem_depths) < 1
        ):
            raise ConfigError(
                f"stem_depths gives the convolutions at each of the conv stem's log2(patch_size) "
                f"+ 1 = {stages} resolutions (stem = 'conv'), each at least 1: got "
                f"{list(self.stem_depths)} with stem = '{self.stem}'"
            )
        if self.class_names and len(self.class_names) != self.n_classes:
            raise ConfigError(
                f"class_names has {len(self.class_names)} names for n_classes = {self.n_classes}"
            )
        for name in ("dropout", "activation_dropout", "token_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {getattr(self, name)}")

    def _validate_options(self) -> None:
        """Options that apply to one stack only, and the sharing of embeddings."""
        if self.final_logits_bias and (self.n_encoder_layers == 0 or self.n_decoder_layers == 0):
            raise ConfigError(
                "model.final_logits_bias applies to encoder–decoder (translation) models"
            )
        if self.bigram_buckets < 0:
            raise ConfigError(f"bigram_buckets must be >= 0, got {self.bigram_buckets}")
        if self.bigram_buckets and self.n_decoder_layers > 0:
            raise ConfigError(
                "model.bigram_buckets applies to encoder-only classifiers (n_decoder_layers = 0)"
            )
        if self.nb_ngrams < 0 or self.nb_buckets < 1 or self.nb_scale < 0:
            raise ConfigError(
                f"nb_ngrams must be >= 0, nb_buckets >= 1 and nb_scale >= 0, got "
                f"{self.nb_ngrams}, {self.nb_buckets} and {self.nb_scale}"
            )
        if self.nb_ngrams and self.n_decoder_layers > 0:
            raise ConfigError(
                "model.nb_ngrams applies to encoder-only classifiers (n_decoder_layers = 0)"
            )
        if self.token_dropout and self.n_decoder_layers > 0:
            raise ConfigError(
                "model.token_dropout applies to encoder-only classifiers (n_decoder_layers = 0)"
            )
        if self.attention_dropout is not None and not 0.0 <= self.attention_dropout < 1.0:
            raise ConfigError(f"attention_dropout must be in [0, 1), got {self.attention_dropout}")
        if (
            self.share_embeddings
            and self.n_encoder_layers > 0
            and (self.src_vocab_size != self.tgt_vocab_size)
        ):
            raise ConfigError(
                f"share_embeddings needs src_vocab_size == tgt_vocab_size "
                f"(got {self.src_vocab_size} and {self.tgt_vocab_size}); "
                "set share_embeddings=false for separate vocabularies"
            )
