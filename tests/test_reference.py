"""docs/reference/cli.md is what scripts/make_reference.py writes from the parsers and the config
dataclasses: a flag, its help or a recipe key changed without the page fails here."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def make_reference():
    spec = importlib.util.spec_from_file_location("make_reference",
                                                  ROOT / "scripts" / "make_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_reference_page_is_what_the_script_writes():
    page = (ROOT / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")
    assert page == make_reference().render(), (
        "docs/reference/cli.md is stale: run `python scripts/make_reference.py`")


def test_every_recipe_key_has_a_reason_and_every_command_a_section():
    text = make_reference().render()
    assert "(no comment in the code yet)" not in text
    for command in ("translate", "evaluate", "serve", "data prepare", "plot attention", "import"):
        assert f"\n### aiayn {command}\n" in text
    for key in ("model.d_model", "data.max_tokens", "train.lr", "decode.batch_tokens",
                "serve.batch_tokens"):
        assert f"- `{key}` = " in text


def test_the_page_counts_the_flags_and_keys_a_user_can_meet():
    """The size of the option surface, on the page (issue 58: 113 flags and 114 keys before
    merging; issue 64: 118 flags and 12 old spellings before one spelling per setting), so that a
    flag or key added shows in the page's diff: one per flag line of the commands (the global
    -v/-q left out), one per key line (recipe keys and serve.*)."""
    import re

    text = make_reference().render()
    found = re.search(r"In all: (\d+) flags over (\d+) commands, and (\d+) keys", text)
    commands, keys = text.split("\n## Recipe keys\n")
    flags = len(re.findall(r"^- `-", commands.split("\n### ", 1)[1], re.M))
    assert found and (int(found[1]), int(found[3])) == (flags, len(re.findall(r"^- `\w+\.", keys, re.M)))


def test_a_key_without_a_comment_is_shown_as_such_and_shared_comments_carry_over():
    from dataclasses import dataclass

    @dataclass
    class Example:
        # Why a and b.
        a: int = 1
        b: int = 2

        c: int = 3

    assert make_reference().field_comments(Example) == {"a": "Why a and b.", "b": "Why a and b.",
                                                        "c": ""}


def test_the_check_mode_says_whether_the_page_is_current(capsys):
    assert make_reference().main(["--check"]) == 0
    assert capsys.readouterr().out == "docs/reference/cli.md: current\n"
