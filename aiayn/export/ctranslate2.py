"""Write a model as a CTranslate2 model (``aiayn export --format ctranslate2``).

Built with CTranslate2's Python model-spec API (no C++): a ``TransformerSpec`` for a translation
model, a ``TransformerDecoderModelSpec`` for a language model, every weight set from the PyTorch
module that holds it, then ``validate()``, ``optimize(quantization)`` and ``save()``. The
CTranslate2 files go to the sub-folder ``ctranslate2/`` of the export (CTranslate2 writes a
``config.json`` of its own).

How aiayn's options map:

- post-LN / pre-LN: ``pre_norm``; the per-sub-layer LayerNorms are CTranslate2's
  ``self_attention.layer_norm``, ``attention.layer_norm``, ``ffn.layer_norm``, and pre-LN's final
  norms ``encoder.layer_norm`` / ``decoder.layer_norm``; ``layer_norm_eps`` is the model's
  ``layer_norm_epsilon``;
- activation: ReLU, GELU, SiLU (CTranslate2's SWISH); ``final_logits_bias`` is the output
  projection's bias;
- positions: aiayn's own table (sinusoids in either layout, or the learned weights) is written as
  ``position_encodings`` (CTranslate2 would otherwise generate its own, laid out differently);
  ``scale_embeddings`` as is;
- self-attention Q, K, V become one fused projection, cross-attention K, V another;
- shared, tied or separate embeddings: each weight is written where CTranslate2 reads it;
- ``output_vocab = "targets"``: CTranslate2's output projection has an optional bias; tokens
  outside ``output_mask`` get a bias of -1e9, so that their probability is 0 exactly as with
  aiayn's -inf logits;
- not expressible (a ConfigError says which): a classifier (CTranslate2 has no mean/max/CLS
  pooling head), a masked LM, ``d_v != d_k`` or ``n_heads · d_k != d_model``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from aiayn.errors import ConfigError, require
from aiayn.export.exporter import MASKED_BIAS, QUANTIZATIONS, ExportOptions, FolderExporter
from aiayn.kinds import check_kind, get_kind
from aiayn.model.embeddings import SinusoidalPositionalEncoding
from aiayn.runtime.ct2_backend import token_strings

MODEL_DIR = "ctranslate2"  # the CTranslate2 model inside the exported folder


def check_exportable(model: Any, kind: str) -> None:
    """ConfigError naming the first option of ``model`` that CTranslate2 cannot express."""
    check_kind(
        "ctranslate2", kind, "its pooling head has no CTranslate2 equivalent: use --format onnx"
    )
    cfg = model.cfg
    if cfg.head_dim_v != cfg.head_dim_k:
        raise ConfigError(
            f"model.d_v={cfg.head_dim_v} differs from d_k={cfg.head_dim_k}: CTranslate2 attention "
            "has one head size for keys and values; use --format onnx"
        )
    if cfg.n_heads * cfg.head_dim_k != cfg.d_model:
        raise ConfigError(
            f"model.d_k={cfg.head_dim_k} × n_heads={cfg.n_heads} != d_model={cfg.d_model}: "
            "CTranslate2 splits d_model into the heads; use --format onnx"
        )


def _np(t: Tensor) -> np.ndarray:
    return t.detach().cpu().float().numpy().copy()


def _linear(spec: Any, *layers: Any) -> None:
    """One CTranslate2 linear layer from one or several (stacked: fused Q/K/V) torch layers."""
    spec.weight = _np(torch.cat([layer.weight for layer in layers]))
    if layers[0].bias is not None:
        spec.bias = _np(torch.cat([layer.bias for layer in layers]))


def _norm(spec: Any, norm: Any) -> None:
    spec.gamma, spec.beta = _np(norm.weight), _np(norm.bias)


def _attention(spec: Any, attn: Any, norm: Any, self_attention: bool) -> None:
    if self_attention:
        _linear(spec.linear[0], attn.q_proj, attn.k_proj, attn.v_proj)
    else:
        _linear(spec.linear[0], attn.q_proj)
        _linear(spec.linear[1], attn.k_proj, attn.v_proj)
    _linear(spec.linear[-1], attn.out_proj)
    _norm(spec.layer_norm, norm)


def _ffn(spec: Any, layer: Any) -> None:
    _linear(spec.linear_0, layer.feed_forward.linear1)
    _linear(spec.linear_1, layer.feed_forward.linear2)
    _norm(spec.layer_norm, layer.ff_block.norm)


def _embeddings(spec: Any, emb: Any, embeddings_spec: Any) -> None:
    embeddings_spec.weight = _np(emb.token.weight)
    spec.scale_embeddings = emb.scale != 1.0
    pos = emb.positional
    table: Any = pos.table if isinstance(pos, SinusoidalPositionalEncoding) else pos.weight
    spec.position_encodings.encodings = _np(table)


def _decoder(spec: Any, model: Any, embed: Any, cross: bool) -> None:
    _embeddings(spec, embed, spec.embeddings)
    for layer_spec, layer in zip(spec.layer, model.decoder.layers):
        _attention(layer_spec.self_attention, layer.self_attn, layer.self_block.norm, True)
        if cross:
            _attention(layer_spec.attention, layer.cross_attn, layer.cross_block.norm, False)
        _ffn(layer_spec.ffn, layer)
    if model.decoder.norm is not None:
        _norm(spec.layer_norm, model.decoder.norm)
    _linear(spec.projection, model.generator)
    mask = getattr(model, "output_mask", None)
    if mask is not None:  # output_vocab = "targets": the kept tokens only, as a bias
        bias = _np(model.generator.bias) if model.generator.bias is not None else 0.0
        kept = _np(mask.float()) > 0
        spec.projection.bias = np.where(kept, bias, MASKED_BIAS).astype(np.float32)


def _activation(cfg: Any) -> Any:
    from ctranslate2.specs import common_spec

    return {
        "relu": common_spec.Activation.RELU,
        "gelu": common_spec.Activation.GELU,
        "silu": common_spec.Activation.SWISH,
    }[cfg.activation]


def _special_tokens(config: Any, cfg: Any, tokens: list[str]) -> None:
    """The model's own special tokens (a Marian model's decoder starts from ``<pad>``)."""
    config.unk_token, config.eos_token = tokens[cfg.unk_id], tokens[cfg.eos_id]
    config.bos_token = config.decoder_start_token = tokens[cfg.bos_id]


def translation_spec(model: Any, tokens: list[str]) -> Any:
    """The ``TransformerSpec`` of a :class:`~aiayn.model.Transformer` with its weights."""
    specs = require("ctranslate2", "ctranslate2", "--format ctranslate2").specs
    cfg = model.cfg
    spec = specs.TransformerSpec.from_config(
        (cfg.n_encoder_layers, cfg.n_decoder_layers),
        cfg.n_heads,
        pre_norm=cfg.norm_first,
        activation=_activation(cfg),
    )
    spec.config.layer_norm_epsilon = cfg.layer_norm_eps
    _special_tokens(spec.config, cfg, tokens)
    encoder = spec.encoder
    _embeddings(encoder, model.src_embed, encoder.embeddings[0])
    for layer_spec, layer in zip(encoder.layer, model.encoder.layers):
        _attention(layer_spec.self_attention, layer.self_attn, layer.attn_block.norm, True)
        _ffn(layer_spec.ffn, layer)
    if model.encoder.norm is not None:
        _norm(encoder.layer_norm, model.encoder.norm)
    _decoder(spec.decoder, model, model.tgt_embed, cross=True)
    spec.register_source_vocabulary(tokens[: cfg.src_vocab_size])
    spec.register_target_vocabulary(tokens[: cfg.tgt_vocab_size])
    return spec


def lm_spec(model: Any, tokens: list[str]) -> Any:
    """The ``TransformerDecoderModelSpec`` of a :class:`~aiayn.model.TransformerLM`."""
    specs = require("ctranslate2", "ctranslate2", "--format ctranslate2").specs
    cfg = model.cfg
    spec = specs.TransformerDecoderModelSpec.from_config(
        cfg.n_decoder_layers, cfg.n_heads, pre_norm=cfg.norm_first, activation=_activation(cfg)
    )
    spec.config.layer_norm_epsilon = cfg.layer_norm_eps
    _decoder(spec.decoder, model, model.embed, cross=False)
    spec.register_vocabulary(tokens[: cfg.tgt_vocab_size])
    return spec


class Ct2Exporter(FolderExporter):
    """``aiayn export --format ctranslate2``: a translation model or a language model as a
    CTranslate2 model, its weights in ``--quantization``'s type."""

    name = "ctranslate2"
    dependency = ("ctranslate2", "ctranslate2")

    def check_options(self, options: ExportOptions) -> None:
        q = options.quantization
        if q is not None and q not in QUANTIZATIONS:
            raise ConfigError(
                f"--quantization must be one of {', '.join(QUANTIZATIONS)}, got '{q}'"
            )

    def check(self, model: Any, kind: str, tokenizer: Any) -> None:
        check_exportable(model, kind)

    def write(
        self, model: Any, kind: str, tokenizer: Any, folder: Path, options: ExportOptions
    ) -> dict:
        """The CTranslate2 model into ``folder/ctranslate2``; returns config.json entries."""
        import ctranslate2

        quantization = options.quantization or "float32"
        cfg = model.cfg
        tokens = token_strings(tokenizer, max(cfg.src_vocab_size, cfg.tgt_vocab_size))
        spec = get_kind(kind).exporter(self.name)(model, tokens)  # translation_spec, lm_spec
        spec.validate()
        spec.optimize(quantization=quantization)
        (folder / MODEL_DIR).mkdir()
        spec.save(str(folder / MODEL_DIR))
        return {
            "files": {"model": MODEL_DIR},
            "quantization": quantization,
            "ctranslate2_version": ctranslate2.__version__,
        }
