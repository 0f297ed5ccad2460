"""The parts of a model folder, checked against each other when it is opened.

A model folder's weights record the model config and tokenizer they were written with
(:func:`aiayn.folder.checkpoint.verify_folder_parts`). A folder written by ``aiayn export`` gets the same
guarantee from config.json's ``parts``: at export, the sha256 of every file it holds (graphs or
the CTranslate2 model, tokenizer.json) and of its model section (:func:`record_parts`); at load,
:func:`verify_parts` checks the files and :func:`verify_model_section` the section, so that a
tokenizer.json copied from another run or an edited ``n_heads`` is one CheckpointError naming
the folder, never a wrong translation or an engine's traceback. Exports written before the record
existed load unchecked (said once per folder). :func:`read_tokenizer` is the one reader of a
folder's tokenizer.json, for every folder.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from aiayn.config import ModelConfig, to_dict
from aiayn.data.download import sha256_of
from aiayn.data.tokenizer import Tokenizer
from aiayn.errors import CheckpointError, DataError
from aiayn.folder.config import CONFIG_FILE, FolderConfig

log = logging.getLogger(__name__)

__all__ = ["MODEL_PART", "read_tokenizer", "record_parts", "verify_parts", "verify_model_section"]

TOKENIZER_FILE = "tokenizer.json"
#: the key of ``parts`` that holds the digest of config.json's model section
MODEL_PART = "config.json:model"
#: files of an exported folder that are not parts: the record itself, the model card
_NOT_PARTS = (CONFIG_FILE, "README.md")

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


def model_digest(cfg: ModelConfig) -> str:
    """sha256 of a model section's fields that differ from ModelConfig's defaults, in canonical
    JSON (key order and spacing aside). Only those: a field added to ModelConfig later, with a
    default, must not change the digest of the exports written before it."""
    default = to_dict(ModelConfig())
    section = {k: v for k, v in to_dict(cfg).items() if default.get(k) != v}
    return hashlib.sha256(json.dumps(section, sort_keys=True).encode("utf-8")).hexdigest()


def record_parts(folder: Path, cfg: ModelConfig) -> dict[str, str]:
    """config.json's ``parts`` of an export written into ``folder``: the sha256 of each file
    (by its path in the folder, config.json and README.md aside) and of the model section."""
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    digests = {
        p.relative_to(folder).as_posix(): sha256_of(p)
        for p in files
        if p.relative_to(folder).as_posix() not in _NOT_PARTS
    }
    return {MODEL_PART: model_digest(cfg), **digests}


def _recorded(folder: Path, parsed: FolderConfig) -> Mapping[str, str] | None:
    if parsed.parts is None:
        if str(folder) not in _UNCHECKED_NOTED:
            _UNCHECKED_NOTED.add(str(folder))
            log.info("%s: exported before aiayn recorded an export's parts; not checked", folder)
    return parsed.parts


def verify_parts(folder: Path, parsed: FolderConfig) -> None:
    """Check every file config.json's ``parts`` records: present, and the one written at export.
    CheckpointError naming the file otherwise."""
    for name, digest in (_recorded(folder, parsed) or {}).items():
        if name == MODEL_PART:
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


def verify_model_section(folder: Path, parsed: FolderConfig) -> None:
    """Check config.json's model section against the digest recorded at export (the engines
    check what they can against the graphs' own shapes first, naming the field)."""
    recorded = (_recorded(folder, parsed) or {}).get(MODEL_PART)
    if recorded is not None and recorded != model_digest(parsed.config.model):
        raise CheckpointError(
            f"{folder}: config.json's model section was changed after export: it no longer "
            "describes the exported model (export the model folder again)"
        )
