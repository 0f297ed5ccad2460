"""Where a Vision Transformer looks: its attention drawn as a heat map over the image.

Shape legend: L layers · H heads · S tokens (N patches, plus the class token) · g = image side /
patch side (N = g²).

For each layer and head, the attention of the class token to the patches (a model that pools
the class token), or the attention each patch receives averaged over all queries (a model that
pools the mean), reshaped to the g × g grid of patches and drawn over the picture. Attention
rollout (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers", §3) follows the
attention through the layers instead: per layer the heads' mean plus the identity of the
residual connection, rows renormalised, multiplied from the first layer to the last.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from aiayn.decode.images import model_images, pixels_of
from aiayn.errors import AiaynError
from aiayn.folder import load_model_folder
from aiayn.folder.load import ModelFolder
from aiayn.viz import pyplot
from aiayn.viz.attention import select_numbers

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

__all__ = [
    "ImageAttention",
    "patch_attention",
    "attention_rollout",
    "image_attention",
    "attention_of_pixels",
    "attention_maps",
    "plot_image_attention",
]


@dataclass
class ImageAttention:
    """One image read by a model: its pixels (C, H, W) uint8, every layer's attention weights
    (L, H, S, S), whether the first token is the class token, and the prediction."""

    image: np.ndarray
    weights: Tensor
    cls: bool
    label: str
    prob: float


def patch_attention(weights: Tensor, cls: bool) -> Tensor:
    """Per map of ``weights`` (..., S, S) the attention over the N patches (..., N): the class
    token's row (``cls``), else the mean over every query of the attention each patch receives."""
    if cls:
        return weights[..., 0, 1:]
    return weights.mean(dim=-2)


def attention_rollout(weights: Tensor) -> Tensor:
    """Attention rollout of (L, H, S, S) weights -> (S, S): Ã_l = 0.5·mean_h(A_l) + 0.5·I, rows
    renormalised, R = Ã_L ⋯ Ã_1 (Abnar & Zuidema 2020, Eq. 1)."""
    eye = torch.eye(weights.size(-1), dtype=weights.dtype)
    rollout = eye
    for layer in weights:  # (H, S, S), first layer first
        a = 0.5 * layer.mean(dim=0) + 0.5 * eye
        a = a / a.sum(dim=-1, keepdim=True)
        rollout = a @ rollout
    return rollout


def image_attention(model_dir: str | Path, image: Any) -> ImageAttention:
    """The attention of the model in ``model_dir`` reading ``image`` (a file or an array),
    converted as the training images were."""
    folder = load_model_folder(model_dir, engine="torch")
    if not folder.kind_info.does("classify_images"):
        raise AiaynError(
            f"{model_dir}: holds a '{folder.kind}' model; --image needs an image classifier"
        )
    cfg = folder.config.model
    pixels = model_images([image], cfg.image_size, cfg.channels)  # (1, C, H, W) uint8
    seen, _ = attention_of_pixels(folder, pixels)
    return seen[0]


def attention_of_pixels(
    folder: ModelFolder, pixels: np.ndarray
) -> tuple[list[ImageAttention], Tensor]:
    """Per image of ``pixels`` (N, C, H, W) uint8, as the model reads them, its
    :class:`ImageAttention`; and the class probabilities (N, K). One forward pass of the
    folder's PyTorch module (`aiayn plot attention --image` and the server's /v1/classify)."""
    model = folder.torch_module()
    model.eval()
    record: list = []
    with torch.no_grad():
        probs = model(pixels_of(pixels).to(folder.device), attn_record=record).float().softmax(-1)
    probs = probs.cpu()
    weights = torch.stack([w.float().cpu() for _, w in record], dim=1)  # (N, L, H, S, S)
    names, cls = folder.label_names(), folder.config.model.pooling == "cls"
    best = probs.argmax(-1).tolist()
    seen = [
        ImageAttention(pixels[i], weights[i], cls, names[b], float(probs[i, b]))
        for i, b in enumerate(best)
    ]
    return seen, probs


def attention_maps(seen: ImageAttention, digits: int = 4) -> dict[str, Any]:
    """The heat maps of one image as JSON: ``maps`` (L × H lists of the g × g grid's N values,
    row-major: the class token's attention to each patch, or the mean attention each patch
    receives), ``rollout`` (N values: the same row of the attention rollout), ``grid`` (g),
    ``source`` ("class token" or "mean over patches"). Raw weights, rounded to ``digits``."""
    maps = patch_attention(seen.weights, seen.cls)  # (L, H, N)
    rollout = patch_attention(attention_rollout(seen.weights), seen.cls)  # (N,)
    return {
        "grid": int(round(maps.size(-1) ** 0.5)),
        "source": "class token" if seen.cls else "mean over patches",
        "maps": maps.round(decimals=digits).tolist(),
        "rollout": rollout.round(decimals=digits).tolist(),
    }


def _grid(values: Tensor) -> np.ndarray:
    """(N,) -> (g, g), scaled to [0, 1] (each panel's own range: where it looks, not how much)."""
    g = int(round(values.numel() ** 0.5))
    grid = values.reshape(g, g).numpy()
    span = grid.max() - grid.min()
    return (grid - grid.min()) / span if span > 0 else np.zeros_like(grid)


def plot_image_attention(
    seen: ImageAttention,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    rollout: bool = False,
    title: str = "",
) -> Figure:
    """A grid: one row per layer, one panel per head, each the picture with its attention over
    the patches as a heat map; with ``rollout``, one more panel of the attention rollout."""
    n_layers, n_heads = seen.weights.shape[:2]
    rows = select_numbers(layers, n_layers, "layer")
    cols = select_numbers(heads, n_heads, "head")
    maps = patch_attention(seen.weights, seen.cls)  # (L, H, N)
    picture = seen.image[0] if seen.image.shape[0] == 1 else seen.image.transpose(1, 2, 0)
    side = picture.shape[0]
    plt = pyplot()
    extra = int(rollout)
    fig, axes = plt.subplots(
        len(rows) + extra,
        len(cols),
        figsize=(1.8 * len(cols) + 0.5, 1.8 * (len(rows) + extra) + 0.6),
        squeeze=False,
    )
    what = "class token" if seen.cls else "mean over patches"

    def draw(ax: Any, values: Tensor, name: str) -> None:
        ax.imshow(picture, cmap="gray" if picture.ndim == 2 else None, vmin=0, vmax=255)
        ax.imshow(
            _grid(values),
            cmap="inferno",
            alpha=0.55,
            extent=(-0.5, side - 0.5, side - 0.5, -0.5),
            interpolation="nearest",
        )
        ax.set_title(name, fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])

    for r, layer in enumerate(rows):
        for c, head in enumerate(cols):
            draw(axes[r][c], maps[layer, head], f"layer {layer + 1} head {head + 1}")
    if rollout:
        rolled = attention_rollout(seen.weights)  # (S, S)
        draw(axes[-1][0], patch_attention(rolled, seen.cls), "attention rollout")
        for ax in axes[-1][1:]:
            fig.delaxes(ax)
    fig.suptitle(
        (title + "\n" if title else "")
        + f"predicted {seen.label} ({seen.prob:.2f}); attention of the {what}",
        fontsize=9,
    )
    fig.tight_layout()
    return fig
