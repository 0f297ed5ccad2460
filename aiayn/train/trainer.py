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
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from aiayn.checkpoint import init_from_model_dir, load_weights, save_model_dir
from aiayn.errors import AiaynError, CheckpointError, ConfigError
from aiayn.memory import keep_freed_memory
from aiayn.run_config import RunConfig, micro_batches_per_update
from aiayn.threads import ThreadGovernor, threads_for_load
from aiayn.train.allocator import cache_cpu_kernels, kernel_cache_capacity
from aiayn.train.distributed import DistContext, resolve_precision
from aiayn.train.run_folder import RunFolder
from aiayn.train.schedule import make_schedule
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
class _Progress:
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


def _rng_state() -> dict[str, Any]:
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


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate((3, tuple(state["python"]), state["python_gauss"]))
    keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state(("MT19937", keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


@contextlib.contextmanager
def _rng_untouched() -> Iterator[None]:
    """Whatever runs inside (batching, validation) leaves the global RNGs as they were."""
    saved = _rng_state()
    try:
        yield
    finally:
        _set_rng_state(saved)


class Trainer:
    """Trains ``task``'s model with ``cfg.train`` into ``folder``; see the module docstring."""

    def __init__(
        self,
        cfg: RunConfig,
        task: Task,
        folder: RunFolder,
        dist: DistContext,
        meta: dict[str, Any],
        tokenizer_json: str,
        resume: bool,
    ) -> None:
        self.cfg, self.task, self.folder, self.dist = cfg, task, folder, dist
        self.governor = ThreadGovernor(active=False)  # fit() starts the real one
        self.train_cfg = cfg.train
        self.meta = meta
        self.tokenizer_json = tokenizer_json
        self.device = dist.device
        if self.device.type == "cpu":
            keep_freed_memory()  # no page faults for memory freed by the previous step
            self._cache_kernels()
        self.autocast_dtype = resolve_precision(self.train_cfg.precision, self.device)
        torch.manual_seed(self.train_cfg.seed)
        self.model = task.build_model(cfg.model).to(self.device)
        if self.train_cfg.init_from and not resume:
            self._init_from(self.train_cfg.init_from)
        if self.train_cfg.compile:  # the model's forward compiled; loss and optimizer stay eager
            self.model.forward = torch.compile(self.model.forward)
        self.optimizer = self._build_optimizer()
        self.schedule = make_schedule(self.train_cfg, cfg.model.d_model)
        self.progress = _Progress()
        if resume:
            self._restore()
        else:
            # Processes share the initial weights (seed) but each draws its own dropout masks.
            torch.manual_seed(self.train_cfg.seed + 1_000_003 * dist.rank)
        self.ddp = (
            DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None
            )
            if dist.active
            else None
        )
        self.update_freq = micro_batches_per_update(cfg, dist.world_size)
        if self.train_cfg.tokens_per_update:
            log.info(
                "train.tokens_per_update = %d: %d micro-batches of data.max_tokens = %d on each "
                "of %d processes per update",
                self.train_cfg.tokens_per_update,
                self.update_freq,
                cfg.data.max_tokens,
                dist.world_size,
            )
        self._last_save_wall = self.progress.wall  # train.save_every_minutes counts from here
        self.last_valid: dict[str, float] = {}
        self.session_start = time.perf_counter()
        self._synced_wall = self.progress.wall  # the wall-clock all processes agree on
        self._bar: Any = None
        self._interval = _Interval()

    # ---- construction ------------------------------------------------------------------------
    def _cache_kernels(self) -> None:
        """oneDNN's kernel caches sized for the run's batch shapes (aiayn/train/allocator.py)."""
        shapes = self.task.batch_shapes(self.dist.rank, self.dist.world_size)
        capacity = kernel_cache_capacity(shapes)
        if cache_cpu_kernels(capacity):
            log.info(
                "oneDNN kernel caches: %d kernels (an epoch has %s batch shapes)",
                capacity,
                "uncounted" if shapes is None else f"{shapes:,}",
            )

    def _build_optimizer(self) -> torch.optim.Optimizer:
        train = self.train_cfg
        opt = torch.optim.AdamW if train.weight_decay > 0 else torch.optim.Adam
        # The fused kernel: one pass over each parameter instead of ~10 foreach passes (BASE,
        # 60 M parameters, 2 threads here: 37 ms against 160 ms a step); the same update.
        self.fused_optimizer = self.device.type in ("cpu", "cuda")
        return opt(
            self.model.parameters(),
            lr=0.0,
            betas=(train.adam_betas[0], train.adam_betas[1]),
            eps=train.adam_eps,
            weight_decay=train.weight_decay,
            fused=self.fused_optimizer,
        )

    def _init_from(self, folder: str) -> None:
        copied, fresh = init_from_model_dir(self.model, folder)
        log.info(
            "train.init_from: %d tensors from %s; initialised here: %s",
            len(copied),
            folder,
            ", ".join(fresh) or "none",
        )

    def _fuse_optimizer_groups(self) -> None:
        """A state saved before the fused optimizer kernel brings back its groups' ``fused`` flag
        (load_state_dict restores the saved groups); switch them to the fused kernel again."""
        for group in self.optimizer.param_groups:
            if self.fused_optimizer and not group.get("fused"):
                group["fused"], group["foreach"] = True, None
                for param in group["params"]:
                    st = self.optimizer.state.get(param, {})
                    if torch.is_tensor(st.get("step")):
                        st["step"] = st["step"].to(param.device, torch.float32)

    def _restore(self) -> None:
        state = self.folder.load_state()
        snapshot = self.folder.checkpoints / state["snapshot"]
        self.folder.check_parts(snapshot, self.cfg.model)  # config.json edited since?
        load_weights(self.model, snapshot)
        try:
            self.optimizer.load_state_dict(state["optimizer"])
        except (ValueError, KeyError, RuntimeError) as err:
            raise CheckpointError(
                f"{self.folder.state}: optimizer state does not fit the model ({err})"
            ) from None
        self._fuse_optimizer_groups()
        try:
            self.progress = _Progress(**state["progress"])
            rngs = state["rng"]
            _set_rng_state(rngs[self.dist.rank % len(rngs)])
        except (TypeError, KeyError, ValueError, RuntimeError, IndexError) as err:
            raise CheckpointError(
                f"{self.folder.state}: not an aiayn trainer state ({err})"
            ) from None
        if len(rngs) != self.dist.world_size:
            log.warning(
                "resuming with %d processes, the checkpoint had %d: dropout masks and the "
                "data order will differ from an uninterrupted run",
                self.dist.world_size,
                len(rngs),
            )
        if self.dist.is_main:
            self.folder.discard_after(self.progress.step)
        log.info(
            "resumed %s at step %d (epoch %d)", self.folder.path, state["step"], state["epoch"]
        )

    # ---- the loop ----------------------------------------------------------------------------
    def fit(self) -> TrainResult:
        """Train until a limit, early stopping or divergence; returns where it stopped."""
        self._bar = self._progress_bar()
        self._interval = _Interval()
        self.governor = self._thread_governor()
        if self.train_cfg.warm_shapes:  # each batch shape once, before the clock (warmup.py)
            with _rng_untouched():
                net, seconds = self.ddp or self.model, self.train_cfg.warm_shapes
                warm_shapes(net, self.task, self.device, self._autocast, seconds)
        self.session_start = time.perf_counter()
        self._synced_wall = self.progress.wall
        # The time limit is checked after updates; at the start only the saved wall-clock counts
        # (the same on every process), so resuming a run that used up max_time trains no more.
        reason = self._limit_reached(check_time=False)
        if (
            reason is None
            and self.train_cfg.max_time
            and self.progress.wall >= self.train_cfg.max_time
        ):
            reason = "max_time"
        try:
            while reason is None:
                reason = self._run_epoch()
        finally:
            if self._bar is not None:
                self._bar.close()
        self._finish(reason)
        progress = self.progress
        return TrainResult(progress.step, progress.epoch, reason, progress.best, self.last_valid)

    def _thread_governor(self) -> Any:
        """On the CPU: threads for the load now, then re-measured now and then (aiayn/threads.py);
        nothing when the user set a thread count."""
        governor = ThreadGovernor(active=self.device.type == "cpu")
        if governor.active:
            threads_for_load()
            governor.current = torch.get_num_threads()
        return governor

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
        with _rng_untouched():
            batches = self.task.epoch_batches(epoch, self.dist.rank, self.dist.world_size)
        # Every process must run the same number of updates, or DDP would wait forever.
        n = int(self.dist.all_reduce([len(batches)], op="min")[0])
        if n == 0:
            raise ConfigError(
                f"epoch {epoch} has no batches on rank {self.dist.rank}: too little "
                "data for the number of processes"
            )
        return batches[:n]

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

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
                self._autocast(),
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
        lr = self.schedule(self.progress.step, self._time_used())
        for group_ in self.optimizer.param_groups:
            group_["lr"] = lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.progress.bad_steps = 0
        self._count(loss, nll, n_targets, tokens, norm)
        self.governor.record(tokens, time.perf_counter() - start)
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

    def _count(self, loss: float, nll: float, targets: float, tokens: float, norm: float) -> None:
        interval = self._interval
        interval.loss += loss
        interval.nll += nll
        interval.targets += targets
        interval.tokens += tokens
        interval.grad_norm += norm
        interval.updates += 1
        if self._bar is not None:
            self._bar.update(1)

    # ---- after each update: log, validate, save, stop ------------------------------------
    def _due(self, every: int) -> bool:
        return every > 0 and self.progress.step % every == 0

    def _after_update(self) -> str | None:
        train = self.train_cfg
        limit = self._limit_reached()
        trained_until = time.perf_counter()  # tokens/s counts training time only
        validate = self._due(train.valid_every) or limit is not None
        reason = self._validate() if validate else None
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

    def _time_used(self) -> float:
        """The share of the time budget after the warm-up spent so far (schedule_clock = "time")."""
        progress, train = self.progress, self.train_cfg
        if train.schedule_clock != "time" or progress.step < train.warmup_steps:
            return 0.0
        if progress.warmup_wall is None:  # this update ends the warm-up
            progress.warmup_wall = self._synced_wall if train.warmup_steps else 0.0
        return (self._synced_wall - progress.warmup_wall) / max(
            train.max_time - progress.warmup_wall, 1e-9
        )

    def _limit_reached(self, check_time: bool = True) -> str | None:
        progress, train = self.progress, self.train_cfg
        if train.max_steps and progress.step >= train.max_steps:
            return "max_steps"
        completed = (
            progress.epoch - 1 + int(0 < getattr(self, "_epoch_len", 0) <= progress.position)
        )
        if train.max_epochs and completed >= train.max_epochs:
            return "max_epochs"
        if check_time and train.max_time and self._synced_wall >= train.max_time:
            return "max_time"
        return None

    def _log(self, valid: dict[str, float], until: float | None = None) -> None:
        interval, progress = self._interval, self.progress
        elapsed = max((until or time.perf_counter()) - interval.start, 1e-9)
        targets = max(interval.targets, 1.0)
        record = {
            "step": progress.step,
            "wall": round(self._wall(), 3),
            "epoch": progress.epoch,
            "loss": interval.loss / targets,
            "nll": interval.nll / targets,
            "lr": self.optimizer.param_groups[0]["lr"],
            "tokens_per_s": interval.tokens / elapsed,
            "grad_norm": interval.grad_norm / max(interval.updates, 1),
            "skipped": progress.skipped,
            **valid,
        }
        if self.dist.is_main:
            self.folder.append_metrics(record)
            if self._bar is not None:
                self._bar.set_postfix(
                    loss=f"{record['loss']:.3f}",
                    lr=f"{record['lr']:.2e}",
                    tok_s=f"{record['tokens_per_s']:.0f}",
                    refresh=False,
                )
        self._interval = _Interval()

    # ---- validation --------------------------------------------------------------------------
    @torch.no_grad()
    def _valid_loss(self) -> dict[str, float]:
        self.model.eval()
        sums = [0.0, 0.0]
        for indices in self.task.valid_batches(self.dist.rank, self.dist.world_size):
            batch = self.task.collate("valid", indices)
            with self._autocast():
                stats = self.task.loss(self.model, batch, self.device)
            sums[0] += stats.nll.item()
            sums[1] += stats.n_targets
        nll, n = self.dist.all_reduce(sums)
        if n == 0:
            return {}
        return {"valid_loss": nll / n, "valid_ppl": math.exp(min(nll / n, 50.0))}

    def _validate(self) -> str | None:
        """Validation loss (+ BLEU when due), keep-best and early stopping."""
        with _rng_untouched():
            metrics = self._valid_loss()
            if self._due(self.train_cfg.metrics_every):
                extra = None
                if self.dist.is_main:
                    self.model.eval()
                    with torch.no_grad(), self._autocast():
                        extra = self.task.valid_metrics(self.model, self.progress.step)
                metrics.update(self.dist.broadcast(extra))
        self.last_valid = metrics
        self._valid_step = self.progress.step
        return self._track_best(metrics)

    def _track_best(self, metrics: dict[str, float]) -> str | None:
        progress, train = self.progress, self.train_cfg
        value = metrics.get(train.best_metric)
        if value is None:
            return None
        better = progress.best is None or (
            value < progress.best if train.best_metric == "valid_loss" else value > progress.best
        )
        if better:
            progress.best, progress.bad_valid = value, 0
            if self.dist.is_main:
                self._save_best(value)
            return None
        progress.bad_valid += 1
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
    def _state(self) -> dict[str, Any]:
        progress = self.progress
        progress_state = {k: v for k, v in vars(progress).items()}
        progress_state["wall"] = self._wall()
        return {
            "step": progress.step,
            "epoch": progress.epoch,
            "position": progress.position,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": {"name": self.train_cfg.lr_schedule, "step": progress.step},
            "rng": self.dist.gather(_rng_state()),
            "progress": progress_state,
            "world_size": self.dist.world_size,
        }

    def _save(self) -> None:
        state = self._state()  # collective (RNG states of every process): all ranks call it
        if self.dist.is_main:
            self.folder.save_checkpoint(self.model, state, self.train_cfg.keep_last)
        self._saved_step = self.progress.step
        self._last_save_wall = self._synced_wall

    def _save_best(self, value: float) -> None:
        extra = {k: v for k, v in self.meta.items() if k not in ("kind", "model")}
        save_model_dir(
            self.folder.best,
            self.model,
            self.cfg.model,
            kind=self.task.kind,
            tokenizer_json=self.tokenizer_json,
            extra={
                **extra,
                "best": {"step": self.progress.step, self.train_cfg.best_metric: value},
            },
            overwrite=True,  # this run's own best/ (prepare refused a folder holding another)
        )

    def _finish(self, reason: str) -> None:
        """Validate, log and save the final step unless that already happened."""
        progress = self.progress
        log.info("stopping at step %d (%s)", progress.step, reason)
        if progress.step == 0:
            return
        if self._interval.updates:  # stopped without passing through _after_update (time limit)
            self._validate()
            self._log(self.last_valid)
        if getattr(self, "_saved_step", None) != progress.step:
            self._save()

    def _progress_bar(self) -> Any:
        if not (self.train_cfg.progress and self.dist.is_main):
            return None
        total = self.train_cfg.max_steps or None
        return tqdm(
            total=total,
            initial=self.progress.step,
            desc="train",
            unit="upd",
            dynamic_ncols=True,
            leave=False,
        )
