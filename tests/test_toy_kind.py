"""Adding a model kind is one Task module and one registry entry (issue #58, point 1).

tests/toy_kind.py defines ``reverse`` (its model class, its Task, its :class:`~aiayn.kinds.Kind`);
registered at test time, it trains through ``aiayn train``, saves a model folder, loads with
``aiayn.load`` and is served by the HTTP app, with nothing in aiayn/ naming it. Its config checks
come from its entry: it takes none of the kind-specific settings."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("httpx", reason="httpx (FastAPI's TestClient) is not installed")

import toy_kind  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402
from trainutil import base_values, fails, torch_threads, write_toml  # noqa: E402

import aiayn  # noqa: E402
from aiayn.cli import main  # noqa: E402
from aiayn.errors import CheckpointError, ConfigError  # noqa: E402
from aiayn.kinds import KINDS, register_kind  # noqa: E402
from aiayn.run_config import build_run_config  # noqa: E402
from aiayn.serve import Limits, create_app  # noqa: E402


@pytest.fixture(scope="module")
def reverse_kind():
    """The toy kind in the registry for this module's tests, and out of it afterwards."""
    register_kind(toy_kind.KIND)
    yield toy_kind.KIND
    del KINDS[toy_kind.KIND.name]


@pytest.fixture(scope="module")
def run(reverse_kind, tmp_path_factory):
    """A 6-update run of the toy kind, trained through the CLI, its metrics every 3 updates."""
    tmp = tmp_path_factory.mktemp("toy")
    values = base_values(tmp / "data", max_steps=6, valid_every=3, save_every=3, metrics_every=3)
    cfg = write_toml(tmp / "reverse.toml", {**values, "data.kind": "reverse"})
    with torch_threads(1):
        assert main(["train", str(cfg), "--out", str(tmp / "run")]) == 0
    return tmp / "run"


def test_the_toy_kind_trains_with_its_own_task_and_model(run):
    meta = json.loads((run / "config.json").read_text())
    assert meta["kind"] == "reverse" and meta["data"]["kind"] == "reverse"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    exact = [r["valid_exact"] for r in rows if "valid_exact" in r]  # the toy Task's own metric
    assert len(exact) == 2 and all(0.0 <= x <= 1.0 for x in exact)
    assert not any("valid_bleu" in r for r in rows)  # translation's metric is not its


def test_the_toy_kind_saves_loads_and_translates(run):
    model = aiayn.load(run / "best")
    assert model.kind == "reverse" and type(model.torch_module()) is toy_kind.Reverser
    out = model.translate(["a b c", "d e"], beam=1)
    assert len(out) == 2 and all(isinstance(x, str) for x in out)
    assert "reverser" in (run / "best" / "README.md").read_text()  # its model card's words
    with pytest.raises(CheckpointError, match="holds a 'reverse' model, classify needs"):
        model.classify(["a b"])


def test_the_toy_kind_is_served_on_its_routes(run):
    folder = aiayn.load(run / "best")
    with TestClient(create_app(folder, Limits())) as client:
        info = client.get("/v1/model").json()
        assert info["kind"] == "reverse"
        r = client.post("/v1/translate", json={"texts": ["a b c"], "beam": 1})
        assert r.status_code == 200, r.text
        assert r.json()["translations"][0]["text"] == folder.translate(["a b c"], beam=1)[0]
        r = client.post("/v1/classify", json={"texts": ["a b c"]})
        assert r.status_code == 404 and "it answers /v1/translate" in r.json()["error"]


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("train.best_metric", "valid_bleu", "needs data.kind = 'translation', not 'reverse'"),
        ("data.pad_to_multiple", 8, "data.kind = 'translation'; data.kind is 'reverse'"),
        ("train.adversarial_eps", 0.1, "applies to data.kind = 'classification' only"),
        (
            "data.train_file",
            "x.tsv",
            "'reverse' reads data.train_src/train_tgt, not data.train_file",
        ),
    ],
)
def test_the_toy_kinds_config_checks_come_from_its_entry(
    reverse_kind, tmp_path, key, value, message
):
    values = {**base_values(tmp_path / "data", metrics_every=3), "data.kind": "reverse"}
    build_run_config(values)  # valid as it is
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        build_run_config({**values, key: value})


def test_an_unregistered_kind_is_refused_and_a_name_is_registered_once(
    reverse_kind, tmp_path, capsys
):
    with pytest.raises(ConfigError, match="model kind 'reverse' is already registered"):
        register_kind(toy_kind.KIND)
    with pytest.raises(ConfigError, match="'translation' is already registered"):
        register_kind(KINDS["translation"])
    values = {**base_values(tmp_path / "data"), "data.kind": "rev"}
    fails(
        capsys,
        ["train", str(write_toml(tmp_path / "c.toml", values)), "--out", str(tmp_path / "run")],
        "data.kind: 'rev' is not one of",
    )
