"""glibc malloc set-up for training on CPU: keep freed memory in the process (and, at the end of
this module, oneDNN's kernel caches made large enough for a training run's shapes).

A training step allocates and frees the same few hundred MiB of activations, gradients and
logits every step, in sizes that change with the batch's shape. glibc serves blocks above its
mmap threshold (128 KiB, rising to at most 32 MiB) with a fresh ``mmap`` and gives them back to
the kernel on ``free``, so a step page-faults much of its memory in again: on this project's
2-core VM up to ~220,000 minor faults and 1.6 s of kernel time in a ~5 s BASE step
(docs/performance.md, "What was tried"). With ``M_MMAP_MAX = 0`` every block comes from the heap, and
with a large ``M_TRIM_THRESHOLD`` freed heap memory stays in the process, so once the steps have
reached their peak they fault almost nothing. The price: the process keeps its peak memory until
it exits, which is what a training process does anyway. With ``M_ARENA_MAX = 1`` every thread
allocates from the one main arena: glibc otherwise gives each thread (decoding workers,
``--workers 2``) an arena of its own, each then keeping its own peak, and the two workers'
freed blocks could not serve each other. Demo model, test2016, beam 5, 2 workers, 4,096 tokens
per batch: peak RSS 1,279 MB with an arena per thread, 965 MB with one (two runs each), no
slower (AMD EPYC,
2026-11-26).

Applied by the trainer on CPU, once per process, and by the inference commands (translate,
evaluate, classify, generate) on CPU (each beam-search step allocates and frees ~10 MB of
logits and the self-attention caches; ~35,000 minor faults per batch of 64 sentences without
it, 0 with it). Skipped off glibc, when the user tuned malloc themselves (any ``MALLOC_*``
variable, ``glibc.malloc`` in ``GLIBC_TUNABLES``) or preloads jemalloc / tcmalloc / mimalloc,
and with ``AIAYN_MALLOC=default``.
"""

from __future__ import annotations

import ctypes
import os
import platform

# glibc's mallopt parameter numbers
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX, M_ARENA_MAX = -1, -2, -4, -8
_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Tune glibc malloc as above (once per process); True when the settings are in force."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    env = os.environ
    if (
        env.get("AIAYN_MALLOC", "") == "default"
        or any(k.startswith("MALLOC_") for k in env)
        or "glibc.malloc" in env.get("GLIBC_TUNABLES", "")
        or any(name in env.get("LD_PRELOAD", "") for name in ("jemalloc", "tcmalloc", "mimalloc"))
    ):
        return False  # the user's own malloc settings, or another allocator
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    # mallopt returns 1 on success; all four or the state is reported as not applied.
    ok = [
        libc.mallopt(M_MMAP_MAX, 0),
        libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1),
        libc.mallopt(M_TOP_PAD, 64 << 20),
        libc.mallopt(M_ARENA_MAX, 1),
    ]
    _applied = all(r == 1 for r in ok)
    return _applied


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
