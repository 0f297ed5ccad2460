# aiayn — `make quick` (a model in 3 minutes), `make demo` (the main job), `make test`, `make docs`.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
# The torch build: TORCH is the pip requirement, TORCH_INDEX the index it comes from, when set.
#   CPU only (no CUDA wheels):  make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu
#   CUDA 12.8:                  make demo TORCH_INDEX=https://download.pytorch.org/whl/cu128
# Without TORCH_INDEX, on Linux x86-64 with no NVIDIA GPU (no nvidia-smi) and a pip that has no
# index or local wheels of its own configured (`pip config list`: such a pip is left to them),
# pip also looks in TORCH_CPU_INDEX, whose CPU build (2.13.0+cpu) outranks PyPI's CUDA one with
# its several GB of nvidia-* wheels. An extra index, not --index-url: PyPI still gives torch's
# dependencies. TORCH_CPU_INDEX= turns it off.
TORCH   ?= torch==2.13.0
TORCH_INDEX ?=
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
NO_NVIDIA = $(and $(filter Linux,$(shell uname -s)),$(filter x86_64,$(shell uname -m)),$(if $(shell command -v nvidia-smi 2>/dev/null),,yes))
PIP_OWN_INDEX = $(shell $(PY) -m pip config list 2>/dev/null | grep -E 'index-url|find-links')
# Where datasets are read from when no download is possible: a folder (or URL) laid out as NAME/FILE.
AIAYN_DATA_MIRROR ?= $(if $(wildcard ../shared/data/MANIFEST.sha256),$(abspath ../shared/data),)
export AIAYN_DATA_MIRROR

.PHONY: install install-demo quick demo docs lint test test-slow smoke bench bench-decode bench-engines bench-sweep bench-train \
	bench-convergence bench-scaling gpu-check gpu-check-dry gpu-data clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

# torch first, pinned, by pip (which finds the machine's local wheel), so that nothing resolves a
# bare `torch` (several GB of CUDA wheels); then the rest by uv, which keeps that torch and takes
# a fraction of pip's CPU time (docs/experiments/code_notes.md#make-install-uv-against-pip), or by
# pip where uv can't be had.
# Neither compiles bytecode ahead: the first import writes it, for the modules used (see test).
PIP     := $(BIN)/pip install -q --disable-pip-version-check --no-compile
INSTALL  = $(BIN)/uv pip install -q --python $(BIN)/python $(1) || $(PIP) $(1)
DEV      := -e '.[test,plot,serve,export,ctranslate2]'
# What `make quick` and `make demo` need: aiayn and its core dependencies, matplotlib for the plots.
DEMO     := -e '.[plot]'
TORCH_PIP = $(PIP) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),$(if $(and $(TORCH_CPU_INDEX),$(NO_NVIDIA),$(if $(PIP_OWN_INDEX),,yes)),--extra-index-url $(TORCH_CPU_INDEX))) '$(TORCH)'
$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(TORCH_PIP)
	-$(PIP) uv
	$(call INSTALL,$(DEV))
	touch $@ $(VENV)/.installed-demo

$(VENV)/.installed-demo: $(BIN)/python pyproject.toml
	$(TORCH_PIP)
	-$(PIP) uv
	$(call INSTALL,$(DEMO))
	touch $@

install: $(VENV)/.installed
install-demo: $(VENV)/.installed-demo

# A first model of your own in 3 minutes (configs/multi30k_quick.toml), then two translations.
QUICK_RUN ?= runs/quick
quick: install-demo
	@if [ ! -f $(QUICK_RUN)/model.safetensors ]; then \
	  $(BIN)/aiayn train configs/multi30k_quick.toml --out $(QUICK_RUN); fi
	printf '%s\n' "A man in a blue shirt is riding a bike down the street." \
	  "A dog is running through the snow." | $(BIN)/aiayn translate $(QUICK_RUN)

# The API reference from the docstrings (pdoc) -> build/api/index.html
docs: install
	$(BIN)/python scripts/api_docs.py --out build/api

# The main job: two Transformer-tiny models on Multi30k En->De, trained side by side for 15
# minutes, each on half the cores (the headline recipe's way, in a quarter of its time); each
# one's last 5 checkpoints averaged; a few translations and test2016 BLEU of the two as an
# ensemble. An interrupted training resumes, not restarts; a model whose avg5 exists is kept.
# Model 1 prints its progress, model 2 logs to $(DEMO_RUN)/m2.log.
DEMO_RUN ?= runs/demo
DEMO_MODELS = $(DEMO_RUN)/m1/avg5 $(DEMO_RUN)/m2/avg5
demo: install-demo
	@threads=$$(( $$(nproc) / 2 )); [ $$threads -ge 1 ] || threads=1; pids=; \
	for seed in 1 2; do \
	  run=$(DEMO_RUN)/m$$seed; log=/dev/stdout; \
	  [ -f $$run/avg5/model.safetensors ] && continue; \
	  if [ -f $$run/trainer_state.pt ]; then args="--resume --out $$run"; \
	  else args="configs/multi30k_demo.toml --out $$run --set train.seed=$$seed"; fi; \
	  [ $$seed = 1 ] || { mkdir -p $(DEMO_RUN); log=$(DEMO_RUN)/m2.log; }; \
	  OMP_NUM_THREADS=$$threads $(BIN)/aiayn train $$args >>$$log 2>&1 & pids="$$pids $$!"; \
	done; \
	trap 'kill $$pids 2>/dev/null; exit 130' INT TERM; \
	while [ -n "$$pids" ]; do left=; \
	  for pid in $$pids; do \
	    if kill -0 $$pid 2>/dev/null; then left="$$left $$pid"; elif ! wait $$pid; then \
	      kill $$pids 2>/dev/null; \
	      echo "make demo: a training failed (model 2 logs to $(DEMO_RUN)/m2.log)" >&2; exit 1; fi; \
	  done; pids=$$left; [ -z "$$pids" ] || sleep 1; \
	done; \
	for seed in 1 2; do run=$(DEMO_RUN)/m$$seed; [ -f $$run/avg5/model.safetensors ] || \
	  $(BIN)/aiayn average $$run --last 5 -o $$run/avg5 || exit 1; done
	printf '%s\n' "A man in a blue shirt is riding a bike down the street." \
	  "Two young girls are playing soccer in a park." \
	  "A dog is running through the snow." \
	  | $(BIN)/aiayn translate $(DEMO_MODELS)
	$(BIN)/aiayn evaluate $(DEMO_MODELS) --split test_2016_flickr

# Lint, format and types of aiayn/ (settings in pyproject.toml), then the tests.
lint: install
	$(BIN)/ruff check aiayn
	$(BIN)/ruff format --check aiayn
	$(BIN)/mypy

# The tests on every core (pytest-xdist; TEST_WORKERS=0 runs them in this one process). loadgroup:
# a module's tests run on one worker, the longest modules first (tests/conftest.py).
TEST_WORKERS ?= auto
# Bytecode is written (PYTHONDONTWRITEBYTECODE cleared): the suite starts Python processes by the
# dozen, and each would otherwise compile aiayn and the packages it imports again.
test: lint
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

test-slow: install
	$(BIN)/python -m pytest -q -m slow

# Every benchmark and script at tiny sizes, each code path once, outputs in temporary folders (part
# of `make test`; tests/test_scripts_smoke.py, and gpu_check's whole dry run).
smoke: install
	$(BIN)/python -m pytest -q tests/test_scripts_smoke.py tests/test_gpu_check.py

# The benchmarks: decoding, training, same convergence as nn.Transformer, then cost vs length and
# batch (minutes each: docs/experiments/code_notes.md#make-bench-how-long-each-part-takes).
bench: bench-decode bench-train bench-convergence bench-scaling

$(VENV)/.bench: $(VENV)/.installed
	$(call INSTALL,-e '.[bench]')
	touch $@

# Decoding speed against Hugging Face generate and CTranslate2 -> docs/experiments/decoding.json, .table.md
bench-decode: $(VENV)/.bench
	$(BIN)/python benchmarks/bench_decode.py

# One trained model run by native PyTorch fp32 / bf16, ONNX Runtime and CTranslate2 float32 / int8:
# sentences/s, BLEU, peak RSS, size on disk -> docs/experiments/engines.json and the table in docs/experiments/engines.md.
# Needs a trained model folder (default: the demo's, `make demo`). ENGINES_ARGS="--limit 200" etc.
ENGINES_MODEL ?= $(DEMO_RUN)/m1/avg5
bench-engines: $(VENV)/.installed
	$(BIN)/python benchmarks/bench_engines.py --model $(ENGINES_MODEL) $(ENGINES_ARGS)

# Each engine's default (what `aiayn translate` does with no flags) against a grid of workers ×
# threads on this machine's cores: native fp32, ONNX Runtime, CTranslate2 float32 / int8 ->
# docs/experiments/engines_sweep.json and its table in docs/experiments/engines.md; a WARNING line
# for a default more than 10% slower than the best setting. SWEEP_ARGS="--limit 200" etc.
bench-sweep: $(VENV)/.installed
	$(BIN)/python benchmarks/bench_engines.py --sweep --model $(ENGINES_MODEL) --repeats 3 $(SWEEP_ARGS)

# Training tokens/s, peak RSS, MFU against nn.Transformer and HF Marian -> docs/experiments/performance.json, .md
# (real Multi30k batches: needs the data mirror or a download). BENCH_ARGS="--threads 1" etc.
bench-train: $(VENV)/.bench
	$(BIN)/python benchmarks/bench_train.py $(BENCH_ARGS)

# aiayn's trainer and nn.Transformer from the same weights on the same 100 real batches -> docs/experiments/convergence.json
bench-convergence: $(VENV)/.bench
	$(BIN)/python benchmarks/same_convergence.py

# How aiayn's step time grows with sentence length and batch size -> docs/experiments/scaling.json, performance.md (both in docs/experiments/)
bench-scaling: $(VENV)/.installed
	$(BIN)/python benchmarks/bench_scaling.py $(SCALING_ARGS)

# One GPU slot, one command (docs/gpu.md): the CUDA tests, bench-train on cuda (SMALL, BASE, bf16),
# decoding speed, 3 minutes of the headline model + test2016 BLEU (minutes in all:
# docs/experiments/gpu_2026-11-26.md#the-whole-check-second-slot-all-four-stages) -> gpu_check/ (or
# $OUT) with gpu_check.json. Reads Multi30k from AIAYN_DATA_MIRROR (default ../shared/data, or
# shared/data / .gpu_data in this checkout); downloads nothing. Without a GPU it says so and fails.
# GPU_PY=python3: use a Python that already has CUDA torch (a machine without network) instead
# of installing the venv.
GPU_PY ?=
gpu-check: $(if $(GPU_PY),,$(VENV)/.bench)
	$(or $(GPU_PY),$(BIN)/python) benchmarks/gpu_check.py $(GPU_CHECK_ARGS)

# The same stages with the same commands on the CPU, every size shrunk (benchmarks/gpu_check.py
# DRY_VALUES; two presets stay two): proves the script works before a GPU slot. `make test` runs it.
gpu-check-dry: $(VENV)/.bench
	$(BIN)/python benchmarks/gpu_check.py --dry-run $(GPU_CHECK_ARGS)

# Multi30k copied into .gpu_data/ (ignored by git), for a machine that gets only this checkout.
gpu-data:
	@test -n "$(AIAYN_DATA_MIRROR)" || { echo "gpu-data: no data mirror (../shared/data or AIAYN_DATA_MIRROR)"; exit 2; }
	mkdir -p .gpu_data && cp -r $(AIAYN_DATA_MIRROR)/multi30k .gpu_data/
	echo "$$(git rev-parse --short HEAD)$$(git status --porcelain -- aiayn benchmarks | grep -q . && echo +dirty)" > .gpu_data/commit.txt

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
