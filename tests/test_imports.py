"""The package is acyclic: no module of aiayn/ imports, directly or through others, itself.

Every ``import`` statement counts, at module level or inside a function (a function-level import
only hides a cycle until that function runs). Two kinds of edge are left out, on purpose:

- imports under ``if TYPE_CHECKING:``, which never run;
- the import of a module's own parent package: ``from aiayn.train.task import Task`` is an edge to
  ``aiayn.train.task``, not to ``aiayn/train/__init__.py``, and ``from aiayn.export import
  require`` inside ``aiayn.export.onnx`` is no edge at all: Python runs a package's ``__init__``
  before any of its modules anyway, so such an edge orders nothing. Counting it would make every
  package that re-exports its own modules a cycle.

``from aiayn.train import classification`` is an edge to the module ``aiayn.train.classification``;
``from aiayn.train import SHAPES`` one to ``aiayn.train`` (its ``__init__``).

Before issue #32 this found aiayn.train.tasks -> aiayn.train.classification -> aiayn.train.tasks
(and the same through lm and mlm).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "aiayn"


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of ``tree`` outside ``if TYPE_CHECKING:`` blocks."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the aiayn modules it imports (see the module docstring for what counts)."""
    files = {module_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names
                ]
            ancestors = {name.rsplit(".", n)[0] for n in range(1, name.count(".") + 1)}
            graph[name] |= {t for t in targets if t in files and t != name and t not in ancestors}
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def strongconnect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return cycles


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import(tmp_path):
    pkg = tmp_path / "aiayn"
    (pkg / "train").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "train" / "__init__.py").write_text("")
    (pkg / "train" / "tasks.py").write_text("from aiayn.train.classification import X\n")
    (pkg / "train" / "classification.py").write_text(
        "def f():\n    from .tasks import Task\n"
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from aiayn import train\n"
    )
    graph = import_graph(pkg)
    assert graph["aiayn.train.classification"] == {"aiayn.train.tasks"}
    assert find_cycles(graph) == [["aiayn.train.classification", "aiayn.train.tasks"]]


def test_aiayn_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 50 and graph["aiayn.cli"]
    assert find_cycles(graph) == []


def test_no_private_name_is_imported_from_another_module():
    """A ``_name`` is private to its module: one that another module needs is made public."""
    found = []
    for path in ROOT.rglob("*.py"):
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("aiayn"):
                found += [f"{path.name}: {node.module}.{a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    assert found == []
