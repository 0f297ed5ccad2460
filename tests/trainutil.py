"""Shared helpers of the trainer tests: a tiny reversal task written as user files, a model of a
few thousand parameters, and ways to run ``aiayn train`` in-process or as a subprocess."""

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


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models on a shared 2-core machine: one thread avoids oversubscription stalls."""
    with torch_threads(1):
        yield


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
    values.update({"train.precision": "fp32", "train.device": "cpu", "train.progress": False,
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


# ---- the classifier / LM tests' tiny data and one-line errors (test_shapes_cli, test_mlm) ----

SHAPE_TRAIN = {"train.precision": "fp32", "train.device": "cpu", "train.progress": False,
               "train.lr_schedule": "inverse_sqrt", "train.lr": 5e-3, "train.warmup_steps": 10,
               "train.label_smoothing": 0.0, "train.keep_last": 1, "train.log_every": 10}


def fails(capsys, argv: list[str], message: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("aiayn: error: ") and message in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


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
