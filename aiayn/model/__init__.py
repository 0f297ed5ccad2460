"""The Transformer's building blocks (Vaswani et al. 2017, §3)."""

from aiayn.model.attention import MultiHeadAttention, scaled_dot_product_attention
from aiayn.model.cache import DecoderCache, LayerCache
from aiayn.model.classifier import TransformerClassifier
from aiayn.model.embeddings import (
    Embeddings,
    LearnedPositionalEncoding,
    SinusoidalPositionalEncoding,
    sinusoidal_table,
)
from aiayn.model.feedforward import PositionwiseFeedForward
from aiayn.model.layers import DecoderLayer, EncoderLayer
from aiayn.model.lm import TransformerLM
from aiayn.model.masks import causal_mask, padding_mask, target_mask
from aiayn.model.mlm import TransformerMaskedLM
from aiayn.model.transformer import Decoder, Encoder, Transformer
from aiayn.model.vision import VisionTransformer

__all__ = [
    "MultiHeadAttention",
    "scaled_dot_product_attention",
    "DecoderCache",
    "LayerCache",
    "Embeddings",
    "LearnedPositionalEncoding",
    "SinusoidalPositionalEncoding",
    "sinusoidal_table",
    "PositionwiseFeedForward",
    "EncoderLayer",
    "DecoderLayer",
    "causal_mask",
    "padding_mask",
    "target_mask",
    "Encoder",
    "Decoder",
    "Transformer",
    "TransformerClassifier",
    "TransformerLM",
    "TransformerMaskedLM",
    "VisionTransformer",
]
