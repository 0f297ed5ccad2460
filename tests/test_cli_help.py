"""`aiayn` alone prints the commands and the first steps; every --help ends with one example that
the parser itself accepts."""

from __future__ import annotations

import shlex

import pytest

from aiayn.cli import COMMANDS, build_parser, main


def help_text(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 0
    return capsys.readouterr().out


def example_of(text: str) -> list[str]:
    """The arguments of the `aiayn …` command on the last line, which must be `Example: …`."""
    last = text.rstrip().splitlines()[-1].strip()
    assert last.startswith("Example: "), f"help does not end with an example: {last!r}"
    command = last.removeprefix("Example: ").split("| ")[-1]
    words = shlex.split(command)
    assert words[0] == "aiayn", last
    return words[1:]


def test_no_arguments_prints_commands_and_first_steps(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert f"    {name} " in out, name
    assert "make demo" in out and "make test" in out
    assert "aiayn train configs/multi30k_demo.toml --out runs/x" in out
    assert "aiayn translate runs/x/best" in out
    assert "error" not in out


def test_top_level_help_ends_with_an_example(capsys):
    argv = example_of(help_text(["--help"], capsys))
    build_parser().parse_args(argv)  # the example is a command the parser accepts


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_help_ends_with_an_example_that_parses(name, capsys):
    argv = example_of(help_text([name, "--help"], capsys))
    assert argv[0] == name
    build_parser().parse_args(argv)


def test_example_lines_are_not_wrapped(capsys):
    out = help_text(["summary", "--help"], capsys)
    assert ("Example: aiayn summary base --set model.src_vocab_size=37000 --set model.d_model=256"
            in out)
