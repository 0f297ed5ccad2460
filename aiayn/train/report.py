"""What a training run says while it trains: a line every ``train.log_every`` updates and one at
each validation, logged to stderr (INFO) on a terminal or in a log file alike; a terminal also
gets a bar (:func:`aiayn.progress.progress_bar`). ``-q`` silences both.

    step STEP[/MAX_STEPS] | loss L | lr LR | N tok/s | H:MM:SS elapsed | ETA H:MM:SS (BUDGET)
    valid step STEP | loss L | ppl P[ | bleu B | chrf C][ | acc A][ | best]

The ETA is measured against the budget that ends the run first (train.max_steps, max_time or
max_epochs), at the pace of the updates of this session, validations included.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from aiayn.progress import progress_bar
from aiayn.run_config import TrainConfig
from aiayn.train.schedule import cosine_decay

log = logging.getLogger(__name__)

__all__ = ["Budget", "TrainReport", "clock", "remaining"]

# Validation figures in the order a line shows them: key, label, format.
_VALID = (
    ("valid_loss", "loss", "{:.3f}"),
    ("valid_ppl", "ppl", "{:.1f}"),
    ("valid_bleu", "bleu", "{:.2f}"),
    ("valid_chrf", "chrf", "{:.2f}"),
    ("valid_acc", "acc", "{:.4f}"),
)


def clock(seconds: float) -> str:
    """``seconds`` as H:MM:SS, or M:SS under an hour."""
    s = max(int(round(seconds)), 0)
    h, m = divmod(s // 60, 60)
    return f"{h}:{m:02d}:{s % 60:02d}" if h else f"{m}:{s % 60:02d}"


@dataclass(frozen=True)
class Budget:
    """The budget that ends the run first, as the trainer sees it after an update."""

    name: str  # "max_steps", "max_time" or "max_epochs"
    seconds: float  # left, at the pace so far
    last_step: int  # the update it ends at, at that pace


def remaining(
    train: TrainConfig, step: int, wall: float, pace: float | None, epoch_updates: float | None
) -> Budget | None:
    """The budget that runs out first from update ``step`` at ``wall`` seconds, at ``pace``
    seconds per update (None: not measured yet; only max_time then counts); ``epoch_updates``:
    the updates left until train.max_epochs (None: no such limit). None: no budget is set."""
    left: list[tuple[float, str]] = []
    if train.max_steps:
        left.append((float(train.max_steps - step), "max_steps"))
    if epoch_updates is not None:
        left.append((epoch_updates, "max_epochs"))
    budgets = [(n * pace, n, name) for n, name in left] if pace else []
    if train.max_time:
        seconds = max(train.max_time - wall, 0.0)
        budgets.append((seconds, seconds / pace if pace else math.inf, "max_time"))
    if not budgets:
        return None
    seconds, updates, name = min(budgets)
    last = step + updates if math.isfinite(updates) else math.inf
    return Budget(name, seconds, int(last) if math.isfinite(last) else 0)


class TrainReport:
    """The log lines and the bar of one training session on rank 0 (``shown``: False on the
    other ranks, which say nothing)."""

    def __init__(self, train: TrainConfig, step: int, wall: float, shown: bool) -> None:
        self.train = train
        self.shown = shown and log.isEnabledFor(logging.INFO)
        self._start = (step, wall)  # the pace counts this session's updates only
        self._warned = False
        self.bar: Any = None
        if self.shown:
            self.bar = progress_bar(train.max_steps or None, "train", "upd", initial=step)
        if self.shown and train.lr_schedule == "cosine" and train.schedule_clock == "time":
            steps = f" or max_steps = {train.max_steps} updates" if train.max_steps else ""
            log.info(
                "lr: cosine from %.2e to %.2e over max_time = %g s%s, whichever ends the run first",
                train.lr,
                train.min_lr,
                train.max_time,
                steps,
            )

    def pace(self, step: int, wall: float) -> float | None:
        """Seconds per update in this session (validations and saves included)."""
        steps = step - self._start[0]
        return (wall - self._start[1]) / steps if steps > 0 else None

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def train_line(self, record: dict[str, Any], epoch_updates: float | None) -> None:
        """The line of a metrics record (step, wall, loss, lr, tokens_per_s), with the ETA."""
        if not self.shown:
            return
        step, wall = int(record["step"]), float(record["wall"])
        budget = remaining(self.train, step, wall, self.pace(step, wall), epoch_updates)
        of = f"/{self.train.max_steps}" if budget and budget.name == "max_steps" else ""
        if budget is not None:
            eta = f"ETA {clock(budget.seconds)} ({budget.name})"
        else:  # no limit (early stopping ends it), or none measured yet
            eta = "no budget set" if not self._has_budget(epoch_updates) else "ETA unknown"
        log.info(
            "step %d%s | loss %.3f | lr %.2e | %s tok/s | %s elapsed | %s",
            step,
            of,
            record["loss"],
            record["lr"],
            f"{record['tokens_per_s']:,.0f}",
            clock(wall),
            eta,
        )
        if budget is None:
            return
        if self.bar is not None:
            if budget.last_step and self.bar.total != budget.last_step:
                self.bar.total = budget.last_step
            self.bar.set_postfix_str(
                f"loss {record['loss']:.3f}, lr {record['lr']:.2e}, ETA {clock(budget.seconds)}",
                refresh=False,
            )
        self._warn_short_schedule(step, wall, budget)

    def _has_budget(self, epoch_updates: float | None) -> bool:
        train = self.train
        return bool(train.max_steps or train.max_time or epoch_updates is not None)

    def valid_line(self, step: int, metrics: dict[str, float], best: bool) -> None:
        """The line of a validation: loss, and BLEU, chrF or accuracy where computed."""
        if not (self.shown and metrics):
            return
        parts = [f"{label} {fmt.format(metrics[k])}" for k, label, fmt in _VALID if k in metrics]
        log.info("valid step %d | %s%s", step, " | ".join(parts), " | best" if best else "")

    def _warn_short_schedule(self, step: int, wall: float, budget: Budget) -> None:
        """Once: a cosine over updates that max_time will cut short, by how much, and the fix
        (judged after the warm-up and a tenth of the time budget, when the pace has settled)."""
        train = self.train
        if (
            self._warned
            or budget.name != "max_time"
            or not budget.last_step
            or train.lr_schedule != "cosine"
            or train.schedule_clock != "updates"
            or step <= train.warmup_steps
            or wall < 0.1 * train.max_time
        ):
            return
        share = (budget.last_step - train.warmup_steps) / (train.max_steps - train.warmup_steps)
        if share >= 0.9:  # the rate ends within 2.5% of the way from the peak to min_lr
            return
        self._warned = True
        log.warning(
            "lr: at this pace max_time = %g s ends the run near update %d, before the cosine over "
            "max_steps = %d decays (lr %.2e there, min_lr %.2e): set train.max_steps=%d, or "
            "train.schedule_clock=time to decay over the time budget",
            train.max_time,
            budget.last_step,
            train.max_steps,
            cosine_decay(share, train.lr, train.min_lr),
            train.min_lr,
            budget.last_step,
        )
