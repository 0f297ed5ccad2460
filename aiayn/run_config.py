"""The run configuration: ``[model]``, ``[data]``, ``[train]`` and ``[decode]`` sections of one TOML file.

One config system (:mod:`aiayn.config`): the TOML file is flattened to dotted keys
(``train.lr``) and applied with :func:`aiayn.config.apply_overrides`, exactly as
``--set train.lr=5e-4`` is. ``[model]`` may name a ``preset`` (``tiny``, ``base`` …) that the
other model keys then override. Defaults are the paper's recipe (Vaswani et al. 2017, §5).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from aiayn.config import ModelConfig, apply_overrides, flatten_keys, parse_override, to_dict
from aiayn.data.batching import padded_width
from aiayn.data.config import DataConfig
from aiayn.data.registry import cache_dir
from aiayn.decode.config import DecodeConfig
from aiayn.errors import ConfigError
from aiayn.kinds import get_kind, kinds_taking

log = logging.getLogger(__name__)

__all__ = [
    "TrainConfig",
    "RunConfig",
    "load_run_config",
    "micro_batches_per_update",
    "build_run_config",
    "check_run_config",
    "warn_run_config",
    "parse_sets",
    "data_keys",
    "run_config_from_dict",
    "run_config_to_dict",
]


@dataclass(frozen=True)
class TrainConfig:
    """How to optimise (Vaswani et al. 2017, §5.3–5.4) and how to run and checkpoint."""

    # Label smoothing ε of the cross-entropy (§5.4, 0.1); padding is never a target.
    label_smoothing: float = 0.1
    # Classification only: adversarial training (Miyato et al. 2017), the L2 norm of the
    # perturbation of each text's token embeddings, added along the loss gradient; 0 = off.
    adversarial_eps: float = 0.0
    # R-Drop (Liang et al. 2021), translation and classification: each batch runs through the
    # model twice (other dropout masks) and the loss adds alpha times the symmetric KL divergence
    # of the two predictions (their Eq. 3, halved: the logged loss stays one cross-entropy, and
    # alpha means what it means there and in fairseq's rdrop_alpha); doubles the compute of a
    # step. 0 = off.
    rdrop_alpha: float = 0.0
    # An exponential moving average of the weights, updated after every update with this decay
    # (timm's ModelEmaV2: ema = decay * ema + (1 - decay) * weights, from the initial weights);
    # validation, best/ and the run folder's model.safetensors then hold the average, the
    # checkpoint both. 0 = off; typical values 0.999-0.9999.
    ema_decay: float = 0.0
    # Adam's β1, β2 and ε (§5.3: 0.9, 0.98, 1e-9).
    adam_betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-9
    # Decoupled weight decay (AdamW); 0 as in the paper.
    weight_decay: float = 0.0
    # noam: the §5.3 formula scale·d_model^-0.5·min(step^-0.5, step·warmup^-1.5);
    # inverse_sqrt: fairseq's linear warmup to `lr`, then lr·sqrt(warmup/step); cosine: linear
    # warmup to `lr`, then half a cosine down to `min_lr` at `max_steps`; constant: `lr`.
    lr_schedule: Literal["noam", "inverse_sqrt", "cosine", "constant"] = "noam"
    # The §5.3 schedule's multiplier (1.0 in the paper; some codebases use 2.0).
    lr_scale: float = 1.0
    # Peak learning rate of inverse_sqrt and cosine, the rate of constant (unused by noam).
    lr: float = 5e-4
    # The rate cosine decays to at max_steps (and keeps after it).
    min_lr: float = 0.0
    # What cosine decays over: "updates" (from warmup_steps to max_steps) or "time" (from the end
    # of the warm-up to max_time seconds of training, validation included), so that the rate
    # reaches min_lr when the time budget ends on a machine of any speed, as the time-based
    # schedules of Izsak et al. 2021 and Cramming (Geiping & Goldstein 2023); "time" decays over
    # max_steps instead when that budget ends the run first. The price: the rate of an update
    # depends on the machine's speed, so a resumed run does not repeat an uninterrupted one exactly.
    schedule_clock: Literal["updates", "time"] = "updates"
    # Warm-up updates (§5.3: 4000).
    warmup_steps: int = 4000
    # Learning rate at update 0 of inverse_sqrt's linear warm-up (fairseq's warmup_init_lr).
    warmup_init_lr: float = 0.0
    # Clip the global gradient L2 norm to this; 0 = no clipping (the paper does not clip).
    clip_norm: float = 0.0
    # Micro-batches (of data.max_tokens each, per process) accumulated into one update.
    update_freq: int = 1
    # Tokens per update, padding included, on the larger side of each batch (the paper, §5.1:
    # ~25,000 source + 25,000 target tokens): when > 0, update_freq is derived when a run starts
    # as ceil(tokens_per_update / (data.max_tokens × processes)), so the same recipe makes updates
    # of the same size on 1 GPU or 8 (update_freq must then be left at 1); 0 = off.
    tokens_per_update: int = 0
    # Stop after this many updates / epochs / seconds of wall-clock (summed over resumes, checked
    # after each update); 0 = no limit.
    max_steps: int = 100_000
    max_epochs: int = 0
    max_time: float = 0.0
    # Validation loss every N updates (and at the end); 0 = only at the end.
    valid_every: int = 1000
    # Validation metrics every N updates (BLEU/chrF by decoding for translation, accuracy for a
    # classifier) and at the last update; such a point validates even between valid_every
    # points; 0 = never. Was `bleu_every` (still read, with a warning).
    metrics_every: int = 0
    # Sentences of the validation set decoded for BLEU (0 = all), and the beam size (the length
    # penalty α is the run's decode.alpha, the one its model folder is decoded with).
    bleu_max_sentences: int = 500
    bleu_beam: int = 1
    # The validation metric that picks the best checkpoint (best/ folder) and drives patience.
    best_metric: Literal["valid_loss", "valid_bleu"] = "valid_loss"
    # Early stopping: stop after this many validations without a new best; 0 = never.
    patience: int = 0
    # Write a checkpoint every N updates (and at validations and the end).
    save_every: int = 1000
    # Also write one every this many minutes of training wall-clock, on every process at the
    # same update (the paper, §6.1: every 10 minutes, the last 5 or 20 averaged); 0 = off.
    save_every_minutes: float = 0.0
    # Weight snapshots kept in checkpoints/ for `aiayn average` (the paper averages 5).
    keep_last: int = 5
    # Every N updates: a metrics.jsonl line, and a progress line on stderr (loss, lr, tokens/s,
    # elapsed, ETA; -q silences it).
    log_every: int = 100
    # Stop when this many consecutive updates had a non-finite loss or gradient (each is skipped).
    max_bad_steps: int = 10
    # A model folder (e.g. a masked_lm run's best/ or an `aiayn average` output) whose tokenizer
    # this run uses and whose weights of the same name and shape start this model (the rest is
    # initialised as usual); "" = train from scratch. Ignored by --resume.
    init_from: str = ""
    # A fine-tune recipe: refuse to start without train.init_from, rather than train its model
    # from scratch at a fine-tune's learning rate (configs/finetune.toml sets it).
    requires_init_from: bool = False
    # Parts of the model held fixed (fine-tuning, with train.init_from): "embeddings" (the token
    # embeddings, and so the output projection tied to them) and/or "encoder" (its layers). Frozen
    # parameters get no gradient and are left out of the optimizer; () = train everything.
    freeze: tuple[Literal["embeddings", "encoder"], ...] = ()
    # Seed of weight initialisation and dropout (data order has its own seed, data.seed).
    seed: int = 1
    # auto = CUDA when available, else CPU.
    device: str = "auto"
    # auto = bf16 autocast where the hardware supports it (CUDA, AMX/AVX512-BF16 CPUs), else fp32.
    # Master weights and optimizer state are fp32 either way.
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    # Seconds at most, before training starts, to run one batch of each distinct batch shape
    # forward and backward (no optimizer step, the same losses after; aiayn/train/warmup.py), so
    # that a GPU's first sight of each shape is paid up front, with data.bucket_widths. 0 = off.
    warm_shapes: float = 0.0
    # torch.compile the model's forward pass (the loss, the optimizer and decoding stay eager): a
    # graph per batch shape, then one with dynamic sizes, compiled in the first updates (or in
    # train.warm_shapes). Dropout then draws from the compiler's own generator: other masks than
    # an eager run of the same seed. Not yet measured on a GPU (issue 57): off by default.
    compile: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ConfigError naming the field when a value makes no sense."""
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(
                f"train.label_smoothing must be in [0, 1), got {self.label_smoothing}"
            )
        if not all(0.0 <= b < 1.0 for b in self.adam_betas) or len(self.adam_betas) != 2:
            raise ConfigError(
                f"train.adam_betas must be two numbers in [0, 1), got {self.adam_betas}"
            )
        for name in ("update_freq", "keep_last", "log_every", "max_bad_steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        for name in _NOT_NEGATIVE:
            if getattr(self, name) < 0:
                raise ConfigError(f"train.{name} must be >= 0, got {getattr(self, name)}")
        self._check_schedule()
        if self.tokens_per_update and self.update_freq != 1:
            raise ConfigError(
                f"train.tokens_per_update ({self.tokens_per_update}) derives update_freq; "
                f"leave train.update_freq at 1 (got {self.update_freq})"
            )
        if self.bleu_beam < 1:
            raise ConfigError(f"train.bleu_beam must be >= 1, got {self.bleu_beam}")
        if self.best_metric == "valid_bleu" and self.metrics_every == 0:
            raise ConfigError("train.best_metric = 'valid_bleu' needs train.metrics_every > 0")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ConfigError(f"train.ema_decay must be in [0, 1), got {self.ema_decay}")
        if self.rdrop_alpha and self.adversarial_eps:
            raise ConfigError(
                "train.rdrop_alpha and train.adversarial_eps each change the loss; set one of them"
            )
        if len(set(self.freeze)) != len(self.freeze):
            raise ConfigError(f"train.freeze names a part twice: {list(self.freeze)}")

    def _check_schedule(self) -> None:
        """The learning-rate schedule has the warm-up and the end it decays to."""
        if self.lr_schedule == "noam" and self.warmup_steps == 0:
            raise ConfigError("train.warmup_steps must be > 0 for the noam schedule")
        if self.schedule_clock == "time" and not (
            self.lr_schedule == "cosine" and self.max_time > 0
        ):
            raise ConfigError(
                "train.schedule_clock = 'time' decays lr_schedule = 'cosine' over "
                f"train.max_time; got lr_schedule = {self.lr_schedule!r}, max_time = "
                f"{self.max_time}"
            )
        if (
            self.lr_schedule == "cosine"
            and self.schedule_clock == "updates"
            and not self.warmup_steps < self.max_steps
        ):
            raise ConfigError(
                "train.lr_schedule = 'cosine' decays over train.max_steps, which must "
                f"be > warmup_steps ({self.warmup_steps}), got {self.max_steps}"
            )


#: TrainConfig's counts, rates and durations, none of which may be negative
_NOT_NEGATIVE = (
    "warmup_steps",
    "max_steps",
    "max_epochs",
    "valid_every",
    "metrics_every",
    "bleu_max_sentences",
    "patience",
    "save_every",
    "tokens_per_update",
    "adversarial_eps",
    "rdrop_alpha",
    "lr",
    "lr_scale",
    "adam_eps",
    "max_time",
    "clip_norm",
    "weight_decay",
    "warmup_init_lr",
    "min_lr",
    "save_every_minutes",
    "warm_shapes",
)


@dataclass(frozen=True)
class RunConfig:
    """Everything one training run needs; saved, fully resolved, in the run's config.json.

    ``decode`` is how the trained model should be decoded (the recipe's ``[decode]`` section):
    translate, evaluate and the server use it unless a flag overrides it.
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)


SECTIONS = ("model", "data", "train", "decode")
# Keys renamed since older run configs and model folders were written: old -> new.
RENAMED = {
    "train.bleu_every": "train.metrics_every",
    "data.task": "data.kind",
    "decode.max_tokens": "decode.batch_tokens",
}
# Keys no longer read, and why: dropped with one warning (a model folder's: silently).
REMOVED = {
    "decode.workers": "batches decoded at once are chosen for the machine when the model runs "
    "(--workers sets them)",
    "train.bleu_alpha": "validation BLEU decodes with decode.alpha, the run's own length penalty",
    "train.progress": "the progress bar shows on a terminal; -q hides it",
}


def renamed_keys(
    values: dict[str, Any], where: str = "config", *, warn: bool = True
) -> dict[str, Any]:
    """``values`` (dotted keys) with renamed keys under their new name and removed ones
    (:data:`REMOVED`) left out, one logged warning line per key (the new name wins when both are
    given). ``warn=False`` (a model folder written by an
    older aiayn, which its user cannot fix and need not) maps them with a debug line only."""
    out = dict(values)
    level = logging.WARNING if warn else logging.DEBUG
    for old, new in RENAMED.items():
        if old in out:
            log.log(level, "%s: '%s' is now called '%s'", where, old, new)
            out.setdefault(new, out.pop(old))
    for old, why in REMOVED.items():
        if old in out:
            log.log(level, "%s: '%s' is ignored: %s", where, old, why)
            del out[old]
    return out


def data_keys(data: dict[str, Any], where: str) -> dict[str, Any]:
    """A recipe's ``[data]`` keys (or ``--set`` ones, with or without the ``data.`` prefix) under
    their current names, a renamed one warned about once (``data.task`` is ``data.kind``)."""
    flat = flatten_keys({k.removeprefix("data."): v for k, v in data.items()}, "data.")
    return {k.removeprefix("data."): v for k, v in renamed_keys(flat, where).items()}


def _read_toml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: not valid TOML ({err})") from None


def build_run_config(values: dict[str, Any], where: str = "config") -> RunConfig:
    """A RunConfig from dotted keys; ``model.preset`` picks the base model config. ``where``
    (the recipe's path) names the source in the warning about a renamed key."""
    values = renamed_keys(values, where)
    preset = values.pop("model.preset", None)
    base = RunConfig()
    if preset is not None:
        if not isinstance(preset, str):
            raise ConfigError(f"model.preset: expected a string, got {preset!r}")
        base = dataclasses.replace(base, model=ModelConfig.preset(preset))
    cfg = apply_overrides(base, values)
    check_run_config(cfg)
    return cfg


def micro_batches_per_update(cfg: RunConfig, world_size: int) -> int:
    """How many micro-batches each of ``world_size`` processes accumulates into one update:
    train.update_freq, or derived from train.tokens_per_update (see TrainConfig)."""
    tokens = cfg.train.tokens_per_update
    if not tokens:
        return cfg.train.update_freq
    return max(1, math.ceil(tokens / (cfg.data.max_tokens * world_size)))


def warn_run_config(cfg: RunConfig) -> None:
    """Advice on a config that is valid but probably not meant: logged once, when a run starts
    (:func:`aiayn.train.task.build_task`), not at every read as :func:`check_run_config` is."""
    t = cfg.train
    if t.max_steps and t.warmup_steps >= t.max_steps and t.lr_schedule != "constant":
        log.warning(
            "train.warmup_steps (%d) >= train.max_steps (%d): the run ends before its learning "
            "rate has warmed up",
            t.warmup_steps,
            t.max_steps,
        )


def check_run_config(cfg: RunConfig) -> None:
    """Settings of different sections that contradict each other: a ConfigError naming both,
    when the config is read (before a tokenizer is trained or a folder written)."""
    if get_kind(cfg.data.kind).tokenized:  # an image is (image_size / patch_size)² tokens
        _check_lengths(cfg.model, cfg.data)
    _check_training(cfg.train)
    _check_kind_settings(cfg)
    if cfg.model.output_vocab == "targets" and cfg.data.bpe_dropout:
        raise ConfigError(
            "model.output_vocab = 'targets' does not go with data.bpe_dropout: "
            "a noisy segmentation produces tokens the clean targets never hold"
        )
    _check_own_files(cfg.data)


def _check_lengths(m: ModelConfig, d: DataConfig) -> None:
    """The longest example fits the model's positions (padded widths too) and a batch."""
    if m.max_len < d.max_len:
        raise ConfigError(
            f"model.max_len ({m.max_len}) is below data.max_len ({d.max_len}): the longest "
            "training examples would not fit the model's positions; raise model.max_len or "
            "lower data.max_len"
        )
    padded = padded_width(d.max_len, d.pad_to_multiple, d.bucket_widths)
    if m.max_len < padded:
        raise ConfigError(
            f"model.max_len ({m.max_len}) is below data.max_len ({d.max_len}) padded to "
            + (
                f"its data.bucket_widths bucket, {padded}"
                if d.bucket_widths
                else f"data.pad_to_multiple ({d.pad_to_multiple}), {padded}"
            )
            + ": the widest padded batches "
            "would not fit the model's positions; raise model.max_len or lower data.max_len"
        )
    if d.max_tokens < d.max_len:
        raise ConfigError(
            f"data.max_tokens ({d.max_tokens}) is below data.max_len ({d.max_len}): a batch "
            "could not hold the longest example"
        )


def _check_training(t: TrainConfig) -> None:
    """The run stops, patience has validations to count, the schedule's rates are in order."""
    if t.max_steps == 0 and t.max_epochs == 0 and t.max_time == 0:
        raise ConfigError(
            "train.max_steps, max_epochs and max_time are all 0: the run would never stop; "
            "set one of them"
        )
    if t.patience and not t.valid_every and not t.metrics_every:
        raise ConfigError(
            "train.patience counts validations, but train.valid_every = 0 validates only at "
            "the end; set train.valid_every"
        )
    if t.lr_schedule == "cosine" and t.min_lr > t.lr:
        raise ConfigError(
            f"train.min_lr ({t.min_lr}) is above train.lr ({t.lr}): cosine decays from lr to min_lr"
        )
    if t.lr_schedule == "inverse_sqrt" and t.warmup_init_lr > t.lr:
        raise ConfigError(
            f"train.warmup_init_lr ({t.warmup_init_lr}) is above train.lr ({t.lr}): the "
            "warm-up rises from warmup_init_lr to lr"
        )


# The run-level settings that only some kinds take (aiayn.kinds.SETTINGS): the setting's name
# there, whether a config sets it, and the error ({able}: the kinds that take it; {kind}: the
# config's; {long_examples}, {output_vocab}: the config's values).
_KIND_SETTINGS: tuple[tuple[str, Callable[[RunConfig], bool], str], ...] = (
    (
        "bleu",
        lambda c: c.train.best_metric == "valid_bleu",
        "train.best_metric = 'valid_bleu' needs data.kind = {able}, not '{kind}'",
    ),
    (
        "long_examples",
        lambda c: c.data.long_examples != "filter",
        "data.long_examples = '{long_examples}' applies to classification texts, "
        "not data.kind = '{kind}'",
    ),
    (
        "bleu",
        lambda c: bool(c.train.metrics_every) and c.train.bleu_beam > 1,
        "train.bleu_beam applies to data.kind = {able}, not '{kind}'",
    ),
    (
        "adversarial_eps",
        lambda c: c.train.adversarial_eps > 0,
        "train.adversarial_eps applies to data.kind = {able} only, not '{kind}'",
    ),
    (
        "rdrop",
        lambda c: c.train.rdrop_alpha > 0,
        "train.rdrop_alpha applies to data.kind = {able} only, not '{kind}'",
    ),
    (
        "output_vocab",
        lambda c: c.model.output_vocab != "all",
        "model.output_vocab = '{output_vocab}' applies to data.kind = {able} only, not '{kind}'",
    ),
)


def _check_kind_settings(cfg: RunConfig) -> None:
    """ConfigError when the config sets what its kind does not take (the kind says what it
    takes: :attr:`aiayn.kinds.Kind.takes`)."""
    kind = get_kind(cfg.data.kind)
    for setting, is_set, message in _KIND_SETTINGS:
        if is_set(cfg) and setting not in kind.takes:
            raise ConfigError(
                message.format(
                    able=kinds_taking(setting),
                    kind=kind.name,
                    long_examples=cfg.data.long_examples,
                    output_vocab=cfg.model.output_vocab,
                )
            )


def _check_own_files(d: DataConfig) -> None:
    """The user's files given are those the kind's data source reads (data.train_src/train_tgt
    for sentence pairs, data.train_file for texts)."""
    reads = get_kind(d.kind).data_files
    files = ("src", "tgt", "file", "dir")
    given = [f"{split}_{f}" for split in ("train", "valid") for f in files]
    wrong = [key for key in given if getattr(d, key) and key.split("_")[1] not in reads]
    if wrong:
        wanted = "/".join(f"train_{f}" for f in reads)
        raise ConfigError(f"data.kind = '{d.kind}' reads data.{wanted}, not data.{wrong[0]}")


def load_run_config(
    path: str | Path | None, overrides: Sequence[str] = ()
) -> tuple[RunConfig, dict[str, Any]]:
    """Read a TOML run config and apply ``--set section.key=value`` overrides.

    Returns the config and the dotted keys that produced it (``model.preset`` included), so that a
    later step (the vocabulary size known after the tokenizer is trained) can rebuild it.
    """
    values: dict[str, Any] = {}
    if path is not None:
        table = _read_toml(Path(path))
        for name, section in table.items():
            if not isinstance(section, dict):
                raise ConfigError(
                    f"{path}: '{name}' must be a [section] (model, data, train or decode), "
                    "not a bare key"
                )
        values = flatten_keys(table)
    values.update(parse_sets(overrides))
    values = renamed_keys(values, str(path) if path is not None else "--set")
    return build_run_config(values), values


def parse_sets(overrides: Sequence[str]) -> dict[str, str]:
    """``["train.lr=1e-3", …]`` -> ``{"train.lr": "1e-3", …}``; every key names its section."""
    values = {}
    for text in overrides:
        key, value = parse_override(text)
        if "." not in key:
            raise ConfigError(f"--set {text}: name the section, e.g. train.{key} or model.{key}")
        values[key] = value
    return values


def run_config_from_dict(data: dict[str, Any], where: str = "config.json") -> RunConfig:
    """Rebuild the RunConfig saved in a run's config.json (extra top-level keys are ignored; a
    missing section takes its defaults)."""
    sections = {k: data[k] for k in SECTIONS if k in data}
    return apply_overrides(RunConfig(), renamed_keys(flatten_keys(sections), where, warn=False))


def run_config_to_dict(cfg: RunConfig) -> dict[str, Any]:
    out = {name: to_dict(getattr(cfg, name)) for name in SECTIONS}
    for key in REMOVED:  # settings of the machine a model runs on, not of the model
        section, name = key.split(".")
        out[section].pop(name, None)
    return out


def run_inputs(cfg: RunConfig) -> list[Path]:
    """What a run reads besides its config file: its own data files (``data.train_src``, …,
    ``data.valid_file``), the downloaded datasets (``$AIAYN_CACHE/datasets``) when it reads a
    registered one, ``train.init_from``."""
    data = cfg.data
    paths = [Path(name) for name in data.own_files]
    if not data.uses_own_files:
        paths.append(cache_dir() / "datasets")
    if cfg.train.init_from:
        paths.append(Path(cfg.train.init_from))
    return paths
