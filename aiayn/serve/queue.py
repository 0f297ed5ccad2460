"""The server's request queue: bounded, with admission at the door and cancellation.

Every request the HTTP layer hands to the model waits here until a scheduler
(:mod:`aiayn.serve.schedulers`) takes it. The queue holds at most ``max_queue`` inputs
(:class:`QueueFull` beyond, the server's 503; a request larger than the whole queue is
:class:`TooLarge` at once, the server's 422, since waiting would not help). A request's time
limit is its future: the HTTP layer cancels the future when the limit passes (or the client
goes), and a cancelled request leaves the queue before it is ever run. Once the queue is
closed, new requests get :class:`Stopping` (the server's 503).

One lock (:attr:`RequestQueue.cond`) guards the queue; the schedulers take requests with it
held and run them without it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiayn.serve.stepping import Running

__all__ = [
    "BatchResult",
    "QueueFull",
    "Request",
    "RequestError",
    "RequestQueue",
    "Stopping",
    "TooLarge",
]


class RequestError(Exception):
    """A request the server refuses: HTTP ``status`` and a one-line reason."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


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
class Request:
    """A list of inputs, their cost (tokens) and a key: what must be equal for two requests to
    share a batch (the decoding settings). Key None: a single job (``inputs`` is a callable),
    never merged."""

    key: Hashable | None
    inputs: Any
    cost: int
    future: Future = field(default_factory=Future)
    arrived: float = field(default_factory=time.monotonic)
    # the running batch that first kept it waiting, and that batch's step count then
    held: tuple[Running, int] | None = None

    @property
    def size(self) -> int:
        """The room it takes in the queue: its inputs (a single job: one)."""
        return len(self.inputs) if self.key is not None else 1


class RequestQueue:
    """Requests in arrival order, at most ``max_queue`` inputs together."""

    def __init__(self, max_queue: int) -> None:
        if max_queue < 1:
            raise ValueError("max_queue must be >= 1")
        self.max_queue = max_queue
        self.cond = threading.Condition()  # guards everything below; notified on each change
        self.closed = False
        self._requests: deque[Request] = deque()
        self._waiting = 0  # inputs in the queue

    def put(self, request: Request) -> Future:
        """Admit ``request`` (TooLarge, QueueFull or Stopping when it cannot be); its future."""
        if request.size > self.max_queue:
            raise TooLarge(request.size, self.max_queue)
        with self.cond:
            if self.closed:
                raise Stopping()
            self.purge()
            if self._waiting + request.size > self.max_queue:
                raise QueueFull(self._waiting)
            self._requests.append(request)
            self._waiting += request.size
            self.cond.notify()
        return request.future

    @property
    def waiting(self) -> int:
        """Inputs queued and not yet started (cancelled requests not counted)."""
        with self.cond:
            self.purge()
            return self._waiting

    def __bool__(self) -> bool:
        return bool(self._requests)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._requests)

    @property
    def head(self) -> Request:
        """The oldest request (the lock is held; the queue is not empty)."""
        return self._requests[0]

    def purge(self) -> None:
        """Drop cancelled requests (the lock is held)."""
        if any(r.future.cancelled() for r in self._requests):
            self.take(lambda r: False)

    def take(self, choose: Callable[[Request], bool]) -> list[Request]:
        """Remove the live requests that ``choose`` accepts, asked in arrival order, and return
        them; cancelled requests are dropped on the way, unasked (the lock is held)."""
        taken: list[Request] = []
        keep: deque[Request] = deque()
        for r in self._requests:
            if r.future.cancelled():
                self._waiting -= r.size
            elif choose(r):
                taken.append(r)
                self._waiting -= r.size
            else:
                keep.append(r)
        self._requests = keep
        return taken

    def close(self, drop: bool = False) -> None:
        """No more requests come in; ``drop``: those queued fail with :class:`Stopping` now."""
        with self.cond:
            self.closed = True
            if drop:
                for r in self._requests:
                    if not r.future.done():
                        r.future.set_exception(Stopping())
                self._requests.clear()
                self._waiting = 0
            self.cond.notify()
