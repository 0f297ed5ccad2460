"""Image classification task: the Vision Transformer on labelled images (Fashion-MNIST's shape).

Images are decoded once into an image store (:mod:`aiayn.data.images`) and read from it
memory-mapped; a batch holds ``data.max_tokens // tokens per image`` images (the token budget
of the other kinds: an image is (image_size / patch_size)² patch tokens, plus the class token),
shuffled per epoch with ``data.seed``. Training batches are augmented as ``data.augment`` says
(off by default), each batch's draws seeded by ``data.seed`` and its images, so a resumed run
draws what it would have. The loss is the (label-smoothed) cross-entropy per image; validation
also reports accuracy (``valid_acc``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.data.images import ImageSet, augment, split_images
from aiayn.decode.images import image_probs, pixels_of
from aiayn.errors import ConfigError
from aiayn.kinds import IMAGE_CLASSIFICATION
from aiayn.model.vision import n_patches
from aiayn.train.loss import label_smoothed_nll_loss
from aiayn.train.task import StepStats, Task

__all__ = ["ImageBatch", "ImageClassificationTask"]

log = logging.getLogger(__name__)


@dataclass
class ImageBatch:
    """Pixels (B, C, H, W) float32 in [0, 1] and labels (B,)."""

    pixels: Tensor
    labels: Tensor

    def __len__(self) -> int:
        return len(self.labels)

    def to(self, device: torch.device, non_blocking: bool = False) -> ImageBatch:
        return ImageBatch(
            self.pixels.to(device, non_blocking=non_blocking),
            self.labels.to(device, non_blocking=non_blocking),
        )


class ImageClassificationTask(Task):
    """Cross-entropy over (image, label) pairs with a :class:`~aiayn.model.VisionTransformer`."""

    kind = IMAGE_CLASSIFICATION

    def setup(self, tokenizer_json: str | None) -> None:
        """The training and validation images (no tokenizer: the model reads pixels)."""
        data, model = self.cfg.data, self.cfg.model
        self.splits: dict[str, tuple[ImageSet, np.ndarray]] = {
            "train": split_images(data, data.train_split, model.image_size, model.channels),
            "valid": split_images(data, data.valid_split, model.image_size, model.channels),
        }
        store, train = self.splits["train"]
        self.classes = list(store.classes)
        for name, (split_store, _) in self.splits.items():
            if split_store.classes != self.classes:
                raise ConfigError(
                    f"the {name} images' classes {split_store.classes} are not the training "
                    f"images' {self.classes} (the same subfolders, in both)"
                )
        log.info(
            "%d training images, %d validation images, %d classes",
            len(train),
            len(self.splits["valid"][1]),
            len(self.classes),
        )
        return None

    def model_config(self, model: ModelConfig) -> ModelConfig:
        """The classes the data has (n_classes, class_names); the stack has no decoder."""
        return replace(
            model,
            n_classes=len(self.classes),
            class_names=tuple(self.classes),
            n_decoder_layers=0,
        )

    @property
    def tokens_per_image(self) -> int:
        model = self.cfg.model
        return n_patches(model) + int(model.pooling == "cls")

    @property
    def batch_size(self) -> int:
        size = self.cfg.data.max_tokens // self.tokens_per_image
        if size < 1:
            raise ConfigError(
                f"data.max_tokens = {self.cfg.data.max_tokens} holds no image of "
                f"{self.tokens_per_image} tokens"
            )
        return size

    def _batches(self, order: np.ndarray) -> list[list[int]]:
        size = self.batch_size
        return [order[i : i + size].tolist() for i in range(0, len(order), size)]

    def epoch_batches(self, epoch: int, rank: int, world_size: int) -> Sequence[list[int]]:
        n = len(self.splits["train"][1])
        order = np.random.default_rng([self.cfg.data.seed, epoch]).permutation(n)
        batches = self._batches(order)
        usable = len(batches) - len(batches) % world_size if world_size > 1 else len(batches)
        return batches[rank:usable:world_size]

    def batch_shapes(self, rank: int, world_size: int) -> int | None:
        """Every batch is ``batch_size`` images but an epoch's last: one or two shapes."""
        return len({len(b) for b in self.epoch_batches(1, rank, world_size)})

    def valid_batches(self, rank: int, world_size: int) -> Sequence[list[int]]:
        return self._batches(np.arange(len(self.splits["valid"][1])))[rank::world_size]

    def collate(self, split: str, indices: list[int]) -> ImageBatch:
        store, rows = self.splits[split]
        picked = np.sort(rows[indices])  # ascending rows: a sequential read of the memory map
        pixels = pixels_of(store.images[picked])
        if split == "train" and self.cfg.data.augment:
            generator = torch.Generator().manual_seed(
                int(
                    np.random.default_rng([self.cfg.data.seed, *picked[:8].tolist()]).integers(
                        2**62
                    )
                )
            )
            pixels = augment(pixels, self.cfg.data, generator)
        return ImageBatch(pixels, torch.from_numpy(store.labels[picked].astype(np.int64)))

    def num_targets(self, batch: Any) -> int:
        return len(batch)

    def loss(self, model: nn.Module, batch: Any, device: torch.device) -> StepStats:
        batch = batch.to(device, non_blocking=True)
        logits = model(batch.pixels)  # (B, K)
        loss, nll = label_smoothed_nll_loss(
            logits, batch.labels, self.cfg.train.label_smoothing, ignore_index=-1
        )
        return StepStats(loss, nll, len(batch), len(batch) * self.tokens_per_image)

    def valid_metrics(self, model: nn.Module, step: int) -> dict[str, float]:
        """Accuracy on the validation split (when ``train.metrics_every`` is due)."""
        store, rows = self.splits["valid"]
        if not len(rows):
            return {}
        device = next(model.parameters()).device
        probs = image_probs(model, store.images[rows], device)
        labels = torch.from_numpy(store.labels[rows].astype(np.int64))
        return {"valid_acc": float((probs.argmax(-1) == labels).float().mean())}
