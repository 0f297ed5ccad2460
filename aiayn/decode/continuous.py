"""Step-level ("continuous") batching of translations: sentences join a running search between
decoder steps and leave it the step they end.

Shape legend: b sentences joining · k beam size · S source len · D d_model.

:class:`RunningTranslation` holds one :class:`~aiayn.decode.generator.SequenceGenerator` and its
decoder cache. :meth:`~RunningTranslation.add` encodes new sources and appends their rows to the cache
(their cross-attention keys/values padded to the longest source, their self-attention positions
counted from the step they joined: :meth:`aiayn.model.DecoderCache.extend`);
:meth:`~RunningTranslation.step` runs one decoder step for every sentence and returns the
n-best lists of those that ended. A sentence's hypotheses are those of a decoding of it alone
(:func:`aiayn.decode.translate_ids`), whenever it joins (tested): the masks hide every other row
and every position before it joined. Beam 1 is greedy search, as there.

This is what vLLM and Hugging Face's TGI call continuous batching, at the granularity of a
decoder step. `aiayn serve` runs it for the PyTorch backend (aiayn/serve/batching.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch import Tensor

from aiayn.decode.config import DecodeConfig
from aiayn.decode.generator import SequenceGenerator
from aiayn.decode.packed import prepacked
from aiayn.decode.search import Hypothesis, search_for
from aiayn.decode.step import Seq2SeqModel
from aiayn.decode.translate import check_bad_ids, max_output_lengths, pad_rows, search_settings

__all__ = ["JoinableModel", "RunningTranslation"]


class JoinableModel(Seq2SeqModel, Protocol):
    """A :class:`~aiayn.decode.step.Seq2SeqModel` whose caches take rows that join later:
    ``init_cache(...)`` gives caches with ``extend(other)`` and ``trim(n)``, and the model
    projects a memory into a fresh cache at once."""

    def project_memory(self, cache: Any, memory: Any) -> Any:
        """Cross-attention keys/values of ``memory`` into ``cache`` now; returns the cache."""
        ...


class RunningTranslation:
    """A translation search that sentences join and leave between decoder steps.

    ``cfg`` (one for all its sentences: requests with other settings run in another one) is
    checked as :func:`~aiayn.decode.translate_ids` checks it.
    """

    def __init__(self, model: JoinableModel, cfg: DecodeConfig, device: torch.device) -> None:
        check_bad_ids(model.cfg, cfg)
        self.model, self.cfg, self.device = prepacked(model), cfg, device
        settings = search_settings(model.cfg, cfg)
        self.search = SequenceGenerator(settings, search_for(settings), device)
        self.cache: Any = None

    @property
    def active(self) -> int:
        """Sentences still being decoded."""
        return self.search.active

    @torch.no_grad()
    def add(self, sources: Sequence[list[int]]) -> list[int]:
        """Encode ``sources`` (non-empty id lists) and start them; returns their ids.

        Shape: b sources -> memory (b, S, D), cache rows b (k after their first step)."""
        if not sources or not all(sources):
            raise ValueError("add() takes one or more non-empty sources")
        model_cfg = self.model.cfg
        src = pad_rows([list(s) for s in sources], model_cfg.pad_id, self.device)  # (b, S)
        max_len = max_output_lengths(
            (src != model_cfg.pad_id).sum(1).cpu(), self.cfg, model_cfg.max_len
        )
        memory = self.model.encode(src)
        cache = self.model.init_cache(memory, src=src).with_beam(self.cfg.beam)
        self.model.project_memory(cache, memory)
        self.cache = cache if self.cache is None else self.cache.extend(cache)
        return self.search.add(max_len, len(sources))  # after the cache: it cannot fail

    @torch.no_grad()
    def step(self) -> dict[int, list[Hypothesis]]:
        """One decoder step for every sentence; the n-best lists of those that ended, by id."""
        self.cache = self.search.step(self._step, self.cache)
        return self._ended()

    def drop(self, ids: Sequence[int]) -> None:
        """Stop decoding sentences ``ids`` (their client went away); their rows leave."""
        self.cache = self.search.drop(ids, self.cache)
        if not self.search.active:
            self.cache = None

    def _ended(self) -> dict[int, list[Hypothesis]]:
        if not self.search.active:
            self.cache = None  # the next sentence starts a new one
        return self.search.pop_done()

    def _step(self, tokens: Tensor, cache: Any) -> tuple[Tensor, Any]:
        """The step function: the memory is in the cache already (None: not read again)."""
        new = tokens[:, cache.length :]
        return self.model.log_probs(new, None, cache)[:, -1], cache  # (N, V)
