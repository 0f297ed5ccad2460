"""Learning curves of a training run, read from ``RUN_DIR/metrics.jsonl``.

The trainer appends one JSON object per line: ``step``, ``wall`` (seconds since start), ``epoch``,
``loss`` (label-smoothed), ``nll``, ``lr``, ``tokens_per_s``; validation lines add ``valid_loss``
(NLL), ``valid_ppl`` and, when computed, other ``valid_*`` metrics (``valid_bleu`` …). Lines may
carry either or both kinds of values.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from aiayn.errors import DataError
from aiayn.viz import pyplot

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
TRAIN_KEYS = ("loss", "nll", "lr")


@dataclass
class Series:
    """One quantity against step and wall-clock seconds."""

    step: list[float] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)
    value: list[float] = field(default_factory=list)

    def add(self, row: dict, key: str) -> None:
        self.step.append(row["step"])
        self.wall.append(row["wall"])
        self.value.append(row[key])


def read_metrics(path: str | Path) -> list[dict]:
    """The rows of a run's metrics.jsonl (``path`` is the run folder or the file itself).

    A malformed line is a DataError naming it, except a truncated last line (a trainer still
    writing), which is skipped with a warning. Every row needs numeric ``step`` and ``wall``.
    """
    path = Path(path)
    file = path / METRICS_FILE if path.is_dir() else path
    if not file.is_file():
        raise DataError(f"{file}: no metrics file (expected a run folder holding {METRICS_FILE})")
    text = file.read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines()
    rows = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            if n == len(lines) and not text.endswith("\n"):
                log.warning("%s: skipping the unfinished last line %d", file, n)
                continue
            raise DataError(f"{file}:{n}: not a JSON object ({err.msg})") from None
        rows.append(_check_row(row, file, n))
    if not rows:
        raise DataError(f"{file}: no metrics yet (the file is empty)")
    return rows


def _check_row(row: object, file: Path, n: int) -> dict:
    if not isinstance(row, dict):
        raise DataError(f"{file}:{n}: not a JSON object")
    for key in ("step", "wall"):
        if not _is_number(row.get(key)):
            raise DataError(f"{file}:{n}: '{key}' is missing or not a number")
    return row


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def collect_series(rows: list[dict]) -> dict[str, Series]:
    """Every numeric quantity of interest: ``loss``, ``nll``, ``lr`` and each ``valid_*``."""
    series: dict[str, Series] = {}
    for row in rows:
        for key, value in row.items():
            if (key in TRAIN_KEYS or key.startswith("valid_")) and _is_number(value):
                series.setdefault(key, Series()).add(row, key)
    return series


def _wall_unit(seconds: float) -> tuple[float, str]:
    if seconds >= 2 * 3600:
        return 3600.0, "h"
    if seconds >= 2 * 60:
        return 60.0, "min"
    return 1.0, "s"


def _metric_series(series: dict[str, Series]) -> dict[str, Series]:
    """The validation metrics of the third column: BLEU and the like, else the perplexity."""
    metrics = {
        k: s
        for k, s in series.items()
        if k.startswith("valid_") and k not in ("valid_loss", "valid_ppl")
    }
    if metrics:
        return metrics
    if "valid_ppl" in series:
        return {"valid_ppl": series["valid_ppl"]}
    if "valid_loss" in series:
        vl = series["valid_loss"]
        return {"valid_ppl": Series(vl.step, vl.wall, [math.exp(min(v, 700.0)) for v in vl.value])}
    return {}


def plot_curves(rows: list[dict], title: str | None = None) -> Figure:
    """Loss (training and validation), learning rate and validation metrics, against step (top
    row) and wall-clock (bottom row). Six panels. The third column shows the ``valid_*`` metrics
    other than loss and perplexity (BLEU …); without any, the validation perplexity."""
    return plot_runs([("", rows)], title)


def plot_runs(runs: list[tuple[str, list[dict]]], title: str | None = None) -> Figure:
    """:func:`plot_curves` of several runs on the same panels (e.g. the models of an ensemble,
    trained side by side); each line's legend starts with its run's label."""
    plotted = []
    for label, rows in runs:
        series = collect_series(rows)
        if "loss" not in series and "valid_loss" not in series:
            raise DataError(
                f"{label + ': ' if label else ''}the metrics hold no 'loss' or "
                "'valid_loss' values to plot"
            )
        plotted.append((f"{label} " if label else "", series, _metric_series(series)))
    unit, unit_name = _wall_unit(max(r["wall"] for _, rows in runs for r in rows))
    plt = pyplot()
    fig, axes = plt.subplots(2, 3, figsize=(15, 7.5), layout="constrained")
    for r, (axis, xlabel) in enumerate([("step", "step"), ("wall", f"wall-clock ({unit_name})")]):
        scale = 1.0 if axis == "step" else unit

        def draw(ax, key: str, s: Series, axis: str = axis, scale: float = scale, **kw) -> None:
            ax.plot([x / scale for x in getattr(s, axis)], s.value, label=key, **kw)

        loss_ax, lr_ax, metric_ax = axes[r]
        for prefix, series, metrics in plotted:
            for key in ("loss", "nll"):
                if key in series:
                    draw(loss_ax, prefix + key, series[key], lw=0.8, alpha=0.8)
            if "valid_loss" in series:
                draw(loss_ax, prefix + "valid_loss", series["valid_loss"], marker="o", ms=3)
            if "lr" in series:
                draw(lr_ax, prefix + "lr", series["lr"], lw=1.0)
            for key, s in metrics.items():
                draw(metric_ax, prefix + key, s, marker="o", ms=3)
        loss_ax.set(yscale="log", ylabel="loss (nats/token)", title=f"loss vs {axis}")
        loss_ax.legend()
        lr_ax.set(ylabel="learning rate", title=f"learning rate vs {axis}")
        if len(plotted) > 1:
            lr_ax.legend()
        metric_ax.set(title=f"validation metrics vs {axis}")
        if any(metrics for _, _, metrics in plotted):
            metric_ax.legend()
        else:
            metric_ax.text(
                0.5, 0.5, "no validation lines yet", ha="center", transform=metric_ax.transAxes
            )
        for ax in axes[r]:
            ax.set_xlabel(xlabel)
            ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    return fig
