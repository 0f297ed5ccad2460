"""Devices, precision and multi-process data parallelism (``torch.distributed``).

Launched by ``torchrun`` (which sets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``…),
``aiayn train`` joins a process group — NCCL on CUDA, gloo on CPU — and wraps the model in
``DistributedDataParallel``. Without those variables everything here is a no-op for one process.
"""

from __future__ import annotations

import gc
import logging
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from aiayn.checks import check_device
from aiayn.threads import cpu_has_bf16

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistContext:
    """This process's place in the job; ``world_size == 1`` means no process group."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1

    def all_reduce(self, values: list[float], op: str = "sum") -> list[float]:
        """Sum (or min/max) a few numbers over all processes, in float64."""
        if not self.active:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        reduce_op = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}[
            op
        ]
        dist.all_reduce(t, op=reduce_op)
        return t.tolist()

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every process."""
        if not self.active:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj: Any) -> list[Any]:
        """Every process's ``obj``, in rank order, on every process."""
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.active:
            dist.barrier()


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """``auto`` = this process's CUDA device when there is one, else the CPU."""
    device = check_device(name, "train.device =")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank)
    return device


def resolve_precision(name: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype (bf16) or None for plain fp32. ``auto`` uses bf16 where it is fast."""
    if name == "fp32":
        return None
    supported = torch.cuda.is_bf16_supported() if device.type == "cuda" else cpu_has_bf16()
    if name == "bf16":
        if not supported:
            log.warning("bf16 requested but %s has no native bf16 support: it will be slow", device)
        return torch.bfloat16
    return torch.bfloat16 if supported else None


def init_distributed(device_name: str) -> DistContext:
    """Join the process group ``torchrun`` describes (if any) and pick this process's device."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(device_name, local_rank)
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend=backend)
        log.debug("rank %d/%d joined the %s process group", rank, world_size, backend)
    return DistContext(rank=rank, world_size=world_size, local_rank=local_rank, device=device)


def shutdown_distributed() -> None:
    """Leave the process group. What still holds it (a DistributedDataParallel wrapper the
    caller has dropped) is collected first, so that gloo's threads stop here, while the
    interpreter is whole: left to the interpreter's exit, a 2-rank CPU run that had trained
    and saved could still abort there ("terminate called without an active exception")."""
    if dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()
