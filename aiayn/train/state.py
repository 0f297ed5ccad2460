"""What a checkpoint saves and a resume restores: :class:`TrainState`.

A run resumes to bit-identical weights: besides the model's weights (a snapshot in the run folder)
and the optimizer's moments, the state holds the step counters (:class:`Progress`: the learning
rate is a function of the step, the data position says which batches of the epoch are done) and
the RNG states of every process (dropout masks, masked-LM masks). :meth:`TrainState.save` writes
them through :meth:`~aiayn.train.run_folder.RunFolder.save_checkpoint` (atomic writes), and
:meth:`TrainState.load` reads them back, checked.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from aiayn.errors import CheckpointError
from aiayn.folder.checkpoint import init_from_model_dir, load_weights, save_model_dir, upgrade_state
from aiayn.run_config import RunConfig, TrainConfig
from aiayn.train.distributed import DistContext
from aiayn.train.ema import WeightAverage
from aiayn.train.run_folder import RunFolder

if TYPE_CHECKING:  # annotations only: the state never imports the kinds' tasks nor the set-up
    from aiayn.train.setup import TrainingSetup
    from aiayn.train.task import Task

log = logging.getLogger(__name__)

__all__ = [
    "Progress",
    "TrainState",
    "build_optimizer",
    "init_from",
    "rng_state",
    "rng_untouched",
    "set_rng_state",
]


@dataclass
class Progress:
    """Counters that a checkpoint saves and a resume restores."""

    step: int = 0  # updates applied
    epoch: int = 1  # the epoch in progress (1-based)
    position: int = 0  # batches of this epoch already consumed (this process's list)
    wall: float = 0.0  # seconds of training before this session
    best: float | None = None  # best value of train.best_metric so far
    bad_valid: int = 0  # validations since the last new best (early stopping)
    bad_steps: int = 0  # consecutive updates skipped for a non-finite loss
    skipped: int = 0  # all updates skipped so far
    warmup_wall: float | None = None  # wall-clock when the warm-up ended (schedule_clock = "time")

    def new_best(self, value: float, lower_is_better: bool) -> bool:
        """Count a validation's ``value`` of train.best_metric: True when it is a new best."""
        best = self.best
        if best is None or (value < best if lower_is_better else value > best):
            self.best, self.bad_valid = value, 0
            return True
        self.bad_valid += 1
        return False


def rng_state() -> dict[str, Any]:
    """This process's global RNG states: torch (and CUDA once used), Python, numpy."""
    np_state: Any = np.random.get_state()  # the legacy tuple
    state = {
        "torch": torch.get_rng_state(),
        "python": list(random.getstate()[1]),
        "python_gauss": random.getstate()[2],
        "numpy": [
            torch.from_numpy(np_state[1].astype(np.int64)),
            int(np_state[2]),
            int(np_state[3]),
            float(np_state[4]),
        ],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate((3, tuple(state["python"]), state["python_gauss"]))
    keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state(("MT19937", keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


@contextlib.contextmanager
def rng_untouched() -> Iterator[None]:
    """Whatever runs inside (batching, validation) leaves the global RNGs as they were."""
    saved = rng_state()
    try:
        yield
    finally:
        set_rng_state(saved)


def build_optimizer(model: nn.Module, train: TrainConfig, fused: bool) -> torch.optim.Optimizer:
    """Adam (AdamW with ``train.weight_decay``) over ``model``'s trained parameters (a frozen
    one, ``train.freeze``, is left out); the schedule sets the learning rate before each update."""
    opt = torch.optim.AdamW if train.weight_decay > 0 else torch.optim.Adam
    return opt(
        [p for p in model.parameters() if p.requires_grad],
        lr=0.0,
        betas=(train.adam_betas[0], train.adam_betas[1]),
        eps=train.adam_eps,
        weight_decay=train.weight_decay,
        fused=fused,
    )


def init_from(model: nn.Module, folder: str) -> list[str]:
    """``model``'s weights from the model folder ``folder`` where they fit (train.init_from);
    returns the names of the tensors copied."""
    copied, fresh = init_from_model_dir(model, folder)
    log.info(
        "train.init_from: %d tensors from %s; initialised here: %s",
        len(copied),
        folder,
        ", ".join(fresh) or "none",
    )
    return copied


class TrainState:
    """The model, its optimizer, the :class:`Progress` counters and the RNGs of a run, as one
    checkpoint: :meth:`save` after an update, :meth:`load` before the first (``--resume``)."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        dist: DistContext,
        cfg: RunConfig,
    ) -> None:
        self.model, self.optimizer, self.dist, self.cfg = model, optimizer, dist, cfg
        self.progress = Progress()
        decay = cfg.train.ema_decay
        # train.ema_decay: the moving average of the weights, from the weights of now
        self.ema = WeightAverage(model, decay) if decay else None

    @property
    def folder_model(self) -> nn.Module:
        """The weights a model folder gets (the run folder's, best/'s) and validation uses: the
        moving average with train.ema_decay, else the trained model."""
        return self.model if self.ema is None else self.ema.model

    @classmethod
    def start(
        cls, cfg: RunConfig, task: Task, setup: TrainingSetup, resume: RunFolder | None
    ) -> TrainState:
        """The state of a run's first update: ``task``'s model seeded by ``train.seed`` (its
        weights from ``train.init_from``) and a fresh optimizer, or, when ``resume`` names the
        run folder, all of it as its last checkpoint left it."""
        train = cfg.train
        torch.manual_seed(train.seed)
        model = task.build_model(cfg.model)
        if resume is None:  # (a checkpoint holds all the weights)
            loaded = init_from(model, train.init_from) if train.init_from else []
            task.fit_before_training(model, loaded)
        model = setup.place(model)
        optimizer = build_optimizer(model, train, setup.fused_optimizer)
        state = cls(model, optimizer, setup.dist, cfg)
        if resume is not None:
            state.load(resume)
        else:
            # Processes share the initial weights (seed) but each draws its own dropout masks.
            torch.manual_seed(train.seed + 1_000_003 * setup.dist.rank)
        return state

    def state_dict(self, wall: float) -> dict[str, Any]:
        """What trainer_state.pt holds; ``wall``: the seconds trained so far. Collective (the RNG
        states of every process are gathered): all ranks call it."""
        progress = self.progress
        progress_state = {k: v for k, v in vars(progress).items()}
        progress_state["wall"] = wall
        return {
            "step": progress.step,
            "epoch": progress.epoch,
            "position": progress.position,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": {"name": self.cfg.train.lr_schedule, "step": progress.step},
            "rng": self.dist.gather(rng_state()),
            "progress": progress_state,
            "world_size": self.dist.world_size,
            **({} if self.ema is None else {"ema": self.ema.state_dict()}),
        }

    def save(self, folder: RunFolder, wall: float) -> None:
        """A checkpoint in ``folder``, keeping its last ``train.keep_last`` snapshots (written by
        rank 0; every rank calls it)."""
        state = self.state_dict(wall)
        if self.dist.is_main:
            keep = self.cfg.train.keep_last
            folder.save_checkpoint(self.model, state, keep, folder_model=self.folder_model)

    def save_best(
        self, path: Path, value: float, kind: str, tokenizer_json: str | None, meta: dict[str, Any]
    ) -> None:
        """The model folder ``path`` (the run's best/) with the weights of now, a new best
        ``value`` of train.best_metric; its config.json records ``meta`` and that best."""
        extra = {k: v for k, v in meta.items() if k not in ("kind", "model")}
        save_model_dir(
            path,
            self.folder_model,
            self.cfg.model,
            kind=kind,
            tokenizer_json=tokenizer_json,
            extra={
                **extra,
                "best": {"step": self.progress.step, self.cfg.train.best_metric: value},
            },
            overwrite=True,  # this run's own best/ (prepare refused a folder holding another)
        )

    def load(self, folder: RunFolder) -> None:
        """Restore the last checkpoint of ``folder``, whose config.json must still describe its
        weights; CheckpointError when it cannot be restored."""
        state = folder.load_state()
        snapshot = folder.checkpoints / state["snapshot"]
        folder.check_parts(snapshot, self.cfg.model)  # config.json edited since?
        load_weights(self.model, snapshot)
        try:
            self.optimizer.load_state_dict(state["optimizer"])
        except (ValueError, KeyError, RuntimeError) as err:
            raise CheckpointError(
                f"{folder.state}: optimizer state does not fit the model ({err})"
            ) from None
        self._fuse_optimizer_groups()
        self._load_ema(state.get("ema"), folder)
        try:
            self.progress = Progress(**state["progress"])
            rngs = state["rng"]
            set_rng_state(rngs[self.dist.rank % len(rngs)])
        except (TypeError, KeyError, ValueError, RuntimeError, IndexError) as err:
            raise CheckpointError(f"{folder.state}: not an aiayn trainer state ({err})") from None
        if len(rngs) != self.dist.world_size:
            log.warning(
                "resuming with %d processes, the checkpoint had %d: dropout masks and the "
                "data order will differ from an uninterrupted run",
                self.dist.world_size,
                len(rngs),
            )
        if self.dist.is_main:
            folder.discard_after(self.progress.step)
        log.info("resumed %s at step %d (epoch %d)", folder.path, state["step"], state["epoch"])

    def _load_ema(self, saved: dict[str, Any] | None, folder: RunFolder) -> None:
        """The saved moving average of the weights; a checkpoint without one (saved with
        train.ema_decay = 0) starts it from the restored weights."""
        if self.ema is None:
            return
        if saved is None:
            log.warning(
                "%s holds no moving average of the weights (train.ema_decay was 0): it starts "
                "from the resumed weights",
                folder.state,
            )
            self.ema.reset(self.model)
            return
        try:
            upgrade_state(self.ema.model, saved)  # saved before a module changed its tensors
            self.ema.load_state_dict(saved)
        except (RuntimeError, KeyError, TypeError) as err:
            raise CheckpointError(
                f"{folder.state}: the moving average of the weights does not fit the model ({err})"
            ) from None

    def _fuse_optimizer_groups(self) -> None:
        """A state saved before the fused optimizer kernel brings back its groups' ``fused`` flag
        (load_state_dict restores the saved groups); switch them to the fused kernel again."""
        if not self.optimizer.defaults.get("fused"):
            return
        for group in self.optimizer.param_groups:
            if not group.get("fused"):
                group["fused"], group["foreach"] = True, None
                for param in group["params"]:
                    st = self.optimizer.state.get(param, {})
                    if torch.is_tensor(st.get("step")):
                        st["step"] = st["step"].to(param.device, torch.float32)
