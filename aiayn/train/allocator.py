"""oneDNN's kernel caches on CPU, sized for a training run's batch shapes (applied by
:class:`aiayn.train.setup.TrainingSetup`, beside :mod:`aiayn.memory`'s malloc settings).
"""

from __future__ import annotations

import os

__all__ = ["cache_cpu_kernels", "kernel_cache_capacity"]

# oneDNN, which runs torch's bf16 (and many fp32) matrix multiplies on x86 CPUs, JIT-compiles a
# kernel ("primitive") for every new shape, several times the cost of running it once cached
# (docs/experiments/training_speed.md#what-was-tried-and-what-it-gave). Translation batches
# change shape every step (rows, lengths), and the default caches keep 1,024 kernels (torch's ideep
# layer: ``LRU_CACHE_CAPACITY``; oneDNN: ``ONEDNN_PRIMITIVE_CACHE_CAPACITY``), fewer than a training
# run's distinct shapes, so kernels were compiled again all run long. Both caches read their size
# once, when first used.
#
# A cached kernel holds memory, so keeping them all pays only while an epoch's batch shapes are
# few and come back: Multi30k's 117 batches per epoch have 88 shapes. A corpus of 5 M WMT-like
# pairs has 4,069 shapes in 38,682 batches: with room for 65,536 kernels the process grew without
# end; with room for 256 (each update's own kernels reused within it) it levelled off, no slower
# (docs/experiments/log.md#data-at-scale).
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
