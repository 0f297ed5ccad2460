"""Ensembles: several models decoding as one, through the same search and CLI as one model; several
text classifiers whose class probabilities are averaged.

Random small models stand in for trained ones: what is checked is the arithmetic (the mean of
the models' distributions, step by step with each model's cache), that an ensemble of one model
or of two copies decodes as that model, batch invariance, and every bad combination of folders.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from trainutil import fails, tiny_model_config

from aiayn.decode import DecodeConfig, Ensemble, translate_ids
from aiayn.decode.classify import predict_ids
from aiayn.decode.ensemble import ClassifierEnsemble
from aiayn.folder import load_model_folder
from aiayn.errors import CheckpointError
from aiayn.model import Transformer, TransformerClassifier
from test_translate_cli import cli, make_model_dir, sentences, write_lines

pytestmark = pytest.mark.usefixtures("one_thread")

V = 40


def model(seed: int, **overrides) -> Transformer:
    cfg = tiny_model_config(V, **{"max_len": 40, **overrides})
    torch.manual_seed(seed)
    return Transformer(cfg).eval()


def sources(n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(4, V, (int(torch.randint(1, 12, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


@torch.no_grad()
def mean_distribution_greedy(models: list[Transformer], src: list[int], steps: int) -> list[int]:
    """Greedy decoding written out: every step runs each model on the whole prefix (no cache) and
    takes the argmax of the mean of their softmaxes."""
    cfg = models[0].cfg
    x = torch.tensor([src + [cfg.eos_id]])
    prefix = [cfg.bos_id]
    for _ in range(steps):
        y = torch.tensor([prefix])
        p = sum(torch.softmax(m(x, y)[0, -1].double(), -1) for m in models) / len(models)
        token = int(p.argmax())
        if token == cfg.eos_id:
            break
        prefix.append(token)
    return prefix[1:]


def test_ensemble_step_is_the_mean_of_the_models_distributions():
    a, b = model(1), model(2, norm_first=True, d_ff=48)  # members may differ in all but vocabulary
    ens = Ensemble([a, b])
    src = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 0]])
    tgt = torch.tensor([[1, 11, 12, 13], [1, 14, 15, 16]])
    memory = ens.encode(src)
    cache = ens.init_cache(memory, src=src)
    steps = [ens.log_probs(tgt[:, t:t + 1], memory, cache) for t in range(tgt.size(1))]  # (B, 1, V) each
    got = torch.cat(steps, dim=1)
    want = torch.log((torch.softmax(a(src, tgt).double(), -1) + torch.softmax(b(src, tgt).double(), -1)) / 2)
    assert cache.length == 4 and all(c.length == 4 for c in cache.caches)
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=0)
    assert torch.allclose(got.exp().sum(-1), torch.ones(2, 4))  # a distribution at every step


def test_greedy_ensemble_equals_the_written_out_mean_distribution_search():
    a, b = model(1), model(2)
    srcs = sources(6, 0)
    cfg = DecodeConfig(beam=1, max_len_a=0.0, max_len_b=10)
    got = [h[0].tokens for h in translate_ids(Ensemble([a, b]), srcs, cfg)]
    assert got == [mean_distribution_greedy([a, b], s, 10) for s in srcs]
    assert got != [h[0].tokens for h in translate_ids(a, srcs, cfg)]  # b changed something


@pytest.mark.parametrize("beam", [1, 4])
def test_an_ensemble_of_one_model_or_of_two_copies_decodes_as_the_model(beam):
    a = model(3)
    srcs = sources(8, 1)
    cfg = DecodeConfig(beam=beam, alpha=0.6, max_len_b=12, nbest=min(beam, 2))
    alone = translate_ids(a, srcs, cfg)
    for members in ([a], [a, model(3)]):
        together = translate_ids(Ensemble(members), srcs, cfg)
        assert [[h.tokens for h in line] for line in together] == [[h.tokens for h in line] for line in alone]
        for line_a, line_b in zip(alone, together):
            for h_a, h_b in zip(line_a, line_b):
                assert math.isclose(h_a.score, h_b.score, abs_tol=1e-4)


def test_an_ensemble_sentence_decodes_the_same_alone_or_in_a_batch():
    ens = Ensemble([model(1), model(2, norm_first=True)])
    srcs = sources(10, 2)
    cfg = DecodeConfig(beam=3, alpha=1.0, max_len_b=12)
    batched = translate_ids(ens, srcs, cfg)
    for s, line in zip(srcs, batched):
        assert translate_ids(ens, [s], cfg)[0][0].tokens == line[0].tokens


def test_ensemble_cap_is_the_shortest_positional_table():
    assert Ensemble([model(1), model(2, max_len=24)]).cfg.max_len == 24


def test_members_must_share_the_vocabulary():
    with pytest.raises(ValueError, match="model 2 has tgt_vocab_size=48"):
        Ensemble([model(1), model(2, tgt_vocab_size=V + 8, share_embeddings=False)])
    with pytest.raises(ValueError, match="eos_id"):
        Ensemble([model(1), model(2, eos_id=3)])


# ---- the CLI ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_model_dirs(tmp_path_factory):
    root, texts = tmp_path_factory.mktemp("ensemble"), sentences(500, 0)
    first, _ = make_model_dir(root / "m1", texts)
    second, m2 = make_model_dir(root / "m2", texts)
    torch.manual_seed(7)  # the same tokenizer, other weights
    with torch.no_grad():
        for p in m2.parameters():
            p.add_(0.5 * torch.randn_like(p))
    from aiayn.folder.checkpoint import save_model_dir

    save_model_dir(
        second, m2, m2.cfg, tokenizer_json=(first / "tokenizer.json").read_text(), overwrite=True
    )
    return first, second


def test_evaluate_and_translate_an_ensemble(two_model_dirs, tmp_path, capsys):
    first, second = two_model_dirs
    lines = sentences(8, 4)
    src, ref = write_lines(tmp_path / "t.en", lines), write_lines(tmp_path / "t.de", lines)
    hyps = tmp_path / "hyps.txt"
    assert cli("evaluate", first, second, "--src", src, "--ref", ref, "--beam", 2,
               "--set", "decode.max_len_b=6", "--hyps", hyps) == 0
    scores = json.loads((first / "eval_t_ensemble2.json").read_text())
    assert scores["model"] == [str(first), str(second)] and scores["n"] == 8
    out = tmp_path / "out.txt"
    assert cli("translate", first, second, "-i", src, "-o", out, "--beam", 2, "--set", "decode.max_len_b=6") == 0
    assert out.read_text(encoding="utf-8") == hyps.read_text(encoding="utf-8")
    model = load_model_folder([first, second]).torch_module()
    assert isinstance(model, Ensemble) and len(model.models) == 2
    single = load_model_folder([first]).torch_module()
    assert not isinstance(single, Ensemble)


def test_ensemble_folder_errors(two_model_dirs, tmp_path, capsys):
    first, _ = two_model_dirs
    other, _ = make_model_dir(tmp_path / "other", sentences(300, 5))  # another tokenizer
    src = write_lines(tmp_path / "t.en", ["the cat"])
    fails(capsys, ["translate", first, other, "-i", src], "tokenizer differs", unchanged=[tmp_path])
    with pytest.raises(CheckpointError, match="tokenizer differs"):
        load_model_folder([first, other])
    fails(capsys, ["translate", first, tmp_path / "missing", "-i", src], "missing",
          unchanged=[tmp_path])
    classifier = tmp_path / "clf"  # only its recorded kind matters: refused before loading
    classifier.mkdir()
    meta = json.loads((first / "config.json").read_text())
    (classifier / "config.json").write_text(json.dumps({**meta, "kind": "classifier"}))
    fails(capsys, ["evaluate", classifier, first, "--src", src, "--ref", src],
          "other models are used one folder at a time", unchanged=[tmp_path])


# ---- text classifiers: the mean of their class probabilities ------------------------------------


def classifier(seed: int, **overrides) -> TransformerClassifier:
    torch.manual_seed(seed)
    cfg = tiny_model_config(V, **{"max_len": 40, "n_decoder_layers": 0, "n_classes": 3, **overrides})
    return TransformerClassifier(cfg).eval()


def test_classifier_ensemble_is_the_mean_of_the_class_probabilities():
    a, b = classifier(1), classifier(2)
    texts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
    mean = (predict_ids(a, texts) + predict_ids(b, texts)) / 2
    torch.testing.assert_close(predict_ids(ClassifierEnsemble([a, b]), texts), mean)
    torch.testing.assert_close(predict_ids(ClassifierEnsemble([a]), texts), predict_ids(a, texts))
    assert not torch.allclose(mean, predict_ids(a, texts))
    with pytest.raises(ValueError, match="n_classes=2, model 1 3"):
        ClassifierEnsemble([a, classifier(3, n_classes=2)])


def test_evaluate_a_classifier_ensemble(tmp_path, capsys):
    from aiayn.run_config import build_run_config
    from aiayn.train.run import train_run
    from trainutil import SHAPE_TRAIN, reviews, write_tsv

    valid = write_tsv(tmp_path / "valid.tsv", reviews(8, 1))
    values = {
        "model.d_model": 16, "model.n_heads": 2, "model.d_ff": 32, "model.n_encoder_layers": 1,
        "model.n_decoder_layers": 0, "model.max_len": 100, "data.kind": "classification",
        "data.dataset": "", "data.train_file": write_tsv(tmp_path / "train.tsv", reviews(16, 0)),
        "data.valid_file": valid, "data.tokenizer": "char", "data.vocab_size": 60,
        "data.max_len": 90, "data.max_tokens": 1200, **SHAPE_TRAIN, "train.max_steps": 3,
    }
    runs = [tmp_path / "r1", tmp_path / "r2"]
    for seed, run in enumerate(runs, 1):
        train_run(build_run_config({**values, "train.seed": seed}), run)
    assert cli("evaluate", *runs, "--src", valid) == 0
    (saved,) = runs[0].glob("eval_*.json")
    scores = json.loads(saved.read_text())
    assert scores["model"] == [str(r) for r in runs] and scores["n"] == 8
    ensemble = load_model_folder(runs).torch_module()
    assert isinstance(ensemble, ClassifierEnsemble) and len(ensemble.models) == 2
    texts = [row.split("\t", 1)[1] for row in (tmp_path / "valid.tsv").read_text().splitlines()]
    one, two = (load_model_folder([r]).class_probs(texts) for r in runs)
    both = (one + two) / 2
    torch.testing.assert_close(load_model_folder(runs).class_probs(texts), both)
    lines = write_lines(tmp_path / "texts.txt", texts)
    capsys.readouterr()
    assert cli("classify", *runs, "-i", lines) == 0
    printed = [float(line.split("\t")[1]) for line in capsys.readouterr().out.splitlines()]
    assert printed == pytest.approx(both.max(-1).values.tolist(), abs=1e-4)
