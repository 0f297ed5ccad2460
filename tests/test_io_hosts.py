"""aiayn.io when several hosts share one file system: a writer on another host is judged by its
lease (its temporary's mtime, refreshed while it works), never by a pid this host cannot see."""

from __future__ import annotations

import os
import threading
import time

import pytest

import aiayn.io
from aiayn.io import atomic_path, new_folder, recover_folder, remove_temp_files

OTHER = "node-7.cluster"  # another host's name, as it appears in its temporaries
NO_SUCH_PID = 2**22 + 12345


def _age(path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_temporaries_record_pid_start_time_boot_and_host(tmp_path):
    names: list[str] = []
    with new_folder(tmp_path / "model") as tmp:
        names.append(tmp.name)
        with atomic_path(tmp / "config.json") as f:
            names.append(f.name)
            f.write_text("{}")
    for name in names:
        start = aiayn.io.start_time(os.getpid())
        assert f".tmp-{os.getpid()}.{start}.{aiayn.io._BOOT}@{aiayn.io._HOST}-" in name
        found = aiayn.io._TEMP.match(name)
        assert found["host"] == aiayn.io._HOST and found["pid"] == str(os.getpid())
        assert found["start"] == str(start) and found["boot"] == aiayn.io._BOOT


def test_another_hosts_writer_is_dead_only_when_its_lease_expired(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "weights").write_text("new")
    working = tmp_path / f".model.tmp-{NO_SUCH_PID}@{OTHER}-abc123"
    working.mkdir()
    half = model / f".weights.tmp-{NO_SUCH_PID}@{OTHER}-x1"
    half.write_text("half")
    recover_folder(model)  # the pid is no process here, but the leases are fresh: kept
    assert working.is_dir() and half.exists()
    _age(working, aiayn.io.LEASE_S + 5)
    _age(half, aiayn.io.LEASE_S + 5)
    recover_folder(model)
    assert not working.exists() and not half.exists()


def test_a_swap_killed_on_another_host_is_undone_after_the_lease(tmp_path):
    old = tmp_path / f".model.old-{os.getpid()}@{OTHER}-abc"  # our pid, but on another host
    old.mkdir()
    (old / "weights").write_text("old")
    recover_folder(tmp_path / "model")  # maybe between the other host's two renames: wait
    assert not (tmp_path / "model").exists() and old.exists()
    _age(old, aiayn.io.LEASE_S + 5)
    recover_folder(tmp_path / "model")
    assert (tmp_path / "model" / "weights").read_text() == "old" and not old.exists()


def test_this_hosts_and_legacy_names_are_judged_by_pid(tmp_path):
    mine = tmp_path / f".f.tmp-{os.getpid()}@{aiayn.io._HOST}-a"  # a live writer: kept
    dead = tmp_path / f".f.tmp-{NO_SUCH_PID}@{aiayn.io._HOST}-b"  # fresh, but its pid is gone
    legacy = tmp_path / f".f.tmp-{NO_SUCH_PID}-c"  # written before hosts were recorded
    for path in (mine, dead, legacy):
        path.write_text("x")
    assert remove_temp_files(tmp_path) == 2
    assert mine.exists() and not dead.exists() and not legacy.exists()


def test_a_working_writer_keeps_its_lease_fresh(tmp_path, monkeypatch):
    monkeypatch.setattr(aiayn.io, "HEARTBEAT_S", 0.02)
    with atomic_path(tmp_path / "slow.bin") as tmp:
        _age(tmp, aiayn.io.LEASE_S + 5)  # as if it had been written long ago
        deadline = time.time() + 5
        while time.time() - tmp.stat().st_mtime > 60 and time.time() < deadline:
            time.sleep(0.01)
        assert time.time() - tmp.stat().st_mtime < 60  # touched by the heartbeat
        tmp.write_bytes(b"done")
    assert (tmp_path / "slow.bin").read_bytes() == b"done"
    assert not [t for t in threading.enumerate() if t.name == "aiayn-lease"]  # stopped


@pytest.mark.parametrize("host", ["h", "gpu-node-01.example.org", "a_b"])
def test_host_names_with_dashes_and_dots_parse(host):
    m = aiayn.io._TEMP.match(f".model.safetensors.tmp-42@{host}-k3y_9z")
    assert (m["name"], m["what"], m["pid"], m["host"]) == ("model.safetensors", "tmp", "42", host)
