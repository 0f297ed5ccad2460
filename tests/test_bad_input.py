"""Bad input, faults and kills: every case ends with the exit code it should, exactly one line
``aiayn: error: …`` that names the problem, no traceback, and every file that existed before
byte-identical after (nothing half-written is left either: no temporary file or folder).

Most cases run in-process through ``aiayn.cli.main`` (a subprocess costs 2-3 s of imports);
the kills of a writer are simulated by leaving what a killed writer leaves (a real SIGKILL is in
tests/test_atomic_folders.py). Disk faults are an ``OSError(ENOSPC)`` injected into the writes.
A command added later (serve, export) joins by adding its cases to CASES.
"""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
import torch

import aiayn.io
from aiayn.cli import main

sys.path.insert(0, str(Path(__file__).parent))
from trainutil import base_values, temporaries, thread_fixture, torch_threads, write_toml  # noqa: E402
from trainutil import fails_keeping as fails  # noqa: E402
from trainutil import file_bytes as files  # noqa: E402


# ---- fixtures: one tiny trained run for the module ---------------------------------------------
@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A folder holding: data/ (reverse-task text), run.toml, run/ (6 updates, every snapshot
    kept, best/), avg/ (an average of run), and assorted user files and folders."""
    root = tmp_path_factory.mktemp("bad")
    values = base_values(root / "data", max_steps=6, save_every=1, keep_last=10, valid_every=3)
    write_toml(root / "run.toml", values)
    with torch_threads(1):
        assert main(["train", str(root / "run.toml"), "--out", str(root / "run")]) == 0
        assert main(["average", str(root / "run"), "--last", "2", "-o", str(root / "avg")]) == 0
    (root / "file.txt").write_text("a plain file\n")
    (root / "in.txt").write_text("a b c\nd e\n")
    (root / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    (root / "out").mkdir()
    (root / "out2" / "b").mkdir(parents=True)  # a folder of the user's
    (root / "out2" / "a.txt").write_text("a user's file\n")
    return root


_one_thread = thread_fixture(autouse=True, name="_one_thread")


def copy_of(world: Path, tmp_path: Path, name: str) -> Path:
    dest = tmp_path / name
    shutil.copytree(world / name, dest)
    return dest


def toml(tmp_path: Path, world: Path, **changes) -> Path:
    values = base_values(world / "data")
    for key, value in changes.items():
        values[key.replace("__", ".")] = value
    return write_toml(tmp_path / "c.toml", values)


# ---- configs ------------------------------------------------------------------------------------
CONFIG_CASES = {
    "model max_len below data max_len": (
        {"model__max_len": 16, "data__max_len": 32}, "model.max_len (16) is below data.max_len"),
    "max_tokens below max_len": ({"data__max_tokens": 20}, "data.max_tokens (20) is below"),
    "padded widths beyond the model's positions": (
        {"model__max_len": 36, "data__max_len": 34, "data__pad_to_multiple": 8},
        "padded to data.pad_to_multiple (8), 40"),
    "no stop condition": ({"train__max_steps": 0}, "the run would never stop"),
    "patience without validation": (
        {"train__patience": 2, "train__valid_every": 0}, "train.patience counts validations"),
    "valid_bleu without metrics_every": (
        {"train__best_metric": "valid_bleu"}, "needs train.metrics_every > 0"),
    "long_examples for translation": (
        {"data__long_examples": "truncate"}, "applies to classification texts"),
    "cosine min_lr above lr": (
        {"train__lr_schedule": "cosine", "train__min_lr": 1.0, "train__lr": 0.1},
        "train.min_lr (1.0) is above train.lr"),
    "warmup_init_lr above lr": ({"train__warmup_init_lr": 1.0}, "warmup_init_lr (1.0) is above"),
    "cosine warmup not below max_steps": (
        {"train__lr_schedule": "cosine", "train__warmup_steps": 10}, "must be > warmup_steps"),
    "time clock without cosine": ({"train__schedule_clock": "time"}, "schedule_clock = 'time'"),
    "d_model not divisible by n_heads": ({"model__n_heads": 3}, "divisible by n_heads"),
    "negative max_steps": ({"train__max_steps": -1}, "train.max_steps must be >= 0"),
    "label smoothing of 1": ({"train__label_smoothing": 1.0}, "label_smoothing must be in"),
    "wrong type": ({"train__lr": "fast"}, "train.lr"),
    "unknown key": ({"train__max_step": 5}, "did you mean 'train.max_steps'"),
    "unknown preset": ({"model__preset": "huge"}, "unknown preset 'huge'"),
    "dataset and own files": ({"data__dataset": "multi30k"}, "are both set"),
    "translation with train_file": ({"data__train_file": "x.tsv"}, "not data.train_file"),
    "adversarial training of a translation": (
        {"train__adversarial_eps": 0.1}, "adversarial_eps applies to data.kind = 'classification'"),
    "output_vocab of a language model": (
        {"data__task": "lm", "data__train_src": "", "data__train_tgt": "", "data__valid_src": "",
         "data__valid_tgt": "", "model__output_vocab": "targets"}, "model.output_vocab"),
    "bpe dropout with char tokenizer": ({"data__bpe_dropout": 0.1}, "data.bpe_dropout needs"),
    "lowercase with char tokenizer": ({"data__lowercase": True}, "data.lowercase needs"),
}


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_config_contradictions(case, world, tmp_path, capsys):
    changes, message = CONFIG_CASES[case]
    cfg = toml(tmp_path, world, **changes)
    fails(capsys, world, ["train", cfg, "--out", tmp_path / "run"], message)
    assert not (tmp_path / "run").exists()  # refused before any folder or tokenizer


def test_config_file_errors(world, tmp_path, capsys):
    out = tmp_path / "run"
    fails(capsys, world, ["train", tmp_path / "missing.toml", "--out", out], "config file not found")
    bad = tmp_path / "bad.toml"
    bad.write_text("[train\nlr = 1\n")
    fails(capsys, world, ["train", bad, "--out", out], "not valid TOML")
    bare = tmp_path / "bare.toml"
    bare.write_text("lr = 1\n")
    fails(capsys, world, ["train", bare, "--out", out], "must be a [section]")
    cfg = toml(tmp_path, world)
    fails(capsys, world, ["train", cfg, "--out", out, "--set", "lr=1"], "name the section")
    fails(capsys, world, ["train", cfg, "--out", out, "--set", "train.lr"], "KEY=VALUE")
    fails(capsys, world, ["train", "--out", out], "give a CONFIG.toml")


# ---- data files ---------------------------------------------------------------------------------
def test_data_file_errors(world, tmp_path, capsys):
    data = world / "data"
    out = tmp_path / "run"
    cases = [
        ({"data__train_src": str(tmp_path / "nope.src")}, "nope.src"),
        ({"data__train_src": str(world / "latin1.txt")}, "latin1.txt"),
    ]
    short = tmp_path / "short.tgt"
    short.write_text("a\n")
    cases.append(({"data__train_tgt": str(short)}, "short.tgt"))
    empty = tmp_path / "empty.src"
    empty.write_text("")
    cases.append(({"data__train_src": str(empty), "data__train_tgt": str(empty)}, "empty.src"))
    longer = tmp_path / "long.src"
    longer.write_text(("x " * 40 + "\n") * 3)
    cases.append(({"data__train_src": str(longer), "data__train_tgt": str(longer)},
                  "no training pairs left"))
    for changes, message in cases:
        cfg = toml(tmp_path, world, **changes)
        fails(capsys, world, ["train", cfg, "--out", out], message)
        assert not (out / "trainer_state.pt").exists()
    assert (data / "train.src").exists()


def test_pathological_text_finishes_in_seconds(tmp_path, caplog):
    """A 1 MB line without spaces, a 10 MB one-line text and control characters: tokenizer
    training leaves the long ones out (counted in the log) and encoding stays fast."""
    from aiayn.data.tokenizer import train_tokenizer

    normal = [f"word{i % 50} other{i % 7} text\x01\x7f\u200b here" for i in range(400)]
    start = time.perf_counter()
    with caplog.at_level("WARNING"):
        tok = train_tokenizer(normal + ["x" * 1_000_000, "ab" * 5_000_000], "bpe", 300)
    assert "left out 2 of 402 texts" in caplog.text
    ids = tok.encode("y" * 1_000_000)
    assert ids and time.perf_counter() - start < 30
    text = "z" * 10_000_000  # training never encodes what cannot fit data.max_len
    assert tok.min_tokens(text) > 1000 and tok.min_tokens("short text") == 0
    assert tok.min_tokens(text) <= len(tok.encode(text[:100_000])) * 100


# ---- model folders ------------------------------------------------------------------------------
def damage(folder: Path, what: str) -> None:
    cfg = folder / "config.json"
    weights = folder / "model.safetensors"
    meta = json.loads(cfg.read_text())
    if what == "config not json":
        cfg.write_text("{not json")
    elif what == "config without kind":
        del meta["kind"]
        cfg.write_text(json.dumps(meta))
    elif what == "unknown kind":
        meta["kind"] = "diffusion"
        cfg.write_text(json.dumps(meta))
    elif what == "n_heads edited":
        meta["model"]["n_heads"] = 1
        cfg.write_text(json.dumps(meta))
    elif what == "d_model edited":
        meta["model"]["d_model"] = 32
        cfg.write_text(json.dumps(meta))
    elif what == "no config":
        cfg.unlink()
    elif what == "no weights":
        weights.unlink()
    elif what == "weights truncated":
        weights.write_bytes(weights.read_bytes()[:100])
    elif what == "weights garbage":
        weights.write_bytes(b"\x00" * 64)
    elif what == "tokenizer garbage":
        (folder / "tokenizer.json").write_text("{]")
    elif what == "tokenizer swapped":
        tok = json.loads((folder / "tokenizer.json").read_text())
        tok["chars"] = tok["chars"][::-1]
        (folder / "tokenizer.json").write_text(json.dumps(tok))


FOLDER_CASES = {
    "config not json": "not valid JSON",
    "config without kind": "needs 'kind' and 'model'",
    "unknown kind": "unknown model kind",
    "n_heads edited": "parts come from different models",
    "d_model edited": "parts come from different models",
    "no config": "config.json is missing",
    "no weights": "weights file not found",
    "weights truncated": "not a readable safetensors file",
    "weights garbage": "not a readable safetensors file",
    "tokenizer garbage": "not a tokenizer",
    "tokenizer swapped": "not the tokenizer these weights were trained with",
}


@pytest.mark.parametrize("what", list(FOLDER_CASES))
def test_damaged_model_folder(what, world, tmp_path, capsys):
    folder = copy_of(world, tmp_path, "avg")
    damage(folder, what)
    fails(capsys, tmp_path, ["translate", folder, "-i", world / "in.txt"], FOLDER_CASES[what])


def test_missing_folders(world, tmp_path, capsys):
    fails(capsys, world, ["translate", tmp_path / "nope", "-i", world / "in.txt"], "not found")
    fails(capsys, world, ["summary", tmp_path / "nope"], "not found")
    fails(capsys, world, ["evaluate", world / "out", "--src", world / "in.txt", "--ref",
                          world / "in.txt"], "not a model folder")
    fails(capsys, world, ["average", tmp_path / "nope", "-o", tmp_path / "a"],
          "not a training run folder")


# ---- flags and inputs ---------------------------------------------------------------------------
def test_bad_flags(world, tmp_path, capsys):
    avg, inp = world / "avg", world / "in.txt"
    cases = [
        (["translate", avg, "-i", inp, "--beam", "0"], "beam must be >= 1"),
        (["translate", avg, "-i", inp, "--nbest", "5", "--beam", "2"], "nbest must be between"),
        (["translate", avg, "-i", inp, "--device", "tpu9"], "unknown device"),
        (["translate", avg, "-i", inp, "--batch-tokens", "0"], "--batch-tokens must be >= 1"),
        (["translate", avg, "-i", inp, "--set", "decode.max_len_a=0", "--set", "decode.max_len_b=0"],
         "output cap is 0 tokens"),
        (["translate", avg, "-i", tmp_path / "none.txt"], "none.txt"),
        (["translate", avg, "-i", world / "latin1.txt"], "latin1.txt"),
        (["evaluate", avg], "give either --split NAME or --src FILE --ref FILE"),
        (["evaluate", avg, "--src", inp, "--ref", inp, "--limit", "-1"], "--limit must be >= 0"),
        (["summary", "tiny", "--shape", "2,0,16"], "--shape must be three positive integers B,S,T"),
        (["average", world / "run", "--last", "0", "-o", tmp_path / "a"], "--last must be >= 1"),
        (["average", world / "run", "--last", "99", "-o", tmp_path / "a"], "only 6"),
        (["average", world / "run", "--last", "5", "--until", "3", "-o", tmp_path / "a"],
         "only 3 are at step 3 or before (steps 1, 2, 3)"),
    ]
    for argv, message in cases:
        fails(capsys, world, argv, message)
    err = fails(capsys, world, ["average", world / "run", "--until", "0", "-o", tmp_path / "a"],
                "no checkpoint at step 0 or before; its checkpoints are at steps 1, 2, 3, 4, 5, 6")
    assert "keep_last" not in err  # no checkpoint was removed: keeping more would not help


def test_devices_aiayn_does_not_run_on_are_one_line(world, tmp_path, capsys):
    """mps, meta, xpu (and a CUDA device on a machine without one): one line from the one check
    (aiayn.checks.check_device) in every command, and in aiayn.load, where translate, evaluate
    and serve ended in a torch traceback while train refused mps in one line."""
    import aiayn

    avg, inp, cfg = world / "avg", world / "in.txt", world / "run.toml"
    unsupported = "not supported; aiayn runs on auto, cpu, cuda, cuda:N"
    for name in ("mps", "meta", "xpu"):
        for argv in (["translate", avg, "-i", inp], ["evaluate", avg, "--src", inp, "--ref", inp],
                     ["classify", avg, "-i", inp], ["generate", avg, "--prompt", "a"]):
            fails(capsys, world, [*argv, "--device", name], f"--device {name}: {unsupported}")
        fails(capsys, world, ["train", cfg, "--out", tmp_path / "r", "--set", f"train.device={name}"],
              f"train.device = {name}: {unsupported}")
        with pytest.raises(aiayn.ConfigError, match=f"device {name}: {unsupported}"):
            aiayn.load(avg, device=name)
    if importlib.util.find_spec("fastapi"):
        fails(capsys, world, ["serve", avg, "--device", "mps"], f"--device mps: {unsupported}")
    if not torch.cuda.is_available():
        fails(capsys, world, ["translate", avg, "-i", inp, "--device", "cuda:1"],
              "--device cuda:1: no CUDA device is available")


def test_outputs_checked_before_any_work(world, tmp_path, capsys):
    """A folder where a file is expected, a path under a file, an unwritable place: refused
    before a model is loaded (a broken model folder would otherwise be reported first)."""
    broken = tmp_path / "broken"  # not a model: the output error must come first
    broken.mkdir()
    inp, file_ = world / "in.txt", world / "file.txt"
    for flag in ("-o", "--out"):
        fails(capsys, world, ["translate", broken, "-i", inp, flag, world / "out"], "is a folder")
    cases = [
        (["translate", broken, "-i", inp, "-o", file_ / "x.txt"], "is a file, not a folder"),
        (["translate", broken, "-i", inp, "-o", f"{tmp_path}/new/"], "names a folder"),
        (["translate", broken, "-i", inp, "-o", "/sys/aiayn-out.txt"], "cannot write in /sys"),
        (["evaluate", broken, "--src", inp, "--ref", inp, "--hyps", world / "out"],
         "--hyps"),
        (["evaluate", broken, "--src", inp, "--ref", inp, "-o", file_ / "s.json"], "is a file"),
        (["data", "tokenizer", "--config", world / "run.toml", "-o", world / "out"], "is a folder"),
        (["plot", "pe", "-o", world / "out"], "is a folder"),
        (["plot", "pe", "-o", file_ / "pe.png"], "is a file, not a folder"),
        (["average", world / "run", "--last", "2", "-o", file_], "is a file, not a folder"),
        (["average", world / "run", "--last", "2", "-o", file_ / "avg"], "is a file"),
        (["average", world / "run", "--last", "2", "-o", "/sys/aiayn-avg"], "cannot write in"),
        (["train", world / "run.toml", "--out", file_], "is a file"),
        (["train", world / "run.toml", "--out", file_ / "run"], "is a file, not a folder"),
    ]
    for argv, message in cases:
        fails(capsys, world, argv, message)


def test_outputs_over_inputs_are_refused(world, tmp_path, capsys):
    """An output file that is one of the command's inputs (also through a symbolic link), or a
    part of a model folder: refused before any work, through one check (aiayn.io.check_not_input),
    every input byte-identical after (it was replaced, exit 0)."""
    avg, run, inp = world / "avg", world / "run", world / "in.txt"
    link = tmp_path / "link.txt"
    link.symlink_to(inp)
    reads = "which this command reads"
    part = "is a part of the model folder"
    cases = [
        (["translate", avg, "-i", inp, "-o", inp], f"--out {inp}: is {inp} itself, {reads}"),
        (["translate", avg, "-i", inp, "-o", link], reads),
        (["translate", avg, "-i", link, "-o", inp], reads),
        (["translate", avg, "-i", inp, "-o", avg / "tokenizer.json"], part),
        (["data", "tokenizer", "--config", world / "run.toml", "-o", world / "data" / "train.src"],
         reads),
        (["data", "tokenizer", "--config", world / "run.toml", "-o", avg / "tokenizer.json"],
         f"{part} {avg} (tokenizer.json)"),
        (["data", "tokenizer", "--config", world / "run.toml", "-o", run / "best" / "tokenizer.json"],
         part),
        (["evaluate", avg, "--src", inp, "--ref", world / "file.txt", "-o", world / "file.txt"],
         reads),
        (["evaluate", avg, "--src", inp, "--ref", inp, "-o", avg / "config.json"], part),
        (["evaluate", avg, "--src", inp, "--ref", inp, "--hyps", avg / "model.safetensors"], part),
        (["plot", "curves", run, "-o", run / "metrics.jsonl"], part),
    ]
    for argv, message in cases:
        fails(capsys, world, argv, message)


# ---- folders that are not to be overwritten -----------------------------------------------------
def test_existing_folders_are_refused(world, tmp_path, capsys):
    run, cfg = world / "run", world / "run.toml"
    model = "holds a model folder (README.md, config.json, model.safetensors, tokenizer.json)"
    cases = [
        (["average", run, "--last", "2", "-o", run / "best"], f"{model}; pass --overwrite"),
        (["average", run, "--last", "2", "-o", world / "avg"], model),
        (["average", run, "--last", "2", "-o", run], f"holds {run / 'checkpoints'}, which"),
        (["average", run, "--last", "2", "-o", world], f"holds {run / 'checkpoints'}, which"),
        (["average", run, "--last", "2", "-o", world / "out", "--overwrite"], ""),  # see below
        (["train", cfg, "--out", run / "best"], model),
        (["export", world / "avg", "--format", "onnx", "-o", run],
         "holds a training run with 6 checkpoints (steps 1, 2, 3, 4, 5, 6); pass --overwrite"),
        (["train", cfg, "--out", run],
         "already holds a training run with 6 checkpoints (steps 1, 2, 3, 4, 5, 6); pass --resume"),
        (["train", cfg, "--out", world / "out2"], "holds a folder of 2 entries (a.txt, b)"),
        (["train", cfg, "--out", run, "--resume", "--overwrite"], "--overwrite replaces it"),
        (["train", cfg, "--out", world / "avg", "--resume"],
         f"nothing to resume (trainer_state.pt not found; it {model})"),
    ]
    for argv, message in cases:
        if "--overwrite" in argv and "--resume" not in argv:
            continue  # an empty folder: allowed (tested in test_overwrite_swaps_whole)
        fails(capsys, world, argv, message)


def test_overwrite_swaps_whole(world, tmp_path, capsys):
    run = copy_of(world, tmp_path, "run")
    before = files(run / "best")
    assert main(["average", str(run), "--last", "3", "-o", str(run / "best"), "--overwrite"]) == 0
    assert files(run / "best") != before and temporaries(run) == []
    meta = json.loads((run / "best" / "config.json").read_text())
    assert meta["averaged"]["steps"] == [4, 5, 6]


def test_resume_with_another_model_is_refused(world, tmp_path, capsys):
    run = copy_of(world, tmp_path, "run")
    fails(capsys, tmp_path, ["train", "--resume", "--out", run, "--set", "model.d_model=32"],
          "differs from the run")


def test_outputs_never_replace_what_the_command_reads(world, tmp_path, capsys,
                                                       monkeypatch):
    """-o/--out may not be, hold or lie inside what the command reads (model and run folders,
    data and config files), --overwrite or not: one line, every input byte-identical."""
    run, avg, cfg, data = world / "run", world / "avg", world / "run.toml", world / "data"
    own = tmp_path / "own"  # a config file inside the folder it would train into
    own.mkdir()
    own_cfg = toml(own, world)
    cases = [
        (["export", run / "best", "--format", "onnx", "-o", run, "--overwrite"],
         f"-o {run}: holds {run / 'best'}, which this command reads"),
        (["export", avg, "--format", "onnx", "-o", avg, "--overwrite"],
         f"-o {avg}: is {avg} itself, which this command reads"),
        (["export", avg, "--format", "onnx", "-o", avg / "onnx", "--overwrite"],
         f"lies inside {avg}"),
        (["average", run, "--last", "2", "-o", run, "--overwrite"],
         f"-o {run}: holds {run / 'checkpoints'}"),
        (["average", run, "--last", "2", "-o", run / "checkpoints", "--overwrite"],
         f"is {run / 'checkpoints'} itself"),
        (["train", cfg, "--out", data, "--overwrite"],
         f"--out {data}: holds {data / 'train.src'}, which this command reads"),
        (["train", cfg, "--out", data], f"holds {data / 'train.src'}"),
        (["train", cfg, "--out", avg / "ft", "--set", f"train.init_from={avg}"],
         f"lies inside {avg}"),
    ]
    for argv, message in cases:
        fails(capsys, world, argv, message)
    fails(capsys, own, ["train", own_cfg, "--out", own, "--overwrite"], f"holds {own_cfg}")
    monkeypatch.setenv("AIAYN_CACHE", str(own))  # a registered dataset: the downloads are read
    mine = {f"data__{k}": "" for k in ("train_src", "train_tgt", "valid_src", "valid_tgt")}
    registered = toml(tmp_path, world, data__dataset="multi30k", **mine)
    fails(capsys, own, ["train", registered, "--out", own, "--overwrite"],
          f"holds {own / 'datasets'}, which this command reads")


def test_resume_after_config_json_was_edited_is_refused(world, tmp_path, capsys):
    """config.json edited in a way that keeps every shape (n_heads 2 -> 4), or another tokenizer
    of the same size: the checkpoint's record says so, before anything is loaded or written."""
    run = copy_of(world, tmp_path, "run")
    meta = json.loads((run / "config.json").read_text())
    meta["model"]["n_heads"] = 4
    (run / "config.json").write_text(json.dumps(meta))
    resume = ["train", "--resume", "--out", run, "--set", "train.max_steps=9"]
    fails(capsys, tmp_path, resume, "does not describe the weights of the checkpoint to resume "
          "(step_00000006.safetensors: n_heads is 4, the weights' is 2)")
    shutil.rmtree(run)
    run = copy_of(world, tmp_path, "run")
    tok = json.loads((run / "tokenizer.json").read_text())
    tok["chars"] = tok["chars"][::-1]
    (run / "tokenizer.json").write_text(json.dumps(tok))
    fails(capsys, tmp_path, resume, "is not the tokenizer the checkpoint to resume "
          "(step_00000006.safetensors) was trained with")


# ---- trainer states -----------------------------------------------------------------------------
class Foreign:
    pass


class RunsCode:
    """What a tampered state holds: unpickling it would run a shell command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


STATE_CASES = {
    "code-running pickle": "refused to unpickle it: it names a Python object (posix.system)",
    "foreign pickle": "not an aiayn trainer state; refused to unpickle it",
    "plain pickle": "not an aiayn trainer state; refused to unpickle it",
    "truncated": "corrupt or truncated trainer state",
    "empty": "corrupt or truncated trainer state",
    "tensors only": "not an aiayn trainer state",
}


@pytest.mark.parametrize("what", list(STATE_CASES))
def test_bad_trainer_state(what, world, tmp_path, capsys):
    import pickle

    run = copy_of(world, tmp_path, "run")
    state = run / "trainer_state.pt"
    if what == "code-running pickle":
        torch.save({"step": 3, "x": RunsCode(tmp_path / "ran")}, state)
    elif what == "foreign pickle":
        torch.save({"step": 3, "x": Foreign()}, state)
    elif what == "plain pickle":
        state.write_bytes(pickle.dumps({"step": 3, "x": Foreign()}))
    elif what == "truncated":
        state.write_bytes(state.read_bytes()[:300])
    elif what == "empty":
        state.write_bytes(b"")
    else:
        torch.save({"weights": torch.zeros(2)}, state)
    err = fails(capsys, tmp_path, ["train", "--resume", "--out", run], STATE_CASES[what])
    assert "weights_only" not in err and "miniz" not in err
    assert ("truncated" in err) == (what in ("truncated", "empty"))
    assert not (tmp_path / "ran").exists()


# ---- kills: what a killed writer leaves is resolved at the next start ---------------------------
DEAD = 2**22 + 12345  # a pid no process has (beyond the default pid_max)


def test_leftovers_of_killed_writers_are_resolved(world, tmp_path, capsys):
    run = copy_of(world, tmp_path, "run")
    avg = copy_of(world, tmp_path, "avg")
    # killed between the two renames of a swap: avg moved aside, the new one complete beside it
    os.rename(avg, tmp_path / f".avg.old-{DEAD}-abc")
    shutil.copytree(run / "best", tmp_path / f".avg.tmp-{DEAD}-abc")
    # killed while writing files
    (run / f".model.safetensors.tmp-{DEAD}-x").write_bytes(b"half")
    (run / "checkpoints" / f".step_00000007.safetensors.tmp-{DEAD}-y").write_bytes(b"half")
    (tmp_path / f".best2.tmp-{DEAD}-z").mkdir()
    assert main(["translate", str(avg), "-i", str(world / "in.txt"), "-o",
                 str(tmp_path / "t.txt")]) == 0
    assert (avg / "model.safetensors").exists()
    assert main(["train", "--resume", "--out", str(run), "--set", "train.max_steps=6"]) == 0
    assert main(["average", str(run), "--last", "2", "-o", str(tmp_path / "best2")]) == 0
    assert temporaries(tmp_path) == [] and not (tmp_path / "new").exists()


def test_live_writers_temporaries_are_kept(world, tmp_path):
    avg = copy_of(world, tmp_path, "avg")
    mine = avg / f".model.safetensors.tmp-{os.getpid()}-x"  # a writer that is still running
    mine.write_bytes(b"in progress")
    aiayn.io.recover_folder(avg)
    assert mine.exists()


# ---- full disk ----------------------------------------------------------------------------------
@pytest.fixture
def full_disk(monkeypatch):
    """``arm(match)``: from then on, every fsync of a file whose path holds ``match`` fails with
    ENOSPC (what a full disk does to a write that the page cache accepted)."""
    state = {"match": None}
    real = os.fsync

    def fsync(fd):
        match = state["match"]
        if match is not None and match in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return lambda match="": state.update(match=match)


def test_full_disk_average(world, tmp_path, capsys, full_disk):
    run = copy_of(world, tmp_path, "run")
    full_disk(".safetensors")
    fails(capsys, tmp_path, ["average", run, "--last", "2", "-o", tmp_path / "a"],
          "disk full while writing", code=2)
    assert not (tmp_path / "a").exists()
    fails(capsys, tmp_path, ["average", run, "--last", "2", "-o", run / "best", "--overwrite"],
          "disk full while writing")


def test_full_disk_translate_and_evaluate(world, tmp_path, capsys, full_disk):
    avg, inp = world / "avg", world / "in.txt"
    (tmp_path / "t.txt").write_text("old translations\n")
    full_disk()
    err = fails(capsys, world, ["translate", avg, "-i", inp, "-o", tmp_path / "t.txt"],
                "disk full while writing")
    assert "t.txt" in err and (tmp_path / "t.txt").read_text() == "old translations\n"
    fails(capsys, world, ["evaluate", avg, "--src", inp, "--ref", inp, "-o",
                          tmp_path / "s.json"], f"disk full while writing {tmp_path / 's.json'}")
    assert temporaries(tmp_path) == [] and not (tmp_path / "new").exists()


def test_full_disk_train_and_resume(world, tmp_path, capsys, full_disk):
    """ENOSPC at the first checkpoint of a new run, and during a resumed run: one line naming the
    file, the last checkpoint still resumes."""
    from aiayn.train.run_folder import RunFolder

    run = copy_of(world, tmp_path, "run")
    step = RunFolder(run).load_state()["step"]
    full_disk(".safetensors")
    # config.json records the changed train.max_steps, as every resume does
    err = fails(capsys, tmp_path, ["train", "--resume", "--out", run, "--set",
                                   "train.max_steps=9"], "disk full while writing",
                may_change=[run / "config.json"])
    assert str(run) in err
    assert RunFolder(run).load_state()["step"] == step  # the last checkpoint is intact
    err = fails(capsys, tmp_path, ["train", world / "run.toml", "--out", tmp_path / "new"],
                "disk full while writing")
    assert temporaries(tmp_path) == [] and not (tmp_path / "new").exists()


# What safetensors raises when its own write fails: no OSError (found by limiting the file size,
# tests below: 'Error while serializing: I/O error: File too large (os error 27)').
ENOSPC_FROM_SAFETENSORS = (
    "Error while serializing: I/O error: No space left on device (os error 28)"
)


@pytest.fixture
def safetensors_full_disk(monkeypatch):
    """``arm(match)``: from then on, every safetensors file written to a path that holds
    ``match`` fails as safetensors fails on a full disk; ``arm(None)`` frees the disk."""
    import safetensors.torch
    from safetensors import SafetensorError

    state = {"match": None}
    real = safetensors.torch.serialize_file

    def serialize_file(tensors, filename, *args, **kwargs):
        if state["match"] is not None and state["match"] in str(filename):
            raise SafetensorError(ENOSPC_FROM_SAFETENSORS)
        return real(tensors, filename, *args, **kwargs)

    monkeypatch.setattr(safetensors.torch, "serialize_file", serialize_file)
    return lambda match="": state.update(match=match)


def test_full_disk_in_the_safetensors_writer(world, tmp_path, capsys, safetensors_full_disk):
    """average, a resumed run and a new run's first checkpoint: one line, nothing lost, no
    uncommitted snapshot left, no half-made folder."""
    from aiayn.train.run_folder import RunFolder

    run = copy_of(world, tmp_path, "run")
    state, steps = RunFolder(run).load_state()["step"], RunFolder(run).snapshot_steps()
    safetensors_full_disk()
    fails(capsys, tmp_path, ["average", run, "--last", "2", "-o", tmp_path / "a"],
          f"disk full while writing {tmp_path / 'a' / 'model.safetensors'}")
    assert not (tmp_path / "a").exists()
    fails(capsys, tmp_path, ["train", "--resume", "--out", run, "--set", "train.max_steps=9"],
          "disk full while writing " + str(run / "checkpoints" / "step_00000007.safetensors"),
          may_change=[run / "config.json"])
    assert RunFolder(run).load_state()["step"] == state and RunFolder(run).snapshot_steps() == steps
    fails(capsys, tmp_path, ["train", world / "run.toml", "--out", tmp_path / "new"],
          "disk full while writing")
    assert not (tmp_path / "new").exists()


def test_a_run_whose_first_checkpoint_failed_starts_again(
    world, tmp_path, capsys, caplog, safetensors_full_disk
):
    """The disk fills after best/ was written, at the first snapshot: the folder (the user's,
    so it stays) is left as a run stopped before its first checkpoint, which --resume (or
    train) starts again from step 0 with the same config once there is room."""
    from aiayn.train.run_folder import RunFolder

    out = tmp_path / "run"
    out.mkdir()
    safetensors_full_disk("step_")
    fails(capsys, tmp_path, ["train", world / "run.toml", "--out", out, "--set",
                             "train.valid_every=1"], "disk full while writing",
          may_change=[out / "config.json", out / "tokenizer.json", out / "metrics.jsonl"])
    assert RunFolder(out).unstarted() and not (out / "best").exists()
    safetensors_full_disk(None)
    with caplog.at_level("WARNING"):
        assert main(["train", "--resume", "--out", str(out)]) == 0
    assert "nothing to resume; starting it again from step 0" in caplog.text
    assert RunFolder(out).load_state()["step"] == 6 and temporaries(tmp_path) == []


def test_a_real_safetensors_write_error_is_one_line(world, tmp_path):
    """Not simulated: a file size limit (RLIMIT_FSIZE; a write past it fails with EFBIG as one
    on a full disk fails with ENOSPC) stops safetensors' own writer in the middle of the file,
    in average and at a new run's first checkpoint."""
    import resource
    import subprocess

    from trainutil import ROOT, aiayn_command, subprocess_env

    limit = 8000  # above config.json and tokenizer.json, below the weights (28 kB)

    def limit_file_size():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    def error_line(*argv) -> str:
        proc = subprocess.run(aiayn_command(*map(str, argv)), cwd=ROOT, env=subprocess_env(),
                              capture_output=True, text=True, timeout=120,
                              preexec_fn=limit_file_size)
        errors = [line for line in proc.stderr.splitlines() if line.startswith("aiayn: error:")]
        assert proc.returncode == 2 and len(errors) == 1, proc.stderr
        assert "Traceback" not in proc.stderr and proc.stderr.rstrip().endswith(errors[0])
        return errors[0]

    assert error_line("average", world / "run", "--last", "2", "-o", tmp_path / "a") == (
        f"aiayn: error: {tmp_path / 'a' / 'model.safetensors'}: cannot write (File too large)")
    snapshot = tmp_path / "new" / "checkpoints" / "step_00000001.safetensors"
    assert error_line("train", world / "run.toml", "--out", tmp_path / "new") == (
        f"aiayn: error: {snapshot}: cannot write (File too large)")
    assert list(tmp_path.iterdir()) == []  # no folder, no temporary


def test_a_run_killed_before_its_first_checkpoint_starts_again(world, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(world / "run" / "config.json", run / "config.json")
    shutil.copy(world / "run" / "tokenizer.json", run / "tokenizer.json")
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 9.0}\n{"st')  # cut by the kill
    (run / "checkpoints").mkdir()
    assert main(["train", str(world / "run.toml"), "--out", str(run)]) == 0
    assert (run / "trainer_state.pt").is_file() and temporaries(tmp_path) == []
    assert '"loss": 9.0' not in (run / "metrics.jsonl").read_text()
    early = tmp_path / "early"  # killed before config.json: only the checkpoints/ train made
    (early / "checkpoints").mkdir(parents=True)
    assert main(["train", str(world / "run.toml"), "--out", str(early)]) == 0
    assert (early / "trainer_state.pt").is_file()


def test_a_run_stopped_inside_its_first_checkpoint_says_what_it_holds(world, tmp_path, capsys):
    """Weights but no trainer state (killed between the first snapshot and the state that
    commits it, or trainer_state.pt deleted by hand): nothing to resume, and not started again
    without --overwrite, since the weights may be what someone kept."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    for name in ("config.json", "tokenizer.json", "checkpoints/step_00000003.safetensors"):
        shutil.copy(world / "run" / name, run / name)
    shutil.copytree(world / "run" / "best", run / "best")
    held = "a training run with 1 checkpoint (step 3) and no trainer_state.pt"
    fails(capsys, tmp_path, ["train", world / "run.toml", "--out", run],
          f"already exists and holds {held}; pass --overwrite")
    fails(capsys, tmp_path, ["train", "--resume", "--out", run],
          f"nothing to resume (trainer_state.pt not found; it holds {held})")
    assert main(["train", str(world / "run.toml"), "--out", str(run), "--overwrite"]) == 0


# ---- the commands added later: export and serve join the suite ----------------------------------
def test_export_and_serve_bad_input(world, tmp_path, capsys):
    """Each refused before any work: nothing written, one line, exit 2 (the server never starts).
    Needs the extras only where the check comes after their import (skipped with a reason)."""
    pytest.importorskip("onnx", reason="the 'export' extra is not installed")
    pytest.importorskip("fastapi", reason="the 'serve' extra is not installed")
    avg, run = world / "avg", world / "run"
    cases = [
        (["export", world / "out", "--format", "onnx", "-o", tmp_path / "x"], "not a model folder"),
        (["export", tmp_path / "nope", "--format", "onnx", "-o", tmp_path / "x"], "not found"),
        (["export", avg, "--format", "onnx", "--quantization", "int8", "-o", tmp_path / "x"],
         "--quantization applies to --format ctranslate2 only"),
        (["export", avg, "--format", "onnx", "-o", avg], f"is {avg} itself, which this command"),
        (["export", avg, "--format", "onnx", "-o", run / "best"], "holds a model folder"),
        (["export", avg, "--format", "onnx", "-o", world / "file.txt"], "is a file"),
        (["translate", avg, "-i", world / "in.txt", "--engine", "onnx"], "onnx"),
        (["serve", tmp_path / "nope"], "not found"),
        (["serve", world / "out"], "not a model folder"),
        (["serve", avg, "--port", "70000"], "--port must be between 1 and 65535"),
    ]
    for argv, message in cases:
        fails(capsys, world, argv, message)
    # An exported folder has no PyTorch weights to record attention from.
    assert main(["export", str(avg), "--format", "onnx", "-o", str(tmp_path / "onnx")]) == 0
    fails(capsys, tmp_path, ["plot", "attention", tmp_path / "onnx", "--text", "a b"],
          "--engine torch needs the model folder it was exported from")
