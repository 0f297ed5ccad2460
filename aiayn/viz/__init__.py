"""Plots that show what the Transformer computes: positional encodings (§3.5), attention maps
(§3.2, Figures 3–5 of the paper), and learning curves of a training run.

matplotlib is an optional dependency (``pip install -e '.[plot]'``): it is imported only when a
figure is drawn, with the non-interactive Agg backend, and a clear :class:`AiaynError` when it is
missing. Each ``plot_*`` function returns a ``matplotlib.figure.Figure``; :func:`save_figure`
writes it as a PNG whose ``Description`` text chunk lists the panel titles.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiayn.errors import AiaynError, OutputError
from aiayn.io import atomic_path, disk_full

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

__all__ = ["pyplot", "panels", "save_figure"]

COLORBAR_LABEL = "<colorbar>"  # the label matplotlib gives a colorbar's axes


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend, or an AiaynError saying how to install it."""
    try:
        import matplotlib
    except ImportError:
        raise AiaynError(
            "plotting needs matplotlib: pip install -e '.[plot]' (or pip install matplotlib)"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def panels(fig: Figure) -> list[Any]:
    """The plot panels of ``fig``: its axes, colorbars excluded."""
    return [ax for ax in fig.axes if ax.get_label() != COLORBAR_LABEL]


def save_figure(fig: Figure, path: str | Path, dpi: int = 110) -> Path:
    """Write ``fig`` as a PNG (atomically) and close it. The PNG's ``Description`` holds the panel
    titles, one per line, so a reader (or a test) can tell what the image contains."""
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise AiaynError(f"{path}: plots are written as PNG; give a file name ending in .png")
    titles = "\n".join(ax.get_title() or "(untitled)" for ax in panels(fig))
    try:
        with atomic_path(path) as tmp:
            fig.savefig(
                tmp,
                format="png",
                dpi=dpi,
                bbox_inches="tight",
                metadata={"Software": "aiayn", "Description": titles},
            )
    except OSError as err:
        if disk_full(err):
            raise OutputError(f"disk full while writing {path}") from None
        raise AiaynError(f"{path}: cannot write the figure ({err.strerror or err})") from None
    finally:
        pyplot().close(fig)
    return path
