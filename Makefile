# aiayn — two commands: `make demo` (the main job) and `make test`.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
TORCH   := torch==2.13.0
# Where datasets are read from when no download is possible: a folder (or URL) laid out as NAME/FILE.
AIAYN_DATA_MIRROR ?= $(if $(wildcard ../shared/data/MANIFEST.sha256),$(abspath ../shared/data),)
export AIAYN_DATA_MIRROR

.PHONY: install demo test test-slow bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

# torch first, pinned, so that pip never resolves a bare `torch` (several GB of CUDA wheels).
$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q --disable-pip-version-check $(TORCH)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[test,plot]'
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/python -m aiayn.demo

test: install
	$(BIN)/python -m pytest -q

test-slow: install
	$(BIN)/python -m pytest -q -m slow

# Decoding speed against Hugging Face generate and CTranslate2 -> docs/decoding.json, .table.md
bench: install
	$(BIN)/pip install -q --disable-pip-version-check -e '.[bench]'
	$(BIN)/python benchmarks/bench_decode.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
