"""aiayn.card: a model folder's README.md says what the model is, how it was trained, what it scored
(from its eval_*.json), its decoding settings and how to use it; writing it never breaks a command."""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest
from trainutil import tiny_model_config

from aiayn.card import model_card, write_model_card
from aiayn.folder.checkpoint import save_model_dir
from aiayn.config import ModelConfig
from aiayn.model import Transformer


@pytest.fixture
def run(tmp_path):
    """A run folder with best/ and an average, as train and average leave them (tiny model)."""
    cfg = ModelConfig.preset("tiny", src_vocab_size=50, tgt_vocab_size=50, n_encoder_layers=1,
                             n_decoder_layers=1, share_embeddings=True, norm_first=True)
    model = Transformer(cfg)
    extra = {
        "data": {"dataset": "multi30k", "src_lang": "en", "tgt_lang": "de", "train_split": "train",
                 "valid_split": "val", "tokenizer": "bpe", "vocab_size": 8000},
        "train": {"max_steps": 10600, "max_time": 3600, "precision": "auto"},
        "decode": {"beam": 5, "alpha": 1.4},
        "hardware": "2-core AMD EPYC (avx512f, avx512_bf16, no AMX)",
    }
    run = tmp_path / "run"
    save_model_dir(run, model, cfg, extra=extra)
    save_model_dir(run / "best", model, cfg, extra={**extra, "best": {"step": 200, "valid_loss": 1.6713}})
    save_model_dir(run / "avg2", model, cfg,
                   extra={**extra, "averaged": {"steps": [100, 200], "run": str(run)}})
    metrics = [{"step": 100, "wall": 60.0, "tokens_per_s": 1000.0},
               {"step": 200, "wall": 125.0, "tokens_per_s": 3000.0, "valid_loss": 1.7}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    n_params = sum(p.numel() for p in model.parameters())
    return run, n_params


def test_card_says_what_the_model_is_and_how_it_was_trained(run):
    run, n_params = run
    card = model_card(run / "avg2")
    assert card.startswith("# avg2: translation model")
    assert "translates en → de" in card and "`multi30k`" in card
    # the model's 50 tokens (the folder has no tokenizer.json), not the 8,000 the run asked for
    assert "| tokenizer | bpe, 50 tokens (data.vocab_size 8,000) |" in card
    assert "encoder–decoder, 1+1 layers, d_model 128, 4 heads, d_ff 256, pre-LN" in card
    assert f"| parameters | {n_params:,} |" in card  # tied weights counted once
    assert "the average of 2 checkpoints (updates 100, 200)" in card
    assert "200 updates in 2.1 min" in card and "median 2,000 tokens/s" in card  # the run's metrics
    assert "2-core AMD EPYC" in card
    assert "`beam` 5, `alpha` 1.4" in card
    for command in ("aiayn translate", "aiayn serve", "aiayn export", "--format onnx", 'aiayn.load("'):
        assert command in card


def test_the_tokenizer_row_gives_the_tokenizers_real_size(tmp_path):
    """A BPE learnt on small data stops short of data.vocab_size: the card gives the size of the
    folder's tokenizer.json (issue 66: "bpe, 8,000 tokens" for a tokenizer of 5,758)."""
    from aiayn.data.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(["a small corpus", "of a few words", "and no more"] * 5, "bpe", 8000)
    size = tokenizer.vocab_size
    assert size < 8000
    cfg = tiny_model_config(size, 16)
    extra = {"data": {"tokenizer": "bpe", "vocab_size": 8000}}
    folder = save_model_dir(tmp_path / "m", Transformer(cfg), cfg, tokenizer_json=tokenizer.to_str(),
                            extra=extra)
    card = model_card(folder)
    assert f"| tokenizer | bpe, {size:,} tokens (data.vocab_size 8,000) |" in card
    assert "8,000 tokens" not in card


def test_a_metrics_line_cut_by_a_kill_still_gives_the_training(run):
    run, _ = run
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 300, "wa')  # a run killed while it wrote (and not resumed)
    assert "200 updates in 2.1 min" in model_card(run / "avg2")


def test_a_copied_folder_keeps_its_training_row(run, tmp_path):
    """A model folder copied away from its run (no metrics.jsonl beside it) keeps the training row
    its card had when `aiayn evaluate` refreshes the card."""
    import shutil

    run, _ = run
    write_model_card(run / "best")  # its run's metrics.jsonl is in the folder above
    copy = tmp_path / "shipped" / "best"
    shutil.copytree(run / "best", copy)
    (copy / "eval_test_2016_flickr.json").write_text(json.dumps({"bleu": 40.0, "n": 3}))
    write_model_card(copy)
    card = (copy / "README.md").read_text()
    assert "| training | 200 updates in 2.1 min" in card and "not recorded here" not in card
    assert "eval_test_2016_flickr.json" in card
    (copy / "README.md").unlink()  # no card and no metrics: said so
    assert "| training | not recorded here (limits: max_steps 10600" in model_card(copy)


def test_best_folder_names_its_checkpoint(run):
    run, _ = run
    card = model_card(run / "best")
    assert "the best checkpoint, update 200 (valid_loss 1.671)" in card
    assert "200 updates" in card  # metrics.jsonl found in the parent run folder


def test_scores_come_from_the_eval_files(run):
    run, _ = run
    folder = run / "avg2"
    assert "None measured on this folder yet" in model_card(folder)
    (folder / "eval_test_2016_flickr.json").write_text(json.dumps({
        "bleu": 40.67, "bleu_lc": 41.08, "chrf": 64.8, "test_set": "test_2016_flickr",
        "sentences_per_s": 105.5, "decoding": {"beam": 5, "alpha": 1.4},
        "model": [str(folder), "other"]}))
    (folder / "eval_broken.json").write_text("{not json")
    card = model_card(folder)
    assert "| `eval_test_2016_flickr.json` | test_2016_flickr | BLEU 40.67, BLEU `-lc` 41.08, chrF 64.80 |" in card
    assert "beam 5, α 1.4; ensemble of 2" in card and "105.5 sentences/s" in card
    assert "eval_broken.json" not in card  # an unreadable score file is skipped, not fatal


def test_classifier_card_reports_accuracy_and_its_commands(tmp_path):
    from aiayn.model import TransformerClassifier

    cfg = tiny_model_config(vocab=30, max_len=1024, d_model=16, n_heads=2, d_ff=32,
                            n_encoder_layers=1, n_decoder_layers=0, n_classes=2, dropout=0.1)
    folder = save_model_dir(tmp_path / "clf", TransformerClassifier(cfg), cfg, kind="classifier",
                            extra={"data": {"dataset": "imdb", "tokenizer": "bpe", "vocab_size": 30}})
    (folder / "eval_test.json").write_text(json.dumps(
        {"accuracy": 0.8979, "correct": 22447, "n": 25000, "test_set": "test", "texts_per_s": 368.0}))
    card = model_card(folder)
    assert card.startswith("# clf: classification model")
    assert "accuracy 89.79% (22447/25000)" in card and "aiayn classify" in card
    assert "no beam search settings" in card and "aiayn translate" not in card


def test_write_is_atomic_and_never_raises(run, tmp_path, caplog):
    run, _ = run
    path = write_model_card(run)
    assert path == run / "README.md" and path.read_text().startswith("# run:")
    assert not [p for p in run.iterdir() if p.name.startswith(".README")]  # no temporary left
    with caplog.at_level(logging.WARNING):
        assert write_model_card(tmp_path / "no_such_folder") is None
    assert "model card not written" in caplog.text
    (run / "config.json").write_text("{broken")
    before = path.read_text()
    assert write_model_card(run) is None and path.read_text() == before  # the old card stays


def test_train_and_average_write_cards(tmp_path):
    """End to end: `aiayn train` leaves a card in the run folder and best/, `aiayn average` in its
    output, each naming the folder by its final path and the training the run logged."""

    from trainutil import base_values, torch_threads, write_toml

    from aiayn.cli import main

    values = base_values(tmp_path / "data", max_steps=4, save_every=1, keep_last=4, valid_every=2)
    cfg = write_toml(tmp_path / "run.toml", values)
    run, avg = tmp_path / "run", tmp_path / "avg"
    with torch_threads(1):
        assert main(["train", str(cfg), "--out", str(run)]) == 0
        assert main(["average", str(run), "--last", "2", "-o", str(avg)]) == 0
        assert "None measured on this folder yet" in (avg / "README.md").read_text()
        data = tmp_path / "data"
        assert main(["evaluate", str(avg), "--src", str(data / "valid.src"),
                     "--ref", str(data / "valid.tgt"), "--beam", "2"]) == 0
    for folder in (run, run / "best", avg):
        card = (folder / "README.md").read_text()
        assert card.startswith(f"# {folder.name}: translation model"), folder
        assert "4 updates in" in card and "| hardware | not recorded |" not in card
        assert f"aiayn translate {folder}" in card
    avg_card = (avg / "README.md").read_text()
    assert "the average of 2 checkpoints (updates 3, 4)" in avg_card
    assert "| `eval_valid.json` | valid |" in avg_card and "beam 2" in avg_card  # evaluate refreshed it
    assert json.loads((run / "config.json").read_text())["hardware"]


def test_exported_folder_card(run):
    """`aiayn export` writes a folder whose config.json says its format: the card names it, and
    offers the commands that run it through its engine (not another export)."""
    run, _ = run
    folder = run / "ct2"
    folder.mkdir()
    meta = json.loads((run / "avg2" / "config.json").read_text())
    meta.update(format="ctranslate2", quantization="int8", exported_from=str(run / "avg2"))
    (folder / "config.json").write_text(json.dumps(meta))
    card = model_card(folder)
    assert card.startswith("# ct2: translation model (CTranslate2 export)")
    assert "| format | CTranslate2, int8, exported from" in card
    assert "aiayn translate" in card and "aiayn serve" in card and "aiayn export" not in card


def _translation_folder(tmp_path, name: str, **extra):
    cfg = ModelConfig(src_vocab_size=30, tgt_vocab_size=30, d_model=16, n_heads=2, d_ff=32,
                      n_encoder_layers=1, n_decoder_layers=1)
    return save_model_dir(tmp_path / name, Transformer(cfg), cfg, extra=extra)


def _shell(card: str) -> list[str]:
    """The lines of the card's shell block."""
    return card.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()


def test_a_model_of_own_files_is_evaluated_on_files(tmp_path):
    """Trained on files of one's own (no registered dataset), or with no data recorded: the card
    suggests --src/--ref (named after its languages), never a Multi30k split it cannot read."""
    own = _translation_folder(tmp_path, "own", data={
        "dataset": "", "train_src": "train.en", "train_tgt": "train.fr", "valid_src": "val.en",
        "valid_tgt": "val.fr", "src_lang": "en", "tgt_lang": "fr", "tokenizer": "char"})
    bare = _translation_folder(tmp_path, "bare")  # config.json without a data section
    for folder, files in ((own, "--src test.en --ref test.fr"), (bare, "--src test.src --ref test.tgt")):
        card = model_card(folder)
        evaluate = [line for line in _shell(card) if line.startswith("aiayn evaluate")]
        assert evaluate == [f"aiayn evaluate {folder} {files}   # your own test files"], card
        assert "--split" not in card


def test_registered_datasets_suggest_their_own_test_splits(tmp_path, monkeypatch):
    """The test splits come from the dataset registry: Multi30k's two, IMDB's one, and those of
    a dataset the registry gains (here a WMT-like one), never a hard-coded Multi30k split."""
    from aiayn.data import registry
    from aiayn.model import TransformerClassifier

    m30k = model_card(_translation_folder(tmp_path, "m30k", data={"dataset": "multi30k"}))
    assert [line for line in _shell(m30k) if line.startswith("aiayn evaluate")] == [
        f"aiayn evaluate {tmp_path / 'm30k'} --split test_2016_flickr",
        f"aiayn evaluate {tmp_path / 'm30k'} --split test_2017_flickr",
    ]
    toy = dataclasses.replace(registry.DATASETS["multi30k"], name="wmt_toy",
                              splits=("train", "val", "newstest2013", "newstest2014"))
    monkeypatch.setitem(registry.DATASETS, "wmt_toy", toy)
    wmt = model_card(_translation_folder(tmp_path, "wmt", data={"dataset": "wmt_toy"}))
    assert "--split newstest2013" in wmt and "--split newstest2014" in wmt
    assert "test_2016_flickr" not in wmt and "--split val" not in wmt
    paper = model_card(_translation_folder(  # the WMT14 recipes validate on newstest2013
        tmp_path, "paper", data={"dataset": "wmt_toy", "valid_split": "newstest2013"}))
    assert "--split newstest2014" in paper and "--split newstest2013" not in paper
    cfg = ModelConfig(src_vocab_size=30, tgt_vocab_size=30, d_model=16, n_heads=2, d_ff=32,
                      n_encoder_layers=1, n_decoder_layers=0, n_classes=2)
    own_clf = save_model_dir(tmp_path / "clf", TransformerClassifier(cfg), cfg, kind="classifier",
                             extra={"data": {"dataset": "", "train_file": "reviews.tsv"}})
    assert f"aiayn evaluate {own_clf} --src test.tsv" in model_card(own_clf)
    assert "--split" not in model_card(own_clf)


@pytest.mark.parametrize("fmt", ["onnx", "ctranslate2"])
def test_exported_folders_suggest_commands_that_run_their_engine(tmp_path, fmt):
    """An export's card runs the export: every command and aiayn.load name its engine, the test
    splits are still its dataset's, and it offers no second export."""
    source = _translation_folder(tmp_path, "model", data={"dataset": "multi30k"})
    folder = tmp_path / fmt
    folder.mkdir()
    meta = json.loads((source / "config.json").read_text())
    meta.update(format=fmt, exported_from=str(source))
    (folder / "config.json").write_text(json.dumps(meta))
    card = model_card(folder)
    shell = _shell(card)
    assert [line for line in shell if not line.endswith(f"--engine {fmt}")] == []
    assert f"aiayn evaluate {folder} --engine {fmt} --split test_2016_flickr" not in shell
    assert f"aiayn evaluate {folder} --split test_2016_flickr --engine {fmt}" in shell
    assert f'aiayn.load("{folder}", engine="{fmt}").translate(' in card
    assert "aiayn export" not in card
