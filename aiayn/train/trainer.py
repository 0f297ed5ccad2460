"""The training loop: one for every model shape (the shape is a :class:`~aiayn.train.task.Task`).

The paper's recipe (Vaswani et al. 2017, §5): token-bounded batches, Adam(0.9, 0.98, 1e-9), the
§5.3 warm-up schedule (or fairseq's inverse-sqrt), label smoothing 0.1, dropout; plus what real
runs need: gradient accumulation, clipping, bf16 autocast with fp32 master weights, validation,
keep-best, early stopping, step/epoch/time limits, non-finite-loss guards, DDP, and checkpoints
that resume to bit-identical weights (the RNG states and the data position are saved too).

Normalisation: each update's gradient is the summed loss of all its micro-batches on all processes
divided by their total target count, so one process with ``update_freq = k·n`` and ``n``
processes with ``update_freq = k`` compute the same update from the same global batch.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from aiayn.errors import AiaynError, ConfigError
from aiayn.progress import lines_above_bars
from aiayn.run_config import RunConfig, TrainConfig, micro_batches_per_update
from aiayn.train.distributed import DistContext
from aiayn.train.report import TrainReport
from aiayn.train.run_folder import RunFolder
from aiayn.train.schedule import make_schedule
from aiayn.train.setup import TrainingSetup
from aiayn.train.state import Progress, TrainState, rng_untouched
from aiayn.train.task import Task
from aiayn.train.warmup import warm_shapes

log = logging.getLogger(__name__)

__all__ = ["Trainer", "TrainingDiverged", "TrainResult"]


class TrainingDiverged(AiaynError):
    """Too many consecutive updates had a non-finite loss or gradient."""


@dataclass
class TrainResult:
    step: int
    epoch: int
    stop_reason: str
    best: float | None
    last_valid: dict[str, float] = field(default_factory=dict)


@dataclass
class _Interval:
    """Sums since the last metrics line."""

    loss: float = 0.0
    nll: float = 0.0
    targets: float = 0.0
    tokens: float = 0.0
    grad_norm: float = 0.0
    updates: int = 0
    start: float = field(default_factory=time.perf_counter)

    def add(self, loss: float, nll: float, targets: float, tokens: float, norm: float) -> None:
        self.loss += loss
        self.nll += nll
        self.targets += targets
        self.tokens += tokens
        self.grad_norm += norm
        self.updates += 1

    def record(self, head: dict[str, Any], lr: float, skipped: int, until: float | None) -> dict:
        """The metrics line: ``head`` (step, wall, epoch), then the means of the interval."""
        elapsed = max((until or time.perf_counter()) - self.start, 1e-9)
        targets = max(self.targets, 1.0)
        return {
            **head,
            "loss": self.loss / targets,
            "nll": self.nll / targets,
            "lr": lr,
            "tokens_per_s": self.tokens / elapsed,
            "grad_norm": self.grad_norm / max(self.updates, 1),
            "skipped": skipped,
        }


def _micro_batches(cfg: RunConfig, world_size: int) -> int:
    """Micro-batches per update on each process (train.update_freq or train.tokens_per_update)."""
    n = micro_batches_per_update(cfg, world_size)
    if cfg.train.tokens_per_update:
        log.info(
            "train.tokens_per_update = %d: %d micro-batches of data.max_tokens = %d on each "
            "of %d processes per update",
            cfg.train.tokens_per_update,
            n,
            cfg.data.max_tokens,
            world_size,
        )
    return n


def _time_used(progress: Progress, train: TrainConfig, wall: float) -> float:
    """The share of the time budget after the warm-up spent by ``wall`` (schedule_clock =
    "time"); the update that ends the warm-up records its wall-clock in ``progress``."""
    if train.schedule_clock != "time" or progress.step < train.warmup_steps:
        return 0.0
    if progress.warmup_wall is None:  # this update ends the warm-up
        progress.warmup_wall = wall if train.warmup_steps else 0.0
    return (wall - progress.warmup_wall) / max(train.max_time - progress.warmup_wall, 1e-9)


class Trainer:
    """Trains ``task``'s model with ``cfg.train`` into ``folder``; see the module docstring.

    Three parts: the process's set-up (:class:`~aiayn.train.setup.TrainingSetup`: allocator,
    kernel caches, device, precision, threads), the state a checkpoint holds
    (:class:`~aiayn.train.state.TrainState`: model, optimizer, counters, RNGs), and here the loop
    (:meth:`fit` -> epochs -> :meth:`update`) with validation, logging and the stopping rules.
    """

    def __init__(
        self,
        cfg: RunConfig,
        task: Task,
        folder: RunFolder,
        dist: DistContext,
        meta: dict[str, Any],
        tokenizer_json: str | None,
        resume: bool,
    ) -> None:
        self.cfg, self.task, self.folder, self.dist = cfg, task, folder, dist
        self.train_cfg = train = cfg.train
        self.meta = meta
        self.tokenizer_json = tokenizer_json
        self.setup = TrainingSetup(train, task, dist)  # before the model: the first step's memory
        self.device = dist.device
        self.state = TrainState.start(cfg, task, self.setup, folder if resume else None)
        self.model, self.optimizer = self.state.model, self.state.optimizer
        if train.compile:  # the model's forward compiled; loss and optimizer stay eager
            self.model.forward = torch.compile(self.model.forward)
        self.schedule = make_schedule(train, cfg.model.d_model)
        self.ddp = self.setup.wrap(self.model)
        self.update_freq = _micro_batches(cfg, dist.world_size)
        self._last_save_wall = self.progress.wall  # train.save_every_minutes counts from here
        self.last_valid: dict[str, float] = {}
        self.session_start = time.perf_counter()
        self._synced_wall = self.progress.wall  # the wall-clock all processes agree on
        self._report: TrainReport | None = None
        self._new_best = False  # whether the latest validation set a new best
        self._interval = _Interval()

    @property
    def progress(self) -> Progress:
        """The step counters (held by the state, which a resume replaces)."""
        return self.state.progress

    # ---- the loop ----------------------------------------------------------------------------
    def fit(self) -> TrainResult:
        """Train until a limit, early stopping or divergence; returns where it stopped."""
        with self.setup:
            self._interval = _Interval()
            if self.train_cfg.warm_shapes:  # each batch shape once, before the clock
                with rng_untouched():
                    net, seconds = self.ddp or self.model, self.train_cfg.warm_shapes
                    warm_shapes(net, self.task, self.device, self.setup.autocast, seconds)
            self.session_start = time.perf_counter()
            self._synced_wall = self.progress.wall
            report = TrainReport(
                self.train_cfg, self.progress.step, self.progress.wall, self.dist.is_main
            )
            self._report = report
            # At the start the clock reads the saved wall-clock (the same on every process), so
            # resuming a run that used up max_time trains no more.
            reason = self._limit_reached()
            with lines_above_bars(report.bar):
                try:
                    while reason is None:
                        reason = self._run_epoch()
                finally:
                    report.close()
                self._finish(reason)
        progress = self.progress
        return TrainResult(progress.step, progress.epoch, reason, progress.best, self.last_valid)

    def _run_epoch(self) -> str | None:
        progress = self.progress
        batches = self._epoch_batches(progress.epoch)
        self._epoch_len = len(batches)
        while progress.position < len(batches):
            group = batches[progress.position : progress.position + self.update_freq]
            progress.position += len(group)
            applied = self.update(group)
            if applied:
                reason = self._after_update()
                if reason is not None:
                    return reason
            elif (reason := self._limit_reached()) is not None:
                return reason
        progress.epoch, progress.position = progress.epoch + 1, 0
        return self._limit_reached()

    def _epoch_batches(self, epoch: int) -> Sequence[list[int]]:
        with rng_untouched():
            batches = self.task.epoch_batches(epoch, self.dist.rank, self.dist.world_size)
        # Every process must run the same number of updates, or DDP would wait forever.
        n = int(self.dist.all_reduce([len(batches)], op="min")[0])
        if n == 0:
            raise ConfigError(
                f"epoch {epoch} has no batches on rank {self.dist.rank}: too little "
                "data for the number of processes"
            )
        return batches[:n]

    def update(self, group: Sequence[list[int]]) -> bool:
        """One optimizer update from ``group``'s micro-batches; False when it was skipped."""
        net = self.ddp or self.model
        net.train()
        start = time.perf_counter()
        batches = [self.task.collate("train", b) for b in group]
        local = [float(sum(self.task.num_targets(b) for b in batches))]
        n_targets = max(self.dist.all_reduce(local)[0], 1.0)
        scale = self.dist.world_size / n_targets  # DDP averages gradients over processes
        # The summed loss and NLL stay on the device until one copy to the host after the
        # gradient norm: one host-device sync per update, not two per micro-batch (docs/gpu.md).
        sums = torch.zeros(2, dtype=torch.float64, device=self.device)
        tokens = 0.0
        ddp = self.ddp
        for i, batch in enumerate(batches):
            sync = ddp is None or i == len(batches) - 1
            with (
                contextlib.nullcontext() if ddp is None or sync else ddp.no_sync(),
                self.setup.autocast(),
            ):
                stats = self.task.loss(net, batch, self.device)
            (stats.loss * scale).backward()
            sums += torch.stack([stats.loss.detach(), stats.nll.detach()]).double()
            tokens += stats.n_tokens
        # A non-finite loss makes the norm non-finite too (the update is then skipped).
        loss, nll, norm = torch.cat([sums, self._grad_norm()[None].double()]).tolist()
        # With the sums goes each process's clock: every process then reads the same wall-clock
        # (their mean), so all stop at max_time after the same update and agree on the rate.
        loss, nll, tokens, walls = self.dist.all_reduce([loss, nll, tokens, self._wall()])
        self._synced_wall = walls / self.dist.world_size
        if not math.isfinite(loss):
            norm = math.nan
        if not (math.isfinite(loss) and math.isfinite(norm)):
            return self._skip(loss, norm)
        self.progress.step += 1
        used = _time_used(self.progress, self.train_cfg, self._synced_wall)
        lr = self.schedule(self.progress.step, used)
        for group_ in self.optimizer.param_groups:
            group_["lr"] = lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.state.ema is not None:
            self.state.ema.update(self.model)
        self.progress.bad_steps = 0
        self._interval.add(loss, nll, n_targets, tokens, norm)
        if self._report is not None:
            self._report.advance()
        self.setup.governor.record(tokens, time.perf_counter() - start)
        return True

    def _grad_norm(self) -> torch.Tensor:
        """The gradients' total norm (a 0-d tensor on the device), after clipping them to it."""
        max_norm = self.train_cfg.clip_norm if self.train_cfg.clip_norm > 0 else math.inf
        return nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)

    def _skip(self, loss: float, norm: float) -> bool:
        progress = self.progress
        self.optimizer.zero_grad(set_to_none=True)
        progress.bad_steps += 1
        progress.skipped += 1
        log.warning(
            "update %d skipped: non-finite %s (%d in a row, %d in all)",
            progress.step + 1,
            "loss" if not math.isfinite(loss) else "gradient norm",
            progress.bad_steps,
            progress.skipped,
        )
        if progress.bad_steps >= self.train_cfg.max_bad_steps:
            raise TrainingDiverged(
                f"training stopped: {progress.bad_steps} consecutive updates had a non-finite loss or "
                f"gradient (train.max_bad_steps = {self.train_cfg.max_bad_steps}); the last good "
                f"checkpoint in {self.folder.path} is intact. Lower train.lr or raise "
                "train.warmup_steps, or try precision = fp32"
            )
        return False

    # ---- after each update: log, validate, save, stop ------------------------------------
    def _due(self, every: int) -> bool:
        return every > 0 and self.progress.step % every == 0

    def _after_update(self) -> str | None:
        train = self.train_cfg
        limit = self._limit_reached()
        trained_until = time.perf_counter()  # tokens/s counts training time only
        # A metrics_every point validates too (its BLEU or accuracy needs the validation).
        due = self._due(train.valid_every) or self._due(train.metrics_every)
        validate = due or limit is not None
        reason = self._validate(final=limit is not None) if validate else None
        logged = validate or self._due(train.log_every)
        if logged:
            self._log(self.last_valid if validate else {}, trained_until)
        if validate or self._due(train.save_every) or self._save_time_due():
            self._save()
        if logged:
            self._interval.start = time.perf_counter()
        return reason or limit

    def _save_time_due(self) -> bool:
        """train.save_every_minutes have passed since the last save, on the clock every process
        agrees on (so all of them save at the same update)."""
        minutes = self.train_cfg.save_every_minutes
        return minutes > 0 and self._synced_wall - self._last_save_wall >= 60.0 * minutes

    def _wall(self) -> float:
        return self.progress.wall + time.perf_counter() - self.session_start

    def _limit_reached(self) -> str | None:
        progress, train = self.progress, self.train_cfg
        if train.max_steps and progress.step >= train.max_steps:
            return "max_steps"
        completed = (
            progress.epoch - 1 + int(0 < getattr(self, "_epoch_len", 0) <= progress.position)
        )
        if train.max_epochs and completed >= train.max_epochs:
            return "max_epochs"
        if train.max_time and self._synced_wall >= train.max_time:
            return "max_time"
        return None

    def _log(self, valid: dict[str, float], until: float | None = None) -> None:
        progress = self.progress
        head = {"step": progress.step, "wall": round(self._wall(), 3), "epoch": progress.epoch}
        lr = self.optimizer.param_groups[0]["lr"]
        record = {**self._interval.record(head, lr, progress.skipped, until), **valid}
        if self.dist.is_main:
            self.folder.append_metrics(record)
            if self._report is not None:
                # the clock every process agrees on: the one max_time and the schedule read
                line = {**record, "wall": self._synced_wall}
                self._report.train_line(line, self._epoch_updates_left())
                self._report.valid_line(progress.step, valid, self._new_best)
        self._interval = _Interval()

    def _epoch_updates_left(self) -> float | None:
        """Updates left until train.max_epochs (None: no such limit, or the epoch's length is
        not known yet)."""
        progress, epochs = self.progress, self.train_cfg.max_epochs
        length = getattr(self, "_epoch_len", 0)
        if not (epochs and length):
            return None
        batches = (epochs - progress.epoch) * length + length - progress.position
        return max(math.ceil(batches / self.update_freq), 0)

    # ---- validation --------------------------------------------------------------------------
    @torch.no_grad()
    def _valid_loss(self) -> dict[str, float]:
        model = self.state.folder_model  # the moving average of the weights, when kept
        model.eval()
        sums = [0.0, 0.0]
        for indices in self.task.valid_batches(self.dist.rank, self.dist.world_size):
            batch = self.task.collate("valid", indices)
            with self.setup.autocast():
                stats = self.task.loss(model, batch, self.device)
            sums[0] += stats.nll.item()
            sums[1] += stats.n_targets
        nll, n = self.dist.all_reduce(sums)
        if n == 0:
            return {}
        return {"valid_loss": nll / n, "valid_ppl": math.exp(min(nll / n, 50.0))}

    def _validate(self, final: bool = False) -> str | None:
        """Validation loss (+ BLEU when due, and at the ``final`` update of a run that measures
        it, so that best/ can be the last update), keep-best and early stopping."""
        every = self.train_cfg.metrics_every
        with rng_untouched():
            metrics = self._valid_loss()
            if self._due(every) or (final and every > 0):
                extra = None
                if self.dist.is_main:
                    model = self.state.folder_model
                    model.eval()
                    with torch.no_grad(), self.setup.autocast():
                        extra = self.task.valid_metrics(model, self.progress.step)
                metrics.update(self.dist.broadcast(extra))
        self.last_valid = metrics
        best = self.progress.best
        reason = self._track_best(metrics)
        self._new_best = self.progress.best != best
        return reason

    def _track_best(self, metrics: dict[str, float]) -> str | None:
        progress, train = self.progress, self.train_cfg
        value = metrics.get(train.best_metric)
        if value is None:
            return None
        if progress.new_best(value, lower_is_better=train.best_metric == "valid_loss"):
            if self.dist.is_main:
                meta, kind = self.meta, self.task.kind
                self.state.save_best(self.folder.best, value, kind, self.tokenizer_json, meta)
            return None
        if train.patience and progress.bad_valid >= train.patience:
            log.info(
                "early stopping: %s has not improved for %d validations (best %.4f)",
                train.best_metric,
                progress.bad_valid,
                progress.best,
            )
            return "early_stopping"
        return None

    # ---- checkpoints -------------------------------------------------------------------------
    def _save(self) -> None:
        self.state.save(self.folder, self._wall())  # all ranks call it
        self._saved_step = self.progress.step
        self._last_save_wall = self._synced_wall

    def _finish(self, reason: str) -> None:
        """Validate, log and save the final step unless that already happened."""
        progress = self.progress
        log.info("stopping at step %d (%s)", progress.step, reason)
        if progress.step == 0:
            return
        if self._interval.updates:  # stopped without passing through _after_update (time limit)
            self._validate(final=True)
            self._log(self.last_valid)
        if getattr(self, "_saved_step", None) != progress.step:
            self._save()
