"""The exported graphs: thin modules over a trained model's own submodules, with the decoder's
cache as explicit inputs and outputs (what ``torch.onnx.export`` traces).

Shape legend: B sentences · N decoder rows (B, or B·k with a beam of k) · S source len · T new
tokens · t tokens decoded before them · D d_model · H heads · K head dim · V vocab · C classes.

Every projection, LayerNorm, feed-forward network, embedding table and output projection is the
model's own module; only the glue is written here, because a traced graph keeps one branch of
every Python ``if`` on a tensor value. The glue differs from the model's forward in three ways,
none of which changes the result (tested to 1e-4 against the PyTorch model):

- attention always takes the explicit path of Eq. 1 and always zeroes fully masked query rows
  (the model picks the fused kernel by key length and skips the zeroing when no row is fully
  masked: data-dependent choices a trace would freeze);
- positions are looked up as ``table[past + arange(T)]`` with the offset read from the shape of
  the cached keys, so one graph serves every step (the model slices its table with a Python int);
- a step always applies the causal mask (a single new token may attend everything; the model
  leaves the mask out then).

The decoder cache of :class:`~aiayn.model.cache.DecoderCache` maps onto the step graph as:
``past_k.i``/``past_v.i`` (N, H, t, K) in, ``present_k.i``/``present_v.i`` (N, H, t+T, K) out
(self-attention keys/values of layer i, old positions then the new ones), and
``cross_k.i``/``cross_v.i`` (B, H, S, K) in (encoder-output keys/values of layer i, computed
once by the encoder graph). With a beam of k, N = B·k: the k rows of a sentence share its one
memory row, as in :func:`aiayn.model.layers.attend_shared_memory`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from aiayn.model.classifier import bigram_ids
from aiayn.model.embeddings import SinusoidalPositionalEncoding


def attend(attn: Any, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """The model's own attention (``MultiHeadAttention.attend``) on its explicit path: softmax(Q Kᵀ
    / √d_k) V, then W^O (§3.2.1-3.2.2), with no branch on the device or the key length (the
    weights asked for choose that path; the graph leaves them unused).

    Shape: q (B, H, Tq, K), k (B, H, Tk, K), v (B, H, Tk, Kv), mask bool broadcastable to
    (B, H, Tq, Tk), True = may attend -> (B, Tq, D).
    """
    return attn.attend(q, k, v, mask, need_weights=True)[0]


def attend_shared(attn: Any, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """Cross-attention where the N / B consecutive decoder rows of a sentence share its memory.

    Shape: q (N, H, T, K), k/v (B, H, S, K), mask (B, 1, 1, S) -> (N, T, D).
    """
    N, H, T, K = q.shape
    q = q.reshape(k.size(0), -1, H, T, K).transpose(1, 2).reshape(k.size(0), H, -1, K)
    return attend(attn, q, k, v, mask).reshape(N, T, -1)  # (B, g·T, D) -> (N, T, D)


def embed(emb: Any, ids: Tensor, offset: Any = 0, delta: Tensor | None = None) -> Tensor:
    """:class:`~aiayn.model.embeddings.Embeddings` (eval mode) with a traced position offset.

    Shape: ids (B, T) -> (B, T, D); positions offset … offset+T-1.
    """
    positional = emb.positional
    table: Any = (
        positional.table
        if isinstance(positional, SinusoidalPositionalEncoding)
        else positional.weight
    )
    x = emb.token(ids) * emb.scale  # (B, T, D)
    if delta is not None:
        x = x + delta
    positions = torch.arange(ids.size(1), device=ids.device) + offset  # (T,)
    return x + table[positions].to(x.dtype)


def causal(length: Any, offset: Any, device: torch.device) -> Tensor:
    """Query i (position offset + i) may attend keys 0 … offset + i. -> (1, 1, T, offset + T)."""
    q = torch.arange(length, device=device) + offset
    k = torch.arange(offset + length, device=device)
    return (k[None, :] <= q[:, None])[None, None]


def encode(encoder: Any, x: Tensor, mask: Tensor) -> Tensor:
    """The encoder stack of §3.1 over embedded x (B, S, D), mask (B, 1, 1, S) -> (B, S, D)."""
    for layer in encoder.layers:
        x = _encoder_layer(layer, x, mask)
    return encoder.norm(x) if encoder.norm is not None else x


def _encoder_layer(layer: Any, x: Tensor, mask: Tensor) -> Tensor:
    attn = layer.self_attn

    def self_attention(h: Tensor) -> Tensor:
        q, k, v = attn.project_qkv(h)
        return attend(attn, q, k, v, mask)

    x = layer.attn_block(x, self_attention)
    return layer.ff_block(x, layer.feed_forward)


def decode_step(
    decoder: Any,
    x: Tensor,
    self_mask: Tensor,
    past: list[Tensor],
    cross: list[Tensor] | None = None,
    memory_mask: Tensor | None = None,
) -> tuple[Tensor, list[Tensor]]:
    """The decoder stack over the new positions x (N, T, D) with explicit caches.

    ``past`` = [k0, v0, k1, v1, …] (N, H, t, K); ``cross`` likewise (B, H, S, K) or None for a
    decoder-only model. Returns the hidden states (N, T, D) and the present keys/values
    [k0, v0, …] (N, H, t+T, K).
    """
    present: list[Tensor] = []
    for i, layer in enumerate(decoder.layers):
        kv = None if cross is None else (cross[2 * i], cross[2 * i + 1])
        x = _decoder_layer(
            layer, x, self_mask, past[2 * i], past[2 * i + 1], kv, memory_mask, present
        )
    return (decoder.norm(x) if decoder.norm is not None else x), present


def _decoder_layer(
    layer: Any,
    x: Tensor,
    self_mask: Tensor,
    past_k: Tensor,
    past_v: Tensor,
    cross: Any,
    memory_mask: Any,
    present: list[Tensor],
) -> Tensor:
    def self_attention(h: Tensor) -> Tensor:
        q, k, v = layer.self_attn.project_qkv(h)
        k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)  # (N, H, t+T, K)
        present.extend((k, v))
        return attend(layer.self_attn, q, k, v, self_mask)

    def cross_attention(h: Tensor) -> Tensor:
        q = layer.cross_attn.project_q(h)
        return attend_shared(layer.cross_attn, q, cross[0], cross[1], memory_mask)

    x = layer.self_block(x, self_attention)
    if cross is not None:
        x = layer.cross_block(x, cross_attention)
    return layer.ff_block(x, layer.feed_forward)


def _project(model: Any, h: Tensor) -> Tensor:
    """The output projection (§3.4), tokens outside ``output_mask`` at -inf. (N, T, D) -> (N, T, V)."""
    logits = model.generator(h)
    mask = getattr(model, "output_mask", None)
    return logits if mask is None else logits.masked_fill(~mask, float("-inf"))


class EncoderGraph(nn.Module):
    """Translation encoder: src (B, S) -> memory (B, S, D), then cross_k.i, cross_v.i (B, H, S, K)
    for every decoder layer i (projected once per sentence, as the model's cache does)."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, src: Tensor) -> tuple[Tensor, ...]:
        m = self.model
        mask = (src != m.cfg.pad_id)[:, None, None, :]  # (B, 1, 1, S)
        memory = encode(m.encoder, embed(m.src_embed, src), mask)  # (B, S, D)
        cross: list[Tensor] = []
        for layer in m.decoder.layers:
            cross.extend(layer.cross_attn.project_kv(memory, memory))  # (B, H, S, K) each
        return (memory, *cross)


class DecoderStepGraph(nn.Module):
    """One translation decoder step: (tokens (N, T), src_mask (B, S), cross_k.0, cross_v.0, …,
    past_k.0, past_v.0, …) -> (logits (N, T, V), present_k.0, present_v.0, …)."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model
        self.n_layers = len(model.decoder.layers)

    def forward(self, tokens: Tensor, src_mask: Tensor, *state: Tensor) -> tuple[Tensor, ...]:
        m, n = self.model, 2 * self.n_layers
        cross, past = list(state[:n]), list(state[n:])
        offset = past[0].size(2)
        x = embed(m.tgt_embed, tokens, offset)  # (N, T, D)
        self_mask = causal(tokens.size(1), offset, tokens.device)
        h, present = decode_step(m.decoder, x, self_mask, past, cross, src_mask[:, None, None, :])
        return (_project(m, h), *present)


class LMStepGraph(nn.Module):
    """One decoder-only step: (tokens (N, T), past_k.0, past_v.0, …) -> (logits (N, T, V),
    present_k.0, present_v.0, …)."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: Tensor, *past: Tensor) -> tuple[Tensor, ...]:
        m = self.model
        offset = past[0].size(2)
        x = embed(m.embed, tokens, offset)
        h, present = decode_step(
            m.decoder, x, causal(tokens.size(1), offset, tokens.device), list(past)
        )
        return (_project(m, h), *present)


class ImageClassifierGraph(nn.Module):
    """Vision Transformer: pixels (B, C, H, W) in [0, 1] -> logits (B, K), the model's own
    pooling (class token or mean); no padding, so every patch may attend to every other."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixels: Tensor) -> Tensor:
        m = self.model
        x = m.embed(pixels)  # (B, S, D)
        everywhere = torch.ones(1, 1, 1, x.size(1), dtype=torch.bool, device=x.device)
        h = encode(m.encoder, x, everywhere)  # (B, S, D); no padding, every key visible
        pooled = h[:, 0] if m.cfg.pooling == "cls" else h.mean(dim=1)  # (B, D)
        return m.head(pooled)


class ClassifierGraph(nn.Module):
    """Classifier: ids (B, S) -> logits (B, C), the model's own pooling (mean, max or CLS)."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: Tensor) -> Tensor:
        m, cfg = self.model, self.model.cfg
        keep = ids != cfg.pad_id  # (B, S)
        delta = None
        if m.bigrams is not None:
            delta = m.bigrams(bigram_ids(ids, cfg.bos_id, cfg.bigram_buckets)) * m.embed.scale
        x = embed(m.embed, ids, 0, delta)  # (B, S, D)
        if m.cls is not None:
            x = torch.cat([m.cls.to(x.dtype).expand(x.size(0), 1, -1), x], dim=1)  # (B, 1+S, D)
            keep = torch.cat([keep.new_ones(keep.size(0), 1), keep], dim=1)
        h = encode(m.encoder, x, keep[:, None, None, :])
        logits = m.head(m.pool(h, keep))
        return logits if m.nb is None else logits + m.nb(ids)
