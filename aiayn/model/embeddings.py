"""Token embeddings and positional encodings (Vaswani et al. 2017, §3.4 and §3.5).

Shape legend: B batch · T sequence len · D d_model · V vocab.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from aiayn.model.dropout import Dropout


def sinusoidal_table(length: int, d_model: int, layout: str = "interleaved") -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(…) (§3.5). -> (length, D).

    ``layout="halves"`` puts the same sines in the first ⌈D/2⌉ columns and the cosines after
    them (Marian's ``MarianSinusoidalPositionalEmbedding``, tested against it).
    """
    if layout not in ("interleaved", "halves"):
        raise ValueError(f"layout must be 'interleaved' or 'halves', got {layout!r}")
    position = torch.arange(length, dtype=torch.float64)[:, None]  # (L, 1)
    div = torch.pow(10000.0, torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    sin, cos = torch.sin(position / div), torch.cos(position / div[: d_model // 2])
    if layout == "halves":
        return torch.cat([sin, cos], dim=1).float()  # (L, ⌈D/2⌉ + ⌊D/2⌋)
    table = torch.zeros(length, d_model, dtype=torch.float64)
    table[:, 0::2], table[:, 1::2] = sin, cos
    return table.float()


class SinusoidalPositionalEncoding(nn.Module):
    """The paper's fixed sinusoids, looked up from a precomputed table (§3.5)."""

    table: Tensor  # a buffer, not saved with the weights

    def __init__(self, d_model: int, max_len: int, layout: str = "interleaved") -> None:
        super().__init__()
        self.max_len = max_len
        table = sinusoidal_table(max_len, d_model, layout)
        self.register_buffer("table", table, persistent=False)

    def forward(self, length: int, offset: int | Tensor = 0) -> Tensor:
        """Encodings of positions offset … offset+length-1. -> (length, D), or (N, length, D)
        for (N,) offsets, one per row."""
        return _rows(self.table, length, offset, self.max_len)


class LearnedPositionalEncoding(nn.Module):
    """Learned position embeddings, the alternative of Table 3 row (E)."""

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        self.max_len = max_len
        self.weight = nn.Parameter(torch.empty(max_len, d_model))
        nn.init.normal_(self.weight, std=d_model**-0.5)

    def forward(self, length: int, offset: int | Tensor = 0) -> Tensor:
        """As :class:`SinusoidalPositionalEncoding`, from the learned table."""
        return _rows(self.weight, length, offset, self.max_len)


def _rows(table: Tensor, length: int, offset: int | Tensor, max_len: int) -> Tensor:
    """Rows offset … offset+length-1 of a (max_len, D) table -> (length, D); with (N,) offsets
    (rows of a decoding that joined at different steps) -> (N, length, D). Per-row offsets are
    not checked against max_len here (that would copy them to the host at every step): search
    caps each row's length; a position past the table is an indexing error."""
    if isinstance(offset, Tensor):
        return table[offset[:, None] + torch.arange(length, device=offset.device)]
    if offset + length > max_len:
        raise ValueError(f"position {offset + length - 1} exceeds max_len={max_len}")
    return table[offset : offset + length]


class Embeddings(nn.Module):
    """Token embedding × √d_model + positional encoding, then dropout (§3.4, §3.5, §5.4).

    ``token`` may be shared with another Embeddings and with the output projection (§3.4).
    """

    def __init__(
        self,
        token: nn.Embedding,
        positional: nn.Module,
        dropout: float,
        scale: bool = True,
    ) -> None:
        super().__init__()
        self.token = token
        self.positional = positional
        self.scale = math.sqrt(token.embedding_dim) if scale else 1.0
        self.dropout = Dropout(dropout)

    def forward(self, ids: Tensor, offset: int | Tensor = 0, delta: Tensor | None = None) -> Tensor:
        """Shape: ids (B, T) -> (B, T, D); ``offset`` is the position of ids[:, 0] (or (B,), one
        per row); ``delta``
        (B, T, D), if given, is added to the scaled token embeddings (adversarial training)."""
        return self.at(ids, self.positional(ids.size(1), offset), delta)

    def at(self, ids: Tensor, positions: Tensor, delta: Tensor | None = None) -> Tensor:
        """:meth:`forward` with the positional encodings given. Shape: ids (B, T), positions
        (T, D) -> (B, T, D)."""
        x = self.token(ids) * self.scale  # (B, T, D)
        if delta is not None:
            x = x + delta
        return self.dropout(x + positions.to(x.dtype))


def token_embedding(vocab_size: int, d_model: int, pad_id: int) -> nn.Embedding:
    """An embedding table ~ N(0, d_model^-0.5) with a zero padding row (fairseq's initialisation,
    which keeps the √d_model-scaled embedding at unit variance)."""
    emb = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
    nn.init.normal_(emb.weight, std=d_model**-0.5)
    with torch.no_grad():
        emb.weight[pad_id].zero_()
    return emb
