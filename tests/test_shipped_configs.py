"""Every recipe in configs/ parses and validates: a misspelt key or a bad value fails here, not
an hour into somebody's training run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from aiayn.run_config import load_run_config

CONFIGS = sorted((Path(__file__).resolve().parent.parent / "configs").glob("*.toml"))


def test_there_are_recipes():
    assert {p.name for p in CONFIGS} >= {"multi30k_en_de.toml", "multi30k_demo.toml", "imdb.toml",
                                          "shakespeare_char.toml", "wmt14_en_de_base.toml",
                                          "wmt14_en_de_big.toml"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_recipe_loads(path):
    cfg, _ = load_run_config(path)
    if cfg.train.lr_schedule == "cosine":  # the schedule ends inside the budget of updates
        assert cfg.train.warmup_steps < cfg.train.max_steps < 100_000


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_recipe_header_is_short_and_links_its_guide(path):
    """A recipe opens with at most 6 comment lines (what it trains, how long on what, the expected
    result, a link to its guide section); its history lives in docs/experiments.md."""
    lines = path.read_text(encoding="utf-8").splitlines()
    first_section = next(i for i, line in enumerate(lines) if line.startswith("["))
    header = [line for line in lines[:first_section] if line.startswith("#")]
    assert 1 <= len(header) <= 6, f"{path.name}: {len(header)} header comment lines"
    guides = [word for line in header for word in line.split() if word.startswith("docs/")]
    assert guides, f"{path.name}: the header links no guide page"
    root = path.parent.parent
    for guide in guides:
        assert (root / guide.split("#")[0].rstrip(";:,.)")).is_file(), guide


PARAMETERS = re.compile(r"(\d+(?:\.(\d+))?) M parameters(?: with ([\d,]+) tokens)?")


def header(path: Path) -> str:
    lines = path.read_text(encoding="utf-8").splitlines()
    first_section = next(i for i, line in enumerate(lines) if line.startswith("["))
    return "\n".join(line for line in lines[:first_section] if line.startswith("#"))


@pytest.mark.parametrize("path", [p for p in CONFIGS if PARAMETERS.search(header(p))],
                         ids=lambda p: p.name)
def test_a_recipes_parameter_count_is_what_the_code_builds(path):
    """A header's "N M parameters" is the count of the model the recipe builds (issue 66: 4.7 M
    for a model of 2.35 M), at the recipe's data.vocab_size, which the header names."""
    from aiayn.commands.summary import resolve_model_config
    from aiayn.kinds import KINDS

    match = PARAMETERS.search(header(path))
    figure, decimals, tokens = match.group(1), len(match.group(2) or ""), match.group(3)
    cfg, kind = resolve_model_config(str(path), [])
    run_cfg, _ = load_run_config(path)
    assert tokens is not None, f"{path.name}: say at which vocabulary ('with N tokens')"
    assert int(tokens.replace(",", "")) == run_cfg.data.vocab_size == cfg.src_vocab_size
    count = sum(p.numel() for p in KINDS[kind].model_class(cfg).parameters())
    assert f"{count / 1e6:.{decimals}f}" == figure, f"{path.name}: {count:,} parameters"


def test_the_parameter_check_reads_a_figure():
    found = PARAMETERS.search("# x: Transformer-tiny (2.35 M parameters with 8,000 tokens), y")
    assert found and found.groups() == ("2.35", "35", "8,000")
    assert any(PARAMETERS.search(header(p)) for p in CONFIGS)


# The paper's settings (Vaswani et al. 2017): Table 3 sizes, §5 training, §6.1 checkpoints and decoding.
PAPER = {
    "wmt14_en_de_base.toml": dict(d_model=512, n_heads=8, d_ff=2048, dropout=0.1, max_steps=100_000,
                                  keep_last=5),
    "wmt14_en_de_big.toml": dict(d_model=1024, n_heads=16, d_ff=4096, dropout=0.3, max_steps=300_000,
                                 keep_last=20),
}


@pytest.mark.parametrize("name", sorted(PAPER))
def test_wmt_recipes_have_the_papers_settings(name):
    from aiayn.run_config import micro_batches_per_update

    cfg, _ = load_run_config(CONFIGS[0].parent / name)
    m, d, t, dec, paper = cfg.model, cfg.data, cfg.train, cfg.decode, PAPER[name]
    assert (m.d_model, m.n_heads, m.d_ff, m.dropout) == (
        paper["d_model"], paper["n_heads"], paper["d_ff"], paper["dropout"])
    assert (m.n_encoder_layers, m.n_decoder_layers, m.head_dim_k) == (6, 6, 64)
    assert not m.norm_first and m.attn_dropout == 0.0 and m.share_embeddings  # post-LN, §3.4
    assert m.positional == "sinusoidal" and m.scale_embeddings
    assert (d.dataset, d.src_lang, d.tgt_lang, d.valid_split) == ("wmt14", "en", "de", "newstest2013")
    assert d.tokenizer == "bpe" and d.vocab_size == 37000  # one shared BPE vocabulary of ~37k
    assert t.label_smoothing == 0.1 and t.adam_betas == (0.9, 0.98) and t.adam_eps == 1e-9
    assert (t.lr_schedule, t.lr_scale, t.warmup_steps) == ("noam", 1.0, 4000)
    assert t.max_steps == paper["max_steps"] and t.keep_last == paper["keep_last"]
    assert t.save_every_minutes == 10 and t.save_every == 0 and t.clip_norm == 0
    assert t.tokens_per_update == 25_000 and t.update_freq == 1
    # ~25,000 tokens per side per update on any number of processes
    for world, freq in ((1, 8), (2, 4), (4, 2), (8, 1), (3, 3)):
        assert micro_batches_per_update(cfg, world) == freq
        assert 25_000 <= world * freq * d.max_tokens < 25_000 + world * d.max_tokens
    assert (dec.beam, dec.alpha, dec.length_penalty, dec.max_len_a, dec.max_len_b) == (
        4, 0.6, "gnmt", 1.0, 50)
