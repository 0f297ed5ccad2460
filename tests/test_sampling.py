"""Sampling settings as one object (SamplingConfig): its checks, shared by `aiayn generate`, the
Python call and the server (tests/test_serve_input.py), and its repetition rules reaching the
language model's sampling (tests/test_search.py tests each rule under sampling with a stub)."""

from __future__ import annotations

import re

import pytest
import torch
from trainutil import fails, tiny_model_config

from aiayn.decode import SamplingConfig
from aiayn.decode.generate import generate
from aiayn.errors import ConfigError
from aiayn.model.lm import TransformerLM


@pytest.mark.parametrize("field, value, words", [
    ("temperature", 1e-300, "temperature must be >= 1e-06, got 1e-300"),  # issue 66, finding 13
    ("temperature", 0.0, "temperature must be >= 1e-06"),
    ("top_p", 1.5, "top_p must be >= 1e-06 and <= 1"),
    ("top_k", -1, "top_k must be >= 0, got -1"),
    ("max_new_tokens", 0, "max_new_tokens must be >= 1, got 0"),
    ("seed", 2**64, "seed must be an integer from -2**63 to 2**64-1"),
    ("repetition_penalty", 0.0, "repetition_penalty must be > 0"),
])  # fmt: skip
def test_sampling_config_refuses_in_one_line_and_the_cli_names_the_flag(
    tmp_path, capsys, field, value, words
):
    with pytest.raises(ConfigError, match=re.escape(words)):
        SamplingConfig(**{field: value})
    if field == "repetition_penalty":
        return  # not a flag of `aiayn generate`
    flag = "--" + field.replace("_", "-")
    # refused before the model folder is read (it does not exist)
    line = fails(capsys, ["generate", tmp_path / "lm", "--prompt", "a", f"{flag}={value}"],
                 flag + words[len(field):])  # fmt: skip
    assert "Traceback" not in line


def test_a_misspelt_sampling_setting_names_the_nearest():
    with pytest.raises(ConfigError, match="'temprature' .*did you mean temperature"):
        SamplingConfig().replace(temprature=0.5)
    assert SamplingConfig().replace(top_k=3) == SamplingConfig(top_k=3)


def test_generate_applies_the_repetition_rules():
    """A user who asks an LM's sampling for no repeated token gets none (they used to be
    ignored by sampling), and banned ids are never drawn."""
    torch.manual_seed(0)
    model = TransformerLM(tiny_model_config(vocab=40, max_len=64, n_encoder_layers=0)).eval()
    plain = generate(model, [5, 9], 64, SamplingConfig(30, seed=1))
    assert len(set(plain)) < len(plain)  # 30 draws from 36 tokens: repeats without the rule
    once = generate(model, [5, 9], 64, SamplingConfig(30, seed=1, no_repeat_ngram_size=1))
    assert len(once) == 30 and len(set(once + [5, 9])) == 32
    banned = tuple(range(4, 30))
    assert all(t >= 30 for t in generate(model, [5], 64, SamplingConfig(20, bad_ids=banned)))
    with pytest.raises(ConfigError, match="bad_ids"):
        generate(model, [5], 64, SamplingConfig(2, bad_ids=(40,)))
