"""Decoding: search over a step function, and text-to-text translation with a trained model."""

from aiayn.decode.config import DecodeConfig
from aiayn.decode.ensemble import Ensemble
from aiayn.decode.search import (
    Hypothesis,
    SearchSettings,
    beam_search,
    filter_log_probs,
    greedy_search,
    length_penalty,
    sample,
)
from aiayn.decode.step import Seq2SeqModel, transformer_step
from aiayn.decode.translate import (
    token_batches,
    translate_hypotheses,
    translate_ids,
    translate_texts,
)

__all__ = [
    "DecodeConfig",
    "Ensemble",
    "Hypothesis",
    "SearchSettings",
    "Seq2SeqModel",
    "beam_search",
    "filter_log_probs",
    "greedy_search",
    "length_penalty",
    "sample",
    "token_batches",
    "transformer_step",
    "translate_hypotheses",
    "translate_ids",
    "translate_texts",
]
