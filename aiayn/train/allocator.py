"""oneDNN's kernel caches on CPU, sized for a training run's batch shapes (applied by
:class:`aiayn.train.setup.TrainingSetup`, beside :mod:`aiayn.memory`'s malloc settings).
"""

from __future__ import annotations

import os

__all__ = ["cache_cpu_kernels", "kernel_cache_capacity"]

# oneDNN, which runs torch's bf16 (and many fp32) matrix multiplies on x86 CPUs, JIT-compiles a
# kernel ("primitive") for every new shape: a (1000, 8000) x (8000, 128) bf16 product took ~15 ms
# the first time and ~2.5-3.4 ms once cached (one thread, AMX). Translation batches change shape
# every step (rows, lengths), and the default caches keep 1,024 kernels (torch's ideep layer:
# ``LRU_CACHE_CAPACITY``; oneDNN: ``ONEDNN_PRIMITIVE_CACHE_CAPACITY``), fewer than a training
# run's distinct shapes, so kernels were compiled again all run long. Both caches read their size
# once, when first used.
#
# A cached kernel holds memory (~0.75 MB each here: fp32, AMD EPYC), so keeping them all pays only
# while an epoch's batch shapes are few and come back: Multi30k's 117 batches per epoch have 88
# shapes. A corpus of 5 M WMT-like pairs has 4,069 shapes in 38,682 batches: with room for 65,536
# kernels the process grew by ~18 MB per update without end (3,888 MiB anonymous by update 146), and the
# first 60 updates took 55.8 s; with room for 256 (each update's own kernels reused within it)
# it held 1,358 MiB and took 51.3 s (one run each, 2026-11-26, demo model, 1 thread, AMD EPYC).
# So a run whose epoch has more than SHAPES_CACHED_WHOLE shapes keeps MANY_SHAPES_CAPACITY.
KERNEL_CACHE_CAPACITY = 65536
SHAPES_CACHED_WHOLE = 1024
MANY_SHAPES_CAPACITY = 256
_CACHE_VARS = ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")


def kernel_cache_capacity(batch_shapes: int | None) -> int:
    """How many kernels to keep for a run whose epoch has ``batch_shapes`` distinct batch shapes
    (None: unknown or fixed)."""
    if batch_shapes is not None and batch_shapes > SHAPES_CACHED_WHOLE:
        return MANY_SHAPES_CAPACITY
    return KERNEL_CACHE_CAPACITY


def cache_cpu_kernels(capacity: int = KERNEL_CACHE_CAPACITY) -> bool:
    """Let oneDNN keep ``capacity`` compiled kernels (see above); True when set here. Takes effect
    only before the process's first oneDNN operation; a variable the user set is left alone, and
    ``AIAYN_KERNEL_CACHE=default`` keeps torch's defaults."""
    env = os.environ
    if env.get("AIAYN_KERNEL_CACHE", "") == "default" or any(k in env for k in _CACHE_VARS):
        return False
    for name in _CACHE_VARS:
        env[name] = str(capacity)
    return True
