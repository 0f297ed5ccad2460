"""One meaning per name on the command line: renamed flags keep working with one warning line,
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

# (old spelling, new spelling, the namespace attribute both set, the value it gets)
RENAMED = [
    (["translate", "m", "--max-tokens", "5"], ["translate", "m", "--batch-tokens", "5"], "max_tokens", 5),
    (["evaluate", "m", "--max-tokens", "5"], ["evaluate", "m", "--batch-tokens", "5"], "max_tokens", 5),
    (["classify", "m", "--max-tokens", "5"], ["classify", "m", "--batch-tokens", "5"], "max_tokens", 5),
    (["translate", "m", "--output", "t.txt"], ["translate", "m", "--out", "t.txt"], "output", "t.txt"),
    (["evaluate", "m", "--output", "s.json"], ["evaluate", "m", "-o", "s.json"], "output", "s.json"),
    (["plot", "pe", "--output", "p.png"], ["plot", "pe", "--out", "p.png"], "output", "p.png"),
    (["data", "tokenizer", "--output", "t.json"], ["data", "tokenizer", "-o", "t.json"], "output",
     "t.json"),
    (["plot", "pe", "--depth", "16"], ["plot", "pe", "--d-model", "16"], "d_model", 16),
    (["plot", "pe-similarity", "--depth", "16"], ["plot", "pe-similarity", "--d-model", "16"],
     "d_model", 16),
]


def parse(argv: list[str], capsys) -> tuple[Namespace, list[str]]:
    capsys.readouterr()
    args = build_parser().parse_args(argv)
    return args, capsys.readouterr().err.splitlines()


@pytest.mark.parametrize("old, new, dest, value", RENAMED, ids=lambda x: " ".join(x)
                         if isinstance(x, list) else None)
def test_an_old_spelling_works_with_one_warning_naming_the_new_one(old, new, dest, value, capsys):
    args, warned = parse(old, capsys)
    assert getattr(args, dest) == value
    now = {"--max-tokens": "--batch-tokens", "--output": "--out", "--depth": "--d-model"}[old[-2]]
    assert warned == [f"aiayn: warning: {old[-2]} is now called {now}"]
    args, warned = parse(new, capsys)
    assert getattr(args, dest) == value and warned == []


def test_an_old_spelling_given_twice_warns_once(capsys):
    args, warned = parse(["translate", "m", "--max-tokens", "5", "--max-tokens", "6"], capsys)
    assert args.max_tokens == 6
    assert warned == ["aiayn: warning: --max-tokens is now called --batch-tokens"]


def test_help_shows_the_new_spellings_only(capsys):
    for argv, hidden in ((["translate", "--help"], ("--max-tokens", "--output")),
                         (["plot", "pe", "--help"], ("--depth", "--output"))):
        with pytest.raises(SystemExit):
            main(argv)
        out = capsys.readouterr().out
        assert not [h for h in hidden if h in out], out
    with pytest.raises(SystemExit):
        main(["translate", "--help"])
    out = capsys.readouterr().out
    assert "--batch-tokens N" in out and "-o FILE, --out FILE" in out


# ---- flags merged into another, or retired for --set decode.KEY / the environment ----------------
# (old argv, new argv, what both give: namespace attributes, or the decoding settings, the
# one warning line the old spelling prints)
RETIRED = [
    (["serve", "m", "--no-batching"], ["serve", "m", "--batching", "off"], {"batching": "off"},
     "--no-batching is now --batching off"),
    (["serve", "m", "--no-step-batching"], ["serve", "m", "--batching", "whole"],
     {"batching": "whole"}, "--no-step-batching is now --batching whole"),
    (["summary", "tiny", "--src-len", "7"], ["summary", "tiny", "--shape", "2,7,16"],
     {"shape": (2, 7, 16)}, "--src-len is now --shape B,7,T"),
    (["summary", "tiny", "--batch", "3"], ["summary", "tiny", "--shape", "3,16,16"],
     {"shape": (3, 16, 16)}, "--batch is now --shape 3,S,T"),
    (["data", "prepare", "toy", "--no-progress"], ["data", "prepare", "toy", "-q"],
     {"quiet_or_no_progress": True}, "--no-progress is now -q (no progress bar)"),
    *[([command, "m", flag, value], [command, "m", "--set", f"decode.{key}={value}"],
       {"decode": {key: typed}}, f"{flag} is now --set decode.{key}={value}")
      for command in ("translate", "evaluate")
      for flag, key, value, typed in (("--length-penalty", "length_penalty", "average", "average"),
                                      ("--max-len-a", "max_len_a", "1.5", 1.5),
                                      ("--max-len-b", "max_len_b", "6", 6),
                                      ("--repetition-penalty", "repetition_penalty", "1.2", 1.2),
                                      ("--no-repeat-ngram-size", "no_repeat_ngram_size", "3", 3))],
]


def given(args: Namespace) -> dict:
    """What a parsed command line asks for, in the terms the RETIRED cases compare."""
    from aiayn.commands.options import decode_overrides
    from aiayn.commands.summary import example_shape

    if args.command in ("translate", "evaluate"):
        return {"decode": decode_overrides(args)}
    if args.command == "summary":
        return {"shape": example_shape(args)}
    if args.command == "data":
        return {"quiet_or_no_progress": args.no_progress or args.quiet}
    return {"batching": args.batching}


@pytest.mark.parametrize("old, new, same, warning", RETIRED,
                         ids=lambda x: " ".join(x) if isinstance(x, list) else "")
def test_a_retired_flag_works_with_one_warning_naming_what_replaces_it(old, new, same, warning,
                                                                         capsys):
    flags = old[next(i for i, a in enumerate(old) if a.startswith("--")):]
    args, warned = parse(old + flags, capsys)  # given twice: still one warning
    assert given(args) == same and warned == [f"aiayn: warning: {warning}"]
    args, warned = parse(new, capsys)
    assert given(args) == same and warned == []


def test_retired_flags_are_not_in_help(capsys):
    for argv in (["translate", "--help"], ["evaluate", "--help"], ["serve", "--help"],
                 ["summary", "--help"], ["data", "prepare", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
        out = capsys.readouterr().out
        hidden = [f for f in ("--length-penalty", "--max-len-a", "--max-len-b",
                              "--repetition-penalty", "--no-repeat-ngram-size", "--no-batching",
                              "--no-step-batching", "--src-len", "--tgt-len", "--batch ",
                              "--mirror", "--cache", "--no-progress") if f in out]
        assert hidden == [], argv


def test_serve_batching_gives_the_limits_the_old_flags_gave():
    from aiayn.commands.serve import limits_from

    def limits(*flags):
        chosen = limits_from(build_parser().parse_args(["serve", "m", *flags]))
        return chosen.batching, chosen.step_batching

    assert limits() == limits("--batching", "step") == (True, True)
    assert limits("--batching", "whole") == (True, False)
    assert limits("--batching", "off")[0] is False  # no merging: step batching cannot apply


def test_set_decode_takes_any_decoding_key_typed_and_refuses_others(capsys):
    from aiayn.commands.options import decode_overrides

    def sets(*pairs, flags=()):
        argv = ["translate", "m", *flags, *(a for p in pairs for a in ("--set", p))]
        return decode_overrides(build_parser().parse_args(argv))

    assert sets("decode.early_stopping=false", "decode.min_len=2", "decode.bad_ids=5,7") == {
        "early_stopping": False, "min_len": 2, "bad_ids": (5, 7)}
    assert sets("decode.beam=2", flags=("--beam", "5")) == {"beam": 5}  # the flag wins
    for bad, error in (("decode.beem=2", "unknown config key 'decode.beem' (did you mean "
                        "'decode.beam'?)"),
                       ("beam=2", "--set beam=2: this command takes decode.KEY=VALUE"),
                       ("train.lr=1", "--set train.lr=1: this command takes decode.KEY=VALUE"),
                       ("decode.min_len=x", "decode.min_len: expected an integer, got 'x'"),
                       ("decode.workers=2", "--set decode.workers: batches decoded at once")):
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
def test_data_and_summary_take_dotted_keys_and_bare_ones_with_a_warning(capsys):
    from aiayn.commands.data import data_config
    from aiayn.commands.summary import resolve_model_config

    capsys.readouterr()
    assert data_config(Namespace(config=None, overrides=["data.vocab_size=123"])).vocab_size == 123
    assert resolve_model_config("tiny", ["model.d_model=64"])[0].d_model == 64
    assert capsys.readouterr().err == ""
    assert data_config(Namespace(config=None, overrides=["vocab_size=123"])).vocab_size == 123
    assert resolve_model_config("tiny", ["d_model=64"])[0].d_model == 64
    assert capsys.readouterr().err.splitlines() == [
        "aiayn: warning: --set vocab_size=123 is now --set data.vocab_size=123 (the recipes' "
        "SECTION.KEY)",
        "aiayn: warning: --set d_model=64 is now --set model.d_model=64 (the recipes' SECTION.KEY)",
    ]
    with pytest.raises(ConfigError, match=r"--set train.lr=1: this command takes data.KEY=VALUE"):
        data_config(Namespace(config=None, overrides=["train.lr=1"]))


def test_every_set_flag_has_the_same_syntax():
    metavars = {name: a.metavar for name, p in sub_parsers(build_parser()) for a in p._actions
                if "--set" in a.option_strings}
    assert metavars == {"summary": "model.KEY=VALUE", "train": "SECTION.KEY=VALUE",
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


@pytest.mark.parametrize("command", ["translate", "evaluate", "classify", "generate", "serve",
                                     "summary"])
def test_expert_flags_are_under_advanced_options(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    assert f"\n{ADVANCED}:\n" in out
    advanced = out.split(f"\n{ADVANCED}:\n")[1]
    expert = {"translate": "--workers", "evaluate": "--compile", "classify": "--batch-tokens",
              "generate": "--no-cache", "serve": "--batching", "summary": "--shape"}
    options = out.split("\noptions:\n")[1].split(f"\n{ADVANCED}:\n")[0]
    assert expert[command] in advanced and expert[command] not in options


def test_a_bare_set_key_through_the_command_line_is_one_warning_line(capsys):
    capsys.readouterr()
    assert main(["summary", "tiny", "--set", "d_model=64", "--set", "d_ff=64"]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        "aiayn: warning: --set d_model=64 is now --set model.d_model=64 (the recipes' SECTION.KEY)",
        "aiayn: warning: --set d_ff=64 is now --set model.d_ff=64 (the recipes' SECTION.KEY)",
    ]
    assert "Total params" in captured.out
    assert main(["summary", "tiny", "--set", "model.d_model=64"]) == 0
    assert capsys.readouterr().err == ""
