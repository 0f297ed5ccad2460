"""Every recipe in configs/ parses and validates: a misspelt key or a bad value fails here, not
an hour into somebody's training run."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiayn.train.config import load_run_config

CONFIGS = sorted((Path(__file__).resolve().parent.parent / "configs").glob("*.toml"))


def test_there_are_recipes():
    assert {p.name for p in CONFIGS} >= {"multi30k_en_de.toml", "multi30k_demo.toml", "imdb.toml",
                                          "shakespeare_char.toml"}


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
