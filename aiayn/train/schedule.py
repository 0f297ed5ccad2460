"""Learning-rate schedules, as functions of the update number (1 = the first update).

Stateless: the learning rate of update ``step`` depends on ``step`` alone, so resuming needs only
the step count — except for cosine over time (``train.schedule_clock = "time"``), which also reads
the share of the time budget used, measured by the trainer. A budget ends the run and the decay
together: cosine over time decays over max_time or max_steps, whichever runs out first, so a step
budget given to a recipe on the clock (``--set train.max_steps=400``) still ends at ``min_lr``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from aiayn.run_config import TrainConfig

Schedule = Callable[[int, float], float]  # (update, share of the post-warm-up time used) -> lr


def noam_lr(step: int, d_model: int, warmup: int, scale: float = 1.0) -> float:
    """Vaswani et al. 2017, §5.3: scale · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)."""
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def inverse_sqrt_lr(step: int, peak: float, warmup: int, init: float = 0.0) -> float:
    """fairseq's inverse_sqrt: linear from ``init`` to ``peak`` over ``warmup`` updates, then
    peak · sqrt(warmup / step)."""
    step = max(step, 1)
    if step <= warmup:
        return init + (peak - init) * step / warmup
    return peak * math.sqrt(max(warmup, 1) / step)


def cosine_lr(
    step: int, peak: float, warmup: int, total: int, floor: float = 0.0, init: float = 0.0
) -> float:
    """Linear warm-up from ``init`` to ``peak`` over ``warmup`` updates, then half a cosine from
    ``peak`` down to ``floor`` at update ``total``, and ``floor`` after it (as nanoGPT; for a run
    with a known budget of updates, so the rate has decayed when the budget ends)."""
    step = max(step, 1)
    if step <= warmup:
        return init + (peak - init) * step / warmup
    return cosine_decay((step - warmup) / (total - warmup), peak, floor)


def cosine_decay(progress: float, peak: float, floor: float) -> float:
    """Half a cosine from ``peak`` at ``progress`` 0 down to ``floor`` at 1, ``floor`` after it."""
    progress = min(max(progress, 0.0), 1.0)
    return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def time_cosine_lr(
    step: int, time_used: float, peak: float, warmup: int, floor: float = 0.0, init: float = 0.0
) -> float:
    """cosine_lr over time: the same warm-up over ``warmup`` updates, then half a cosine whose
    progress is ``time_used``, the share of the time budget left after the warm-up that has been
    spent (0 at the end of the warm-up, 1 when the budget ends)."""
    step = max(step, 1)
    if step <= warmup:
        return init + (peak - init) * step / warmup
    return cosine_decay(time_used, peak, floor)


def decay_share(step: int, time_used: float, cfg: TrainConfig) -> float:
    """How far cosine over time has decayed at update ``step``: the larger of the share of the
    time budget used (``time_used``) and the share of the updates after the warm-up up to
    ``cfg.max_steps`` (when set), so the rate reaches ``min_lr`` at whichever budget ends the
    run."""
    steps = 0.0
    if cfg.max_steps > cfg.warmup_steps:
        steps = (step - cfg.warmup_steps) / (cfg.max_steps - cfg.warmup_steps)
    return max(time_used, steps)


def make_schedule(cfg: TrainConfig, d_model: int) -> Schedule:
    """The schedule ``cfg.lr_schedule`` names, as ``(step, time_used) -> lr``; only cosine with
    ``cfg.schedule_clock = "time"`` reads ``time_used`` (:func:`decay_share`)."""

    def schedule(step: int, used: float = 0.0) -> float:
        if cfg.lr_schedule == "noam":
            return noam_lr(step, d_model, cfg.warmup_steps, cfg.lr_scale)
        if cfg.lr_schedule == "inverse_sqrt":
            return inverse_sqrt_lr(step, cfg.lr, cfg.warmup_steps, cfg.warmup_init_lr)
        if cfg.lr_schedule == "cosine" and cfg.schedule_clock == "time":
            return time_cosine_lr(
                step,
                decay_share(step, used, cfg),
                cfg.lr,
                cfg.warmup_steps,
                cfg.min_lr,
                cfg.warmup_init_lr,
            )
        if cfg.lr_schedule == "cosine":
            return cosine_lr(
                step, cfg.lr, cfg.warmup_steps, cfg.max_steps, cfg.min_lr, cfg.warmup_init_lr
            )
        return cfg.lr

    return schedule
