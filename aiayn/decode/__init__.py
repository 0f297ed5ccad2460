"""Decoding: search over a step function, and text-to-text translation with a trained model.

Each name below is imported from its module on first use (PEP 562): ``aiayn.decode.config`` (the
settings, whose defaults ``aiayn translate --help`` shows) imports without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
# The modules that hold them, lightest first: a name is taken from the first that has it.
MODULES = ("config", "rules", "search", "generator", "ensemble", "step", "translate")


def __getattr__(name: str) -> Any:
    if name in __all__:
        for module in MODULES:
            home = importlib.import_module(f"aiayn.decode.{module}")
            if hasattr(home, name):
                globals()[name] = value = getattr(home, name)
                return value
    raise AttributeError(f"module 'aiayn.decode' has no attribute {name!r}")
