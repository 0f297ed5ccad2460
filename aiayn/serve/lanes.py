"""Serving on every core: `aiayn serve` as one process per decoding lane, all on one port.

A decoding step of a small model is mostly Python, and Python runs one thread at a time: two
batches stepped side by side on threads of one process took turns and served no more than one
batch on two threads (docs/experiments/decoding_speed.md). Lanes are processes instead, the way
uvicorn's and gunicorn's workers are. Each lane loads the model folder itself, holds its own
request queue, its own batch (step-level or whole) and its share of the cores (``threads``
each), and listens on the same port: the kernel spreads the connections over the lanes'
sockets (``SO_REUSEPORT``, Linux), so that no process has to relay the requests. Every lane
answers exactly as a single server would: the same model, the same decoding, and a batch's
outputs do not depend on what else is in it.

The first lane is the command's own process; it starts the others after its model has loaded
(a bad folder is one error, not one per lane), waits until each listens, and only then listens
itself. A lane whose parent is gone (killed at the worst moment) stops on its own: it watches a
pipe that the parent holds open.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from aiayn.errors import ConfigError
from aiayn.threads import cores, user_threads

if TYPE_CHECKING:
    from aiayn.serve.batching import DynamicBatcher

log = logging.getLogger(__name__)

__all__ = [
    "LaneSpec",
    "Lanes",
    "SWITCH_INTERVAL_S",
    "can_share_port",
    "default_lanes",
    "lane_plan",
    "serve_forever",
    "listening_socket",
    "run_on_main_thread",
    "watch_parent",
]

# How long the first lane waits for the others to load their model and listen.
START_TIMEOUT_S = 600.0


def can_share_port() -> bool:
    """Whether several processes can listen on one port with the kernel spreading connections
    over them (``SO_REUSEPORT`` on Linux; macOS has the option but gives every connection to
    the last socket)."""
    return sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")


def server_threads(device: str) -> int:
    """The threads a server shares among its lanes: on the CPU the cores this process may run on,
    or the threads the user set (``AIAYN_THREADS``, ``OMP_NUM_THREADS``); elsewhere torch's count.
    Not the cores idle at this instant (:func:`aiayn.threads.threads_for_load`, what a one-off
    command uses): a server lives long, and a moment's load at its start would cut it to fewer
    lanes for its whole life (seen: a server started as another stopped took 1 lane of 2 cores)."""
    if device != "cpu":
        return torch.get_num_threads()
    return user_threads() or cores()


def default_lanes(threads: int, device: str) -> int:
    """Lanes when the user chose none: one per thread the server may use (``threads``: the cores
    it may run on, or the threads the user set), each then decoding on one thread; 1 on a GPU
    (one device, one process) or where the port cannot be shared."""
    if device != "cpu" or not can_share_port():
        return 1
    return max(1, threads)


def listening_socket(host: str, port: int, share: bool) -> socket.socket:
    """A TCP socket bound to ``host:port`` and listening; with ``share`` other lanes' sockets
    may listen on the same port (``SO_REUSEPORT``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # as uvicorn binds
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if share:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(False)
    return sock


def lane_plan(asked: int | None, threads: int, device: str) -> tuple[int, int]:
    """(lanes, threads per lane): ``asked`` (``--lanes``) or :func:`default_lanes`, sharing
    ``threads``; ConfigError for a count below 1, above ``threads`` (each lane is a process with
    its own copy of the model and at least one thread: more lanes than threads only compete for
    the cores), or above 1 where the port cannot be shared."""
    lanes = default_lanes(threads, device) if asked is None else asked
    if lanes < 1:
        raise ConfigError(f"--lanes must be >= 1, got {lanes}")
    if lanes > threads:
        raise ConfigError(
            f"--lanes {lanes}: at most {threads} here, one per thread the server may use (the "
            "cores it may run on, or AIAYN_THREADS)"
        )
    if lanes > 1 and not can_share_port():
        raise ConfigError("--lanes above 1 needs Linux (processes sharing the port)")
    return lanes, max(1, threads // lanes)


def serve_forever(app: Any, host: str, port: int, sock: socket.socket) -> int:
    """Serve ``app`` (its service's batcher on this, the main, thread) on ``sock`` until Ctrl+C,
    SIGTERM or uvicorn stops (:func:`run_on_main_thread`)."""
    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=3)
    )
    # What is loaded now lives as long as the server: gc.freeze() takes it out of the collector's
    # sight, so that a full collection no longer walks it (a pause of the HTTP layer that split
    # batches; docs/design/serving.md#step-level-batching-pytorch).
    gc.collect()
    gc.freeze()
    return run_on_main_thread(server, app.state.service.batcher, sock)


@dataclass(frozen=True)
class LaneSpec:
    """What a lane process needs to serve as the first one does (picklable)."""

    models: list[str]
    engine: str | None
    device: str
    host: str
    port: int
    threads: int  # torch's intra-op threads in this lane
    limits: dict[str, Any]
    api_key: str | None
    log_level: int
    lanes: int = 1  # how many the server runs


class Lanes:
    """The lanes besides the first (this process): started with :meth:`start`, which returns
    once each listens (ConfigError with the first one's error otherwise); :meth:`stop` ends
    them."""

    def __init__(self, spec: LaneSpec, count: int, target: Callable[..., None]) -> None:
        """``target(spec, lane, report, alive)`` is a lane's body (aiayn.serve.app.serve_lane):
        it sends "ready" or its error on ``report``, and stops once ``alive`` closes
        (:func:`watch_parent`)."""
        self.spec, self.count, self.target = spec, count, target
        self.processes: list[Any] = []
        self._keep: list[Any] = []  # the parent's ends of the lanes' "parent alive" pipes

    def start(self) -> None:
        if self.count < 1:
            return
        ctx = multiprocessing.get_context("spawn")  # no fork: torch's OpenMP threads
        reports = []
        for lane in range(1, self.count + 1):
            report_r, report_w = ctx.Pipe(duplex=False)
            alive_r, alive_w = ctx.Pipe(duplex=False)
            process = ctx.Process(
                target=self.target,
                args=(self.spec, lane, report_w, alive_r),
                name=f"aiayn-lane-{lane}",
                daemon=True,
            )
            process.start()
            report_w.close()
            alive_r.close()
            self.processes.append(process)
            self._keep.append(alive_w)
            reports.append(report_r)
        for lane, (report, process) in enumerate(zip(reports, self.processes), 1):
            message = _read_report(report, process)
            if message != "ready":
                self.stop()
                raise ConfigError(f"serving lane {lane} did not start: {message}")
        log.info("%d more lane(s) listening (processes %s)", self.count,
                 ", ".join(str(p.pid) for p in self.processes))  # fmt: skip

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM to every lane (each drops what it has queued, as Ctrl+C does), then wait."""
        for process in self.processes:
            if process.is_alive() and process.pid is not None:
                try:
                    os.kill(process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for process in self.processes:
            process.join(timeout)
            if process.is_alive():
                process.kill()
        for end in self._keep:
            end.close()
        self._keep.clear()


def _read_report(report: Any, process: Any) -> str:
    """The lane's first message ("ready" or its error), or why none came."""
    if not report.poll(START_TIMEOUT_S):
        return f"no answer in {START_TIMEOUT_S:.0f} s"
    try:
        return str(report.recv())
    except EOFError:
        process.join(5)
        return f"it exited (code {process.exitcode})"


def watch_parent(alive: Any) -> None:
    """SIGTERM to this lane once the parent's end of ``alive`` closes (the parent is gone)."""
    try:
        alive.recv()
    except (EOFError, OSError):
        pass
    os.kill(os.getpid(), signal.SIGTERM)


# How long a thread may hold the GIL while another waits for it (Python's default: 5 ms). The
# model's worker now runs step after step while the HTTP thread reads requests and writes
# answers between them; at 5 ms that thread waited on the worker's Python and fewer requests
# were in the running batch (64 / 128 one-sentence clients:
# docs/design/serving.md#step-level-batching-pytorch).
SWITCH_INTERVAL_S = 0.0005


def run_on_main_thread(
    server: Any, batcher: DynamicBatcher, sock: socket.socket | None = None
) -> int:
    """uvicorn on a thread of its own, the model on the main thread (``batcher.work()``: torch
    starts its parallel regions several times faster there,
    docs/design/serving.md#step-level-batching-pytorch) until Ctrl+C or
    SIGTERM, or until uvicorn stops; 1 when uvicorn could not start. ``sock``: the listening
    socket to serve on (a lane's, :func:`listening_socket`; default: uvicorn binds its own). ``server`` is a
    ``uvicorn.Server`` (its ``run()``, ``started`` and ``should_exit``)."""

    def http() -> None:
        try:
            server.run() if sock is None else server.run(sockets=[sock])
        finally:
            batcher.close()  # work() returns once the queue is drained

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    thread = threading.Thread(target=http, name="aiayn-http", daemon=True)
    thread.start()
    try:
        batcher.work()
    except KeyboardInterrupt:
        log.info("stopping")
    finally:
        signal.signal(signal.SIGTERM, previous)
        sys.setswitchinterval(switch)
        server.should_exit = True
        batcher.close(drop=True)  # the requests still queued get a 503 at once
        thread.join(10)
    if not server.started:
        log.error("the HTTP server did not start (see above)")
        return 1
    return 0
