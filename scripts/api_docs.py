"""The API reference: HTML pages written by pdoc from the docstrings of aiayn and each of its
modules (`make docs` -> build/api/index.html; tests/test_api_docs.py builds it in `make test`).

    python scripts/api_docs.py [--out build/api]
"""

from __future__ import annotations

import argparse
import pkgutil
from pathlib import Path

import pdoc

import aiayn


def modules() -> list[str]:
    """aiayn and its top-level modules and packages (a package's page lists what its
    ``__all__`` exports); ``aiayn.__main__`` runs the CLI on import, so it is left out."""
    names = [m.name for m in pkgutil.iter_modules(aiayn.__path__, "aiayn.")]
    return ["aiayn", *sorted(n for n in names if n != "aiayn.__main__")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="build/api", help="output folder (default: build/api)")
    args = parser.parse_args()
    pdoc.render.configure(docformat="restructuredtext", footer_text="aiayn")
    pdoc.pdoc(*modules(), output_directory=Path(args.out))
    print(f"API reference: {Path(args.out) / 'index.html'}")


if __name__ == "__main__":
    main()
