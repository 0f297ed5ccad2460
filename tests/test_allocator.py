"""The glibc malloc set-up (aiayn/memory.py; trainer, inference commands, aiayn.load) and the
trainer's kernel caches (aiayn/train/allocator.py): memory freed by one step is reused by the next
without page faults; the user's own MALLOC_* settings and opt-out win."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from aiayn.train.allocator import (KERNEL_CACHE_CAPACITY, MANY_SHAPES_CAPACITY, SHAPES_CACHED_WHOLE,
                                   kernel_cache_capacity)
from aiayn.train.setup import cache_kernels_for

glibc = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                           reason="glibc malloc only")

# What a training step does with its activations, once per step: allocate tensors, use them,
# free them; then count the page faults of the next step doing the same with 3 of the 4.
# (Not one tensor freed and allocated again: torch allocates with posix_memalign, which needs a
# little more than the size of the block it just freed, so a lone block is not always reused;
# over several blocks and steps freed neighbours merge and it is.)
PROBE = """
import resource, torch
from aiayn.memory import keep_freed_memory
applied = keep_freed_memory()
def step(n):
    xs = [torch.empty(16 << 20, dtype=torch.float32) for _ in range(n)]  # n x 64 MiB
    for x in xs:
        x.fill_(1.0)
step(4)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
step(3)
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


# Two threads allocating at once (decoding workers), then glibc's malloc_stats(), which lists
# every arena on stderr: with M_ARENA_MAX = 1 both threads allocate from the main arena (memory
# one frees can serve the other), otherwise each gets an arena of its own that keeps its own peak.
ARENAS = """
import ctypes, threading, torch
from aiayn.memory import keep_freed_memory
applied = keep_freed_memory()
def work():
    torch.empty(4 << 20).fill_(1.0)
threads = [threading.Thread(target=work) for _ in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(applied, flush=True)
ctypes.CDLL("libc.so.6").malloc_stats()
"""


def _arenas(**env: str) -> tuple[bool, int]:
    """(applied, arenas glibc made) for ARENAS."""
    clean = {k: v for k, v in os.environ.items() if k != "AIAYN_MALLOC"}
    out = subprocess.run([sys.executable, "-c", ARENAS], env={**clean, **env}, check=True,
                         capture_output=True, text=True)
    return out.stdout.split()[0] == "True", out.stderr.count("Arena ")


def _probe(**env: str) -> tuple[bool, int]:
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith("MALLOC_") and k not in ("AIAYN_MALLOC", "GLIBC_TUNABLES", "LD_PRELOAD")}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**clean, **env}, check=True,
                         capture_output=True, text=True).stdout.split()
    return out[0] == "True", int(out[1])


@glibc
def _kernel_pages_out_idle_memory() -> bool:
    """A DAMON daemon running a pageout scheme (as some VM hosts do) pages out memory that is
    not touched for a while, freed-but-kept heap memory too, which then faults back in."""
    root = Path("/sys/kernel/mm/damon/admin/kdamonds")
    try:
        return any((d / "state").read_text().strip() == "on"
                   and any(a.read_text().strip() == "pageout"
                           for a in d.glob("contexts/*/schemes/*/action"))
                   for d in root.iterdir() if d.is_dir())
    except OSError:
        return False


def test_freed_memory_is_reused_without_page_faults():
    # Faults can only be added by what else the machine does, never removed: the fewest of up to
    # three probes is the measure.
    applied, faults = _probe()
    for _ in range(2):
        if faults < 20_000:
            break
        faults = min(faults, _probe()[1])
    assert applied
    if faults >= 20_000 and _kernel_pages_out_idle_memory():
        pytest.skip(f"{faults} page faults: this kernel pages out idle memory (DAMON pageout), "
                    "so memory kept by malloc faults back in; not a property of aiayn's set-up")
    assert faults < 20_000  # 3 x 64 MiB is 49,152 pages of 4 KiB: at most one block faulted in
    default, default_faults = _probe(AIAYN_MALLOC="default")
    assert not default
    assert default_faults > 45_000  # glibc's default: munmap on free, every page faulted in again


@glibc
def test_threads_allocate_from_one_arena():
    assert _arenas() == (True, 1)
    applied, arenas = _arenas(AIAYN_MALLOC="default")
    assert not applied and arenas > 1


@glibc
def test_the_users_own_malloc_settings_win():
    for env in ({"MALLOC_ARENA_MAX": "2"}, {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1000000"}):
        applied, _ = _probe(**env)
        assert not applied


# The trainer's oneDNN kernel cache (cache_cpu_kernels): bf16 products of 1,100 shapes, then the
# first ten again. oneDNN logs each kernel it compiles ("create:cache_miss", ONEDNN_VERBOSE);
# with torch's default caches (1,024 kernels) the first shapes were evicted and are compiled
# again, with the trainer's setting they are not.
KERNELS = """
import torch
from aiayn.train.allocator import cache_cpu_kernels
applied = cache_cpu_kernels()
torch.set_num_threads(1)
w = torch.ones(64, 64, dtype=torch.bfloat16)
for m in range(8, 1108):
    torch.mm(torch.ones(m, 64, dtype=torch.bfloat16), w)
print("AGAIN", applied, flush=True)
for m in range(8, 18):
    torch.mm(torch.ones(m, 64, dtype=torch.bfloat16), w)
"""


def _recompiled(**env: str) -> tuple[bool, int, int]:
    """(applied, kernels compiled in all, kernels compiled again for the ten repeated shapes)."""
    clean = {k: v for k, v in os.environ.items() if k not in
             ("AIAYN_KERNEL_CACHE", "LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")}
    out = subprocess.run([sys.executable, "-c", KERNELS], check=True, capture_output=True, text=True,
                         env={**clean, "ONEDNN_VERBOSE": "profile_create", **env}).stdout
    again = out.split("AGAIN")[1]
    return again.split()[0] == "True", out.count("create:cache_miss"), again.count("create:cache_miss")


def test_compiled_matmul_kernels_are_kept():
    default, compiled, recompiled = _recompiled(AIAYN_KERNEL_CACHE="default")
    assert not default
    if compiled == 0:
        pytest.skip("torch does not run bf16 matmuls through oneDNN on this CPU")
    assert recompiled == 10  # torch's defaults: evicted, compiled again
    applied, _, recompiled = _recompiled()
    assert applied
    assert recompiled == 0
    user, _, recompiled = _recompiled(LRU_CACHE_CAPACITY="16", ONEDNN_PRIMITIVE_CACHE_CAPACITY="16")
    assert not user and recompiled == 10  # the user's own setting is left alone


def test_the_kernel_cache_is_sized_by_the_runs_batch_shapes(monkeypatch):
    """Few shapes that come back every epoch (Multi30k: 88): every kernel kept. More than
    SHAPES_CACHED_WHOLE (5 M WMT-like pairs: 4,069): a small cache, or the process grew without
    end. The trainer counts its task's shapes and sets the caches before its first matmul."""
    assert kernel_cache_capacity(None) == kernel_cache_capacity(88) == KERNEL_CACHE_CAPACITY
    assert kernel_cache_capacity(SHAPES_CACHED_WHOLE) == KERNEL_CACHE_CAPACITY
    assert kernel_cache_capacity(SHAPES_CACHED_WHOLE + 1) == MANY_SHAPES_CAPACITY
    for name in ("AIAYN_KERNEL_CACHE", "LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY"):
        monkeypatch.delenv(name, raising=False)
    seen = []

    class Task:
        def batch_shapes(self, rank, world_size):
            seen.append((rank, world_size))
            return 4069

    cache_kernels_for(Task(), rank=1, world_size=2)
    assert seen == [(1, 2)]
    assert os.environ["LRU_CACHE_CAPACITY"] == os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "256"


LOADED = """
import sys
import aiayn.memory as memory
from aiayn.folder import load_model_folder
before = memory._applied
load_model_folder(sys.argv[1])
print(before, memory._applied, any(m.startswith("aiayn.train") for m in sys.modules))
"""


@glibc
def test_opening_a_model_on_the_cpu_keeps_freed_memory_and_imports_no_training(tmp_path):
    """`aiayn.load` (the Python API) decodes with the malloc settings the CLI uses: each beam
    step frees and reallocates ~10 MB; ``AIAYN_MALLOC=default`` still opts out."""
    sys.path.insert(0, str(Path(__file__).parent))
    from serve_helpers import make_folder

    folder = make_folder(tmp_path / "m")
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith("MALLOC_") and k not in ("AIAYN_MALLOC", "GLIBC_TUNABLES", "LD_PRELOAD")}
    for env, expected in (({}, "None True False"), ({"AIAYN_MALLOC": "default"}, "None False False")):
        out = subprocess.run([sys.executable, "-c", LOADED, str(folder)], env={**clean, **env},
                             check=True, capture_output=True, text=True).stdout.split()
        assert " ".join(out) == expected
