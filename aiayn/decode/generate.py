"""Text generation with a decoder-only language model: sampling with the KV cache, streamed.

Shape legend: N rows (1 here) · t tokens so far (prompt included) · V vocab.

:func:`lm_step` turns a :class:`~aiayn.model.lm.TransformerLM` into the step function the search
functions take (``(tokens, state) -> (log_probs, state)``); :func:`generate` runs
:func:`aiayn.decode.generator.sample` over it with a :class:`~aiayn.decode.config.SamplingConfig`
and hands every token to ``on_token`` as soon as it is drawn. With the cache each step feeds only the new token; without it, each step re-reads the whole
context. The model saw windows of ``window`` tokens in training: when the context outgrows that,
the cached step restarts its cache on the last ``window // 2`` tokens (the uncached one simply
reads the last ``window``), so the two agree exactly while the text fits in one window (tested).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from aiayn.checks import check_ids
from aiayn.decode.config import SEED_RANGE, SamplingConfig, check_seed
from aiayn.decode.generator import sample
from aiayn.decode.rules import Rules
from aiayn.decode.search import SearchSettings, StepFn
from aiayn.decode.step import decoding_device
from aiayn.model.cache import DecoderCache
from aiayn.model.lm import TransformerLM

__all__ = ["LMState", "SEED_RANGE", "check_seed", "lm_step", "generate", "TextStream"]


@dataclass
class LMState:
    """What a cached step carries: the K/V cache and how many of the tokens so far it has read."""

    cache: DecoderCache
    seen: int = 0  # tokens of the sequence consumed (the cache may hold only the last of them)

    def reorder(self, index: Tensor) -> LMState:
        self.cache.reorder(index)
        return self


def _banned(model: TransformerLM) -> list[int]:
    """Special ids a running-text model never predicts (it never saw them as targets)."""
    cfg = model.cfg
    return sorted({cfg.pad_id, cfg.bos_id, cfg.eos_id, cfg.unk_id})


def lm_step(model: TransformerLM, window: int, use_cache: bool = True) -> StepFn:
    """A step function over ``model``; its first call takes ``state=None``.

    Shape: tokens (N, t) -> log_probs (N, V), special tokens at -inf, renormalised.
    """
    if window < 2:
        raise ValueError(f"window must be >= 2, got {window}")
    banned = _banned(model)

    def step(tokens: Tensor, state: LMState | None) -> tuple[Tensor, LMState | None]:
        if not use_cache:
            logits = model(tokens[:, -window:])[:, -1]  # (N, V)
        else:
            t = tokens.size(1)
            if state is None or state.cache.length + t - state.seen > window:
                keep = min(t, window // 2) if state is not None or t > window else t
                state = LMState(model.init_cache(), t - keep)
            logits = model(tokens[:, state.seen :], state.cache)[:, -1]  # (N, V)
            state.seen = t
        logits = logits.float()
        logits[:, banned] = float("-inf")
        return logits.log_softmax(-1), state

    return step


@torch.no_grad()
def generate(
    model: TransformerLM,
    prompt_ids: list[int],
    window: int,
    sampling: SamplingConfig = SamplingConfig(),
    use_cache: bool = True,
    on_token: Callable[[int], Any] | None = None,
    device: torch.device | None = None,
) -> list[int]:
    """Sample ``sampling.max_new_tokens`` tokens after ``prompt_ids``; returns them (prompt
    excluded). ``window``: the context the model saw in training.

    ``on_token(id)`` is called for each token as soon as it is drawn (streaming). ``device``:
    where the model runs (default: where its weights are).
    """
    if not prompt_ids:
        raise ValueError("the prompt must have at least one token")
    check_ids("bad_ids", sampling.bad_ids, model.cfg.tgt_vocab_size)
    device = decoding_device(model, device)
    prefix = torch.tensor([prompt_ids], dtype=torch.long, device=device)  # (1, t0)
    step, reported = lm_step(model, window, use_cache), prefix.size(1)

    def streaming(tokens: Tensor, state: Any) -> tuple[Tensor, Any]:
        nonlocal reported
        if on_token is not None:
            for token in tokens[0, reported:].tolist():  # drawn since the last step
                on_token(token)
        reported = tokens.size(1)
        return step(tokens, state)

    settings = search_settings(model, sampling)
    hyp = sample(streaming, None, prefix, sampling.max_new_tokens, settings)[0]
    if on_token is not None:
        for token in hyp.tokens[reported - prefix.size(1) :]:  # the last one drawn
            on_token(token)
    return hyp.tokens


def search_settings(model: TransformerLM, sampling: SamplingConfig) -> SearchSettings:
    """What search is told: the model's special ids, the rules ``sampling`` sets, and itself."""
    rules = Rules(
        repetition_penalty=sampling.repetition_penalty,
        no_repeat_ngram_size=sampling.no_repeat_ngram_size,
        bad_ids=sampling.bad_ids,
    )
    return SearchSettings(model.cfg.bos_id, model.cfg.eos_id, rules, sampling=sampling)


class TextStream:
    """Turns streamed token ids into the text they add: ``on_text(piece)`` per token, or later
    when a token ends mid-character (the decoded text then ends in U+FFFD: wait for more)."""

    def __init__(self, tokenizer: Any, on_text: Callable[[str], Any]) -> None:
        self.tokenizer, self.on_text = tokenizer, on_text
        self.ids: list[int] = []
        self.shown = 0

    def __call__(self, token: int) -> None:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids)
        if not text.endswith("\ufffd"):
            self.on_text(text[self.shown :])
            self.shown = len(text)
