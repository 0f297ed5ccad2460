"""aiayn.threads: the governor keeps the faster thread setting, re-probes, and never overrides a
thread count the user set; the load-based choice counts the cores other processes keep busy at
normal priority (/proc/stat), not niced work."""

from __future__ import annotations

import pytest
from trainutil import FakeProcStat

import aiayn.threads as threads
from aiayn.threads import ThreadGovernor, busy_cores, threads_for_load


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


@pytest.fixture
def machine(monkeypatch):
    """A 2-core machine (not pinned, torch on 2 threads) whose /proc/stat the test sets: this
    process runs nothing meanwhile, and the probe finds 2 threads faster."""
    monkeypatch.delenv("AIAYN_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "cores", lambda: 2)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 2)  # all the machine's cores: not pinned
    monkeypatch.setattr(threads.torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(threads, "_own_ticks", lambda: 0.0)
    monkeypatch.setattr(threads, "probe", lambda settings: {2: 0.01, 1: 0.015})

    def stat(cpus: int = 2, busy: int = 0, niced: int = 0) -> FakeProcStat:
        fake = FakeProcStat(cpus, busy, niced)
        monkeypatch.setattr(threads, "_read_stat", fake)
        return fake

    return stat


def test_niced_work_leaves_every_core_to_aiayn(machine):
    """Issue 66, point 10: with the only other work at nice 19, every command chose 1 thread of 2
    ("the machine is busy with other work") and ran at half speed."""
    machine(niced=1)
    assert busy_cores(0) == 0
    assert threads_for_load(apply=False) == 2
    machine(niced=2)
    assert threads_for_load(apply=False) == 2


def test_work_at_normal_priority_takes_its_cores(machine):
    machine(busy=1)
    assert busy_cores(0) == 1
    assert threads_for_load(apply=False) == 1
    machine(busy=1, niced=1)
    assert threads_for_load(apply=False) == 1
    machine(cpus=4, busy=3)
    assert busy_cores(0) == 3


def test_an_idle_machine_gets_every_core(machine):
    machine()
    assert busy_cores(0) == 0
    assert threads_for_load(apply=False) == 2


def test_a_passing_kernel_thread_is_no_busy_core(machine, monkeypatch):
    """A kworker running 2 ticks of the 20 of a window is a tenth of a core: no busy core."""
    machine()
    reads = iter(["cpu  200 0 100 2000 0 0 0 0\ncpu0 100 0 50 1000 0 0 0 0\n"
                  "cpu1 100 0 50 1000 0 0 0 0\n",
                  "cpu  200 0 102 2018 0 0 0 0\ncpu0 100 0 52 1008 0 0 0 0\n"
                  "cpu1 100 0 50 1010 0 0 0 0\n"])
    monkeypatch.setattr(threads, "_read_stat", lambda: next(reads))
    assert busy_cores(0) == 0


def test_this_process_own_work_is_not_another_process(machine, monkeypatch):
    """A server's own threads (its HTTP thread, another lane) keep a core busy: not a reason to
    lower its own count. One core's 10 ticks of the window were this process's."""
    machine(busy=1)
    own = iter([0.0, 10.0])
    monkeypatch.setattr(threads, "_own_ticks", lambda: next(own))
    assert busy_cores(0) == 0


def test_the_probe_still_decides_and_unread_stat_counts_nothing(machine, monkeypatch):
    machine()
    monkeypatch.setattr(threads, "probe", lambda settings: {2: 0.05, 1: 0.015})  # bursty load
    assert threads_for_load(apply=False) == 1
    monkeypatch.setattr(threads, "_read_stat", lambda: "")  # no /proc (not Linux)
    assert busy_cores(0) == 0
    monkeypatch.setattr(threads, "_read_stat", lambda: "cpu0 1 2 x\n")
    assert busy_cores(0) == 0


def test_a_niced_process_leaves_its_own_time_out(monkeypatch):
    """Run at nice 10 (as on a shared machine), this process's time is in /proc/stat's nice
    column, which busy time leaves out: none of it is taken off the others'."""
    monkeypatch.setattr(threads.os, "nice", lambda n: 10)
    assert threads._own_ticks() == 0.0
    monkeypatch.setattr(threads.os, "nice", lambda n: 0)
    assert threads._own_ticks() > 0


def test_busy_cores_reads_this_machine():
    """The real /proc/stat (where there is one): a whole number of cores, within the machine's."""
    assert 0 <= busy_cores(0.05) <= (threads.os.cpu_count() or 1)


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


def test_a_pinned_process_lets_the_probe_decide(machine, monkeypatch):
    """Pinned to 2 of 16 cores on a busy host: the machine-wide busy time is not about its cores,
    so it does not force 1 thread; the probe decides."""
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 16)
    machine(cpus=16, busy=12)  # other jobs on the other cores
    monkeypatch.setattr(threads, "probe", lambda settings: {2: 0.01, 1: 0.02})
    assert threads_for_load(apply=False) == 2
    monkeypatch.setattr(threads, "probe", lambda settings: {2: 0.05, 1: 0.02})
    assert threads_for_load(apply=False) == 1
