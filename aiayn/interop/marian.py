"""Import a Hugging Face Marian (OPUS-MT) folder as an aiayn model folder (``aiayn import hf``).

A ``MarianMTModel`` is the paper's post-LN Transformer with a few differences, each mapped onto
a :class:`~aiayn.config.ModelConfig` option (tested against transformers on a tiny model built
in the tests, tests/test_hf_import.py):

- sinusoids laid out as sines | cosines (``sinusoid_layout = "halves"``), token embeddings × √d
  (``scale_embedding``), no embedding LayerNorm (aiayn has none);
- ``final_logits_bias`` (``final_logits_bias = true``), SiLU ("swish", ``activation = "silu"``);
- ``<pad>`` is the decoder's start token and its id (``bos_id = decoder_start_token_id``,
  which is ``pad_id`` in OPUS-MT models); ``</s>`` ends the source;
- two SentencePiece models over one joint vocabulary (:mod:`aiayn.data.spm`);
- or, in aiayn's own ``--format hf`` exports, ``tokenizer.json`` (a BPE/unigram tokenizer
  with aiayn's special ids) and BOS as the decoder's start: they import back;
- ``generation_config.json`` becomes the folder's decoding settings (:func:`decode_settings`),
  so that ``aiayn translate`` with no flags gives what ``model.generate()`` gives with none.

What cannot be mapped is refused with one line that names it: another architecture, a pre-LN or
embedding-LayerNorm variant, separate source and target vocabularies, untied output weights, a
generation setting aiayn's search does not have, a missing file. Weights are read from
``model.safetensors``, or from ``pytorch_model.bin`` with ``torch.load(weights_only=True)``:
nothing executes pickled code.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor

from aiayn.card import write_model_card
from aiayn.checks import check_finite_tensors, check_ids, check_integer, check_number, check_order
from aiayn.config import ModelConfig
from aiayn.data.spm import SentencePieceTokenizer, load_processor
from aiayn.data.tokenizer import Tokenizer
from aiayn.decode.config import DecodeConfig
from aiayn.errors import CheckpointError, ConfigError, DataError
from aiayn.folder.checkpoint import save_model_dir
from aiayn.io import check_not_input, check_output_folder
from aiayn.kinds import TRANSLATION
from aiayn.model import Transformer
from aiayn.model.embeddings import sinusoidal_table
from aiayn.progress import progress_bar

log = logging.getLogger(__name__)

__all__ = ["import_marian", "marian_names", "read_marian", "decode_settings", "MARIAN_FILES"]

# What a Marian folder must hold besides config.json and its weights.
MARIAN_FILES = ("source.spm", "target.spm", "vocab.json")
ACTIVATIONS = {"swish": "silu", "silu": "silu", "relu": "relu", "gelu": "gelu"}

# aiayn's name of each sub-layer -> transformers' (per layer).
_ENCODER_LAYER = {
    "self_attn": "self_attn",
    "attn_block.norm": "self_attn_layer_norm",
    "feed_forward.linear1": "fc1",
    "feed_forward.linear2": "fc2",
    "ff_block.norm": "final_layer_norm",
}
_DECODER_LAYER = {
    "self_attn": "self_attn",
    "self_block.norm": "self_attn_layer_norm",
    "cross_attn": "encoder_attn",
    "cross_block.norm": "encoder_attn_layer_norm",
    "feed_forward.linear1": "fc1",
    "feed_forward.linear2": "fc2",
    "ff_block.norm": "final_layer_norm",
}
_ATTENTION = ("q_proj", "k_proj", "v_proj", "out_proj")


def marian_names(n_encoder_layers: int, n_decoder_layers: int) -> dict[str, str]:
    """aiayn's weight name -> ``MarianMTModel``'s, for every weight but the shared embedding and
    the output bias (whose layouts differ: see :func:`to_aiayn`)."""
    names: dict[str, str] = {}
    for side, n, table in (
        ("encoder", n_encoder_layers, _ENCODER_LAYER),
        ("decoder", n_decoder_layers, _DECODER_LAYER),
    ):
        for i in range(n):
            for ours, theirs in table.items():
                subs = [f".{p}" for p in _ATTENTION] if theirs.endswith("attn") else [""]
                for sub in subs:
                    for param in ("weight", "bias"):
                        names[f"{side}.layers.{i}.{ours}{sub}.{param}"] = (
                            f"model.{side}.layers.{i}.{theirs}{sub}.{param}"
                        )
    return names


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path.parent}: not a Marian folder ({path.name} is missing)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"{path}: not readable JSON ({err})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: not a JSON object")
    return value


def _check_architecture(hf: dict[str, Any], path: Path) -> None:
    """ConfigError naming the first thing of config.json that is no post-LN Marian model."""
    kind = hf.get("model_type")
    if kind != "marian":
        raise ConfigError(
            f"{path}: model_type {kind!r} is not a Marian model; aiayn imports MarianMTModel "
            "folders (OPUS-MT)"
        )
    arch = hf.get("architectures") or ["MarianMTModel"]
    if arch != ["MarianMTModel"]:
        raise ConfigError(f"{path}: architectures {arch} is not ['MarianMTModel']")
    for key, meaning in (
        ("normalize_before", "a pre-LN Marian variant"),
        ("add_final_layer_norm", "a pre-LN Marian variant (final LayerNorms)"),
        ("normalize_embedding", "an embedding LayerNorm"),
    ):
        if hf.get(key):
            raise ConfigError(f"{path}: {key} = true ({meaning}) cannot be mapped")
    if hf.get("share_encoder_decoder_embeddings", True) is False:
        raise ConfigError(
            f"{path}: separate source and target vocabularies "
            "(share_encoder_decoder_embeddings = false) are not supported"
        )
    if hf.get("tie_word_embeddings", True) is False:
        raise ConfigError(f"{path}: tie_word_embeddings = false (an untied output layer)")
    act = hf.get("activation_function", "gelu")
    if act not in ACTIVATIONS:
        raise ConfigError(f"{path}: activation_function {act!r} is not one of {list(ACTIVATIONS)}")
    for a, b in (
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        if hf.get(a) != hf.get(b):
            raise ConfigError(f"{path}: {a} ({hf.get(a)}) differs from {b} ({hf.get(b)})")
    vocab, decoder_vocab = hf.get("vocab_size"), hf.get("decoder_vocab_size")
    if decoder_vocab not in (None, vocab):
        raise ConfigError(f"{path}: decoder_vocab_size {decoder_vocab} differs from {vocab}")


def model_config(hf: dict[str, Any], path: Path, unk_id: int) -> ModelConfig:
    """The :class:`ModelConfig` of a Marian config.json (checked by :func:`_check_architecture`);
    ``unk_id`` is the vocabulary's (config.json does not record it)."""
    _check_architecture(hf, path)
    pad, start = hf.get("pad_token_id"), hf.get("decoder_start_token_id", hf.get("pad_token_id"))
    if type(pad) is not int or type(start) is not int:
        raise ConfigError(
            f"{path}: pad_token_id {pad!r} and decoder_start_token_id {start!r} must be ids"
        )
    for key in ("dropout", "attention_dropout", "activation_dropout"):
        if hf.get(key) is not None:
            _checked(path, check_number, key, hf[key], minimum=0, maximum=1)
    for key in ("vocab_size", "d_model", "encoder_attention_heads", "encoder_ffn_dim"):
        if key in hf:
            _checked(path, check_integer, key, hf[key], minimum=1)
    try:
        return ModelConfig(
            src_vocab_size=hf["vocab_size"],
            tgt_vocab_size=hf["vocab_size"],
            d_model=hf["d_model"],
            n_heads=hf["encoder_attention_heads"],
            d_ff=hf["encoder_ffn_dim"],
            n_encoder_layers=hf["encoder_layers"],
            n_decoder_layers=hf["decoder_layers"],
            dropout=float(hf.get("dropout", 0.1)),
            attention_dropout=float(hf.get("attention_dropout", 0.0)),
            activation_dropout=float(hf.get("activation_dropout", 0.0)),
            activation=ACTIVATIONS[hf.get("activation_function", "gelu")],  # type: ignore[arg-type]
            norm_first=False,
            positional="sinusoidal",
            sinusoid_layout="halves",
            max_len=hf.get("max_position_embeddings", 1024),
            share_embeddings=True,
            scale_embeddings=bool(hf.get("scale_embedding", False)),
            final_logits_bias=True,
            pad_id=pad,
            bos_id=start,  # <pad> in OPUS-MT models; BOS in aiayn's own exports
            eos_id=hf["eos_token_id"],
            unk_id=unk_id,
        )
    except KeyError as err:
        raise ConfigError(f"{path}: {err.args[0]} is missing") from None
    except (TypeError, ValueError, ConfigError) as err:
        raise ConfigError(f"{path}: cannot be mapped ({err})") from None


# ---- weights -------------------------------------------------------------------------------


def read_weights(folder: Path) -> dict[str, Tensor]:
    """The tensors of ``model.safetensors``, else of ``pytorch_model.bin`` (``weights_only``:
    no pickled code runs), names under ``model.`` as transformers saves them."""
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (folder / index).is_file():
            raise ConfigError(f"{folder}: sharded weights ({index}) are not supported")
    safetensors, pickle = folder / "model.safetensors", folder / "pytorch_model.bin"
    if safetensors.is_file():
        try:
            state = load_file(str(safetensors))
        except (SafetensorError, OSError, ValueError, RuntimeError) as err:
            raise CheckpointError(
                f"{safetensors}: not a readable safetensors file ({err})"
            ) from None
    elif pickle.is_file():
        try:
            state = torch.load(pickle, map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001 - UnpicklingError, RuntimeError, EOFError…
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise CheckpointError(
                f"{pickle}: not loadable as plain tensors (weights_only; {first[:200]})"
            ) from None
    else:
        raise ConfigError(
            f"{folder}: not a Marian folder (no model.safetensors or pytorch_model.bin)"
        )
    if not isinstance(state, dict) or not all(isinstance(t, Tensor) for t in state.values()):
        raise CheckpointError(f"{folder}: the weights file is not a table of tensors")
    check_finite_tensors(state, safetensors if safetensors.is_file() else pickle)
    if not any(k.startswith("model.") for k in state):  # saved from the inner MarianModel
        state = {
            (k if k in ("final_logits_bias", "lm_head.weight") else f"model.{k}"): t
            for k, t in state.items()
        }
    return state


def _shared_embedding(weights: dict[str, Tensor], folder: Path) -> tuple[Tensor, list[str]]:
    """The one embedding matrix (V, D) the encoder, the decoder and the output layer share, and
    the names that held it; CheckpointError when copies differ (an untied model)."""
    names: list[str] = [
        k
        for k in (
            "model.shared.weight",
            "model.encoder.embed_tokens.weight",
            "model.decoder.embed_tokens.weight",
            "lm_head.weight",
        )
        if k in weights
    ]
    if not names:
        raise CheckpointError(f"{folder}: the weights have no model.shared.weight")
    shared = weights[names[0]]
    for name in names[1:]:
        if weights[name].shape != shared.shape or not torch.equal(weights[name], shared):
            raise CheckpointError(
                f"{folder}: {name} differs from {names[0]} (untied embeddings cannot be mapped)"
            )
    return shared, names


def to_aiayn(weights: dict[str, Tensor], cfg: ModelConfig, folder: Path) -> dict[str, Tensor]:
    """aiayn's state dict (tied tensors once) from a MarianMTModel's; CheckpointError naming a
    missing tensor, a tensor aiayn has no place for, or positions that are not the sinusoids."""
    shared, used = _shared_embedding(weights, folder)
    state = {"src_embed.token.weight": shared}
    bias = weights.get("final_logits_bias", torch.zeros(1, shared.size(0)))
    state["generator.bias"] = bias.reshape(-1)
    used.append("final_logits_bias")
    for ours, theirs in marian_names(cfg.n_encoder_layers, cfg.n_decoder_layers).items():
        if theirs not in weights:
            raise CheckpointError(f"{folder}: the weights have no {theirs}")
        state[ours] = weights[theirs]
        used.append(theirs)
    for side in ("encoder", "decoder"):
        name = f"model.{side}.embed_positions.weight"
        if name in weights:  # recomputed, but it must be what aiayn computes
            table = weights[name]
            expected = sinusoidal_table(table.size(0), table.size(1), "halves")
            fits = table.size(1) == cfg.d_model and torch.allclose(
                table.float(), expected, atol=1e-4
            )
            if not fits:
                raise CheckpointError(f"{folder}: {name} are not Marian's sinusoids")
            used.append(name)
    extra = sorted(set(weights) - set(used))
    if extra:
        raise CheckpointError(
            f"{folder}: weights aiayn has no place for ({', '.join(extra[:3])}"
            + (f" and {len(extra) - 3} more" if len(extra) > 3 else "")
            + "): not a plain Marian model"
        )
    return {k: v.float() for k, v in state.items()}


# ---- tokenizer -----------------------------------------------------------------------------


def _token_name(value: Any, default: str) -> str:
    """A special token of tokenizer_config.json: a string or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else default


def read_tokenizer(folder: Path) -> Any:
    """The :class:`~aiayn.data.spm.SentencePieceTokenizer` of a Marian folder: source.spm,
    target.spm, vocab.json, and the special tokens tokenizer_config.json names; or the subword
    tokenizer of an aiayn model exported ``--format hf`` (tokenizer.json)."""
    if not (folder / "source.spm").is_file() and (folder / "tokenizer.json").is_file():
        return _exported_tokenizer(folder)
    for name in MARIAN_FILES:
        if not (folder / name).is_file():
            raise ConfigError(f"{folder}: not a Marian folder ({name} is missing)")
    config_path = folder / "tokenizer_config.json"
    config = _read_json(config_path) if config_path.is_file() else {}
    if config.get("separate_vocabs"):
        raise ConfigError(f"{config_path}: separate_vocabs = true is not supported")
    vocab = _read_json(folder / "vocab.json")
    specials = {
        "pad": _token_name(config.get("pad_token"), "<pad>"),
        "eos": _token_name(config.get("eos_token"), "</s>"),
        "unk": _token_name(config.get("unk_token"), "<unk>"),
    }
    models = {}
    for name in ("source.spm", "target.spm"):  # each checked alone: an error names its file
        try:
            models[name] = (folder / name).read_bytes()
            load_processor(models[name], str(folder / name))
        except OSError as err:
            raise ConfigError(f"{folder / name}: cannot read it ({err.strerror or err})") from None
        except DataError as err:
            raise ConfigError(str(err)) from None
    try:
        return SentencePieceTokenizer(
            models["source.spm"], models["target.spm"], vocab, specials, str(folder / "vocab.json")
        )
    except DataError as err:
        raise ConfigError(str(err)) from None


def _exported_tokenizer(folder: Path) -> Any:
    """The BPE/unigram tokenizer of an aiayn model exported ``--format hf``: tokenizer.json (a
    ``tokenizers`` file) as a PreTrainedTokenizerFast with aiayn's special ids; ConfigError for a
    tokenizer.json of anything else."""
    path = folder / "tokenizer_config.json"
    config = _read_json(path) if path.is_file() else {}
    if config.get("tokenizer_class") != "PreTrainedTokenizerFast":
        raise ConfigError(
            f"{folder}: not a Marian folder (source.spm is missing, and tokenizer.json is not "
            "the PreTrainedTokenizerFast of an aiayn export)"
        )
    try:
        tokenizer = Tokenizer.from_str(
            (folder / "tokenizer.json").read_text(encoding="utf-8"), str(folder / "tokenizer.json")
        )
    except (OSError, UnicodeDecodeError, DataError) as err:
        raise ConfigError(f"{folder / 'tokenizer.json'}: {err}") from None
    token = getattr(getattr(tokenizer, "hf", None), "id_to_token", None)
    roles = {
        "pad_token": tokenizer.pad_id,
        "eos_token": tokenizer.eos_id,
        "unk_token": tokenizer.unk_id,
    }
    for role, i in roles.items():
        if token is None or config.get(role) not in (None, token(i)):
            raise ConfigError(f"{path}: {role} {config.get(role)!r} is not the tokenizer's id {i}")
    return tokenizer


def _check_ids(tokenizer: Any, hf: dict[str, Any], folder: Path) -> None:
    """The vocabulary's special ids and size are the model's."""
    for name, ours in (("pad_token_id", tokenizer.pad_id), ("eos_token_id", tokenizer.eos_id)):
        if hf.get(name) != ours:
            raise ConfigError(
                f"{folder}: config.json's {name} is {hf.get(name)}, vocab.json's is {ours}"
            )
    if tokenizer.vocab_size != hf.get("vocab_size"):
        raise ConfigError(
            f"{folder}: vocab.json has {tokenizer.vocab_size} tokens, config.json's vocab_size "
            f"is {hf.get('vocab_size')}"
        )


# ---- decoding settings ---------------------------------------------------------------------

# generation_config.json keys that change what generate() outputs and aiayn cannot do, with the
# value that leaves them off.
_UNSUPPORTED = {
    "do_sample": False,
    "num_beam_groups": 1,
    "diversity_penalty": 0.0,
    "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "forced_bos_token_id": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "exponential_decay_length_penalty": None,
    "force_words_ids": None,
    "sequence_bias": None,
    "penalty_alpha": None,
    "constraints": None,
}


def _bad_ids(value: Any, path: Path, vocab_size: int) -> list[int]:
    """bad_words_ids [[id], …] -> [id, …]; ConfigError for a word of several tokens or an id
    outside the vocabulary."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(
        isinstance(w, list) and len(w) == 1 and type(w[0]) is int for w in value
    ):
        raise ConfigError(
            f"{path}: bad_words_ids {value!r}: only single-token bad words can be mapped"
        )
    ids = sorted({w[0] for w in value})
    _checked(path, check_ids, "bad_words_ids", ids, vocab_size)
    return ids


def _checked(path: Path, check: Any, *args: Any, **kwargs: Any) -> None:
    """Run one of aiayn.checks' rules; its ConfigError names ``path``."""
    try:
        check(*args, **kwargs)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


def _check_generation(generation: dict[str, Any], path: Path) -> None:
    """The numbers of generation_config.json by aiayn's rules (:mod:`aiayn.checks`): what
    transformers would refuse, or aiayn refuse later, is refused at the door."""
    for key in ("num_beams", "max_length", "max_new_tokens"):
        if generation.get(key) is not None:
            _checked(path, check_integer, key, generation[key], minimum=1)
    for key in ("min_length", "min_new_tokens"):
        if generation.get(key) is not None:
            _checked(path, check_integer, key, generation[key], minimum=0)
    if generation.get("length_penalty") is not None:
        _checked(path, check_number, "length_penalty", generation["length_penalty"], minimum=0)
    for low, high in (("min_length", "max_length"), ("min_new_tokens", "max_new_tokens")):
        if generation.get(low) is not None and generation.get(high) is not None:
            _checked(path, check_order, low, generation[low], high, generation[high])


def decode_settings(generation: dict[str, Any], cfg: ModelConfig, path: Path) -> dict[str, Any]:
    """The :class:`~aiayn.decode.DecodeConfig` fields that make aiayn's search do what
    ``model.generate()`` does with ``generation`` (generation_config.json; transformers'
    defaults where a key is absent). ConfigError naming the file and the setting when aiayn's
    search lacks it or it is out of range (the folder would then be refused by every command)."""
    for key, off in _UNSUPPORTED.items():
        if generation.get(key, off) not in (off, [], {}):
            raise ConfigError(f"{path}: {key} = {generation[key]!r} cannot be mapped")
    _check_generation(generation, path)
    eos = generation.get("eos_token_id", cfg.eos_id)
    if eos not in (cfg.eos_id, [cfg.eos_id]):
        raise ConfigError(f"{path}: eos_token_id {eos!r} is not the model's ({cfg.eos_id})")
    forced = generation.get("forced_eos_token_id")
    if forced not in (None, cfg.eos_id, [cfg.eos_id]):
        raise ConfigError(f"{path}: forced_eos_token_id {forced!r} is not EOS ({cfg.eos_id})")
    early = generation.get("early_stopping", False)
    if early not in (True, False):
        raise ConfigError(f"{path}: early_stopping = {early!r} cannot be mapped")
    alpha = float(generation.get("length_penalty", 1.0))
    # max_length counts the start token; without it or max_new_tokens transformers (4.x and 5.x)
    # generates 20 new tokens. (4.x also reads an explicit max_length of 20 so; 5.x, 19.)
    new, length = generation.get("max_new_tokens"), generation.get("max_length")
    cap = int(new) if new is not None else int(length) - 1 if length is not None else 20
    min_new = generation.get("min_new_tokens")
    floor = int(min_new) if min_new is not None else int(generation.get("min_length", 0)) - 1
    cap = max(1, min(cap, cfg.max_len))
    if floor > cap:
        which = "min_new_tokens" if min_new is not None else "min_length"
        raise ConfigError(
            f"{path}: {which} asks for {floor} new tokens, more than the output cap of {cap} "
            "(max_length / max_new_tokens, at most the model's max_position_embeddings)"
        )
    settings: dict[str, Any] = {
        "beam": int(generation.get("num_beams", 1)),
        "alpha": alpha,
        "length_penalty": "power",
        "early_stopping": bool(early),
        "max_len_a": 0.0,
        "max_len_b": cap,
        "min_len": max(0, floor),
        "bad_ids": _bad_ids(generation.get("bad_words_ids"), path, cfg.tgt_vocab_size),
        "renormalize": bool(generation.get("renormalize_logits", False)),
        "forced_eos": forced is not None,
    }
    try:  # every rule of DecodeConfig, as each command that opens the folder applies it
        DecodeConfig(**{**settings, "bad_ids": tuple(settings["bad_ids"])})
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
    return settings


def read_generation(folder: Path, hf: dict[str, Any]) -> tuple[dict[str, Any], Path]:
    """generation_config.json, else the generation keys of config.json (what transformers
    falls back on), and the file they came from."""
    path = folder / "generation_config.json"
    if path.is_file():
        return _read_json(path), path
    return hf, folder / "config.json"


# ---- the import ----------------------------------------------------------------------------


def read_licence(folder: Path) -> str | None:
    """The ``license:`` of the folder's model card (README.md front matter), if it states one."""
    try:
        text = (folder / "README.md").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    front = text.split("---")[1] if text.startswith("---") and text.count("---") >= 2 else ""
    found = re.search(r"^licen[cs]e:\s*(\S.*?)\s*$", front, re.MULTILINE)
    return found[1].strip("'\"") if found else None


def _languages(folder: Path) -> tuple[str | None, str | None]:
    """Source and target language: tokenizer_config.json's, else an OPUS-MT folder name's."""
    config_path = folder / "tokenizer_config.json"
    config = _read_json(config_path) if config_path.is_file() else {}
    src, tgt = config.get("source_lang"), config.get("target_lang")
    named = re.fullmatch(r"opus-mt-([a-z]{2,3})-([a-z]{2,3})", folder.resolve().name)
    if (src is None or tgt is None) and named:
        src, tgt = named[1], named[2]
    return (src if isinstance(src, str) else None), (tgt if isinstance(tgt, str) else None)


def read_marian(folder: str | Path) -> tuple[Any, Any, dict[str, Any]]:
    """(model, tokenizer, decoding settings) of a Hugging Face Marian folder, checked whole."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"{folder}: no such folder")
    hf = _read_json(folder / "config.json")
    _check_architecture(hf, folder / "config.json")
    tokenizer = read_tokenizer(folder)
    _check_ids(tokenizer, hf, folder)
    cfg = model_config(hf, folder / "config.json", tokenizer.unk_id)
    generation, path = read_generation(folder, hf)
    settings = decode_settings(generation, cfg, path)
    state = to_aiayn(read_weights(folder), cfg, folder)
    model = Transformer(cfg)
    try:
        missing, _ = model.load_state_dict(state, strict=False)
    except RuntimeError as err:  # a tensor of another shape than config.json says
        first = str(err).strip().splitlines()[-1].strip()
        raise CheckpointError(f"{folder}: the weights do not fit config.json ({first})") from None
    tied = {"tgt_embed.token.weight", "generator.weight"}
    if set(missing) - tied:
        raise CheckpointError(f"{folder}: the weights have no {sorted(set(missing) - tied)[0]}")
    return model.eval(), tokenizer, settings


def import_marian(source: str | Path, out: str | Path, overwrite: bool = False) -> Path:
    """``aiayn import hf SOURCE -o OUT``: a Marian folder as an aiayn model folder (config.json
    with the decoding settings, model.safetensors, tokenizer.json, README.md). Nothing is
    written when the source cannot be mapped; OUT is written whole or not at all."""
    source, out = Path(source), Path(out)
    check_not_input(out, [source], "-o")
    check_output_folder(out, overwrite)  # before any work
    with progress_bar(2, "import", "stage") as bar:
        bar.set_postfix_str(f"reading {source}")
        model, tokenizer, settings = read_marian(source)
        bar.update()
        bar.set_postfix_str(f"writing {out}")
        _write_imported(source, out, overwrite, model, tokenizer, settings)
        bar.update()
    return out


def _write_imported(
    source: Path, out: Path, overwrite: bool, model: Any, tokenizer: Any, settings: dict
) -> None:
    """The model folder of an imported Marian model: weights, tokenizer, config, card."""
    src, tgt = _languages(source)
    imported = {
        "format": "huggingface-marian",
        "source": str(source.resolve()),
        "licence": read_licence(source) or "not stated in the source folder",
        "src_lang": src,
        "tgt_lang": tgt,
    }
    save_model_dir(
        out,
        model,
        model.cfg,
        kind=TRANSLATION,
        tokenizer_json=tokenizer.to_str(),
        extra={"decode": settings, "imported_from": imported},
        overwrite=overwrite,
    )
    write_model_card(out)
