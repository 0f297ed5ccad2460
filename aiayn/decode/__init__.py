"""Decoding: search over a step function, and text-to-text translation with a trained model."""

from aiayn.decode.config import DecodeConfig, SamplingConfig
from aiayn.decode.ensemble import Ensemble
from aiayn.decode.generator import SequenceGenerator, beam_search, greedy_search, sample
from aiayn.decode.rules import Rules
from aiayn.decode.search import (
    BeamSearch,
    GreedySearch,
    Hypothesis,
    Sampling,
    Search,
    SearchSettings,
    filter_log_probs,
    length_penalty,
)
from aiayn.decode.step import Seq2SeqModel, transformer_step
from aiayn.decode.translate import (
    token_batches,
    translate_hypotheses,
    translate_ids,
    translate_texts,
)

__all__ = [
    "BeamSearch",
    "DecodeConfig",
    "Ensemble",
    "GreedySearch",
    "Hypothesis",
    "Rules",
    "Sampling",
    "SamplingConfig",
    "Search",
    "SearchSettings",
    "Seq2SeqModel",
    "SequenceGenerator",
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
