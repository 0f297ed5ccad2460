"""Position-wise feed-forward network (Vaswani et al. 2017, §3.3).

Shape legend: B batch · T len · D d_model · F d_ff.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.model.dropout import Dropout

# The FFN non-linearities by name: the paper's ReLU, GELU (BERT/GPT), SiLU ("swish", Marian).
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "silu": F.silu,
}


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2 (Eq. 2); GELU or SiLU optionally in place of ReLU."""

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        activation: str = "relu",
        dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {', '.join(ACTIVATIONS)}, got {activation!r}"
            )
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)
        self.activation = ACTIVATIONS[activation]
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """Shape: (B, T, D) -> (B, T, D)."""
        return self.linear2(self.dropout(self.activation(self.linear1(x))))  # (B, T, F) inside
