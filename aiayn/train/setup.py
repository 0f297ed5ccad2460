"""The set-up of a training process: allocator, oneDNN kernel caches, precision, device, threads.

:class:`TrainingSetup` is everything the trainer does to the process rather than to the model:
made once before the model is built (glibc keeps freed memory, oneDNN's kernel caches sized for the
run's batch shapes: both must come before the first step), it places the model on the device,
wraps it for DDP, says whether the fused optimizer kernel runs there and opens the autocast
region of every forward pass; entered for the run (``with setup:``), it sets torch's thread
count for the machine's load and keeps re-measuring it (:class:`aiayn.threads.ThreadGovernor`).
GPU speed work (warm-up, compile) belongs here too, beside the CPU's.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from aiayn.memory import keep_freed_memory
from aiayn.run_config import TrainConfig
from aiayn.threads import ThreadGovernor, threads_for_load
from aiayn.train.allocator import cache_cpu_kernels, kernel_cache_capacity
from aiayn.train.distributed import DistContext, resolve_precision

if TYPE_CHECKING:  # annotations only
    from aiayn.train.task import Task

log = logging.getLogger(__name__)

__all__ = ["TrainingSetup", "cache_kernels_for"]


def cache_kernels_for(task: Task, rank: int, world_size: int) -> None:
    """oneDNN's kernel caches sized for the batch shapes of ``task``'s epoch on all processes
    (aiayn/train/allocator.py)."""
    shapes = task.batch_shapes(rank, world_size)
    capacity = kernel_cache_capacity(shapes)
    if cache_cpu_kernels(capacity):
        log.info(
            "oneDNN kernel caches: %d kernels (an epoch has %s batch shapes)",
            capacity,
            "uncounted" if shapes is None else f"{shapes:,}",
        )


class TrainingSetup:
    """This process prepared for training ``task`` with ``train`` (see the module docstring)."""

    def __init__(self, train: TrainConfig, task: Task, dist: DistContext) -> None:
        self.dist = dist
        self.device = dist.device
        if self.device.type == "cpu":
            keep_freed_memory()  # no page faults for memory freed by the previous step
            cache_kernels_for(task, dist.rank, dist.world_size)
        self.autocast_dtype = resolve_precision(train.precision, self.device)
        # The fused kernel: one pass over each parameter instead of ~10 foreach passes (faster:
        # docs/experiments/training_speed.md#what-was-tried-and-what-it-gave); the same update.
        self.fused_optimizer = self.device.type in ("cpu", "cuda")
        self.governor = ThreadGovernor(active=False)  # entering the set-up starts the real one

    def place(self, model: nn.Module) -> nn.Module:
        """``model`` on this process's device."""
        return model.to(self.device)

    def wrap(self, model: nn.Module) -> DistributedDataParallel | None:
        """``model`` in a DDP wrapper when the run has several processes; None otherwise."""
        if not self.dist.active:
            return None
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids)

    def autocast(self) -> contextlib.AbstractContextManager:
        """The precision of forward passes: bf16 autocast, or nothing for fp32."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def __enter__(self) -> TrainingSetup:
        """On the CPU: threads for the load now, then re-measured now and then
        (aiayn/threads.py); nothing when the user set a thread count. The count chosen stays
        after the run."""
        self.governor = ThreadGovernor(active=self.device.type == "cpu")
        if self.governor.active:
            threads_for_load()
            self.governor.current = torch.get_num_threads()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.governor.active = False  # no more trials after the run
