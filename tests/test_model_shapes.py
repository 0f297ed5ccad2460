"""The encoder-only classifier and the decoder-only language model."""

import pytest
import torch
from trainutil import tiny_model_config

from aiayn.model import TransformerClassifier, TransformerLM

PAD = 0


def cfg(**kw):
    return tiny_model_config(vocab=30, max_len=1024, **kw)


@pytest.mark.parametrize("pooling", ["mean", "max", "cls"])
def test_classifier_invariant_to_padding_and_batch_composition(pooling):
    model = TransformerClassifier(cfg(pooling=pooling, n_classes=3)).eval()
    seqs = [torch.randint(4, 30, (n,)) for n in (5, 9, 2)]
    batch = torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True, padding_value=PAD)
    out = model(batch)
    assert out.shape == (3, 3)
    for i, s in enumerate(seqs):
        alone = model(s[None])
        extra_pad = model(torch.cat([s, torch.full((4,), PAD)])[None])
        torch.testing.assert_close(out[i], alone[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(extra_pad[0], alone[0], atol=1e-5, rtol=1e-5)
    assert torch.isfinite(model(torch.full((1, 4), PAD))).all()


@pytest.mark.parametrize("pooling", ["mean", "max", "cls"])
def test_token_dropout_turns_dropped_tokens_into_padding(pooling):
    model = TransformerClassifier(cfg(pooling=pooling, token_dropout=0.5, n_decoder_layers=0))
    ids = torch.randint(4, 30, (6, 9))
    ids[1, 5:] = PAD
    ids[2, 1:] = PAD  # one real token: with p = 0.5 it is often dropped, and must be kept
    torch.manual_seed(3)
    out = model.train()(ids)
    torch.manual_seed(3)  # the same draw, done by hand (dropout is 0: no other random numbers)
    kept = (ids != PAD) & (torch.rand(ids.shape) >= 0.5)
    kept = torch.where(kept.any(1, keepdim=True), kept, ids != PAD)
    assert 0 < int(kept.sum()) < int((ids != PAD).sum())
    torch.testing.assert_close(out, model.eval()(ids.masked_fill(~kept, PAD)), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(model.eval()(ids), out)  # evaluation keeps every token
    with pytest.raises(Exception, match="token_dropout applies to encoder-only"):
        cfg(token_dropout=0.1)  # an encoder-decoder


@pytest.mark.parametrize("pooling", ["mean", "max", "cls"])
def test_bigram_embeddings_start_at_zero_and_keep_padding_invariance(pooling):
    from aiayn.model.classifier import bigram_ids

    torch.manual_seed(0)
    plain = TransformerClassifier(cfg(pooling=pooling, n_decoder_layers=0)).eval()
    model = TransformerClassifier(cfg(pooling=pooling, n_decoder_layers=0, bigram_buckets=101)).eval()
    model.load_state_dict({**plain.state_dict(), "bigrams.weight": model.bigrams.weight}, strict=True)
    seqs = [torch.randint(4, 30, (n,)) for n in (5, 9, 2)]
    batch = torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True, padding_value=PAD)
    torch.testing.assert_close(model(batch), plain(batch))  # zero bigram rows: the plain model
    torch.nn.init.normal_(model.bigrams.weight)
    out = model(batch)
    assert not torch.allclose(out, plain(batch), atol=1e-3)
    for i, s in enumerate(seqs):
        torch.testing.assert_close(out[i], model(s[None])[0], atol=1e-5, rtol=1e-5)
    ids = torch.tensor([[5, 7, 9]])  # bigrams (<s>,5) (5,7) (7,9): order matters
    assert bigram_ids(ids, 1, 101).tolist() == [[(1 * 1_000_003 + 5) % 101, (5 * 1_000_003 + 7) % 101,
                                                  (7 * 1_000_003 + 9) % 101]]
    assert bigram_ids(ids, 1, 101)[0, 1] != bigram_ids(ids.flip(1), 1, 101)[0, 2]
    with pytest.raises(Exception, match="bigram_buckets applies to encoder-only"):
        cfg(bigram_buckets=10)  # an encoder-decoder
    with pytest.raises(Exception, match="bigram_buckets must be >= 0"):
        cfg(bigram_buckets=-1, n_decoder_layers=0)


def test_classifier_overfits_tiny_data():
    torch.manual_seed(0)
    model = TransformerClassifier(cfg(pooling="max"))
    x = torch.randint(4, 30, (16, 6))
    y = (x[:, 0] > 16).long()  # label decided by the first token
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(150):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    assert (model(x).argmax(-1) == y).all(), loss.item()


def test_lm_cached_generation_equals_uncached_and_is_causal():
    model = TransformerLM(cfg(n_encoder_layers=0)).eval()
    assert not hasattr(model, "encoder") and model.decoder.layers[0].cross_attn is None
    assert model.generator.weight is model.embed.token.weight
    ids = torch.randint(4, 30, (2, 9))
    full = model(ids)
    cache = model.init_cache()
    steps = [model(ids[:, :3], cache)]  # a prompt of 3, then one token at a time
    steps += [model(ids[:, t : t + 1], cache) for t in range(3, 9)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    changed = ids.clone()
    changed[:, 5:] = 7
    torch.testing.assert_close(model(changed)[:, :5], full[:, :5], atol=1e-6, rtol=1e-6)


def test_lm_overfits_tiny_text():
    torch.manual_seed(0)
    model = TransformerLM(cfg(n_encoder_layers=0))
    ids = torch.randint(4, 30, (4, 12))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(150):
        logits = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 30), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05


def _adversarial_task(eps: float):
    from aiayn.train.classification import ClassificationTask
    from aiayn.run_config import build_run_config

    return ClassificationTask(build_run_config({"data.kind": "classification",
                                                "train.adversarial_eps": eps,
                                                "train.label_smoothing": 0.0}))


def _texts():
    torch.manual_seed(0)
    items = [(torch.randint(4, 30, (n,)).tolist(), n % 2) for n in (5, 9, 2)]
    model = TransformerClassifier(cfg(n_classes=2, n_decoder_layers=0)).double().eval()
    return model, items


def _clean_loss_and_embedding_grad_norm(model, ids, label):
    """The loss of one text alone and the L2 norm of its gradient w.r.t. the token embeddings."""
    tokens = torch.tensor([ids])
    delta = torch.zeros(1, len(ids), model.cfg.d_model, dtype=torch.float64, requires_grad=True)
    loss = torch.nn.functional.cross_entropy(model(tokens, delta=delta), torch.tensor([label]),
                                             reduction="sum")
    (grad,) = torch.autograd.grad(loss, delta)
    return float(loss.detach()), float(grad.norm())


def test_adversarial_loss_adds_the_loss_one_gradient_step_up_per_text():
    """Adversarial training (Miyato et al. 2017): loss = clean + loss at embeddings moved by eps
    (per text) along the gradient; to first order the second term is clean + eps·‖∇‖ per text,
    padding or batch-mates changing nothing. The reported NLL is the clean one."""
    from aiayn.data import collate_classification

    model, items = _texts()
    eps = 1e-5
    stats = _adversarial_task(eps).loss(model, collate_classification(items), torch.device("cpu"))
    parts = [_clean_loss_and_embedding_grad_norm(model, ids, label) for ids, label in items]
    clean = sum(loss for loss, _ in parts)
    assert float(stats.nll) == pytest.approx(clean, rel=1e-9)
    assert all(norm > 0 for _, norm in parts)
    assert stats.loss.item() - 2 * clean == pytest.approx(eps * sum(n for _, n in parts), rel=1e-3)


def test_adversarial_loss_of_a_padded_batch_is_the_sum_over_texts_alone():
    from aiayn.data import collate_classification

    model, items = _texts()
    task, cpu = _adversarial_task(2.0), torch.device("cpu")
    together = task.loss(model, collate_classification(items), cpu)
    alone = [task.loss(model, collate_classification([item]), cpu) for item in items]
    assert together.loss.item() == pytest.approx(sum(s.loss.item() for s in alone), rel=1e-9)
    assert together.loss.item() > 2 * float(together.nll)  # the perturbation raises the loss
    with torch.no_grad():  # validation: the plain loss
        plain = task.loss(model, collate_classification(items), cpu)
    assert float(plain.loss) == pytest.approx(float(together.nll), rel=1e-9)


def test_adversarial_eps_is_checked():
    from aiayn.errors import ConfigError
    from aiayn.run_config import build_run_config
    from aiayn.train.task import build_task

    with pytest.raises(ConfigError, match="adversarial_eps must be >= 0"):
        build_run_config({"train.adversarial_eps": -1.0})
    with pytest.raises(ConfigError, match="classification' only"):
        build_task(build_run_config({"train.adversarial_eps": 1.0}))
