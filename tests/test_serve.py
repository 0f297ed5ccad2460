"""`aiayn serve`: the HTTP API (FastAPI's TestClient), the dynamic batcher, limits and bad input.

The model folders are tiny, with random weights: their translations are arbitrary but
deterministic, which is all that equality between batched and one-at-a-time answers, response
shapes and error handling need.
"""

from __future__ import annotations

import base64
import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

pytest.importorskip("fastapi", reason="the 'serve' extra (fastapi) is not installed")
pytest.importorskip("httpx", reason="httpx (FastAPI's TestClient) is not installed")

from fastapi.testclient import TestClient  # noqa: E402
from serve_helpers import free_port, make_folder, sentences  # noqa: E402
from trainutil import thread_fixture  # noqa: E402

from aiayn.decode import DecodeConfig, translate_hypotheses  # noqa: E402
from aiayn.folder import load_model_folder as load_folder  # noqa: E402
from aiayn.serve import Limits, create_app  # noqa: E402
from aiayn.errors import ConfigError  # noqa: E402
from aiayn.serve.batching import (  # noqa: E402
    DynamicBatcher,
    QueueFull,
    Stopping,
    TooLarge,
    WorkerHooks,
)
from aiayn.viz.attention import attention_of_translation  # noqa: E402

KEY = "s3cret-key"


# Tiny models on a shared machine: threads only contend.
one_thread_module = thread_fixture(autouse=True, scope="module", name="one_thread_module")


@pytest.fixture(scope="module")
def folder_dir(tmp_path_factory) -> Path:
    # The folder's own decoding settings (beam 2, short outputs), which the server must use.
    path = make_folder(
        tmp_path_factory.mktemp("serve") / "m",
        decode={"beam": 2, "alpha": 1.0, "max_len_a": 0.0, "max_len_b": 8},
    )
    (path / "eval_test.json").write_text(json.dumps({"bleu": 12.5, "chrf": 40.1}))
    return path


@pytest.fixture(scope="module")
def folder(folder_dir):
    return load_folder([folder_dir])


@pytest.fixture(scope="module")
def client(folder):
    with TestClient(create_app(folder, Limits())) as c:
        yield c


# ---- the dynamic batcher alone ----------------------------------------------------------------


def echo(calls):
    def run(key, inputs):
        calls.append((key, list(inputs)))
        return [f"{key}:{x}" for x in inputs]

    return run


def slow_first(calls, seconds):
    """``echo``, with a first batch that takes ``seconds``."""
    fast = echo(calls)

    def run(key, inputs):
        if not calls:
            time.sleep(seconds)
        return fast(key, inputs)

    return run


def test_batcher_merges_requests_of_one_key_and_keeps_each_answer():
    calls: list = []
    batcher = DynamicBatcher(echo(calls), max_batch_cost=100, wait_s=0.2)
    futures = [batcher.submit("k", [f"a{i}", f"b{i}"], cost=2) for i in range(5)]
    futures.append(batcher.submit("other", ["z"], cost=1))
    results = [f.result(5) for f in futures]
    batcher.close()
    assert [r.outputs for r in results[:5]] == [[f"k:a{i}", f"k:b{i}"] for i in range(5)]
    assert results[5].outputs == ["other:z"]
    assert calls[0] == ("k", [x for i in range(5) for x in (f"a{i}", f"b{i}")])  # one batch
    assert calls[1] == ("other", ["z"])  # another key: its own batch
    assert results[0].batch_requests == 5 and results[0].batch_inputs == 10


def test_batcher_bounds_a_batch_by_cost_and_runs_alone_without_merge():
    calls: list = []
    batcher = DynamicBatcher(echo(calls), max_batch_cost=5, wait_s=0.2)
    futures = [batcher.submit("k", [i], cost=2) for i in range(5)]
    [f.result(5) for f in futures]
    batcher.close()
    assert [len(inputs) for _, inputs in calls] == [2, 2, 1]  # cost 2 each, at most 5 a batch
    calls.clear()
    alone = DynamicBatcher(echo(calls), wait_s=0.2, merge=False)
    futures = [alone.submit("k", [i], cost=1) for i in range(4)]
    assert [f.result(5).outputs for f in futures] == [[f"k:{i}"] for i in range(4)]
    alone.close()
    assert [inputs for _, inputs in calls] == [[0], [1], [2], [3]]


def test_batcher_window_starts_again_when_the_worker_is_free():
    """A request that waited through a batch still waits ``wait_s`` after it, so the clients the
    batch answered can join it (else closed-loop clients split into groups that never merge)."""
    calls: list = []
    run = slow_first(calls, 0.8)
    batcher = DynamicBatcher(run, max_batch_cost=100, wait_s=0.3)
    first = batcher.submit("k", ["a"], cost=1)
    time.sleep(0.35)  # the first batch is running
    during = batcher.submit("k", ["b"], cost=1)  # its own window ends before that batch does
    first.result(5)
    after = batcher.submit("k", ["c"], cost=1)  # the first batch's client comes back
    assert during.result(5).outputs == ["k:b"] and after.result(5).outputs == ["k:c"]
    batcher.close()
    assert [inputs for _, inputs in calls] == [["a"], ["b", "c"]]


def test_batcher_window_stays_open_while_requests_keep_coming_up_to_max_wait():
    """A burst whose requests come closer together than ``wait_s`` is one batch, however long
    the burst (the clients a batch answered come back one by one); ``max_wait_s`` ends it."""
    calls: list = []
    batcher = DynamicBatcher(echo(calls), max_batch_cost=1000, wait_s=0.25, max_wait_s=30)
    burst = []
    for i in range(6):  # 0.6 s in all: longer than wait_s, each gap shorter than it
        burst.append(batcher.submit("k", [i], cost=1))
        time.sleep(0.1)
    assert [f.result(5).outputs for f in burst] == [[f"k:{i}"] for i in range(6)]
    assert [inputs for _, inputs in calls] == [[0, 1, 2, 3, 4, 5]]
    batcher.close()

    calls.clear()
    capped = DynamicBatcher(echo(calls), max_batch_cost=1000, wait_s=0.25, max_wait_s=0.5)
    stream = []
    for i in range(15):  # 1.5 s of requests 0.1 s apart: the window closes after 0.5 s
        stream.append(capped.submit("k", [i], cost=1))
        time.sleep(0.1)
    [f.result(5) for f in stream]
    capped.close()
    first = calls[0][1]
    assert first[0] == 0 and 3 <= len(first) <= 10, calls  # ~0.5 s of arrivals, not all 15
    assert [x for _, inputs in calls for x in inputs] == list(range(15))


def test_batcher_window_stays_open_while_answers_are_handed_out():
    """The HTTP layer writes a batch's answers one by one before it reads the next requests:
    arrivals pause, answers do not, and each one keeps the window open ``wait_s`` longer."""
    calls: list = []
    run = slow_first(calls, 0.8)
    batcher = DynamicBatcher(run, max_batch_cost=100, wait_s=0.3, max_wait_s=30)
    first = [batcher.submit("k", [x], cost=1) for x in ("a1", "a2")]
    time.sleep(0.6)  # their batch starts 0.3 s after them and runs 0.8 s
    waiting = batcher.submit("k", ["b"], cost=1)  # waits through the first batch
    [f.result(5) for f in first]
    early = batcher.submit("k", ["c"], cost=1)  # the first client to come back
    for _ in range(6):  # 0.6 s of answers being written, no arrival
        time.sleep(0.1)
        batcher.answered()
    late = batcher.submit("k", ["d"], cost=1)  # a client whose answer was written last
    assert [f.result(5).batch_inputs for f in (waiting, early, late)] == [3, 3, 3]
    batcher.close()
    assert [inputs for _, inputs in calls] == [["a1", "a2"], ["b", "c", "d"]]


def test_batcher_window_closes_when_the_last_batchs_clients_are_back():
    """As many new requests as the last batch held close the window at once (no quiet gap);
    requests that waited through that batch do not count, so two groups of clients merge."""
    calls: list = []
    run = slow_first(calls, 0.8)
    batcher = DynamicBatcher(run, max_batch_cost=100, wait_s=1.5, max_wait_s=30)
    first = [batcher.submit("k", [x], cost=1) for x in ("a1", "a2")]
    while not calls and batcher.waiting:  # the window of a1, a2 holds for 1.5 s: ...
        time.sleep(0.01)
    time.sleep(0.1)  # ... their batch has started (as many came as the last batch: 0, none)
    waiting = batcher.submit("k", ["b"], cost=1)
    [f.result(10) for f in first]
    start = time.monotonic()
    back = [batcher.submit("k", [x], cost=1) for x in ("c1", "c2")]
    assert all(f.result(10).batch_inputs == 3 for f in (waiting, *back))
    assert time.monotonic() - start < 1.2  # not the 1.5 s quiet gap
    batcher.close()
    assert [inputs for _, inputs in calls] == [["a1", "a2"], ["b", "c1", "c2"]]


def test_batcher_lone_request_waits_wait_s_not_max_wait():
    calls: list = []
    batcher = DynamicBatcher(echo(calls), wait_s=0.01, max_wait_s=20)
    start = time.monotonic()
    assert batcher.submit("k", ["a"], cost=1).result(10).outputs == ["k:a"]
    assert time.monotonic() - start < 5  # the quiet gap after it, not max_wait_s
    batcher.close()


def test_serve_runs_the_model_on_the_main_thread_and_stops_with_the_http_server():
    """`aiayn serve` decodes on the main thread (torch's parallel regions start several times
    faster there) with uvicorn on another; when uvicorn stops, so does the worker."""
    from aiayn.serve.lanes import run_on_main_thread

    threads_seen: list = []

    def run(key, inputs):
        threads_seen.append(threading.current_thread())
        return list(inputs)

    batcher = DynamicBatcher(run, wait_s=0.0, thread=False)

    class Server:  # uvicorn.Server's part that run_on_main_thread uses
        started = should_exit = False
        answers: list = []

        def run(self):
            self.started = True
            self.answers.append(batcher.submit("k", ["x"], cost=1).result(10).outputs)

    server = Server()
    assert run_on_main_thread(server, batcher) == 0
    assert server.answers == [["x"]] and threads_seen == [threading.main_thread()]
    assert server.should_exit

    class Failed(Server):
        def run(self):  # uvicorn could not bind its port: it returns without starting
            pass

    assert run_on_main_thread(Failed(), DynamicBatcher(run, thread=False)) == 1


def test_stopping_fails_queued_requests_at_once_with_a_503(folder):
    """Ctrl+C or SIGTERM: `aiayn serve` closes its batcher with drop=True; the requests still
    queued, and any that come after, fail at once with one line (503), not after their timeout."""
    release = threading.Event()
    batcher = DynamicBatcher(echo([]), wait_s=0.0)
    blocker = batcher.call(release.wait)  # holds the worker
    time.sleep(0.05)
    queued = batcher.submit("k", ["a"], cost=1)
    batcher.close(timeout=0.1, drop=True)
    with pytest.raises(Stopping):
        queued.result(1)
    with pytest.raises(Stopping):
        batcher.submit("k", ["b"], cost=1)
    release.set()
    assert blocker.result(5) is True

    with TestClient(create_app(folder, Limits())) as c:
        c.app.state.service.batcher.close()
        r = c.post("/v1/translate", json={"texts": ["a b c"]})
        assert r.status_code == 503
        assert r.json() == {"error": "the server is stopping; retry on another server or later"}


def test_batcher_runs_its_idle_job_when_free_and_never_during_a_batch():
    """`aiayn serve` chooses torch's threads again when idle (on_idle): the job runs once the
    worker has been free ``idle_s``, at most once per ``idle_every_s``, between batches only."""
    calls: list = []
    idle_runs: list = []
    hooks = WorkerHooks(on_idle=lambda: idle_runs.append(len(calls)), idle_s=0.2, idle_every_s=0.3)
    batcher = DynamicBatcher(slow_first(calls, 0.5), wait_s=0.0, hooks=hooks)  # idle: batches run
    batcher._idle_done = 0.0  # due as soon as the worker is free idle_s
    first = batcher.submit("k", ["a"], cost=1)
    assert first.result(5).outputs == ["k:a"]
    time.sleep(1.0)
    batcher.close()
    assert idle_runs and idle_runs[0] == 1  # after the batch, not before or during it
    assert 1 <= len(idle_runs) <= 4  # 1 s free: at most about one per 0.3 s


def test_the_worker_runs_its_start_hook_first_and_its_round_hook_before_each_round():
    """The thread setting `aiayn serve` passes in: once on the worker's thread before anything,
    then (the load follower) before each round."""
    order: list = []
    hooks = WorkerHooks(
        on_start=lambda: order.append(("start", threading.current_thread().name)),
        between_rounds=lambda: order.append("round"),
    )
    batcher = DynamicBatcher(lambda key, inputs: order.append(key) or inputs, hooks=hooks)
    assert batcher.submit("k", ["a"], cost=1).result(5).outputs == ["a"]
    assert batcher.call(lambda: "job").result(5) == "job"
    batcher.close()
    assert order == [("start", "aiayn-batcher"), "round", "k", "round"]


def test_service_chooses_threads_again_when_idle_unless_the_user_fixed_them(folder, monkeypatch):
    from aiayn.serve.service import ModelService

    monkeypatch.delenv("AIAYN_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    service = ModelService(folder, Limits())
    assert service.batcher.hooks.on_idle is not None
    service.close()
    monkeypatch.setenv("AIAYN_THREADS", "1")
    service = ModelService(folder, Limits())
    assert service.batcher.hooks.on_idle is None
    service.close()


def test_batcher_queue_full_cancel_and_errors():
    release = threading.Event()
    calls: list = []
    batcher = DynamicBatcher(echo(calls), max_queue=3, wait_s=0.0)
    blocker = batcher.call(release.wait)  # holds the worker
    time.sleep(0.05)
    waiting = batcher.submit("k", ["a", "b"], cost=2)
    dropped = batcher.submit("k", ["c"], cost=1)
    with pytest.raises(QueueFull):
        batcher.submit("k", ["d"], cost=1)  # 3 inputs wait already
    assert dropped.cancel()  # not started: leaves the queue
    release.set()
    assert blocker.result(5) is True
    assert waiting.result(5).outputs == ["k:a", "k:b"]
    assert all("c" not in inputs for _, inputs in calls)

    def boom(key, inputs):
        raise ValueError("bad batch")

    failing = DynamicBatcher(boom)
    with pytest.raises(ValueError, match="bad batch"):
        failing.submit("k", ["x"], 1).result(5)
    assert failing.call(lambda: 42).result(5) == 42  # the worker goes on after a failure
    failing.close()
    batcher.close()


def test_a_request_larger_than_the_queue_is_refused_at_once(folder):
    """More inputs than the whole queue holds could never be queued: TooLarge at once, a 422
    that says why (it was a 503 with Retry-After, for ever), whether the queue is empty or not;
    Limits refuse serve.max_texts above serve.max_queue, so the server meets this only through the
    batcher itself."""
    batcher = DynamicBatcher(echo([]), max_queue=3, wait_s=0.0)
    with pytest.raises(TooLarge, match="4 inputs in one request can never fit"):
        batcher.submit("k", ["a", "b", "c", "d"], cost=4)
    assert batcher.submit("k", ["a", "b", "c"], cost=3).result(5).outputs == ["k:a", "k:b", "k:c"]
    batcher.close()
    with pytest.raises(ConfigError, match="serve.max_texts .5. is more than serve.max_queue .4."):
        Limits(max_texts=5, max_queue=4)
    with TestClient(create_app(folder, Limits(max_texts=2, max_queue=2))) as c:
        c.app.state.service.batcher.queue.max_queue = 1  # as if the limits had let it through
        r = c.post("/v1/translate", json={"texts": ["a cat", "a dog"]})
        assert r.status_code == 422 and "Retry-After" not in r.headers
        assert "can never fit this server's queue of 1" in r.json()["error"]


def test_a_seed_outside_torchs_range_is_422_before_any_token(tmp_path):
    """It was 200 with an error event: the seed is checked (aiayn.decode.generate.check_seed,
    as `aiayn generate` does) before the generation is queued."""
    lm = load_folder([make_folder(tmp_path / "lm", kind="lm")])
    with TestClient(create_app(lm, Limits())) as c:
        body = {"prompt": "the cat", "max_new_tokens": 2}
        for seed in (99999999999999999999999, 2**64, -(2**63) - 1):
            r = c.post("/v1/generate", json={**body, "seed": seed})
            assert r.status_code == 422, r.text
            assert r.headers["content-type"].startswith("application/json")
            assert "seed must be an integer from -2**63 to 2**64-1" in r.json()["error"]
        ok = c.post("/v1/generate", json={**body, "seed": 2**64 - 1})
        assert ok.status_code == 200 and "event: done" in ok.text


# ---- the API ----------------------------------------------------------------------------------


def test_translate_uses_the_folder_settings_and_equals_the_library(client, folder):
    texts = ["the cat sits on the mat", "a red dog"]
    r = client.post("/v1/translate", json={"texts": texts})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["decode"] == {"beam": 2, "alpha": 1.0, "nbest": 1}  # from config.json "decode"
    expected = translate_hypotheses(
        folder.torch_module(),
        folder.tokenizer,
        texts,
        DecodeConfig(beam=2, alpha=1.0, max_len_a=0.0, max_len_b=8),
    )
    assert [t["text"] for t in body["translations"]] == [h[0][0] for h in expected]
    assert body["translations"][0]["nbest"][0]["score"] == pytest.approx(expected[0][0][1].score)
    assert set(body["timing"]) >= {"queue_ms", "compute_ms", "total_ms", "batch_requests"}

    r = client.post("/v1/translate", json={"texts": texts, "beam": 3, "nbest": 3, "alpha": 0.0})
    body = r.json()
    assert body["decode"] == {"beam": 3, "alpha": 0.0, "nbest": 3}
    for t in body["translations"]:
        scores = [h["score"] for h in t["nbest"]]
        assert len(scores) == 3 and scores == sorted(scores, reverse=True)
        assert t["text"] == t["nbest"][0]["text"]


def test_concurrent_requests_are_batched_and_answer_as_one_at_a_time(folder):
    """The same 24 requests, sent by 8 clients at once with dynamic batching and one at a time
    without it: identical translations and scores, and batching did merge requests."""
    requests = [{"texts": sentences(random.Random(i).randint(1, 3), 100 + i)} for i in range(24)]
    requests += [{"texts": sentences(2, 200 + i), "beam": 1} for i in range(6)]  # another key

    def answers(limits: Limits, clients: int) -> tuple[list, int]:
        with TestClient(create_app(folder, limits)) as c:
            with ThreadPoolExecutor(clients) as pool:
                responses = list(pool.map(lambda b: c.post("/v1/translate", json=b), requests))
        assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
        bodies = [r.json() for r in responses]
        merged = max(b["timing"]["batch_requests"] for b in bodies)
        return [b["translations"] for b in bodies], merged

    batched, merged = answers(Limits(batch_wait_ms=20.0), clients=8)
    alone, single = answers(Limits(batching=False), clients=1)
    assert merged > 1 and single == 1
    assert [[t["text"] for t in r] for r in batched] == [[t["text"] for t in r] for r in alone]
    for rb, ra in zip(batched, alone):
        for tb, ta in zip(rb, ra):
            assert tb["nbest"][0]["score"] == pytest.approx(ta["nbest"][0]["score"], abs=1e-4)


def test_attention_gives_every_layer_and_head_for_the_translation(client, folder):
    r = client.post("/v1/attention", json={"text": "the dog runs under the table"})
    assert r.status_code == 200, r.text
    a = r.json()
    S, T = len(a["src_tokens"]), len(a["tgt_tokens"])
    assert a["tgt_tokens"][0] == "<s>"
    for kind, (rows, cols) in {"encoder": (S, S), "decoder": (T, T), "cross": (T, S)}.items():
        weights = torch.tensor(a[kind])  # (layers, H, rows, cols)
        assert weights.shape == (2, 4, rows, cols), kind
        assert torch.allclose(weights.sum(-1), torch.ones(2, 4, rows), atol=1e-3)
    assert torch.tensor(a["decoder"]).triu(1).abs().max() == 0  # masked: no look ahead
    best = client.post("/v1/translate", json={"texts": ["the dog runs under the table"]}).json()
    assert a["translation"] == best["translations"][0]["text"]
    ref = attention_of_translation(
        folder.backend, folder.tokenizer, "the dog runs under the table", decode=folder.decode
    )
    assert torch.allclose(torch.tensor(a["cross"]), torch.stack(ref.maps.cross), atol=1e-4)
    second = client.post(
        "/v1/attention", json={"text": "the dog runs under the table", "rank": 2, "beam": 3}
    ).json()
    nbest = client.post(
        "/v1/translate", json={"texts": ["the dog runs under the table"], "beam": 3, "nbest": 2}
    ).json()
    assert second["translation"] == nbest["translations"][0]["nbest"][1]["text"]


def test_attention_of_a_hypothesis_cut_at_the_length_cap(folder):
    """A random model never emits EOS: the search stops at the cap, and the re-read feeds the
    tokens the search fed (not one more, which would overrun the positional table)."""
    cfg = DecodeConfig(beam=2, max_len_a=0.0, max_len_b=folder.backend.cfg.max_len)
    att = attention_of_translation(folder.backend, folder.tokenizer, "a cat", decode=cfg)
    assert len(att.tgt_tokens) == folder.backend.cfg.max_len  # <s> + 31 of the 32 tokens


def test_model_card(client, folder_dir):
    info = client.get("/v1/model").json()
    assert info["kind"] == "translation"
    assert info["parameters"] == sum(
        p.numel() for p in load_folder([folder_dir]).parameters()
    )
    assert info["vocab_size"] == load_folder([folder_dir]).tokenizer.vocab_size
    assert info["scores"] == {"test": {"bleu": 12.5, "chrf": 40.1}}
    assert info["decode"]["beam"] == 2
    assert info["config"]["model"]["d_model"] == 32
    assert info["routes"] == ["/v1/translate", "/v1/attention"]
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["kind"] == "translation"


def test_page_and_docs_are_served(client):
    page = client.get("/")
    assert page.status_code == 200 and "static/app.js" in page.text
    assert client.get("/static/app.js").status_code == 200
    assert client.get("/static/style.css").status_code == 200
    assert "/v1/translate" in client.get("/openapi.json").json()["paths"]


def test_classifier_and_language_model_routes(tmp_path):
    clf = load_folder([make_folder(tmp_path / "clf", kind="classifier")])
    with TestClient(create_app(clf, Limits())) as c:
        r = c.post("/v1/classify", json={"texts": ["a red cat", "the dog"]})
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert len(results) == 2 and sum(results[0]["probs"].values()) == pytest.approx(1.0)
        assert results[0]["label"] == max(results[0]["probs"], key=results[0]["probs"].get)
        assert c.post("/v1/translate", json={"texts": ["a"]}).status_code == 404
        long = c.post("/v1/classify", json={"texts": ["the cat sat " * 100]})  # cut, as trained
        assert long.status_code == 200 and long.json()["results"][0]["label"] in results[0]["probs"]
    lm = load_folder([make_folder(tmp_path / "lm", kind="lm")])
    with TestClient(create_app(lm, Limits())) as c:
        body = {"prompt": "the cat", "max_new_tokens": 6, "seed": 3}
        with c.stream("POST", "/v1/generate", json=body) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            events = [block for block in r.read().decode().split("\n\n") if block]
        kinds = [e.split("\n")[0] for e in events]
        assert kinds[-1] == "event: done" and set(kinds[:-1]) <= {"event: token"}
        data = [json.loads(e.split("\n")[1][len("data: ") :]) for e in events]
        assert "".join(d["text"] for d in data[:-1]) == data[-1]["text"]
        assert data[-1]["text"] == lm.generate("the cat", max_new_tokens=6, seed=3)
        assert c.post("/v1/generate", json={**body, "max_new_tokens": 10_000}).status_code == 422
        assert c.post("/v1/attention", json={"text": "a"}).status_code == 404


# ---- limits and bad input ---------------------------------------------------------------------


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


BAD_REQUESTS = [
    # (what, method, path, body (str: raw bytes as sent), headers, status, words in the error)
    (
        "no API key",
        "POST",
        "/v1/translate",
        {"texts": ["a"]},
        {"Authorization": ""},
        401,
        "API key",
    ),
    (
        "wrong API key",
        "POST",
        "/v1/translate",
        {"texts": ["a"]},
        {"Authorization": "", "X-API-Key": "no"},
        401,
        "API key",
    ),
    (
        "wrong Basic password",
        "GET",
        "/v1/model",
        None,
        {"Authorization": basic("u", "x")},
        401,
        "API key",
    ),
    ("malformed JSON", "POST", "/v1/translate", '{"texts": [', {}, 400, "malformed JSON"),
    ("empty body", "POST", "/v1/translate", "", {}, 400, "empty"),
    ("not UTF-8", "POST", "/v1/translate", b'{"texts": ["\xff"]}', {}, 400, "malformed"),
    ("deeply nested", "POST", "/v1/translate", "[" * 3000, {}, 400, "malformed"),
    ("body not an object", "POST", "/v1/translate", [1, 2], {}, 422, "JSON object"),
    ("texts missing", "POST", "/v1/translate", {"beam": 2}, {}, 422, "'texts' is required"),
    ("texts a string", "POST", "/v1/translate", {"texts": "a cat"}, {}, 422, "texts"),
    ("no texts", "POST", "/v1/translate", {"texts": []}, {}, 422, "texts"),
    ("a text not a string", "POST", "/v1/translate", {"texts": ["a", 7]}, {}, 422, "texts[1]"),
    ("too many texts", "POST", "/v1/translate", {"texts": ["a"] * 9}, {}, 422, "texts"),
    ("empty attention text", "POST", "/v1/attention", {"text": "  "}, {}, 422, "texts[0] is empty"),
    (
        "text too long",
        "POST",
        "/v1/translate",
        {"texts": ["cat " * 40]},
        {},
        422,
        "tokens; the limit",
    ),
    ("beam 0", "POST", "/v1/translate", {"texts": ["a"], "beam": 0}, {}, 422, "beam"),
    ("beam too large", "POST", "/v1/translate", {"texts": ["a"], "beam": 99}, {}, 422, "beam"),
    ("beam a string", "POST", "/v1/translate", {"texts": ["a"], "beam": "4"}, {}, 422, "beam"),
    ("beam a bool", "POST", "/v1/translate", {"texts": ["a"], "beam": True}, {}, 422, "beam"),
    ("beam a fraction", "POST", "/v1/translate", {"texts": ["a"], "beam": 2.5}, {}, 422, "beam"),
    ("alpha negative", "POST", "/v1/translate", {"texts": ["a"], "alpha": -1}, {}, 422, "alpha"),
    ("alpha NaN", "POST", "/v1/translate", '{"texts": ["a"], "alpha": NaN}', {}, 422, "alpha"),
    ("alpha too large", "POST", "/v1/translate", {"texts": ["a"], "alpha": 1e9}, {}, 422, "alpha"),
    (
        "nbest above beam",
        "POST",
        "/v1/translate",
        {"texts": ["a"], "beam": 2, "nbest": 3},
        {},
        422,
        "nbest",
    ),
    (
        "unknown field",
        "POST",
        "/v1/translate",
        {"texts": ["a"], "bean": 4},
        {},
        422,
        "unknown field 'bean'",
    ),
    ("body too large", "POST", "/v1/translate", {"texts": ["a" * 5000]}, {}, 413, "limit is 4096"),
    (
        "attention rank above beam",
        "POST",
        "/v1/attention",
        {"text": "a", "beam": 2, "rank": 3},
        {},
        422,
        "rank",
    ),
    ("attention no text", "POST", "/v1/attention", {}, {}, 422, "'text' is required"),
    (
        "route of another kind",
        "POST",
        "/v1/classify",
        {"texts": ["a"]},
        {},
        404,
        "translation model",
    ),
    ("unknown route", "GET", "/v1/nothing", None, {}, 404, "no route"),
    ("wrong method", "GET", "/v1/translate", None, {}, 405, "not allowed"),
]


def test_twenty_kinds_of_bad_request_then_a_good_one(folder):
    limits = Limits(max_body_bytes=4096, max_texts=8, max_text_tokens=24, max_beam=4, max_alpha=2)
    auth = {"Authorization": f"Bearer {KEY}"}
    assert len(BAD_REQUESTS) >= 20
    with TestClient(create_app(folder, limits, api_key=KEY), raise_server_exceptions=False) as c:
        for what, method, path, body, headers, status, words in BAD_REQUESTS:
            hdrs = {**auth, "Content-Type": "application/json", **headers}
            if isinstance(body, (str, bytes)):
                r = c.request(method, path, content=body, headers=hdrs)
            else:
                r = c.request(method, path, json=body, headers=hdrs)
            assert r.status_code == status, (what, r.status_code, r.text)
            assert r.headers["content-type"].startswith("application/json"), what
            error = r.json()["error"]
            assert set(r.json()) == {"error"} and "\n" not in error, what
            assert words in error, (what, error)
        assert c.get("/health").status_code == 200  # the one route without the key
        for good in (auth, {"X-API-Key": KEY}, {"Authorization": basic("anyone", KEY)}):
            r = c.post("/v1/translate", json={"texts": ["the cat sits"]}, headers=good)
            assert r.status_code == 200 and r.json()["translations"][0]["text"] is not None


def test_full_queue_is_503_and_time_limit_is_504(folder):
    limits = Limits(max_queue=2, max_texts=2, timeout=0.3)
    with TestClient(create_app(folder, limits)) as c:
        batcher = c.app.state.service.batcher
        release = threading.Event()
        blocker = batcher.call(lambda: release.wait(10))  # the worker is busy
        time.sleep(0.05)
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(c.post, "/v1/translate", json={"texts": ["a cat", "a dog"]})
            deadline = time.monotonic() + 5
            while batcher.waiting < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            full = c.post("/v1/translate", json={"texts": ["the mat"]})
            assert full.status_code == 503 and full.headers["Retry-After"] == "1"
            assert "busy" in full.json()["error"]
            late = waiting.result(10)  # its 0.3 s passed while the worker was busy
        assert late.status_code == 504 and "time limit" in late.json()["error"]
        assert batcher.waiting == 0  # the late request left the queue
        release.set()
        blocker.result(5)
        served = batcher.stats.requests
        ok = c.post("/v1/translate", json={"texts": ["the mat"]})
        assert ok.status_code == 200
        assert batcher.stats.requests == served + 1  # the cancelled request was never decoded


# ---- the command ------------------------------------------------------------------------------


def never_serve(server, batcher, sock=None):
    raise AssertionError("the server started: it should have been refused at start")


def test_serve_command_errors(folder_dir, monkeypatch, capsys):
    import builtins
    import socket

    from aiayn.cli import main

    real_import = builtins.__import__

    def no_uvicorn(name, *args, **kwargs):
        if name == "uvicorn":
            raise ImportError("No module named 'uvicorn'", name="uvicorn")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_uvicorn)
    assert main(["serve", str(folder_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "'serve' extra" in err and "uvicorn" in err
    monkeypatch.setattr(builtins, "__import__", real_import)

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", str(folder_dir), "--port", str(port)]) == 2
    assert "cannot listen on 127.0.0.1" in capsys.readouterr().err
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    assert main(["serve", str(folder_dir.parent / "missing"), "--port", str(port)]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["serve", str(folder_dir), "--set", "serve.max_texts=0"]) == 2
    assert "serve.max_texts must be > 0" in capsys.readouterr().err
    # a request of serve.max_texts texts could never be queued: refused at start, in one line (a
    # server that started anyway fails the test instead of serving for ever)
    monkeypatch.setattr("aiayn.serve.lanes.run_on_main_thread", never_serve)
    assert main(["serve", str(folder_dir), "--set", "serve.max_texts=64", "--set",
                 "serve.max_queue=32"]) == 2
    err = capsys.readouterr().err.strip()
    assert "serve.max_texts (64) is more than serve.max_queue (32)" in err and "\n" not in err


def test_generation_past_its_time_limit_ends_with_an_error_event(tmp_path):
    lm = load_folder([make_folder(tmp_path / "lm", kind="lm")])
    with TestClient(create_app(lm, Limits(timeout=0.3))) as c:
        release = threading.Event()
        blocker = c.app.state.service.batcher.call(lambda: release.wait(10))
        with c.stream("POST", "/v1/generate", json={"prompt": "the cat"}) as r:
            assert r.status_code == 200  # accepted; the stream then says what happened
            body = r.read().decode()
        release.set()
        blocker.result(5)
        assert body.startswith("event: error\n") and "time limit" in body
        ok = c.post("/v1/generate", json={"prompt": "the cat", "max_new_tokens": 3})
        assert ok.status_code == 200 and "event: done" in ok.text  # the server goes on


@pytest.mark.parametrize("engine", ["onnx", "ctranslate2"])
def test_exported_model_served_by_its_engine(folder_dir, tmp_path, engine, capsys):
    """`aiayn serve EXPORTED --engine onnx|ctranslate2`: the engine's own translations (as
    `aiayn translate --engine` gives them), no attention route, the engine in /v1/model."""
    pytest.importorskip(
        "onnx" if engine == "onnx" else "ctranslate2",
        reason=f"the '{'export' if engine == 'onnx' else 'ctranslate2'}' extra is not installed",
    )
    from aiayn.export import export_model
    from aiayn.folder import load_model_folder

    out = export_model(folder_dir, engine, tmp_path / engine)
    served = load_model_folder([out], engine=engine)  # the one loader opens exports too
    texts = ["the cat sits on the mat", "a red dog"]
    with TestClient(create_app(served, Limits())) as c:
        r = c.post("/v1/translate", json={"texts": texts, "beam": 2, "nbest": 2})
        assert r.status_code == 200, r.text
        decode = DecodeConfig(beam=2, alpha=1.0, max_len_a=0.0, max_len_b=8, nbest=2)
        expected = load_model_folder(out).translate_hypotheses(texts, decode)
        assert [[h["text"] for h in t["nbest"]] for t in r.json()["translations"]] == [
            [text for text, _ in line] for line in expected
        ]
        att = c.post("/v1/attention", json={"text": "a cat"})
        assert att.status_code == 404 and "--engine torch" in att.json()["error"]
        info = c.get("/v1/model").json()
        assert info["engine"] == engine and info["routes"] == ["/v1/translate"]
    from aiayn.cli import main

    assert main(["serve", str(out), "--engine", "torch", "--port", str(free_port())]) == 2


def test_an_ensemble_is_served_and_its_attention_is_its_first_models(folder_dir, client):
    """Two copies of one folder: the ensemble's mean of equal distributions is that distribution,
    so it translates as the single model; attention is recorded from its first model."""
    twice = load_folder([folder_dir, folder_dir])
    texts = ["the cat sits on the mat", "a red dog"]
    with TestClient(create_app(twice, Limits())) as c:
        r = c.post("/v1/translate", json={"texts": texts})
        assert r.status_code == 200, r.text
        info = c.get("/v1/model").json()
        att = c.post("/v1/attention", json={"text": texts[0]}).json()
    single = client.post("/v1/translate", json={"texts": texts}).json()
    assert [t["text"] for t in r.json()["translations"]] == [
        t["text"] for t in single["translations"]
    ]
    assert info["ensemble"] == 2
    alone = client.post("/v1/attention", json={"text": texts[0]}).json()
    assert att["tgt_tokens"] == alone["tgt_tokens"] and att["cross"] == alone["cross"]


def test_a_chunked_body_past_the_limit_is_413(folder):
    """No Content-Length to trust: the body is counted as it arrives and cut off at the limit."""

    def chunks():
        yield b'{"texts": ["'
        for _ in range(100):
            yield b"a" * 1000
        yield b'"]}'

    with TestClient(create_app(folder, Limits(max_body_bytes=4096))) as c:
        r = c.post("/v1/translate", content=chunks(), headers={"Content-Type": "application/json"})
        assert "content-length" not in {k.lower() for k in r.request.headers}
        assert r.status_code == 413 and "limit is 4096" in r.json()["error"]
        ok = c.post("/v1/translate", json={"texts": ["the cat"]})
        assert ok.status_code == 200
