"""NBSVM over hashed word n-grams as a term of the classifier's logits (model.nb_ngrams)."""

from __future__ import annotations

import json
import math
import re
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.nn import functional as F

from aiayn.errors import ConfigError
from aiayn.folder.checkpoint import load_weights
from aiayn.model import TransformerClassifier
from aiayn.model.ngrams import C_REG, NBSVM, ngram_buckets, word_hash
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


def test_words_are_rebuilt_from_pieces_lower_cased_whatever_their_split():
    pieces = [
        "",
        "",
        "",
        "",
        " The",
        " mo",
        "vie",
        "!",
        "!!",
        " 10",
        "/",
        "10",
        " THE",
        "Mo",
        "VIE",
    ]
    nb = NBSVM(2, 97, 2, PAD, 1.0, len(pieces))
    nb.set_pieces(pieces)
    ids = torch.tensor(
        [[4, 5, 6, 7, 8, 9, 10, 11, 2, PAD], [12, 5, 13, 14, 1, 7, PAD, PAD, PAD, PAD]]
    )
    words = ["the", "movie", "!", "!!", "10", "/", "10"]  # specials (1, 2) are in no word
    assert nb.words(ids).tolist() == [
        [word_hash(w) for w in words] + [-1] * 3,
        [word_hash(w) for w in ["the", "momovie", "!"]] + [-1] * 7,
    ]
    plain = NBSVM(2, 97, 2, PAD, 1.0, len(pieces))  # tables unset: token n-grams
    assert plain.words(ids)[0].tolist() == ids[0, :9].tolist() + [-1]


def _log_count_ratio(ids, target, vocab, buckets):
    """r of each token in ``vocab`` by hand: texts holding it in the class and out (add-one)."""
    inside, outside = Counter(), Counter()
    for row, t in zip(ids.tolist(), target.tolist()):
        (inside if t else outside).update(set(row) - {PAD})
    return torch.tensor([
        math.log((inside[t] + 1) / (inside.total() + buckets))
        - math.log((outside[t] + 1) / (outside.total() + buckets))
        for t in vocab
    ])


@pytest.mark.parametrize("n_classes", [2, 3])
def test_fit_is_logistic_regression_on_naive_bayes_scaled_features(n_classes):
    ids, labels = _texts()
    labels = labels if n_classes == 3 else (labels > 0).long()
    buckets = 1_000_003  # no collisions among these few tokens: the features by hand below
    nb = NBSVM(1, buckets, n_classes, PAD, 1.0, 12)  # unigrams of tokens (tables unset)
    found = nb.fit([(ids[:4], labels[:4]), (ids[4:], labels[4:])])
    vocab = sorted({t for t in ids.flatten().tolist() if t != PAD})
    assert found["texts"] == 7 and found["buckets_used"] == len(vocab)
    x = torch.tensor([[float(t in row) for t in vocab] for row in ids.tolist()])  # binarized
    bucket = torch.stack([ngram_buckets(torch.tensor([[t]]), PAD, 1, buckets)[0][0, 0] for t in vocab])
    # two classes: one model of class 1 against 0 (its margin the columns' difference);
    # more: one model per class against the others (each column)
    models = [(1, nb.weight[bucket, 1] - nb.weight[bucket, 0], nb.bias[1] - nb.bias[0])] if (
        n_classes == 2) else [(k, nb.weight[bucket, k], nb.bias[k]) for k in range(n_classes)]
    margins = []
    for k, rw, bias in models:  # rw: each token's weight in the margin, r × w
        r = _log_count_ratio(ids, labels == k, vocab, buckets)
        z = x @ rw + bias
        # the minimum of ½|w|² + C Σ loss(z) over w and an unpenalised bias: the gradient is zero
        d = C_REG * (torch.sigmoid(z) - (labels == k).float())
        assert abs(d.sum().item()) < 1e-4
        torch.testing.assert_close(rw, -r * (d @ (x * r)), atol=1e-4, rtol=1e-3)  # w = -C Σ d x r
        assert rw.abs().max() > 0.01
        margins.append(z)
    z = torch.stack(margins, 1)
    predicted = (z[:, 0] > 0).long() if n_classes == 2 else z.argmax(1)
    assert found["train_accuracy"] == pytest.approx((predicted == labels).float().mean().item())
    scores = nb.scores(ids)
    if n_classes == 2:
        torch.testing.assert_close(scores[:, 1] - scores[:, 0], z[:, 0])
    else:
        torch.testing.assert_close(scores, z - z.mean(1, keepdim=True))


def test_fit_refuses_what_it_cannot_fit():
    nb = NBSVM(1, 97, 2, PAD, 1.0, 12)
    with pytest.raises(ValueError, match="no training text"):
        nb.fit([])
    with pytest.raises(ValueError, match="labels must lie in 0 … 1"):
        nb.fit([(torch.tensor([[4, 5]]), torch.tensor([2]))])


def test_weights_files_of_naive_bayes_counts_load_as_what_they_were(tmp_path):
    ids, labels = _texts()
    buckets = 4099  # few enough for a small file; the tables by hand below use the same buckets
    counts = torch.zeros(buckets, 3)
    b, kept = ngram_buckets(ids, PAD, 3, buckets)
    counts.index_put_((b[kept], labels[:, None].expand_as(b)[kept]), torch.ones(int(kept.sum())), True)
    texts = torch.bincount(labels, minlength=3).float()
    cfg = dict(vocab=12, max_len=64, n_decoder_layers=0, n_classes=3, nb_ngrams=3, nb_buckets=buckets)
    model = TransformerClassifier(tiny_model_config(**cfg)).eval()
    old = {k: v for k, v in model.state_dict().items() if not k.startswith("nb.")}
    save_file({**old, "nb.counts": counts, "nb.texts": texts}, str(tmp_path / "model.safetensors"))
    loaded = TransformerClassifier(tiny_model_config(**cfg)).eval()
    loaded.nb.set_pieces([""] * 4 + [f" w{i}" for i in range(8)])  # a word vocabulary: replaced
    load_weights(loaded, tmp_path / "model.safetensors")
    query = torch.tensor([[3, 4, 3, 4, 11, PAD]])
    qb, qk = ngram_buckets(query, PAD, 3, buckets)
    grams = qb[0][qk[0]]  # the query's distinct buckets: multinomial naive Bayes written out
    loglik = ((counts[grams] + 1).log() - (counts.sum(0) + buckets).log()).sum(0) + (texts + 1).log()
    torch.testing.assert_close(loaded.nb.scores(query)[0], loglik - loglik.mean(), atol=1e-4, rtol=1e-5)


def test_classifier_adds_the_scaled_scores_outside_training_only():
    cfg = tiny_model_config(vocab=30, max_len=64, n_decoder_layers=0, n_classes=3, dropout=0.0)
    plain = TransformerClassifier(cfg).eval()
    model = TransformerClassifier(
        tiny_model_config(
            vocab=30,
            max_len=64,
            n_decoder_layers=0,
            n_classes=3,
            dropout=0.0,
            nb_ngrams=2,
            nb_buckets=97,
            nb_scale=0.3,
        )
    ).eval()
    model.load_state_dict({**model.state_dict(), **plain.state_dict()})
    ids, labels = _texts()
    model.nb.fit([(ids, labels)])
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
        "model.d_model": 16,
        "model.n_heads": 2,
        "model.d_ff": 32,
        "model.n_encoder_layers": 1,
        "model.n_decoder_layers": 0,
        "model.max_len": 100,
        "model.dropout": 0.0,
        "model.nb_ngrams": 2,
        "model.nb_buckets": 4096,
        "data.kind": "classification",
        "data.dataset": "",
        "data.train_file": write_tsv(tmp_path / "train.tsv", reviews(16, 0)),
        "data.valid_file": write_tsv(tmp_path / "valid.tsv", reviews(8, 1)),
        "data.tokenizer": "char",
        "data.vocab_size": 60,
        "data.max_len": 90,
        "data.max_tokens": 1200,
        **SHAPE_TRAIN,
    }


def test_the_task_fits_on_the_training_split_and_trains_the_network_alone(tmp_path):
    cfg = build_run_config(_values(tmp_path))
    task = ClassificationTask(cfg)
    task.setup(None)
    model = task.build_model(task.model_config(cfg.model)).train()
    task.fit_before_training(model, ["embed.token.weight"])  # a masked LM's: fitted here
    everything = task.collate("train", list(range(16)))
    vocab = task.tokenizer.vocab_size
    again = NBSVM(2, 4096, 2, PAD, 1.0, vocab)
    again.set_pieces([task.tokenizer.decode([i]) for i in range(vocab)])  # words of characters
    again.fit([(everything.tokens, everything.labels)])
    torch.testing.assert_close(model.nb.weight, again.weight)
    torch.testing.assert_close(model.nb.bias, again.bias)
    texts = [task.tokenizer.decode(row) for row in everything.tokens]
    words = [len(re.findall(r"[^\W\d_]+|\d+|\S", t)) for t in texts]  # runs of letters, of digits
    assert (model.nb.words(everything.tokens) >= 0).sum(1).tolist() == words
    assert sum(words) < sum(len(t.replace(" ", "")) for t in texts)  # words, not characters
    model.nb.scale = 0.5
    batch = task.collate("train", list(range(6)))
    stats = task.loss(model, batch, CPU)
    alone = F.cross_entropy(model(batch.tokens), batch.labels, reduction="sum")
    with torch.no_grad():
        fused = task.loss(model.eval(), batch, CPU)  # validation: the fused logits
    by_hand = F.cross_entropy(model(batch.tokens), batch.labels, reduction="sum")
    assert torch.allclose(stats.loss, alone) and torch.allclose(fused.loss, by_hand)
    assert not torch.allclose(fused.loss, stats.loss)
    model.nb.weight.zero_()
    task.fit_before_training(model, list(model.state_dict()))  # a classifier folder's: kept
    assert not model.nb.weight.any()


def test_resume_and_init_from_keep_the_fitted_term_without_fitting_again(tmp_path, monkeypatch):
    run, short = tmp_path / "run", {"train.max_steps": 2}
    train_run(build_run_config({**_values(tmp_path), **short}), run)
    fitted = load_file(run / "model.safetensors")["nb.weight"]
    assert fitted.abs().sum() > 0

    def refuse(self, batches):
        raise AssertionError("fitted again")

    monkeypatch.setattr(NBSVM, "fit", refuse)
    longer = build_run_config({**_values(tmp_path), "train.max_steps": 4})
    train_run(longer, run, resume=True)
    tuned = tmp_path / "tuned"
    train_run(build_run_config({**_values(tmp_path), **short, "train.init_from": str(run)}), tuned)
    for folder in run, tuned:
        torch.testing.assert_close(load_file(folder / "model.safetensors")["nb.weight"], fitted)
    with pytest.raises(AssertionError, match="fitted again"):  # a new run does fit
        train_run(build_run_config({**_values(tmp_path), **short}), tmp_path / "new")


def test_resume_upgrades_naive_bayes_counts_in_the_saved_moving_average(tmp_path):
    values = {**_values(tmp_path), "train.max_steps": 2, "train.ema_decay": 0.9}
    run = tmp_path / "run"
    train_run(build_run_config(values), run)
    path = run / "trainer_state.pt"
    state = torch.load(path, weights_only=True)
    live = load_file(run / "checkpoints" / state["snapshot"])["nb.weight"]  # fitted, not trained
    ema = state["ema"]
    del ema["nb.weight"], ema["nb.bias"]  # the average as saved before NBSVM: counts
    counts = torch.randint(0, 5, (len(live), 2), generator=torch.Generator().manual_seed(0)).float()
    ema["nb.counts"], ema["nb.texts"] = counts, torch.tensor([8.0, 8.0])
    torch.save(state, path)
    train_run(build_run_config({**values, "train.max_steps": 3}), run, resume=True)
    old = (counts + 1).log() - (counts.sum(0) + len(counts)).log()  # the counts' weights
    averaged = load_file(run / "model.safetensors")["nb.weight"]  # the average, one update on
    torch.testing.assert_close(averaged, 0.9 * old + 0.1 * live)


def test_nb_scale_script_scores_scales_and_writes_the_best(tmp_path, capsys):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import nb_scale

    run = tmp_path / "run"
    train_run(build_run_config({**_values(tmp_path), "train.max_steps": 3}), run)
    assert nb_scale.main([str(run), "--split", "valid", "--scales", "0", "5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines[:2]] == ["0", "5"] and "NBSVM alone" in lines[2]
    assert "best on valid" in lines[3]
    best = float(lines[3].split()[3])
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
