"""The package is acyclic, each module imports on its own, and imports sit at module level.

**No import loop** (issue #32; issue #42, point 3; issue #64, point 2). No module of aiayn/
imports, directly or through others, itself. Every ``import`` statement counts, at module level,
inside a function (a function-level import only hides a cycle until that function runs) or under
``if TYPE_CHECKING:`` (such an import never runs, but a module whose types need a module above it
is a loop in the design all the same: before issue #64, aiayn.folder_score took ModelFolder from
aiayn.folder that way while aiayn.folder imported it). Package ``__init__`` files count like any
module:

- ``from aiayn.train import classification`` is an edge to the module
  ``aiayn.train.classification``; ``from aiayn.train import Task`` one to ``aiayn.train`` (its
  ``__init__``), even from a module inside ``aiayn.train``: a module that takes a name from its own
  package's ``__init__`` while that ``__init__`` imports it back sees a half-run ``__init__``, the
  loop that only shows when the module is imported first.
- The implicit step "importing ``aiayn.a.b`` runs ``aiayn/a/__init__.py`` first" is no edge: a
  package's ``__init__`` importing its own modules is how packages work, and is safe as long as
  none of them takes a name back from it (the edge above).

Before issue #32 this found aiayn.train.tasks -> aiayn.train.classification -> aiayn.train.tasks
(and the same through lm and mlm).

**Each module imports alone.** With the graph acyclic in that sense, any module imported first,
in any order, finds each module it takes a name from fully run. That is checked for real too,
by one interpreter that imports every module of aiayn in a random order (the seed is in the
failure message). Not one interpreter per module: with bytecode writing off on this machine each
module's import chain costs ~0.2 s even in a child forked after torch is loaded (99 modules: ~20
s on the shared 2-core machine, 2026-11-26), while the graph check proves the same thing in
milliseconds and the random order checks the graph against Python's own import.

**Imports inside functions** stay for optional dependencies (the extras of pyproject.toml) and
the CLI's lazy loading (aiayn/cli.py, aiayn/commands/), plus the few in :data:`LAZY_IMPORTS`,
each with its reason. ``importlib.import_module`` inside a function counts as an import.
"""

from __future__ import annotations

import ast
import json
import random
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from trainutil import subprocess_env

ROOT = Path(__file__).resolve().parent.parent / "aiayn"
PYPROJECT = ROOT.parent / "pyproject.toml"


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


def _imports(tree: ast.AST, typing: bool = False) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of ``tree``; those under ``if TYPE_CHECKING:`` only if ``typing``."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node) and not typing:
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
        for node in _imports(ast.parse(path.read_text(encoding="utf-8")), typing=True):
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
            graph[name] |= {t for t in targets if t in files and t != name}
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
    assert graph["aiayn.train.classification"] == {"aiayn.train.tasks", "aiayn.train"}
    assert find_cycles(graph) == [["aiayn.train.classification", "aiayn.train.tasks"]]


def test_the_cycle_finder_finds_a_cycle_through_type_checking(tmp_path):
    """What aiayn.folder and aiayn.folder_score were before issue #64: the loader imports the
    scorer, the scorer takes the loader's class for its annotations only."""
    pkg = tmp_path / "aiayn"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "folder.py").write_text("from aiayn.folder_score import score\n")
    (pkg / "folder_score.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:  # pragma: no cover\n    from aiayn.folder import ModelFolder\n"
    )
    assert find_cycles(import_graph(pkg)) == [["aiayn.folder", "aiayn.folder_score"]]


def test_aiayn_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 50 and graph["aiayn.cli"]
    assert find_cycles(graph) == []


# The layers, bottom-up (../shared/LAYOUT.md): a module imports only modules of its own layer or of
# those below it. A new top-level module or package of aiayn/ gets its place here.
LAYERS: list[tuple[str, ...]] = [
    ("errors",),
    ("config", "io", "env", "engines", "threads", "memory", "eval", "checks", "checksum", "progress"),
    ("model",),
    ("kinds",),
    ("data",),
    ("decode",),
    ("run_config",),
    ("runtime",),
    ("folder",),
    ("aiayn", "viz"),
    ("card",),
    ("interop",),
    ("export", "train", "serve"),
    ("commands",),
    ("cli",),
    ("__main__",),
]
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}
# The longest chain of imports between aiayn modules (issue #58: no longer than on 2026-11-29,
# commands.serve -> serve -> ... -> model.packed, 19 edges).
LONGEST_CHAIN = 19


def layer_of(module: str) -> str:
    """aiayn.data.store -> data; aiayn -> aiayn (the package's __init__)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "aiayn"


def longest_chain(graph: dict[str, set[str]]) -> list[str]:
    """The longest path of imports in the (acyclic) graph, as the modules along it."""
    memo: dict[str, list[str]] = {}

    def walk(v: str) -> list[str]:
        if v not in memo:
            memo[v] = [v, *max((walk(w) for w in sorted(graph[v])), key=len, default=[])]
        return memo[v]

    return max((walk(v) for v in sorted(graph)), key=len)


def test_every_import_goes_down_the_layers():
    graph = import_graph()
    unplaced = sorted({layer_of(m) for m in graph} - set(RANK))
    assert not unplaced, f"place {unplaced} in LAYERS"
    upward = [
        f"{a} -> {b}"
        for a, targets in sorted(graph.items())
        for b in sorted(targets)
        if RANK[layer_of(b)] > RANK[layer_of(a)]
    ]
    assert upward == []


def test_the_longest_import_chain_is_no_longer_than_before():
    chain = longest_chain(import_graph())
    assert len(chain) - 1 <= LONGEST_CHAIN, " -> ".join(chain)


def test_no_private_name_is_imported_from_another_module():
    """A ``_name`` is private to its module: one that another module needs is made public."""
    found = []
    for path in ROOT.rglob("*.py"):
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("aiayn"):
                found += [f"{path.name}: {node.module}.{a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    assert found == []


def test_the_cycle_finder_finds_a_loop_through_a_package_init(tmp_path):
    """``from aiayn.data import load`` inside aiayn.data.store, while aiayn/data/__init__.py
    imports the store: importing aiayn.data.store first fails (its package's ``__init__`` is
    half-run), a loop the finder must see."""
    pkg = tmp_path / "aiayn"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "data" / "__init__.py").write_text("from aiayn.data.store import Store\nload = 1\n")
    (pkg / "data" / "store.py").write_text("from aiayn.data import load\nStore = load\n")
    (pkg / "data" / "readers.py").write_text("from aiayn import data\n")
    graph = import_graph(pkg)
    assert graph["aiayn.data.readers"] == {"aiayn.data"}
    assert find_cycles(graph) == [["aiayn.data", "aiayn.data.store"]]


# An interpreter of its own: every module of aiayn (argv[1:], in that order), each imported once;
# one JSON line {module: the error's last line} of those that failed.
IMPORT_ALL = """
import importlib, json, sys, traceback
assert not [m for m in sys.modules if m.split(".")[0] == "aiayn"]
failed = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception:
        failed[name] = traceback.format_exc().strip().splitlines()[-1]
print(json.dumps(failed))
"""


def optional_dependencies() -> set[str]:
    """The top-level modules of pyproject.toml's extras that are not core dependencies."""

    def names(requirements: list[str]) -> set[str]:
        return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower().replace("-", "_")
                for r in requirements}

    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    extras = set().union(*map(names, project["optional-dependencies"].values()))
    return extras - names(project["dependencies"])


def test_every_module_imports_in_a_random_order_in_one_interpreter():
    modules = sorted(m for m in import_graph() if m != "aiayn.__main__")  # that one runs the CLI
    seed = random.randrange(2**32)
    random.Random(seed).shuffle(modules)
    done = subprocess.run([sys.executable, "-c", IMPORT_ALL, *modules], cwd=ROOT.parent,
                          env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    failed = json.loads(done.stdout.splitlines()[-1])
    # Only a module that needs an extra not installed here may fail, and only for that reason.
    missing = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")
    real = {m: e for m, e in failed.items()
            if not ((found := missing.match(e)) and found[1].split(".")[0] in OPTIONAL)}
    assert real == {}, f"random order with seed {seed}: {real}"


# ---- imports inside functions (issue #42, point 3) ----

OPTIONAL = optional_dependencies()

# (file under aiayn/, the module it imports inside a function) -> why it is not at module level.
LAZY_IMPORTS: dict[tuple[str, str], str] = {
    ("checks.py", "torch"):
        "check_device: the checks of numbers import without torch (`aiayn --help`, issue 66); "
        "only a device name needs it",
    ("__init__.py", "aiayn.folder"):
        "aiayn.load (PEP 562): the package's __init__ runs before every aiayn module, the CLI's "
        "included; importing the model folder from it would pull the data, decoding and runtime "
        "layers into `import aiayn.errors`, and run them while aiayn is half-initialised",
    ("__init__.py", "aiayn.model"):
        "aiayn.Transformer (PEP 562): every `aiayn ...` command line runs the package's __init__ "
        "first; importing torch there cost `aiayn --help` and `--version` 3-4 s (issue 66)",
    ("runtime/compiled.py", "torch._inductor"):
        "AOTInductor compiles the decoder step only on its first use per model and CPU "
        "(decode.compile); importing inductor costs ~1.5 s, which every inference command would "
        "pay at start-up (the package is then loaded through torch._C, without it)",
    ("serve/__init__.py", "aiayn.serve.app"):
        "aiayn.serve.app is the FastAPI app (the 'serve' extra); aiayn.serve's limits and "
        "batcher import without it",
    ("kinds.py", "importlib.import_module"):
        "a kind's training task, its format writers and its ONNX engine, by dotted path: loading "
        "a model for inference imports nothing from aiayn.train (tests/test_kinds_registry.py), "
        "and kinds.py, below those layers, never imports them",
    ("data/tokenizer.py", "importlib.import_module"):
        "a tokenizer.json of another module's type (TOKENIZER_TYPES: SentencePiece, in "
        "aiayn.data.spm, which itself builds on aiayn.data.tokenizer), looked up by name",
    ("decode/__init__.py", "importlib.import_module"):
        "aiayn.decode's names, each from its module on first use (PEP 562): the decoding settings "
        "(aiayn.decode.config), whose defaults `aiayn translate --help` shows, import without "
        "the search, the data pipeline and torch",
    ("errors.py", "importlib.import_module"):
        "require(module, extra, purpose): an optional dependency, named by the caller",
}


def _dynamic_import(node: ast.AST) -> bool:
    """``importlib.import_module(…)`` or ``__import__(…)``."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    return (isinstance(f, ast.Attribute) and f.attr == "import_module") or (
        isinstance(f, ast.Name) and f.id in ("__import__", "import_module"))


def function_level_imports(root: Path = ROOT) -> list[tuple[str, int, str]]:
    """(file under ``root``, line, module) of each import that runs inside a function: the
    module is absolute (relative imports resolved), ``importlib.import_module`` for a dynamic
    one. Imports under ``if TYPE_CHECKING:`` never run and are left out."""
    found: list[tuple[str, int, str]] = []
    for path in sorted(root.rglob("*.py")):
        name, file = module_name(path, root), path.relative_to(root).as_posix()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
        nodes = {id(n): n for f in functions for n in _imports(f)}
        nodes |= {id(n): n for f in functions for n in ast.walk(f) if _dynamic_import(n)}
        for node in sorted(nodes.values(), key=lambda n: n.lineno):
            if isinstance(node, ast.Call):
                modules = ["importlib.import_module"]
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            else:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                modules = [".".join(anchor + [node.module or ""]).strip(".") if node.level
                           else node.module or ""]
            found += [(file, node.lineno, m) for m in modules]
    return found


def _allowed(file: str, module: str) -> bool:
    cli = file == "cli.py" or file.startswith("commands/")
    return cli or module.split(".")[0] in OPTIONAL or (file, module) in LAZY_IMPORTS


def test_the_function_level_import_finder(tmp_path):
    pkg = tmp_path / "aiayn"
    (pkg / "data").mkdir(parents=True)
    (pkg / "data" / "store.py").write_text(
        "import json\nfrom typing import TYPE_CHECKING\n"
        "def f():\n    from .readers import read\n    if TYPE_CHECKING:\n        import torch\n"
        "class A:\n    def g(self):\n        import numpy, importlib\n"
        "        return importlib.import_module('x'), (lambda: __import__('y'))\n"
    )
    assert function_level_imports(pkg) == [
        ("data/store.py", 4, "aiayn.data.readers"),
        ("data/store.py", 9, "numpy"),
        ("data/store.py", 9, "importlib"),
        ("data/store.py", 10, "importlib.import_module"),
        ("data/store.py", 10, "importlib.import_module"),
    ]
    assert {"matplotlib", "fastapi", "onnxruntime", "ctranslate2", "sacremoses"} <= OPTIONAL
    assert not {"torch", "numpy", "tqdm", "sacrebleu"} & OPTIONAL


def test_imports_inside_functions_are_only_optional_dependencies_and_the_cli():
    found = function_level_imports()
    assert len(found) > 20  # the CLI's lazy loading is there: the finder sees them
    assert [f"{file}:{line}: {module}" for file, line, module in found
            if not _allowed(file, module)] == []
    used = {(file, module) for file, _, module in found}
    assert sorted(set(LAZY_IMPORTS) - used) == []  # no stale excuse
