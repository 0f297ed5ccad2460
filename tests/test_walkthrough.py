"""docs/walkthrough.md stays true: every file, function, test and figure it names exists, and the
model sizes it quotes are those the code builds today."""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "walkthrough.md"
NUMBERS = ROOT / "docs" / "figures" / "numbers.json"
REFERENCE = re.compile(r"`((?:aiayn|tests|docs)/[\w/]+\.py)(?:::([\w.]+))?`")
FIGURE = re.compile(r"\((figures/[\w.-]+\.png)\)")


def defined_names(path: Path) -> set[str]:
    """Top-level functions and classes of a Python file, and Class.method for their methods."""
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names.update(f"{node.name}.{item.name}" for item in node.body
                         if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return names


def test_every_code_and_test_reference_exists():
    text = DOC.read_text(encoding="utf-8")
    refs = REFERENCE.findall(text)
    assert len(refs) > 30  # the map names code and tests for every section
    missing = []
    for file, name in refs:
        path = ROOT / file
        if not path.is_file():
            missing.append(file)
        elif name and name not in defined_names(path):
            missing.append(f"{file}::{name}")
    assert not missing, f"walkthrough names what does not exist: {missing}"


def test_every_section_of_the_issue_has_a_row():
    rows = [line for line in DOC.read_text(encoding="utf-8").splitlines() if line.startswith("| ")]
    sections = {row.split("|")[1].strip() for row in rows}
    assert {"3.1", "3.2.1", "3.2.2", "3.2.3", "3.3", "3.4", "3.5", "5.3", "5.4"} <= sections


def test_every_figure_exists():
    figures = set(FIGURE.findall(DOC.read_text(encoding="utf-8")))
    assert {"figures/pe.png", "figures/pe-similarity.png", "figures/lr-schedule.png",
            "figures/curves.png", "figures/attention-last-layer.png"} <= figures
    for figure in figures:
        path = DOC.parent / figure
        assert path.is_file() and path.stat().st_size > 1000, figure


def test_quoted_model_sizes_are_what_the_code_builds(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    make_figures = pytest.importorskip("make_figures")
    sizes = make_figures.model_sizes()
    assert json.loads(NUMBERS.read_text())["model_sizes"] == sizes
    text = DOC.read_text(encoding="utf-8")
    base = sizes["base"]
    for key in ("parameters", "parameters_without_sharing", "encoder_layer_parameters",
                "decoder_layer_parameters", "ffn_parameters_per_layer",
                "attention_parameters_per_sublayer"):
        assert f"{base[key]:,}" in text, key
    sys.modules.pop("make_figures", None)


def test_quoted_run_numbers_are_those_of_the_run():
    run = json.loads(NUMBERS.read_text())["run"]
    text = DOC.read_text(encoding="utf-8")
    assert f"{run['parameters']:,} parameters" in text
    assert f"{run['steps']} updates" in text
    assert f"{run['best_valid_loss']:.3f} at update {run['best_valid_step']}" in text
    assert f"perplexity {run['best_valid_ppl']:.1f}" in text
    assert f"{run['first_loss']:.2f} → {run['last_loss']:.2f}" in text
    bleu = json.loads(NUMBERS.read_text())["test_bleu"]
    assert f"BLEU {bleu['bleu']:.2f} on Multi30k test 2016" in text
    assert f"| {bleu['bleu']:.2f} (chrF {bleu['chrf']:.1f})" in text
