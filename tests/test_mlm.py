"""Masked-language-model pre-training (``data.kind = "masked_lm"``) and starting a classifier from
it (``train.init_from``): BERT's corruption in the right proportions and never on padding, a
padded text predicted as it is alone, the pre-trained embedding and encoder copied exactly into a
classifier that shares the tokenizer, and one clear error for models that do not fit together."""

from __future__ import annotations

import collections
import json
import math

import pytest
import torch

from aiayn.folder.checkpoint import init_from_model_dir
from aiayn.folder import load_model_dir
from aiayn.cli import main
from aiayn.config import ModelConfig
from aiayn.data.clean import clean_text
from aiayn.model import TransformerClassifier, TransformerMaskedLM
from aiayn.train.mlm import mask_tokens
from trainutil import SHAPE_TRAIN, fails, one_thread, reviews, write_toml, write_tsv  # noqa: F401
from trainutil import tiny_model_config

PAD, MASK, V = 0, 1, 50


def _padded_batch(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(4, V, (64, 300), generator=g)  # (B, S)
    lengths = torch.randint(1, 301, (64,), generator=g)
    tokens[torch.arange(300)[None, :] >= lengths[:, None]] = PAD
    return tokens


def test_corruption_follows_bert():
    tokens = _padded_batch()
    real = tokens != PAD
    inputs, targets = mask_tokens(tokens, 0.15, MASK, PAD, V, torch.Generator().manual_seed(1))
    chosen = targets != PAD
    assert not (chosen & ~real).any()  # padding is never a target
    assert torch.equal(targets[chosen], tokens[chosen])
    assert torch.equal(inputs[~chosen], tokens[~chosen])  # the rest is shown as it is
    assert abs(chosen.sum() / real.sum() - 0.15) < 0.01
    shown = inputs[chosen]
    masked = (shown == MASK).float().mean()
    kept = (shown == tokens[chosen]).float().mean()  # 10% kept (+ random draws of the same token)
    assert abs(masked - 0.8) < 0.02 and abs(kept - 0.1) < 0.02
    assert ((shown >= 4) | (shown == MASK)).all() and (shown < V).all()  # no other specials


def test_every_batch_has_a_target_and_masks_repeat_with_the_generator():
    tokens = _padded_batch(3)
    _, targets = mask_tokens(tokens, 1e-9, MASK, PAD, V)
    assert int((targets != PAD).sum()) == 1
    a = mask_tokens(tokens, 0.15, MASK, PAD, V, torch.Generator().manual_seed(5))
    b = mask_tokens(tokens, 0.15, MASK, PAD, V, torch.Generator().manual_seed(5))
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def _cfg(**kw) -> ModelConfig:
    return tiny_model_config(vocab=V, max_len=64, n_heads=2, n_decoder_layers=0, **kw)


def test_a_padded_text_is_predicted_as_it_is_alone():
    torch.manual_seed(0)
    model = TransformerMaskedLM(_cfg()).eval()
    assert model.generator.weight is model.embed.token.weight  # tied (§3.4)
    short = torch.randint(4, V, (1, 7))
    batch = torch.full((2, 12), PAD)
    batch[0, :7] = short[0]
    batch[1] = torch.randint(4, V, (12,))
    with torch.no_grad():
        torch.testing.assert_close(model(batch)[0, :7], model(short)[0], rtol=1e-5, atol=1e-5)


def test_init_from_copies_embedding_and_encoder(tmp_path):
    from aiayn.folder.checkpoint import save_model_dir

    torch.manual_seed(0)
    mlm = TransformerMaskedLM(_cfg())
    save_model_dir(tmp_path / "mlm", mlm, mlm.cfg, kind="masked_lm")
    torch.manual_seed(1)
    clf = TransformerClassifier(_cfg(n_classes=3))
    head = clf.head.weight.detach().clone()
    copied, fresh = init_from_model_dir(clf, tmp_path / "mlm")
    assert sorted(fresh) == ["head.bias", "head.weight"]
    state = mlm.state_dict()
    for name, tensor in clf.state_dict().items():
        if name in copied:
            assert torch.equal(tensor, state[name]), name
    assert any(n.startswith("encoder.") for n in copied) and "embed.token.weight" in copied
    assert torch.equal(clf.head.weight, head)
    from aiayn.errors import ConfigError

    with pytest.raises(ConfigError, match="shape"):
        init_from_model_dir(TransformerClassifier(_cfg(d_ff=48, n_classes=2)), tmp_path / "mlm")


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mlm")
    train = write_tsv(tmp / "train.tsv", reviews(64, 0))
    valid = write_tsv(tmp / "valid.tsv", reviews(16, 1))
    data = {"data.dataset": "", "data.train_file": train, "data.valid_file": valid,
            "data.tokenizer": "char", "data.vocab_size": 60, "data.max_len": 90,
            "data.long_examples": "truncate", "data.max_tokens": 1200}
    model = {"model.d_model": 32, "model.n_heads": 2, "model.d_ff": 64,
             "model.n_encoder_layers": 1, "model.n_decoder_layers": 0, "model.dropout": 0.0,
             "model.max_len": 100}
    cfg = write_toml(tmp / "mlm.toml", {**model, **data, "data.kind": "masked_lm", **SHAPE_TRAIN,
                                        "train.max_steps": 150, "train.valid_every": 50,
                                        "train.save_every": 50})
    assert main(["train", str(cfg), "--out", str(tmp / "mlm")]) == 0
    return tmp, model, data


def test_pretraining_learns_and_a_classifier_starts_from_it(pretrained):
    tmp, model, data = pretrained
    run = tmp / "mlm"
    records = map(json.loads, open(run / "metrics.jsonl"))
    losses = [r["valid_loss"] for r in records if "valid_loss" in r]
    # Below the entropy of the characters' frequencies, the best a guess without context can do.
    text = "".join(clean_text(t) for _, t in reviews(16, 1))
    counts = collections.Counter(text).values()
    unigram = -sum(c / len(text) * math.log(c / len(text)) for c in counts)  # 2.79 nats
    assert len(losses) == 3 and losses[-1] < unigram - 0.2
    assert json.loads((run / "config.json").read_text())["kind"] == "masked_lm"
    # data.vocab_size differs: the pretrained tokenizer is used, and config.json says so
    cfg = write_toml(tmp / "clf.toml", {**model, **data, "data.vocab_size": 40,
                                        "data.kind": "classification",
                                        "model.pooling": "mean", **SHAPE_TRAIN,
                                        "train.max_steps": 1, "train.lr": 1e-9,
                                        "train.warmup_steps": 0,
                                        "train.init_from": str(run / "best")})
    assert main(["train", str(cfg), "--out", str(tmp / "clf")]) == 0
    tokenizer = (run / "best" / "tokenizer.json").read_text()
    assert (tmp / "clf" / "tokenizer.json").read_text() == tokenizer
    assert json.loads((tmp / "clf" / "config.json").read_text())["data"]["vocab_size"] == 60
    mlm, _, _ = load_model_dir(run / "best")
    clf, _, _ = load_model_dir(tmp / "clf")
    torch.testing.assert_close(clf.encoder.layers[0].self_attn.q_proj.weight,
                               mlm.encoder.layers[0].self_attn.q_proj.weight, rtol=0, atol=1e-6)


def test_models_that_do_not_fit_together_fail_in_one_line(pretrained, capsys, tmp_path):
    tmp, model, data = pretrained
    base = {**model, **data, "data.kind": "classification", **SHAPE_TRAIN, "train.max_steps": 1}
    cfg = write_toml(tmp_path / "a.toml", {**base, "model.d_model": 16,
                                           "train.init_from": str(tmp / "mlm" / "best")})
    fails(capsys, ["train", str(cfg), "--out", str(tmp_path / "a")], "settings differ")
    assert not (tmp_path / "a" / "model.safetensors").exists()
    cfg = write_toml(tmp_path / "b.toml", {**base, "train.init_from": str(tmp_path / "nope")})
    fails(capsys, ["train", str(cfg), "--out", str(tmp_path / "b")], "model folder not found")
    cfg = write_toml(tmp_path / "c.toml", {**base, "data.kind": "masked_lm", "data.mask_prob": 0})
    fails(capsys, ["train", str(cfg), "--out", str(tmp_path / "c")], "data.mask_prob")
    cfg = write_toml(tmp_path / "d.toml", {**base, "data.kind": "masked_lm",
                                           "model.pooling": "cls"})
    fails(capsys, ["train", str(cfg), "--out", str(tmp_path / "d")], "no CLS token")
    for i, setting in enumerate(({"model.bigram_buckets": 64}, {"model.token_dropout": 0.1})):
        cfg = write_toml(tmp_path / f"e{i}.toml", {**base, "data.kind": "masked_lm", **setting})
        fails(capsys, ["train", str(cfg), "--out", str(tmp_path / f"e{i}")],
              f"set {next(iter(setting))} in the classifier run")
    fails(capsys, ["classify", str(tmp / "mlm" / "best")], "this command needs 'classification'")
