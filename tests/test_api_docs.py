"""The API reference builds: pdoc renders aiayn and its modules from their docstrings
(scripts/api_docs.py, `make docs`) without an import error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_pdoc_renders_the_api_reference(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "scripts/api_docs.py", "--out", str(tmp_path)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    pages = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.html")}
    assert {"index.html", "aiayn.html", "aiayn/folder.html", "aiayn/config.html"} <= pages
    assert "load_model_folder" in (tmp_path / "aiayn" / "folder.html").read_text(encoding="utf-8")
