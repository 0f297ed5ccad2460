"""The encoder–decoder Transformer (Vaswani et al. 2017, §3, Figure 1).

Shape legend: B batch · S source len · T target len · D d_model · V vocab · H heads.

``Encoder`` and ``Decoder`` are stacks of N layers over already-embedded inputs (what
``torch.nn.TransformerEncoder/Decoder`` compute, against which they are tested). ``Transformer``
adds the embeddings, positional encodings, masks from ``pad_id`` and the output projection, with
``encode`` and a step-wise ``decode`` that takes an explicit :class:`DecoderCache`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.model.cache import DecoderCache
from aiayn.model.embeddings import (
    Embeddings,
    LearnedPositionalEncoding,
    SinusoidalPositionalEncoding,
    token_embedding,
)
from aiayn.model.layers import DecoderLayer, EncoderLayer
from aiayn.model.masks import as_attention_mask, causal_mask, padding_mask, target_mask


class Encoder(nn.Module):
    """N identical encoder layers (§3.1). Pre-LN adds a final LayerNorm; post-LN needs none."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_encoder_layers))
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.norm_first else None

    def forward(
        self, x: Tensor, mask: Tensor | None = None, attn_record: list | None = None
    ) -> Tensor:
        """Shape: x (B, S, D), mask broadcastable to (B, H, S, S) -> (B, S, D)."""
        for layer in self.layers:
            x = layer(x, mask, attn_record)
        return self.norm(x) if self.norm is not None else x


class Decoder(nn.Module):
    """N identical decoder layers (§3.1); cross-attention off for a decoder-only model."""

    def __init__(self, cfg: ModelConfig, cross_attention: bool = True) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, cross_attention) for _ in range(cfg.n_decoder_layers)
        )
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.norm_first else None

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None,
        tgt_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        cache: DecoderCache | None = None,
        attn_record: list | None = None,
    ) -> Tensor:
        """Shape: x (B, T, D), memory (B, S, D) -> (B, T, D). See :class:`DecoderLayer`."""
        for i, layer in enumerate(self.layers):
            layer_cache = cache.layers[i] if cache is not None else None
            x = layer(x, memory, tgt_mask, memory_mask, layer_cache, attn_record)
        return self.norm(x) if self.norm is not None else x


def positional_encoding(cfg: ModelConfig) -> nn.Module:
    if cfg.positional == "learned":
        return LearnedPositionalEncoding(cfg.d_model, cfg.max_len)
    return SinusoidalPositionalEncoding(cfg.d_model, cfg.max_len, cfg.sinusoid_layout)


def init_weights(module: nn.Module) -> None:
    """Xavier-uniform weights and zero biases for every linear layer (as nn.Transformer and the
    Annotated Transformer do); embeddings keep their N(0, d^-0.5) initialisation."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


class Transformer(nn.Module):
    """The encoder–decoder model of Figure 1, with embeddings shared as in §3.4.

    ``forward(src, tgt)`` gives next-token logits for teacher forcing; ``encode`` and ``decode``
    (with an optional :class:`DecoderCache`) serve search. Masks are derived from ``cfg.pad_id``
    and causality unless given explicitly.
    """

    output_mask: Tensor | None  # a buffer (see __init__)

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.n_encoder_layers == 0:
            raise ValueError("Transformer needs n_encoder_layers > 0 (an encoder–decoder model)")
        self.cfg = cfg
        src_token = token_embedding(cfg.src_vocab_size, cfg.d_model, cfg.pad_id)
        tgt_token = (
            src_token
            if cfg.share_embeddings
            else token_embedding(cfg.tgt_vocab_size, cfg.d_model, cfg.pad_id)
        )
        self.src_embed = Embeddings(
            src_token, positional_encoding(cfg), cfg.dropout, cfg.scale_embeddings
        )
        tgt_pos = (
            self.src_embed.positional
            if cfg.positional == "sinusoidal"
            else positional_encoding(cfg)
        )
        self.tgt_embed = Embeddings(tgt_token, tgt_pos, cfg.dropout, cfg.scale_embeddings)
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        # The pre-softmax linear transformation (§3.4); "Generator" in the Annotated Transformer.
        # cfg.final_logits_bias: not the paper's; Marian's per-token bias (imported models).
        self.generator = nn.Linear(cfg.d_model, cfg.tgt_vocab_size, bias=cfg.final_logits_bias)
        init_weights(self)
        if cfg.share_embeddings or cfg.tie_output:
            self.generator.weight = tgt_token.weight
        # cfg.output_vocab = "targets": the tokens the softmax ranges over, (V,) bool. All True
        # until the trainer marks those of the training targets; saved and loaded with the weights.
        self.register_buffer(
            "output_mask",
            torch.ones(cfg.tgt_vocab_size, dtype=torch.bool)
            if cfg.output_vocab == "targets"
            else None,
        )

    # ---- masks -------------------------------------------------------------------------------
    def src_mask(self, src: Tensor) -> Tensor:
        """(B, S) -> (B, 1, 1, S), True at real source tokens."""
        return padding_mask(src, self.cfg.pad_id)

    def tgt_mask(self, tgt: Tensor) -> Tensor:
        """(B, T) -> (B, 1, T, T): causal, padded keys masked. Where the decoder starts from the
        pad id (Marian: bos_id == pad_id) only causal: right padding is never a real query's key."""
        if self.cfg.bos_id == self.cfg.pad_id:
            return causal_mask(tgt.size(1), tgt.device)
        return target_mask(tgt, self.cfg.pad_id)

    # ---- the three entry points --------------------------------------------------------------
    def encode(
        self, src: Tensor, src_mask: Tensor | None = None, attn_record: list | None = None
    ) -> Tensor:
        """Shape: src (B, S) LongTensor -> memory (B, S, D)."""
        mask = self.src_mask(src) if src_mask is None else as_attention_mask(src_mask)
        return self.encoder(self.src_embed(src), mask, attn_record)

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor | None,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        cache: DecoderCache | None = None,
        attn_record: list | None = None,
        features_only: bool = False,
    ) -> Tensor:
        """Next-token logits for every target position.

        Shape: tgt (B, T), memory (B, S, D), src_mask (B, S) or (B, 1, 1, S) -> logits (B, T, V),
        or with ``features_only`` the decoder's last hidden states (B, T, D) before the
        generator (the trainer's loss projects them itself, chunk by chunk). Tokens outside
        ``output_mask`` (``cfg.output_vocab = "targets"``) get logit -inf.

        With ``cache`` (from :meth:`init_cache`), ``tgt`` holds only the tokens after the
        ``cache.length`` already decoded; the cache is extended in place. ``memory`` may then be
        None once the cache holds the cross-attention keys/values (:meth:`project_memory`). The
        output projection is the cache's ``output`` when the decoding gave it one.
        """
        if cache is not None:
            memory_mask = cache.memory_mask
            self_mask = (
                tgt_mask if tgt_mask is not None else cache.self_mask(tgt.size(1), tgt.device)
            )
            positions = cache.positions()  # int, or (B,) for rows that joined later
        else:
            memory_mask = as_attention_mask(src_mask) if src_mask is not None else None
            self_mask = self.tgt_mask(tgt) if tgt_mask is None else as_attention_mask(tgt_mask)
            positions = 0
        x = self.tgt_embed(tgt, positions)  # (B, T, D)
        h = self.decoder(x, memory, self_mask, memory_mask, cache, attn_record)
        if cache is not None:
            cache.length += tgt.size(1)
        if features_only:
            return h  # (B, T, D)
        return self.logits(h, cache.output if cache is not None else None)  # (B, T, V)

    def logits(self, h: Tensor, output: Callable[[Tensor], Tensor] | None = None) -> Tensor:
        """The pre-softmax linear transformation (§3.4), or ``output`` when given (the same
        layer as a decoding computes it: aiayn/decode/packed.py); tokens outside
        ``output_mask`` at -inf. Shape: h (B, T, D) -> (B, T, V)."""
        logits = self.generator(h) if output is None else output(h)
        if self.output_mask is not None:
            logits = logits.masked_fill(~self.output_mask, float("-inf"))
        return logits

    def log_probs(self, tgt: Tensor, memory: Tensor | None, cache: DecoderCache) -> Tensor:
        """Normalised next-token log-probabilities, incremental: what search asks a model for.

        Shape: tgt (N, T) tokens after the ``cache.length`` already decoded, memory (N, S, D) ->
        (N, T, V) float32.
        """
        return torch.log_softmax(self.decode(tgt, memory, cache=cache).float(), dim=-1)

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        features_only: bool = False,
    ) -> Tensor:
        """Teacher-forced logits. Shape: src (B, S), tgt (B, T) -> (B, T, V), or (B, T, D) hidden
        states with ``features_only``.

        ``tgt`` is the decoder input (BOS + target[:-1]); padded with ``cfg.pad_id``.
        """
        src_mask = self.src_mask(src) if src_mask is None else as_attention_mask(src_mask)
        memory = self.encode(src, src_mask)
        return self.decode(tgt, memory, src_mask, tgt_mask, features_only=features_only)

    def init_cache(
        self, memory: Tensor, src: Tensor | None = None, src_mask: Tensor | None = None
    ) -> DecoderCache:
        """An empty cache for incremental decoding of ``memory`` (B, S, D)."""
        if src_mask is None and src is not None:
            src_mask = self.src_mask(src)
        return DecoderCache.empty(len(self.decoder.layers), as_attention_mask(src_mask))

    def project_memory(self, cache: DecoderCache, memory: Tensor) -> DecoderCache:
        """Project ``memory`` (B, S, D) into the cache's cross-attention keys/values now, as the
        first step would (rows that join a running decoding bring theirs: DecoderCache.extend);
        returns the cache."""
        for layer, layer_cache in zip(self.decoder.layers, cache.layers):
            layer_cache.cross_k, layer_cache.cross_v = cast(DecoderLayer, layer).memory_kv(memory)
        return cache
