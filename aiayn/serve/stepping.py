"""Step-level batching on the server's worker: requests join a running computation between its
steps and leave it the step their last input ends.

A :class:`Stepper` is that computation (for translation, a
:class:`~aiayn.decode.continuous.RunningTranslation` behind the service's text handling): inputs
are added, each ``step()`` returns the outputs of the inputs that ended in it, and inputs can be
dropped. :class:`Running` is one stepper with the requests in it, as the
:class:`~aiayn.serve.schedulers.StepLevel` scheduler drives it: a request's future resolves at
the step its last input ends, whatever the others in the batch are doing; a request whose future
was cancelled (its time limit passed, or its client went away) is dropped at the next step, and
its rows leave the batch. Futures stay pending while their requests run, so that cancelling
still works.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger(__name__)

__all__ = ["Stepper", "Running"]


class Stepper(Protocol):
    """Work that inputs join and leave between steps."""

    @property
    def active(self) -> int:
        """Inputs still running."""
        ...

    def add(self, inputs: Sequence[Any]) -> list[int]:
        """Start ``inputs``; returns an id for each."""
        ...

    def step(self) -> dict[int, Any]:
        """One step for every input; the outputs of those that ended, by id."""
        ...

    def drop(self, ids: Sequence[int]) -> None:
        """Stop inputs ``ids`` (their request is gone)."""
        ...


class Request(Protocol):
    """What the queue holds (:class:`aiayn.serve.queue.Request`): the future, inputs, cost,
    arrival time."""

    future: Future
    inputs: Any
    cost: int
    arrived: float


@dataclass
class Member:
    """A request inside a running stepper."""

    request: Request
    ids: list[int]  # its inputs' ids in the stepper
    joined: float = field(default_factory=time.monotonic)
    outputs: dict[int, Any] = field(default_factory=dict)
    shared: int = 1  # the most requests that ran a step together with it (itself included)
    shared_inputs: int = 0  # the inputs of those requests


class Running:
    """One stepper for one batch key and the requests it is running."""

    def __init__(self, key: Hashable, stepper: Stepper) -> None:
        self.key, self.stepper = key, stepper
        self.members: list[Member] = []
        self.by_id: dict[int, Member] = {}  # input id -> its request
        self.cost = 0  # the cost of the requests in it (the batcher's token budget)
        self.steps = 0  # steps run so far

    def __len__(self) -> int:
        return len(self.members)

    @property
    def inputs(self) -> int:
        """Inputs of the requests in it (ended ones included until their request leaves)."""
        return sum(len(m.request.inputs) for m in self.members)

    def join(self, requests: Sequence[Request]) -> int:
        """Add ``requests``; returns how many joined (those cancelled meanwhile do not). An
        error fails them, not the requests already running."""
        live = [r for r in requests if not r.future.cancelled()]
        if not live:
            return 0
        try:
            ids = self.stepper.add([x for r in live for x in r.inputs])
        except Exception as err:
            log.debug("joining failed: %s", err, exc_info=True)
            for r in live:
                _fail(r.future, err)
            return 0
        at = 0
        for r in live:
            member = Member(r, ids[at : at + len(r.inputs)])
            at += len(r.inputs)
            self.members.append(member)
            self.by_id.update((j, member) for j in member.ids)
            self.cost += r.cost
        return len(live)

    def step(self, result: Callable[[list[Any], Member], Any]) -> bool:
        """Drop the requests that are gone, run one step, resolve the requests it ended
        (``result(outputs, member)`` is what a future gets); False once nothing runs."""
        self.drop_gone()
        if not self.stepper.active:
            return False
        self.steps += 1
        inputs = self.inputs
        for m in self.members:
            if len(self.members) >= m.shared:
                m.shared, m.shared_inputs = len(self.members), inputs
        for j, out in self.stepper.step().items():
            member = self.by_id.pop(j)
            member.outputs[j] = out
            if len(member.outputs) == len(member.ids):
                self._leave(member)
                future = member.request.future
                if future.set_running_or_notify_cancel():
                    future.set_result(result([member.outputs[i] for i in member.ids], member))
        return self.stepper.active > 0

    def drop_gone(self) -> None:
        """Requests whose future was cancelled leave, and their inputs leave the stepper."""
        gone = [m for m in self.members if m.request.future.cancelled()]
        if not gone:
            return
        ids = [j for m in gone for j in m.ids if j in self.by_id]
        for m in gone:
            self._leave(m)
        self.stepper.drop(ids)

    def fail(self, err: BaseException) -> None:
        """Every request still running fails with ``err`` (a step failed, the server stops)."""
        for m in self.members:
            _fail(m.request.future, err)
        self.members, self.by_id, self.cost = [], {}, 0

    def _leave(self, member: Member) -> None:
        self.members.remove(member)
        for j in member.ids:
            self.by_id.pop(j, None)
        self.cost -= member.request.cost


def _fail(future: Future, err: BaseException) -> None:
    if not future.done() and future.set_running_or_notify_cancel():
        future.set_exception(err)
