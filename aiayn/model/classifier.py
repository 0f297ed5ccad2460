"""Encoder-only Transformer for sequence classification (the IMDB shape).

Shape legend: B batch · S sequence len · D d_model · C classes.

The encoder stack of §3.1 over embedded tokens, pooled into one vector per sequence (mean over
real tokens, max over real tokens as in the Keras IMDB tutorial, or a learned CLS token
prepended), then dropout and a linear layer to class logits. In training, ``token_dropout``
drops whole tokens (they become padding for that step), and ``forward(…, delta=…)`` takes a
perturbation of the token embeddings (adversarial training, :mod:`aiayn.train.classification`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.model.dropout import Dropout
from aiayn.model.embeddings import Embeddings, token_embedding
from aiayn.model.ngrams import NBSVM
from aiayn.model.transformer import Encoder, init_weights, positional_encoding


def bigram_ids(ids: Tensor, boundary: int, buckets: int) -> Tensor:
    """The hashed bigram (previous token, token) at each position; the first token's previous
    token is ``boundary``. Shape: (B, S) -> (B, S), values in [0, buckets)."""
    prev = torch.cat([torch.full_like(ids[:, :1], boundary), ids[:, :-1]], dim=1)
    return (prev * 1_000_003 + ids) % buckets


class TransformerClassifier(nn.Module):
    """Embeddings → Encoder → pooling → dropout → Linear(D, C). Uses ``src_vocab_size``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.n_encoder_layers == 0:
            raise ValueError("TransformerClassifier needs n_encoder_layers > 0")
        self.cfg = cfg
        self.embed = Embeddings(
            token_embedding(cfg.src_vocab_size, cfg.d_model, cfg.pad_id),
            positional_encoding(cfg),
            cfg.dropout,
            cfg.scale_embeddings,
        )
        self.cls = (
            nn.Parameter(torch.randn(cfg.d_model) * cfg.d_model**-0.5)
            if cfg.pooling == "cls"
            else None
        )
        # fastText's hashed bigrams (cfg.bigram_buckets; not in the paper), starting at zero:
        # at initialisation the model is the plain one.
        self.bigrams = nn.Embedding(cfg.bigram_buckets, cfg.d_model) if cfg.bigram_buckets else None
        if self.bigrams is not None:
            nn.init.zeros_(self.bigrams.weight)
        self.encoder = Encoder(cfg)
        self.dropout = Dropout(cfg.dropout)
        self.head = nn.Linear(cfg.d_model, cfg.n_classes)
        init_weights(self)
        # NBSVM over the text's word n-grams (cfg.nb_ngrams; not in the paper), fused into the
        # logits outside training: the task fits it on the training split
        self.nb: NBSVM | None = (
            NBSVM(
                cfg.nb_ngrams,
                cfg.nb_buckets,
                cfg.n_classes,
                cfg.pad_id,
                cfg.nb_scale,
                cfg.src_vocab_size,
            )
            if cfg.nb_ngrams
            else None
        )

    def forward(
        self, ids: Tensor, attn_record: list | None = None, delta: Tensor | None = None
    ) -> Tensor:
        """Shape: ids (B, S) padded with ``cfg.pad_id`` -> logits (B, C). ``delta`` (B, S, D) is
        added to the scaled token embeddings (the perturbation of adversarial training). Outside
        training, with ``cfg.nb_ngrams``, NBSVM's scores join the logits (shallow fusion)."""
        keep = ids != self.cfg.pad_id  # (B, S)
        if self.training and self.cfg.token_dropout > 0.0:
            kept = keep & (torch.rand(keep.shape, device=ids.device) >= self.cfg.token_dropout)
            keep = torch.where(kept.any(1, keepdim=True), kept, keep)  # never an empty text
        if self.bigrams is not None:  # at padding too: padding is never attended to or pooled
            b = self.bigrams(bigram_ids(ids, self.cfg.bos_id, self.cfg.bigram_buckets))
            b = b * self.embed.scale  # (B, S, D), scaled as the token embedding is
            delta = b if delta is None else delta + b
        x = self.embed(ids, delta=delta)  # (B, S, D)
        if self.cls is not None:
            x = torch.cat([self.cls.to(x.dtype).expand(x.size(0), 1, -1), x], dim=1)  # (B, 1+S, D)
            keep = torch.cat([keep.new_ones(keep.size(0), 1), keep], dim=1)
        h = self.encoder(x, keep[:, None, None, :], attn_record)  # (B, S', D)
        logits = self.head(self.dropout(self.pool(h, keep)))
        return logits if self.nb is None or self.training else logits + self.nb(ids)

    def pool(self, h: Tensor, keep: Tensor) -> Tensor:
        """(B, S, D), keep (B, S) -> (B, D). Padding never contributes; an all-padding row gives 0."""
        if self.cfg.pooling == "cls":
            return h[:, 0]
        k = keep[..., None]  # (B, S, 1)
        if self.cfg.pooling == "max":
            pooled = h.masked_fill(~k, float("-inf")).amax(dim=1)
            return pooled.masked_fill(~k.any(1), 0.0)
        return (h * k).sum(1) / k.sum(1).clamp(min=1).to(h.dtype)
