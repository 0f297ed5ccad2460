"""Decoder-only Transformer language model (the Tiny Shakespeare shape).

Shape legend: B batch · T sequence len · D d_model · V vocab.

The decoder stack of §3.1 without encoder–decoder attention: masked self-attention and the
feed-forward network, with the output projection tied to the token embedding (§3.4).
Incremental generation uses the same explicit :class:`DecoderCache` as translation.
"""

from __future__ import annotations

from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.model.cache import DecoderCache
from aiayn.model.embeddings import Embeddings, token_embedding
from aiayn.model.masks import causal_mask, target_mask
from aiayn.model.transformer import Decoder, init_weights, positional_encoding


class TransformerLM(nn.Module):
    """Embeddings → causal Decoder (no cross-attention) → tied projection. Uses ``tgt_vocab_size``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.n_decoder_layers == 0:
            raise ValueError("TransformerLM needs n_decoder_layers > 0")
        self.cfg = cfg
        token = token_embedding(cfg.tgt_vocab_size, cfg.d_model, cfg.pad_id)
        self.embed = Embeddings(token, positional_encoding(cfg), cfg.dropout, cfg.scale_embeddings)
        self.decoder = Decoder(cfg, cross_attention=False)
        self.generator = nn.Linear(cfg.d_model, cfg.tgt_vocab_size, bias=False)
        init_weights(self)
        self.generator.weight = token.weight

    def forward(
        self,
        ids: Tensor,
        cache: DecoderCache | None = None,
        attn_record: list | None = None,
        features_only: bool = False,
    ) -> Tensor:
        """Next-token logits. Shape: ids (B, T) -> (B, T, V), or the last hidden states (B, T, D)
        before the generator with ``features_only``.

        With ``cache`` (from :meth:`init_cache`), ``ids`` holds only the tokens after the
        ``cache.length`` already seen; the cache is extended in place.
        """
        mask: Tensor | None
        if cache is None:
            offset, mask = 0, target_mask(ids, self.cfg.pad_id)
        else:
            offset = cache.length
            mask = None if ids.size(1) == 1 else causal_mask(ids.size(1), ids.device, offset)
        h = self.decoder(self.embed(ids, offset), None, mask, None, cache, attn_record)
        if cache is not None:
            cache.length += ids.size(1)
        return h if features_only else self.generator(h)  # (B, T, D) or (B, T, V)

    def init_cache(self) -> DecoderCache:
        """An empty cache for incremental generation."""
        return DecoderCache.empty(len(self.decoder.layers))
