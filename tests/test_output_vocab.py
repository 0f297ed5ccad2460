"""model.output_vocab = "targets": the softmax ranges over the tokens of the training targets only.

A cipher task makes the two sides' letters disjoint (source a-j, target k-t), so that a joint
vocabulary holds tokens that no target ever has.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from aiayn.folder.checkpoint import init_from_model_dir
from aiayn.folder import load_model_dir
from aiayn.cli import main
from aiayn.decode import translate_texts
from aiayn.folder import load_model_folder
from aiayn.model import Transformer
from aiayn.train.average import average_checkpoints
from aiayn.run_config import build_run_config
from aiayn.train.run import train_run
from aiayn.train.task import build_task
from aiayn.train.translation import TranslationTask, kept_outputs
from trainutil import base_values, one_thread  # noqa: F401 (autouse fixture)

SOURCE, TARGET = "abcdefghij", "klmnopqrst"


def cipher_values(folder, **train) -> dict:
    """The tiny reversal run of trainutil with each target letter shifted out of a-j."""
    values = base_values(folder, **train)
    shift = str.maketrans(SOURCE, TARGET)
    for split in ("train", "valid"):
        path = folder / f"{split}.tgt"
        path.write_text(path.read_text(encoding="utf-8").translate(shift), encoding="utf-8")
    values["model.output_vocab"] = "targets"
    return values


@pytest.fixture(scope="module")
def cipher_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cipher")
    cfg = build_run_config(cipher_values(tmp / "data", max_steps=6, save_every=2, keep_last=3))
    train_run(cfg, tmp / "run")
    return tmp / "run", cfg


def test_the_mask_holds_the_target_tokens_and_eos(cipher_run):
    run, _ = cipher_run
    model, cfg, _ = load_model_dir(run)
    tok = load_model_folder([run]).tokenizer
    kept = {int(i) for i in model.output_mask.nonzero()}
    assert kept == {tok.encode(c)[0] for c in TARGET} | {tok.encode("k l")[1], cfg.eos_id}
    assert not any(tok.encode(c)[0] in kept for c in SOURCE)
    logits = model.decode(torch.tensor([[cfg.bos_id]]), model.encode(torch.tensor([[5, 6]])))
    assert torch.isinf(logits[0, 0, ~model.output_mask]).all()
    assert torch.isfinite(logits[0, 0, model.output_mask]).all()
    out = translate_texts(model, tok, ["a b c", "j"], beam=3)
    assert all(set(line) <= set(TARGET + " ") for line in out)


def test_the_loss_is_label_smoothed_cross_entropy_over_the_kept_tokens(cipher_run):
    run, cfg = cipher_run
    model, _, _ = load_model_dir(run)
    task = TranslationTask(cfg)
    task.setup((run / "tokenizer.json").read_text(encoding="utf-8"))
    batch = task.collate("valid", [0, 1, 2, 3])
    stats = task.loss(model, batch, torch.device("cpu"))
    ids = model.output_mask.nonzero().squeeze(1)
    logits = model(batch.src, batch.tgt_in)[..., ids]  # (B, T, V')
    position = {int(v): i for i, v in enumerate(ids)}
    gold = torch.tensor([[position.get(int(t), -100) for t in row] for row in batch.tgt_out])
    expected = F.cross_entropy(logits.flatten(0, 1), gold.flatten(), ignore_index=-100,
                               label_smoothing=0.1, reduction="sum")
    assert stats.loss.item() == pytest.approx(expected.item(), rel=1e-5)
    # the loss's view of the model: the kept rows of the output weight, targets as positions
    full, _, target, ignore = kept_outputs(model, batch.tgt_out, cfg.model.pad_id)
    assert full.size(0) == ids.numel() and ignore == -1
    assert (target[batch.tgt_out == cfg.model.pad_id] == -1).all()


def test_a_target_token_unseen_in_training_is_not_counted(cipher_run):
    run, cfg = cipher_run
    model, _, _ = load_model_dir(run)
    source_only = int((~model.output_mask).nonzero()[-1])
    target = torch.tensor([[source_only, cfg.model.eos_id, cfg.model.pad_id]])
    _, _, position, ignore = kept_outputs(model, target, cfg.model.pad_id)
    assert position[0, 0] == ignore and position[0, 2] == ignore and position[0, 1] >= 0


def test_a_skipped_reference_token_is_left_out_of_the_count(cipher_run):
    run, cfg = cipher_run
    model, _, _ = load_model_dir(run)
    task = TranslationTask(cfg)
    task.setup((run / "tokenizer.json").read_text(encoding="utf-8"))
    batch = task.collate("valid", [0, 1])
    assert task.loss(model, batch, torch.device("cpu")).n_targets == batch.n_tgt_tokens
    batch.tgt_out[0, 0] = int((~model.output_mask).nonzero()[-1])  # a source-only token
    assert task.loss(model, batch, torch.device("cpu")).n_targets == batch.n_tgt_tokens - 1


def test_init_from_keeps_the_mask_of_the_new_run(cipher_run):
    run, _ = cipher_run
    trained, cfg, _ = load_model_dir(run)
    fresh = Transformer(cfg)  # all True until a trainer marks its own training targets
    copied, _ = init_from_model_dir(fresh, run)
    assert "output_mask" not in copied and fresh.output_mask.all()
    assert not trained.output_mask.all()
    assert torch.equal(fresh.generator.weight, trained.generator.weight)


def test_averaging_and_ensembles_keep_the_mask(cipher_run, tmp_path, capsys):
    run, _ = cipher_run
    average_checkpoints(run, 3, tmp_path / "avg")
    model, _, _ = load_model_dir(tmp_path / "avg")
    assert torch.equal(model.output_mask, load_model_dir(run)[0].output_mask)
    src = tmp_path / "in.txt"
    src.write_text("a b c\nd e\n", encoding="utf-8")
    assert main(["translate", str(run), str(tmp_path / "avg"), "--input", str(src)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and all(set(line) <= set(TARGET + " ") for line in out)


def test_output_vocab_is_for_translation_without_bpe_dropout(tmp_path):
    values = cipher_values(tmp_path / "data")
    values.update({"data.tokenizer": "bpe", "data.vocab_size": 60, "data.bpe_dropout": 0.1})
    with pytest.raises(Exception, match="does not go with data.bpe_dropout"):
        build_task(build_run_config(values))
    lm = {"data.kind": "lm", "model.n_encoder_layers": 0, "model.output_vocab": "targets",
          "data.dataset": "", "data.train_src": str(tmp_path / "data/train.src")}
    with pytest.raises(Exception, match="applies to data.kind = 'translation' only"):
        build_task(build_run_config(lm))
