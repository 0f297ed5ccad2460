"""``train_run``: config + run folder -> a trained run. What ``aiayn train`` calls.

Handles what surrounds the loop: joining the process group, checking the run folder, restoring
the tokenizer and config on ``--resume`` (refusing a config whose model or data differ), writing
the resolved config.json and tokenizer.json, and turning a failure on rank 0 into the same error on
every rank (so no process waits forever).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Collection
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, TypeVar

import aiayn.errors as errors
from aiayn import __version__
from aiayn.card import write_model_card
from aiayn.config import ModelConfig, flatten_keys
from aiayn.data.config import OWN_FILE_KEYS
from aiayn.decode.config import DecodeConfig, merge_decode
from aiayn.env import hardware_name
from aiayn.errors import AiaynError, ConfigError
from aiayn.folder.config import CONFIG_FILE, FolderConfig, read_folder_config
from aiayn.folder.parts import TOKENIZER_FILE
from aiayn.io import check_not_input, recover_folder
from aiayn.kinds import KINDS, get_kind
from aiayn.run_config import RunConfig, run_config_to_dict, run_inputs
from aiayn.train.distributed import DistContext, init_distributed, shutdown_distributed
from aiayn.train.run_folder import RunFolder
from aiayn.train.task import Task, build_task
from aiayn.train.trainer import Trainer, TrainResult

log = logging.getLogger(__name__)

T = TypeVar("T")

__all__ = ["train_run", "resume_config", "config_differences", "init_model", "FREE_MODEL_KEYS"]


def _on_main(dist: DistContext, fn: Callable[[], T]) -> T:
    """Run ``fn`` on rank 0 and hand its result (or its user error) to every rank."""
    result: Any = None
    error: str | None = None
    if dist.is_main:
        try:
            result = fn()
        except AiaynError as err:
            error = f"{type(err).__name__}:{err}"
            if not dist.active:
                raise
    result, error = dist.broadcast((result, error))
    if error is not None:
        name, _, message = error.partition(":")
        raise getattr(errors, name, AiaynError)(message)
    return result


def config_differences(
    old: dict[str, Any], new: dict[str, Any], sections: tuple[str, ...]
) -> list[str]:
    """``section.key: old -> new`` for every key of ``sections`` that differs."""
    a = flatten_keys({s: old.get(s, {}) for s in sections})
    b = flatten_keys({s: new.get(s, {}) for s in sections})
    return [
        f"{k}: run has {a.get(k)!r}, config says {b.get(k)!r}"
        for k in sorted(set(a) | set(b))
        if _norm(a.get(k)) != _norm(b.get(k))
    ]


def _norm(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def check_data_files(cfg: RunConfig, resume: bool) -> None:
    """ConfigError naming the first of the run's own data files that is missing, and the key
    that names it; on ``--resume``, how to give the file's place now."""
    data = cfg.data
    for key in OWN_FILE_KEYS:
        path = getattr(data, key)
        folder = key.endswith("_dir")  # a folder of images, one subfolder per class
        if path and not (Path(path).is_dir() if folder else Path(path).is_file()):
            hint = f"; --set data.{key}=PATH gives its place now" if resume else ""
            what = "folder" if folder else "file"
            raise ConfigError(f"{path}: no such {what} (data.{key}{hint})")


def _check_resume(folder: RunFolder, new: dict[str, Any]) -> None:
    old = run_config_to_dict(resume_config(folder.path))
    for key in OWN_FILE_KEYS:  # where the files are (moved data): the user's to say, logged
        if old.get("data", {}).get(key) != new.get("data", {}).get(key):
            log.info("resume: data.%s now %s", key, new.get("data", {}).get(key))
            old.setdefault("data", {})[key] = new.get("data", {}).get(key)
    diffs = config_differences(old, new, ("model", "data"))
    if diffs:
        raise ConfigError(
            f"--resume: the config differs from the run in {folder.path} in what shapes the model "
            f"or its data: {'; '.join(diffs[:5])}" + (" …" if len(diffs) > 5 else "")
        )
    changed = config_differences(old, new, ("train", "decode"))
    for line in changed:
        log.info("resume: changed %s", line)


# Model settings that change what a weight means without changing its shape.
_MEANING = ("activation", "norm_first", "scale_embeddings", "positional", "n_heads")
# Data settings that the tokenizer of train.init_from fixes instead.
_TOKENIZER_KEYS = ("tokenizer", "vocab_size", "lowercase")


# What a fine-tune may set in [model] (regularisation): every other model setting is the init
# folder's, because it fixes the shape or the meaning of a weight, and a different value is refused.
FREE_MODEL_KEYS = ("dropout", "attention_dropout", "activation_dropout")


def init_folder(cfg: RunConfig) -> FolderConfig:
    """The config of the model folder ``train.init_from``, checked: a model folder (not an
    export) of the run's kind, or of a kind pre-trained on the run's data (masked_lm for a
    classifier). ConfigError otherwise, in one line."""
    folder = Path(cfg.train.init_from)
    parsed = read_folder_config(folder)
    if parsed.format is not None:
        raise ConfigError(
            f"train.init_from: {folder} is an export ({parsed.format}); start from the model "
            "folder it was exported from"
        )
    kind = cfg.data.kind
    if parsed.kind != kind and KINDS[parsed.kind].reads != kind:
        raise ConfigError(
            f"train.init_from: {folder} holds a '{parsed.kind}' model; a '{kind}' run "
            f"(data.kind) starts from a '{kind}' model"
        )
    return parsed


def init_model(
    cfg: RunConfig, parsed: FolderConfig, model_keys: Collection[str] | None
) -> ModelConfig:
    """The model section of a run that fine-tunes a folder of its own kind: the folder's, with
    the regularisation (:data:`FREE_MODEL_KEYS`) that the run's config sets. ``model_keys``: the
    model settings the config sets (None: those that differ from the defaults); one that
    contradicts the folder is refused, naming it."""
    here, there = cfg.model, parsed.config.model
    if model_keys is None:
        default = ModelConfig()
        model_keys = [
            f.name for f in fields(ModelConfig) if getattr(here, f.name) != getattr(default, f.name)
        ]
    for key in sorted(model_keys):
        if key not in FREE_MODEL_KEYS and getattr(here, key) != getattr(there, key):
            raise ConfigError(
                f"model.{key}: {getattr(here, key)!r} here but {getattr(there, key)!r} in "
                f"{cfg.train.init_from}; a fine-tune keeps what its weights mean and their "
                f"shapes: leave model.{key} unset"
            )
    free = {key: getattr(here, key) for key in FREE_MODEL_KEYS if key in model_keys}
    return replace(there, **free)


def init_decode(cfg: RunConfig, parsed: FolderConfig) -> DecodeConfig:
    """The decoding settings of a fine-tuned model: the init folder's (an imported model's
    generation_config.json), with those the run's config sets (differs from the defaults)."""
    default, here = DecodeConfig(), cfg.decode
    own = {
        f.name: getattr(here, f.name)
        for f in fields(DecodeConfig)
        if getattr(here, f.name) != getattr(default, f.name)
    }
    return merge_decode(parsed.config.decode, own)


def _fit_positions(cfg: RunConfig) -> RunConfig:
    """``cfg`` with data.max_len cut to the positions the init folder's model has (logged)."""
    if cfg.data.max_len <= cfg.model.max_len:
        return cfg
    log.info(
        "train.init_from: data.max_len %d cut to the model's %d positions",
        cfg.data.max_len,
        cfg.model.max_len,
    )
    return replace(cfg, data=replace(cfg.data, max_len=cfg.model.max_len))


def init_tokenizer(cfg: RunConfig, parsed: FolderConfig) -> tuple[str, dict[str, Any]]:
    """The tokenizer of the model folder ``train.init_from`` (the run must use its vocabulary)
    and that model's tokenizer settings (``data.tokenizer``/``vocab_size``/``lowercase``), which
    the run then records as its own; warns about settings that differ from that model's."""
    folder = Path(cfg.train.init_from)
    path = folder / TOKENIZER_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"train.init_from: cannot read {path} ({err})") from None
    there = parsed.config if parsed.has_data else replace(parsed.config, data=cfg.data)
    checks = [("data", k) for k in _TOKENIZER_KEYS]
    if parsed.kind != cfg.data.kind:  # of its own kind, the model section is the folder's
        checks = [("model", k) for k in _MEANING] + checks
    for section, key in checks:
        here_value = getattr(getattr(cfg, section), key)
        there_value = getattr(getattr(there, section), key)
        if here_value != there_value:
            log.warning(
                "train.init_from: %s.%s is %r here but %r in %s%s",
                section,
                key,
                here_value,
                there_value,
                folder,
                " (its tokenizer, and so its value, is used)" if section == "data" else "",
            )
    log.info("train.init_from: the tokenizer and weights of %s", folder)
    return text, {key: getattr(there.data, key) for key in _TOKENIZER_KEYS}


def train_run(
    cfg: RunConfig,
    out: str | Path,
    resume: bool = False,
    extra_meta: dict[str, Any] | None = None,
    task: Task | None = None,
    overwrite: bool = False,
    inputs: tuple[str | Path, ...] = (),
    model_keys: Collection[str] | None = None,
) -> TrainResult:
    """Train ``cfg`` into the run folder ``out`` (``resume``: continue it; ``overwrite``: replace
    it once all before the first update has succeeded); ``out`` may not be, hold or lie inside
    what the run reads (data, ``train.init_from``, ``inputs``). ``train.init_from`` of the run's
    kind fine-tunes that folder (:func:`_fine_tune`; ``model_keys``: the keys the config sets)."""
    dist = init_distributed(cfg.train.device)
    cfg = replace(cfg, data=cfg.data.with_absolute_paths())  # config.json: from anywhere
    folder = RunFolder(out)
    new = not folder.path.exists()
    owned = False  # whether what the folder holds is this run's own (to tidy after a failure)
    trainer: Trainer | None = None
    try:
        if resume and folder.config.is_file():
            cfg = _on_main(dist, lambda: _resumed_init_from(folder, cfg))
        _check_init_given(cfg)
        check_not_input(folder.path, [*run_inputs(cfg), *inputs], "--out")
        check_data_files(cfg, resume)
        start = _on_main(dist, lambda: folder.prepare(resume, overwrite))
        owned = not start.replace
        task = task or build_task(cfg)
        started, saved_tok = _starting_point(cfg, dist, folder, start.resume, model_keys)
        if started is not cfg:  # a fine-tune: the starting model's sections
            cfg = task.cfg = started
        tokenizer_json = _on_main(dist, lambda: task.setup(saved_tok))
        if not dist.is_main:
            task.setup(tokenizer_json)
        cfg = replace(cfg, model=task.model_config(cfg.model))
        task.cfg = cfg
        meta = _run_meta(cfg, task, extra_meta)
        if resume and folder.config.is_file():  # also when it starts again: the same config
            _on_main(dist, lambda: _check_resume(folder, meta))
        trainer = Trainer(cfg, task, folder, dist, meta, tokenizer_json, start.resume)
        if start.replace:
            _on_main(dist, folder.start_over)
            owned = True
        _on_main(dist, lambda: folder.write_meta(meta, tokenizer_json))
        result = trainer.fit()
        _on_main(dist, lambda: write_run_cards(folder.path))
        dist.barrier()
        return result
    except AiaynError:
        if dist.is_main and owned and not folder.state.is_file():
            if new:
                shutil.rmtree(folder.path, ignore_errors=True)  # nothing trained: leave no folder
            else:
                folder.discard_uncommitted()  # a run folder that the next train starts again
        raise
    finally:
        # The DDP wrapper holds the process group: dropped first, the group is torn down in
        # shutdown_distributed, after the last collective, not by the interpreter's exit.
        trainer = None
        shutdown_distributed()


def _starting_point(
    cfg: RunConfig,
    dist: DistContext,
    folder: RunFolder,
    resuming: bool,
    model_keys: Collection[str] | None,
) -> tuple[RunConfig, str | None]:
    """The config and the saved tokenizer a run starts from: on resume, its own tokenizer (none
    for a kind that reads no text) and, for a fine-tune given its recipe again, the starting
    model's sections as when it started; for a new fine-tune, the starting model's
    (:func:`_fine_tune`); for a new run, ``cfg`` and no tokenizer."""
    if resuming:
        if cfg.train.init_from and model_keys is not None:  # a recipe, as when it started
            cfg = _fine_tune(cfg, dist, model_keys)[0]
        tokenized = get_kind(cfg.data.kind).tokenized  # an image run has no tokenizer
        return cfg, _on_main(dist, folder.read_tokenizer) if tokenized else None
    if cfg.train.init_from:
        return _fine_tune(cfg, dist, model_keys)
    return cfg, None


def _check_init_given(cfg: RunConfig) -> None:
    """ConfigError when a fine-tune recipe (train.requires_init_from) names no folder to start
    from: it would train its model from scratch at a fine-tune's learning rate."""
    if cfg.train.requires_init_from and not cfg.train.init_from:
        raise ConfigError(
            "train.init_from is not set: this recipe fine-tunes a model folder (an `aiayn import "
            "hf` OPUS-MT folder or one of aiayn's own); give it with --set "
            "train.init_from=MODEL_DIR"
        )


def _resumed_init_from(folder: RunFolder, cfg: RunConfig) -> RunConfig:
    """``cfg`` with the run's own train.init_from: a resumed run's weights come from its
    checkpoint, so config.json keeps naming the folder the run started from. Another folder is
    refused in one line (it would not be used)."""
    started = resume_config(folder.path).train.init_from
    given = cfg.train.init_from
    if given and given != started and Path(given).resolve() != Path(started).resolve():
        was = f"started from {started}" if started else "started from scratch (no train.init_from)"
        raise ConfigError(
            f"--resume: train.init_from = {given} here, but the run in {folder.path} {was}; a "
            "resumed run continues from its own checkpoint: leave train.init_from as it was, or "
            "start a new run with another --out"
        )
    return replace(cfg, train=replace(cfg.train, init_from=started))


def _fine_tune(
    cfg: RunConfig, dist: DistContext, model_keys: Collection[str] | None
) -> tuple[RunConfig, str]:
    """The run's config and tokenizer with ``train.init_from``: a folder of the run's kind gives
    its model section, decoding settings and tokenizer (fine-tuning); config.json then says what
    was used."""
    parsed = _on_main(dist, lambda: init_folder(cfg))
    if parsed.kind == cfg.data.kind:
        model = init_model(cfg, parsed, model_keys)
        cfg = _fit_positions(replace(cfg, model=model, decode=init_decode(cfg, parsed)))
    saved_tok, keys = _on_main(dist, lambda: init_tokenizer(cfg, parsed))
    return replace(cfg, data=replace(cfg.data, **keys)), saved_tok


def _run_meta(cfg: RunConfig, task: Task, extra_meta: dict[str, Any] | None) -> dict[str, Any]:
    """What the run's config.json records."""
    return {
        "kind": task.kind,
        **run_config_to_dict(cfg),
        "aiayn_version": __version__,
        "hardware": hardware_name(cfg.train.device),
        **(extra_meta or {}),
    }


def write_run_cards(run: Path) -> None:
    """The model cards of a run folder and of its best/ (logged, never raised, on failure)."""
    write_model_card(run)
    if (run / "best" / CONFIG_FILE).is_file():
        write_model_card(run / "best")


def resume_config(out: str | Path) -> RunConfig:
    """The RunConfig saved in a run folder (for ``aiayn train --resume`` without CONFIG)."""
    folder = RunFolder(out)
    recover_folder(folder.path)
    if not folder.config.is_file():
        raise ConfigError(f"{folder.path}: no run to resume ({folder.config.name} not found)")
    return folder.read_meta().config
