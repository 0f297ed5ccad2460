"""The model options that imported Marian models need (issue #44), each against its reference:
the sinusoid layout "halves" against transformers' ``MarianSinusoidalPositionalEmbedding``, SiLU
against transformers' "swish", ``final_logits_bias`` as a bias on the output projection, a
decoder that starts from the pad id. The defaults stay the paper's."""

import pytest
import torch
import torch.nn.functional as F
from trainutil import tiny_model_config

from aiayn.config import ModelConfig
from aiayn.errors import ConfigError
from aiayn.model import PositionwiseFeedForward, Transformer, sinusoidal_table


def test_defaults_are_the_papers():
    cfg = ModelConfig()
    assert (cfg.activation, cfg.sinusoid_layout, cfg.final_logits_bias) == (
        "relu",
        "interleaved",
        False,
    )
    table = sinusoidal_table(7, 8)
    assert torch.allclose(table[3, 0::2], torch.sin(3 / 10000 ** (torch.arange(0, 8, 2) / 8)))


@pytest.mark.parametrize("dim", [8, 9])
def test_halves_layout_equals_marian_sinusoids(dim):
    marian = pytest.importorskip("transformers.models.marian.modeling_marian")
    ref = marian.MarianSinusoidalPositionalEmbedding(50, dim).create_weight()
    ours = sinusoidal_table(50, dim, "halves")
    assert torch.allclose(ours, ref, atol=1e-6)
    interleaved = sinusoidal_table(50, dim)  # the same values, columns in another order
    assert torch.allclose(interleaved[:, 0::2], ours[:, : (dim + 1) // 2])
    assert torch.allclose(interleaved[:, 1::2], ours[:, (dim + 1) // 2 :])
    with pytest.raises(ValueError, match="layout"):
        sinusoidal_table(5, dim, "stacked")


def test_silu_equals_transformers_swish():
    activations = pytest.importorskip("transformers.activations")
    ffn = PositionwiseFeedForward(8, 16, activation="silu")
    x = torch.randn(2, 3, 8)
    ref = ffn.linear2(activations.ACT2FN["swish"](ffn.linear1(x)))
    assert torch.allclose(ffn(x), ref, atol=1e-6)
    assert not torch.allclose(ffn(x), ffn.linear2(F.relu(ffn.linear1(x))))
    with pytest.raises(ValueError, match="activation"):
        PositionwiseFeedForward(8, 16, activation="tanh")


def test_final_logits_bias_is_added_to_every_logit():
    torch.manual_seed(0)
    plain = Transformer(tiny_model_config(20, 16)).eval()
    biased = Transformer(tiny_model_config(20, 16, final_logits_bias=True)).eval()
    biased.load_state_dict({**plain.state_dict(), "generator.bias": torch.arange(20.0)})
    src, tgt = torch.randint(4, 20, (2, 5)), torch.randint(4, 20, (2, 4))
    assert torch.allclose(biased(src, tgt), plain(src, tgt) + torch.arange(20.0), atol=1e-5)
    assert biased.generator.weight is biased.tgt_embed.token.weight  # still tied
    with pytest.raises(ConfigError, match="final_logits_bias"):
        tiny_model_config(20, 16, n_encoder_layers=0, final_logits_bias=True)


def test_decoder_starting_from_pad_sees_its_first_position():
    """Marian starts the decoder from the pad id: teacher forcing must not mask that position
    (it equals cached step-by-step decoding), and right padding changes no real position."""
    torch.manual_seed(0)
    cfg = tiny_model_config(20, 16, pad_id=19, bos_id=19, eos_id=0, unk_id=1)
    model = Transformer(cfg).eval()
    src, tgt = torch.randint(2, 19, (2, 5)), torch.randint(2, 19, (2, 4))
    tgt[:, 0] = 19
    full = model(src, tgt)
    memory = model.encode(src)
    cache = model.init_cache(memory, src=src)
    steps = torch.cat([model.decode(tgt[:, i : i + 1], memory, cache=cache) for i in range(4)], 1)
    assert torch.allclose(full, steps, atol=1e-5)
    padded = torch.cat([tgt, torch.full((2, 2), 19)], dim=1)
    assert torch.allclose(model(src, padded)[:, :4], full, atol=1e-5)
