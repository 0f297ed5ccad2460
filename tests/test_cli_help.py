"""`aiayn` alone prints the commands and the first steps; every --help ends with one example that
the parser itself accepts; `aiayn --help` and `--version` answer without importing torch."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time

import pytest
from trainutil import subprocess_env

from aiayn.cli import COMMANDS, build_parser, main, named_command


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


# ---- a fast start (issue 66, point 9): `aiayn --help` and `--version` took 3-4 s importing torch --

# One interpreter per command line: main(argv), then the heavy modules and the command modules it
# imported (their shared options aside), as one JSON line.
IMPORTED = """
import json, sys
from aiayn.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
heavy = {"torch", "numpy", "tokenizers", "sacrebleu", "safetensors"}
commands = {m for m in sys.modules if m.startswith("aiayn.commands.")} - {"aiayn.commands.options"}
print(json.dumps(sorted(heavy & set(sys.modules) | commands)))
"""
# Commands whose --help builds their parser without torch (the others show names held by modules
# that need it: the classifier's batch, the export formats, the datasets).
LIGHT_COMMANDS = ("plot", "summary", "train", "average", "translate", "evaluate", "generate",
                  "serve", "import")


def imported_by(*argv: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", IMPORTED, *argv], env=subprocess_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_help_and_version_import_neither_torch_nor_a_command():
    assert imported_by("--version") == []
    assert imported_by("--help") == []
    assert imported_by() == []  # bare `aiayn`: the commands and first steps
    assert imported_by("-v", "no-such-command") == []
    for name in LIGHT_COMMANDS:
        assert imported_by(name, "--help") == [f"aiayn.commands.{name}"], name


def test_version_answers_in_a_fraction_of_a_second():
    """Wall time of the real entry point; the best of three, as the machine may be shared (with
    torch imported it took 3-4 s on the 2-core machine, and 0.2 s without, 2026-12-06)."""
    times = []
    for _ in range(3):
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "aiayn", "--version"], env=subprocess_env(),
                              capture_output=True, text=True, timeout=120)
        times.append(time.perf_counter() - start)
        assert done.returncode == 0 and done.stdout.startswith("aiayn "), done.stderr
    assert min(times) < 1.5, times


def test_the_list_of_commands_is_the_same_without_their_modules():
    """`aiayn --help` builds no command's parser: its text is the one of the whole parser."""
    assert build_parser([]).format_help() == build_parser().format_help()
    assert build_parser(["train"]).format_help() == build_parser().format_help()


@pytest.mark.parametrize(("argv", "named"), [
    ([], None), (["--help"], None), (["--version"], None), (["bogus", "train"], None),
    (["train", "x.toml"], "train"), (["-v", "-q", "translate", "--help"], "translate"),
])
def test_the_command_named_is_the_first_word_that_is_not_a_flag(argv, named):
    assert named_command(argv) == named
