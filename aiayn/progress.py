"""Progress bars: one helper for every long command (training, data, evaluate, average, export,
import), so that all of them show a bar on the same terms.

A bar is drawn on stderr when stderr is a terminal and progress lines are logged (INFO, so not
under ``-q``); elsewhere (a log file, a pipe, a test) it is off and costs nothing, and what a run
has to say goes into log lines instead. Log lines written while a bar is drawn go above it
(:func:`lines_above_bars`), not through it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

__all__ = ["bar_shown", "progress_bar", "lines_above_bars"]


def bar_shown() -> bool:
    """Whether a bar would be drawn: stderr is a terminal and aiayn logs INFO lines (not -q)."""
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty()) and logging.getLogger("aiayn").isEnabledFor(logging.INFO)


def progress_bar(
    total: float | None = None,
    desc: str = "",
    unit: str = "it",
    shown: bool | None = None,
    **kw: Any,
) -> Any:
    """A tqdm bar on stderr (``total``: None when unknown: a count and a rate), off unless
    :func:`bar_shown` (``shown``: True or False to decide instead); it vanishes when closed,
    leaving the lines a command logs."""
    shown = bar_shown() if shown is None else shown
    width = _terminal_width() if shown else None
    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        file=sys.stderr,
        # A terminal that reports no size (a pseudo-terminal of `script`, some CI runners) would
        # get no bar at all from tqdm (0 columns, 0 rows): it gets 80 by 24.
        dynamic_ncols=bool(width),
        ncols=None if width else 80,
        nrows=None if width else 24,
        leave=False,
        disable=not shown,
        **kw,
    )


def _terminal_width() -> int:
    """The columns of the terminal on stderr; 0 when it does not say."""
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns
    except (OSError, ValueError, AttributeError):
        return 0


@contextlib.contextmanager
def lines_above_bars(bar: Any) -> Iterator[None]:
    """While ``bar`` is drawn, log lines to the terminal are written above it, not across it."""
    if bar is None or getattr(bar, "disable", True):
        yield
        return
    with logging_redirect_tqdm():
        yield
