"""Naive Bayes over hashed n-grams as a term of the classifier's logits (model.nb_ngrams)."""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

from aiayn.errors import ConfigError
from aiayn.model import TransformerClassifier
from aiayn.model.ngrams import NaiveBayesNgrams, ngram_buckets
from aiayn.run_config import build_run_config
from aiayn.train.classification import ClassificationTask
from aiayn.train.run import train_run
from trainutil import SHAPE_TRAIN, reviews, tiny_model_config, write_tsv

PAD = 0
CPU = torch.device("cpu")


def _texts():
    torch.manual_seed(0)
    ids = torch.randint(1, 12, (7, 9))
    ids[2, 5:] = PAD
    ids[4, 2:] = PAD
    return ids, torch.tensor([0, 1, 1, 0, 2, 0, 1])


def _grams(row: list[int], n: int) -> set[tuple[int, ...]]:
    real = [t for t in row if t != PAD]
    return {tuple(real[i : i + k]) for k in range(1, n + 1) for i in range(len(real) - k + 1)}


def test_each_distinct_ngram_is_kept_once():
    ids = torch.tensor([[5, 7, 9, PAD], [5, 5, 5, 5]])
    b, kept = ngram_buckets(ids, PAD, 2, 1_000_003)
    assert kept.sum(1).tolist() == [5, 2]  # 3 unigrams + 2 bigrams; (5) and (5, 5) once each
    row = b[0][kept[0]].tolist()
    assert len(set(row)) == 5
    flipped, kf = ngram_buckets(torch.tensor([[9, 7, 5]]), PAD, 2, 1_000_003)
    assert set(flipped[0][kf[0]].tolist()) != set(row)  # (5, 7) is not (7, 5)
    unigrams, ku = ngram_buckets(torch.tensor([[5, 7, 9]]), PAD, 1, 1_000_003)
    assert set(unigrams[0][ku[0]].tolist()) < set(row)  # the same unigrams at every order


def test_scores_are_binarized_naive_bayes_with_add_one_smoothing():
    ids, labels = _texts()
    buckets = 1_000_003  # no collisions among these few n-grams: the tables by hand below
    nb = NaiveBayesNgrams(3, buckets, 3, PAD, 1.0)
    nb.count(ids, labels)
    counts = [Counter() for _ in range(3)]
    for row, y in zip(ids.tolist(), labels.tolist()):
        counts[y].update(_grams(row, 3))  # each n-gram once per text
    texts = Counter(labels.tolist())
    query = [3, 4, 3, 4, 11, PAD]
    grams = _grams(query, 3)
    by_hand = [
        sum(math.log((counts[c][g] + 1) / (sum(counts[c].values()) + buckets)) for g in grams)
        + math.log(texts[c] + 1)
        for c in range(3)
    ]
    mean = sum(by_hand) / 3
    got = nb.scores(torch.tensor([query]))[0].tolist()
    assert got == pytest.approx([v - mean for v in by_hand], abs=1e-3)


def test_classifier_adds_the_scaled_scores_outside_training_only():
    cfg = tiny_model_config(vocab=30, max_len=64, n_decoder_layers=0, n_classes=3, dropout=0.0)
    plain = TransformerClassifier(cfg).eval()
    model = TransformerClassifier(tiny_model_config(
        vocab=30, max_len=64, n_decoder_layers=0, n_classes=3, dropout=0.0, nb_ngrams=2,
        nb_buckets=97, nb_scale=0.3)).eval()
    model.load_state_dict({**model.state_dict(), **plain.state_dict()})
    ids, labels = _texts()
    model.nb.count(ids, labels)
    out = model(ids)
    torch.testing.assert_close(out, plain(ids) + 0.3 * model.nb.scores(ids))
    assert not torch.allclose(out, plain(ids))
    torch.testing.assert_close(model.train()(ids), plain(ids))  # training: the network alone
    model.eval()
    for i in range(len(ids)):
        padded = torch.cat([ids[i], torch.full((3,), PAD)])[None]
        torch.testing.assert_close(model(padded), out[i : i + 1], atol=1e-5, rtol=1e-5)


def _values(tmp_path):
    return {
        "model.d_model": 16, "model.n_heads": 2, "model.d_ff": 32, "model.n_encoder_layers": 1,
        "model.n_decoder_layers": 0, "model.max_len": 100, "model.dropout": 0.0,
        "model.nb_ngrams": 2, "model.nb_buckets": 4096,
        "data.kind": "classification", "data.dataset": "",
        "data.train_file": write_tsv(tmp_path / "train.tsv", reviews(16, 0)),
        "data.valid_file": write_tsv(tmp_path / "valid.tsv", reviews(8, 1)),
        "data.tokenizer": "char", "data.vocab_size": 60, "data.max_len": 90,
        "data.max_tokens": 1200, **SHAPE_TRAIN,
    }


def test_the_task_counts_the_training_split_and_trains_the_network_alone(tmp_path):
    cfg = build_run_config(_values(tmp_path))
    task = ClassificationTask(cfg)
    task.setup(None)
    model = task.build_model(task.model_config(cfg.model)).train()
    everything = task.collate("train", list(range(16)))
    assert model.nb.texts.tolist() == torch.bincount(everything.labels, minlength=2).tolist()
    _, kept = ngram_buckets(everything.tokens, PAD, 2, 4096)
    assert model.nb.counts.sum() == kept.sum()  # each text's distinct buckets, once
    model.nb.scale = 0.5
    batch = task.collate("train", list(range(6)))
    stats = task.loss(model, batch, CPU)
    alone = F.cross_entropy(model(batch.tokens), batch.labels, reduction="sum")
    with torch.no_grad():
        fused = task.loss(model.eval(), batch, CPU)  # validation: the fused logits
    by_hand = F.cross_entropy(model(batch.tokens), batch.labels, reduction="sum")
    assert torch.allclose(stats.loss, alone) and torch.allclose(fused.loss, by_hand)
    assert not torch.allclose(fused.loss, stats.loss)


def test_nb_scale_script_scores_scales_and_writes_the_best(tmp_path, capsys):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import nb_scale

    run = tmp_path / "run"
    train_run(build_run_config({**_values(tmp_path), "train.max_steps": 3}), run)
    assert nb_scale.main([str(run), "--split", "valid", "--scales", "0", "5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines[:2]] == ["0", "5"] and "best on valid" in lines[2]
    best = float(lines[2].split()[3])
    assert nb_scale.main([str(run), "--split", "valid", "--scales", str(best), "--write"]) == 0
    assert json.loads((run / "config.json").read_text())["model"]["nb_scale"] == best
    assert nb_scale.main([str(tmp_path / "nothing"), "--split", "valid"]) == 2


def test_nb_settings_are_checked():
    with pytest.raises(ConfigError, match="nb_ngrams applies to encoder-only"):
        tiny_model_config(vocab=30, max_len=64, nb_ngrams=2)  # an encoder-decoder
    with pytest.raises(ConfigError, match="nb_ngrams must be >= 0"):
        tiny_model_config(vocab=30, max_len=64, n_decoder_layers=0, nb_ngrams=-1)
    with pytest.raises(ConfigError, match="nb_buckets >= 1"):
        tiny_model_config(vocab=30, max_len=64, n_decoder_layers=0, nb_ngrams=2, nb_buckets=0)
    with pytest.raises(ConfigError, match="nb_scale >= 0"):
        tiny_model_config(vocab=30, max_len=64, n_decoder_layers=0, nb_ngrams=2, nb_scale=-1.0)
