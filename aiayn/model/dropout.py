"""Dropout (Srivastava et al. 2014; the paper's §5.4 regularisation).

Same distribution as ``nn.Dropout`` — each element kept with probability 1 - p and scaled by
1 / (1 - p) — but with a cheaper mask on the CPU. torch's CPU generator is sequential (one
Mersenne-Twister draw per element for ``torch.rand``), and drawing the masks was a visible
share of a SMALL training step on 2 threads. Here one 64-bit draw (``random_`` on int64) gives
the masks of 4 elements: its four 16-bit pieces are compared with p on a 1/65536 grid (the top piece
has 15 random bits, ``random_`` leaving the sign bit 0, and is compared on a 1/32768 grid), so p is
rounded to a multiple of 2^-15 at worst — 0.1 becomes 0.100006. Faster to draw than
``torch.rand`` (docs/experiments/training_speed.md#what-was-tried-and-what-it-gave). On other
devices (and big-endian CPUs, where the
pieces lie the other way round): ``uniform >= p``.
"""

from __future__ import annotations

import math
import sys

import torch
from torch import Tensor, nn


def keep_mask(
    shape: torch.Size | tuple[int, ...], p: float, device: torch.device | str = "cpu"
) -> Tensor:
    """A bool tensor of ``shape``, each element True with probability 1 - p (p on a 2^-16 grid,
    2^-15 for every fourth element); drawn from torch's default generator for ``device``."""
    device = torch.device(device)
    if device.type != "cpu" or sys.byteorder != "little":
        return torch.rand(shape, device=device) >= p  # float32 uniforms: exact p
    n = math.prod(shape)
    bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_()  # [0, 2^63): 63 random bits
    pieces = bits.view(torch.int16).view(-1, 4)  # little-endian: piece 3 holds bits 48-63
    low = -32768 + round(p * 65536)  # pieces 0-2: uniform over all 65536 int16 values
    top = round(p * 32768)  # piece 3: uniform over 0 … 32767
    keep = pieces >= torch.tensor([low, low, low, top], dtype=torch.int16)
    return keep.view(-1)[:n].view(shape)


class Dropout(nn.Dropout):
    """``nn.Dropout`` with a cheaper mask; identical in eval mode and for p = 0."""

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        if self.p == 1.0:
            return x * 0.0
        return x * keep_mask(x.shape, self.p, x.device) * (1.0 / (1.0 - self.p))
