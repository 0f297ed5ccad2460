"""README.md and docs/ stay true: every relative link and every repository path they name exists,
every `aiayn …` command in their code blocks is one the CLI parser accepts, and every published
figure (README, guide pages, the log, config headers) is the one docs/results.json holds, which
in turn is its raw file's.

Placeholders are handled as a reader would: `[--top-k K]` is an optional part (checked with it),
`…` stands for arguments left out, and an upper-case word (`MODEL_DIR`, `N`) stands for a value.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import statistics
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


# A page of docs/ named in the code, with its heading when it has one: where a comment's
# measurement lives (issue 64: the comment names the figure's record).
DOCS_POINTER = re.compile(r"(?<![\w./-])(docs/[\w./-]*\.md)(?:#([\w-]+))?")


def test_docs_pointers_in_the_code_resolve():
    sources = [*sorted((ROOT / "aiayn").rglob("*.py")), ROOT / "Makefile"]
    broken = []
    for source in sources:
        for path, anchor in DOCS_POINTER.findall(source.read_text(encoding="utf-8")):
            dest = ROOT / path
            if not dest.exists():
                broken.append(f"{rel(source)}: {path}")
            elif anchor and anchor not in anchors(dest):
                broken.append(f"{rel(source)}: {path}#{anchor} (no such heading)")
    assert not broken, f"pointers to docs that do not resolve: {broken}"


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


# --- Published figures: one results file, every page checked against it -----------------------
#
# docs/results.json holds each published figure once, with its unit, protocol, date, CPU, commit,
# command and the raw file it comes from. A page states a figure followed by its mark,
# `41.08<!-- result:en_de.bleu_lc -->` (in a TOML comment `41.08 [result:en_de.bleu_lc]`); a
# transcript in a code block is marked after the block, `<!-- results-in-block: ID ID -->`. A
# figure of someone else's (an anchor, not measured here) is marked `<!-- anchor -->`.

RESULTS_FILE = ROOT / "docs" / "results.json"
# The pages whose figures are checked: the guide, the experiments log and the config headers. The
# per-run records under docs/experiments/ are written by the scripts from the raw files.
FIGURE_PAGES = [*GUIDE, *sorted((ROOT / "configs").glob("*.toml"))]
RESULT_MARK = re.compile(r"<!--\s*result:\s*([\w.-]+)\s*-->|\[result:([\w.-]+)\]")
ANCHOR_MARK = re.compile(r"<!--\s*anchor\b[^>]*-->|\[anchor\b[^\]]*\]")
BLOCK_MARK = re.compile(r"<!--\s*results-in-block:([\w.\s-]+?)\s*-->")
# Sections that a script writes from a raw file (scripts/make_results.py, benchmarks/*.py).
GENERATED = re.compile(
    r"<!-- ?(results|make_results|engines|bench_train|bench_scaling|bench-load|serving):begin[^>]*-->"
    r".*?<!-- ?\1:end ?-->", re.S)
# Where every figure must carry a mark: a marked zone of a page, a config header's Expected line.
ZONE = re.compile(r"<!-- results-zone:begin -->(.*?)<!-- results-zone:end -->|^#[^\n]*?Expected:([^\n]*)",
                  re.S | re.M)
FIGURE_BEFORE = re.compile(r"(?<![\d.,])(\d[\d,]*(?:\.\d+)?)[%×k*\s]*$")
DECIMAL = re.compile(r"(?<![\w.,=])\d[\d,]*\.\d+(?![\d.])")
MARK_AFTER = re.compile(r"[%×k*\s]*(?:" + RESULT_MARK.pattern + "|" + ANCHOR_MARK.pattern + ")")
REDUCE = {"mean": statistics.mean, "max": max, "min": min}
FIELDS = ("figure", "decimals", "unit", "protocol", "date", "cpu", "commit", "command", "raw",
          "record")


def load_results(path: Path = RESULTS_FILE) -> dict[str, dict]:
    return json.loads(path.read_text(encoding="utf-8"))["results"]


def shown(entry: dict) -> str:
    """The figure as pages write it: rounded to the entry's decimals."""
    return f"{entry['figure']:.{entry['decimals']}f}"


def dig(data, keys: list) -> list:
    """The values at a list of keys; `*` takes every item of a list or object."""
    items = [data]
    for key in keys:
        if key == "*":
            items = [x for it in items for x in (it.values() if isinstance(it, dict) else it)]
        else:
            items = [it[key] for it in items]
    return items


def raw_value(entry: dict, root: Path = ROOT) -> float:
    """The entry's figure computed from its raw file: raw_key, reduce, per, scale."""
    data = json.loads((root / entry["raw"]).read_text(encoding="utf-8"))
    values = dig(data, entry["raw_key"])
    if "reduce" in entry:
        value = REDUCE[entry["reduce"]](values)
    else:
        (value,) = values
    per = entry.get("per")
    if per is not None:
        value /= per if isinstance(per, (int, float)) else dig(data, per)[0]
    return value * entry.get("scale", 1)


def entry_errors(rid: str, entry: dict, root: Path = ROOT) -> list[str]:
    """What is wrong with one entry of the results file: a field missing, a raw file missing, or a
    figure that is not its raw file's value (or, without one, not in the record that states it)."""
    errors = [f"{rid}: no {f}" for f in FIELDS if f not in entry]
    if errors:
        return errors
    if None in (entry["raw"], entry.get("raw_key"), entry["date"], entry["commit"]):
        if not entry.get("raw_reason"):
            errors.append(f"{rid}: raw, raw_key, date or commit is null without a raw_reason")
    if entry["raw"] is not None and not (root / entry["raw"]).is_file():
        return errors + [f"{rid}: raw file {entry['raw']} does not exist"]
    if entry["raw"] is not None and entry.get("raw_key") is not None:
        value = f"{raw_value(entry, root):.{entry['decimals']}f}"
        if value != shown(entry):
            errors.append(f"{rid}: figure {shown(entry)}, but {entry['raw']} gives {value}")
    else:  # no raw value to compare with: the record that states the figure must state this one
        record = (root / entry["record"].partition("#")[0]).read_text(encoding="utf-8")
        if not re.search(rf"(?<![\d.$]){re.escape(shown(entry))}(?![\d]|\.\d)", record):
            errors.append(f"{rid}: {shown(entry)} is not in its record {entry['record']}")
    return errors


def line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def block_before(text: str, pos: int) -> tuple[int, int] | None:
    """The span of the fenced block that ends right before pos, if one does."""
    before = text[:pos].rstrip()
    for match in FENCE.finditer(text):
        if match.end() == len(before):
            return match.span()
    return None


def mark_errors(text: str, results: dict) -> tuple[list[str], list[tuple[str, int, int]]]:
    """Each mark checked against the results file; returns the errors and the spans (id, start,
    end) of the figures the marks cover."""
    errors, covered = [], []
    for mark in RESULT_MARK.finditer(text):
        rid = mark.group(1) or mark.group(2)
        where = f"line {line_of(text, mark.start())}"
        if rid not in results:
            errors.append(f"{where}: no result {rid!r} in docs/results.json")
            continue
        figure = FIGURE_BEFORE.search(text, max(0, mark.start() - 80), mark.start())
        if figure is None:
            errors.append(f"{where}: the mark {rid} follows no figure")
        elif figure.group(1).replace(",", "") != shown(results[rid]):
            errors.append(f"{where}: {figure.group(1)} marked {rid}, whose figure is "
                          f"{shown(results[rid])} (docs/results.json)")
        else:
            covered.append((rid, figure.start(1), figure.end(1)))
    for mark in BLOCK_MARK.finditer(text):
        span = block_before(text, mark.start())
        where = f"line {line_of(text, mark.start())}"
        if span is None:
            errors.append(f"{where}: results-in-block follows no code block")
            continue
        for rid in mark.group(1).split():
            if rid not in results:
                errors.append(f"{where}: no result {rid!r} in docs/results.json")
            elif not re.search(rf"(?<![\d.]){re.escape(shown(results[rid]))}(?![\d]|\.\d)",
                               text[span[0]:span[1]]):
                errors.append(f"{where}: the block above does not show {rid} = "
                              f"{shown(results[rid])} (docs/results.json)")
            else:
                covered.append((rid, *span))
    return errors, covered


def unmarked_headlines(text: str, results: dict, covered: list[tuple[str, int, int]]) -> list[str]:
    """A headline figure written anywhere but in a marked place or a generated section."""
    generated = [m.span() for m in GENERATED.finditer(text)]
    errors = []
    for rid, entry in results.items():
        if not entry.get("headline"):
            continue
        for hit in re.finditer(rf"(?<![\d.$]){re.escape(shown(entry))}(?![\d]|\.\d)", text):
            spans = generated + [(s, e) for r, s, e in covered if r == rid]
            if not any(s <= hit.start() < e for s, e in spans):
                errors.append(f"line {line_of(text, hit.start())}: {shown(entry)} ({rid}) "
                              "without its mark <!-- result:" + rid + " -->")
    return errors


def unmarked_in_zones(text: str) -> list[str]:
    """In a results zone every decimal figure carries a result or anchor mark."""
    errors = []
    for zone in ZONE.finditer(text):
        start = zone.start(1) if zone.group(1) is not None else zone.start(2)
        body = zone.group(1) if zone.group(1) is not None else zone.group(2)
        for number in DECIMAL.finditer(body):
            if not MARK_AFTER.match(body, number.end()):
                errors.append(f"line {line_of(text, start + number.start())}: {number.group()} "
                              "in a results zone has no mark")
    return errors


def figure_errors(text: str, results: dict) -> list[str]:
    """Everything on one page (its text) that disagrees with the results file."""
    errors, covered = mark_errors(text, results)
    return errors + unmarked_headlines(text, results, covered) + unmarked_in_zones(text)


def page_errors(page: Path, results: dict) -> list[str]:
    return figure_errors(page.read_text(encoding="utf-8"), results)


def test_every_result_agrees_with_its_raw_file():
    results = load_results()
    errors = [e for rid, entry in results.items() for e in entry_errors(rid, entry)]
    assert not errors, "docs/results.json:\n" + "\n".join(errors)


@pytest.mark.parametrize("page", FIGURE_PAGES, ids=rel)
def test_published_figures_agree_with_the_results_file(page):
    errors = page_errors(page, load_results())
    assert not errors, f"{rel(page)}:\n" + "\n".join(errors)


def test_every_result_is_published_somewhere():
    text = "\n".join(p.read_text(encoding="utf-8") for p in FIGURE_PAGES)
    marked = {m.group(1) or m.group(2) for m in RESULT_MARK.finditer(text)}
    marked |= {rid for m in BLOCK_MARK.finditer(text) for rid in m.group(1).split()}
    unpublished = sorted(set(load_results()) - marked)
    assert not unpublished, f"docs/results.json entries no page states: {unpublished}"


# The checker itself, on pages made up here: each check fails on a wrong page.

FAKE = {"x.bleu": {"figure": 41.08, "decimals": 2, "headline": True},
        "x.acc": {"figure": 89.5, "decimals": 1},
        "x.rate": {"figure": 2.50, "decimals": 2}}


def test_a_marked_figure_that_is_not_the_results_file_value_fails():
    assert figure_errors("BLEU **41.08**<!-- result:x.bleu --> and 2.50×<!-- result:x.rate -->.",
                         FAKE) == []
    (error,) = figure_errors("BLEU **41.07**<!-- result:x.bleu -->", FAKE)
    assert "41.07 marked x.bleu, whose figure is 41.08" in error
    (error,) = figure_errors("accuracy 89.5%<!-- result:x.bleu -->", FAKE)  # the wrong id
    assert "89.5 marked x.bleu" in error
    assert "no result 'x.nope'" in figure_errors("1.0<!-- result:x.nope -->", FAKE)[0]
    assert "follows no figure" in figure_errors("see <!-- result:x.acc -->", FAKE)[0]
    assert figure_errors("# Expected: 89.5% [result:x.acc]", FAKE) == []
    assert "89.4 marked x.acc" in figure_errors("# Expected: 89.4% [result:x.acc]", FAKE)[0]


def test_a_headline_figure_outside_a_marked_place_fails():
    (error,) = figure_errors("Line one.\nWe got 41.08 on test2016.\n", FAKE)
    assert error.startswith("line 2: 41.08 (x.bleu) without its mark")
    # marked for another result, it is still unmarked as this one
    assert figure_errors("41.08<!-- result:x.rate -->", FAKE)[-1].endswith(
        "without its mark <!-- result:x.bleu -->")
    # 141.08 or 41.085 are other numbers; a generated section is written from the raw file
    page = ("141.08 and 41.085\n<!-- results:begin -->\n| 41.08 |\n<!-- results:end -->\n"
            "41.08<!-- result:x.bleu -->")
    assert figure_errors(page, FAKE) == []


def test_a_transcript_is_marked_after_its_block():
    block = "```text\nBLEU-lc = 41.08 69.1/44.4\n```\n"
    assert figure_errors(block + "<!-- results-in-block: x.bleu -->\n", FAKE) == []
    assert figure_errors(block, FAKE)[0].startswith("line 2: 41.08 (x.bleu) without its mark")
    wrong = block.replace("41.08", "41.80") + "<!-- results-in-block: x.bleu -->\n"
    assert "does not show x.bleu = 41.08" in figure_errors(wrong, FAKE)[0]
    assert "follows no code block" in figure_errors("text\n<!-- results-in-block: x.bleu -->",
                                                    FAKE)[0]


def test_every_figure_of_a_results_zone_carries_a_mark():
    zone = ("<!-- results-zone:begin -->\n| 41.08<!-- result:x.bleu --> | {} | α=1.4 | "
            "2021 | 36.5<!-- anchor: Wu et al. --> |\n<!-- results-zone:end -->\n99.9%")
    assert figure_errors(zone.format("89.5%<!-- result:x.acc -->"), FAKE) == []
    (error,) = figure_errors(zone.format("89.5%"), FAKE)
    assert error == "line 2: 89.5 in a results zone has no mark"
    assert figure_errors("# Expected: test2016 41.08 sacreBLEU", FAKE)[-1] == (
        "line 1: 41.08 in a results zone has no mark")


def test_an_entry_that_is_not_its_raw_files_value_fails(tmp_path):
    raw = tmp_path / "docs" / "experiments" / "run.json"
    raw.parent.mkdir(parents=True)
    raw.write_text(json.dumps({"pairs": [{"b": 41.0}, {"b": 41.17}], "n": {"s": 2.0}}))
    (tmp_path / "docs" / "log.md").write_text("the recipe scored 89.79% (22,447 / 25,000)\n")
    entry = {"figure": 41.09, "decimals": 2, "unit": "BLEU", "protocol": "p", "date": "d",
             "cpu": "c", "commit": "abc1234", "command": "x", "raw": "docs/experiments/run.json",
             "raw_key": ["pairs", "*", "b"], "reduce": "mean", "record": "docs/log.md"}
    assert entry_errors("e", entry, tmp_path) == []
    assert entry_errors("e", dict(entry, figure=41.08), tmp_path) == [
        "e: figure 41.08, but docs/experiments/run.json gives 41.09"]
    ratio = dict(entry, raw_key=["pairs", 1, "b"], per=["n", "s"], figure=20.59)
    assert entry_errors("e", dict(ratio, scale=1), tmp_path) == []
    assert "does not exist" in entry_errors("e", dict(entry, raw="docs/none.json"), tmp_path)[0]
    assert entry_errors("e", {k: v for k, v in entry.items() if k != "cpu"}, tmp_path) == [
        "e: no cpu"]
    unraw = dict(entry, raw=None, raw_key=None, figure=89.79, raw_reason="not kept")
    assert entry_errors("e", unraw, tmp_path) == []
    assert entry_errors("e", dict(unraw, figure=89.97), tmp_path) == [
        "e: 89.97 is not in its record docs/log.md"]
    assert "without a raw_reason" in entry_errors("e", dict(unraw, raw_reason=""), tmp_path)[0]


def test_a_page_or_a_results_file_that_disagree_fail(tmp_path):
    """The real pages against a results file with one figure changed, and a wrong page against the
    real results file."""
    results = load_results()
    changed = dict(results, **{"en_de.bleu_lc": dict(results["en_de.bleu_lc"], figure=41.07)})
    for page in (ROOT / "README.md", ROOT / "configs" / "multi30k_en_de.toml"):
        assert page_errors(page, results) == []
        assert any("marked en_de.bleu_lc, whose figure is 41.07" in e
                   for e in page_errors(page, changed)), page
    wrong = tmp_path / "README.md"
    wrong.write_text((ROOT / "README.md").read_text(encoding="utf-8").replace(
        "**91.93%**<!-- result:imdb.accuracy_mean -->", "**90.68%**<!-- result:imdb.accuracy_mean -->"))
    assert page_errors(wrong, results) == [
        f"line {line_of(wrong.read_text(), wrong.read_text().index('90.68'))}: 90.68 marked "
        "imdb.accuracy_mean, whose figure is 91.93 (docs/results.json)"]
    wrong.write_text("Our headline: 41.08 sacreBLEU.\n")
    assert "without its mark" in page_errors(wrong, results)[0]


# --- The code blocks a newcomer pastes first run as written --------------------------------------
#
# README.md, docs/getting-started.md and docs/model.md: every code block runs in this test, except those marked
# just before the fence with `<!-- not-run: REASON -->` (they train, download, install or need a
# server). A shell block that runs may hold only `aiayn …` commands and comments; a Python block
# runs as one program.

RUN_PAGES = [ROOT / "README.md", ROOT / "docs" / "getting-started.md", ROOT / "docs" / "model.md"]
NOT_RUN = re.compile(r"<!--\s*not-run:[^>]*-->\s*\n$")


def runnable_blocks(text: str) -> list[tuple[int, str, str]]:
    """(line, language, code) of each fenced block not marked `not-run`."""
    found = []
    for match in FENCE.finditer(text):
        lang = match.group(1).strip()
        if NOT_RUN.search(text[max(0, match.start() - 200):match.start()]):
            continue
        if lang in ("bash", "sh", "shell", "python"):
            found.append((line_of(text, match.start()), lang, match.group(2)))
    return found


def shell_commands(code: str) -> list[list[str]]:
    """The argv of each `aiayn …` line of a shell block; ValueError for any other command."""
    commands = []
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        if words[0] != "aiayn":
            raise ValueError(f"`{line.strip()}` is not an aiayn command: mark the block "
                             "<!-- not-run: why --> or run only aiayn commands in it")
        commands.append(words[1:])
    return commands


def test_the_block_finder_skips_marked_blocks():
    text = ("<!-- not-run: trains -->\n```bash\nmake demo\n```\n\n```bash\naiayn --help  # x\n```\n"
            "```text\nout\n```\n```python\nx = 1\n```\n")
    blocks = runnable_blocks(text)
    assert [(lang, code) for _, lang, code in blocks] == [("bash", "aiayn --help  # x\n"),
                                                         ("python", "x = 1\n")]
    assert shell_commands(blocks[0][2]) == [["--help"]]
    with pytest.raises(ValueError, match="not an aiayn command"):
        shell_commands("make demo\n")


@pytest.mark.parametrize("page", RUN_PAGES, ids=rel)
def test_code_blocks_that_need_no_training_run(page, tmp_path, monkeypatch):
    from aiayn.cli import main

    monkeypatch.setenv("AIAYN_CACHE", str(tmp_path / "cache"))  # nothing cached, nothing written
    monkeypatch.chdir(tmp_path)
    failures = []
    for line, lang, code in runnable_blocks(page.read_text(encoding="utf-8")):
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                if lang == "python":
                    exec(compile(code, f"{rel(page)}:{line}", "exec"), {"__name__": "__docs__"})
                    continue
                for argv in shell_commands(code):
                    try:
                        code_ = main(argv)
                    except SystemExit as exit_:  # --help
                        code_ = exit_.code or 0
                    if code_:
                        failures.append(f"line {line}: aiayn {' '.join(argv)} exited {code_}: "
                                        f"{out.getvalue()[-300:]}")
        except Exception as err:  # noqa: BLE001 - reported with the block's line
            failures.append(f"line {line}: {type(err).__name__}: {err}")
    assert not failures, f"{rel(page)}:\n" + "\n".join(failures)


# --- Every flag the guide writes is one its command accepts --------------------------------------
#
# In code (fenced blocks and inline `code`), a `--flag` belongs to the aiayn command before it on
# the same line or span (`aiayn translate … --beam 5`, or a span that starts with the command:
# `evaluate --paper-bleu`), else to the last one named earlier in the same paragraph; it must be
# one of that command's options. A flag with no command in its paragraph must be an option of
# some aiayn command. A line or span that runs another program (pip, torchrun, python, make,
# pytest, curl, sacrebleu) before any aiayn command names that program's flags, which are not checked.

FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*(?![\w])")
COMMAND = re.compile(r"\baiayn\s+([a-z][a-z0-9-]*)(?:\s+([a-z][a-z0-9-]*))?")
OTHER_PROGRAM = re.compile(r"(?:^|[\s;&|(`$])(pip|torchrun|python3?|make|pytest|curl|git|ruff|uv|sacrebleu|"
                           r"benchmarks/[\w.]+|scripts/[\w.]+)\b")


def parser_flags() -> dict[str, set[str]]:
    """Each command's option strings ("translate", "data list", …; a command with actions also
    holds theirs), and "" for the global ones."""
    import argparse

    flags: dict[str, set[str]] = {}

    def walk(parser: argparse.ArgumentParser, name: str) -> None:
        flags[name] = {s for a in parser._actions for s in a.option_strings}
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, subparser in action.choices.items():
                    walk(subparser, f"{name} {sub}".strip())
                    if name:
                        flags[name] |= flags[f"{name} {sub}"]

    walk(build_parser(), "")
    return flags


def code_pieces(text: str) -> list[tuple[int, str | None, bool]]:
    """(line, code, inline) in page order: each line of each shell block, each inline code span,
    and (line, None, False) where a paragraph ends (a blank line, a heading, a block's end)."""
    pieces: list[tuple[int, str | None, bool]] = []
    pos = 0
    for match in FENCE.finditer(text):
        pieces += prose_pieces(text, pos, match.start())
        if match.group(1).strip() in SHELL_BLOCKS:
            start = line_of(text, match.start(2))
            for i, line in enumerate(match.group(2).replace("\\\n", " ").splitlines()):
                pieces.append((start + i, line, False))
        pieces.append((line_of(text, match.end()), None, False))
        pos = match.end()
    return pieces + prose_pieces(text, pos, len(text))


def prose_pieces(text: str, start: int, end: int) -> list[tuple[int, str | None, bool]]:
    pieces: list[tuple[int, str | None, bool]] = []
    for match in re.finditer(r"^#{1,6} .*$|^\s*$|`[^`\n]+`", text[start:end], re.M):
        line = line_of(text, start + match.start())
        code = match.group()
        pieces.append((line, code.strip("`"), True) if code.startswith("`") else (line, None, False))
    return pieces


def command_named(code: str, at: int, flags: dict[str, set[str]], inline: bool) -> str | None:
    """The aiayn command named in code before position at, if any."""
    found = list(COMMAND.finditer(code, 0, at))
    words = code.split()
    if found:
        first, second = found[-1].group(1), found[-1].group(2)
    elif inline and words and words[0] in flags and words[0] != "":
        first, second = words[0], words[1] if len(words) > 1 else None
    else:
        return None
    if f"{first} {second}" in flags:
        return f"{first} {second}"
    return first if first in flags else None


def flag_errors(text: str, flags: dict[str, set[str]]) -> list[str]:
    every = set().union(*flags.values())
    errors, current = [], None
    for line, code, inline in code_pieces(text):
        if code is None:
            current = None
            continue
        command = COMMAND.search(code)
        other = OTHER_PROGRAM.search(code)
        if other and (command is None or other.start() < command.start()):
            code = code[command.start():] if command else ""
        for match in FLAG.finditer(code):
            current = command_named(code, match.start(), flags, inline) or current
            allowed = every if current is None else flags[current] | flags[""]
            if match.group() not in allowed:
                where = f"aiayn {current}" if current else "any aiayn command"
                errors.append(f"line {line}: {match.group()} is not an option of {where}")
        current = command_named(code, len(code), flags, inline) or current
    return errors


def test_the_flag_checker_finds_a_flag_of_another_command():
    flags = parser_flags()
    assert flag_errors("`aiayn translate runs/x --beam 5` and `--nbest 3`.", flags) == []
    assert flag_errors("`aiayn serve runs/x`, then `--nbest 3`.", flags) == [
        "line 1: --nbest is not an option of aiayn serve"]
    assert flag_errors("`aiayn serve runs/x`.\n\nThen `--nbest 3`.", flags) == []  # a new paragraph
    assert flag_errors("`aiayn serve m`\n## Next\n`--beam`", flags) == []  # a heading too
    assert flag_errors("`export --format onnx`, `evaluate --paper-bleu`", flags) == []
    assert flag_errors("```bash\npip install --index-url U torch\naiayn data list\n```\n", flags) == []
    assert "--no-such" in flag_errors("```bash\naiayn evaluate m --no-such 1\n```\n", flags)[0]
    assert flag_errors("Then `--no-such-flag`.", flags) == [
        "line 1: --no-such-flag is not an option of any aiayn command"]


@pytest.mark.parametrize("page", GUIDE, ids=rel)
def test_every_flag_in_the_guide_belongs_to_its_command(page):
    errors = flag_errors(page.read_text(encoding="utf-8"), parser_flags())
    assert not errors, f"{rel(page)}:\n" + "\n".join(errors)


def test_the_install_commands_match_the_makefile():
    """The README's CPU install pins the torch the Makefile installs by default, from the index
    the Makefile takes as TORCH_INDEX; `make quick`, `make demo` and `make docs` exist."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    torch_default = re.search(r"^TORCH\s*\?=\s*(\S+)", makefile, re.M).group(1)
    assert f"pip install {torch_default} --index-url https://download.pytorch.org/whl/cpu" in readme
    assert re.search(r"^TORCH_INDEX\s*\?=\s*$", makefile, re.M)  # empty by default
    # A TORCH_INDEX given is the index; else, on Linux x86-64 without nvidia-smi and with a pip
    # that has no index or local wheels configured, PyTorch's CPU index is added to PyPI.
    assert ("$(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),$(if $(and $(TORCH_CPU_INDEX),"
            "$(NO_NVIDIA),$(if $(PIP_OWN_INDEX),,yes)),--extra-index-url $(TORCH_CPU_INDEX)))"
            ) in makefile
    assert "pip config list" in re.search(r"^PIP_OWN_INDEX\s*=\s*(.+)$", makefile, re.M).group(1)
    assert re.search(r"^TORCH_CPU_INDEX\s*\?=\s*https://download.pytorch.org/whl/cpu$", makefile,
                     re.M)
    no_nvidia = re.search(r"^NO_NVIDIA\s*=\s*(.+)$", makefile, re.M).group(1)
    for part in ("$(filter Linux,$(shell uname -s))", "$(filter x86_64,$(shell uname -m))",
                 "command -v nvidia-smi"):
        assert part in no_nvidia
    for target in ("quick", "demo", "docs", "install-demo"):
        assert re.search(rf"^{target}:", makefile, re.M), target
    demo_extras = re.search(r"^DEMO\s*:=\s*(.+)$", makefile, re.M).group(1)
    assert demo_extras == "-e '.[plot]'"  # make quick and make demo need no test tools
