"""Write docs/reference/cli.md: every `aiayn` command and flag with its help, read from the parsers,
and every recipe key with its default and the why-comment above it in the config dataclasses.

    python scripts/make_reference.py           # rewrite docs/reference/cli.md
    python scripts/make_reference.py --check   # exit 1 when the page is not what this writes

tests/test_reference.py checks that the page in the repository is the one this writes, so a flag
or a key changed without the page fails the tests.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

from aiayn.cli import _HelpFormatter, build_parser, sub_parsers
from aiayn.run_config import RunConfig
from aiayn.serve.limits import Limits

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "reference" / "cli.md"

HEADER = """# Reference: commands, flags and recipe keys

Written by `scripts/make_reference.py` from the command line's parsers and the config
dataclasses; `tests/test_reference.py` fails when this page is not what the script writes, so
rerun the script after changing a flag, its help or a config key. `aiayn COMMAND --help` prints
the same text for one command.

Names mean one thing each, and a setting has one name: the flag `--beam` is the recipe key
`decode.beam`, the HTTP field `"beam"` and the Python keyword `translate(beam=)`. Each setting has
one spelling on a command line: a flag where it has one, else `--set SECTION.KEY=VALUE`, which
sets a key below. `-o/--out` is what a command writes (its kind is said per command).
`-i/--input` is a file of inputs, one per line; `--src`/`--ref` are the two sides of your own test
set; `--text` and `--prompt` are text given on the command line. Three token budgets, three
settings: `--batch-tokens` (`decode.batch_tokens`) is one decoding batch's, sentences × longest
padded source; `data.max_tokens` is a training batch's, B × max(S, T) over both sides
(fairseq-train's `--max-tokens`); `serve.batch_tokens` is the source tokens the server merges
across requests. `--workers` are batches decoded at once in one process; `serve --lanes` are
server processes. `--device auto` takes CUDA when there is one. Expert and benchmark flags are
listed under "advanced options".
"""


def escape(text: str) -> str:
    """Markdown-safe text: ``<name>`` outside code spans would be read as an HTML tag."""
    parts = text.split("`")
    return "`".join(p.replace("<", "\\<") if i % 2 == 0 else p for i, p in enumerate(parts))


def invocation(action: argparse.Action) -> str:
    """How --help writes the flag (``-o FILE, --out FILE``)."""
    return _HelpFormatter("aiayn")._format_action_invocation(action)


def flag_lines(actions: list[argparse.Action]) -> list[str]:
    lines = []
    for action in actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        lines.append(f"- `{invocation(action)}`: {escape(' '.join((action.help or '').split()))}")
    return lines


def command_section(name: str, parser: argparse.ArgumentParser, summary: str) -> list[str]:
    lines = [f"### aiayn {name}", "", escape(summary[:1].upper() + summary[1:]) + ".", ""]
    if parser.description:
        lines += [escape(" ".join(parser.description.split())), ""]
    for group in parser._action_groups:
        if group.title == "global options":
            continue
        flags = flag_lines(group._group_actions)
        if flags:
            title = {"positional arguments": "arguments", "options": "options"}.get(
                str(group.title), str(group.title)
            )
            lines += [f"{title}:", "", *flags, ""]
    return lines


def summaries(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, str]:
    """Each command's one-line help, as the list of commands in ``aiayn --help`` gives it."""
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                found[prefix + choice.dest] = str(choice.help)
            for name, sub in action.choices.items():
                found.update(summaries(sub, f"{prefix}{name} "))
    return found


def commands() -> list[str]:
    top = build_parser()
    lines = ["## Commands", "", "Global options, before or after the command:", ""]
    lines += flag_lines([a for a in top._actions if a.option_strings])
    lines.append("")
    helps = summaries(top)
    for name, parser in sub_parsers(top):
        lines += command_section(name, parser, helps[name])
    return lines


def field_comments(cls: type) -> dict[str, str]:
    """The comment block above each field of dataclass ``cls``, joined into one line; fields
    declared right after another without a comment of their own share its comment."""
    comments: dict[str, str] = {}
    block: list[str] = []
    last = ""
    for line in textwrap.dedent(inspect.getsource(cls)).splitlines()[1:]:
        comment = re.match(r"    # ?(.*)$", line)
        field = re.match(r"    (\w+): [^=]+(=.*)?$", line)
        if comment:
            block.append(comment.group(1).strip())
        elif field and field.group(1) != "PRESETS":
            last = " ".join(block) if block else last
            comments[field.group(1)] = last
            block = []
        else:
            block, last = [], ""
    return comments


def toml(value: Any) -> str:
    """A default as a recipe writes it."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(toml(v) for v in value) + "]"
    return "none" if value is None else str(value)


def sections() -> list[tuple[str, Any]]:
    """(name, defaults) of every section `--set SECTION.KEY=VALUE` takes: a recipe's, then the
    server's (``aiayn serve --set serve.KEY=VALUE``; not a recipe's)."""
    cfg = RunConfig()
    return [(s.name, getattr(cfg, s.name)) for s in dataclasses.fields(RunConfig)] + [
        ("serve", Limits())
    ]


def config_keys() -> list[str]:
    lines = [
        "## Recipe keys",
        "",
        "The sections of a recipe (`configs/*.toml`) and of `--set SECTION.KEY=VALUE`; a model "
        "folder's config.json holds them all, resolved. Each key with its default. The last, "
        "[serve], is `aiayn serve --set serve.KEY=VALUE`'s, not a recipe's.",
        "",
    ]
    for name, value in sections():
        why = field_comments(type(value))
        doc = (inspect.getdoc(type(value)) or "").split("\n\n")
        lines += [f"### [{name}]", "", *(escape(" ".join(p.split())) + "\n" for p in doc)]
        for f in dataclasses.fields(value):
            reason = escape(why.get(f.name) or "(no comment in the code yet)")
            lines.append(f"- `{name}.{f.name}` = `{toml(getattr(value, f.name))}`: {reason}")
        lines.append("")
    return lines


def sizes() -> str:
    """How many flags and keys a user can meet: the measure of the option surface (--help and
    the global -v/-q left out; a --x/--no-x pair is one flag)."""
    flags = 0
    parsers = [  # the commands that run (`data prepare`), not the groups (`data`)
        p
        for _, p in sub_parsers(build_parser())
        if not any(isinstance(a, argparse._SubParsersAction) for a in p._actions)
    ]
    for parser in parsers:
        for group in parser._action_groups:
            if group.title == "global options":
                continue
            flags += sum(
                1
                for a in group._group_actions
                if a.option_strings and not isinstance(a, argparse._HelpAction)
            )
    keys = sum(len(dataclasses.fields(value)) for _, value in sections())
    return f"In all: {flags} flags over {len(parsers)} commands, and {keys} keys.\n"


def render() -> str:
    return "\n".join([HEADER, sizes(), *commands(), *config_keys()]).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only say whether the page is current")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = PAGE.is_file() and PAGE.read_text(encoding="utf-8") == text
        print(f"{PAGE.relative_to(ROOT)}: {'current' if current else 'stale: rerun this script'}")
        return 0 if current else 1
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
