"""Trust nothing read back (issue #55): one fault-injection test per family.

- a token store whose src.bin was overwritten with other bytes of the same size (random bytes,
  or all 7s: every id valid) is rebuilt, never read; so is one built before checksums;
- a cached tokenizer swapped with another's, or corrupt, is trained again; a compiled package
  changed since it was written (a stand-in compiler) is compiled again;
- NaN and inf for every numeric decoding input (the CLI flags, a recipe, the library), NaN weights
  at load, and a prefix the vocabulary cannot represent are refused in one line;
- a leftover of a writer whose pid now belongs to another live process (another start time, or
  another boot) is a dead writer's: the model folder comes back;
- a full disk is named as such, with the bytes written.

(Imported generation settings and weights: tests/test_hf_import.py's BAD cases.)
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from trainutil import fails, tiny_model_config, write_reverse_data, write_toml

import aiayn.io
from aiayn.folder.checkpoint import save_model_dir
from aiayn.checks import check_finite_tensors
from aiayn.data import DataConfig, TokenStore, train_tokenizer, train_tokenizer_for
from aiayn.data.loaders import translation_store
from aiayn.data.store import StoreWriter, open_store
from aiayn.decode import DecodeConfig
from aiayn.errors import CheckpointError, ConfigError, DataError, OutputError
from aiayn.folder import load_model_folder
from aiayn.folder.config import read_folder_config
from aiayn.io import recover_folder, write_bytes
from aiayn.model import Transformer
from aiayn.runtime import compiled as compiled_module
from aiayn.runtime.compiled import EagerRunner, compiled_step, package_key
from aiayn.run_config import load_run_config


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A data cache of the test's own."""
    monkeypatch.setenv("AIAYN_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def own_files(tmp_path: Path, **over) -> DataConfig:
    keys = write_reverse_data(tmp_path / "data", n_train=200)
    return DataConfig(**{**{k.removeprefix("data."): v for k, v in keys.items()}, **over})


def rows(store: TokenStore, field: str) -> list[list[int]]:
    return [r.tolist() for r in store.rows(field, range(len(store)))]


# ---- token stores ------------------------------------------------------------------------------


@pytest.mark.parametrize("overwrite", ["random", "all 7s"])
def test_a_store_overwritten_with_bytes_of_the_same_size_is_rebuilt(
    cache, tmp_path, caplog, overwrite
):
    cfg = own_files(tmp_path)
    tok = train_tokenizer_for(cfg)
    store = translation_store(cfg, tok, "train")
    expected = rows(store, "src")
    src = store.path / "src.bin"
    size = src.stat().st_size
    if overwrite == "random":  # ids out of the vocabulary: training crashed with an IndexError
        src.write_bytes(np.random.default_rng(0).bytes(size))
    else:  # every id valid: training went on, on the wrong data, and exited 0
        src.write_bytes(np.full(size // 2, 7, np.uint16).tobytes())
    assert src.stat().st_size == size
    with pytest.raises(DataError, match=r"src\.bin: its content changed since it was built"):
        TokenStore(store.path)
    with caplog.at_level(logging.WARNING):
        again = translation_store(cfg, tok, "train")
    lines = [r.getMessage() for r in caplog.records if "building it again" in r.getMessage()]
    assert len(lines) == 1 and "src.bin: its content changed since it was built" in lines[0]
    assert rows(again, "src") == expected


def test_a_store_without_checksums_is_rebuilt_once(cache, tmp_path, caplog):
    cfg = own_files(tmp_path)
    tok = train_tokenizer_for(cfg)
    store = translation_store(cfg, tok, "train")
    manifest = json.loads((store.path / "manifest.json").read_text())
    del manifest["checksums"]  # as stores built before checksums were recorded
    (store.path / "manifest.json").write_text(json.dumps(manifest))
    with caplog.at_level(logging.WARNING):
        translation_store(cfg, tok, "train")
        translation_store(cfg, tok, "train")
    assert caplog.text.count("built before checksums were recorded; building it again") == 1


# ---- tokenizer caches and compiled packages ----------------------------------------------------


def test_a_swapped_or_corrupt_tokenizer_cache_is_trained_again(cache, tmp_path, caplog):
    small, large = own_files(tmp_path, vocab_size=12), own_files(tmp_path, vocab_size=40)
    want = train_tokenizer_for(small).to_str()
    other = train_tokenizer_for(large).to_str()
    assert want != other
    path_small = next(p for p in (cache / "tokenizers").glob("*.json") if p.read_text() == want)
    path_large = next(p for p in (cache / "tokenizers").glob("*.json") if p.read_text() == other)
    shutil.copy(path_large, path_small)  # the cache entry of other settings, under this key
    with caplog.at_level(logging.WARNING):
        assert train_tokenizer_for(small).to_str() == want
    assert f"tokenizer cache: {path_small} has" in caplog.text  # its size differs
    shutil.copy(path_large, path_small)
    shutil.copy(path_large.with_name(path_large.name + ".sum.json"),
                path_small.with_name(path_small.name + ".sum.json"))  # its record too
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert train_tokenizer_for(small).to_str() == want
    assert f"{path_small} was built with other settings" in caplog.text
    i = want.index('"a"')  # corrupt, the same size: another character in the vocabulary
    path_small.write_text(want[:i] + '"z"' + want[i + 3 :])
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert train_tokenizer_for(small).to_str() == want
    assert "its content changed since it was built" in caplog.text
    assert caplog.text.count("training it again") == 1


def test_a_changed_compiled_package_is_compiled_again(tmp_path, monkeypatch, caplog):
    """A stand-in compiler (writes a file) and loader (runs the step eagerly)."""
    model = Transformer(tiny_model_config(20, 16)).eval()
    built: list[Path] = []

    def build(m, path):
        built.append(path)
        path.write_bytes(b"a package of " + package_key(m, 1).encode())

    monkeypatch.setattr(compiled_module, "_build", build)
    monkeypatch.setattr(compiled_module, "_load", lambda path, runners: EagerRunner(model))
    compiled_step(model, tmp_path)
    compiled_step(model, tmp_path)
    assert len(built) == 1  # the second load trusted the checksum
    package = built[0]
    package.write_bytes(b"X" + package.read_bytes()[1:])  # corrupt, the same size
    with caplog.at_level(logging.WARNING):
        compiled_step(model, tmp_path)
    assert len(built) == 2 and "its content changed since it was built" in caplog.text
    package.with_name(package.name + ".sum.json").unlink()  # a package from before checksums
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        compiled_step(model, tmp_path)
    assert len(built) == 3 and "compiling it again" in caplog.text


# ---- numbers and weights -----------------------------------------------------------------------


@pytest.fixture
def folder(tmp_path) -> Path:
    tok = train_tokenizer(["abc abd bca cab"] * 5, "char", 20)
    model = Transformer(tiny_model_config(tok.vocab_size, 32)).eval()
    out = tmp_path / "model"
    save_model_dir(out, model, model.cfg, tokenizer_json=tok.to_str())
    (tmp_path / "in.txt").write_text("abc\n")
    return out


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("flag, error", [
    ("--alpha", "alpha must be a"),
    ("--set=decode.max_len_a", "decode.max_len_a: expected a finite number"),
    ("--set=decode.repetition_penalty", "decode.repetition_penalty: expected a finite number"),
])
def test_nan_and_inf_decoding_flags_are_one_line(folder, capsys, flag, error, value):
    name = flag.split(".")[-1].removeprefix("--")
    argv = ["translate", folder, "-i", folder.parent / "in.txt", f"{flag}={value}"]
    fails(capsys, argv, error, unchanged=[folder])
    with pytest.raises(ConfigError, match=f"{name} must be a"):
        DecodeConfig(**{name: float(value)})


@pytest.mark.parametrize("value", ["nan", "inf"])
@pytest.mark.parametrize("flag", ["--temperature", "--top-p"])
def test_nan_and_inf_sampling_flags_are_one_line(tmp_path, capsys, flag, value):
    argv = ["generate", tmp_path / "lm", "--prompt", "a", f"{flag}={value}"]
    fails(capsys, argv, f"{flag} must be a finite number")


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_nan_and_inf_in_a_recipe_are_one_line(tmp_path, value):
    recipe = write_toml(tmp_path / "r.toml", {"decode.alpha": 0.6, "train.lr": 1.0})
    text = recipe.read_text().replace("1.0", "nan" if math.isnan(value) else "inf")
    recipe.write_text(text)
    with pytest.raises(ConfigError, match="lr: expected a finite number"):
        load_run_config(recipe)


def test_nan_weights_are_refused_at_load_naming_file_and_tensor(folder):
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    state = load_file(str(path))
    name = sorted(state)[3]
    state[name][0] = math.nan
    save_file(state, str(path))
    with pytest.raises(CheckpointError, match=rf"model\.safetensors: tensor '{name}' holds NaN"):
        load_model_folder(folder)
    with pytest.raises(CheckpointError, match="holds infinite values"):
        check_finite_tensors({"w": torch.tensor([1.0, math.inf])}, "f")


def test_a_prefix_the_vocabulary_lacks_is_refused_not_cut(folder, capsys):
    model = load_model_folder(folder)
    assert model.translate(["abc"], prefixes=["ab"], beam=1)[0].startswith("ab")
    with pytest.raises(ConfigError, match=r"cannot represent 'z' \(U\+007A\), 'é' \(U\+00E9\)"):
        model.translate(["abc"], prefixes=["abzé"], beam=1)
    prefixes = folder.parent / "prefixes.txt"
    prefixes.write_text("abzé\n", encoding="utf-8")
    argv = ["translate", folder, "-i", folder.parent / "in.txt", "--prefixes", prefixes]
    fails(capsys, argv, "prefix 'abzé': the tokenizer cannot represent 'z'", unchanged=[folder])


# ---- dead writers ------------------------------------------------------------------------------


def _leftover(tmp_path: Path, pid: int, start: int | None, boot: str) -> Path:
    tag = f"{pid}.{start}.{boot}"
    old = tmp_path / f".model.old-{tag}@{aiayn.io._HOST}-abc123"
    old.mkdir()
    (old / "config.json").write_text("{}")
    return old


@pytest.mark.skipif(not aiayn.io._BOOT, reason="no /proc boot id on this system")
def test_a_reused_pid_does_not_keep_a_dead_writer_alive(tmp_path):
    parent = os.getppid()  # alive, and not the writer: it started at another time
    start = aiayn.io.start_time(parent)
    assert start is not None
    _leftover(tmp_path, parent, start + 1, aiayn.io._BOOT)
    recover_folder(tmp_path / "model")
    assert (tmp_path / "model" / "config.json").read_text() == "{}"
    shutil.rmtree(tmp_path / "model")
    other_boot = "0" * 8 if aiayn.io._BOOT != "0" * 8 else "1" * 8
    _leftover(tmp_path, parent, start, other_boot)  # its very start time, in another boot
    recover_folder(tmp_path / "model")
    assert (tmp_path / "model" / "config.json").read_text() == "{}"


def test_an_old_style_leftover_of_a_reused_pid_is_judged_by_its_time(tmp_path):
    """Names from before start times were recorded: a process that started after the leftover
    was last touched cannot have written it."""
    parent = os.getppid()
    old = tmp_path / f".model.old-{parent}@{aiayn.io._HOST}-abc123"
    old.mkdir()
    os.utime(old, (0, 0))  # touched long before the parent started (1970)
    recover_folder(tmp_path / "model")
    assert (tmp_path / "model").is_dir() and not old.exists()
    again = tmp_path / f".other.old-{parent}@{aiayn.io._HOST}-abc123"
    again.mkdir()  # touched now: the parent may have written it, and it is alive
    recover_folder(tmp_path / "other")
    assert again.is_dir() and not (tmp_path / "other").exists()


@pytest.mark.skipif(not aiayn.io._BOOT, reason="no /proc boot id on this system")
def test_a_live_writers_leftover_never_hides_the_model_folder(tmp_path):
    parent = os.getppid()  # a live writer: its pid, start time and boot
    old = _leftover(tmp_path, parent, aiayn.io.start_time(parent), aiayn.io._BOOT)
    with pytest.raises(CheckpointError, match=rf"missing while a writer \(pid {parent} on "
                       r".*\) replaces it; its last version is in ") as e:
        read_folder_config(tmp_path / "model")
    assert str(old) in str(e.value)


# ---- a full disk -------------------------------------------------------------------------------


def _full_disk(monkeypatch, name: str, room: int) -> None:
    """os.write to a file whose name holds ``name`` writes at most ``room`` bytes in all, then
    fails with ENOSPC (or, every other call, writes nothing)."""
    real, state = os.write, {"left": room, "calls": 0}

    def write(fd, data):
        if name not in os.readlink(f"/proc/self/fd/{fd}"):
            return real(fd, data)
        state["calls"] += 1
        n = min(len(data), state["left"], 7)
        if n == 0:
            if state["calls"] % 2:
                return 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        state["left"] -= n
        return real(fd, bytes(memoryview(data)[:n]))

    monkeypatch.setattr(os, "write", write)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd")
def test_a_full_disk_is_named_with_the_bytes_written(tmp_path, monkeypatch, cache):
    _full_disk(monkeypatch, "notes.txt", 20)
    with pytest.raises(OutputError) as e:
        write_bytes(tmp_path / "notes.txt", b"x" * 100)
    assert str(e.value) == f"disk full while writing {tmp_path / 'notes.txt'} (20 of 100 bytes written)"
    assert not (tmp_path / "notes.txt").exists()

    src = tmp_path / "a.txt"
    src.write_text("x\n")

    def build(folder: Path) -> dict:
        writer = StoreWriter(folder, ["src"], 100)
        writer.add({"src": [[1, 2, 3]] * 40}, list(range(40)))
        writer.finish()
        return {}

    _full_disk(monkeypatch, "src.bin", 50)
    with pytest.raises(OutputError, match=r"^disk full while writing .*stores/t-\w+/src\.bin "
                       r"\(50 of 240 bytes written\)$"):
        open_store("t", {"k": 1}, [src], build)
