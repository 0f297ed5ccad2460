"""Each batch shape once before training starts (``train.warm_shapes``).

A GPU pays for the first sight of each tensor shape (kernel choice and plans, first allocations of
the caching allocator), so the WMT base recipe's first epoch on an H100, where every shape is new,
ran several times slower than the later ones
(docs/experiments/gpu_2026-11-26.md#the-whole-check-third-slot-and-six-minutes-of-wmt-shaped-training).
With a few bucket widths (``data.bucket_widths``) an epoch has a few dozen shapes, the same every
epoch; running one batch of each here, forward and backward without an optimizer step, pays for
them before the training clock starts, within a time bound, in one log line.

Nothing the run computes changes: the gradients are dropped, no weight or optimizer state moves,
and the caller restores the random number generators (the trainer runs it inside
``_rng_untouched``), so a run's losses are those of the same run without it
(tests/test_warmup.py). BPE-dropout draws from the tokenizers library's own generator, which
takes no seed: a run with ``data.bpe_dropout`` does not repeat exactly either way.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from aiayn.train.task import Task

log = logging.getLogger(__name__)

__all__ = ["WarmupReport", "warm_shapes"]


@dataclass(frozen=True)
class WarmupReport:
    shapes: int  # batch shapes run once
    listed: int  # distinct batch shapes of an epoch (all of them, when none was left out)
    seconds: float
    stopped: bool  # the time bound ended it before the last shape


def warm_shapes(
    net: nn.Module,
    task: Task,
    device: torch.device,
    autocast: Callable[[], contextlib.AbstractContextManager],
    seconds: float,
) -> WarmupReport:
    """Run forward + backward once on one training batch of each distinct shape, the largest
    first, until the shapes or ``seconds`` run out; drop the gradients; log one line."""
    batches = task.shape_batches()
    # Under DDP no gradient is all-reduced: each process warms its own kernels.
    quiet = net.no_sync if isinstance(net, DistributedDataParallel) else contextlib.nullcontext
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    net.train()
    start = time.perf_counter()
    done = 0
    for indices in batches:
        sync()
        if time.perf_counter() - start >= seconds:
            break
        batch = task.collate("train", indices)
        with quiet(), autocast():
            stats = task.loss(net, batch, device)
        stats.loss.backward()
        done += 1
    sync()
    net.zero_grad(set_to_none=True)
    report = WarmupReport(done, len(batches), time.perf_counter() - start, done < len(batches))
    log.info(
        "train.warm_shapes: %d of %d batch shapes run once (forward + backward) in %.1f s%s",
        report.shapes,
        report.listed,
        report.seconds,
        f": stopped at the {seconds:g} s bound" if report.stopped else "",
    )
    return report
