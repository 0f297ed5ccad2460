"""Pictures of the sinusoidal positional encoding (Vaswani et al. 2017, §3.5).

Shape legend: L number of positions · D depth (d_model).

Both plots draw :func:`aiayn.model.embeddings.sinusoidal_table`, the table the model adds to its
embeddings, so the figure shows exactly what the model uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from aiayn.errors import AiaynError
from aiayn.model.embeddings import sinusoidal_table
from aiayn.viz import pyplot

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure


def _check_shape(length: int, depth: int) -> None:
    if length < 1:
        raise AiaynError(f"--length must be at least 1, got {length}")
    if depth < 2 or depth % 2:
        raise AiaynError(f"--depth must be an even number >= 2 (sin/cos pairs), got {depth}")


def plot_pe(length: int = 2048, depth: int = 512) -> Figure:
    """Heat-map of PE(pos, i): position down, depth across. One panel (+ colorbar)."""
    _check_shape(length, depth)
    table = sinusoidal_table(length, depth)  # (L, D)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 6), layout="constrained")
    image = ax.pcolormesh(table.numpy(), cmap="RdBu", vmin=-1.0, vmax=1.0, rasterized=True)
    ax.invert_yaxis()
    ax.set(
        xlabel="depth i",
        ylabel="position",
        title=f"Sinusoidal positional encoding (§3.5), {length} positions × depth {depth}",
    )
    fig.colorbar(image, ax=ax, label="PE(pos, i)")
    return fig


def pe_similarity(table: Tensor, position: int) -> Tensor:
    """Cosine similarity of ``table[position]`` with every row. (L, D) -> (L,)."""
    return torch.nn.functional.cosine_similarity(table[position][None, :], table, dim=-1)


def plot_pe_similarity(
    position: int = 1000, length: int = 2048, depth: int = 512, window: int = 50
) -> Figure:
    """Cosine similarity of one position's encoding with all others: the whole range, and a zoomed
    panel of ±``window`` positions around it. Two panels."""
    _check_shape(length, depth)
    if not 0 <= position < length:
        raise AiaynError(
            f"--position must be in [0, {length - 1}] (--length {length}), got {position}"
        )
    if window < 1:
        raise AiaynError(f"--window must be at least 1, got {window}")
    sim = pe_similarity(sinusoidal_table(length, depth).double(), position).numpy()  # (L,)
    lo, hi = max(0, position - window), min(length, position + window + 1)
    plt = pyplot()
    fig, (full, zoom) = plt.subplots(
        1, 2, figsize=(12, 4), layout="constrained", gridspec_kw={"width_ratios": [2, 1]}
    )
    full.plot(sim, lw=0.8)
    full.axvspan(lo, hi - 1, color="tab:orange", alpha=0.2, label="zoomed range")
    full.legend(loc="lower left")
    full.set(
        xlabel="position",
        ylabel="cosine similarity",
        title=f"cos(PE[{position}], PE[p]) for all p < {length}, depth {depth}",
    )
    zoom.plot(range(lo, hi), sim[lo:hi], marker=".", ms=3, lw=0.8)
    zoom.axvline(position, color="tab:red", lw=0.8, ls="--")
    zoom.set(xlabel="position", title=f"zoom: positions {lo}…{hi - 1}")
    for ax in (full, zoom):
        ax.grid(alpha=0.3)
    return fig
