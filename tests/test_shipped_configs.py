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
