"""Encoder-only masked language model (BERT's pre-training objective; Devlin et al. 2019).

Shape legend: B batch · S sequence len · D d_model · V vocab.

The encoder stack of §3.1 over embedded tokens, with the output projection tied to the token
embedding (§3.4), predicting the tokens hidden in the input. Its ``embed`` and ``encoder`` have
the same names and shapes as :class:`~aiayn.model.classifier.TransformerClassifier`'s, so a
classifier run can start from them (``train.init_from``); the masking is the task's
(:mod:`aiayn.train.mlm`).
"""

from __future__ import annotations

from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.model.embeddings import Embeddings, token_embedding
from aiayn.model.transformer import Encoder, init_weights, positional_encoding


class TransformerMaskedLM(nn.Module):
    """Embeddings → Encoder → tied projection. Uses ``src_vocab_size``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.n_encoder_layers == 0:
            raise ValueError("TransformerMaskedLM needs n_encoder_layers > 0")
        self.cfg = cfg
        token = token_embedding(cfg.src_vocab_size, cfg.d_model, cfg.pad_id)
        self.embed = Embeddings(token, positional_encoding(cfg), cfg.dropout, cfg.scale_embeddings)
        self.encoder = Encoder(cfg)
        self.generator = nn.Linear(cfg.d_model, cfg.src_vocab_size, bias=False)
        init_weights(self)
        self.generator.weight = token.weight

    def forward(
        self, ids: Tensor, attn_record: list | None = None, features_only: bool = False
    ) -> Tensor:
        """Shape: ids (B, S) padded with ``cfg.pad_id`` -> logits (B, S, V), or the encoder's
        output (B, S, D) with ``features_only``. Every real token attends to every real token."""
        keep = ids != self.cfg.pad_id  # (B, S)
        h = self.encoder(self.embed(ids), keep[:, None, None, :], attn_record)  # (B, S, D)
        return h if features_only else self.generator(h)
