"""What the server's worker runs next: schedulers over the request queue.

The worker (:class:`~aiayn.serve.batching.DynamicBatcher`) runs in rounds. Each round it asks
its scheduler, with the queue's lock held, for the next :class:`Round`
(:meth:`Scheduler.next_round`), then runs that round without the lock
(:meth:`Scheduler.run_round`). Two schedulers implement the interface:

- :class:`WholeBatches`, batching at batch boundaries: the oldest request and the later ones
  with its key that fit ``max_batch_cost`` run as one call of ``run(key, inputs)`` once its
  window closes (below). Used for every key that cannot be stepped (classification, ONNX and
  CTranslate2 translations, translations with alignments) and for every key when step-level
  batching is off.
- :class:`StepLevel`, step-level batching: where ``stepper(key)`` gives a
  :class:`~aiayn.serve.stepping.Stepper` (the PyTorch backend's translations), requests join
  the key's running batch between its decoder steps, within ``max_batch_cost``, and each is
  answered the step its last input ends; a cancelled request leaves at the next step. Each
  round the waiting requests join their running batches (or the oldest starts one), the oldest
  single job or request of another key runs (through :class:`WholeBatches`, with no window:
  step-level batches are running), then every running batch takes one step
  (aiayn/serve/stepping.py). Joins are grouped: each is an encoder pass and a copy of the
  batch's cross-attention state, whatever the number of requests joining, so the requests
  waiting for a running batch join it together once their inputs reach ``join_fraction`` (an
  eighth) of the batch's, or their tokens fill it, or the oldest has waited ``join_steps`` (2)
  of its steps. A batch that is empty (an idle server) takes a request at once.

The window of a batch-boundary batch. The scheduler takes the oldest request and holds a window
open for others with the same key. The batch starts as soon as

- it is full (``max_batch_cost``), or
- as many new requests have come in the window as the last batch held (its clients are back), or
- nothing has happened for ``wait_s`` (5 ms by default): no request has come and the HTTP layer
  has handed no answer out (:meth:`Scheduler.answered`), or
- ``max_wait_s`` (100 ms) has passed since the window opened.

It then runs all of them as one call of ``run(key, inputs)`` whose cost stays within
``max_batch_cost`` (a request costlier than that runs alone), and hands each request its own
slice of the outputs. Requests with other keys wait their turn, in arrival order. This is the
"dynamic batching" of TorchServe and Triton; it pays off because one batched decoding of n
sentences costs far less than n decodings of one (docs/serving.md has the figures).

A window opens at the later of its first request's arrival and the end of the previous round.
The clients that batch answered come back over the next tens of milliseconds: the HTTP layer
writes their answers one after the other, then reads their next requests one after the other.
A window that had already passed while the batch ran, or that ended at the first pause in
arrivals, split closed-loop clients into groups that never merged again (64 clients: two uneven
batches in turn with a fixed 5 ms window; docs/design/serving.md#step-level-batching-pytorch);
with these rules they make
one batch of 64. Requests that waited through the last batch are not counted as "back", or two
groups of clients could take turns for ever, each in half-size batches.

A batch-boundary batch that has started runs to its end (its result is discarded for a
cancelled request); a step-level one drops cancelled requests between steps. ``merge=False``
runs every request alone, in arrival order: the baseline the benchmark compares with.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiayn.serve.queue import BatchResult, Request, RequestQueue, Stopping
from aiayn.serve.stepping import Member, Running, Stepper

log = logging.getLogger(__name__)

__all__ = ["Round", "Scheduler", "Stats", "StepLevel", "WholeBatches", "stopped"]


@dataclass
class Stats:
    """What the worker has run, for /health and the benchmarks."""

    batches: int = 0  # batches started (single jobs included; not step-level ones)
    requests: int = 0  # requests started in them, and requests that joined step-level batches
    steps: int = 0  # steps of step-level batches
    step_requests: int = 0  # requests in those steps, summed (/ steps: requests per step)
    joins: int = 0  # joins into running step-level batches (a new batch's first included)


@dataclass
class Round:
    """One round of the worker: requests joining running batches, and a batch (or one single
    job) to run whole."""

    batch: list[Request] = field(default_factory=list)
    joins: list[tuple[Running, list[Request]]] = field(default_factory=list)


class Scheduler(Protocol):
    """Chooses each round's work from the queue and runs it."""

    stats: Stats

    @property
    def running(self) -> bool:
        """Work is in progress outside the queue (a step-level batch)."""
        ...

    def next_round(self, queue: RequestQueue, free_since: float) -> Round:
        """Take the next round's requests from ``queue`` (its lock held; may wait on its
        condition). ``free_since``: when the worker last became free."""
        ...

    def run_round(self, work: Round) -> None:
        """Run ``work`` (the lock not held): every request it took is answered or failed."""
        ...

    def answered(self) -> None:
        """The HTTP layer is handing an answer out (its client may come back soon)."""
        ...

    def stop(self) -> None:
        """The requests running fail with :class:`Stopping` at their next step."""
        ...

    def abandon(self, work: Round) -> None:
        """The worker stops inside ``work`` (Ctrl+C on the main thread): its requests and the
        running ones fail with :class:`Stopping`."""
        ...


def stopped(request: Request) -> None:
    """``request`` fails with :class:`Stopping` unless it is answered (or cancelled)."""
    if not request.future.done():
        request.future.set_exception(Stopping())


class WholeBatches:
    """Batching at batch boundaries: one call of ``run(key, inputs) -> outputs`` (one output per
    input, in order) per batch, after its window (module docstring)."""

    running = False  # nothing runs between rounds

    def __init__(
        self,
        run: Callable[[Hashable, list[Any]], Sequence[Any]],
        max_batch_cost: int,
        wait_s: float,
        max_wait_s: float,
        merge: bool,
        stats: Stats,
    ) -> None:
        self.run, self.max_batch_cost, self.merge, self.stats = run, max_batch_cost, merge, stats
        self.wait_s, self.max_wait_s = wait_s, max_wait_s
        self._last_requests = 0  # requests merged into the last batch
        self._answered = 0.0  # when the HTTP layer last handed an answer out

    def answered(self) -> None:
        self._answered = time.monotonic()

    def stop(self) -> None:
        """A batch that has started runs to its end."""

    def next_round(self, queue: RequestQueue, free_since: float) -> Round:
        if queue:
            self._wait_window(queue, queue.head, free_since)
        return Round(batch=self.take(queue))

    def run_round(self, work: Round) -> None:
        self.execute(work.batch)

    def abandon(self, work: Round) -> None:
        for r in work.batch:
            stopped(r)

    def take(self, queue: RequestQueue) -> list[Request]:
        """Remove the oldest live request and, when merging, the later ones with its key that
        fit in the batch's cost (the lock is held)."""
        first: Request | None = None
        cost = 0

        def choose(r: Request) -> bool:
            nonlocal first, cost
            if first is None:
                first, cost = r, r.cost
                return True
            fits = cost + r.cost <= self.max_batch_cost
            if self.merge and first.key is not None and r.key == first.key and fits:
                cost += r.cost
                return True
            return False

        return queue.take(choose)

    def _wait_window(self, queue: RequestQueue, first: Request, free_since: float) -> None:
        """Wait on the queue's condition until ``first``'s window closes (module docstring)."""
        if not self.merge or first.key is None:
            return
        # Opened at the later of its arrival and the end of the last round: a request that
        # waited through a batch would otherwise start the next one at once, with only the
        # requests that came during that batch (module docstring).
        opened = max(first.arrived, free_since)
        deadline = opened + self.max_wait_s
        while not queue.closed:
            same = [r for r in queue if r.key == first.key]
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
            queue.cond.wait(left)

    def execute(self, batch: list[Request]) -> None:
        """Run ``batch`` (a batch of one key, or one single job) and answer its requests."""
        live = [r for r in batch if r.future.set_running_or_notify_cancel()]
        if not live:
            return
        self.stats.batches += 1
        self.stats.requests += len(live)
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

    def _run_batch(self, live: list[Request], start: float) -> None:
        inputs = [x for r in live for x in r.inputs]
        outputs = list(self.run(live[0].key, inputs))
        if len(outputs) != len(inputs):
            raise RuntimeError(f"the batch gave {len(outputs)} outputs for {len(inputs)} inputs")
        compute = time.monotonic() - start
        at = 0
        for r in live:
            n = len(r.inputs)
            result = BatchResult(
                outputs[at : at + n], start - r.arrived, compute, len(live), len(inputs)
            )
            r.future.set_result(result)
            at += n


class StepLevel:
    """Step-level batching for the keys that ``stepper(key)`` gives a Stepper for (None: that
    key is batched whole, by ``whole``); admission into running batches as the module docstring
    says (``join_steps`` 0: at every step, whatever ``join_fraction``)."""

    def __init__(
        self,
        whole: WholeBatches,
        stepper: Callable[[Hashable], Stepper | None],
        join_fraction: float = 0.125,
        join_steps: int = 2,
    ) -> None:
        self.whole, self.stepper, self.stats = whole, stepper, whole.stats
        self.max_batch_cost = whole.max_batch_cost
        self.join_fraction, self.join_steps = join_fraction, join_steps
        self._running: dict[Hashable, Running] = {}  # by key; touched by the worker alone
        # keys asked of ``stepper``: False (batched whole), True, or the stepper it made when
        # asked, for the first batch of that key
        self._step_keys: dict[Hashable, bool | Stepper] = {}
        self._stop = False  # stop(): the running requests fail at their next step

    @property
    def running(self) -> bool:
        return bool(self._running)

    def answered(self) -> None:
        self.whole.answered()

    def stop(self) -> None:
        self._stop = True

    def next_round(self, queue: RequestQueue, free_since: float) -> Round:
        if not self._running and not (queue and self._steps(queue.head.key)):
            return self.whole.next_round(queue, free_since)  # nothing steps: a window
        joins = self._take_joining(queue)
        # the oldest request left, when it is a single job or of a key batched whole
        other = queue and not self._steps(queue.head.key)
        return Round(batch=self.whole.take(queue) if other else [], joins=joins)

    def run_round(self, work: Round) -> None:
        """Requests join their running batches (or start one), then the batch or single job
        that was next in arrival order runs, then every running batch takes one step."""
        for running, requests in work.joins:
            self.stats.requests += running.join(requests)
            self._running[running.key] = running
        if work.batch:
            self.whole.execute(work.batch)
        for running in list(self._running.values()):
            self._step(running)

    def abandon(self, work: Round) -> None:
        for running in self._running.values():
            running.fail(Stopping())
        self._running.clear()
        for r in [*work.batch, *(r for _, requests in work.joins for r in requests)]:
            stopped(r)

    def _steps(self, key: Hashable | None) -> bool:
        """Whether requests of ``key`` are batched step by step (asked once per key)."""
        if key is None:
            return False
        if key not in self._step_keys:
            if len(self._step_keys) > 1000:
                self._step_keys.clear()
            try:
                stepper = self.stepper(key)
            except Exception as err:  # batched whole: ``run`` says what is wrong
                log.debug("no stepper for %r: %s", key, err)
                stepper = None
            self._step_keys[key] = False if stepper is None else stepper  # kept for its use
        return self._step_keys[key] is not False

    def _take_joining(self, queue: RequestQueue) -> list[tuple[Running, list[Request]]]:
        """Remove the queued requests that join a running batch now, and those that start one
        when the oldest request is of a key not running (the lock is held)."""
        batches = list(self._running.values())
        head = queue.head.key if queue else None
        if head is not None and head not in self._running and self._steps(head):
            kept = self._step_keys[head]  # made by _steps(), unused yet: True once used
            stepper = kept if not isinstance(kept, bool) else self.stepper(head)
            self._step_keys[head] = True
            if stepper is not None:
                batches.append(Running(head, stepper))
        joins = []
        for running in batches:
            if not self._admits(running, [r for r in queue if r.key == running.key]):
                continue
            taken = queue.take(self._joining(running))
            if taken:
                joins.append((running, taken))
                self.stats.joins += 1
        return joins

    def _joining(self, running: Running) -> Callable[[Request], bool]:
        """Which requests join ``running``: those of its key in arrival order as long as its cost
        budget allows (one costlier than the budget joins an empty batch alone); none after a
        request of its key that did not fit."""
        room, taken, full = self.max_batch_cost - running.cost, 0, False

        def choose(r: Request) -> bool:
            nonlocal room, taken, full
            fits = r.cost <= room or not (taken or len(running))
            if r.key == running.key and fits and not full:
                room, taken = room - r.cost, taken + 1
                return True
            full = full or r.key == running.key
            return False

        return choose

    def _admits(self, running: Running, waiting: list[Request]) -> bool:
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

    def _step(self, running: Running) -> None:
        """One step of a running batch; it ends when no request is left in it."""
        if self._stop:
            running.fail(Stopping())
        try:
            requests = len(running)
            going = running.step(self._result) if requests else False
            if requests:
                self.stats.steps += 1
                self.stats.step_requests += requests
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
