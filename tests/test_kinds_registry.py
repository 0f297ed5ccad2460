"""The model kinds are declared once (aiayn/kinds.py): no other module of aiayn/ spells a kind's
name, every kind's training task and model class resolve, older names still load, and loading a
model for inference imports nothing from aiayn.train."""

from __future__ import annotations

import ast
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from serve_helpers import make_folder
from trainutil import ROOT, subprocess_env

from aiayn.data.loaders import SOURCES
from aiayn.errors import CheckpointError, ConfigError
from aiayn.export import EXPORTERS
from aiayn.folder import load_model_folder
from aiayn.kinds import DATA_SOURCES, KINDS, OLD_NAMES, SETTINGS, get_kind, kind_name
from aiayn.train.task import Task, task_class

PACKAGE = ROOT / "aiayn"
NAMES = set(KINDS) | set(OLD_NAMES)
# The one word that is a kind's old name and also means something else: the ONNX classifier
# graph's key in an exported folder's config.json "files" (written since before kinds.py).
NOT_KINDS = {("aiayn/runtime/onnx_backend.py", "classifier")}


def kind_literals(root: Path = PACKAGE) -> list[str]:
    """Every string constant of aiayn/**/*.py (kinds.py aside) that is a kind's name, old or new."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path == root / "kinds.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            where = path.relative_to(root.parent).as_posix()
            if isinstance(node, ast.Constant) and node.value in NAMES:
                if (where, node.value) in NOT_KINDS:
                    continue
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}: {node.value!r}")
    return found


def test_the_literal_counter_finds_a_kind_name(tmp_path):
    pkg = tmp_path / "aiayn"
    pkg.mkdir()
    (pkg / "kinds.py").write_text('TRANSLATION = "translation"\n')
    (pkg / "folder.py").write_text('"""translation, lm"""\nif kind == "lm":\n    x = f"{kind}"\n')
    assert kind_literals(pkg) == ["aiayn/folder.py:2: 'lm'"]


def test_no_module_but_kinds_spells_a_kind_name():
    assert kind_literals() == []


@pytest.mark.parametrize("name", sorted(KINDS))
def test_every_kind_resolves_its_task_and_model(name):
    kind = get_kind(name)
    cls = task_class(name)
    assert issubclass(cls, Task) and cls.kind == name
    assert kind.task.startswith("aiayn.train.") and kind.model_class.__module__.startswith(
        "aiayn.model"
    )
    assert set(kind.routes) <= {"translate", "attention", "classify", "generate"}
    assert set(kind.exporters) <= set(EXPORTERS)  # each names a real --format


@pytest.mark.parametrize("name", sorted(KINDS))
def test_every_kind_declares_a_data_source_settings_and_writers_that_resolve(name):
    kind = get_kind(name)
    assert SOURCES[kind.reads].name == kind.reads  # the loaders read what it names
    assert kind.takes <= set(SETTINGS)
    for fmt in kind.exporters:
        assert callable(kind.exporter(fmt))
    for fmt in kind.engines:
        assert isinstance(kind.engine(fmt), type) and fmt in kind.exporters
    assert set(SOURCES) == set(DATA_SOURCES)


def test_a_kind_names_a_known_data_source_and_known_settings():
    translation = KINDS["translation"]
    with pytest.raises(ConfigError, match="no data source 'images'"):
        dataclasses.replace(translation, name="x", reads="images")
    with pytest.raises(ConfigError, match=r"unknown settings \['beam_width'\]"):
        dataclasses.replace(translation, name="x", takes=frozenset({"beam_width"}))
    with pytest.raises(ConfigError, match="--format onnx exports .*; this one is 'masked_lm'"):
        KINDS["masked_lm"].exporter("onnx")


def test_old_names_map_and_unknown_names_are_refused():
    assert kind_name("seq2seq") == "translation" and kind_name("classifier") == "classification"
    assert get_kind("seq2seq") is KINDS["translation"]
    with pytest.raises(ConfigError, match="unknown model kind 'bert'.*translation"):
        get_kind("bert")


@pytest.mark.parametrize("old, new", sorted(OLD_NAMES.items()))
def test_a_folder_with_an_old_kind_name_loads_under_the_new_one(tmp_path, old, new):
    folder = make_folder(tmp_path / "m", kind=old)
    assert json.loads((folder / "config.json").read_text())["kind"] == old
    loaded = load_model_folder(folder, expect_kind=old)
    assert loaded.kind == new
    assert load_model_folder(folder, expect_kind=new).kind == new


def test_an_unknown_kind_in_config_json_is_one_clear_error(tmp_path):
    folder = make_folder(tmp_path / "m")
    meta = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**meta, "kind": "bert"}))
    with pytest.raises(CheckpointError, match="unknown model kind 'bert'"):
        load_model_folder(folder)


LOAD_AND_TRANSLATE = """
import sys, aiayn
model = aiayn.load(sys.argv[1])
print(model.translate(["the cat"])[0] is not None)
loaded = sorted(m for m in sys.modules if m == "aiayn.train" or m.startswith("aiayn.train."))
print("train modules:", loaded)
"""


def test_loading_and_translating_imports_nothing_from_train(tmp_path):
    folder = make_folder(tmp_path / "m")
    done = subprocess.run(
        [sys.executable, "-c", LOAD_AND_TRANSLATE, str(folder)],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["True", "train modules: []"]
