"""README.md and docs/ stay true: every relative link and every repository path they name exists,
and every `aiayn …` command in their code blocks is one the CLI parser accepts.

Placeholders are handled as a reader would: `[--top-k K]` is an optional part (checked with it),
`…` stands for arguments left out, and an upper-case word (`MODEL_DIR`, `N`) stands for a value.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from aiayn.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# The guide (README and docs/*.md): commands are checked there. The per-run records under
# docs/experiments/ keep the commands of their day, so only their links and paths are checked.
GUIDE = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
# A repository path named in the text: it starts at a top-level folder of the repository.
REPO_PATH = re.compile(
    r"(?<![\w./-])((?:aiayn|tests|benchmarks|scripts|docs|configs)/[\w./-]*[\w/])"
)
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.S | re.M)
SHELL_BLOCKS = {"", "bash", "sh", "shell", "console", "text"}
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")


def rel(page: Path) -> str:
    return str(page.relative_to(ROOT))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {slug(m) for m in re.findall(r"^#{1,6}\s+(.+?)\s*$", text, re.M)}


def outside_code_blocks(text: str) -> str:
    return FENCE.sub("", text)


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_relative_links_resolve(page):
    text = outside_code_blocks(page.read_text(encoding="utf-8"))
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{rel(page)}: broken links {broken}"


def path_exists(name: str) -> bool:
    """A named path exists as a file or folder, or names the prefix of files a script writes
    (`--out docs/experiments/results_lr30` writes .json and .md beside each other)."""
    path = ROOT / name.rstrip("/.")
    return path.exists() or any(path.parent.glob(path.name + ".*"))


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_named_repository_paths_exist(page):
    text = page.read_text(encoding="utf-8")
    missing = sorted({name for name in REPO_PATH.findall(text) if not path_exists(name)})
    assert not missing, f"{rel(page)} names paths that do not exist: {missing}"


def command_lines(text: str) -> list[str]:
    """Every `aiayn …` invocation in the code blocks of a page, continuation lines joined."""
    found = []
    for lang, block in FENCE.findall(text):
        if lang.strip() not in SHELL_BLOCKS:  # python, toml, json: not shell commands
            continue
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"^\s*(\$\s+)?", "", line)
            for match in re.finditer(r"(?:^|[\s;&|(])(?:-m\s+)?aiayn\s+(?=[a-z-])(.*)", line):
                found.append(match.group(1))
                break
    return found


def tokens(command: str) -> list[str]:
    """The arguments of one command, up to the first shell operator or comment; optional
    `[...]` groups kept without their brackets; `…` dropped."""
    command = command.replace("[", " ").replace("]", " ")
    command = re.split(r"\s*\d?(?:&&|\|\||[;|&<>])", command)[0]  # the first command of a pipeline
    try:
        words = shlex.split(command, comments=True)
    except ValueError:  # a quote opened here and closed after the operator
        words = command.split()
    out = []
    for word in words:
        if word not in ("…", "..."):
            out.append(word)
    return out


def parses(argv: list[str]) -> str | None:
    """None when the parser accepts argv, else its error message."""
    parser = build_parser()
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            parser.parse_args(argv)
        except SystemExit as exit_:
            if exit_.code:
                return err.getvalue().strip().splitlines()[-1] if err.getvalue() else "error"
    return None


def test_the_command_finder_sees_what_readers_see():
    text = "```bash\nfor s in 1 2; do OMP_NUM_THREADS=1 aiayn train c.toml \\\n  --out r & done\n" \
           "$ echo hi | aiayn translate runs/x --beam 5\ntorchrun -m aiayn train c.toml\n```\n"
    assert [tokens(c) for c in command_lines(text)] == [
        ["train", "c.toml", "--out", "r"], ["translate", "runs/x", "--beam", "5"],
        ["train", "c.toml"]]
    assert parses(["translate", "runs/x", "--no-such-flag"]) is not None
    assert parses(["no-such-command"]) is not None
    assert parses(["translate", "runs/x", "--beam", "5"]) is None


@pytest.mark.parametrize("page", GUIDE, ids=rel)
def test_commands_in_code_blocks_parse(page):
    bad = []
    for command in command_lines(page.read_text(encoding="utf-8")):
        argv = tokens(command)
        error = parses(argv)
        if error is not None:  # placeholders stand for values: try them as one
            error = parses(["1" if PLACEHOLDER.match(w) else w for w in argv]) and error
        if error is not None:
            bad.append(f"aiayn {' '.join(argv)}: {error}")
    assert not bad, f"{rel(page)}: commands the CLI does not accept:\n" + "\n".join(bad)


def test_every_guide_page_is_linked_from_the_index():
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    linked = {Path(t.partition("#")[0]).name for t in LINK.findall(index)}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    assert not pages - linked, f"docs/index.md does not link {sorted(pages - linked)}"


def test_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines (at most 250)"
    assert "docs/index.md" in "\n".join(lines)
