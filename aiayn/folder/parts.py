"""Whether a model folder's parts belong together: one record, written with the folder, checked
whenever it is opened, for PyTorch folders and exports alike.

A folder's parts are config.json's model section, tokenizer.json and the files that hold the
model (model.safetensors; an export's ONNX graphs or CTranslate2 model). When a folder is written,
aiayn records them (:func:`folder_parts`, :func:`record_parts`):

- ``model``: the model section, as JSON (so that a field that differs is named);
- ``tokenizer_sha256``: the sha256 of the tokenizer's content, written canonically
  (:func:`aiayn.data.tokenizer.tokenizer_digest`: re-indenting tokenizer.json changes nothing);
- every other file of an export, by its path in the folder: the sha256 of its bytes.

The record travels with the file it describes. A PyTorch folder's weights carry it in their
safetensors header (keys ``aiayn.model``, ``aiayn.tokenizer_sha256``), written in the same
atomic write as the weights: each checkpoint snapshot, a run folder's latest weights and an
averaged folder carry their own, and a kill can never leave weights and record apart. An export,
whose engine files cannot all carry metadata, keeps the record in config.json's ``"parts"``.
Opening a folder checks it (:func:`check_model`, :func:`check_files`), so that an edited
``n_heads``, a tokenizer.json copied from another run or a graph from another export is one
CheckpointError naming the folder and the part, never a wrong translation or an engine's
traceback. Folders written before the record existed load unchecked (said once per folder);
exports written before the scheme was shared record the model section as a digest
(``config.json:model``) and tokenizer.json by its bytes, and are checked as they were written.

:func:`read_tokenizer` is the one reader of a folder's tokenizer.json, for every folder.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from safetensors import SafetensorError, safe_open

from aiayn.config import ModelConfig, from_dict, to_dict
from aiayn.data.download import sha256_of
from aiayn.data.tokenizer import Tokenizer, tokenizer_digest
from aiayn.errors import AiaynError, CheckpointError, DataError
from aiayn.folder.config import CONFIG_FILE

log = logging.getLogger(__name__)

__all__ = [
    "MODEL",
    "TOKENIZER",
    "TOKENIZER_FILE",
    "check_files",
    "check_model",
    "export_record",
    "folder_parts",
    "parts_differences",
    "read_tokenizer",
    "record_parts",
    "verify_folder_parts",
    "weights_record",
]

TOKENIZER_FILE = "tokenizer.json"
#: the record's keys (beside an export's file paths); a weights header prefixes them with "aiayn."
MODEL = "model"
TOKENIZER = "tokenizer_sha256"
_HEADER_PREFIX = "aiayn."
#: the key under which exports written before the shared scheme record their model section's digest
_OLD_MODEL_DIGEST = "config.json:model"
#: files of an exported folder that are not parts: the record itself, the model card, the tokenizer
#: (recorded by its content under TOKENIZER)
_NOT_FILES = (CONFIG_FILE, "README.md", TOKENIZER_FILE)

_UNCHECKED_NOTED: set[str] = set()


def read_tokenizer(folder: Path, model_cfg: ModelConfig) -> Tokenizer:
    """``folder``'s tokenizer.json; CheckpointError when it is missing, unreadable or has more
    tokens than the model's vocabulary."""
    path = folder / TOKENIZER_FILE
    if not path.is_file():
        raise CheckpointError(
            f"{folder}: not a complete model folder ({TOKENIZER_FILE} is missing)"
        )
    try:
        tokenizer = Tokenizer.from_file(path)
    except DataError as err:
        raise CheckpointError(str(err)) from None
    vocab = min(model_cfg.src_vocab_size, model_cfg.tgt_vocab_size)
    if tokenizer.vocab_size > vocab:
        raise CheckpointError(
            f"{folder}: tokenizer has {tokenizer.vocab_size} tokens, the model only {vocab}"
        )
    return tokenizer


# ---- writing the record ----------------------------------------------------------------------
def _record(model_cfg: ModelConfig | dict[str, Any], tokenizer: str | bytes | None) -> dict:
    cfg = model_cfg if isinstance(model_cfg, dict) else to_dict(model_cfg)
    record = {MODEL: json.dumps(cfg, sort_keys=True)}
    digest = tokenizer_digest(tokenizer) if tokenizer is not None else None
    if digest is not None:
        record[TOKENIZER] = digest
    return record


def folder_parts(model_cfg: ModelConfig | dict[str, Any], tokenizer: str | bytes | None) -> dict:
    """The record of a weights file's model section and tokenizer, as its safetensors metadata
    (what :func:`aiayn.folder.checkpoint.save_weights` writes into its header)."""
    return {_HEADER_PREFIX + k: v for k, v in _record(model_cfg, tokenizer).items()}


def record_parts(folder: Path, cfg: ModelConfig) -> dict[str, str]:
    """config.json's ``parts`` of an export written into ``folder``: the model section, the
    tokenizer's content digest, and the sha256 of each other file (by its path in the folder)."""
    tokenizer = folder / TOKENIZER_FILE
    record = _record(cfg, tokenizer.read_bytes() if tokenizer.is_file() else None)
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = path.relative_to(folder).as_posix()
        if name not in _NOT_FILES:
            record[name] = sha256_of(path)
    return record


# ---- reading it --------------------------------------------------------------------------------
def weights_record(weights: Path) -> dict[str, str] | None:
    """The record in a weights file's header; None when it records nothing (written before the
    record) or cannot be read (its loader says why)."""
    try:
        with safe_open(str(weights), "pt") as f:
            header = f.metadata() or {}
    except (SafetensorError, OSError, ValueError, RuntimeError):
        return None
    record = {
        k[len(_HEADER_PREFIX) :]: v for k, v in header.items() if k.startswith(_HEADER_PREFIX)
    }
    return record if MODEL in record else None


def _checked(folder: Path, record: Mapping[str, str] | None) -> Mapping[str, str]:
    """``record``, or {} for a folder written before the record existed (said once per folder)."""
    if record is None:
        if str(folder) not in _UNCHECKED_NOTED:
            _UNCHECKED_NOTED.add(str(folder))
            log.info("%s: written before aiayn recorded a folder's parts; not checked", folder)
        return {}
    return record


# ---- checking it -------------------------------------------------------------------------------
def _model_differences(
    record: Mapping[str, str], model_cfg: ModelConfig, where: Path, whose: str
) -> list[str]:
    """``"n_heads is 4, the weights' is 2"`` for each field of ``model_cfg`` that differs from
    the record's (read from ``where``; ``whose`` names its holder)."""
    if MODEL not in record:
        return []
    try:
        saved = to_dict(from_dict(ModelConfig, json.loads(record[MODEL])))
    except (AiaynError, ValueError, TypeError):
        raise CheckpointError(f"{where}: its recorded model config is not valid") from None
    here = to_dict(model_cfg)
    return [
        f"{k} is {here.get(k)!r}, {whose} is {saved.get(k)!r}"
        for k in sorted(set(saved) | set(here))
        if saved.get(k) != here.get(k)
    ]


def _tokenizer_differs(record: Mapping[str, str], tokenizer: Path) -> bool:
    """The tokenizer file's content is not the one recorded (one that cannot be read does not
    differ here: its loader says why)."""
    if TOKENIZER not in record or not tokenizer.is_file():
        return False
    return tokenizer_digest(tokenizer.read_bytes()) not in (None, record[TOKENIZER])


def parts_differences(
    record: Mapping[str, str], model_cfg: ModelConfig, tokenizer: Path, where: Path
) -> tuple[list[str], bool]:
    """How ``model_cfg`` and the tokenizer file differ from the record of the weights file
    ``where``: (each model field that differs, whether the tokenizer differs)."""
    diffs = _model_differences(record, model_cfg, where, "the weights'")
    return diffs, _tokenizer_differs(record, tokenizer)


def _model_digest(cfg: ModelConfig) -> str:
    """What exports before the shared scheme recorded under ``config.json:model``: the sha256 of
    the model section's fields that differ from ModelConfig's defaults, in canonical JSON."""
    default = to_dict(ModelConfig())
    section = {k: v for k, v in to_dict(cfg).items() if default.get(k) != v}
    return hashlib.sha256(json.dumps(section, sort_keys=True).encode("utf-8")).hexdigest()


def check_model(
    folder: Path, record: Mapping[str, str], model_cfg: ModelConfig, exported: bool
) -> None:
    """CheckpointError naming the fields when config.json's model section is not the one the
    folder's model was written with (``exported``: the record is an export's, else its weights')."""
    when, whose = (
        ("export", "the export's") if exported else ("the weights were written", "the weights'")
    )
    diffs = _model_differences(record, model_cfg, folder, whose)
    old = record.get(_OLD_MODEL_DIGEST)
    if diffs or (old is not None and old != _model_digest(model_cfg)):
        said = f" ({'; '.join(diffs[:3])})" if diffs else ""
        raise CheckpointError(
            f"{folder}: config.json's model section was changed after {when}{said}: the "
            "folder's parts come from different models"
        )


def check_files(folder: Path, record: Mapping[str, str], exported: bool) -> None:
    """CheckpointError naming the file when tokenizer.json is not the tokenizer the model was
    written with, or (an export) a recorded file is missing or not the one written at export."""
    if _tokenizer_differs(record, folder / TOKENIZER_FILE):
        written = "this export was written with" if exported else "these weights were trained with"
        raise CheckpointError(
            f"{folder}: tokenizer.json is not the tokenizer {written} (the folder's parts come "
            "from different models)"
        )
    for name, digest in record.items():
        if name in (MODEL, TOKENIZER, _OLD_MODEL_DIGEST):
            continue
        relative = PurePosixPath(name)
        if relative.is_absolute() or ".." in relative.parts:
            raise CheckpointError(
                f"{folder / CONFIG_FILE}: 'parts' names a file outside the folder"
            )
        path = folder / relative
        if not path.is_file():
            raise CheckpointError(f"{path}: not found (the exported folder is incomplete)")
        if sha256_of(path) != digest:
            raise CheckpointError(
                f"{folder}: {name} is not the file this export wrote (changed, corrupted or "
                "from another model or run: the folder's parts do not belong together; export "
                "the model folder again)"
            )


def verify_folder_parts(folder: str | Path, weights_name: str, model_cfg: ModelConfig) -> None:
    """Check a PyTorch folder's config.json (model section) and tokenizer.json against the record
    in its weights' header; CheckpointError naming what differs."""
    folder = Path(folder)
    record = _checked(folder, weights_record(folder / weights_name))
    if record:
        check_model(folder, record, model_cfg, exported=False)
        check_files(folder, record, exported=False)


def export_record(folder: Path, parts: Mapping[str, str] | None) -> Mapping[str, str]:
    """An export's record (config.json's ``parts``), {} for one written before the record."""
    return _checked(folder, parts)
