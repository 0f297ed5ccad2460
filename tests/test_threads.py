"""aiayn.threads: the governor keeps the faster thread setting, re-probes, and never overrides a
thread count the user set; the load-based choice counts other processes' runnable tasks."""

from __future__ import annotations

import aiayn.threads as threads
from aiayn.threads import ThreadGovernor, threads_for_load


def drive(governor: ThreadGovernor, speed: dict[int, float], updates: int) -> list[int]:
    """Feed ``updates`` updates of 1000 tokens taking 1000 / speed[threads] seconds each."""
    used = []
    for _ in range(updates):
        used.append(governor.current)
        governor.record(1000.0, 1000.0 / speed[governor.current])
    return used


def test_governor_keeps_the_faster_setting(monkeypatch):
    monkeypatch.delenv("AIAYN_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    calls = []
    gov = ThreadGovernor(threads=2, first=5, every=50, window=3, set_threads=calls.append)
    used = drive(gov, {2: 6300.0, 1: 12900.0}, 200)  # one busy process: 1 thread is faster
    assert gov.choices[0] == 1 and used[-1] == 1
    share = used[30:].count(1) / len(used[30:])
    assert share > 0.9, share  # only the probes' N-thread updates run with 2
    gov = ThreadGovernor(threads=2, first=5, every=50, window=3, set_threads=calls.append)
    used = drive(gov, {2: 18100.0, 1: 11000.0}, 2000)  # idle: 2 threads are faster
    assert set(gov.choices) == {2} and used[-1] == 2
    assert used.count(1) / len(used) < 0.03  # the probes cost little when idle
    assert gov.every == gov.max_every  # spaced out while the choice holds


def test_governor_follows_a_change_of_load(monkeypatch):
    monkeypatch.delenv("AIAYN_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    gov = ThreadGovernor(threads=2, first=5, every=40, max_every=80, window=3,
                         set_threads=lambda n: None)
    drive(gov, {2: 18000.0, 1: 11000.0}, 300)
    assert gov.choices[-1] == 2
    used = drive(gov, {2: 6000.0, 1: 12000.0}, 300)  # another process started
    assert gov.choices[-1] == 1 and used[-50:].count(1) > 40


def test_user_threads_win(monkeypatch):
    monkeypatch.setenv("AIAYN_THREADS", "2")
    calls = []
    gov = ThreadGovernor(threads=2, first=1, set_threads=calls.append)
    drive(gov, {2: 1.0, 1: 100.0}, 100)
    assert not gov.active and calls == []
    monkeypatch.delenv("AIAYN_THREADS")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert threads.user_threads() == 1


def test_threads_for_load_counts_other_processes(monkeypatch):
    monkeypatch.delenv("AIAYN_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "cores", lambda: 2)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 2)  # all the machine's cores: not pinned
    monkeypatch.setattr(threads.torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(threads, "_running", lambda: 2)  # this process and one other
    assert threads_for_load(apply=False) == 1
    monkeypatch.setattr(threads, "_running", lambda: 1)  # only this process: the probe decides
    monkeypatch.setattr(threads, "probe", lambda settings: {2: 0.01, 1: 0.015})
    assert threads_for_load(apply=False) == 2
    monkeypatch.setattr(threads, "probe", lambda settings: {2: 0.05, 1: 0.015})  # bursty load
    assert threads_for_load(apply=False) == 1
    monkeypatch.setattr(threads, "_running", lambda: 9)
    assert threads_for_load(apply=False) == 1


def test_the_trials_cost_little(monkeypatch):
    """Measured on the loaded 2-core machine: 2 threads ran at 323 tokens/s, 1 thread at 3,346
    (a trial of the slow setting is expensive); idle, 18.1k against 12.9k."""
    monkeypatch.delenv("AIAYN_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    for speed, start in (({2: 323.0, 1: 3346.0}, 1), ({2: 18100.0, 1: 12900.0}, 2)):
        gov = ThreadGovernor(threads=2, set_threads=lambda n: None)
        gov.current = start  # as threads_for_load chose it
        used = drive(gov, speed, 3000)
        seconds = sum(1000.0 / speed[n] for n in used)
        best = 3000 * 1000.0 / max(speed.values())
        assert best / seconds > 0.95, (speed, best / seconds)


def test_probe_times_each_setting():
    times = threads.probe((2, 1), rounds=1, reps=2)
    assert set(times) == {1, 2} and all(0 < t < 5 for t in times.values())


def test_a_pinned_process_lets_the_probe_decide(monkeypatch):
    """Pinned to 2 of 16 cores on a busy host: the machine-wide count of runnable tasks is not
    about its cores, so it does not force 1 thread; the probe decides."""
    monkeypatch.delenv("AIAYN_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "cores", lambda: 2)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 16)
    monkeypatch.setattr(threads.torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(threads, "_running", lambda: 12)  # other jobs on the other cores
    monkeypatch.setattr(threads, "probe", lambda settings: {2: 0.01, 1: 0.02})
    assert threads_for_load(apply=False) == 2
    monkeypatch.setattr(threads, "probe", lambda settings: {2: 0.05, 1: 0.02})
    assert threads_for_load(apply=False) == 1
