"""Dynamic batching: concurrent requests merged into token-bounded batches, run on one thread.

Two ways, by key. Where ``stepper(key)`` gives a :class:`~aiayn.serve.stepping.Stepper` (the
PyTorch backend's translations), requests are batched step by step: they join the key's
running batch between its steps, within ``max_batch_cost``, and each is answered the step its
last input ends; a request whose future is cancelled (time limit, client gone) leaves at the
next step. The worker runs in rounds: the waiting requests join their running batches (or the
oldest starts one), the oldest single job or request of another key runs, then every running
batch takes one step (aiayn/serve/stepping.py). Joins are grouped: each is an encoder pass and
a copy of the batch's cross-attention state, whatever the number of requests joining, so the
requests waiting for a running batch join it together once their inputs reach
``join_fraction`` (an eighth) of the batch's, or their tokens fill it, or the oldest has waited
``join_steps`` (2) of its steps. A batch that is empty (an idle server) takes a request at
once. Every other key is batched at batch boundaries, as follows.

A request is a list of inputs (for example the texts of one ``/v1/translate`` call), its cost
(their tokens) and a key (what must be equal for two requests to share a batch: the decoding
settings). The worker takes the oldest request and holds a window open for others with the same
key. The batch starts as soon as

- it is full (``max_batch_cost``), or
- as many new requests have come in the window as the last batch held (its clients are back), or
- nothing has happened for ``wait_s`` (5 ms by default): no request has come and the HTTP layer
  has handed no answer out (:meth:`DynamicBatcher.answered`), or
- ``max_wait_s`` (100 ms) has passed since the window opened.

It then runs all of them as one call of ``run(key, inputs)`` whose cost stays within
``max_batch_cost`` (a request costlier than that runs alone), and hands each request its own slice
of the outputs. Requests with other keys wait their turn, in arrival order. This is the "dynamic
batching" of TorchServe and Triton; it pays off because one batched decoding of n sentences costs
far less than n decodings of one (docs/serving.md has the figures).

A window opens at the later of its first request's arrival and the end of the previous batch.
The clients that batch answered come back over the next tens of milliseconds: the HTTP layer
writes their answers one after the other, then reads their next requests one after the other.
A window that had already passed while the batch ran, or that ended at the first pause in
arrivals, split closed-loop clients into groups that never merged again (64 clients: batches of
about 46 and 18 in turn with a fixed 5 ms window; docs/serving.md); with these rules they make
one batch of 64. Requests that waited through the last batch are not counted as "back", or two
groups of clients could take turns for ever, each in half-size batches.

One worker runs everything the model does (batches and single jobs such as a generation), so
torch never runs two things at once and each gets all intra-op threads. It is the batcher's own
thread, or (``thread=False``) whichever thread calls :meth:`DynamicBatcher.work`.

Bounds: at most ``max_queue`` inputs wait (:class:`QueueFull` beyond, the server's 503; a
request larger than the whole queue is :class:`TooLarge` at once, the server's 422); a
request cancelled before its batch starts (its time limit passed) is dropped from the queue. A
batch-boundary batch that has started runs to its end (its result is discarded for a cancelled
request); a step-level one drops cancelled requests between steps.

``merge=False`` runs every request alone, in arrival order, through ``run`` (no stepper): the
baseline the benchmark compares with. The outputs are the same either way whenever ``run`` treats each input independently of the
others in its batch (aiayn's translation and classification do; tested).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from aiayn.serve.stepping import Member, Running, Stepper

log = logging.getLogger(__name__)

__all__ = ["BatchResult", "DynamicBatcher", "QueueFull", "Stopping", "TooLarge"]


class Stopping(Exception):
    """The server is stopping: the request was dropped from the queue, or its batch cut short."""

    def __init__(self) -> None:
        super().__init__("the server is stopping; retry on another server or later")


class QueueFull(Exception):
    """More inputs are waiting than the queue holds; try again after ``retry_after`` seconds."""

    def __init__(self, waiting: int, retry_after: int = 1) -> None:
        super().__init__(f"the server is busy ({waiting} inputs waiting); retry later")
        self.retry_after = retry_after


class TooLarge(Exception):
    """A request of more inputs than the whole queue holds: it could never be queued, so
    waiting would not help (the server's 422, not a 503)."""

    def __init__(self, size: int, max_queue: int) -> None:
        super().__init__(
            f"{size} inputs in one request can never fit this server's queue of {max_queue}; "
            "send fewer per request"
        )


@dataclass
class BatchResult:
    """What a request gets back: its own outputs, and how it was served."""

    outputs: list[Any]
    queue_s: float  # from arrival to the start of its batch
    compute_s: float  # the batch's run time (shared with the other requests in it)
    batch_requests: int  # requests merged into the batch
    batch_inputs: int  # inputs in the batch, all requests together


@dataclass
class _Request:
    key: Hashable | None  # None: a single job (``inputs`` is a callable), never merged
    inputs: Any
    cost: int
    future: Future = field(default_factory=Future)
    arrived: float = field(default_factory=time.monotonic)
    # the running batch that first kept it waiting, and that batch's step count then
    held: tuple[Running, int] | None = None


class DynamicBatcher:
    """Merge concurrent requests with equal keys into batches and run them on one thread.

    ``run(key, inputs) -> outputs`` (one output per input, in order) is called on the worker
    thread. ``submit`` and ``call`` return :class:`concurrent.futures.Future` objects; cancel one
    to drop a request that has not started.
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
    ) -> None:
        max_wait_s = max(wait_s, 0.1) if max_wait_s is None else max_wait_s
        if max_batch_cost < 1 or max_queue < 1 or wait_s < 0 or max_wait_s < wait_s:
            raise ValueError("max_batch_cost and max_queue must be >= 1, 0 <= wait_s <= max_wait_s")
        self.run, self.max_batch_cost, self.wait_s = run, max_batch_cost, wait_s
        self.max_wait_s = max_wait_s
        self.max_queue, self.merge = max_queue, merge
        # Step-level batching: a new Stepper for a key, or None for a key batched at batch
        # boundaries (``run``); unused without ``merge``.
        self.stepper = stepper if merge else None
        # Admission into a running step-level batch (module docstring): waiting requests join
        # once their inputs reach ``join_fraction`` of the batch's, or the oldest has waited
        # ``join_steps`` of its steps (0: at once, whatever the fraction); an empty batch takes
        # them at once.
        if join_fraction < 0 or join_steps < 0:
            raise ValueError("join_fraction and join_steps must be >= 0")
        self.join_fraction, self.join_steps = join_fraction, join_steps
        self.joins = 0  # joins into running step-level batches (a new batch's first included)
        self._running: dict[Hashable, Running] = {}  # by key; touched by the worker alone
        # keys asked of ``stepper``: False (batched at boundaries), True, or the stepper it made
        # when asked, for the first batch of that key
        self._step_keys: dict[Hashable, bool | Stepper] = {}
        self._stop_running = False  # close(drop=True): the running requests fail at once
        self.batches = 0  # batches started (single jobs included; not step-level ones)
        self.steps = 0  # steps of step-level batches
        self.step_requests = 0  # requests in those steps, summed (/ steps: requests per step)
        # When the worker last became free: a window opens no earlier, so the clients answered
        # by the last batch have the time to send their next requests.
        self._free_since = time.monotonic()
        self._answered = 0.0  # when the HTTP layer last handed an answer out
        # A job run on the worker when it has been free ``idle_s`` seconds, at most once every
        # ``idle_every_s`` (`aiayn serve`: choose torch's threads again for the load then).
        self.on_idle: Callable[[], object] | None = None
        self.idle_s, self.idle_every_s = 1.0, 60.0
        # A job run on the worker before each batch (`aiayn serve`: choose the threads again
        # under steady traffic, when the worker is never idle; it spaces its own runs).
        self.between_batches: Callable[[], object] | None = None
        self._idle_done = time.monotonic()
        self._last_requests = 0  # requests merged into the last batch
        self.requests = 0  # requests started in them
        self._queue: deque[_Request] = deque()
        self._waiting = 0  # inputs in the queue
        self._cond = threading.Condition()
        self._closed = False
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
        return self._put(_Request(key, list(inputs), max(cost, 1)))

    def call(self, job: Callable[[], Any]) -> Future:
        """Queue ``job()`` to run alone on the worker thread (a generation, an attention map);
        the future's result is what it returns."""
        return self._put(_Request(None, job, 1))

    def answered(self) -> None:
        """The HTTP layer is handing an answer out: a window open now stays open ``wait_s``
        longer, since that answer's client may come back with its next request."""
        self._answered = time.monotonic()

    def _put(self, request: _Request) -> Future:
        size = len(request.inputs) if request.key is not None else 1
        if size > self.max_queue:
            raise TooLarge(size, self.max_queue)
        with self._cond:
            if self._closed:
                raise Stopping()
            self._purge()
            if self._waiting + size > self.max_queue:
                raise QueueFull(self._waiting)
            self._queue.append(request)
            self._waiting += size
            self._cond.notify()
        return request.future

    @property
    def waiting(self) -> int:
        """Inputs queued and not yet started (cancelled requests not counted)."""
        with self._cond:
            self._purge()
            return self._waiting

    def _purge(self) -> None:
        """Drop cancelled requests from the queue (the lock is held)."""
        if any(r.future.cancelled() for r in self._queue):
            for r in self._queue:
                if r.future.cancelled():
                    self._drop(r)
            self._queue = deque(r for r in self._queue if not r.future.cancelled())

    def close(self, timeout: float = 5.0, drop: bool = False) -> None:
        """Stop after the queued requests (``drop``: at once, the queued requests failing with
        :class:`Stopping`); wait up to ``timeout`` seconds for the worker."""
        with self._cond:
            self._closed = True
            if drop:
                for r in self._queue:
                    if not r.future.done():
                        r.future.set_exception(Stopping())
                self._queue.clear()
                self._waiting = 0
                self._stop_running = True
            self._cond.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    # ---- the worker's side ---------------------------------------------------------------

    def work(self) -> None:
        """Run batches until :meth:`close` and the queue is drained: on the batcher's own thread,
        or, made with ``thread=False``, on the caller's. `aiayn serve` runs it on the process's
        main thread: torch's OpenMP threads start a parallel region there several times faster
        than from any other thread (2 threads, a 64 × 256 by 256 × 256 product: 28 µs on the
        main thread, 88 µs on another, 50 µs with 1 thread; docs/serving.md)."""
        while True:
            with self._cond:
                while not self._busy() and not self._closed and not self._idle_job_due():
                    self._cond.wait(self._until_idle_job())
                self._purge()  # cancelled requests leave the queue
                if not self._busy() and self._closed:
                    return  # closed and drained
                if not self._busy() and not self._idle_job_due():
                    continue
                idle, batch, joins = not self._busy(), [], []
                if self._running or self._starts_stepper():
                    joins = self._take_joining()
                    batch = self._take_other()
                elif not idle:
                    self._wait_window(self._queue[0])
                    batch = self._take()
            if idle:  # out of the lock: requests may queue meanwhile
                self._run_idle_job()
                continue
            self._round(batch, joins)

    def _busy(self) -> bool:
        """Requests are queued, or running in a step-level batch."""
        return bool(self._queue or self._running)

    def _round(self, batch: list[_Request], joins: list[tuple[Running, list[_Request]]]) -> None:
        """Out of the lock: requests join their running batches (or start one), then the batch
        or single job that was next in arrival order, then one step of every running batch."""
        try:
            self._run_hook(self.between_batches)  # threads follow the load (at most every 30 s)
            for running, requests in joins:
                self.requests += running.join(requests)
                self._running[running.key] = running
            if batch:
                self._execute(batch)
            for running in list(self._running.values()):
                self._step(running)
        except BaseException:  # Ctrl+C on the main thread: the requests fail, the worker stops
            self._fail_running(Stopping())
            for _, requests in joins:  # those that were joining when it came
                for r in requests:
                    if not r.future.done() and r.future.set_running_or_notify_cancel():
                        r.future.set_exception(Stopping())
            raise
        finally:
            self._free_since = time.monotonic()

    def _starts_stepper(self) -> bool:
        """The oldest live request is of a key batched step by step (the lock is held)."""
        self._purge()
        return bool(self._queue) and self._steps(self._queue[0].key)

    def _steps(self, key: Hashable | None) -> bool:
        """Whether requests of ``key`` are batched step by step (asked once per key)."""
        if self.stepper is None or key is None:
            return False
        if key not in self._step_keys:
            if len(self._step_keys) > 1000:
                self._step_keys.clear()
            try:
                stepper = self.stepper(key)
            except Exception as err:  # batched at boundaries: ``run`` says what is wrong
                log.debug("no stepper for %r: %s", key, err)
                stepper = None
            self._step_keys[key] = False if stepper is None else stepper  # kept for its use
        return self._step_keys[key] is not False

    def _take_joining(self) -> list[tuple[Running, list[_Request]]]:
        """Remove the queued requests that join a running step-level batch now, in arrival order
        as long as its cost budget allows (one costlier than the budget joins an empty batch
        alone: those after it wait with it), and those that start one when the oldest request
        is of a key not running (the lock is held)."""
        self._purge()
        joins = []
        batches = list(self._running.values())
        head = self._queue[0].key if self._queue else None
        if head is not None and head not in self._running and self._steps(head):
            kept = self._step_keys[head]  # made by _steps(), unused yet: True once used
            stepper = kept if not isinstance(kept, bool) else self.stepper(head)  # type: ignore[misc]
            self._step_keys[head] = True
            if stepper is not None:
                batches.append(Running(head, stepper))
        for running in batches:
            key = running.key
            if not self._admits(running, [r for r in self._queue if r.key == key]):
                continue
            room = self.max_batch_cost - running.cost
            taken: list[_Request] = []
            keep: deque[_Request] = deque()
            full = False  # a request that did not fit: none after it joins (arrival order)
            for r in self._queue:
                fits = r.cost <= room or not (taken or len(running))
                if r.key == key and fits and not full:
                    taken.append(r)
                    room -= r.cost
                    self._drop(r)
                else:
                    full = full or r.key == key
                    keep.append(r)
            self._queue = keep
            if taken:
                joins.append((running, taken))
                self.joins += 1
        return joins

    def _admits(self, running: Running, waiting: list[_Request]) -> bool:
        """Whether the requests ``waiting`` for a running batch of their key join it now: the
        batch is empty, or their inputs reach ``join_fraction`` of the batch's, or their tokens
        fill it, or the oldest has been kept waiting ``join_steps`` of its steps. Each join is
        an encoder pass and a copy of the batch's cross-attention state, so joins are grouped,
        as a batch-boundary window groups requests; a request to an idle server starts at once."""
        if not waiting or not len(running):
            return bool(waiting)
        inputs = sum(len(r.inputs) for r in waiting)
        if inputs >= self.join_fraction * running.inputs:
            return True
        if sum(r.cost for r in waiting) >= self.max_batch_cost - running.cost:
            return True
        for r in waiting:
            if r.held is None or r.held[0] is not running:
                r.held = (running, running.steps)
        return running.steps - min(r.held[1] for r in waiting if r.held) >= self.join_steps

    def _take_other(self) -> list[_Request]:
        """The oldest request when it is a single job or of a key batched at batch boundaries:
        that batch (the lock is held). Step-level batches are running: no window is held."""
        self._purge()
        if not self._queue or self._steps(self._queue[0].key):
            return []
        return self._take()

    def _step(self, running: Running) -> None:
        """One step of a running batch; it ends when no request is left in it."""
        if self._stop_running:
            running.fail(Stopping())
        try:
            requests = len(running)
            going = running.step(self._result) if requests else False
            if requests:
                self.steps += 1
                self.step_requests += requests
        except Exception as err:  # handed to its requests, the worker goes on
            log.debug("step failed: %s", err, exc_info=True)
            running.fail(err)
            going = False
        if not going:
            self._running.pop(running.key, None)

    def _result(self, outputs: list[Any], member: Member) -> BatchResult:
        """What a request of a step-level batch gets: queue time until it joined, compute time
        from then to its last output, the most requests it ran steps with."""
        now, r = time.monotonic(), member.request
        return BatchResult(
            outputs, member.joined - r.arrived, now - member.joined, member.shared,
            member.shared_inputs,
        )  # fmt: skip

    def _fail_running(self, err: BaseException) -> None:
        for running in self._running.values():
            running.fail(err)
        self._running.clear()

    def _idle_job_due(self) -> bool:
        """``on_idle`` is set, the worker has been free ``idle_s`` and has not run it for
        ``idle_every_s``."""
        now = time.monotonic()
        return (
            self.on_idle is not None
            and now - self._free_since >= self.idle_s
            and now - self._idle_done >= self.idle_every_s
        )

    def _until_idle_job(self) -> float | None:
        """Seconds until the idle job may be due (None: never, wait for a request)."""
        if self.on_idle is None:
            return None
        due = max(self._free_since + self.idle_s, self._idle_done + self.idle_every_s)
        return max(due - time.monotonic(), 0.01)

    def _run_idle_job(self) -> None:
        try:
            self._run_hook(self.on_idle)
        finally:
            self._idle_done = time.monotonic()

    def _run_hook(self, job: Callable[[], object] | None) -> None:
        """``job()`` on the worker, when set; an error is logged and the worker goes on."""
        try:
            if job is not None:
                job()
        except Exception as err:  # the worker goes on
            log.warning("the worker's job between batches failed: %s", err)

    def _wait_window(self, first: _Request) -> None:
        """Hold the lock-owning worker until ``first``'s window closes (module docstring)."""
        if not self.merge or first.key is None:
            return
        # Opened at the later of its arrival and the end of the last batch: a request that
        # waited through a batch would otherwise start the next one at once, with only the
        # requests that came during that batch (module docstring).
        opened = max(first.arrived, self._free_since)
        deadline = opened + self.max_wait_s
        while not self._closed:
            same = [r for r in self._queue if r.key == first.key]
            if sum(r.cost for r in same) >= self.max_batch_cost:
                return
            # As many new requests as the last batch answered: its clients are back (requests
            # that waited through that batch are not counted, or two groups of clients would
            # take turns for ever, each in half-size batches).
            fresh = sum(1 for r in same if r.arrived >= opened)
            if self._last_requests and fresh >= self._last_requests:
                return
            # The quiet gap runs from the latest request to come, or answer to leave, in the
            # window; until one has, the window waits for the clients the last batch answered.
            # (The HTTP layer writes a batch's answers one after the other before it reads the
            # next requests: arrivals pause while it writes, answers do not.)
            came = [t for t in (*(r.arrived for r in same), self._answered) if t >= opened]
            end = min(max(came) + self.wait_s, deadline) if came else deadline
            left = end - time.monotonic()
            if left <= 0:
                return
            self._cond.wait(left)

    def _take(self) -> list[_Request]:
        """Remove the oldest live request and, when merging, the later ones with its key that fit
        in the batch's cost; cancelled requests are dropped on the way."""
        while self._queue and self._queue[0].future.cancelled():
            self._drop(self._queue.popleft())
        if not self._queue:
            return []
        first = self._queue.popleft()
        self._drop(first)
        batch, cost = [first], first.cost
        if self.merge and first.key is not None:
            keep: deque[_Request] = deque()
            for r in self._queue:
                if r.future.cancelled():
                    self._drop(r)
                elif r.key == first.key and cost + r.cost <= self.max_batch_cost:
                    batch.append(r)
                    cost += r.cost
                    self._drop(r)
                else:
                    keep.append(r)
            self._queue = keep
        return batch

    def _drop(self, r: _Request) -> None:
        self._waiting -= len(r.inputs) if r.key is not None else 1

    def _execute(self, batch: list[_Request]) -> None:
        live = [r for r in batch if r.future.set_running_or_notify_cancel()]
        if not live:
            return
        self.batches += 1
        self.requests += len(live)
        if live[0].key is not None:
            self._last_requests = len(live)
        start = time.monotonic()
        try:
            if live[0].key is None:
                live[0].future.set_result(live[0].inputs())
            else:
                self._run_batch(live, start)
        except Exception as err:  # handed to every waiting request, the worker goes on
            log.debug("batch failed: %s", err, exc_info=True)
            for r in live:
                if not r.future.done():
                    r.future.set_exception(err)
        except BaseException:  # Ctrl+C on the main thread: the requests fail, the worker stops
            for r in live:
                if not r.future.done():
                    r.future.set_exception(Stopping())
            raise

    def _run_batch(self, live: list[_Request], start: float) -> None:
        inputs = [x for r in live for x in r.inputs]
        outputs = list(self.run(live[0].key, inputs))
        if len(outputs) != len(inputs):
            raise RuntimeError(f"the batch gave {len(outputs)} outputs for {len(inputs)} inputs")
        compute = time.monotonic() - start
        at = 0
        for r in live:
            n = len(r.inputs)
            r.future.set_result(
                BatchResult(
                    outputs[at : at + n], start - r.arrived, compute, len(live), len(inputs)
                )
            )
            at += n
