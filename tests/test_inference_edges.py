"""Edges of the inference commands and of ``aiayn.load`` that a new user meets: empty input, a
seed outside torch's range, a load of nothing. Each is handled, or one clear line."""

from __future__ import annotations

import pytest
from serve_helpers import make_folder
from trainutil import fails

from aiayn.cli import main
from aiayn.decode.generate import SEED_RANGE, check_seed
from aiayn.errors import ConfigError
from aiayn.folder import load_model_folder

pytestmark = pytest.mark.usefixtures("one_thread")

TOO_BIG = 99999999999999999999999  # the probe's seed: a ValueError traceback from torch


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("edges")
    return {kind: make_folder(root / kind, kind=kind) for kind in ("seq2seq", "classifier", "lm")}


@pytest.mark.parametrize("command,kind", [("translate", "seq2seq"), ("classify", "classifier")])
def test_empty_input_gives_no_output_lines(folders, tmp_path, capsys, command, kind):
    """Every command that reads lines: no input line, no output line, exit 0 (classify printed
    a blank line, translate nothing)."""
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    capsys.readouterr()
    assert main([command, str(folders[kind]), "-i", str(empty)]) == 0
    assert capsys.readouterr().out == ""
    one = tmp_path / "one.txt"
    one.write_text("the cat\n")
    assert main([command, str(folders[kind]), "-i", str(one)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1  # one line in, one line out


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


@pytest.mark.parametrize("bad,words", [(None, "got NoneType"), (3, "got int"),
                                       ([None], "a list holding NoneType")])
def test_load_of_something_not_a_path_says_what_it_takes(bad, words):
    import aiayn

    with pytest.raises(TypeError, match="aiayn.load takes a model folder") as caught:
        aiayn.load(bad)
    assert words in str(caught.value)
    with pytest.raises(ConfigError, match="no model folder given"):
        aiayn.load([])


def test_a_str_is_one_text_and_a_list_stays_a_list(folders):
    """``translate("A sentence")`` and ``classify("A text")`` take the str as one text, as a
    Hugging Face pipeline does, and give its one result (they translated or labelled each
    character: 15 outputs for one sentence); a list gives a list, a tuple too."""
    seq2seq = load_model_folder(folders["seq2seq"])
    one = seq2seq.translate("the cat sits", beam=1)
    assert isinstance(one, str)
    assert [one] == seq2seq.translate(["the cat sits"], beam=1)
    assert seq2seq.translate(("the cat", "a dog"), beam=1) == seq2seq.translate(
        ["the cat", "a dog"], beam=1)
    assert seq2seq.translate("the cat", prefixes="the", beam=1) == seq2seq.translate(
        ["the cat"], prefixes=["the"], beam=1)[0]
    with pytest.raises(ConfigError, match="prefixes: give one per text"):
        seq2seq.translate(["the cat", "a dog"], prefixes="the")
    classifier = load_model_folder(folders["classifier"])
    result = classifier.classify("the cat sits on the mat")
    assert isinstance(result, dict) and result["label"] and set(result["probs"]) == {
        *classifier.label_names()}
    assert [result] == classifier.classify(["the cat sits on the mat"])
    assert classifier.classify("") == {"label": "", "probs": {}}
    for bad, words in [(3, "texts must be a string or a list of strings, got int"),
                       (["a", None], r"texts\[1\] must be a string, got NoneType")]:
        with pytest.raises(TypeError, match=words):
            seq2seq.translate(bad)
        with pytest.raises(TypeError, match=words):
            classifier.classify(bad)
