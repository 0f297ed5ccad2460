"""How many CPU threads torch uses, chosen for the load the machine is under.

On a small CPU shared with another busy process, torch's default (one intra-op thread per core)
loses most of its speed: every parallel op waits at a barrier for the thread that shares a core
with the other process. On the 2-core machine of docs/reliability.md, training with one other
busy process ran at 6.3k tokens/s with 2 threads and 12.9k with 1.

- :func:`threads_for_load` (translate, evaluate, the start of training): the cores that are not
  busy, from the kernel's count of runnable tasks, sampled a few times over ~50 ms.
- :class:`ThreadGovernor` (training): now and then times a few updates with N threads and with 1,
  interleaved, and keeps the faster; the probes are spaced further apart while the choice holds.

A thread count the user set (``AIAYN_THREADS``, else ``OMP_NUM_THREADS``) always wins, and nothing
is changed. Changing the thread count can change the last bits of a float sum: set
``AIAYN_THREADS`` for runs that must repeat bit for bit.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)

__all__ = ["user_threads", "cores", "busy_cores", "threads_for_load", "ThreadGovernor"]


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


def _running() -> int | None:
    """Runnable tasks on the machine now (the 4th field of /proc/loadavg, this one included)."""
    try:
        with open("/proc/loadavg", encoding="ascii") as f:
            return int(f.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return None


def busy_cores(samples: int = 5, interval: float = 0.01) -> int:
    """Cores kept busy by other processes: the median count of runnable tasks over a few samples,
    less this process; 0 where the count cannot be read."""
    counts = []
    for i in range(samples):
        n = _running()
        if n is None:
            return 0
        counts.append(n)
        if i < samples - 1:
            time.sleep(interval)
    return max(0, sorted(counts)[len(counts) // 2] - 1)


def threads_for_load(apply: bool = True) -> int:
    """torch's thread count for the load now: the cores not busy with other processes (at least
    one), unless the user set a count. Sets it with ``apply``; returns it."""
    asked = user_threads()
    if asked is not None:
        if apply and asked != torch.get_num_threads():
            torch.set_num_threads(asked)  # AIAYN_THREADS (OMP_NUM_THREADS torch reads itself)
        return asked
    n = max(1, min(torch.get_num_threads(), cores() - busy_cores()))
    if apply and n != torch.get_num_threads():
        log.info("threads: %d of %d cores busy with other work; using %d", cores() - n, cores(), n)
        torch.set_num_threads(n)
    return n


class ThreadGovernor:
    """Times updates with N threads and with 1 now and then, and keeps the faster (training).

    Call :meth:`record` after each update with its work (tokens) and its duration. A probe runs
    ``window`` timed updates per setting, twice each, interleaved (N, 1, N, 1), after one
    untimed update following each switch; the setting with more work per second is kept until
    the next probe, ``every`` updates later. Each probe that confirms the choice doubles the
    spacing (up to ``max_every``); one that changes it resets the spacing.
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
        self.plan: list[tuple[int, bool]] = []  # (threads, timed) of the probe's next updates
        self.timed: dict[int, list[float]] = {}  # threads -> [work, seconds]
        self.choices: list[int] = []

    def record(self, work: float, seconds: float) -> None:
        """One update's work (e.g. tokens) and wall-clock seconds; may change the thread count."""
        if not self.active:
            return
        if self.plan:
            threads, timed = self.plan.pop(0)  # the setting this update ran with
            if timed:
                total = self.timed.setdefault(threads, [0.0, 0.0])
                total[0] += work
                total[1] += seconds
            if self.plan:
                self._use(self.plan[0][0])
            else:
                self._decide()
            return
        self.countdown -= 1
        if self.countdown <= 0:
            # after each switch one untimed update (the thread pool settles), then `window` timed
            self.plan = [
                (n, timed)
                for n in (self.high, 1, self.high, 1)
                for timed in [False] + [True] * self.window
            ]
            self.timed = {}
            self._use(self.plan[0][0])

    def _decide(self) -> None:
        rate = {n: work / max(sec, 1e-9) for n, (work, sec) in self.timed.items()}
        best = max(rate, key=rate.get)
        confirmed = bool(self.choices) and self.choices[-1] == best
        self.every = min(self.every * 2, self.max_every) if confirmed else self.base_every
        self.choices.append(best)
        self.countdown = self.every
        log.debug(
            "threads: %s; keeping %d for %d updates",
            ", ".join(f"{n}: {r:.0f}/s" for n, r in sorted(rate.items())),
            best,
            self.every,
        )
        if not confirmed:
            log.info(
                "threads: %d (measured %s work/s)", best, {n: round(r) for n, r in rate.items()}
            )
        self._use(best)

    def _use(self, threads: int) -> None:
        if threads != self.current:
            self.set_threads(threads)
            self.current = threads
