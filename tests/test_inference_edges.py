"""Edges of the inference commands that a new user meets: a seed outside torch's range. Each is
handled, or one clear line."""

from __future__ import annotations

import pytest
from serve_helpers import make_folder
from trainutil import fails

from aiayn.decode.generate import SEED_RANGE, check_seed
from aiayn.errors import ConfigError
from aiayn.folder import load_model_folder

pytestmark = pytest.mark.usefixtures("one_thread")

TOO_BIG = 99999999999999999999999  # the probe's seed: a ValueError traceback from torch


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("edges")
    return {kind: make_folder(root / kind, kind=kind) for kind in ("seq2seq", "classifier", "lm")}


def test_a_seed_outside_torchs_range_is_one_line(folders, capsys):
    lm = str(folders["lm"])
    for seed in (TOO_BIG, SEED_RANGE[1] + 1, SEED_RANGE[0] - 1):
        fails(
            capsys,
            ["generate", lm, "--prompt", "the", "--max-new-tokens", "2", "--seed", str(seed)],
            "seed must be an integer from -2**63 to 2**64-1",
        )
    model = load_model_folder(lm)
    with pytest.raises(ConfigError, match="seed must be an integer"):
        model.generate("the", max_new_tokens=2, seed=TOO_BIG)
    for seed in SEED_RANGE:  # both ends are torch's own
        check_seed(seed)
        assert model.generate("the", max_new_tokens=3, seed=seed) == model.generate(
            "the", max_new_tokens=3, seed=seed
        )
    for bad in (True, 1.5, "7"):
        with pytest.raises(ConfigError):
            check_seed(bad)  # type: ignore[arg-type]
