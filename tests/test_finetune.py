"""Fine-tuning (``train.init_from`` on a folder of the run's kind, configs/finetune.toml) against
transformers on the tiny Marian folder of tests/hf_helpers.py (built locally, no network): one
step's label-smoothed loss to 1e-5 and its gradients to 1e-4, the weights after 20 AdamW steps to
1e-4; an lr-0 fine-tune translates exactly as the import; the model section and the tokenizer come
from the folder, and a setting that would change a weight's shape or meaning is refused."""


import dataclasses
import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from hf_helpers import sentences
from trainutil import fails, torch_threads

from aiayn.cli import main
from aiayn.data import collate_translation
from aiayn.folder import load_model_folder
from aiayn.interop.marian import import_marian, marian_names
from aiayn.run_config import TrainConfig
from aiayn.train.loss import projected_label_smoothed_nll_loss
from aiayn.train.state import build_optimizer
from aiayn.train.task import freeze
from aiayn.train.translation import kept_outputs

EPSILON = 0.1


@pytest.fixture(scope="module")
def imported(marian_folder, tmp_path_factory):
    """(HF folder, imported aiayn folder)."""
    return marian_folder, import_marian(marian_folder, tmp_path_factory.mktemp("ft") / "imported")


def _models(imported):
    from transformers import MarianMTModel

    folder, out = imported
    ours = load_model_folder(out)
    theirs = MarianMTModel.from_pretrained(folder)
    return ours.torch_module().train(), ours.tokenizer, theirs.train()


def _batch(tokenizer, cfg, n=8, skip=2000):
    """``n`` Multi30k pairs from line ``skip`` on that fit the tiny model's 64 positions."""
    src, tgt = sentences("en", 10 * n, skip=skip), sentences("de", 10 * n, skip=skip)
    pairs = [(tokenizer.encode(x), tokenizer.encode_target(y)) for x, y in zip(src, tgt)]
    pairs = [(x, y) for x, y in pairs if len(x) < 48 and len(y) < 48][:n]
    return collate_translation(pairs, cfg.pad_id, cfg.bos_id, cfg.eos_id)


def _our_loss(model, batch, pad_id):
    """aiayn's training loss of ``batch`` (summed), divided by its target tokens."""
    hidden = model(batch.src, batch.tgt_in, features_only=True)
    weight, bias, target, ignore = kept_outputs(model, batch.tgt_out, pad_id)
    loss, _ = projected_label_smoothed_nll_loss(hidden, weight, target, EPSILON, ignore, bias)
    return loss / batch.n_tgt_tokens


def _their_loss(model, batch, pad_id):
    """transformers' LabelSmoother (Seq2SeqTrainer's label_smoothing_factor): the mean over the
    non-padding targets of (1 - ε)·NLL + ε·mean_v(-log p_v): aiayn's sum / target tokens."""
    logits = model(
        input_ids=batch.src,
        attention_mask=(batch.src != pad_id).long(),
        decoder_input_ids=batch.tgt_in,
    ).logits
    labels = batch.tgt_out.masked_fill(batch.tgt_out == pad_id, -100)
    log_probs = -torch.log_softmax(logits, dim=-1)
    pad = labels.eq(-100).unsqueeze(-1)
    nll = log_probs.gather(-1, labels.clamp(min=0).unsqueeze(-1)).masked_fill(pad, 0.0)
    smoothed = log_probs.sum(-1, keepdim=True).masked_fill(pad, 0.0)
    active = (~pad).sum()
    return (1 - EPSILON) * nll.sum() / active + EPSILON * smoothed.sum() / (
        active * log_probs.size(-1)
    )


def _pairs(ours, theirs):
    """(our parameter, theirs) for every trained weight (the importer's name mapping)."""
    cfg = ours.cfg
    names = marian_names(cfg.n_encoder_layers, cfg.n_decoder_layers)
    names["src_embed.token.weight"] = "model.shared.weight"
    mine, other = dict(ours.named_parameters()), dict(theirs.named_parameters())
    return [(name, mine[name], other[hf]) for name, hf in names.items()]


def test_one_step_loss_and_gradients_equal_transformers(imported):
    ours, tok, theirs = _models(imported)
    pad = ours.cfg.pad_id
    batch = _batch(tok, ours.cfg)
    assert (batch.tgt_out == pad).any()  # padded
    with torch_threads(1):
        a, b = _our_loss(ours, batch, pad), _their_loss(theirs, batch, pad)
        assert abs(a.item() - b.item()) < 1e-5
        a.backward()
        b.backward()
    for name, mine, hf in _pairs(ours, theirs):
        assert (mine.grad - hf.grad).abs().max() < 1e-4, name
        if name.endswith("k_proj.bias"):  # adds q·b_k to every score of a row: softmax ignores it
            assert mine.grad.abs().max() < 1e-6 and hf.grad.abs().max() < 1e-6


def test_twenty_adamw_steps_give_the_weights_of_transformers(imported):
    ours, tok, theirs = _models(imported)
    pad = ours.cfg.pad_id
    freeze(ours, ())  # final_logits_bias is held fixed, as transformers holds its buffer
    # configs/finetune.toml's peak lr (transformers' default too), AdamW with weight decay and
    # eps 1e-6 (fairseq's BART/RoBERTa fine-tuning value). The key projections' biases have a
    # gradient of 0 up to rounding (the test above): with eps 1e-8 Adam scales that noise up to
    # steps of ±lr in both implementations (1.6e-4 and 3.7e-4 apart after 20 steps, 2026-11-29),
    # with 1e-6 it stays noise (< 1e-5), so every weight is compared.
    settings = dict(lr=5e-5, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01)
    mine = torch.optim.AdamW([p for p in ours.parameters() if p.requires_grad], **settings)
    other = torch.optim.AdamW(theirs.parameters(), **settings)
    with torch_threads(1):
        for step in range(20):
            batch = _batch(tok, ours.cfg, n=6, skip=2000 + 6 * step)
            for model, opt, loss in ((ours, mine, _our_loss), (theirs, other, _their_loss)):
                opt.zero_grad()
                loss(model, batch, pad).backward()
                opt.step()
    for name, p, q in _pairs(ours, theirs):
        assert (p - q).abs().max() < 1e-4, name
    start = load_model_folder(imported[1]).torch_module()
    assert torch.equal(ours.generator.bias, start.generator.bias)  # final_logits_bias: fixed
    moved = ours.src_embed.token.weight - start.src_embed.token.weight
    assert moved.abs().max() > 5e-4  # they did train


# ---- the command: configs/finetune.toml with train.init_from ---------------------------------

RECIPE = Path(__file__).resolve().parent.parent / "configs" / "finetune.toml"


def _files(folder, n=120, skip=3000, odd=False):
    """Train and valid files of short Multi30k pairs (a line of characters the tiny
    SentencePiece models lack with ``odd``)."""
    folder.mkdir(parents=True, exist_ok=True)
    src, tgt = sentences("en", 4 * n, skip=skip), sentences("de", 4 * n, skip=skip)
    pairs = [(x, y) for x, y in zip(src, tgt) if len(x.split()) <= 8][:n]
    if odd:
        pairs[0] = ("☃☃ Ωmega 漢字 snow", "☃☃ Ωmega 漢字 Schnee")
    for name, part in (("train", pairs[10:]), ("valid", pairs[:10])):
        (folder / f"{name}.en").write_text("".join(x + "\n" for x, _ in part), encoding="utf-8")
        (folder / f"{name}.de").write_text("".join(y + "\n" for _, y in part), encoding="utf-8")
    return [
        "--set", f"data.train_src={folder / 'train.en'}", "--set",
        f"data.train_tgt={folder / 'train.de'}", "--set", f"data.valid_src={folder / 'valid.en'}",
        "--set", f"data.valid_tgt={folder / 'valid.de'}",
    ]


def _finetune(init, out, data, *sets):
    argv = ["train", str(RECIPE), "--out", str(out), "--set", f"train.init_from={init}", *data]
    argv += ["--set", "train.max_steps=2", "--set", "train.valid_every=2", "--set",
             "train.metrics_every=2", "--set", "train.save_every=2"]
    for s in sets:
        argv += ["--set", s]
    return argv


def test_lr0_finetune_translates_as_the_import(imported, tmp_path, caplog):
    _, out = imported
    data = _files(tmp_path / "data", odd=True)
    run = tmp_path / "ft"
    sets = ("train.lr=0", "model.dropout=0.2", "train.max_steps=4")
    with torch_threads(1), caplog.at_level(logging.INFO):
        assert main(_finetune(out, run, data, *sets)) == 0
        # checkpoint averaging as for any run
        assert main(["average", str(run), "--last", "2", "-o", str(tmp_path / "avg")]) == 0
    log = caplog.text
    assert "training data: " in log and "tokens are <unk>" in log  # the odd line, counted
    start, tuned = load_model_folder(out), load_model_folder(run)
    saved = json.loads((run / "config.json").read_text())
    # the model section is the folder's but for the dropout the run sets
    assert saved["model"] == {**json.loads((out / "config.json").read_text())["model"],
                              "dropout": 0.2}
    assert (run / "tokenizer.json").read_text() == (out / "tokenizer.json").read_text()
    for name, value in start.torch_module().state_dict().items():
        assert torch.equal(tuned.torch_module().state_dict()[name], value), name
    sources = [s for s in sentences("en", 200, skip=1000) if len(s.split()) <= 10][:16]
    assert tuned.translate(sources) == start.translate(sources)  # the folder's decode settings
    assert load_model_folder(tmp_path / "avg").translate(sources) == tuned.translate(sources)


def test_settings_that_change_a_weight_are_refused(imported, tmp_path, capsys):
    _, out = imported
    data = _files(tmp_path / "data", n=30)
    run = tmp_path / "ft"
    for setting, value in (("d_model", 32), ("n_heads", 4), ("activation", "relu"),
                           ("sinusoid_layout", "interleaved"), ("pad_id", 0),
                           ("final_logits_bias", "false"), ("max_len", 300)):
        fails(capsys, _finetune(out, run, data, f"model.{setting}={value}"),
              f"model.{setting}: ", unchanged=[out])
        assert not run.exists()
    sizes = ("model.src_vocab_size=300", "model.tgt_vocab_size=300")
    fails(capsys, _finetune(out, run, data, *sizes), "model.src_vocab_size: 300 here but 255 in")
    assert not run.exists()


def test_a_folder_of_another_kind_is_refused(imported, tmp_path, capsys):
    _, out = imported
    other = tmp_path / "classifier"
    shutil.copytree(out, other)
    meta = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**meta, "kind": "classification"}))
    data = _files(tmp_path / "data", n=30)
    fails(capsys, _finetune(other, tmp_path / "ft", data),
          "holds a 'classification' model; a 'translation' run (data.kind) starts from a "
          "'translation' model",
          unchanged=[other])
    assert not (tmp_path / "ft").exists()
    (other / "config.json").write_text(json.dumps({**meta, "format": "onnx"}))
    fails(capsys, _finetune(other, tmp_path / "ft", data),
          "is an export (onnx); start from the model folder it was exported from", unchanged=[other])
    assert not (tmp_path / "ft").exists()


def test_frozen_parts_do_not_change(imported):
    ours, tok, _ = _models(imported)
    frozen = freeze(ours, ("encoder",))
    assert frozen and all(n.startswith("encoder.") for n in frozen[:-1])
    assert frozen[-1] == "generator.bias"
    before = {n: p.detach().clone() for n, p in ours.named_parameters()}
    optimizer = build_optimizer(ours, TrainConfig(weight_decay=0.01), fused=False)
    assert sum(len(g["params"]) for g in optimizer.param_groups) == sum(
        p.requires_grad for p in ours.parameters())
    optimizer.param_groups[0]["lr"] = 1e-2
    with torch_threads(1):
        _our_loss(ours, _batch(tok, ours.cfg), ours.cfg.pad_id).backward()
    optimizer.step()
    for name, p in ours.named_parameters():
        assert torch.equal(p, before[name]) == (name in frozen), name
    embeddings = freeze(_models(imported)[0], ("embeddings",))
    assert "src_embed.token.weight" in embeddings


# ---- the fine-tuned folder is a model like any other -----------------------------------------


@pytest.fixture(scope="module")
def tuned(imported, tmp_path_factory):
    """A run folder: the imported model fine-tuned for 2 updates at lr 1e-3."""
    tmp = tmp_path_factory.mktemp("tuned")
    argv = _finetune(imported[1], tmp / "ft", _files(tmp / "data"), "train.lr=1e-3",
                     "train.warmup_steps=1")
    with torch_threads(1):
        assert main(argv) == 0
    return tmp / "ft"


def test_a_finetuned_folder_exports_to_transformers_and_translates_the_same(
    imported, tuned, tmp_path, capsys
):
    from transformers import MarianMTModel, MarianTokenizer

    _, out = imported
    run, hf = tuned, tmp_path / "hf"
    with torch_threads(1):
        assert main(["export", str(run), "--format", "hf", "-o", str(hf)]) == 0
    tuned = load_model_folder(run)
    start = load_model_folder(out)
    assert not torch.equal(tuned.torch_module().generator.weight, start.torch_module().generator.weight)
    sources = [s for s in sentences("en", 200, skip=1000) if len(s.split()) <= 10][:12]
    ours = tuned.translate(sources, beam=1)
    model, tok = MarianMTModel.from_pretrained(hf).eval(), MarianTokenizer.from_pretrained(hf)
    with torch_threads(1), torch.no_grad():
        batch = tok(sources, return_tensors="pt", padding=True)
        theirs = tok.batch_decode(model.generate(**batch, num_beams=1), skip_special_tokens=True)
    assert theirs == ours
    (tmp_path / "in.txt").write_text("\n".join(sources) + "\n")
    capsys.readouterr()
    with torch_threads(1):
        assert main(["translate", str(run), "--input", str(tmp_path / "in.txt")]) == 0
    assert capsys.readouterr().out.splitlines() == tuned.translate(sources)


def test_a_finetuned_folder_evaluates_and_exports_to_onnx_and_ctranslate2(tuned, tmp_path):
    pytest.importorskip("onnxruntime", reason="needs the export extra")
    pytest.importorskip("ctranslate2", reason="needs the ctranslate2 extra")
    from aiayn.decode.translate import translate_ids
    from aiayn.export import export_model

    loaded = load_model_folder(tuned)
    pairs = [(x, y) for x, y in zip(sentences("en", 200, skip=1000), sentences("de", 200, skip=1000))
             if len(x.split()) <= 10][:8]
    texts, refs = [x for x, _ in pairs], [y for _, y in pairs]
    sources = [loaded.tokenizer.encode(t) for t in texts]
    cfg = dataclasses.replace(loaded.decode, beam=1)
    with torch_threads(1):
        native = [line[0].tokens for line in translate_ids(loaded.torch_module(), sources, cfg)]
        for engine in ("onnx", "ctranslate2"):
            backend = load_model_folder(export_model(tuned, engine, tmp_path / engine)).backend
            assert [line[0].tokens for line in backend.translate_ids(sources, cfg)] == native
        (tmp_path / "src.txt").write_text("\n".join(texts) + "\n")
        (tmp_path / "ref.txt").write_text("\n".join(refs) + "\n")
        assert main(["evaluate", str(tuned), "--src", str(tmp_path / "src.txt"),
                     "--ref", str(tmp_path / "ref.txt")]) == 0


def test_aiayns_own_hf_export_imports_back(tmp_path):
    """An aiayn model (BPE tokenizer, BOS as the decoder's start, the paper's interleaved
    sinusoids) exported --format hf imports back: the same logits and greedy tokens."""
    from test_hf_export import random_folder

    from aiayn.export import export_model

    folder = random_folder(tmp_path / "own")
    back = import_marian(export_model(folder, "hf", tmp_path / "hf"), tmp_path / "back")
    a, b = load_model_folder(folder), load_model_folder(back)
    assert b.torch_module().cfg.bos_id == a.torch_module().cfg.bos_id != a.torch_module().cfg.pad_id
    assert (tmp_path / "back" / "tokenizer.json").is_file()
    src, tgt = torch.tensor([[5, 6, 7, 8, 9]]), torch.tensor([[a.torch_module().cfg.bos_id, 9, 10, 11]])
    with torch.no_grad():
        assert (a.torch_module().eval()(src, tgt) - b.torch_module().eval()(src, tgt)).abs().max() < 1e-4
    texts = ["a b c d", "e f g", "h i j a b"]
    assert b.translate(texts, beam=1) == a.translate(texts, beam=1)


def test_one_of_aiayns_own_models_finetunes(tmp_path):
    """An aiayn model (BPE, aiayn's special ids, interleaved sinusoids) fine-tunes with the
    same recipe: its model section and tokenizer are kept, and training moves its weights."""
    from test_hf_export import TEXTS, random_folder

    folder = random_folder(tmp_path / "own")
    data = tmp_path / "data"
    data.mkdir()
    for name in ("train", "valid"):
        (data / f"{name}.en").write_text("\n".join(TEXTS * 5) + "\n")
        (data / f"{name}.de").write_text("\n".join(t[::-1] for t in TEXTS * 5) + "\n")
    files = [f"data.{split}_{side}={data / f'{split}.{lang}'}"
             for split in ("train", "valid") for side, lang in (("src", "en"), ("tgt", "de"))]
    argv = _finetune(folder, tmp_path / "ft", [], *files, "train.lr=1e-3", "train.warmup_steps=1")
    with torch_threads(1):
        assert main(argv) == 0
        assert main([*argv[:3], str(tmp_path / "frozen"), *argv[4:], "--set",
                     "train.freeze=embeddings,encoder"]) == 0
    start, tuned = load_model_folder(folder), load_model_folder(tmp_path / "ft")
    assert dataclasses.replace(tuned.torch_module().cfg, dropout=start.torch_module().cfg.dropout) == start.torch_module().cfg
    assert (tmp_path / "ft" / "tokenizer.json").read_text() == (folder / "tokenizer.json").read_text()
    assert not torch.equal(tuned.torch_module().generator.weight, start.torch_module().generator.weight)
    # train.freeze: the embeddings (tied to the output layer) and the encoder stay as they were
    frozen = dict(load_model_folder(tmp_path / "frozen").torch_module().named_parameters())
    for name, value in start.torch_module().named_parameters():
        if name.startswith(("src_embed.", "encoder.")):
            assert torch.equal(frozen[name], value), name
        else:  # the decoder's layers trained
            assert name.startswith("decoder.") and not torch.equal(frozen[name], value), name


def test_the_token_store_holds_marians_source_and_target_pieces(imported, tmp_path):
    """Sources as MarianTokenizer encodes them (source model, </s> last), targets with the
    target model and no </s> (the batches add it): what transformers trains on."""
    from aiayn.data.config import DataConfig
    from aiayn.data.loaders import translation_store

    tok = load_model_folder(imported[1]).tokenizer
    _files(tmp_path / "data", n=30)
    files = {f"{s}_{side}": str(tmp_path / "data" / f"{s}.{lang}")
             for s in ("train", "valid") for side, lang in (("src", "en"), ("tgt", "de"))}
    store = translation_store(DataConfig(dataset="", max_len=64, **files), tok, "train")
    src = (tmp_path / "data" / "train.en").read_text().splitlines()
    tgt = (tmp_path / "data" / "train.de").read_text().splitlines()
    lines = store.lines.tolist()
    assert len(lines) > 5
    for i, (x, y) in enumerate(zip(store.rows("src", range(5)), store.rows("tgt", range(5)))):
        assert list(x) == tok.encode(src[lines[i]]) and list(x)[-1] == tok.eos_id
        assert list(y) == tok.encode_target(tgt[lines[i]]) and tok.eos_id not in list(y)


def test_a_finetuned_folder_is_served(tuned):
    """`aiayn serve` on a fine-tuned Marian folder answers as the folder translates."""
    pytest.importorskip("httpx", reason="httpx (FastAPI's TestClient) is not installed")
    from fastapi.testclient import TestClient

    from aiayn.serve import Limits, create_app

    folder = load_model_folder(tuned)
    sources = [s for s in sentences("en", 200, skip=1000) if len(s.split()) <= 10][:3]
    with torch_threads(1), TestClient(create_app(folder, Limits())) as client:
        r = client.post("/v1/translate", json={"texts": sources, "beam": 2})
        assert r.status_code == 200, r.text
        assert [t["text"] for t in r.json()["translations"]] == folder.translate(sources, beam=2)


def _own_folder_and_files(tmp_path):
    """One of aiayn's own tiny translation folders (no mirror needed) and --set lines of files."""
    from test_hf_export import TEXTS, random_folder

    folder = random_folder(tmp_path / "own")
    data = tmp_path / "data"
    data.mkdir()
    for name in ("train", "valid"):
        (data / f"{name}.en").write_text("\n".join(TEXTS * 5) + "\n")
        (data / f"{name}.de").write_text("\n".join(t[::-1] for t in TEXTS * 5) + "\n")
    sets = []
    for split in ("train", "valid"):
        for side, lang in (("src", "en"), ("tgt", "de")):
            sets += ["--set", f"data.{split}_{side}={data / f'{split}.{lang}'}"]
    return folder, sets


def test_the_recipe_without_init_from_is_refused(tmp_path, capsys):
    """configs/finetune.toml without train.init_from trained a 6+6-layer model from scratch at
    the fine-tune's learning rate (issue 66): one line now, and no run folder."""
    _, data = _own_folder_and_files(tmp_path)
    argv = ["train", str(RECIPE), "--out", tmp_path / "ft", *data]
    line = fails(capsys, argv, "train.init_from is not set", unchanged=[tmp_path])
    assert "--set train.init_from=MODEL_DIR" in line
    assert not (tmp_path / "ft").exists()


def test_resume_keeps_the_folder_the_run_started_from(tmp_path, capsys):
    """--resume with another train.init_from is refused (the weights come from the run's
    checkpoint, and config.json would name a folder they never came from); without one, the
    run continues and config.json still names the folder it started from."""
    folder, data = _own_folder_and_files(tmp_path)
    other = shutil.copytree(folder, tmp_path / "other")
    run = tmp_path / "ft"
    with torch_threads(1):
        assert main(_finetune(folder, run, data, "train.warmup_steps=1")) == 0
        argv = _finetune(other, run, data, "train.max_steps=4") + ["--resume"]
        fails(capsys, argv, f"the run in {run} started from {folder}", unchanged=[run])
        resumed = ["train", str(RECIPE), "--out", str(run), "--resume", *data,
                   "--set", "train.max_steps=4"]
        assert main(resumed) == 0
    config = json.loads((run / "config.json").read_text())
    assert config["train"]["init_from"] == str(folder) and config["train"]["max_steps"] == 4


def test_bleu_is_measured_at_metrics_every_and_at_the_last_update(tmp_path):
    """A valid_every that falls between metrics_every points never measured BLEU (so best/ and
    early stopping never happened), and the end-of-run validation measured none, so best/
    could miss the last update (issue 66). BLEU is now measured at every metrics_every point
    and at the last update, and best/ is the update of the highest."""
    folder, data = _own_folder_and_files(tmp_path)
    run = tmp_path / "ft"
    argv = _finetune(folder, run, data, "train.max_steps=5", "train.valid_every=3",
                     "train.metrics_every=2", "train.save_every=0", "train.lr=1e-3",
                     "train.warmup_steps=1")
    with torch_threads(1):
        assert main(argv) == 0
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    bleu = {m["step"]: m["valid_bleu"] for m in lines if "valid_bleu" in m}
    assert sorted(bleu) == [2, 4, 5]
    assert 3 in {m["step"] for m in lines if "valid_loss" in m}  # valid_every still validates
    best = json.loads((run / "best" / "config.json").read_text())["best"]
    first_highest = max(sorted(bleu), key=lambda step: bleu[step])
    assert best == {"step": first_highest, "valid_bleu": bleu[first_highest]}
