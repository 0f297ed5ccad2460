"""Step-level batching in the server's worker (aiayn/serve/stepping.py, DynamicBatcher with a
``stepper``): requests join a running batch between steps, each is answered the step its last
input ends, cancelled ones leave at the next step, single jobs and other keys run between steps;
and through a model folder, the translations are those of one request at a time.

The batcher tests use a stepper whose inputs are the number of steps they take, and whose steps
the test lets through one at a time.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from serve_helpers import make_folder, sentences
from trainutil import thread_fixture

from aiayn.folder import load_model_folder
from aiayn.serve import Limits
from aiayn.serve.batching import DynamicBatcher, Stopping, WorkerHooks
from aiayn.serve.service import ModelService

one_thread_module = thread_fixture(autouse=True, scope="module", name="one_thread_module")


class Gated:
    """Input n ends after n steps; each step logs the ids it runs, then waits for the test."""

    def __init__(self, log: list) -> None:
        self.left: dict[int, int] = {}
        self.next_id = 0
        self.log = log  # per step: the ids it ran
        self.dropped: list[int] = []
        self.gate = threading.Semaphore(0)

    @property
    def active(self) -> int:
        return len(self.left)

    def add(self, inputs):
        ids = list(range(self.next_id, self.next_id + len(inputs)))
        self.next_id += len(inputs)
        self.left.update(zip(ids, inputs))
        return ids

    def step(self):
        self.log.append(sorted(self.left))
        assert self.gate.acquire(timeout=10), "the test let no step through"
        self.left = {i: n - 1 for i, n in self.left.items()}
        ended = [i for i, n in self.left.items() if n == 0]
        for i in ended:
            del self.left[i]
        return {i: "ended" for i in ended}

    def drop(self, ids):
        self.dropped += ids
        for i in ids:
            self.left.pop(i, None)


def until(condition, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def stepped(log, kinds=None, **kw):
    """A batcher whose key "s" runs step by step on Gated steppers (or those of the classes
    ``kinds`` yields; others: echo batches), and a list of the steppers it made."""
    steppers: list[Gated] = []

    def stepper(key):
        if key != "s":
            return None
        steppers.append(next(kinds, Gated)(log) if kinds else Gated(log))
        return steppers[-1]

    def run(key, inputs):
        log.append((key, list(inputs)))
        return [f"{key}:{x}" for x in inputs]

    return DynamicBatcher(run, wait_s=0.0, stepper=stepper, **kw), steppers


def submitted_together(batcher, *requests):
    """Submit (key, inputs, cost) requests while the worker is held, so that they start together."""
    hold = threading.Event()
    held = batcher.call(hold.wait)
    futures = [batcher.submit(*r) for r in requests]
    hold.set()
    held.result(5)
    return futures


def test_requests_join_between_steps_and_are_answered_when_their_inputs_end():
    log: list = []
    batcher, steppers = stepped(log)
    a = batcher.submit("s", [3], cost=1)
    until(lambda: len(log) == 1)  # step 1 runs a alone (and waits)
    b = batcher.submit("s", [1, 2], cost=2)  # joins the running batch
    job = batcher.call(lambda: "job")  # runs between steps, in arrival order
    other = batcher.submit("k", ["x"], cost=1)  # another key: batched at its turn
    steppers[0].gate.release()
    until(lambda: len(log) == 2)
    assert job.result(5) == "job" and not other.done()
    steppers[0].gate.release()  # b's first input ends: b is not answered yet
    until(lambda: len(log) == 4)
    assert other.result(5).outputs == ["k:x"] and not b.done() and not a.done()
    steppers[0].gate.release()  # a ends (3 steps), and b's 2-step input
    assert a.result(5).outputs == ["ended"] and b.result(5).outputs == ["ended", "ended"]
    assert log == [[0], [0, 1, 2], ("k", ["x"]), [0, 2]]
    assert b.result().batch_requests == 2 and b.result().batch_inputs == 3
    assert len(steppers) == 1 and batcher.stats.steps == 3 and batcher.stats.requests == 4  # job, other
    batcher.close()


def test_a_request_leaves_before_the_batch_ends():
    log: list = []
    batcher, steppers = stepped(log)
    long, short = submitted_together(batcher, ("s", [5], 1), ("s", [1], 1))
    until(lambda: len(log) == 1)
    steppers[0].gate.release()
    assert short.result(5).outputs == ["ended"] and not long.done()
    for _ in range(4):
        steppers[0].gate.release()
    assert long.result(5).outputs == ["ended"]
    assert log == [[0, 1], [0], [0], [0], [0]]
    batcher.close()


def test_a_cancelled_request_is_dropped_from_the_running_batch_at_the_next_step():
    log: list = []
    batcher, steppers = stepped(log)
    keep, gone = submitted_together(batcher, ("s", [3], 1), ("s", [9, 9], 2))
    until(lambda: len(log) == 1)
    assert gone.cancel()  # the time limit passed, or the client went away: still cancellable
    for _ in range(3):
        steppers[0].gate.release()
    assert keep.result(5).outputs == ["ended"]
    assert steppers[0].dropped == [1, 2] and log == [[0, 1, 2], [0], [0]]
    batcher.close()


def test_the_token_budget_bounds_a_running_batch():
    log: list = []
    batcher, steppers = stepped(log, max_batch_cost=3)
    first = submitted_together(batcher, ("s", [1], 2), ("s", [1], 2))
    until(lambda: len(log) == 1)
    assert log == [[0]]  # cost 2 + 2 > 3: the second waits
    steppers[0].gate.release()
    assert first[0].result(5).outputs == ["ended"]
    until(lambda: len(steppers) == 2)  # the batch ended: the second starts the next one
    steppers[1].gate.release()
    assert first[1].result(5).outputs == ["ended"] and log == [[0], [0]]
    batcher.close()


R = list(range(8))  # the ids of the running request's 8 inputs


@pytest.mark.parametrize(
    "fraction, join_steps, want, joins",
    [
        (0.25, 0, [R, [*R, 8], [*R, 9], R, R], 3),  # join_steps 0: at every step, b then c
        (0.25, 10, [R, R, [*R, 8, 9], R, R], 2),  # b alone is below 2 inputs, b + c not
        (0.5, 2, [R, R, R, [*R, 8, 9], R], 2),  # below 4 inputs: b waits 2 steps, c with it
    ],
)
def test_waiting_requests_join_together_at_a_fraction_of_the_batch_or_after_join_steps(
    fraction, join_steps, want, joins
):
    """A request of 8 inputs runs; b (1 input) comes after its first step, c (1) after its
    second."""
    log: list = []
    batcher, steppers = stepped(log, join_fraction=fraction, join_steps=join_steps)
    running = batcher.submit("s", [5] * 8, cost=8)
    until(lambda: len(log) == 1)
    b = batcher.submit("s", [1], cost=1)
    steppers[0].gate.release()
    until(lambda: len(log) == 2)
    c = batcher.submit("s", [1], cost=1)
    for _ in range(4):
        steppers[0].gate.release()
    assert [f.result(5).outputs for f in (running, b, c)] == [["ended"] * 8, ["ended"], ["ended"]]
    assert log == want and batcher.stats.joins == joins  # the first request's included
    batcher.close()


def test_waiting_requests_that_fill_the_batchs_budget_join_at_once():
    log: list = []
    batcher, steppers = stepped(log, join_fraction=100.0, join_steps=100, max_batch_cost=10)
    running = batcher.submit("s", [2], cost=8)
    until(lambda: len(log) == 1)
    full = batcher.submit("s", [1], cost=2)  # one input, but the tokens left in the budget
    steppers[0].gate.release()
    until(lambda: len(log) == 2)
    steppers[0].gate.release()
    assert running.result(5).outputs == ["ended"] and full.result(5).outputs == ["ended"]
    assert log == [[0], [0, 1]]
    batcher.close()


def test_a_request_to_an_idle_server_starts_at_once_whatever_the_admission_policy():
    log: list = []
    batcher, steppers = stepped(log, join_fraction=100.0, join_steps=100)
    first = batcher.submit("s", [1], cost=1)
    until(lambda: len(log) == 1)
    steppers[0].gate.release()
    assert first.result(5).outputs == ["ended"]
    second = batcher.submit("s", [1], cost=1)  # the batch has emptied: a new one, at once
    until(lambda: len(steppers) == 2 and len(log) == 2)
    steppers[1].gate.release()
    assert second.result(5).outputs == ["ended"]
    with pytest.raises(ValueError, match="join_fraction"):
        DynamicBatcher(lambda key, inputs: inputs, join_fraction=-1, thread=False)
    batcher.close()


class Failing(Gated):
    def step(self):
        raise ZeroDivisionError("a step failed")


def test_a_request_too_large_for_the_room_left_is_not_overtaken_by_smaller_ones():
    log: list = []
    batcher, steppers = stepped(log, max_batch_cost=4)
    running = batcher.submit("s", [3], cost=2)
    until(lambda: len(log) == 1)
    large, small = batcher.submit("s", [1], cost=4), batcher.submit("s", [1], cost=1)
    for _ in range(3):
        steppers[0].gate.release()
    assert running.result(5).outputs == ["ended"]
    until(lambda: len(steppers) == 2)  # the batch emptied: the large one starts the next
    assert not small.done()  # it fitted, but came after large
    steppers[1].gate.release()
    assert large.result(5).outputs == ["ended"]
    until(lambda: len(steppers) == 3)  # large filled the budget: small runs after it
    steppers[2].gate.release()
    assert small.result(5).outputs == ["ended"] and len(log) == 5
    batcher.close()


def test_a_failing_step_fails_its_requests_and_the_worker_goes_on():
    log: list = []
    batcher, steppers = stepped(log, kinds=iter([Failing]))
    with pytest.raises(ZeroDivisionError):
        batcher.submit("s", [1], cost=1).result(5)
    good = batcher.submit("s", [1], cost=1)
    until(lambda: len(steppers) == 2)
    steppers[1].gate.release()
    assert good.result(5).outputs == ["ended"]
    batcher.close()


def test_stopping_fails_the_running_requests_at_once():
    log: list = []
    batcher, steppers = stepped(log)
    running = batcher.submit("s", [50], cost=1)
    until(lambda: len(log) == 1)
    batcher.close(timeout=0.1, drop=True)
    steppers[0].gate.release()
    with pytest.raises(Stopping):
        running.result(5)


class Open(Gated):
    """Gated, with every step let through."""

    def __init__(self, log: list) -> None:
        super().__init__(log)
        self.gate = threading.Semaphore(1000)


def test_ctrl_c_in_a_round_fails_the_running_and_joining_requests_and_stops_the_worker():
    """Ctrl+C on the main thread (`aiayn serve` runs the worker there) during a round: the
    requests running and those taken to join fail with Stopping at once, and work() raises."""
    log: list = []
    late: list = []
    rounds = iter(range(100))

    def between_rounds() -> None:
        n = next(rounds)
        if n == 1:  # queued during the second round: taken to join in the third
            late.append(batcher.submit("s", [9], cost=1))
        if n == 2:
            raise KeyboardInterrupt

    hooks = WorkerHooks(between_rounds=between_rounds)
    batcher, steppers = stepped(log, kinds=iter([Open]), thread=False, hooks=hooks)
    running = [batcher.submit("s", [9], cost=1), batcher.submit("s", [9, 9], cost=2)]
    with pytest.raises(KeyboardInterrupt):
        batcher.work()
    assert log == [[0, 1, 2], [0, 1, 2]] and len(late) == 1  # two steps, then Ctrl+C
    for future in [*running, *late]:
        with pytest.raises(Stopping):
            future.result(0)


def test_a_key_whose_stepper_cannot_be_made_is_batched_at_boundaries():
    """A stepper that refuses its key (a setting the model cannot decode with) leaves the key
    to ``run``, whose error the requests get; the worker goes on."""
    calls: list = []

    def stepper(key):
        raise ValueError("no such setting")

    def run(key, inputs):
        calls.append(inputs)
        if key == "bad":
            raise ValueError("no such setting")
        return inputs

    batcher = DynamicBatcher(run, wait_s=0.0, stepper=stepper)
    with pytest.raises(ValueError, match="no such setting"):
        batcher.submit("bad", ["a"], cost=1).result(5)
    assert batcher.submit("good", ["b"], cost=1).result(5).outputs == ["b"]
    batcher.close()
    assert calls == [["a"], ["b"]]


def test_without_merging_every_request_runs_alone_and_no_stepper_is_made():
    log: list = []
    batcher, steppers = stepped(log, merge=False)
    futures = [batcher.submit("s", [i], cost=1) for i in range(3)]
    assert [f.result(5).outputs for f in futures] == [["s:0"], ["s:1"], ["s:2"]]
    assert log == [("s", [0]), ("s", [1]), ("s", [2])] and not steppers
    batcher.close()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = make_folder(
        tmp_path_factory.mktemp("steps") / "m",
        decode={"beam": 3, "alpha": 0.6, "max_len_a": 1.0, "max_len_b": 3},
    )
    return load_model_folder([path])


@pytest.mark.parametrize("beam, nbest", [(1, 1), (3, 2)])
def test_translations_joining_a_running_batch_equal_one_request_at_a_time(folder, beam, nbest):
    """Requests of 1-3 texts sent by 6 threads at once join each other's running decoding at
    whatever step; each answer is the one `translate_hypotheses` gives for its texts alone."""
    service = ModelService(folder, Limits())
    decode = service.checks.decode_config(beam, None, nbest)
    requests = [sentences(1 + i % 3, 300 + i) for i in range(18)]
    with ThreadPoolExecutor(6) as pool:
        futures = list(pool.map(lambda texts: service.translate(texts, decode), requests))
        answers = [f.result(60).outputs for f in futures]
    steps = service.batcher.stats.steps
    service.close()
    assert steps > 0 and service.batcher.stats.batches == 0  # step by step, no batch
    for texts, answer in zip(requests, answers):
        alone = folder.translate_hypotheses(texts, decode)
        assert [[h["text"] for h in nbest] for nbest in answer] == [
            [text for text, _ in line] for line in alone
        ]
        got = [h["score"] for nbest in answer for h in nbest]
        assert got == pytest.approx([h.score for line in alone for _, h in line], abs=1e-5)


def test_no_step_batching_batches_translations_at_boundaries_with_the_same_answers(folder):
    """`aiayn serve --batching whole`: the same requests run as boundary batches (no decoder
    step is counted) and get the answers step-level batching gives."""
    requests = [sentences(1 + i % 3, 400 + i) for i in range(6)]
    answers = []
    for step_batching in (True, False):
        service = ModelService(folder, Limits(step_batching=step_batching))
        decode = service.checks.decode_config(3, None, 2)
        with ThreadPoolExecutor(3) as pool:
            futures = list(pool.map(lambda texts: service.translate(texts, decode), requests))
            answers.append([[[h["text"] for h in n] for n in f.result(60).outputs] for f in futures])
        steps = service.batcher.stats.steps
        service.close()
        assert (steps > 0) is step_batching
    assert answers[0] == answers[1]


def test_a_translation_whose_client_went_away_stops_decoding_at_the_next_step(folder):
    """Cancelling the future (what the HTTP layer does at the time limit, or when the client is
    gone) takes the request's rows out of the running decoding at the next step: the steps
    stop long before its 25 forced tokens."""
    service = ModelService(folder, Limits())
    decode = dataclasses.replace(service.checks.decode_config(2, None, None), min_len=25, max_len_b=30)
    future = service.translate(["a b c"], decode)
    until(lambda: service.batcher.stats.steps >= 1)
    hold = threading.Event()
    held = service.batcher.call(hold.wait)  # runs between two steps, and holds the worker
    until(held.running)
    assert future.cancel()
    hold.set()
    until(lambda: not service.batcher.scheduler.running)
    steps = service.batcher.stats.steps
    service.close()
    assert steps < 25 and future.cancelled()


def test_the_server_shortens_the_gil_switch_interval_while_it_serves():
    """The HTTP thread gets the GIL back from the stepping worker within 0.5 ms (not Python's
    5 ms) while `aiayn serve` runs; the interval is restored after."""
    import sys

    from aiayn.serve.lanes import SWITCH_INTERVAL_S, run_on_main_thread

    batcher = DynamicBatcher(lambda key, inputs: list(inputs), wait_s=0.0, thread=False)
    seen: list = []

    class Server:  # uvicorn.Server's part that run_on_main_thread uses
        started = should_exit = False

        def run(self):
            self.started = True
            seen.append(sys.getswitchinterval())

    before = sys.getswitchinterval()
    assert run_on_main_thread(Server(), batcher) == 0
    assert seen == [SWITCH_INTERVAL_S] and SWITCH_INTERVAL_S < before
    assert sys.getswitchinterval() == before
