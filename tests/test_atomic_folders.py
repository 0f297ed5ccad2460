"""Model folders are written whole: a kill at any instant of ``aiayn average --overwrite`` or of a
training checkpoint leaves what loads as a whole (the old folder or the new one) or is refused as
a whole, and the next start removes what the killed writer left.

A kill is simulated in-process by copying the folder tree at the instant before the k-th file
system operation (rename, replace, unlink, fsync, mkdir, rmtree …) and stopping there: the copy
is exactly what a SIGKILL at that instant leaves on disk. Every k is tried, until the command
finishes. One test sends a real SIGKILL to a subprocess between the two renames of the swap.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

import aiayn.io
from aiayn.folder.checkpoint import save_model_dir
from aiayn.cli import main
from aiayn.errors import AiaynError
from aiayn.folder import load_model_dir
from aiayn.train.run_folder import RunFolder

sys.path.insert(0, str(Path(__file__).parent))
from trainutil import ROOT, base_values, fails, torch_threads, write_toml  # noqa: E402

OPS = [
    (os, "replace"),
    (os, "rename"),
    (os, "unlink"),
    (os, "fsync"),
    (os, "mkdir"),
    (os, "rmdir"),
    (shutil, "rmtree"),
]


class Killed(BaseException):
    """Not an Exception: no `except Exception` of the code under test may swallow it."""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 6-update run keeping every snapshot (steps 1…6), and its folder tree."""
    tmp = tmp_path_factory.mktemp("atomic")
    values = base_values(tmp / "data", max_steps=6, save_every=1, keep_last=10, valid_every=2)
    cfg = write_toml(tmp / "run.toml", values)
    with torch_threads(1):
        assert main(["train", str(cfg), "--out", str(tmp / "run")]) == 0
    return tmp / "run"


def digest(folder: Path) -> dict[str, str]:
    """What each file holds: config.json without the averaged run's path (which differs between
    the copies of the tree), the model card without that path, the weights' tensors and metadata
    (the header's key order is not fixed), other files' bytes."""
    out = {}
    for p in sorted(folder.iterdir()):
        if p.name == "config.json":
            meta = json.loads(p.read_bytes())
            meta.get("averaged", {}).pop("run", None)
            out[p.name] = json.dumps(meta, sort_keys=True)
        elif p.name == "README.md":  # the model card names the folder by its path: drop it
            text = re.sub(r"\S*/run/avg", "AVG", p.read_text(encoding="utf-8"))
            out[p.name] = hashlib.sha256(text.encode()).hexdigest()
        elif p.suffix == ".safetensors":
            with safe_open(str(p), "pt") as f:
                tensors = {k: hashlib.sha256(f.get_tensor(k).numpy().tobytes()).hexdigest()
                           for k in sorted(f.keys())}
                out[p.name] = json.dumps([tensors, f.metadata()], sort_keys=True)
        elif p.is_file():
            out[p.name] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def kill_at(k: int, root: Path, snapshot: Path, monkeypatch) -> None:
    """Make the k-th file system operation copy ``root`` to ``snapshot`` and stop the program."""
    count = {"n": 0}
    for module, name in OPS:
        real = getattr(module, name)

        def wrapped(*args, _real=real, **kwargs):
            count["n"] += 1
            if count["n"] == k:
                shutil.copytree(root, snapshot, symlinks=True)
                raise Killed()
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapped)


def leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.rglob("*") if ".tmp-" in p.name or ".old-" in p.name]


def every_kill(action, root: Path, tmp_path: Path, check) -> int:
    """Run ``action`` killed at the 1st, 2nd, … operation until it completes; ``check`` each
    snapshot (with the dead writer's leftovers seen as a dead process's). Returns the count."""
    k = 0
    while True:
        k += 1
        snapshot = tmp_path / f"kill{k}"
        work = tmp_path / f"work{k}"
        shutil.copytree(root, work, symlinks=True)
        with pytest.MonkeyPatch.context() as mp:
            kill_at(k, work, snapshot, mp)
            try:
                action(work)
            except Killed:
                pass
            else:
                assert not snapshot.exists()
                return k - 1
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(aiayn.io, "_alive", lambda pid: False)  # the writer is dead
            check(snapshot, k)
        shutil.rmtree(work)
        shutil.rmtree(snapshot)


def test_average_killed_at_every_step_leaves_old_or_new(run, tmp_path, capsys):
    root = tmp_path / "root"
    shutil.copytree(run, root / "run")
    old = root / "run" / "avg"  # an earlier average, to be replaced
    assert main(["average", str(root / "run"), "--last", "2", "-o", str(old)]) == 0
    old_parts = digest(old)
    ref = tmp_path / "ref"
    shutil.copytree(root, ref)
    assert main(["average", str(ref / "run"), "--last", "5", "-o", str(ref / "run/avg"),
                 "--overwrite"]) == 0
    new_parts = digest(ref / "run/avg")
    assert new_parts != old_parts
    seen = set()

    def check(snapshot: Path, k: int) -> None:
        avg = snapshot / "run/avg"
        load_model_dir(avg)  # loads as a whole (recovery puts the old folder back if needed)
        parts = digest(avg)
        assert parts in (old_parts, new_parts), f"kill {k}: a mixed folder"
        seen.add("old" if parts == old_parts else "new")
        assert leftovers(snapshot) == [], f"kill {k}: {leftovers(snapshot)}"

    def action(work: Path) -> None:
        assert main(["average", str(work / "run"), "--last", "5", "-o", str(work / "run/avg"),
                     "--overwrite"]) == 0

    steps = every_kill(action, root, tmp_path, check)
    capsys.readouterr()
    assert steps >= 8 and seen == {"old", "new"}, (steps, seen)


def test_checkpoint_killed_at_every_step_resumes_and_loads(run, tmp_path):
    root = tmp_path / "root"
    shutil.copytree(run, root / "run")
    folder = RunFolder(root / "run")
    state = folder.load_state()
    model, cfg, meta = load_model_dir(folder.path)
    tokenizer = folder.read_tokenizer()
    best_before = digest(folder.best)
    start = [p.detach().clone() for p in model.parameters()]

    def action(work: Path) -> None:
        f = RunFolder(work / "run")
        f.write_meta(meta, tokenizer)
        with torch.no_grad():
            for p, s in zip(model.parameters(), start):
                p.copy_(s + 0.01)
        f.save_checkpoint(model, {**state, "step": state["step"] + 1}, keep_last=3)
        save_model_dir(f.best, model, cfg, kind=meta["kind"], tokenizer_json=tokenizer,
                       extra={"data": meta["data"]}, overwrite=True)

    ref = tmp_path / "ref"
    shutil.copytree(root, ref)
    action(ref)
    best_after = digest(ref / "run/best")
    assert best_after != best_before

    def check(snapshot: Path, k: int) -> None:
        f = RunFolder(snapshot / "run")
        f.prepare(resume=True)  # the next start: recovery, leftovers removed
        s = f.load_state()
        assert s["step"] in (state["step"], state["step"] + 1), k
        assert (f.checkpoints / s["snapshot"]).is_file(), f"kill {k}: snapshot of the state gone"
        load_model_dir(f.path)
        load_model_dir(f.best)
        assert digest(f.best) in (best_before, best_after), f"kill {k}: a mixed best/"
        assert leftovers(snapshot) == [], f"kill {k}: {leftovers(snapshot)}"

    steps = every_kill(action, root, tmp_path, check)
    assert steps >= 10, steps


def test_sigkill_between_the_two_renames_keeps_the_old_folder(run, tmp_path):
    """A real SIGKILL of `aiayn average --overwrite` just after the old folder was moved aside:
    the next command finds the old folder back in place, whole, and no leftovers."""
    work = tmp_path / "run"
    shutil.copytree(run, work)
    out = work / "avg"
    assert main(["average", str(work), "--last", "2", "-o", str(out)]) == 0
    before = digest(out)
    script = (
        "import os, signal, sys\n"
        "real = os.rename\n"
        "def rename(src, dst):\n"
        "    real(src, dst)\n"
        "    if '.old-' in str(dst):\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "os.rename = rename\n"
        "from aiayn.cli import main\n"
        f"sys.exit(main(['average', {str(work)!r}, '--last', '4', '-o', {str(out)!r}, "
        "'--overwrite']))\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert not out.exists() and leftovers(work)  # killed between the renames
    load_model_dir(out)  # the next start restores the old folder
    assert digest(out) == before and leftovers(work) == []


def test_a_reader_still_reads_when_it_cannot_tidy_up(run, tmp_path, monkeypatch):
    """Readers tidy what dead writers left on the way; on a read-only copy (or when another
    reader was first) that fails, and the folder is still read."""
    work = tmp_path / "avg"
    assert main(["average", str(run), "--last", "2", "-o", str(work)]) == 0
    dead = 2**22 + 12345  # no such process
    leftover = work / f".model.safetensors.tmp-{dead}-abc"
    leftover.write_bytes(b"half written")
    moved_aside = tmp_path / f".gone.old-{dead}-abc"
    shutil.copytree(work, moved_aside)  # a swap killed between its renames

    def read_only(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(Path, "unlink", read_only)
    monkeypatch.setattr(aiayn.io.os, "rename", read_only)
    load_model_dir(work)  # the leftover stays, with a warning
    assert leftover.exists()
    with pytest.raises(AiaynError, match="model folder not found"):
        load_model_dir(tmp_path / "gone")  # could not be restored: one line, no OSError


def test_refused_folders_are_untouched(run, tmp_path, capsys):
    work = tmp_path / "run"
    shutil.copytree(run, work)
    cfg = write_toml(tmp_path / "r.toml", base_values(tmp_path / "data"))
    for argv, message in (
        (["average", work, "--last", "2", "-o", work / "best"], "best: already exists and holds a"),
        (["average", work, "--last", "2", "-o", tmp_path], f"holds {work / 'checkpoints'}, which this command reads"),
        (["train", cfg, "--out", work / "best"], "best: already exists and holds a model folder"),
        (["train", cfg, "--out", work], "already holds a training run"),
    ):
        fails(capsys, argv, message, unchanged=[work])


def test_mixed_parts_are_refused(run, tmp_path):
    """A folder whose config.json or tokenizer.json is not the one its weights were written with
    (same shapes: n_heads edited; another model's tokenizer) is one clear error."""
    edited = tmp_path / "edited"
    shutil.copytree(run / "best", edited)
    meta = json.loads((edited / "config.json").read_text())
    meta["model"]["n_heads"] = 4 if meta["model"]["n_heads"] != 4 else 2
    (edited / "config.json").write_text(json.dumps(meta))
    with pytest.raises(AiaynError, match="n_heads .*parts come from different models"):
        load_model_dir(edited)
    swapped = tmp_path / "swapped"
    shutil.copytree(run / "best", swapped)
    tok = json.loads((swapped / "tokenizer.json").read_text())
    (swapped / "tokenizer.json").write_text(json.dumps(tok, indent=3))  # the same, re-indented
    load_model_dir(swapped)
    tok["chars"] = tok["chars"][::-1]  # another tokenizer of the same size
    (swapped / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(AiaynError, match="tokenizer.json is not the tokenizer"):
        load_model_dir(swapped)


def test_folders_from_before_the_record_still_load(run, tmp_path, caplog):
    from safetensors.torch import load_file, save_file

    old = tmp_path / "old"
    shutil.copytree(run / "best", old)
    save_file(load_file(str(old / "model.safetensors")), str(old / "model.safetensors"))
    with caplog.at_level("INFO"):
        load_model_dir(old)
        load_model_dir(old)
    assert sum("not checked" in r.message for r in caplog.records) == 1


def test_weights_have_the_mode_of_the_other_files(run):
    modes = {p.name: p.stat().st_mode & 0o777 for p in (run / "best").iterdir()}
    assert len(set(modes.values())) == 1, modes


def test_a_failed_save_of_a_committed_step_keeps_its_snapshot(tmp_path, monkeypatch):
    """A resumed run that saves its restored step again (it stops at once) and fails to write
    the state (a full disk) must not remove the snapshot the committed state names."""
    from aiayn.errors import OutputError
    from aiayn.train import run_folder as rf

    folder = rf.RunFolder(tmp_path / "run")
    folder.checkpoints.mkdir(parents=True)
    model = torch.nn.Linear(2, 2)
    folder.save_checkpoint(model, {"step": 3}, keep_last=5)
    committed = folder.state.read_bytes()

    def full(path, data):
        raise OutputError(f"{path}: cannot write (No space left on device)")

    monkeypatch.setattr(rf, "write_bytes", full)
    with pytest.raises(OutputError):
        folder.save_checkpoint(model, {"step": 3}, keep_last=5)
    assert folder.snapshot_path(3).is_file() and folder.state.read_bytes() == committed
    with pytest.raises(OutputError):  # a new step's snapshot, never committed, is removed
        folder.save_checkpoint(model, {"step": 4}, keep_last=5)
    assert not folder.snapshot_path(4).exists()
