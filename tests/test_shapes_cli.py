"""The other two shapes through the one trainer and the CLI: an encoder-only classifier and a
decoder-only language model overfit tiny data (`aiayn train`), `aiayn classify` / `evaluate`
give the training labels back, `aiayn generate` recites the text it memorised; cached generation
equals uncached; predictions do not depend on batch composition or padding; bad input fails in one
clear line."""

from __future__ import annotations

import json

import pytest
import torch

from aiayn.cli import main
from aiayn.data.clean import clean_text
from aiayn.decode.classify import predict_ids
from aiayn.decode.config import SamplingConfig
from aiayn.decode.generate import generate, lm_step
from aiayn.model import TransformerClassifier, TransformerLM
from aiayn.run_config import build_run_config
from aiayn.train.lm import LanguageModelTask
from trainutil import SHAPE_TRAIN, fails, one_thread, reviews, write_toml, write_tsv  # noqa: F401
from trainutil import tiny_model_config, torch_threads

POEM = ("Shall I compare thee to a summer's day?\nThou art more lovely and more temperate:\n"
        "Rough winds do shake the darling buds of May,\n"
        "And summer's lease hath all too short a date.\n")



# ---- tiny data ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def classifier_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("clf")
    train = write_tsv(tmp / "train.tsv", reviews(64, 0))
    valid = write_tsv(tmp / "valid.tsv", reviews(16, 1))
    values = {
        "model.d_model": 32, "model.n_heads": 2, "model.d_ff": 64, "model.n_encoder_layers": 1,
        "model.n_decoder_layers": 0, "model.dropout": 0.0, "model.max_len": 100,
        "model.pooling": "max",
        "data.kind": "classification", "data.dataset": "", "data.train_file": train,
        "data.valid_file": valid, "data.tokenizer": "char", "data.vocab_size": 60,
        "data.max_len": 90, "data.long_examples": "truncate", "data.max_tokens": 1200,
        **SHAPE_TRAIN, "train.max_steps": 60, "train.valid_every": 30, "train.metrics_every": 30,
        "train.save_every": 30,
    }
    cfg = write_toml(tmp / "clf.toml", values)
    with torch_threads(1):
        assert main(["train", str(cfg), "--out", str(tmp / "run")]) == 0
    return tmp, tmp / "run"


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lm")
    text = tmp / "poem.txt"
    text.write_text(POEM * 3, encoding="utf-8")  # each line at many offsets of a window
    values = {
        "model.d_model": 48, "model.n_heads": 2, "model.d_ff": 96, "model.n_encoder_layers": 0,
        "model.n_decoder_layers": 2, "model.dropout": 0.0, "model.max_len": 48,
        "model.norm_first": True,
        "data.kind": "lm", "data.dataset": "", "data.train_file": str(text),
        "data.valid_file": str(text), "data.tokenizer": "char", "data.vocab_size": 80,
        "data.max_len": 48, "data.max_tokens": 768,
        **SHAPE_TRAIN, "train.lr_schedule": "constant", "train.lr": 3e-3, "train.max_steps": 300,
        "train.valid_every": 300, "train.save_every": 300,
    }
    cfg = write_toml(tmp / "lm.toml", values)
    with torch_threads(1):
        assert main(["train", str(cfg), "--out", str(tmp / "run")]) == 0
    return tmp, tmp / "run"


# ---- the classifier ------------------------------------------------------------------------------


def test_classifier_overfits_and_classify_gives_the_labels(classifier_run, capsys):
    tmp, run = classifier_run
    meta = json.loads((run / "config.json").read_text())
    assert meta["kind"] == meta["data"]["kind"] == "classification" and "task" not in meta
    assert meta["model"]["n_decoder_layers"] == 0 and meta["model"]["pooling"] == "max"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["valid_acc"] == 1.0 and metrics[-1]["loss"] < 0.1
    rows = reviews(64, 0)
    (tmp / "in.txt").write_text("\n".join(text for _, text in rows[:8]) + "\n\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["classify", str(run / "best"), "--input", str(tmp / "in.txt")]) == 0
    lines = capsys.readouterr().out.split("\n")
    assert lines[8] == "" and len(lines) == 10  # the blank input line stays blank
    for (label, _), line in zip(rows[:8], lines):
        name, prob = line.split("\t")
        assert name == str(label) and 0.5 < float(prob) <= 1.0


def test_evaluate_reports_accuracy_for_a_classifier(classifier_run, capsys):
    tmp, run = classifier_run
    capsys.readouterr()
    out = tmp / "scores.json"
    args = ["evaluate", str(run / "best"), "--src", str(tmp / "train.tsv"), "-o", str(out)]
    assert main(args) == 0
    assert capsys.readouterr().out.startswith("accuracy 100.00% (64/64) on train")
    scores = json.loads(out.read_text())
    assert scores["accuracy"] == 1.0 and scores["n"] == 64 and scores["max_len"] == 90
    fails(capsys, ["evaluate", str(run / "best")], "give either --split NAME or --src FILE")
    for command in (["evaluate", str(run / "best"), "--src", str(tmp / "train.tsv")],
                    ["classify", str(run / "best"), "-i", str(tmp / "train.tsv")]):
        fails(capsys, [*command, "--batch-tokens", "-1"], "--batch-tokens must be >= 1, got -1")


def _random_classifier(pooling: str) -> TransformerClassifier:
    cfg = tiny_model_config(vocab=30, max_len=40, d_model=16, n_heads=2, d_ff=32,
                            n_decoder_layers=0, pooling=pooling, dropout=0.1)
    return TransformerClassifier(cfg).eval()


@pytest.mark.parametrize("pooling", ["mean", "max", "cls"])
def test_predictions_do_not_depend_on_batch_composition_or_padding(pooling):
    model = _random_classifier(pooling)
    gen = torch.Generator().manual_seed(0)
    items = [torch.randint(4, 30, (n,), generator=gen).tolist() for n in (3, 17, 8, 30, 1, 12)]
    alone = torch.cat([predict_ids(model, [x]) for x in items])  # (N, C), no padding at all
    together = predict_ids(model, items, max_tokens=10_000)  # one batch, padded to 30
    split = predict_ids(model, items[::-1], max_tokens=40).flip(0)  # other batches, other order
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(split, alone, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(alone[0], alone[1])  # the texts do get different predictions


def test_classify_output_is_the_same_alone_or_in_a_file(classifier_run, capsys):
    tmp, run = classifier_run
    texts = [text for _, text in reviews(10, 5)]
    texts[3] = texts[3] * 5  # longer than data.max_len: cut, as in training
    (tmp / "many.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["classify", str(run / "best"), "-i", str(tmp / "many.txt")]) == 0
    together = capsys.readouterr().out.splitlines()
    for text, line in zip(texts, together):
        (tmp / "one.txt").write_text(text + "\n", encoding="utf-8")
        assert main(["classify", str(run / "best"), "-i", str(tmp / "one.txt")]) == 0
        assert capsys.readouterr().out.splitlines() == [line]


# ---- the language model --------------------------------------------------------------------------


def test_lm_overfits_and_generate_recites_the_text(lm_run, capsys):
    tmp, run = lm_run
    meta = json.loads((run / "config.json").read_text())
    assert meta["kind"] == "lm" and meta["model"]["n_encoder_layers"] == 0
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # nats per character on the memorised text (a window's first characters have little context)
    assert metrics[-1]["loss"] < 0.2 and metrics[-1]["valid_loss"] < 0.2
    capsys.readouterr()
    prompt = "Shall I compare thee"
    assert main(["generate", str(run / "best"), "--prompt", prompt, "--max-new-tokens", "30",
                 "--top-k", "1", "--seed", "0"]) == 0
    out = capsys.readouterr().out
    assert out == POEM[:len(prompt) + 30] + "\n"


def test_generate_streams_each_token_as_it_is_drawn(lm_run):
    from aiayn.folder import load_model_dir

    _, run = lm_run
    model, _, _ = load_model_dir(run / "best")
    seen: list[int] = []
    calls: list[int] = []
    original = model.forward

    def counting(ids, cache=None, attn_record=None):
        calls.append(len(seen))  # tokens streamed before this forward pass
        return original(ids, cache, attn_record)

    model.forward = counting
    out = generate(model, [10, 11, 12], 48, SamplingConfig(6, seed=1), on_token=seen.append)
    assert seen == out and len(out) == 6
    assert calls == [0, 1, 2, 3, 4, 5]  # token i was handed out before step i + 1 ran


def _random_lm(max_len: int = 64) -> TransformerLM:
    cfg = tiny_model_config(vocab=40, max_len=max_len, n_encoder_layers=0, dropout=0.1)
    return TransformerLM(cfg).eval()


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (5, 1.0), (0, 0.9)])
def test_cached_generation_equals_uncached(top_k, top_p):
    model = _random_lm()
    prompt = [5, 9, 14, 7]
    sampling = SamplingConfig(50, temperature=0.8, top_k=top_k, top_p=top_p, seed=3)
    cached = generate(model, prompt, 64, sampling, use_cache=True)
    uncached = generate(model, prompt, 64, sampling, use_cache=False)
    assert cached == uncached and len(cached) == 50
    assert all(t >= 4 for t in cached)  # special tokens are never sampled


def test_cached_step_log_probs_equal_full_pass_and_slide_past_the_window():
    model = _random_lm(max_len=16)
    tokens = torch.randint(4, 40, (1, 40), generator=torch.Generator().manual_seed(0))
    cached_step, full_step = lm_step(model, 16), lm_step(model, 16, use_cache=False)
    state = None
    for t in range(3, 41):
        lp, state = cached_step(tokens[:, :t], state)
        if t <= 16:  # the whole text fits one window: identical to re-reading it
            torch.testing.assert_close(lp, full_step(tokens[:, :t], None)[0], atol=1e-5, rtol=1e-4)
        assert state.cache.length <= 16  # never past the positions the model has
    keep = state.cache.length  # after sliding, the cache holds the last `keep` tokens
    torch.testing.assert_close(lp, full_step(tokens[:, -keep:], None)[0], atol=1e-5, rtol=1e-4)


def test_generate_cli_cached_equals_no_cache(lm_run, capsys):
    _, run = lm_run
    args = ["generate", str(run / "best"), "--prompt", "Rough", "--max-new-tokens", "25",
            "--temperature", "1.5", "--seed", "7"]
    assert main(args) == 0
    cached = capsys.readouterr().out
    assert main(args + ["--no-cache"]) == 0
    assert capsys.readouterr().out == cached and cached.startswith("Rough")


def test_lm_batches_are_deterministic_and_validation_covers_every_token(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("abcdefghij" * 50 + "xyz", encoding="utf-8")
    cfg = build_run_config({"data.kind": "lm", "data.dataset": "", "data.train_file": str(text),
                            "data.valid_file": str(text), "data.tokenizer": "char",
                            "data.max_len": 16, "data.max_tokens": 64, "model.max_len": 16})
    task = LanguageModelTask(cfg)
    task.setup(None)
    assert task.epoch_batches(1, 0, 1) == task.epoch_batches(1, 0, 1) != task.epoch_batches(2, 0, 1)
    assert all(len(b) == 4 for b in task.epoch_batches(1, 0, 1))
    ranks = [task.epoch_batches(1, r, 2) for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) and ranks[0] != ranks[1]
    x, y = task.collate("train", task.epoch_batches(1, 0, 1)[0])
    assert x.shape == y.shape == (4, 16) and torch.equal(x[:, 1:], y[:, :-1])
    n = sum(task.num_targets(task.collate("valid", b)) for b in task.valid_batches(0, 1))
    assert n == len(task.ids["valid"]) - 1  # every token but the first is predicted once


# ---- cleaning and bad input ----------------------------------------------------------------------


def test_clean_text_removes_html_breaks_and_control_characters():
    raw = "Great film.<br /><br />The end\x96really\x85 \x91fun\x92 \x08 co\xadop<BR>x\uf0b7y"
    assert clean_text(raw) == "Great film. The end–really… ‘fun’ coop x y"
    assert clean_text("  plain\ttext  ") == "plain\ttext"


def test_bad_input_is_one_clear_line(classifier_run, lm_run, capsys, tmp_path):
    _, clf = classifier_run
    _, lm = lm_run
    fails(capsys, ["generate", str(clf / "best"), "--prompt", "x"], "this command needs 'lm'")
    fails(capsys, ["classify", str(lm / "best")], "this command needs 'classification'")
    fails(capsys, ["generate", str(lm / "best"), "--prompt", ""], "--prompt is empty")
    fails(capsys, ["generate", str(lm / "best"), "--prompt", "S", "--top-p", "0"], "--top-p")
    fails(capsys, ["generate", str(lm / "best"), "--prompt", "S", "--temperature", "0"],
           "--temperature")
    fails(capsys, ["generate", str(lm / "best"), "--prompt", "S", "--max-new-tokens", "0"],
           "--max-new-tokens")
    fails(capsys, ["generate", str(tmp_path / "nope"), "--prompt", "S"], "model folder not found")


def test_config_errors_name_the_problem(classifier_run, capsys, tmp_path):
    tmp, _ = classifier_run
    base = {"data.kind": "classification", "data.dataset": "", "data.tokenizer": "char",
            "data.train_file": str(tmp / "train.tsv"), "data.valid_file": str(tmp / "valid.tsv"),
            "model.n_encoder_layers": 1, "model.d_model": 16, "model.n_heads": 2, **SHAPE_TRAIN}
    cfg = write_toml(tmp_path / "a.toml", {**base, "model.n_classes": 1, "data.max_len": 24,
                                            "model.max_len": 32})
    fails(capsys, ["train", str(cfg), "--out", str(tmp_path / "a")], "model.n_classes = 1")
    cfg = write_toml(tmp_path / "b.toml", {**base, "data.max_len": 64, "model.max_len": 32})
    fails(capsys, ["train", str(cfg), "--out", str(tmp_path / "b")], "model.max_len (32) is below data.max_len (64)")
