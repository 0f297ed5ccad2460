"""The engines that run a model, and how many batches each decodes at once by default: names the
command line offers (``--engine``, ``--workers``), here without torch so that ``--help`` needs
none. :mod:`aiayn.runtime` holds the backends, :func:`aiayn.threads.default_workers` the choice."""

from __future__ import annotations

__all__ = ["ENGINES", "MOST_WORKERS"]

#: the runtimes, by the name `--engine` and config.json "format" give them ("torch": a model folder)
ENGINES = ("torch", "onnx", "ctranslate2")

# Batches decoded at once, at most, when the user chose no number (`--workers`), by engine. Each
# batch runs on its share of the threads, and on a CPU one batch per thread is fastest: per-step
# ops are small, and batches side by side overlap their Python and their waits instead of
# meeting at every op's barrier (2-core AMD EPYC, idle, test2016, beam 5, native and CTranslate2:
# docs/experiments/decoding_speed.md#the-openmp-wait-policy-2026-11-26). aiayn's
# search (torch, ONNX Runtime) runs in Python, whose lock lets about two batches overlap usefully;
# CTranslate2's runs in C++ (its inter_threads), and 4 is where its guide's batches of a typical
# test set still fill every translator. A GPU runs one batch at a time.
MOST_WORKERS = {"torch": 2, "onnx": 2, "ctranslate2": 4}
