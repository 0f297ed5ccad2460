"""Every test has a kind (unit, process, serve, browser; tests/conftest.py): a new test file cannot
go unmarked, the kinds are registered markers, and a unit test that starts a process fails."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from conftest import KINDS, MODULE_KINDS, TEST_KINDS
from trainutil import ROOT, subprocess_env

TESTS = Path(__file__).resolve().parent


def test_every_test_module_has_kinds_and_every_listed_test_exists():
    modules = {p.stem for p in TESTS.glob("test_*.py")}
    assert sorted(modules - MODULE_KINDS.keys()) == [], "add these modules to MODULE_KINDS"
    assert sorted(MODULE_KINDS.keys() - modules) == [], "these modules are gone"
    for key, kinds in [*MODULE_KINDS.items(), *TEST_KINDS.items()]:
        assert kinds and set(kinds) <= set(KINDS), (key, kinds)
    for key in TEST_KINDS:
        module, name = key.split("::")
        source = (TESTS / f"{module}.py").read_text(encoding="utf-8")
        assert re.search(rf"^def {name}\(", source, re.M), f"{key}: no such test"


def test_the_kinds_are_registered_markers():
    pytest_options = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
        "pytest"]["ini_options"]
    registered = {line.split(":")[0] for line in pytest_options["markers"]}
    assert set(KINDS) <= registered


def _pytest_in(folder: Path, test_file: str, *args: str) -> subprocess.CompletedProcess:
    """pytest over one test file, in ``folder`` beside copies of the conftest and its helpers."""
    for name in ("conftest.py", "trainutil.py"):
        shutil.copy(TESTS / name, folder / name)
    (folder / "test_new.py").write_text(test_file, encoding="utf-8")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "test_new.py", *args], cwd=folder, env=subprocess_env(), capture_output=True,
                          text=True, timeout=120)


def test_a_test_without_a_kind_stops_the_run(tmp_path):
    proc = _pytest_in(tmp_path, "def test_anything():\n    pass\n")
    assert proc.returncode == 4, proc.stdout + proc.stderr  # a usage error: nothing ran
    expected = ("tests without a kind (unit, process, serve, browser): 1, "
                "e.g. test_new.py::test_anything")
    assert expected in proc.stderr, proc.stderr


def test_a_unit_test_that_starts_a_process_fails(tmp_path):
    """... and ``-m unit`` leaves slow tests out, as the default ``-m 'not slow'`` does."""
    proc = _pytest_in(tmp_path, (
        "import subprocess, sys\n"
        "import pytest\n"
        "pytestmark = pytest.mark.unit\n"
        "def test_spawns():\n"
        "    subprocess.run([sys.executable, '-c', 'pass'], check=True)\n"
        "def test_stays_in():\n"
        "    assert sum(range(4)) == 6\n"
        "@pytest.mark.slow\n"
        "def test_slow():\n"
        "    assert False\n"), "-m", "unit")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 failed, 1 passed, 1 deselected" in proc.stdout
    assert "test_new.py::test_spawns is marked unit but started a process" in proc.stdout
