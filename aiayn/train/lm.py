"""Language-model task: a decoder-only Transformer on one running text (the Tiny Shakespeare shape).

Shape legend: B windows per batch · T block (``data.max_len``) · V vocab.

The trainer's one loop (:mod:`aiayn.train.trainer`) sees this :class:`~aiayn.train.task.Task`.
An example is a window of ``T + 1`` tokens: the model reads the first ``T`` and predicts the last
``T`` (nanoGPT's ``get_batch``). A training epoch is ``len(text) // T`` windows (at least one
batch) at random offsets drawn from ``(data.seed, epoch)``, ``data.max_tokens // T`` per batch.
Validation covers the whole validation text once in consecutive windows, so ``valid_loss`` is the
mean negative log-likelihood per token — nats per character with the char tokenizer.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.data import split_stores
from aiayn.errors import ConfigError
from aiayn.kinds import LM
from aiayn.train.loss import projected_label_smoothed_nll_loss
from aiayn.train.task import StepStats, Task, output_weight

log = logging.getLogger(__name__)

__all__ = ["LanguageModelTask"]


class LanguageModelTask(Task):
    """Next-token cross-entropy over windows of a running text with a :class:`TransformerLM`."""

    kind = LM

    def setup(self, tokenizer_json: str | None) -> str:
        data = self.cfg.data
        self.tokenizer = self.load_tokenizer(tokenizer_json, " on the training text")
        # the text's ids, memory-mapped from its token store
        self.ids = {
            split: store.mapped("text")
            for split, store in split_stores(data, self.tokenizer).items()
        }
        self.block = data.max_len
        self.batch_size = max(1, data.max_tokens // self.block)
        if len(self.ids["train"]) <= self.block + 1:
            raise ConfigError(
                f"the training text has {len(self.ids['train'])} tokens, fewer than "
                f"one window of data.max_len + 1 = {self.block + 1}"
            )
        log.info(
            "%d training tokens, %d validation tokens, vocabulary %d, windows of %d, %d per batch",
            len(self.ids["train"]),
            len(self.ids["valid"]),
            self.tokenizer.vocab_size,
            self.block,
            self.batch_size,
        )
        return self.tokenizer.to_str()

    def model_config(self, model: ModelConfig) -> ModelConfig:
        if model.max_len < self.block:
            raise ConfigError(
                f"model.max_len = {model.max_len} positions cannot hold a window of "
                f"data.max_len = {self.block} tokens"
            )
        v = self.tokenizer.vocab_size
        return replace(model, src_vocab_size=v, tgt_vocab_size=v, n_encoder_layers=0)

    def epoch_batches(self, epoch: int, rank: int, world_size: int) -> Sequence[list[int]]:
        """Window start offsets, drawn from ``(data.seed, epoch)``; every rank its own batches."""
        n_train = len(self.ids["train"])
        n_windows = max(n_train // self.block, self.batch_size)  # a short text: one batch
        rng = np.random.default_rng([self.cfg.data.seed, epoch])
        starts = rng.integers(0, n_train - self.block, size=n_windows).tolist()
        batches = [
            starts[i : i + self.batch_size]
            for i in range(0, n_windows - self.batch_size + 1, self.batch_size)
        ]
        per_rank = len(batches) // world_size
        return batches[rank::world_size][:per_rank]

    def valid_batches(self, rank: int, world_size: int) -> Sequence[list[int]]:
        """Consecutive windows covering every validation token once (the last one shorter)."""
        starts = list(range(0, len(self.ids["valid"]) - 1, self.block))
        batches = [starts[i : i + self.batch_size] for i in range(0, len(starts), self.batch_size)]
        return batches[rank::world_size]

    def collate(self, split: str, indices: list[int]) -> tuple[Tensor, Tensor]:
        """Inputs and next-token targets, (B, T) each; a window cut by the text's end is padded."""
        ids, pad = self.ids[split], self.cfg.model.pad_id
        rows = [torch.from_numpy(ids[s : s + self.block + 1].astype(np.int64)) for s in indices]
        width = max(len(r) for r in rows) - 1
        x = torch.full((len(rows), width), pad, dtype=torch.long)  # (B, T)
        y = torch.full((len(rows), width), pad, dtype=torch.long)  # (B, T)
        for i, row in enumerate(rows):
            x[i, : len(row) - 1] = row[:-1]
            y[i, : len(row) - 1] = row[1:]
        return x, y

    def num_targets(self, batch: Any) -> int:
        return int((batch[1] != self.cfg.model.pad_id).sum())

    def loss(self, model: nn.Module, batch: Any, device: torch.device) -> StepStats:
        x, y = (t.to(device, non_blocking=True) for t in batch)
        hidden = model(x, features_only=True)  # (B, T, D)
        loss, nll = projected_label_smoothed_nll_loss(
            hidden, output_weight(model), y, self.cfg.train.label_smoothing, self.cfg.model.pad_id
        )
        n = self.num_targets(batch)
        return StepStats(loss, nll, n, n)
