"""How many CPU threads torch uses, chosen for the load the machine is under.

On a small CPU shared with another busy process, torch's default (one intra-op thread per core)
loses most of its speed: every parallel op waits at a barrier for the thread that shares a core
with the other process. On the 2-core machine of docs/reliability.md, training beside one other
busy process lost most of its speed with 2 threads (docs/experiments/thread_load.md).

- :func:`threads_for_load` (translate, evaluate, the start of training, the server): the cores
  that other processes do not keep busy at normal priority (/proc/stat's busy time over 0.1 s,
  niced work left out), then a probe of ~0.04 s that times a small matrix product with N threads
  and with 1 (a share of time misses load that comes in bursts;
  docs/experiments/thread_load.md#the-probe).
- :class:`LoadFollower` (`aiayn serve`): :func:`threads_for_load` again, when idle and between
  batches under steady traffic, at most once per interval.
- :class:`ThreadGovernor` (training): now and then runs a few updates with the other setting (1
  or N threads) and keeps the faster; a trial stops after one update when that one is far
  slower, and trials are spaced further apart while the choice holds.

A thread count the user set (``AIAYN_THREADS``, else ``OMP_NUM_THREADS``) always wins, and nothing
is changed. Changing the thread count can change the last bits of a float sum: set
``AIAYN_THREADS`` for runs that must repeat bit for bit.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from aiayn.engines import MOST_WORKERS
from aiayn.env import cpu_flags, cpu_info

log = logging.getLogger(__name__)

__all__ = [
    "cpu_has_bf16",
    "user_threads",
    "cores",
    "busy_cores",
    "threads_for_load",
    "default_workers",
    "MOST_WORKERS",
    "probe",
    "LoadFollower",
    "ThreadGovernor",
]

# torch's own thread count, before aiayn changed it: the most a later choice may go back up to.
DEFAULT_THREADS = torch.get_num_threads()


def user_threads() -> int | None:
    """The thread count the user asked for (``AIAYN_THREADS``, else ``OMP_NUM_THREADS``)."""
    for name in ("AIAYN_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(name, "").strip()
        if value:
            try:
                return max(1, int(value))
            except ValueError:
                log.warning("%s=%r is not a number of threads; ignored", name, value)
    return None


def cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# /proc/stat's columns after a CPU's name: user nice system idle iowait irq softirq steal (guest
# time is inside user and nice). Busy: user, system, irq, softirq, the work at normal priority;
# nice is kept apart, as work that yields the core to ours (a nice-19 task gets 1.5% of a core
# against one at nice 0).
_BUSY, _ALL = (0, 2, 5, 6), 8


def _read_stat() -> str:
    """The text of /proc/stat ("" where it cannot be read)."""
    try:
        return Path("/proc/stat").read_text(encoding="ascii")
    except OSError:
        return ""


def _cpu_ticks() -> tuple[int, int, int] | None:
    """(busy ticks, all ticks, CPUs) of the machine since boot, from /proc/stat's line of each
    CPU; None where it cannot be read."""
    busy = total = cpus = 0
    for line in _read_stat().splitlines():
        name, *values = line.split()
        if not (name.startswith("cpu") and name[3:].isdigit()):
            continue
        try:
            ticks = [int(v) for v in values[:_ALL]]
        except ValueError:
            return None
        busy += sum(ticks[i] for i in _BUSY if i < len(ticks))
        total += sum(ticks)
        cpus += 1
    return (busy, total, cpus) if cpus else None


def _own_ticks() -> float:
    """CPU time this process has run (all its threads), in /proc/stat's ticks; 0 when it runs
    niced (its time is then in the nice column, which busy time leaves out)."""
    if os.nice(0) > 0:
        return 0.0
    used = os.times()
    return (used.user + used.system) * os.sysconf("SC_CLK_TCK")


def busy_cores(window: float = 0.1) -> int:
    """Cores kept busy by other processes' work at normal priority, over ``window`` seconds: the
    busy time /proc/stat counts (user, system, irq, softirq; not nice) less this process's own,
    as a share of the time of all the machine's cores, rounded to whole cores. Niced work (a
    batch job at nice 19) and a kernel thread passing count for nothing; 0 where /proc/stat
    cannot be read."""
    before, own = _cpu_ticks(), _own_ticks()
    time.sleep(window)
    after, own = _cpu_ticks(), _own_ticks() - own
    if before is None or after is None or after[1] <= before[1]:
        return 0
    others = after[0] - before[0] - own
    share = max(0.0, others / (after[1] - before[1]))
    return int(share * after[2] + 0.5)


def threads_for_load(apply: bool = True, most: int | None = None) -> int:
    """torch's thread count for the load now, unless the user set a count: N less the cores other
    processes keep busy (:func:`busy_cores`, ~0.1 s; niced work does not count), then 1 when a
    quick probe (:func:`probe`, ~0.04 s) runs faster on 1 thread than on those, where N is
    ``most`` (default: the count now). Sets it with ``apply``. Translate, evaluate, serve and
    the start of training all choose here."""
    asked = user_threads()
    if asked is not None:
        if apply and asked != torch.get_num_threads():
            torch.set_num_threads(asked)  # AIAYN_THREADS (OMP_NUM_THREADS torch reads itself)
        return asked
    high = most or torch.get_num_threads()
    # /proc/stat's busy time is machine-wide: for a process pinned to some of the cores (taskset,
    # a container's cpuset, Slurm) it says nothing of its own, and the probe alone decides.
    pinned = cores() < (os.cpu_count() or 1)
    n = max(1, min(high, cores() - (0 if pinned else busy_cores())))
    if n > 1:
        times = probe((n, 1))
        n = n if times[n] <= times[1] else 1
    if apply and n != torch.get_num_threads():
        why = "the machine is busy with other work" if n < high else "the machine is less busy"
        log.info("threads: %d of %d (%s)", n, high, why)
        torch.set_num_threads(n)
    return n


def default_workers(engine: str, threads: int | None = None, device: str = "cpu") -> int:
    """Batches to decode at once on ``engine`` when the user chose none: one per thread the job
    may use (``threads``, default torch's count now, which :func:`threads_for_load` set for the
    machine's load), at most :data:`MOST_WORKERS`; 1 on a GPU. Each then runs on
    ``threads // workers`` threads."""
    if device != "cpu":
        return 1
    threads = threads or torch.get_num_threads()
    return max(1, min(threads, MOST_WORKERS.get(engine, 1)))


def probe(settings: tuple[int, ...], rounds: int = 2, reps: int = 30) -> dict[int, float]:
    """Seconds of a small matrix product workload (the size of a small model's layer) with each
    thread count, the best of ``rounds`` interleaved tries: on a core shared with another busy
    process, N threads wait for each other at every op and lose to 1."""
    a, b = torch.randn(128, 512), torch.randn(512, 512)
    best = {n: float("inf") for n in settings}
    before = torch.get_num_threads()
    try:
        for _ in range(rounds):
            for n in settings:
                torch.set_num_threads(n)
                start = time.perf_counter()
                for _ in range(reps):
                    torch.mm(a, b)
                best[n] = min(best[n], time.perf_counter() - start)
    finally:
        torch.set_num_threads(before)
    return best


class LoadFollower:
    """torch's thread count for a server, chosen again for the load of the moment
    (:func:`threads_for_load`): call :meth:`choose` when the worker is idle (the batcher spaces
    those), :meth:`between_batches` before each batch; the latter chooses only when
    ``busy_every_s`` have passed since the last choice, so that under steady traffic, when
    the worker is never idle, the count still follows the machine's load. A choice costs
    ~0.15 s (0.1 s of /proc/stat and the probe), once per interval."""

    def __init__(self, most: int, busy_every_s: float = 30.0) -> None:
        self.most, self.busy_every_s = most, busy_every_s
        self.last = time.monotonic()  # the count chosen at start fits now

    def choose(self) -> int:
        self.last = time.monotonic()
        return threads_for_load(most=self.most)

    def between_batches(self) -> None:
        if time.monotonic() - self.last >= self.busy_every_s:
            self.choose()


class ThreadGovernor:
    """Tries the other thread setting (1 or N) now and then during training, and keeps the
    faster one.

    Call :meth:`record` after each update with its work (tokens) and its duration. The rate of
    the current setting is measured over the updates since the last trial; a trial runs up to
    ``window`` updates with the other setting, and stops after the first one when that one is
    far slower (under 0.6 of the current rate: on a loaded 2-core machine, 2 threads ran far
    slower than 1, docs/design/reliability.md#8-speed-under-load, so a trial must be short). The
    faster setting is kept until the next
    trial, ``every`` updates later; each trial that keeps the setting doubles the spacing (up to
    ``max_every``), one that changes it resets the spacing.
    """

    def __init__(
        self,
        threads: int | None = None,
        first: int = 10,
        every: int = 200,
        max_every: int = 1600,
        window: int = 3,
        set_threads: Callable[[int], None] = torch.set_num_threads,
        active: bool = True,
    ) -> None:
        self.high = threads or torch.get_num_threads()
        self.active = active and self.high > 1 and user_threads() is None
        self.every, self.base_every, self.max_every, self.window = every, every, max_every, window
        self.set_threads = set_threads
        self.current = self.high
        self.countdown = first
        self.base = [0.0, 0.0]  # work, seconds of the current setting since the last trial
        self.trial: list[float] | None = None  # work, seconds, updates of the other setting
        self.choices: list[int] = []  # the setting kept after each trial

    def record(self, work: float, seconds: float) -> None:
        """One update's work (e.g. tokens) and wall-clock seconds; may change the thread count."""
        if not self.active:
            return
        if self.trial is None:
            self.base[0] += work
            self.base[1] += seconds
            self.countdown -= 1
            if self.countdown <= 0 and self.base[1] > 0:
                self.trial = [0.0, 0.0, 0]
                self._use(1 if self.current != 1 else self.high)
            return
        self.trial[0] += work
        self.trial[1] += seconds
        self.trial[2] += 1
        rate = self.trial[0] / max(self.trial[1], 1e-9)
        base_rate = self.base[0] / self.base[1]
        if self.trial[2] >= self.window or rate < 0.6 * base_rate:
            self._decide(rate, base_rate)

    def _decide(self, rate: float, base_rate: float) -> None:
        tried = self.current
        other = 1 if tried != 1 else self.high
        if rate > base_rate:  # the setting tried is faster: keep it, look again soon
            self.every = self.base_every
            log.info(
                "threads: %d (%.0f work/s against %.0f with %d)", tried, rate, base_rate, other
            )
        else:
            self.every = min(self.every * 2, self.max_every)
            self._use(other)
        log.debug("threads: tried %d at %.0f/s, %d ran %.0f/s", tried, rate, other, base_rate)
        self.choices.append(self.current)
        self.trial, self.base, self.countdown = None, [0.0, 0.0], self.every

    def _use(self, threads: int) -> None:
        if threads != self.current:
            self.set_threads(threads)
            self.current = threads


def cpu_has_bf16() -> bool:
    """True on CPUs with native bf16 matrix instructions (AVX512-BF16 or AMX)."""
    info = cpu_info()
    if info is None:
        return "AMX" in torch.backends.cpu.get_cpu_capability()
    return bool(cpu_flags(info) & {"avx512_bf16", "amx_bf16"})
