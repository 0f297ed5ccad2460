"""Write a translation model as a Hugging Face Marian folder (``aiayn export --format hf``).

The output is what ``save_pretrained`` writes for a ``MarianMTModel``: ``config.json``,
``generation_config.json``, ``model.safetensors`` (transformers' names), ``tokenizer.json`` with
``tokenizer_config.json`` (a ``PreTrainedTokenizerFast``; an imported Marian model's
SentencePiece files as ``MarianTokenizer`` reads them) and a ``README.md`` card, so that
``AutoModelForSeq2SeqLM`` and ``AutoTokenizer`` load it and ``generate()`` gives aiayn's
translations (tests/test_hf_export.py; transformers < 5 also ``pipeline("translation")``). No
transformers is needed to write it.

``MarianMTModel`` is the paper's post-LN Transformer; how aiayn's options map:

- post-LN only: pre-LN (``norm_first``) has no Marian equivalent and is refused;
- the sinusoids: Marian lays them out as halves (sines, then cosines). An interleaved model is
  written with its hidden dimensions permuted (0, 2, 4, …, 1, 3, 5, …) in every weight that reads
  or writes the residual stream: the same function exactly, with Marian's positions;
- ``output_vocab = "targets"``: tokens outside ``output_mask`` get ``final_logits_bias`` -1e9;
- no biases (``bias = false``): zero biases; ``activation``: relu, gelu, silu ("swish");
- refused (one line): learned positions, separate embeddings, ``d_k`` other than
  d_model / n_heads, a LayerNorm epsilon other than 1e-5 (Marian's), a character or
  lower-casing tokenizer (no ``tokenizers`` file a transformers tokenizer can load as is);
- decoding settings become ``generation_config.json``: beam, the cap ``max_len_b`` when
  ``max_len_a`` is 0 (else the model's ``max_len``: transformers has no cap per source length)
  as ``max_length`` = cap + 1 (``max_new_tokens`` where that is 20), and the length penalty:
  ``average`` is 1, ``none`` 0, ``power`` α; GNMT's ((5 + |Y|) / 6)^α has no transformers
  equivalent and is written as |Y|^α (a warning says so).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from aiayn.data.spm import SentencePieceTokenizer
from aiayn.data.tokenizer import SubwordTokenizer
from aiayn.errors import ConfigError
from aiayn.export.exporter import MASKED_BIAS, Exporter, ExportOptions
from aiayn.folder.checkpoint import write_safetensors
from aiayn.interop.marian import marian_names
from aiayn.io import write_bytes, write_json, write_text
from aiayn.kinds import check_kind, get_kind

log = logging.getLogger(__name__)

# Recipes of configs/ that train a model --format hf can express (post-LN translation; tested).
POST_LN_RECIPES = ("configs/multi30k_tiny.toml", "configs/wmt14_en_de_base.toml")
PRE_LN = (
    "model.norm_first = true (pre-LN): MarianMTModel is post-LN. Export this model with "
    "--format onnx or --format ctranslate2 (both run pre-LN), or train a post-LN recipe for "
    f"--format hf ({', '.join(POST_LN_RECIPES)}, or model.norm_first = false)"
)
ACTIVATION_NAMES = {"relu": "relu", "gelu": "gelu", "silu": "swish"}


def check_exportable(model: Any, kind: str, tokenizer: Any) -> None:
    """ConfigError naming the first thing of ``model`` that a MarianMTModel cannot express."""
    check_kind("hf", kind)
    cfg = model.cfg
    checks = [
        (cfg.norm_first, PRE_LN),
        (cfg.positional != "sinusoidal", "model.positional = learned: Marian has sinusoids only"),
        (not cfg.share_embeddings, "model.share_embeddings = false: Marian shares one vocabulary"),
        (
            cfg.head_dim_k * cfg.n_heads != cfg.d_model or cfg.head_dim_v != cfg.head_dim_k,
            "model.d_k/d_v: Marian splits d_model into the heads",
        ),
        (cfg.layer_norm_eps != 1e-5, "model.layer_norm_eps: Marian's LayerNorms use 1e-5"),
        (
            not isinstance(tokenizer, SentencePieceTokenizer | SubwordTokenizer)
            or getattr(tokenizer, "recaser", None) is not None,
            f"a {tokenizer.kind} tokenizer"
            + (" with a recaser" if getattr(tokenizer, "recaser", None) else "")
            + ": --format hf needs a plain subword (bpe/unigram) or SentencePiece tokenizer",
        ),
    ]
    for failed, why in checks:
        if failed:
            raise ConfigError(f"--format hf cannot express {why}")


def hidden_order(cfg: Any) -> Tensor:
    """The order of the hidden dimensions in the export: identity for halves, (0, 2, …, 1, 3, …)
    for the paper's interleaved sinusoids (whose column 2i is halves' column i)."""
    d = cfg.d_model
    if cfg.sinusoid_layout == "halves":
        return torch.arange(d)
    return torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])


def marian_state(model: Any) -> dict[str, Tensor]:
    """``MarianMTModel``'s state dict of ``model``: every weight renamed, the residual stream's
    dimensions in :func:`hidden_order`."""
    cfg, order = model.cfg, hidden_order(model.cfg)
    ours = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    ours = {k: v.float() if v.is_floating_point() else v for k, v in ours.items()}
    state: dict[str, Tensor] = {}
    for name, theirs in marian_names(cfg.n_encoder_layers, cfg.n_decoder_layers).items():
        state[theirs] = _permuted(name, ours.get(name), order, cfg)
    shared = ours["src_embed.token.weight"][:, order]  # (V, D)
    state["model.shared.weight"] = shared.contiguous()
    bias = ours.get("generator.bias", torch.zeros(cfg.tgt_vocab_size))
    mask = ours.get("output_mask")
    if mask is not None:
        bias = torch.where(mask, bias, torch.full_like(bias, MASKED_BIAS))
    state["final_logits_bias"] = bias.reshape(1, -1).contiguous()
    return state


def _permuted(name: str, tensor: Tensor | None, order: Tensor, cfg: Any) -> Tensor:
    """One weight in the export's hidden order: the inputs of Q/K/V and of the FFN's first layer,
    the outputs of the attention's output projection and of the FFN's second layer, and the
    LayerNorms read or write the residual stream; the heads' and the FFN's inner dimensions do
    not. A missing bias (``bias = false``) is zeros."""
    if tensor is None:  # bias = false
        out_features = cfg.d_ff if "linear1" in name else cfg.d_model
        return torch.zeros(out_features)
    reads = any(p in name for p in ("q_proj", "k_proj", "v_proj", "linear1"))
    writes = any(p in name for p in ("out_proj", "linear2", "norm"))
    if name.endswith(".weight") and tensor.dim() == 2:
        if reads:
            tensor = tensor[:, order]
        if writes:
            tensor = tensor[order, :]
    elif writes:  # a bias or LayerNorm parameter over the residual stream
        tensor = tensor[order]
    return tensor.contiguous()


def marian_config(cfg: Any) -> dict[str, Any]:
    """``config.json`` of the MarianMTModel that :func:`marian_state` fills."""
    return {
        "architectures": ["MarianMTModel"],
        "model_type": "marian",
        "vocab_size": cfg.tgt_vocab_size,
        "decoder_vocab_size": cfg.tgt_vocab_size,
        "d_model": cfg.d_model,
        "encoder_layers": cfg.n_encoder_layers,
        "decoder_layers": cfg.n_decoder_layers,
        "encoder_attention_heads": cfg.n_heads,
        "decoder_attention_heads": cfg.n_heads,
        "encoder_ffn_dim": cfg.d_ff,
        "decoder_ffn_dim": cfg.d_ff,
        "activation_function": ACTIVATION_NAMES[cfg.activation],
        "dropout": cfg.dropout,
        "attention_dropout": cfg.attn_dropout,
        "activation_dropout": cfg.activation_dropout,
        "max_position_embeddings": cfg.max_len,
        "scale_embedding": cfg.scale_embeddings,
        "share_encoder_decoder_embeddings": True,
        "tie_word_embeddings": True,
        "static_position_embeddings": True,
        "normalize_before": False,
        "is_encoder_decoder": True,
        "pad_token_id": cfg.pad_id,
        "bos_token_id": cfg.bos_id,
        "eos_token_id": cfg.eos_id,
        "decoder_start_token_id": cfg.bos_id,
        "forced_eos_token_id": None,
    }


def generation_config(cfg: Any, decode: Any) -> dict[str, Any]:
    """``generation_config.json``: the folder's decoding settings, as far as transformers has
    them (see the module docstring)."""
    alpha = {"gnmt": decode.alpha, "average": 1.0, "none": 0.0, "power": decode.alpha}
    if decode.beam > 1 and decode.length_penalty == "gnmt":
        log.warning(
            "--format hf: transformers has no GNMT length penalty; generation_config.json ranks "
            "beams by log P / |Y|^%s instead",
            decode.alpha,
        )
    if decode.max_len_a != 0:
        log.warning(
            "--format hf: transformers has no output cap per source length (a·src_len + b); "
            "max_length is the model's max_len (%d)",
            cfg.max_len,
        )
    cap = min(decode.max_len_b if decode.max_len_a == 0 else cfg.max_len, cfg.max_len)
    # max_length counts the start token; transformers 4.x reads a max_length of 20, its own
    # default, as unset (20 new tokens), so that one cap is written as max_new_tokens
    length = {"max_length": cap + 1} if cap + 1 != 20 else {"max_new_tokens": cap}
    out: dict[str, Any] = {
        "decoder_start_token_id": cfg.bos_id,
        "bos_token_id": cfg.bos_id,
        "eos_token_id": cfg.eos_id,
        "pad_token_id": cfg.pad_id,
        "num_beams": decode.beam,
        "length_penalty": alpha[decode.length_penalty],
        "early_stopping": decode.early_stopping,
        **length,
    }
    if decode.min_len:
        out["min_length"] = decode.min_len + 1
    if decode.bad_ids:
        out["bad_words_ids"] = [[i] for i in decode.bad_ids]
    if decode.forced_eos:
        out["forced_eos_token_id"] = cfg.eos_id
    if decode.renormalize:
        out["renormalize_logits"] = True
    return out


def tokenizer_config(tokenizer: Any, cfg: Any) -> dict[str, Any]:
    """``tokenizer_config.json``: ``tokenizer.json`` as a PreTrainedTokenizerFast with the
    model's special tokens and Marian's inputs (a bare PreTrainedTokenizerFast of transformers
    4.x also returns ``token_type_ids``, which ``generate`` refuses)."""
    token = tokenizer.hf.id_to_token
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "pad_token": token(cfg.pad_id),
        "bos_token": token(cfg.bos_id),
        "eos_token": token(cfg.eos_id),
        "unk_token": token(cfg.unk_id),
        "model_max_length": cfg.max_len,
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "attention_mask"],
    }


def card(source: Path, cfg: Any) -> str:
    """README.md of the export: what it is and how to run it."""
    return (
        "---\nlibrary_name: transformers\npipeline_tag: translation\ntags: [marian, aiayn]\n"
        "---\n\n"
        f"# {source.name}\n\n"
        f"A Transformer translation model trained with aiayn, exported from `{source}` as a "
        f"MarianMTModel ({cfg.n_encoder_layers}+{cfg.n_decoder_layers} layers, d_model "
        f"{cfg.d_model}, post-LN). Its decoding settings are in `generation_config.json`.\n\n"
        "```python\nfrom transformers import AutoModelForSeq2SeqLM, AutoTokenizer\n\n"
        'tokenizer = AutoTokenizer.from_pretrained("PATH")\n'
        'model = AutoModelForSeq2SeqLM.from_pretrained("PATH")\n'
        'batch = tokenizer(["A dog runs."], return_tensors="pt", padding=True)\n'
        "print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))\n"
        "```\n"
    )


def write_marian_tokenizer(tokenizer: Any, cfg: Any, folder: Path) -> None:
    """An imported model's SentencePiece tokenizer as MarianTokenizer's files (source.spm,
    target.spm, vocab.json, tokenizer_config.json): the folder it came from, round trip."""
    write_bytes(folder / "source.spm", tokenizer.source_model)
    write_bytes(folder / "target.spm", tokenizer.target_model)
    write_json(folder / "vocab.json", tokenizer.vocab)
    specials = {f"{role}_token": piece for role, piece in tokenizer.specials.items()}
    config = {"tokenizer_class": "MarianTokenizer", "model_max_length": cfg.max_len}
    write_json(folder / "tokenizer_config.json", {**config, **specials, "separate_vocabs": False})


def write_folder(model: Any, tokenizer: Any, decode: Any, folder: Path, source: Path) -> None:
    """The whole Hugging Face folder into ``folder`` (a fresh one, :func:`aiayn.io.new_folder`)."""
    cfg = model.cfg
    write_safetensors(marian_state(model), folder / "model.safetensors", {"format": "pt"})
    write_json(folder / "config.json", marian_config(cfg))
    write_json(folder / "generation_config.json", generation_config(cfg, decode))
    if isinstance(tokenizer, SentencePieceTokenizer):  # an imported Marian model, back
        write_marian_tokenizer(tokenizer, cfg, folder)
    else:
        write_text(folder / "tokenizer.json", tokenizer.hf.to_str())
        write_json(folder / "tokenizer_config.json", tokenizer_config(tokenizer, cfg))
    write_text(folder / "README.md", card(source, cfg))
    log.debug("wrote %s", json.dumps(sorted(p.name for p in folder.iterdir())))


class HfExporter(Exporter):
    """`aiayn export --format hf`: a translation model as a Hugging Face ``MarianMTModel`` folder.
    Its files are transformers' own (config.json, generation_config.json, the tokenizer's), not an
    aiayn folder's record: aiayn runs it again only through ``aiayn import hf``."""

    name = "hf"
    dependency = ("safetensors", "hf")  # a core dependency: writing needs nothing optional

    def check(self, model: Any, kind: str, tokenizer: Any) -> None:
        check_exportable(model, kind, tokenizer)

    def write_output(
        self, loaded: Any, meta: Any, source: Path, tmp: Path, out: Path, options: ExportOptions
    ) -> None:
        write = get_kind(loaded.kind).exporter(self.name)  # write_folder
        write(loaded.torch_module(), loaded.tokenizer, meta.config.decode, tmp, source)
