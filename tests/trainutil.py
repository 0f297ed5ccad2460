"""The tests' one helper layer: a tiny model config, torch on one thread, a tiny reversal task
written as user files, ways to run ``aiayn`` in-process or as a subprocess, and the check that a
bad input fails with one line (``fails``, ``fails_keeping``, ``process_fails``).

serve_helpers.py (model folders for the server tests) and _data_helpers.py (the data tests) build
on it; a test file imports what it needs from here rather than writing its own copy."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from aiayn.cli import main
from aiayn.config import ModelConfig

ROOT = Path(__file__).resolve().parents[1]

@contextmanager
def torch_threads(n: int = 1) -> Iterator[None]:
    """torch on ``n`` threads inside the block (tiny models: one thread is faster, and far faster
    on a loaded machine), the count before it restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def tiny_model_config(vocab: int, max_len: int, **over) -> ModelConfig:
    """A 2-layer, d_model 32 model (no dropout) for tests that build models in memory."""
    values = dict(
        src_vocab_size=vocab,
        tgt_vocab_size=vocab,
        d_model=32,
        n_heads=4,
        d_ff=64,
        n_encoder_layers=2,
        n_decoder_layers=2,
        dropout=0.0,
        max_len=max_len,
    )
    return ModelConfig(**{**values, **over})


TINY_MODEL = {
    "model.d_model": 16, "model.n_heads": 2, "model.d_ff": 32, "model.n_encoder_layers": 1,
    "model.n_decoder_layers": 1, "model.dropout": 0.1, "model.max_len": 64,
}


def thread_fixture(*, autouse: bool = False, scope: str = "function", name: str = "one_thread"):
    """A fixture that runs torch on one thread for its scope (tiny models on a shared 2-core
    machine: one thread avoids oversubscription stalls). tests/conftest.py holds the opt-in
    ``one_thread``; a module whose module-scoped fixtures train takes ``scope="module"``."""

    @pytest.fixture(autouse=autouse, scope=scope, name=name)
    def fixture() -> Iterator[None]:
        with torch_threads(1):
            yield

    return fixture


# Imported into a test module (``from trainutil import one_thread``), it puts each of its tests
# on one thread.
one_thread = thread_fixture(autouse=True)


def write_reverse_data(folder: Path, n_train: int = 120, n_valid: int = 16, seed: int = 0) -> dict:
    """Sentences of letters and their reversal, as user files; returns the data.* keys."""
    rng = random.Random(seed)
    words = list("abcdefghij")

    def sentence() -> str:
        return " ".join(rng.choice(words) for _ in range(rng.randint(2, 7)))

    folder.mkdir(parents=True, exist_ok=True)
    keys = {"data.dataset": "", "data.tokenizer": "char", "data.vocab_size": 40,
            "data.max_tokens": 160, "data.max_len": 32}
    for split, n in (("train", n_train), ("valid", n_valid)):
        src = [sentence() for _ in range(n)]
        (folder / f"{split}.src").write_text("\n".join(src) + "\n", encoding="utf-8")
        (folder / f"{split}.tgt").write_text(
            "\n".join(" ".join(reversed(s.split())) for s in src) + "\n", encoding="utf-8")
        keys[f"data.{split}_src"] = str(folder / f"{split}.src")
        keys[f"data.{split}_tgt"] = str(folder / f"{split}.tgt")
    return keys


def base_values(data_dir: Path, **train) -> dict:
    """Dotted keys of a tiny, fast, fp32 run (override with train keys, e.g. max_steps=8)."""
    values = {**TINY_MODEL, **write_reverse_data(data_dir)}
    values.update({"train.precision": "fp32", "train.device": "cpu",
                   "train.lr_schedule": "inverse_sqrt", "train.lr": 3e-3, "train.warmup_steps": 4,
                   "train.max_steps": 8, "train.valid_every": 4, "train.save_every": 4,
                   "train.log_every": 2})
    values.update({f"train.{k}": v for k, v in train.items()})
    return values


def write_toml(path: Path, values: dict) -> Path:
    """Write dotted keys as a sectioned TOML file."""
    sections: dict[str, list[str]] = {}
    for key, value in values.items():
        section, name = key.split(".", 1)
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, str):
            text = '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
        else:
            text = repr(value)
        sections.setdefault(section, []).append(f"{name} = {text}")
    path.write_text("".join(f"[{s}]\n" + "\n".join(lines) + "\n\n" for s, lines in sections.items()),
                    encoding="utf-8")
    return path


def subprocess_env() -> dict:
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    return env


def aiayn_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "aiayn", *args]


def run_aiayn(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(aiayn_command(*args), cwd=ROOT, env=subprocess_env(), capture_output=True,
                          text=True, timeout=timeout)


# ---- the classifier / LM tests' tiny data (test_shapes_cli, test_mlm) ----

SHAPE_TRAIN = {"train.precision": "fp32", "train.device": "cpu",
               "train.lr_schedule": "inverse_sqrt", "train.lr": 5e-3, "train.warmup_steps": 10,
               "train.label_smoothing": 0.0, "train.keep_last": 1, "train.log_every": 10}




def reviews(n: int, seed: int) -> list[tuple[int, str]]:
    """Texts whose label is whether "good" or "bad" occurs, among filler words and HTML breaks."""
    rng = random.Random(seed)
    filler = "the a film plot actor scene music and was it very".split()
    rows = []
    for i in range(n):
        label = i % 2
        words = [rng.choice(filler) for _ in range(rng.randint(3, 14))]
        words.insert(rng.randrange(len(words) + 1), "good" if label else "bad")
        rows.append((label, " ".join(words).replace("and", "and<br /><br />", 1)))
    return rows


def write_tsv(path, rows) -> str:
    path.write_text("".join(f"{label}\t{text}\n" for label, text in rows), encoding="utf-8")
    return str(path)


# ---- bad input: one error line, exit 2, no traceback, nothing saved changed ---------------------


def file_bytes(*folders: Path) -> dict[Path, bytes]:
    """Every file under ``folders`` and its bytes."""
    return {p: p.read_bytes() for folder in folders for p in Path(folder).rglob("*") if p.is_file()}


def temporaries(folder: Path) -> list[Path]:
    """What a writer leaves while it works (aiayn.io's ``.tmp-`` files, ``.old-`` folders)."""
    return [p for p in Path(folder).rglob("*") if ".tmp-" in p.name or ".old-" in p.name]


def _one_error(rc: int, err: str, code: int, message: str) -> None:
    assert rc == code, (rc, err)
    assert err.startswith("aiayn: error: ") and message in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def _kept(before: dict[Path, bytes], folders, may_change) -> None:
    """The files under ``folders`` are those of ``before``, byte for byte (but ``may_change``):
    none changed, none went, none appeared (no temporary either)."""
    after = file_bytes(*folders)
    changed = sorted(str(p) for p in before.keys() | after.keys()
                     if p not in may_change and before.get(p) != after.get(p))
    assert changed == [], f"changed, gone or new: {changed}"


def fails(capsys, argv: list, message: str, *, code: int = 2, unchanged=(), may_change=()) -> str:
    """Run ``aiayn ARGV`` in-process: exit ``code``, exactly one line ``aiayn: error: …`` on stderr
    holding ``message``, no traceback, and the files under the ``unchanged`` folders as they were,
    byte for byte (but the paths in ``may_change``): none changed, gone or new, no temporary left.
    Returns the line."""
    capsys.readouterr()
    before = file_bytes(*unchanged)
    rc = main([str(a) for a in argv])
    err = capsys.readouterr().err
    _one_error(rc, err, code, message)
    _kept(before, unchanged, may_change)
    return err


def fails_keeping(capsys, root: Path, argv: list, message: str, code: int = 2,
                  may_change=()) -> str:
    """``fails`` with the files under ``root`` unchanged (test_bad_input's form)."""
    return fails(capsys, argv, message, code=code, unchanged=[root], may_change=may_change)


def process_fails(argv: list, message: str, *, code: int = 2, unchanged=(), may_change=(),
                  timeout: float = 120) -> str:
    """``fails`` in a real process (``python -m aiayn``): the same assertions on its exit status
    and stderr, for what only a process shows (the exit status of the interpreter, imports)."""
    before = file_bytes(*unchanged)
    proc = run_aiayn(*(str(a) for a in argv), timeout=timeout)
    _one_error(proc.returncode, proc.stderr, code, message)
    _kept(before, unchanged, may_change)
    return proc.stderr


class FakeProcStat:
    """/proc/stat of a machine of ``cpus`` cores (aiayn.threads._read_stat's stand-in): each read
    comes 10 ticks a core after the one before, during which ``busy`` cores ran work at normal
    priority, ``niced`` cores niced work, and the others were idle (each may change between
    reads)."""

    def __init__(self, cpus: int, busy: int = 0, niced: int = 0) -> None:
        self.cpus, self.busy, self.niced = cpus, busy, niced
        self.ticks = [[1000, 500, 300, 9000, 10, 0, 5, 0] for _ in range(cpus)]

    def __call__(self) -> str:
        for i, ticks in enumerate(self.ticks):
            ticks[0 if i < self.busy else 1 if i < self.busy + self.niced else 3] += 10
        total = [sum(column) for column in zip(*self.ticks)]
        lines = [f"cpu{i} " + " ".join(map(str, t)) + " 0 0" for i, t in enumerate(self.ticks)]
        return "\n".join(["cpu  " + " ".join(map(str, total)) + " 0 0", *lines,
                          "intr 1083497 0 0", "ctxt 1672806", "procs_running 3"]) + "\n"
