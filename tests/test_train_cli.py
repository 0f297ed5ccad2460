"""`aiayn train` and `aiayn average` from the command line: end to end, and every bad input as
one clear error line (exit 2, no traceback, no saved file lost)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from trainutil import base_values, one_thread, torch_threads, write_toml  # noqa: F401
from trainutil import fails as _fails

from aiayn.cli import main
from aiayn.folder import load_model_dir


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 6-update run keeping every snapshot, trained through the CLI."""
    tmp = tmp_path_factory.mktemp("cli")
    values = base_values(tmp / "data", max_steps=6, save_every=1, keep_last=10, valid_every=3,
                         metrics_every=3, bleu_max_sentences=4)
    values["model.preset"] = "tiny"
    cfg = write_toml(tmp / "run.toml", values)
    with torch_threads(1):
        assert main(["train", str(cfg), "--out", str(tmp / "run")]) == 0
    return cfg, tmp / "run"


def test_cli_run_is_a_model_folder_with_bleu(trained):
    cfg, run = trained
    meta = json.loads((run / "config.json").read_text())
    assert meta["preset"] == "tiny" and meta["model"]["d_model"] == 16  # preset, then overrides
    assert meta["model"]["n_heads"] == 2 and meta["model"]["dropout"] == 0.1
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    bleu = [r["valid_bleu"] for r in lines if "valid_bleu" in r]
    assert len(bleu) == 2 and all(0.0 <= b <= 100.0 for b in bleu)
    from aiayn.data import Tokenizer
    from aiayn.decode import translate_texts

    model, _, _ = load_model_dir(run / "best")
    tokenizer = Tokenizer.from_file(run / "best/tokenizer.json")
    out = translate_texts(model, tokenizer, ["a b c"], beam=2)
    assert len(out) == 1 and isinstance(out[0], str)


def test_average_is_the_mean_of_the_last_n(trained, tmp_path, capsys):
    _, run = trained
    assert main(["average", str(run), "--last", "3", "-o", str(tmp_path / "avg")]) == 0
    avg = load_file(str(tmp_path / "avg/model.safetensors"))
    snaps = [load_file(str(run / f"checkpoints/step_{s:08d}.safetensors")) for s in (4, 5, 6)]
    for name, tensor in avg.items():
        torch.testing.assert_close(tensor, sum(s[name] for s in snaps) / 3, rtol=1e-6, atol=1e-7)
    assert any(not torch.equal(avg[k], snaps[-1][k]) for k in avg)  # not just the last one
    model, cfg, meta = load_model_dir(tmp_path / "avg")
    assert meta["averaged"]["steps"] == [4, 5, 6] and (tmp_path / "avg/tokenizer.json").is_file()
    assert main(["average", str(run), "--last", "2", "--until", "4", "-o", str(tmp_path / "upto4")]) == 0
    upto4 = load_file(str(tmp_path / "upto4/model.safetensors"))
    snaps = [load_file(str(run / f"checkpoints/step_{s:08d}.safetensors")) for s in (3, 4)]
    for name, tensor in upto4.items():
        torch.testing.assert_close(tensor, sum(s[name] for s in snaps) / 2, rtol=1e-6, atol=1e-7)


def test_average_errors(trained, tmp_path, capsys):
    _, run = trained
    _fails(capsys, ["average", str(run), "--last", "50", "-o", str(tmp_path / "a")],
           "only 6 are kept")
    _fails(capsys, ["average", str(run), "--last", "3", "--until", "2", "-o", str(tmp_path / "a")],
           "only 2 are at step 2 or before (steps 1, 2)")
    _fails(capsys, ["average", str(run), "--last", "2", "-o", str(run)],
           f"holds {run / 'checkpoints'}, which this command reads")
    _fails(capsys, ["average", str(tmp_path / "none"), "-o", str(tmp_path / "b")],
           "not a training run folder")
    _fails(capsys, ["average", str(run), "--last", "0", "-o", str(tmp_path / "c")], "--last must be")


def test_average_rejects_a_corrupt_snapshot(trained, tmp_path, capsys):
    import shutil

    _, run = trained
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    snap = copy / "checkpoints/step_00000005.safetensors"
    snap.write_bytes(snap.read_bytes()[:64])
    _fails(capsys, ["average", str(copy), "--last", "2", "-o", str(tmp_path / "avg")],
           "not a readable safetensors file")
    save_file({"x": torch.zeros(2)}, str(snap))
    _fails(capsys, ["average", str(copy), "--last", "2", "-o", str(tmp_path / "avg")],
           "different tensors")


def test_bad_config_inputs(tmp_path, capsys):
    cfg = write_toml(tmp_path / "run.toml", base_values(tmp_path / "data"))
    out = ["--out", str(tmp_path / "run")]
    _fails(capsys, ["train", str(cfg), *out, "--set", "train.max_step=3"], "did you mean 'train.max_steps'?")
    _fails(capsys, ["train", str(cfg), *out, "--set", "model.d_model=wide"],
           "model.d_model: expected an integer")
    _fails(capsys, ["train", str(tmp_path / "missing.toml"), *out], "config file not found")
    _fails(capsys, ["train"], "give a CONFIG.toml")
    assert not (tmp_path / "run").exists()


def test_missing_dataset_and_files(tmp_path, capsys):
    values = base_values(tmp_path / "data")
    cfg = write_toml(tmp_path / "run.toml", values)
    out = ["--out", str(tmp_path / "run")]
    _fails(capsys, ["train", str(cfg), *out, "--set", "data.train_src=" + str(tmp_path / "nope.en")],
           "no such file")
    own = {k: v for k, v in values.items() if not k.startswith("data.")}
    cfg2 = write_toml(tmp_path / "reg.toml", {**own, "data.dataset": "multi31k", "data.max_len": 32})
    _fails(capsys, ["train", str(cfg2), "--out", str(tmp_path / "run2")],
           "unknown dataset 'multi31k' (did you mean 'multi30k'?)")


def test_unwritable_run_folder(tmp_path, capsys):
    cfg = write_toml(tmp_path / "run.toml", base_values(tmp_path / "data"))
    blocker = tmp_path / "file"
    blocker.write_text("I am a file\n")
    _fails(capsys, ["train", str(cfg), "--out", str(blocker / "run")], "is a file, not a folder")
    _fails(capsys, ["train", str(cfg), "--out", str(blocker)], "run folder is a file")
    assert blocker.read_text() == "I am a file\n"
