"""Classification of images with a trained Vision Transformer: files or arrays in, classes out.

Shape legend: N images · C channels · H = W side · K classes.

An input is converted as the training images were (:func:`aiayn.data.images.to_model_image`:
grey or RGB as the model reads, resized to its image size), each conversion said in one line
naming the input. The model sees no padding, so an image's probabilities do not depend on which
images share its batch (tested).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from aiayn.data.images import array_image, read_array, read_image, to_model_image
from aiayn.errors import ConfigError

__all__ = ["BATCH", "pixels_of", "image_probs", "model_images", "top_k", "evaluate_images"]

log = logging.getLogger(__name__)

#: images per inference batch
BATCH = 256


def pixels_of(images: np.ndarray) -> Tensor:
    """uint8 (N, C, H, W) -> float32 in [0, 1], what the model reads."""
    return torch.from_numpy(np.ascontiguousarray(images)).float().div_(255.0)


@torch.no_grad()
def image_probs(
    model: Any, images: np.ndarray, device: torch.device | str = "cpu", batch: int = BATCH
) -> Tensor:
    """Class probabilities (N, K) float32 of uint8 images (N, C, H, W), ``batch`` at a time;
    ``model`` a :class:`~aiayn.model.VisionTransformer` (put in eval mode) or an exported engine
    (pixels -> logits)."""
    if isinstance(model, nn.Module):
        model.eval()
    out = [
        model(pixels_of(images[i : i + batch]).to(device)).float().softmax(-1).cpu()
        for i in range(0, len(images), batch)
    ]
    return torch.cat(out) if out else torch.empty(0, model.cfg.n_classes)


def model_images(inputs: Sequence[Any], size: int, channels: int) -> np.ndarray:
    """uint8 (N, C, size, size) of image files (paths) or arrays, converted as the model reads
    them; each conversion one log line naming the input. DataError naming a file that is not an
    image, or an array of no image shape."""
    out = np.empty((len(inputs), channels, size, size), dtype=np.uint8)
    for i, item in enumerate(inputs):
        if isinstance(item, (str, Path)) and Path(item).suffix.lower() == ".npy":
            name = str(item)
            out[i], notes = array_image(read_array(Path(item)), size, channels)
        elif isinstance(item, (str, Path)):
            name = str(item)
            out[i], notes = to_model_image(read_image(Path(item)), size, channels)
        else:
            name = f"image {i + 1}"
            out[i], notes = array_image(item, size, channels)
        if notes:
            log.warning("%s: %s", name, ", ".join(notes))
    return out


def top_k(probs: Tensor, names: Sequence[str], k: int) -> list[list[tuple[str, float]]]:
    """Per row of ``probs`` (N, K) its ``k`` likeliest classes, (name, probability), best first."""
    if k < 1:
        raise ConfigError(f"--top-k must be >= 1, got {k}")
    values, index = probs.topk(min(k, probs.size(-1)), dim=-1)
    return [
        [(names[j], float(p)) for p, j in zip(vs.tolist(), ix.tolist())]
        for vs, ix in zip(values, index)
    ]


def evaluate_images(
    class_probs: Callable[[np.ndarray], Tensor], images: np.ndarray, labels: np.ndarray
) -> dict[str, Any]:
    """Accuracy (and counts, timing) of ``class_probs`` (uint8 images -> (N, K)) on labelled
    images."""
    start = time.perf_counter()
    probs = class_probs(images)
    seconds = time.perf_counter() - start
    correct = int((probs.argmax(-1) == torch.from_numpy(labels.astype(np.int64))).sum())
    return {
        "accuracy": correct / max(len(labels), 1),
        "correct": correct,
        "n": int(len(labels)),
        "seconds": round(seconds, 3),
        "images_per_s": round(len(labels) / max(seconds, 1e-9), 1),
    }
