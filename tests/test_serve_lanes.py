"""`aiayn serve --lanes N`: N processes on one port (aiayn/serve/lanes.py). Every lane answers
as one server does; the lanes share the connections; lanes stop with the first one, even when
it is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

sys.path.insert(0, str(Path(__file__).parent))
from serve_helpers import free_port, make_folder, sentences  # noqa: E402

from aiayn.serve.lanes import can_share_port, default_lanes, server_threads  # noqa: E402
from aiayn.threads import cores  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(not can_share_port(), reason="lanes share a port on Linux only")


def test_one_lane_per_core_on_a_cpu_and_one_on_a_gpu():
    assert default_lanes(2, "cpu") == 2
    assert default_lanes(1, "cpu") == 1
    assert default_lanes(8, "cuda") == 1


def test_a_server_counts_its_cores_not_those_idle_at_its_start(monkeypatch):
    """What one-off commands use (threads_for_load: 1 thread on a busy machine) does not cut a
    server's lanes for its life; the threads the user sets do choose them."""
    for name in ("AIAYN_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # as threads_for_load leaves it when another job is running
        assert server_threads("cpu") == cores()
        monkeypatch.setenv("AIAYN_THREADS", "3")
        assert server_threads("cpu") == 3
        assert server_threads("cuda") == 1  # torch's count
    finally:
        torch.set_num_threads(before)


def start(folder: Path, port: int, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AIAYN_THREADS": "2"}
    return subprocess.Popen(
        [sys.executable, "-m", "aiayn", "serve", str(folder), "--port", str(port), *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_ready(process: subprocess.Popen, url: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the server exited: {process.stdout.read()}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError("the server did not start")


def port_closed(port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
        except httpx.HTTPError:
            return True
        time.sleep(0.2)
    return False


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return make_folder(tmp_path_factory.mktemp("lanes") / "model")


def test_two_lanes_share_the_port_and_answer_as_one_server(folder):
    import aiayn

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start(folder, port, "--lanes", "2")
    try:
        wait_ready(server, url)
        lanes, counts = set(), set()
        for _ in range(16):  # a connection of its own each: the kernel picks a lane for each
            with httpx.Client(base_url=url, timeout=30) as client:
                health = client.get("/health").json()
                lanes.add(health["lane"])
                counts.add(health["lanes"])
        assert lanes == {0, 1}  # both processes took connections (all 16 on one: 2 in 2^16)
        assert counts == {2}  # each says how many there are (a client sums their counters)
        texts, answers = sentences(6, 5), {}
        for text in texts:
            with httpx.Client(base_url=url, timeout=60) as client:
                got = client.post("/v1/translate", json={"texts": [text], "beam": 1})
                assert got.status_code == 200, got.text
                answers[text] = got.json()["translations"][0]["text"]
        alone = aiayn.load(folder)
        for text in texts:  # the same as one at a time, in this process
            assert answers[text] == alone.translate([text], beam=1)[0]
    finally:
        server.send_signal(signal.SIGTERM)
        out, _ = server.communicate(timeout=30)
    assert server.returncode == 0, out
    assert port_closed(port, 5)  # the second lane stopped with the first


def test_the_other_lanes_stop_when_the_first_is_killed(folder):
    port = free_port()
    server = start(folder, port, "--lanes", "2")
    try:
        wait_ready(server, f"http://127.0.0.1:{port}")
    finally:
        server.kill()  # SIGKILL: no chance to stop the others
        server.communicate(timeout=30)
    assert port_closed(port, 20)


def test_lanes_below_one_is_one_line(folder, capsys):
    from aiayn.cli import main

    assert main(["serve", str(folder), "--lanes", "0", "--port", str(free_port())]) == 2
    err = capsys.readouterr().err
    assert "--lanes must be >= 1" in err and "Traceback" not in err


def test_lanes_beyond_the_threads_are_one_line_before_any_starts(folder, capsys, monkeypatch):
    """`serve --lanes 1000` on 2 cores started hundreds of processes (issue 66, finding 15):
    more lanes than the threads the server may use are refused in one line, none started."""
    from aiayn.cli import main
    from aiayn.errors import ConfigError
    from aiayn.serve.lanes import lane_plan

    assert lane_plan(2, 2, "cpu") == (2, 1)
    with pytest.raises(ConfigError, match=r"--lanes 1000: at most 2 here"):
        lane_plan(1000, 2, "cpu")
    started = []
    monkeypatch.setattr("aiayn.serve.lanes.Lanes.start", lambda self: started.append(self))
    monkeypatch.setenv("AIAYN_THREADS", "2")
    assert main(["serve", str(folder), "--lanes", "1000", "--port", str(free_port())]) == 2
    err = capsys.readouterr().err
    assert err.startswith("aiayn: error: --lanes 1000: at most 2 here") and err.count("\n") == 1
    assert started == []
