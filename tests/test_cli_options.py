"""One meaning per name on the command line: one spelling per setting (old spellings are gone),
one `--set` syntax, `--version`, global flags after the command, `--device auto` for inference,
engine and format choices from their registries, and every flag with a help string."""

from __future__ import annotations

import argparse
import logging
from argparse import Namespace
from importlib.metadata import version

import pytest
import torch

from aiayn.cli import build_parser, log_level, main, sub_parsers
from aiayn.commands.options import ADVANCED, inference_device
from aiayn.errors import ConfigError

# ---- one spelling per setting: the old ones (issue 64) are refused, not rewritten ---------------
# (a command line with a spelling removed in issue 64, the one that replaces it)
REMOVED = [
    (["translate", "m", "--max-tokens", "5"], ["translate", "m", "--batch-tokens", "5"]),
    (["classify", "m", "--max-tokens", "5"], ["classify", "m", "--batch-tokens", "5"]),
    (["translate", "m", "--output", "t.txt"], ["translate", "m", "--out", "t.txt"]),
    (["evaluate", "m", "--output", "s.json"], ["evaluate", "m", "-o", "s.json"]),
    (["plot", "pe", "--output", "p.png"], ["plot", "pe", "--out", "p.png"]),
    (["data", "tokenizer", "--output", "t.json"], ["data", "tokenizer", "-o", "t.json"]),
    (["plot", "pe", "--depth", "16"], ["plot", "pe", "--d-model", "16"]),
    (["serve", "m", "--no-batching"], ["serve", "m", "--set", "serve.batching=false"]),
    (["serve", "m", "--no-step-batching"], ["serve", "m", "--set", "serve.step_batching=false"]),
    (["serve", "m", "--batching", "off"], ["serve", "m", "--set", "serve.batching=false"]),
    (["serve", "m", "--workers", "2"], ["serve", "m", "--lanes", "2"]),
    (["serve", "m", "--max-texts", "4"], ["serve", "m", "--set", "serve.max_texts=4"]),
    (["serve", "m", "--batch-tokens", "64"], ["serve", "m", "--set", "serve.batch_tokens=64"]),
    (["serve", "m", "--max-new-tokens", "9"], ["serve", "m", "--set", "serve.max_new_tokens=9"]),
    (["summary", "tiny", "--src-len", "7"], ["summary", "tiny", "--shape", "2,7,16"]),
    (["data", "prepare", "toy", "--mirror", "x"], ["data", "prepare", "toy"]),
    (["data", "prepare", "toy", "--no-progress"], ["data", "prepare", "toy", "-q"]),
    (["evaluate", "m", "--length-penalty", "average"],
     ["evaluate", "m", "--set", "decode.length_penalty=average"]),
    (["translate", "m", "--no-repeat-ngram-size", "3"],
     ["translate", "m", "--set", "decode.no_repeat_ngram_size=3"]),
]


@pytest.mark.parametrize("old, new", REMOVED, ids=lambda x: " ".join(x))
def test_a_removed_spelling_is_refused_and_its_replacement_parses(old, new, capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(old)
    assert exit_.value.code == 2
    assert f"unrecognized arguments: {old[old.index(next(a for a in old if a.startswith('--')))]}" \
        in capsys.readouterr().err
    build_parser().parse_args(new)
    assert capsys.readouterr().err == ""


def test_no_flag_has_a_hidden_or_second_spelling():
    """Every flag is in --help, and each has one long spelling (-o/--out: one short, one long)."""
    for name, p in sub_parsers(build_parser()):
        for a in p._actions:
            longs = [s for s in a.option_strings if s.startswith("--") and not s.startswith("--no-")]
            assert a.help != argparse.SUPPRESS and len(longs) <= 1, (name, a.option_strings)


def test_serve_limits_and_batching_are_set_serve_keys():
    from aiayn.commands.serve import limits_from

    def limits(*sets):
        return limits_from(build_parser().parse_args(["serve", "m", *sets]))

    assert limits().batching and limits().step_batching
    chosen = limits("--set", "serve.batching=false", "--set", "serve.batch_tokens=64",
                    "--set", "serve.max_new_tokens=9")
    assert (chosen.batching, chosen.batch_tokens, chosen.max_new_tokens) == (False, 64, 9)
    with pytest.raises(ConfigError, match=r"unknown config key 'serve.max_text' \(did you mean "
                       r"'serve.max_texts'\?\)"):
        limits("--set", "serve.max_text=4")
    with pytest.raises(ConfigError, match=r"--set decode.beam=2: this command takes serve"):
        limits("--set", "decode.beam=2")


def test_set_decode_takes_any_decoding_key_typed_and_refuses_others(capsys):
    from aiayn.commands.options import decode_overrides

    def sets(*pairs, flags=()):
        argv = ["translate", "m", *flags, *(a for p in pairs for a in ("--set", p))]
        return decode_overrides(build_parser().parse_args(argv))

    assert sets("decode.early_stopping=false", "decode.min_len=2", "decode.bad_ids=5,7") == {
        "early_stopping": False, "min_len": 2, "bad_ids": (5, 7)}
    assert sets(flags=("--beam", "5", "--batch-tokens", "64")) == {"beam": 5, "batch_tokens": 64}
    for bad, error in (("decode.beem=2", "unknown config key 'decode.beem' (did you mean "
                        "'decode.beam'?)"),
                       ("beam=2", "--set beam=2: this command takes decode.KEY=VALUE"),
                       ("train.lr=1", "--set train.lr=1: this command takes decode.KEY=VALUE"),
                       ("decode.min_len=x", "decode.min_len: expected an integer, got 'x'"),
                       # one spelling per setting: a key with a flag is set by the flag
                       ("decode.beam=2", "--set decode.beam: this command's flag for it is --beam"),
                       ("decode.workers=2", "--set decode.workers: this command's flag for it is "
                        "--workers"),
                       ("decode.max_tokens=9", "--set decode.max_tokens: this command's flag for "
                        "it is --batch-tokens"),
                       ("decode.nbest=2", "--set decode.nbest: this command's flag for it is "
                        "--nbest")):
        with pytest.raises(ConfigError) as err:
            sets(bad)
        assert str(err.value).startswith(error), err.value
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("command", ["translate", "evaluate"])
def test_a_bad_set_decode_key_is_one_line_before_the_model_is_read(command, tmp_path, capsys):
    capsys.readouterr()
    assert main([command, str(tmp_path / "none"), "--set", "decode.beem=2"]) == 2
    assert capsys.readouterr().err == (
        "aiayn: error: unknown config key 'decode.beem' (did you mean 'decode.beam'?)\n")


# ---- one --set syntax: SECTION.KEY=VALUE, as in recipes and `aiayn train` ----------------------
def test_data_and_summary_take_dotted_keys_and_refuse_bare_ones(capsys):
    from aiayn.commands.data import data_config
    from aiayn.commands.summary import resolve_model_config

    capsys.readouterr()
    assert data_config(Namespace(config=None, overrides=["data.vocab_size=123"])).vocab_size == 123
    assert resolve_model_config("tiny", ["model.d_model=64"])[0].d_model == 64
    assert capsys.readouterr().err == ""
    with pytest.raises(ConfigError, match=r"--set vocab_size=123: this command takes data.KEY"):
        data_config(Namespace(config=None, overrides=["vocab_size=123"]))
    with pytest.raises(ConfigError, match=r"--set d_model=64: this command takes model.KEY"):
        resolve_model_config("tiny", ["d_model=64"])
    with pytest.raises(ConfigError, match=r"--set train.lr=1: this command takes data.KEY=VALUE"):
        data_config(Namespace(config=None, overrides=["train.lr=1"]))


def test_every_set_flag_has_the_same_syntax():
    metavars = {name: a.metavar for name, p in sub_parsers(build_parser()) for a in p._actions
                if "--set" in a.option_strings}
    assert metavars == {"summary": "model.KEY=VALUE", "train": "SECTION.KEY=VALUE",
                        "serve": "serve.KEY=VALUE",
                        "translate": "decode.KEY=VALUE", "evaluate": "decode.KEY=VALUE",
                        "data tokenizer": "data.KEY=VALUE", "data build": "data.KEY=VALUE",
                        "data stats": "data.KEY=VALUE"}


# ---- --version and the global flags --------------------------------------------------------------
def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"aiayn {version('aiayn')}\n"


@pytest.mark.parametrize("argv, verbose, quiet", [
    (["translate", "m"], False, False),
    (["-v", "translate", "m"], True, False),
    (["translate", "m", "-v"], True, False),
    (["translate", "-q", "m"], False, True),
    (["--verbose", "data", "list", "--quiet"], True, True),
    (["data", "prepare", "multi30k", "--verbose"], True, False),
    (["plot", "curves", "r", "-q"], False, True),
])
def test_global_flags_work_before_and_after_the_command(argv, verbose, quiet):
    args = build_parser().parse_args(argv)
    assert (args.verbose, args.quiet) == (verbose, quiet)
    assert log_level(args) == (logging.DEBUG if verbose else logging.WARNING if quiet
                               else logging.INFO)


# ---- --device auto -------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["translate", "evaluate", "classify", "generate", "serve"])
def test_inference_commands_default_to_device_auto(command):
    argv = [command, "m", *(["--prompt", "x"] if command == "generate" else [])]
    assert build_parser().parse_args(argv).device == "auto"


def test_device_auto_is_cuda_when_there_is_one_else_the_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert inference_device("auto") == torch.device("cpu")
    with pytest.raises(ConfigError, match="--device cuda: no CUDA device is available"):
        inference_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert inference_device("auto") == torch.device("cuda")


# ---- choices from the registries; every flag says what it is for --------------------------------
def test_engine_and_format_choices_come_from_the_registries():
    from aiayn.export import EXPORTERS
    from aiayn.runtime import ENGINES

    choices = {(name, a.dest): tuple(a.choices) for name, p in sub_parsers(build_parser())
               for a in p._actions if a.dest in ("engine", "format")}
    assert choices == {("translate", "engine"): ENGINES, ("evaluate", "engine"): ENGINES,
                       ("serve", "engine"): ENGINES, ("export", "format"): tuple(EXPORTERS)}


def test_every_flag_has_a_help_string():
    missing = [f"{name} {a.option_strings or a.dest}" for name, p in sub_parsers(build_parser())
               for a in p._actions
               if not isinstance(a, argparse._SubParsersAction) and not (a.help or "").strip()]
    assert missing == []


@pytest.mark.parametrize("command", ["translate", "evaluate", "classify", "generate", "summary"])
def test_expert_flags_are_under_advanced_options(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    assert f"\n{ADVANCED}:\n" in out
    advanced = out.split(f"\n{ADVANCED}:\n")[1]
    expert = {"translate": "--workers", "evaluate": "--compile", "classify": "--batch-tokens",
              "generate": "--no-cache", "summary": "--shape"}
    options = out.split("\noptions:\n")[1].split(f"\n{ADVANCED}:\n")[0]
    assert expert[command] in advanced and expert[command] not in options


def test_a_bare_set_key_through_the_command_line_is_one_error_line(capsys):
    capsys.readouterr()
    assert main(["summary", "tiny", "--set", "d_model=64"]) == 2
    assert capsys.readouterr().err == (
        "aiayn: error: --set d_model=64: this command takes model.KEY=VALUE\n")
    assert main(["summary", "tiny", "--set", "model.d_model=64"]) == 0
    assert capsys.readouterr().err == ""
