"""The encoder-only classifier and the decoder-only language model."""

import pytest
import torch

from aiayn import ModelConfig
from aiayn.model import TransformerClassifier, TransformerLM

PAD = 0


def cfg(**kw):
    base = dict(src_vocab_size=30, tgt_vocab_size=30, d_model=32, n_heads=4, d_ff=64,
                n_encoder_layers=2, n_decoder_layers=2, dropout=0.0)
    return ModelConfig(**{**base, **kw})


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
