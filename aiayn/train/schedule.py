"""Learning-rate schedules, as functions of the update number (1 = the first update).

Stateless: the learning rate of update ``step`` depends on ``step`` alone, so resuming needs only
the step count.
"""

from __future__ import annotations

import math
from typing import Callable

from aiayn.train.config import TrainConfig

Schedule = Callable[[int], float]


def noam_lr(step: int, d_model: int, warmup: int, scale: float = 1.0) -> float:
    """Vaswani et al. 2017, §5.3: scale · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)."""
    step = max(step, 1)
    return scale * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def inverse_sqrt_lr(step: int, peak: float, warmup: int, init: float = 0.0) -> float:
    """fairseq's inverse_sqrt: linear from ``init`` to ``peak`` over ``warmup`` updates, then
    peak · sqrt(warmup / step)."""
    step = max(step, 1)
    if step <= warmup:
        return init + (peak - init) * step / warmup
    return peak * math.sqrt(max(warmup, 1) / step)


def cosine_lr(step: int, peak: float, warmup: int, total: int, floor: float = 0.0,
              init: float = 0.0) -> float:
    """Linear warm-up from ``init`` to ``peak`` over ``warmup`` updates, then half a cosine from
    ``peak`` down to ``floor`` at update ``total``, and ``floor`` after it (as nanoGPT; for a run
    with a known budget of updates, so the rate has decayed when the budget ends)."""
    step = max(step, 1)
    if step <= warmup:
        return init + (peak - init) * step / warmup
    if step >= total:
        return floor
    progress = (step - warmup) / (total - warmup)
    return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def make_schedule(cfg: TrainConfig, d_model: int) -> Schedule:
    """The schedule ``cfg.lr_schedule`` names, as ``step -> lr``."""
    if cfg.lr_schedule == "noam":
        return lambda step: noam_lr(step, d_model, cfg.warmup_steps, cfg.lr_scale)
    if cfg.lr_schedule == "inverse_sqrt":
        return lambda step: inverse_sqrt_lr(step, cfg.lr, cfg.warmup_steps, cfg.warmup_init_lr)
    if cfg.lr_schedule == "cosine":
        return lambda step: cosine_lr(step, cfg.lr, cfg.warmup_steps, cfg.max_steps, cfg.min_lr,
                                      cfg.warmup_init_lr)
    return lambda step: cfg.lr
