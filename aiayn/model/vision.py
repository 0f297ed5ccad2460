"""The Vision Transformer: the paper's encoder reading an image cut into patches.

Shape legend: B batch · C channels · H = W image side · P patch side · N patches · D d_model ·
K classes.

Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words", §3.1 (Eq. 1–4): "we reshape the image
x ∈ R^{H×W×C} into a sequence of flattened 2D patches x_p ∈ R^{N×(P²·C)}, where … N = HW/P² is
the resulting number of patches", each mapped by a trainable linear projection to D, a learnable
class embedding prepended (or, as their Appendix D.4 and timm's ``global_pool='avg'`` allow, the
mean over the patch states instead), learned 1-D position embeddings added, then the standard
Transformer encoder (§3.1 of Vaswani et al., this package's :class:`~aiayn.model.Encoder`) and a
linear head. The patch projection is a convolution with kernel and stride P (the same linear map
on each patch, as timm's ``PatchEmbed``). With ``model.stem = "conv"`` the tokens come from a
small convolutional stem instead, the paper's hybrid (§3.1: "the input sequence can be formed
from feature maps of a CNN") in the form of Xiao et al. 2021, "Early Convolutions Help
Transformers See Better": a 3×3 convolution, then 3×3 convolutions of stride 2 that halve the
image log2(P) times, each normalised and followed by GELU, then a 1×1 convolution to D: the same
(H/P)² tokens. ``model.stem_depths`` stacks more 3×3 convolutions at a resolution, as a ResNet
stage does. Tested: patch arithmetic, batch invariance, and ONNX export against this module.

Pixels come in as floats in [0, 1] (``uint8 / 255``) and are normalised inside the model to
[-1, 1] ((x - 0.5) / 0.5, the ViT reference code's normalisation), so an exported graph takes
the same input.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.model.dropout import Dropout
from aiayn.model.transformer import Encoder, init_weights

__all__ = ["ConvStem", "PatchEmbedding", "VisionTransformer", "n_patches", "flops_per_image"]


def n_patches(cfg: ModelConfig) -> int:
    """N = HW / P²: the tokens an image becomes (a class token adds one)."""
    return (cfg.image_size // cfg.patch_size) ** 2


def stem_channels(cfg: ModelConfig) -> list[int]:
    """The conv stem's widths, C → D/2^k → … → D/2 → D with k = log2(P): a stride-1 convolution
    to D/2^k, then k stride-2 convolutions that double the width up to D."""
    k = cfg.patch_size.bit_length() - 1
    return [cfg.channels] + [max(cfg.d_model >> (k - i), 1) for i in range(k + 1)]


def stem_convs(cfg: ModelConfig) -> list[tuple[int, int, int]]:
    """The conv stem's 3×3 convolutions in order, (in channels, out channels, stride): at each
    resolution (``stem_channels``) the first changes the width (stride 2 after the full
    resolution) and ``model.stem_depths`` - 1 more keep it."""
    widths = stem_channels(cfg)
    depths = cfg.stem_depths or (1,) * (len(widths) - 1)
    convs = []
    for i, (c_in, c_out) in enumerate(zip(widths, widths[1:])):
        convs.append((c_in, c_out, 1 if i == 0 else 2))
        convs += [(c_out, c_out, 1)] * (depths[i] - 1)
    return convs


class ConvStem(nn.Module):
    """Shape: (B, C, H, W) -> (B, D, H/P, W/P). A 3×3 convolution at full resolution, then
    log2(P) 3×3 convolutions of stride 2 (Xiao et al.'s stem; the first, stride-1 layer keeps a
    small image's detail, as the convolutional tokenizer of Hassani et al. 2021 does), each
    followed by a GroupNorm of up to 32 groups (batch-independent, as the BiT ResNet of the
    paper's hybrid) and GELU, and a 1×1 convolution to D with its bias (Xiao et al. §3). With
    ``model.stem_depths`` a resolution has more 3×3 convolutions, of stride 1 (``stem_convs``)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for c_in, c_out, stride in stem_convs(cfg):
            layers += [
                nn.Conv2d(c_in, c_out, kernel_size=3, stride=stride, padding=1, bias=False),
                nn.GroupNorm(math.gcd(32, c_out), c_out),
                nn.GELU(),
            ]
        layers.append(nn.Conv2d(stem_channels(cfg)[-1], cfg.d_model, kernel_size=1))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)


class PatchEmbedding(nn.Module):
    """Eq. 1: z_0 = [x_class; x_p^1 E; …; x_p^N E] + E_pos (the class token when
    ``pooling = 'cls'``), then embedding dropout."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.pooling not in ("cls", "mean"):
            raise ValueError(f"VisionTransformer pools with 'cls' or 'mean', not '{cfg.pooling}'")
        self.cfg = cfg
        p = cfg.patch_size
        if cfg.stem == "conv":
            self.proj: nn.Module = ConvStem(cfg)
        else:
            self.proj = nn.Conv2d(cfg.channels, cfg.d_model, kernel_size=p, stride=p)  # E
        extra = int(cfg.pooling == "cls")
        self.cls = nn.Parameter(torch.zeros(1, 1, cfg.d_model)) if extra else None
        self.pos = nn.Parameter(torch.empty(1, n_patches(cfg) + extra, cfg.d_model))
        nn.init.trunc_normal_(self.pos, std=0.02)  # as the reference code and timm
        self.dropout = Dropout(cfg.dropout)

    def forward(self, pixels: Tensor) -> Tensor:
        """Shape: pixels (B, C, H, W) in [0, 1] -> (B, N (+1), D)."""
        x = self.proj((pixels - 0.5) / 0.5)  # (B, D, H/P, W/P)
        x = x.flatten(2).transpose(1, 2)  # (B, N, D), patches in row-major order
        if self.cls is not None:
            x = torch.cat([self.cls.to(x.dtype).expand(x.size(0), -1, -1), x], dim=1)  # (B, 1+N, D)
        return self.dropout(x + self.pos.to(x.dtype))


class VisionTransformer(nn.Module):
    """PatchEmbedding → Encoder → pooling (class token or mean) → dropout → Linear(D, K)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.n_encoder_layers == 0:
            raise ValueError("VisionTransformer needs n_encoder_layers > 0")
        self.cfg = cfg
        self.embed = PatchEmbedding(cfg)
        self.encoder = Encoder(cfg)
        self.dropout = Dropout(cfg.dropout)
        self.head = nn.Linear(cfg.d_model, cfg.n_classes)
        init_weights(self)
        nn.init.zeros_(self.head.weight)  # the reference code's zero-initialised head

    def check_pixels(self, pixels: Tensor) -> None:
        """ValueError unless ``pixels`` is (B, C, H, W) of the model's image size."""
        c, s = self.cfg.channels, self.cfg.image_size
        if pixels.dim() != 4 or tuple(pixels.shape[1:]) != (c, s, s):
            raise ValueError(
                f"the model reads images of shape (B, {c}, {s}, {s}), got {tuple(pixels.shape)}"
            )

    def features(self, pixels: Tensor, attn_record: list | None = None) -> Tensor:
        """Shape: pixels (B, C, H, W) -> encoder states (B, N (+1), D); with ``attn_record`` a
        list, each layer's attention weights (B, H, S, S) are appended as ("self", w)."""
        self.check_pixels(pixels)
        return self.encoder(self.embed(pixels), None, attn_record)  # no padding: no mask

    def forward(self, pixels: Tensor, attn_record: list | None = None) -> Tensor:
        """Shape: pixels (B, C, H, W) floats in [0, 1] -> logits (B, K)."""
        h = self.features(pixels, attn_record)  # (B, S, D)
        pooled = h[:, 0] if self.cfg.pooling == "cls" else h.mean(dim=1)  # (B, D)
        return self.head(self.dropout(pooled))


def flops_per_image(cfg: ModelConfig) -> int:
    """Floating-point operations (a multiply-add counts 2) of one image's forward pass: the
    patch projection, each layer's Q/K/V/output projections, attention scores and weighted sum,
    feed-forward network, and the head (norms, softmax and activations left out, as is usual)."""
    n = n_patches(cfg)
    s = n + int(cfg.pooling == "cls")
    d, hk, hv = cfg.d_model, cfg.n_heads * cfg.head_dim_k, cfg.n_heads * cfg.head_dim_v
    patch = 2 * n * cfg.patch_size**2 * cfg.channels * d
    if cfg.stem == "conv":
        side, patch = cfg.image_size, 0
        for c_in, c_out, stride in stem_convs(cfg):
            side = (side + stride - 1) // stride  # 3×3, padding 1
            patch += 2 * side * side * 9 * c_in * c_out
        patch += 2 * n * stem_channels(cfg)[-1] * d
    projections = 2 * s * d * (2 * hk + hv) + 2 * s * hv * d
    attention = 2 * s * s * hk + 2 * s * s * hv
    ffn = 2 * 2 * s * d * cfg.d_ff
    layer = projections + attention + ffn
    return patch + cfg.n_encoder_layers * layer + 2 * d * cfg.n_classes
