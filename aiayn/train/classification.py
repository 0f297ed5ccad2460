"""Classification task: an encoder-only Transformer on labelled texts (the IMDB shape).

The trainer's one loop (:mod:`aiayn.train.trainer`) sees this :class:`~aiayn.train.task.Task`:
texts are cleaned (:func:`aiayn.data.clean.clean_text`: ``<br />`` tags, stray control
characters) and tokenised once into a token store (:func:`aiayn.data.classification_store`), where
texts longer than ``data.max_len`` tokens are cut (``long_examples = "truncate"``, both splits)
or dropped from training (``"filter"``); the loss is the
(label-smoothed) cross-entropy per text (with ``train.adversarial_eps``, plus the same loss on
adversarially perturbed embeddings; with ``train.rdrop_alpha``, R-Drop's), and validation also
reports accuracy.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import nn

from aiayn.config import ModelConfig
from aiayn.data import collate_classification
from aiayn.decode.classify import predict_ids
from aiayn.errors import ConfigError, DataError
from aiayn.kinds import CLASSIFICATION
from aiayn.model import TransformerClassifier
from aiayn.train.loss import label_smoothed_nll_loss, rdrop_loss
from aiayn.train.task import Lengths, StepStats, TokenBatchedTask

__all__ = ["ClassificationTask"]

log = logging.getLogger(__name__)


class ClassificationTask(TokenBatchedTask):
    """Cross-entropy over (text, label) pairs with a :class:`TransformerClassifier`."""

    kind = CLASSIFICATION

    examples = "texts"
    tokenizer_text = "the cleaned training split"

    def check_data(self) -> None:
        """Every label below model.n_classes."""
        top = max(int(store.labels.max()) for store in self.stores.values() if len(store))
        if top >= self.cfg.model.n_classes:
            raise DataError(
                f"the data has label {top}, but model.n_classes = "
                f"{self.cfg.model.n_classes} (labels are 0 … n_classes-1)"
            )

    def model_config(self, model: ModelConfig) -> ModelConfig:
        longest = self.cfg.data.max_len + int(model.pooling == "cls")
        if model.max_len < longest:
            raise ConfigError(
                f"model.max_len = {model.max_len} positions cannot hold a text of "
                f"data.max_len = {self.cfg.data.max_len} tokens"
                + (" plus the CLS token" if model.pooling == "cls" else "")
            )
        v = self.tokenizer.vocab_size
        return replace(model, src_vocab_size=v, tgt_vocab_size=v, n_decoder_layers=0)

    def build_model(self, model: ModelConfig) -> nn.Module:
        """The classifier; with ``model.nb_ngrams`` its NBSVM term reads words through the
        tokenizer's pieces (fitted by :meth:`fit_before_training`)."""
        net = super().build_model(model)
        if isinstance(net, TransformerClassifier) and net.nb is not None:  # (not the masked LM)
            net.nb.set_pieces([self.tokenizer.decode([i]) for i in range(model.src_vocab_size)])
        return net

    def fit_before_training(self, model: nn.Module, loaded: Collection[str]) -> None:
        """The NBSVM term (``model.nb_ngrams``) fitted on the training split, unless its weights
        came from the folder the run starts from."""
        nb = getattr(model, "nb", None)
        if nb is None or "nb.weight" in loaded:
            return
        store = self.stores["train"]
        starts = range(0, len(store), 256)
        batches = (self.collate("train", list(range(s, min(s + 256, len(store))))) for s in starts)
        found = nb.fit((b.tokens, b.labels) for b in batches)
        log.info(
            "NBSVM over word 1-%d-grams: fitted on %d training texts in %.0f s (%d of %d "
            "buckets used, training accuracy %.2f%%)",
            nb.n,
            found["texts"],
            found["seconds"],
            found["buckets_used"],
            nb.buckets,
            100 * found["train_accuracy"],
        )

    def example_lengths(self, split: str) -> tuple[Lengths, Lengths | None]:
        extra = int(self.cfg.model.pooling == "cls")  # the CLS position the model prepends
        return self.stores[split].lengths("text") + extra, None

    def collate(self, split: str, indices: list[int]) -> Any:
        store = self.stores[split]
        items = zip(store.rows("text", indices), store.labels[indices].tolist())
        return collate_classification(list(items), self.cfg.model.pad_id)

    def num_targets(self, batch: Any) -> int:
        return len(batch)

    def loss(self, model: nn.Module, batch: Any, device: torch.device) -> StepStats:
        batch = batch.to(device, non_blocking=True)
        eps = self.cfg.train.adversarial_eps
        if eps and torch.is_grad_enabled():
            return self._adversarial_loss(model, batch, eps)
        alpha, ls = self.cfg.train.rdrop_alpha, self.cfg.train.label_smoothing
        if alpha and torch.is_grad_enabled():  # R-Drop: the batch twice in one forward pass
            logits = model(torch.cat([batch.tokens, batch.tokens]))  # (2B, C)
            loss, nll = rdrop_loss(logits, batch.labels, ls, -1, alpha)
        else:
            logits = model(batch.tokens)  # (B, C)
            loss, nll = label_smoothed_nll_loss(logits, batch.labels, ls, ignore_index=-1)
        return StepStats(loss, nll, len(batch), batch.n_tokens)

    def _adversarial_loss(self, model: nn.Module, batch: Any, eps: float) -> StepStats:
        """Loss on the texts plus loss on the texts with their token embeddings moved by ``eps``
        (L2 norm per text, over all its positions) along the gradient of the loss: the "fast
        gradient" adversarial training of Miyato et al. (2017), their §3, α = 1.

        The direction comes from a first pass (gradient with respect to the embeddings only, no
        parameter gradients); then one forward pass over the clean and the perturbed copies
        together, so a DDP-wrapped model still sees one forward per backward. Validation (under
        ``no_grad``) uses the plain loss.
        """
        ls = self.cfg.train.label_smoothing
        net = getattr(model, "module", model)  # the model inside a DDP wrapper
        assert isinstance(net, TransformerClassifier)  # the shape's model
        tokens, labels = batch.tokens, batch.labels  # (B, S), (B,)
        delta = torch.zeros(
            *tokens.shape, net.cfg.d_model, device=tokens.device, requires_grad=True
        )  # (B, S, D)
        probe, _ = label_smoothed_nll_loss(net(tokens, delta=delta), labels, ls, ignore_index=-1)
        (grad,) = torch.autograd.grad(probe, delta)  # (B, S, D), zero at padding
        norm = grad.flatten(1).norm(dim=1).clamp(min=1e-12)  # (B,)
        r = eps * grad / norm[:, None, None]
        logits = model(torch.cat([tokens, tokens]), delta=torch.cat([torch.zeros_like(r), r]))
        clean, nll = label_smoothed_nll_loss(logits[: len(labels)], labels, ls, ignore_index=-1)
        adversarial, _ = label_smoothed_nll_loss(logits[len(labels) :], labels, ls, ignore_index=-1)
        return StepStats(clean + adversarial, nll, len(batch), batch.n_tokens)

    def valid_metrics(self, model: nn.Module, step: int) -> dict[str, float]:
        """Accuracy on the validation split (when ``train.metrics_every`` is due)."""
        store = self.stores["valid"]
        if not len(store):
            return {}
        assert isinstance(model, TransformerClassifier)  # the shape's model, unwrapped
        device = next(model.parameters()).device
        rows = [ids.tolist() for ids in store.rows("text", range(len(store)))]
        probs = predict_ids(model, rows, self.cfg.data.max_tokens, device)
        labels = torch.from_numpy(store.labels.astype(np.int64))
        return {"valid_acc": float((probs.argmax(-1) == labels).float().mean())}
