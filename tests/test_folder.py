"""aiayn.load / load_model_folder: one loader for every kind, the folder's decoding settings, and
the order flag > folder > DecodeConfig default; config.json written by train/average carries the
recipe's [decode]; old names still load."""

from __future__ import annotations

import json

import pytest

import aiayn
from aiayn.cli import main
from aiayn.decode import DecodeConfig, translate_texts
from aiayn.errors import CheckpointError
from aiayn.folder import load_model_folder
from aiayn.kinds import KINDS
from aiayn.run_config import build_run_config
from aiayn.train.run import train_run
from test_translate_cli import make_model_dir, sentences, write_lines
from trainutil import base_values, one_thread  # noqa: F401


def test_kinds_are_the_registered_shapes():
    assert set(KINDS) == {"translation", "classification", "lm", "masked_lm", "image_classification"}


def test_aiayn_load_uses_the_folders_decoding_unless_overridden(tmp_path):
    folder, _ = make_model_dir(tmp_path / "m", sentences(300, 0), decode={"beam": 1, "max_len_b": 3})
    model = aiayn.load(folder)
    assert aiayn.load is load_model_folder and model.kind == "translation"
    assert model.decode == DecodeConfig(beam=1, max_len_b=3)
    texts = sentences(6, 1)
    assert model.translate(texts) == translate_texts(model.torch_module(), model.tokenizer, texts,
                                                     DecodeConfig(beam=1, max_len_b=3))
    wider = translate_texts(model.torch_module(), model.tokenizer, texts, beam=3, max_len_b=3)
    assert model.translate(texts, beam=3) == wider
    assert model.translate(texts, DecodeConfig(beam=3, max_len_b=3)) == wider


def test_evaluate_takes_a_flag_over_the_folder_over_the_default(tmp_path):
    folder, _ = make_model_dir(tmp_path / "m", sentences(300, 0), decode={"beam": 1, "alpha": 1.4})
    plain, _ = make_model_dir(tmp_path / "p", sentences(300, 0))
    src = write_lines(tmp_path / "t.en", sentences(5, 2))
    for args, where, beam, alpha in (([], folder, 1, 1.4), (["--beam", "2"], folder, 2, 1.4),
                                     ([], plain, 4, 0.6)):
        out = tmp_path / "s.json"
        assert main(["evaluate", str(where), "--src", str(src), "--ref", str(src), "-o", str(out),
                     *args]) == 0
        decoding = json.loads(out.read_text())["decoding"]
        assert (decoding["beam"], decoding["alpha"]) == (beam, alpha)


def test_old_kind_names_and_renamed_keys_still_load(tmp_path, caplog):
    folder, _ = make_model_dir(tmp_path / "m", sentences(300, 0), train={"bleu_every": 7})
    meta = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({  # as written before data.kind
        **meta, "kind": "seq2seq", "task": "translation", "data": {"task": "translation"}}))
    with caplog.at_level("WARNING"):
        model = load_model_folder(folder, expect_kind="translation")
    assert model.kind == model.config.data.kind == "translation"
    assert model.config.train.metrics_every == 7
    # an old folder is valid as it is: its user has nothing to fix, so no warning on every load
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == []


def test_a_translation_folder_refuses_other_uses(tmp_path):
    folder, _ = make_model_dir(tmp_path / "m", sentences(300, 0))
    model = load_model_folder(folder)
    with pytest.raises(CheckpointError, match="holds a 'translation' model, classify needs"):
        model.classify(["a cat"])
    with pytest.raises(CheckpointError, match="holds a 'translation' model, generate needs"):
        model.generate("a")
    with pytest.raises(CheckpointError, match="this command needs 'lm'"):
        load_model_folder(folder, expect_kind="lm")
    with pytest.raises(CheckpointError, match="model folder not found"):
        load_model_folder(tmp_path / "nowhere")


def test_train_writes_the_recipes_decode_section_and_average_keeps_it(tmp_path):
    values = base_values(tmp_path / "data", max_steps=4, save_every=2, keep_last=2)
    cfg = build_run_config({**values, "decode.beam": 3, "decode.alpha": 1.4})
    train_run(cfg, tmp_path / "run")
    for sub in ("", "best"):
        assert load_model_folder(tmp_path / "run" / sub).decode == DecodeConfig(beam=3, alpha=1.4)
    assert main(["average", str(tmp_path / "run"), "--last", "2", "-o", str(tmp_path / "avg")]) == 0
    assert load_model_folder(tmp_path / "avg").decode == DecodeConfig(beam=3, alpha=1.4)
