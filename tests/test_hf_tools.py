"""An imported Marian folder in aiayn's other tools, unchanged (issue #44): ``aiayn.load``,
``aiayn evaluate`` on files, and the server with its attention page's data (the decoder starts
from <pad>: the attention of its first position must be there, and the labels are the model's own
special tokens)."""

import json

import pytest
import torch
from hf_helpers import sentences
from trainutil import torch_threads

import aiayn
from aiayn.cli import main
from aiayn.interop.marian import import_marian

pytest.importorskip("fastapi", reason="the 'serve' extra (fastapi) is not installed")
pytest.importorskip("httpx", reason="httpx (FastAPI's TestClient) is not installed")


@pytest.fixture(scope="module")
def imported(marian_folder, tmp_path_factory):
    return import_marian(marian_folder, tmp_path_factory.mktemp("tools") / "opus-mt-tiny")


def test_load_evaluate_and_serve_an_imported_folder(imported, tmp_path, capsys):
    from fastapi.testclient import TestClient

    from aiayn.serve import Limits, create_app

    texts = [s for s in sentences("en", 200, skip=5000) if len(s.split()) <= 8][:6]
    folder = aiayn.load(imported)
    with torch_threads(1):
        translations = folder.translate(texts)
    assert len(translations) == len(texts) and any(translations)
    (tmp_path / "src.txt").write_text("\n".join(texts) + "\n")
    (tmp_path / "ref.txt").write_text("\n".join(translations) + "\n")
    argv = ["evaluate", str(imported), "--src", str(tmp_path / "src.txt")]
    with torch_threads(1):
        assert main([*argv, "--ref", str(tmp_path / "ref.txt")]) == 0
    scores = json.loads(next(imported.glob("eval_*.json")).read_text())
    assert scores["bleu"] == pytest.approx(100.0)  # its own translations as references
    with TestClient(create_app(folder, Limits())) as client, torch_threads(1):
        best = client.post("/v1/translate", json={"texts": texts[:1]}).json()
        r = client.post("/v1/attention", json={"text": texts[0]})
    assert r.status_code == 200, r.text
    a = r.json()
    assert a["translation"] == best["translations"][0]["text"] == translations[0]
    assert a["tgt_tokens"][0] == "<pad>" and a["src_tokens"][-1] == "</s>"
    rows = torch.tensor(a["decoder"]).sum(-1)  # (layers, H, T): every position attends
    assert torch.allclose(rows, torch.ones_like(rows), atol=1e-3)


def test_without_sentencepiece_the_folder_is_one_clear_line(imported, capsys, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "sentencepiece", None)
    capsys.readouterr()
    assert main(["translate", str(imported), "--input", "/dev/null"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("aiayn: error: ") and "pip install -e '.[hf]'" in err
    assert len(err.strip().splitlines()) == 1
