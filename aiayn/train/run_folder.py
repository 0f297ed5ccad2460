"""The run folder: a loadable model folder plus everything needed to resume training.

Layout::

    RUN/config.json          fully resolved config: kind, model, data, train (+ task, preset)
    RUN/tokenizer.json       the joint subword vocabulary
    RUN/model.safetensors    weights at the latest checkpoint   -> RUN is a model folder
                             (their moving average with train.ema_decay)
    RUN/best/                model folder of the best validation checkpoint (best.json says which)
    RUN/checkpoints/step_00001000.safetensors   the last `train.keep_last` weight snapshots
    RUN/trainer_state.pt     optimizer, step, epoch, data position, RNG states, best metric,
                             the moving average of the weights (train.ema_decay), …
    RUN/metrics.jsonl        one JSON object per logged update

Every file is written atomically (temporary file, fsync, rename). A checkpoint is committed by
writing ``trainer_state.pt``; it names its weight snapshot, which is written first, so a kill at
any moment leaves a consistent pair to resume from; ``model.safetensors`` is written after the
commit. A folder without ``trainer_state.pt`` has no checkpoint: ``train`` starts it again from
step 0 (:meth:`RunFolder.unstarted`). The state holds only tensors, numbers,
strings, lists and dicts: it loads with ``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

import io
import json
import logging
import os
import pickle
import re
import shutil
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from aiayn.config import ModelConfig
from aiayn.errors import AiaynError, CheckpointError, ConfigError
from aiayn.folder.checkpoint import WEIGHTS_FILE, save_weights
from aiayn.folder.config import (
    CONFIG_FILE,
    FolderConfig,
    parse_folder_config,
    read_folder_config,
    write_folder_config,
)
from aiayn.folder.parts import TOKENIZER_FILE, folder_parts, parts_differences, weights_record
from aiayn.io import (
    CHECKPOINT_DIR,
    STATE_FILE,
    check_output_folder,
    describe_folder,
    is_empty_folder,
    new_folder,
    recover_folder,
    snapshot_steps,
    write_bytes,
    write_error,
    write_text,
)
from aiayn.viz.curves import METRICS_FILE

log = logging.getLogger(__name__)

BEST_DIR = "best"
STATE_VERSION = 1
_WRITE_TEST = ".write_test"


class Start(NamedTuple):
    """How :meth:`RunFolder.prepare` found the folder."""

    replace: bool  # swap the folder for an empty one (start_over) once the run is ready to write
    resume: bool  # restore the committed checkpoint (False: start from step 0)


# What torch's weights_only unpickler says when a state names a Python object it will not build:
# "Unsupported global: GLOBAL __main__.Foreign …", "Trying to load unsupported GLOBAL posix.system
# whose module posix is blocked", "… allowlist this global …".
_REFUSED_GLOBAL = re.compile(r"unsupported global:? (?:GLOBAL )?([\w.]+)|allowlist", re.IGNORECASE)


def _state_error(err: Exception, head: bytes) -> str:
    """What a failed ``torch.load`` of a trainer state (starting with bytes ``head``) means, in the
    user's terms (never torch's advice to lower ``weights_only``, never the zip reader's
    internals alone): a refused Python object (a tampered or foreign file) is not a truncated
    one."""
    text = str(err)
    if isinstance(err, pickle.UnpicklingError):
        refused = _REFUSED_GLOBAL.search(text)
        if refused:
            name = f" ({refused[1]})" if refused[1] else ""
            return (
                "not an aiayn trainer state; refused to unpickle it: it names a Python "
                f"object{name} that loading would build or call, which could run code (aiayn's "
                "states hold only tensors, numbers and strings)"
            )
        if head.startswith(b"\x80"):  # a bare pickle's first byte: not a file torch.save wrote
            return (
                "not an aiayn trainer state; refused to unpickle it (a bare pickle, not a "
                "torch.save archive of tensors, numbers and strings)"
            )
    if isinstance(err, EOFError) or "zip archive" in text or "central directory" in text:
        return "corrupt or truncated trainer state (the file ends early or is not a whole archive)"
    return f"corrupt or truncated trainer state (not a file torch.save wrote: {type(err).__name__})"


class RunFolder:
    """Paths and atomic reads/writes of one run folder."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.config = self.path / CONFIG_FILE
        self.tokenizer = self.path / TOKENIZER_FILE
        self.weights = self.path / WEIGHTS_FILE
        self.state = self.path / STATE_FILE
        self.metrics = self.path / METRICS_FILE
        self.best = self.path / BEST_DIR
        self.checkpoints = self.path / CHECKPOINT_DIR

    # ---- setup -----------------------------------------------------------------------------
    def prepare(self, resume: bool, overwrite: bool = False) -> Start:
        """Check the folder can be used: writable, and holding a committed checkpoint when
        resuming. A folder that holds anything else (a model folder, other files) is refused
        unless ``overwrite``. A run stopped before its first checkpoint (:meth:`unstarted`) is
        started again from step 0, with or without ``resume``. Leftovers of a killed writer are
        resolved first."""
        recover_folder(self.best)
        recover_folder(self.path)
        if self.path.exists() and not self.path.is_dir():
            raise ConfigError(f"{self.path}: run folder is a file")
        if resume and overwrite:
            raise ConfigError("--resume continues the run in --out; --overwrite replaces it")
        committed = self.state.is_file()
        if committed and not resume and not overwrite:
            raise ConfigError(
                f"{self.path}: already holds {describe_folder(self.path)}; pass --resume to "
                "continue it, --overwrite to replace it, or choose another --out"
            )
        if not committed and not overwrite and self.unstarted():
            log.warning(
                "%s: the run in it stopped before its first checkpoint (no %s)%s; starting it "
                "again from step 0",
                self.path,
                STATE_FILE,
                ": nothing to resume" if resume else "",
            )
            resume, overwrite = False, True
        elif resume and not committed:
            what = f"it holds {describe_folder(self.path)}" if self.path.is_dir() else "no folder"
            raise CheckpointError(
                f"{self.path}: nothing to resume ({STATE_FILE} not found; {what})"
            )
        if not resume:
            check_output_folder(self.path, overwrite=overwrite)
        if overwrite and not is_empty_folder(self.path):
            return Start(replace=True, resume=False)  # nothing written there until start_over
        try:
            self.checkpoints.mkdir(parents=True, exist_ok=True)
            write_text(self.path / _WRITE_TEST, "ok\n")
            (self.path / _WRITE_TEST).unlink()
        except OSError as err:
            raise ConfigError(f"{self.path}: run folder is not writable ({err})") from None
        return Start(replace=False, resume=resume)

    def unstarted(self) -> bool:
        """True for what a run stopped before its first checkpoint (killed, or failed) leaves:
        only the files a run writes before it, nothing trained, and a config.json with a train
        section (or only the empty checkpoints/ that train makes first)."""
        if not self.path.is_dir() or self.state.exists() or self.weights.exists():
            return False
        if self.best.exists() or self.snapshot_steps():
            return False
        names = {p.name for p in self.path.iterdir()}
        written = {CONFIG_FILE, TOKENIZER_FILE, METRICS_FILE, CHECKPOINT_DIR, "README.md"}
        if not names <= written | {_WRITE_TEST}:
            return False
        if CONFIG_FILE not in names:
            return names == {CHECKPOINT_DIR} and not any(self.checkpoints.iterdir())
        try:
            return read_folder_config(self.path).has_train
        except AiaynError:
            return False

    def discard_uncommitted(self) -> None:
        """Remove the weights a run that failed before its first checkpoint wrote (``best/``, a
        snapshot): what is left is a run folder that :meth:`unstarted` recognises."""
        if self.state.exists():
            return  # a committed checkpoint: everything beside it is kept
        shutil.rmtree(self.best, ignore_errors=True)
        for step in self.snapshot_steps():
            self.snapshot_path(step).unlink(missing_ok=True)
        self.weights.unlink(missing_ok=True)

    def start_over(self) -> None:
        """Replace the folder (``--overwrite``) by an empty run folder, with a swap: a kill
        leaves the old folder or the new one."""
        if self.path.is_dir() and not is_empty_folder(self.path):
            with new_folder(self.path, overwrite=True) as tmp:
                (tmp / CHECKPOINT_DIR).mkdir()
        self.checkpoints.mkdir(parents=True, exist_ok=True)

    def write_meta(self, meta: FolderConfig | dict[str, Any], tokenizer_json: str | None) -> None:
        """Write the run's config.json (``meta``: typed, or the dict train builds) and tokenizer
        (None: a kind without one)."""
        parsed = meta if isinstance(meta, FolderConfig) else parse_folder_config(meta, self.path)
        write_folder_config(self.path, meta)
        if tokenizer_json is not None:
            write_text(self.tokenizer, tokenizer_json)
        self.parts = folder_parts(parsed.config.model, tokenizer_json)

    def read_meta(self) -> FolderConfig:
        """The run's config.json, parsed."""
        try:
            return read_folder_config(self.path)
        except CheckpointError as err:
            raise CheckpointError(f"{self.config}: cannot read the run's config ({err})") from None

    def read_tokenizer(self) -> str:
        try:
            return self.tokenizer.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise CheckpointError(
                f"{self.tokenizer}: cannot read the run's tokenizer ({err})"
            ) from None

    # ---- checkpoints ---------------------------------------------------------------------------
    def snapshot_path(self, step: int) -> Path:
        return self.checkpoints / f"step_{step:08d}.safetensors"

    def snapshot_steps(self) -> list[int]:
        """Steps of the weight snapshots present, oldest first."""
        return snapshot_steps(self.path)

    def save_checkpoint(
        self,
        model: nn.Module,
        state: dict[str, Any],
        keep_last: int,
        folder_model: nn.Module | None = None,
    ) -> None:
        """The weight snapshot, then the state that commits it, then ``model.safetensors`` (until
        that is written the folder loads the previous checkpoint's weights); prune old
        snapshots. ``model.safetensors`` holds ``folder_model``'s weights when given (the moving
        average of train.ema_decay), the snapshot always ``model``'s. A failed write (a full
        disk) removes the uncommitted snapshot: the folder is left as the last checkpoint left
        it."""
        step = state["step"]
        parts = getattr(self, "parts", None)
        snapshot = self.snapshot_path(step)
        buffer = io.BytesIO()
        torch.save({**state, "version": STATE_VERSION, "snapshot": snapshot.name}, buffer)
        committed = snapshot.exists()  # a resumed run saving its restored step again
        try:
            save_weights(model, snapshot, parts)
            write_bytes(self.state, buffer.getvalue())
        except AiaynError:
            if not committed:  # the state may name it: never remove a committed snapshot
                snapshot.unlink(missing_ok=True)
            raise
        save_weights(model if folder_model is None else folder_model, self.weights, parts)
        for old in self.snapshot_steps()[:-keep_last]:
            self.snapshot_path(old).unlink(missing_ok=True)

    def check_parts(self, snapshot: Path, model_cfg: ModelConfig) -> None:
        """Refuse to resume from ``snapshot`` when the run's config.json (model section) or
        tokenizer.json is not what it was trained with (edited since: same shapes, another
        model); what was recorded is in the snapshot's metadata."""
        record = weights_record(snapshot)  # None: written before the record, or unreadable
        found = parts_differences(record, model_cfg, self.tokenizer, snapshot) if record else None
        diffs, tokenizer_differs = found if found is not None else ([], False)
        if diffs:
            raise CheckpointError(
                f"{self.config}: does not describe the weights of the checkpoint to resume "
                f"({snapshot.name}: {'; '.join(diffs[:3])}); it was edited after they were "
                "written: put back the model section the run was trained with"
            )
        if tokenizer_differs:
            raise CheckpointError(
                f"{self.tokenizer}: is not the tokenizer the checkpoint to resume "
                f"({snapshot.name}) was trained with; put back the run's own tokenizer.json"
            )

    def load_state(self) -> dict[str, Any]:
        """The trainer state, checked; CheckpointError when missing, truncated or foreign."""
        if not self.state.is_file():
            raise CheckpointError(f"{self.state}: trainer state not found")
        try:
            with warnings.catch_warnings():  # torch's notes on pickle protocols: not the user's
                warnings.simplefilter("ignore")
                state = torch.load(self.state, map_location="cpu", weights_only=True)
        except Exception as err:  # torch raises many types on a foreign or damaged file
            with open(self.state, "rb") as f:
                head = f.read(2)
            raise CheckpointError(f"{self.state}: {_state_error(err, head)}") from None
        required = (
            "version",
            "step",
            "epoch",
            "position",
            "optimizer",
            "rng",
            "snapshot",
            "progress",
        )
        if not isinstance(state, dict) or any(k not in state for k in required):
            raise CheckpointError(f"{self.state}: not an aiayn trainer state")
        if state["version"] != STATE_VERSION:
            raise CheckpointError(
                f"{self.state}: trainer state version {state['version']}, "
                f"this aiayn reads version {STATE_VERSION}"
            )
        return state

    def discard_after(self, step: int) -> None:
        """Remove what a killed run wrote past the checkpoint it resumes from."""
        for later in self.snapshot_steps():
            if later > step:
                self.snapshot_path(later).unlink(missing_ok=True)
        if self.metrics.is_file():
            kept = []
            for line in self.metrics.read_text(encoding="utf-8").splitlines():
                try:
                    if json.loads(line)["step"] <= step:
                        kept.append(line)
                except (ValueError, KeyError, TypeError):
                    continue  # a line cut short by the kill
            write_text(self.metrics, "".join(f"{line}\n" for line in kept))

    def append_metrics(self, record: dict[str, Any]) -> None:
        try:
            with open(self.metrics, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
                f.flush()
                os.fsync(f.fileno())
        except OSError as err:  # a cut line is dropped by discard_after on resume
            raise write_error(self.metrics, err) from None
