"""Masked language modelling: pre-training the classifier's encoder on the texts alone.

Shape legend: B texts per batch · S longest text · D d_model · V vocab.

The objective of BERT (Devlin et al. 2019, §3.1): a share ``data.mask_prob`` of each text's
tokens is chosen; the model reads the text with 80% of the chosen tokens replaced by a mask token,
10% by a random token and 10% left as they are, and predicts the chosen tokens (cross-entropy
through the output projection tied to the embedding). The mask token is ``<s>``: classifier inputs
never contain it (texts carry no BOS), so the classifier never meets it. The data, cleaning,
tokenizer and length limit are the classification task's (labels are read but not used), so a
:class:`~aiayn.model.mlm.TransformerMaskedLM` run and a classifier run on the same texts share a
tokenizer, and the classifier can start from the pre-trained embedding and encoder
(``train.init_from``).

Training masks are drawn from the global torch generator (saved in checkpoints: a resumed run
draws the same masks); validation masks from a generator seeded by ``data.seed`` and the batch, so
``valid_loss`` compares across validations and runs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.errors import ConfigError
from aiayn.kinds import MASKED_LM
from aiayn.train.classification import ClassificationTask
from aiayn.train.loss import projected_label_smoothed_nll_loss
from aiayn.train.task import StepStats, output_weight

__all__ = ["MaskedLMTask", "mask_tokens"]

N_SPECIAL = 4  # <pad> <s> </s> <unk>: never drawn as random replacements


def mask_tokens(
    tokens: Tensor,
    prob: float,
    mask_id: int,
    pad_id: int,
    vocab_size: int,
    rng: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """BERT's corruption of a padded batch. Shape: tokens (B, S) -> (inputs, targets), (B, S) each.

    Each real token is chosen with probability ``prob`` (at least one per batch); ``targets``
    holds the chosen tokens and ``pad_id`` elsewhere; in ``inputs`` a chosen token becomes
    ``mask_id`` (80%), a random non-special token (10%) or stays (10%).
    """
    real = tokens != pad_id
    u = torch.rand(tokens.shape, generator=rng)
    chosen = real & (u < prob)
    if not chosen.any() and real.any():
        chosen.view(-1)[int(real.view(-1).nonzero()[0])] = True
    how = torch.rand(tokens.shape, generator=rng)
    random = torch.randint(N_SPECIAL, vocab_size, tokens.shape, generator=rng)
    inputs = torch.where(chosen & (how < 0.8), torch.full_like(tokens, mask_id), tokens)
    inputs = torch.where(chosen & (how >= 0.8) & (how < 0.9), random, inputs)
    targets = torch.where(chosen, tokens, torch.full_like(tokens, pad_id))
    return inputs, targets


class MaskedLMTask(ClassificationTask):
    """Masked-token cross-entropy over the texts of a classification dataset."""

    kind = MASKED_LM

    def check_data(self) -> None:
        """Nothing: the labels are read but not used."""

    def model_config(self, model: ModelConfig) -> ModelConfig:
        if model.pooling == "cls":
            raise ConfigError(
                "data.kind = 'masked_lm' pre-trains for mean or max pooling; "
                "model.pooling = 'cls' has no CLS token to pre-train"
            )
        # the masked-LM model has none of them
        for name in ("bigram_buckets", "nb_ngrams", "token_dropout"):
            if getattr(model, name):
                raise ConfigError(
                    f"data.kind = 'masked_lm' pre-trains the embeddings and encoder "
                    f"only; set model.{name} in the classifier run that starts from "
                    "it (train.init_from), not here"
                )
        return super().model_config(model)

    def collate(self, split: str, indices: list[int]) -> tuple[Tensor, Tensor, int]:
        """(inputs, targets, real tokens) of one batch: masks drawn as the module docstring says."""
        batch = super().collate(split, indices)
        rng = None
        if split != "train":
            rng = torch.Generator().manual_seed(self.cfg.data.seed * 1_000_003 + indices[0])
        m = self.cfg.model
        inputs, targets = mask_tokens(
            batch.tokens, self.cfg.data.mask_prob, m.bos_id, m.pad_id, m.src_vocab_size, rng
        )
        return inputs, targets, batch.n_tokens

    def num_targets(self, batch: Any) -> int:
        return int((batch[1] != self.cfg.model.pad_id).sum())

    def loss(self, model: nn.Module, batch: Any, device: torch.device) -> StepStats:
        inputs, targets, n_tokens = batch
        inputs, targets = (
            inputs.to(device, non_blocking=True),
            targets.to(device, non_blocking=True),
        )
        hidden = model(inputs, features_only=True)  # (B, S, D)
        loss, nll = projected_label_smoothed_nll_loss(
            hidden,
            output_weight(model),
            targets,
            self.cfg.train.label_smoothing,
            self.cfg.model.pad_id,
        )
        return StepStats(loss, nll, self.num_targets(batch), n_tokens)

    def valid_metrics(self, model: nn.Module, step: int) -> dict[str, float]:
        return {}
