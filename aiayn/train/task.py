"""Tasks: what the one training loop needs to know about a model kind.

The trainer owns optimisation, logging and validation (:mod:`aiayn.train.trainer`), the
process's set-up: precision, threads, devices (:mod:`aiayn.train.setup`), and checkpoints
(:mod:`aiayn.train.state`). A :class:`Task` owns the data and the model kind: it loads and
tokenises the data, builds the model, cuts each epoch into token-bounded batches, turns a batch
into a summed loss and token counts, and computes expensive validation metrics (BLEU for
translation).

Each model kind has one name (``data.kind`` in a recipe, ``kind`` in a model folder's
config.json), one Task class and one model class, declared together in :mod:`aiayn.kinds`, which
names the Task class by its dotted path: :func:`build_task` imports it when a run starts. This
module never imports the Task modules, so no import cycle is possible. Adding a kind is one new
Task module and one entry in :data:`aiayn.kinds.KINDS` (or :func:`aiayn.kinds.register_kind`):
the entry names the data source the loaders read, the settings the config checks allow, the
routes the server answers and the formats that export it, so that no other module changes
(``tests/test_toy_kind.py`` adds a kind from outside aiayn, trains, loads and serves it).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.data import TokenBatchSampler, Tokenizer, split_stores, train_tokenizer_for
from aiayn.errors import ConfigError
from aiayn.kinds import KINDS, get_kind
from aiayn.run_config import RunConfig, check_run_config, warn_run_config

log = logging.getLogger(__name__)

__all__ = [
    "StepStats",
    "Task",
    "TokenBatchedTask",
    "task_class",
    "build_task",
    "output_weight",
    "output_bias",
    "freeze",
]


#: per-example lengths: a token store's array (int32, in RAM) or a list
Lengths = Sequence[int] | np.ndarray


def output_weight(model: nn.Module) -> Tensor:
    """The generator's weight (V, D) of ``model``, or of the model inside a DDP wrapper."""
    generator = getattr(model, "module", model).generator
    assert isinstance(generator, nn.Linear)  # every kind's output projection
    return generator.weight


def output_bias(model: nn.Module) -> Tensor | None:
    """The generator's bias (V,) of ``model`` (Marian's ``final_logits_bias``), or None. It is
    held constant in training (:meth:`Task.build_model` freezes it), as transformers holds it."""
    generator = getattr(model, "module", model).generator
    assert isinstance(generator, nn.Linear)  # every kind's output projection
    return generator.bias


# train.freeze's parts: what their parameters' names start with (every kind's model).
_FROZEN_NAMES = {"embeddings": ("embed.", "src_embed.", "tgt_embed."), "encoder": ("encoder.",)}


def freeze(model: nn.Module, parts: Sequence[str]) -> list[str]:
    """Set ``requires_grad = False`` on the parameters of ``parts`` (``train.freeze``) and on the
    output bias (Marian's ``final_logits_bias``, which transformers holds as a fixed buffer);
    returns the frozen names. ConfigError when the model has no such part."""
    frozen = []
    for part in parts:
        names = [n for n, _ in model.named_parameters() if n.startswith(_FROZEN_NAMES[part])]
        if not names:
            raise ConfigError(f"train.freeze: this model has no {part}")
        frozen += names
    params = dict(model.named_parameters())
    if "generator.bias" in params:  # Marian's final_logits_bias
        frozen.append("generator.bias")
    for name in frozen:
        params[name].requires_grad_(False)
    if parts:
        log.info(
            "train.freeze: %d parameter tensors held fixed (%s)", len(frozen), ", ".join(parts)
        )
    if not any(p.requires_grad for p in model.parameters()):
        raise ConfigError(f"train.freeze: {list(parts)} leaves nothing to train")
    return frozen


@dataclass
class StepStats:
    """One micro-batch's contribution: summed loss (with grad) and counts."""

    loss: Tensor  # summed training loss over the targets (label-smoothed for translation)
    nll: Tensor  # summed negative log-likelihood of the targets (detached), for reporting
    n_targets: int  # what the loss is normalised by: predicted tokens (or examples)
    n_tokens: int  # tokens the model processed (source + target, no padding), for tokens/s


class Task(ABC):
    """The interface between the trainer and one model kind (see the module docstring).

    Lifecycle: ``setup`` (data + tokenizer) -> ``model_config`` (vocabulary size filled in) ->
    ``build_model`` -> ``fit_before_training`` (a new run) -> per epoch ``epoch_batches`` -> per
    micro-batch ``collate`` + ``loss``; validation: ``valid_batches`` + ``loss``, and
    ``valid_metrics`` when due.
    """

    #: the kind's name (config.json "kind", data.kind): its entry in aiayn.kinds.KINDS
    kind: ClassVar[str] = ""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg

    @abstractmethod
    def setup(self, tokenizer_json: str | None) -> str | None:
        """Load the data; train the tokenizer unless ``tokenizer_json`` restores one. Returns the
        tokenizer as JSON (saved in the run folder); None for a kind that reads no text
        (:attr:`aiayn.kinds.Kind.tokenized`)."""

    def load_tokenizer(self, tokenizer_json: str | None, trained_on: str) -> Tokenizer:
        """The tokenizer ``tokenizer_json`` restores, or a new one trained as ``data`` says
        (logged as "training a <kind> tokenizer<trained_on>")."""
        if tokenizer_json is not None:
            return Tokenizer.from_str(tokenizer_json, "tokenizer.json")
        log.info("training a %s tokenizer%s", self.cfg.data.tokenizer, trained_on)
        return train_tokenizer_for(self.cfg.data)

    def model_config(self, model: ModelConfig) -> ModelConfig:
        """``model`` with the fields the data fixes (vocabulary size) filled in."""
        return model

    def build_model(self, model: ModelConfig) -> nn.Module:
        """The kind's model, its ``train.freeze`` parts (and any output bias) held fixed."""
        net = KINDS[self.kind].model_class(model)
        freeze(net, self.cfg.train.freeze)
        return net

    def fit_before_training(  # noqa: B027 (most kinds fit nothing)
        self, model: nn.Module, loaded: Collection[str]
    ) -> None:
        """Estimate the parts of ``model`` that come from the data rather than from training (a
        classifier's NBSVM term), unless ``loaded`` (the names of the tensors read from a model
        folder, ``train.init_from``) holds them. Not called on resume: the checkpoint holds
        them. None here."""

    @abstractmethod
    def epoch_batches(self, epoch: int, rank: int, world_size: int) -> Sequence[list[int]]:
        """This process's batches (lists of training-example indices) for ``epoch`` (1-based): a
        deterministic function of the arguments and the config, using no global RNG."""

    @abstractmethod
    def valid_batches(self, rank: int, world_size: int) -> Sequence[list[int]]:
        """This process's share of the validation set, as batches of indices."""

    @abstractmethod
    def collate(self, split: str, indices: list[int]) -> Any:
        """The tensors of one batch of ``split`` ("train" or "valid") examples."""

    @abstractmethod
    def num_targets(self, batch: Any) -> int:
        """The loss normaliser of ``batch``, known before the forward pass."""

    @abstractmethod
    def loss(self, model: nn.Module, batch: Any, device: torch.device) -> StepStats:
        """Forward ``batch`` (moved to ``device``) through ``model``; summed loss and counts."""

    def batch_shapes(self, rank: int, world_size: int) -> int | None:
        """How many distinct tensor shapes an epoch's training batches have, over all processes
        (None: not counted; a kind whose batches all have one shape)."""
        return None

    def shape_batches(self) -> Sequence[list[int]]:
        """One training batch of each distinct tensor shape of an epoch, over all processes, the
        largest first (what train.warm_shapes runs once; empty: not known for this kind)."""
        return []

    def valid_metrics(self, model: nn.Module, step: int) -> dict[str, float]:
        """Expensive validation metrics, computed on rank 0 when ``train.metrics_every`` says so."""
        return {}


class TokenBatchedTask(Task):
    """A kind whose examples are batched by token count (:class:`~aiayn.data.TokenBatchSampler`),
    one sampler per split and process, made on first use. :meth:`setup` builds the tokenizer and
    the splits' token stores (``self.stores``); subclasses give :meth:`example_lengths` and may
    check or prepare more in :meth:`check_data`."""

    #: what one example is called in the logs and errors ("pairs", "texts")
    examples: ClassVar[str] = "examples"
    #: what the tokenizer is trained on, in the log
    tokenizer_text: ClassVar[str] = "the training split"

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self._samplers: dict[tuple[str, int, int], Any] = {}

    def setup(self, tokenizer_json: str | None) -> str:
        data = self.cfg.data
        trained_on = f" (vocabulary {data.vocab_size}) on {self.tokenizer_text}"
        self.tokenizer = self.load_tokenizer(tokenizer_json, trained_on)
        self.stores = split_stores(data, self.tokenizer)
        if not len(self.stores["train"]):
            raise ConfigError(f"no training {self.examples} left after filtering by data.max_len")
        self.check_data()
        log.info(
            "%d training %s, %d validation %s, vocabulary %d",
            len(self.stores["train"]),
            self.examples,
            len(self.stores["valid"]),
            self.examples,
            self.tokenizer.vocab_size,
        )
        return self.tokenizer.to_str()

    def check_data(self) -> None:
        """The kind's own checks and preparations of the loaded data (``self.stores``)."""

    @abstractmethod
    def example_lengths(self, split: str) -> tuple[Lengths, Lengths | None]:
        """Per example of ``split``, its batch-tensor lengths: source, and target (or None); numpy
        arrays of a token store's lengths, or lists."""

    def _sampler(self, split: str, rank: int, world_size: int) -> Any:
        """``split``'s sampler for this process; None when the split has no examples."""
        key = (split, rank, world_size)
        if key not in self._samplers:
            lengths, target_lengths = self.example_lengths(split)
            self._samplers[key] = (
                TokenBatchSampler(
                    lengths,
                    target_lengths,
                    max_tokens=self.cfg.data.max_tokens,
                    shuffle=split == "train",
                    seed=self.cfg.data.seed,
                    rank=rank,
                    world_size=world_size,
                    pad_to_multiple=self.cfg.data.pad_to_multiple,  # translation only (validated)
                    bucket_widths=self.cfg.data.bucket_widths,  # translation only (validated)
                )
                if len(lengths)
                else None
            )
        return self._samplers[key]

    def epoch_batches(self, epoch: int, rank: int, world_size: int) -> Sequence[list[int]]:
        return self._sampler("train", rank, world_size).batches(epoch)

    def batch_shapes(self, rank: int, world_size: int) -> int | None:
        sampler = self._sampler("train", rank, world_size)
        return None if sampler is None else sampler.distinct_shapes()

    def shape_batches(self) -> Sequence[list[int]]:
        sampler = self._sampler("train", 0, 1)
        return [] if sampler is None else [batch for _, batch in sampler.shape_batches()]

    def valid_batches(self, rank: int, world_size: int) -> Sequence[list[int]]:
        sampler = self._sampler("valid", 0, 1)
        if sampler is None:
            return []
        # Every batch on some rank (none dropped, unlike training): the loss sums are all-reduced.
        return sampler.batches(0)[rank::world_size]


def task_class(name: str) -> type[Task]:
    """The Task class of kind ``name`` (an old name too); ConfigError naming the kinds otherwise."""
    cls: type[Task] = get_kind(name).task_class()
    return cls


def build_task(cfg: RunConfig) -> Task:
    """The Task for ``data.kind``."""
    check_run_config(cfg)  # the cross-field checks, for a RunConfig built in Python too
    warn_run_config(cfg)
    return task_class(cfg.data.kind)(cfg)
