"""Text generation with a decoder-only language model: sampling with the KV cache, streamed.

Shape legend: N rows (1 here) · t tokens so far (prompt included) · V vocab.

:func:`lm_step` turns a :class:`~aiayn.model.lm.TransformerLM` into the step function the search
functions take (``(tokens, state) -> (log_probs, state)``); :func:`generate` runs
:func:`aiayn.decode.search.sample` over it and hands every token to ``on_token`` as soon as it is
drawn. With the cache each step feeds only the new token; without it, each step re-reads the whole
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

from aiayn.decode.search import SearchSettings, StepFn, sample
from aiayn.decode.step import decoding_device
from aiayn.errors import ConfigError
from aiayn.model.cache import DecoderCache
from aiayn.model.lm import TransformerLM

__all__ = ["LMState", "SEED_RANGE", "check_seed", "lm_step", "generate", "TextStream"]

#: the seeds ``torch.Generator.manual_seed`` takes (a 64-bit integer, signed or unsigned)
SEED_RANGE = (-(2**63), 2**64 - 1)


def check_seed(seed: int | None) -> None:
    """ConfigError when ``seed`` is outside :data:`SEED_RANGE` or not an integer (None: no seed).
    `aiayn generate`, the server's /v1/generate and :func:`generate` all check it here."""
    if seed is None:
        return
    low, high = SEED_RANGE
    if isinstance(seed, bool) or not isinstance(seed, int) or not low <= seed <= high:
        raise ConfigError(f"seed must be an integer from -2**63 to 2**64-1, got {seed!r}")


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
    max_new_tokens: int,
    window: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    use_cache: bool = True,
    on_token: Callable[[int], Any] | None = None,
    device: torch.device | None = None,
) -> list[int]:
    """Sample ``max_new_tokens`` tokens after ``prompt_ids``; returns them (prompt excluded).

    ``on_token(id)`` is called for each token as soon as it is drawn (streaming). ``device``:
    where the model runs (default: where its weights are).
    """
    if not prompt_ids:
        raise ValueError("the prompt must have at least one token")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    check_seed(seed)
    device = decoding_device(model, device)
    prefix = torch.tensor([prompt_ids], dtype=torch.long, device=device)  # (1, t0)
    rng = torch.Generator(device).manual_seed(seed) if seed is not None else None
    step, reported = lm_step(model, window, use_cache), prefix.size(1)

    def streaming(tokens: Tensor, state: Any) -> tuple[Tensor, Any]:
        nonlocal reported
        if on_token is not None:
            for token in tokens[0, reported:].tolist():  # drawn since the last step
                on_token(token)
        reported = tokens.size(1)
        return step(tokens, state)

    cfg = model.cfg
    settings = SearchSettings(
        cfg.bos_id, cfg.eos_id, cfg.pad_id, temperature=temperature, top_k=top_k, top_p=top_p
    )
    hyp = sample(streaming, None, prefix, max_new_tokens, settings, rng=rng)[0]
    if on_token is not None:
        for token in hyp.tokens[reported - prefix.size(1) :]:  # the last one drawn
            on_token(token)
    return hyp.tokens


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
