"""Dynamic batching: concurrent requests merged into batches, run on one worker thread.

Three parts, read in this order:

- :mod:`aiayn.serve.queue`: the request queue (bounded, admission at the door, cancellation:
  a request whose time limit passed leaves before it runs);
- :mod:`aiayn.serve.schedulers`: what runs next, behind one interface (:class:`Scheduler`):
  :class:`WholeBatches` batches at batch boundaries (a window, then one ``run(key, inputs)``
  call), :class:`StepLevel` lets translations join a running decoding between its steps
  (aiayn/serve/stepping.py, aiayn/decode/continuous.py);
- :class:`DynamicBatcher` (here): the worker loop that takes a round from the scheduler and runs
  it, and the jobs it runs besides requests (:class:`WorkerHooks`, passed in).

A request is a list of inputs (for example the texts of one ``/v1/translate`` call), its cost
(their tokens) and a key (what must be equal for two requests to share a batch: the decoding
settings). One worker runs everything the model does (batches, steps and single jobs such as a
generation), so torch never runs two things at once and each gets all intra-op threads. It is
the batcher's own thread, or (``thread=False``) whichever thread calls
:meth:`DynamicBatcher.work`.

The outputs are the same whether requests are merged or not whenever ``run`` treats each input
independently of the others in its batch (aiayn's translation and classification do; tested).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from aiayn.serve.queue import BatchResult, QueueFull, Request, RequestQueue, Stopping, TooLarge
from aiayn.serve.schedulers import Round, Scheduler, Stats, StepLevel, WholeBatches
from aiayn.serve.stepping import Stepper

log = logging.getLogger(__name__)

__all__ = [
    "BatchResult",
    "DynamicBatcher",
    "QueueFull",
    "Scheduler",
    "Stopping",
    "TooLarge",
    "WorkerHooks",
]


@dataclass(frozen=True)
class WorkerHooks:
    """Jobs the worker runs besides requests, given by whoever makes the batcher (`aiayn serve`:
    torch's thread count, a per-thread setting, chosen again for the machine's load). An error
    in one is logged and the worker goes on."""

    on_start: Callable[[], object] | None = None  # once, first, on the worker's thread
    between_rounds: Callable[[], object] | None = None  # before each round (spaces its own runs)
    on_idle: Callable[[], object] | None = None  # when the worker has been free idle_s, ...
    idle_s: float = 1.0
    idle_every_s: float = 60.0  # ... at most once per idle_every_s (the first: after it too)


class DynamicBatcher:
    """A request queue, a scheduler and the worker that runs its rounds.

    ``run(key, inputs) -> outputs`` (one output per input, in order) is called on the worker
    thread. ``submit`` and ``call`` return :class:`concurrent.futures.Future` objects; cancel one
    to drop a request that has not started. The scheduler is :class:`StepLevel` where
    ``stepper`` is given (and ``merge``), else :class:`WholeBatches`; aiayn/serve/schedulers.py
    says what the other arguments do.
    """

    def __init__(
        self,
        run: Callable[[Hashable, list[Any]], Sequence[Any]],
        max_batch_cost: int = 4096,
        wait_s: float = 0.005,
        max_queue: int = 256,
        merge: bool = True,
        max_wait_s: float | None = None,
        thread: bool = True,
        stepper: Callable[[Hashable], Stepper | None] | None = None,
        join_fraction: float = 0.125,
        join_steps: int = 2,
        hooks: WorkerHooks | None = None,
    ) -> None:
        max_wait_s = max(wait_s, 0.1) if max_wait_s is None else max_wait_s
        if max_batch_cost < 1 or max_queue < 1 or wait_s < 0 or max_wait_s < wait_s:
            raise ValueError("max_batch_cost and max_queue must be >= 1, 0 <= wait_s <= max_wait_s")
        if join_fraction < 0 or join_steps < 0:
            raise ValueError("join_fraction and join_steps must be >= 0")
        self.queue = RequestQueue(max_queue)
        self.stats = Stats()
        whole = WholeBatches(run, max_batch_cost, wait_s, max_wait_s, merge, self.stats)
        self.scheduler: Scheduler = whole
        if merge and stepper is not None:
            self.scheduler = StepLevel(whole, stepper, join_fraction, join_steps)
        self.hooks = hooks or WorkerHooks()
        # When the worker last became free: a window opens no earlier, so the clients answered
        # by the last batch have the time to send their next requests.
        self._free_since = time.monotonic()
        self._idle_done = time.monotonic()  # when the idle job last ran
        self._thread: threading.Thread | None = None
        if thread:  # else the caller runs work() on a thread of its own (`aiayn serve`: main)
            self._thread = threading.Thread(target=self.work, name="aiayn-batcher", daemon=True)
            self._thread.start()

    # ---- the callers' side ---------------------------------------------------------------

    def submit(self, key: Hashable, inputs: Sequence[Any], cost: int) -> Future:
        """Queue ``inputs`` to be run in a batch with others of the same ``key``; the future's
        result is a :class:`BatchResult`. QueueFull when the queue is full; TooLarge when
        ``inputs`` are more than it ever holds."""
        if key is None:
            raise ValueError("a batch key must not be None")
        return self.queue.put(Request(key, list(inputs), max(cost, 1)))

    def call(self, job: Callable[[], Any]) -> Future:
        """Queue ``job()`` to run alone on the worker thread (a generation, an attention map);
        the future's result is what it returns."""
        return self.queue.put(Request(None, job, 1))

    def answered(self) -> None:
        """The HTTP layer is handing an answer out: a window open now stays open ``wait_s``
        longer, since that answer's client may come back with its next request."""
        self.scheduler.answered()

    @property
    def waiting(self) -> int:
        """Inputs queued and not yet started (cancelled requests not counted)."""
        return self.queue.waiting

    def close(self, timeout: float = 5.0, drop: bool = False) -> None:
        """Stop after the queued requests (``drop``: at once, the queued and running requests
        failing with :class:`Stopping`); wait up to ``timeout`` seconds for the worker."""
        if drop:
            self.scheduler.stop()
        self.queue.close(drop)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    # ---- the worker's side ---------------------------------------------------------------

    def work(self) -> None:
        """Run rounds until :meth:`close` and the queue is drained: on the batcher's own thread,
        or, made with ``thread=False``, on the caller's. `aiayn serve` runs it on the process's
        main thread: torch's OpenMP threads start a parallel region there several times faster
        than from any other thread (docs/design/serving.md#step-level-batching-pytorch)."""
        self._run_hook(self.hooks.on_start)
        while True:
            work = self._next_round()
            if work is None:
                return  # closed and drained
            if work is _IDLE:
                self._run_idle_job()
                continue
            try:
                self._run_hook(self.hooks.between_rounds)  # threads follow the load
                self.scheduler.run_round(work)
            except BaseException:  # Ctrl+C on the main thread: the requests fail, work() stops
                self.scheduler.abandon(work)
                raise
            finally:
                self._free_since = time.monotonic()

    def _next_round(self) -> Round | None:
        """The scheduler's next round; :data:`_IDLE` when the idle job is due; None once closed
        and drained. Waits, with the queue's lock, until one of those."""
        queue = self.queue
        with queue.cond:
            while True:
                while not self._busy() and not queue.closed and not self._idle_job_due():
                    queue.cond.wait(self._until_idle_job())
                queue.purge()  # cancelled requests leave the queue
                if self._busy():
                    return self.scheduler.next_round(queue, self._free_since)
                if queue.closed:
                    return None
                if self._idle_job_due():
                    return _IDLE

    def _busy(self) -> bool:
        """Requests are queued, or running in a step-level batch."""
        return bool(self.queue) or self.scheduler.running

    def _idle_job_due(self) -> bool:
        """``on_idle`` is set, the worker has been free ``idle_s`` and has not run it for
        ``idle_every_s``."""
        now, hooks = time.monotonic(), self.hooks
        return (
            hooks.on_idle is not None
            and now - self._free_since >= hooks.idle_s
            and now - self._idle_done >= hooks.idle_every_s
        )

    def _until_idle_job(self) -> float | None:
        """Seconds until the idle job may be due (None: never, wait for a request)."""
        if self.hooks.on_idle is None:
            return None
        due = max(self._free_since + self.hooks.idle_s, self._idle_done + self.hooks.idle_every_s)
        return max(due - time.monotonic(), 0.01)

    def _run_idle_job(self) -> None:
        try:
            self._run_hook(self.hooks.on_idle)
        finally:
            self._idle_done = time.monotonic()

    def _run_hook(self, job: Callable[[], object] | None) -> None:
        """``job()`` on the worker, when set; an error is logged and the worker goes on."""
        try:
            if job is not None:
                job()
        except Exception as err:  # the worker goes on
            log.warning("the worker's job between batches failed: %s", err)


_IDLE = Round()  # the worker's round when nothing is queued and the idle job is due
