"""glibc malloc set-up on CPU: keep freed memory in the process.

A training step allocates and frees the same few hundred MiB of activations, gradients and
logits every step, in sizes that change with the batch's shape. glibc serves blocks above its
mmap threshold (128 KiB, rising to at most 32 MiB) with a fresh ``mmap`` and gives them back to
the kernel on ``free``, so a step page-faults much of its memory in again: on this project's
2-core VM a large share of a BASE step went to minor faults and kernel time
(docs/experiments/training_speed.md#what-was-tried-and-what-it-gave). With ``M_MMAP_MAX = 0``
every block comes from the heap, and with a large ``M_TRIM_THRESHOLD`` freed heap memory stays
in the process, so once the steps have reached their peak they fault almost nothing. The price:
the process keeps its peak memory until it exits, which is what a training process does anyway.
With ``M_ARENA_MAX = 1`` every thread allocates from the one main arena: glibc otherwise gives each
thread (decoding workers, ``--workers 2``) an arena of its own, each then keeping its own peak, and
the two workers' freed blocks could not serve each other: one arena lowers the peak of a 2-worker
decoding, no slower
(docs/experiments/decoding_speed.md#native-decoding-against-ctranslate2-where-the-time-and-the-memory-went-2026-11-26).

Applied once per process on CPU: by the trainer, by the inference commands (translate, evaluate,
classify, generate, serve) and by :func:`aiayn.load` (each beam-search step allocates and frees
its logits and the self-attention caches: page faults at every batch without it, none with it,
docs/experiments/decoding_speed.md#the-same-benchmark-on-a-cpu-without-avx-512-2026-11-23; and
faster decoding through `aiayn.load`, docs/performance.md#in-short). Skipped off glibc, when the
user tuned malloc themselves (any ``MALLOC_*`` variable, ``glibc.malloc`` in ``GLIBC_TUNABLES``)
or preloads jemalloc / tcmalloc / mimalloc, and with ``AIAYN_MALLOC=default``.
"""

from __future__ import annotations

import ctypes
import os
import platform

__all__ = ["keep_freed_memory"]

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
