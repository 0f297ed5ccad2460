"""The decoding controls over HTTP (POST /v1/translate), the API pages served without a CDN, and
the server's thread count following the machine's load under steady traffic."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("fastapi", reason="the 'serve' extra (fastapi) is not installed")
pytest.importorskip("httpx", reason="httpx (FastAPI's TestClient) is not installed")

from fastapi.testclient import TestClient  # noqa: E402
from serve_helpers import PAIRS, make_folder, make_trained_folder  # noqa: E402
from trainutil import FakeProcStat, thread_fixture  # noqa: E402

from aiayn import threads  # noqa: E402
from aiayn.folder import load_model_folder  # noqa: E402
from aiayn.serve import Limits, create_app  # noqa: E402
from aiayn.serve.service import ModelService  # noqa: E402

one_thread_module = thread_fixture(autouse=True, scope="module", name="one_thread_module")


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    return make_trained_folder(tmp_path_factory.mktemp("serve-controls") / "m")


@pytest.fixture(scope="module")
def client(trained):
    with TestClient(create_app(load_model_folder(trained), Limits())) as c:
        yield c


def translate(client, **body):
    r = client.post("/v1/translate", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_controls_over_http_equal_the_python_call(client, trained):
    model = load_model_folder(trained)
    source = PAIRS[1][0]
    got = translate(client, texts=[source], no_repeat_ngram_size=2, repetition_penalty=1.5, beam=2)
    want = model.translate([source], no_repeat_ngram_size=2, repetition_penalty=1.5, beam=2)
    assert got["translations"][0]["text"] == want[0]
    assert got["decode"]["no_repeat_ngram_size"] == 2
    assert got["decode"]["repetition_penalty"] == 1.5


def test_a_prefix_over_http_starts_the_output(client):
    got = translate(client, texts=[PAIRS[0][0], PAIRS[1][0]], prefixes=["ein hund", None])
    first, second = (t["text"] for t in got["translations"])
    assert first.startswith("ein hund") and second == PAIRS[1][1]
    same = translate(client, texts=[PAIRS[0][0]], prefixes=[PAIRS[0][1]])
    assert same["translations"][0]["text"] == PAIRS[0][1]  # its own output: unchanged


def test_alignments_over_http(client):
    got = translate(client, texts=[PAIRS[2][0]], alignments=True, nbest=2)
    for hyp in got["translations"][0]["nbest"]:
        assert len(hyp["alignment"]) == len(hyp["tokens"]) > 0
        assert [j for _, j in hyp["alignment"]] == list(range(len(hyp["tokens"])))
        assert all(0 <= i < len(hyp["src_tokens"]) for i, _ in hyp["alignment"])
    plain = translate(client, texts=[PAIRS[2][0]])
    assert "alignment" not in plain["translations"][0]["nbest"][0]


@pytest.mark.parametrize(
    "body, message",
    [
        ({"repetition_penalty": 0}, "repetition_penalty: Input should be greater than 0"),
        ({"repetition_penalty": "2"}, "repetition_penalty: Input should be a valid number"),
        ({"no_repeat_ngram_size": -1}, "no_repeat_ngram_size: Input should be greater than"),
        ({"no_repeat_ngram_size": 65}, "no_repeat_ngram_size: Input should be less than"),
        ({"prefixes": ["a", "b"]}, "prefixes: one per text (1), got 2"),
        ({"prefixes": ["x " * 300]}, "prefixes[0] has"),
        ({"alignments": "yes"}, "alignments: Input should be a valid boolean"),
    ],
)
def test_bad_controls_are_one_line_422s(client, body, message):
    r = client.post("/v1/translate", json={"texts": ["a cat"], **body})
    assert r.status_code == 422 and message in r.json()["error"], r.text


def test_an_export_refuses_alignments_naming_its_backend(tmp_path):
    pytest.importorskip("onnxruntime", reason="the 'export' extra")
    from aiayn.export import export_model

    onnx = export_model(make_folder(tmp_path / "m"), "onnx", tmp_path / "onnx")
    with TestClient(create_app(load_model_folder(onnx), Limits())) as c:
        r = c.post("/v1/translate", json={"texts": ["the cat"], "alignments": True})
        assert r.status_code == 422
        assert r.json()["error"].startswith("alignments: the onnx backend has no attention")
        r = c.post("/v1/translate", json={"texts": ["the cat"], "no_repeat_ngram_size": 2,
                                          "prefixes": ["the"]})
        assert r.status_code == 200, r.text


def test_the_api_page_loads_its_assets_from_the_server(client):
    """/docs (Swagger UI) references only this server's copies, which it serves; no /redoc."""
    html = client.get("/docs").text
    assert "cdn." not in html and "https://" not in html
    for asset in ("swagger-ui-bundle.js", "swagger-ui.css", "favicon.png"):
        assert f"/docs-assets/{asset}" in html
        r = client.get(f"/docs-assets/{asset}")
        assert r.status_code == 200 and len(r.content) > 1_000
    assert client.get("/redoc").status_code == 404


# ---- threads under load -----------------------------------------------------------------------


def test_under_steady_traffic_the_thread_count_follows_a_fake_load(trained, monkeypatch):
    """The worker chooses torch's threads again between batches while busy, at most once per
    ``busy_every_s``: a fake load (other processes' busy time in /proc/stat) brings the count to
    1, and back up when it goes. (torch's real count is left alone: set_num_threads is a fake.)"""
    monkeypatch.delenv("AIAYN_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    folder = load_model_folder(trained)
    others, count, chosen = FakeProcStat(4), {"n": 4}, []
    monkeypatch.setattr(threads, "cores", lambda: 4)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 4)
    monkeypatch.setattr(threads, "_own_ticks", lambda: 0.0)
    monkeypatch.setattr(threads, "_read_stat", others)
    monkeypatch.setattr(threads, "probe", lambda settings, **kw: {n: 1.0 / n for n in settings})
    monkeypatch.setattr(threads.torch, "get_num_threads", lambda: count["n"])
    monkeypatch.setattr(threads.torch, "set_num_threads", lambda n: count.update(n=n))
    real = threads.threads_for_load

    def recorded(**kw):
        stats = service.batcher.stats
        work = stats.batches + stats.steps  # batches, or decoder steps
        chosen.append((time.monotonic(), real(**kw), work))
        return chosen[-1][1]

    monkeypatch.setattr(threads, "threads_for_load", recorded)
    follower = threads.LoadFollower(most=4, busy_every_s=0.3)
    service = ModelService(folder, Limits(), worker_thread=True, follow_load=follower)
    stop = threading.Event()

    def traffic() -> None:  # one client, back to back: the worker is never idle for 1 s
        while not stop.is_set():
            service.translate([PAIRS[0][0]], service.checks.decode_config(1, None, None)).result()

    client = threading.Thread(target=traffic)
    client.start()
    try:
        others.busy = 3  # three other busy processes on 4 cores
        wait_for(lambda: count["n"] == 1, "threads down to 1 under load")
        others.busy = 0  # the machine is free again
        wait_for(lambda: count["n"] == 4, "threads back up to 4")
    finally:
        stop.set()
        client.join(10)
        service.close()
    times = [t for t, _, _ in chosen]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert len(chosen) >= 2 and all(g >= 0.3 for g in gaps), gaps  # once per busy_every_s
    batches = [b for _, _, b in chosen]
    assert batches == sorted(set(batches))  # each between other batches: traffic never paused


def wait_for(condition, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.02)


def test_a_thread_count_the_user_set_is_never_changed_under_traffic(trained, monkeypatch):
    monkeypatch.setenv("AIAYN_THREADS", "1")
    service = ModelService(load_model_folder(trained), Limits(), worker_thread=True)
    try:
        hooks = service.batcher.hooks
        assert hooks.on_idle is None and hooks.between_rounds is None
    finally:
        service.close()
    assert torch.get_num_threads() >= 1


def test_attention_spans_group_the_pieces_of_one_character(client):
    """Byte-level pieces of one character (each "�" alone) come with spans that merge them."""
    r = client.post("/v1/attention", json={"text": "a cat 北京 🙂", "prefix": "eine",
                                           "no_repeat_ngram_size": 3})
    assert r.status_code == 200, r.text
    att = r.json()
    spans = {label: count for _, count, label in att["src_spans"]}
    assert spans["北"] == 3 and spans["京"] == 3 and spans["🙂"] == 4
    assert att["src_tokens"].count("\ufffd") == 10  # the pieces, each alone
    for side in ("src", "tgt"):
        firsts = [first for first, _, _ in att[f"{side}_spans"]]
        counts = [count for _, count, _ in att[f"{side}_spans"]]
        assert sum(counts) == len(att[f"{side}_tokens"])
        assert firsts == [sum(counts[:k]) for k in range(len(counts))]  # contiguous
    assert att["translation"].startswith("eine")
    assert att["decode"]["no_repeat_ngram_size"] == 3
