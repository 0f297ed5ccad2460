"""config.json of a model folder (or run folder): its one reader and its one writer.

Every module that needs what a folder's config.json says goes through :func:`read_folder_config`
(or :func:`parse_folder_config` for a dict built in memory), which returns a typed
:class:`FolderConfig`; every config.json is written by :func:`write_folder_config`. No other
module reads the raw dict (``tests/test_folder_config.py`` holds the code to that).

The file on disk: ``kind`` (older folders' "seq2seq"/"classifier" still load), the sections
``model``, ``data``, ``train``, ``decode`` (typed into :class:`~aiayn.run_config.RunConfig`;
renamed keys such as ``train.bleu_every`` still load), and provenance written by train, average
and export (``task``, ``preset``, ``hardware``, ``aiayn_version``, ``best``, ``averaged``,
``format``, ``files``, ``quantization``, ``exported_from``, ``parts``; any other key is kept as
written).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiayn.config import to_dict
from aiayn.errors import AiaynError, CheckpointError
from aiayn.io import live_writers, recover_folder, write_json
from aiayn.kinds import KINDS, kind_name
from aiayn.run_config import SECTIONS, RunConfig, run_config_from_dict, run_config_to_dict

__all__ = [
    "CONFIG_FILE",
    "FolderConfig",
    "parse_folder_config",
    "read_folder_config",
    "write_folder_config",
]

CONFIG_FILE = "config.json"

#: top-level keys older folders wrote that say nothing "kind" does not: read and left out
_DROPPED = ("task",)  # data.task's copy, before the kind's one name (data.kind)

#: the optional top-level keys, in the order they are written (after kind and the sections)
_OPTIONAL = (
    "preset",
    "aiayn_version",
    "hardware",
    "best",
    "averaged",
    "files",
    "quantization",
    "exported_from",
    "parts",
)


@dataclass(frozen=True)
class FolderConfig:
    """A folder's config.json, parsed."""

    kind: str  # one of aiayn.kinds.KINDS (old names mapped)
    config: RunConfig  # model, data, train and decode sections (a missing section: defaults)
    sections: tuple[str, ...] = SECTIONS  # the sections config.json records
    decode_keys: tuple[str, ...] | None = None  # the decode fields it sets (None: all)
    format: str | None = None  # "onnx" / "ctranslate2": written by `aiayn export`
    preset: str | None = None  # model.preset of the recipe (train)
    aiayn_version: str | None = None
    hardware: str | None = None  # what trained it (train)
    best: Mapping[str, Any] | None = None  # {"step": N, metric: value} of best/ (train)
    averaged: Mapping[str, Any] | None = None  # {"steps": [...], "run": path} (average)
    files: Mapping[str, str] | None = None  # the exported graphs / model folder (export)
    quantization: str | None = None  # CTranslate2 weight type (export)
    exported_from: str | None = None  # the model folder an export was written from
    parts: Mapping[str, str] | None = None  # an export's record of its parts (aiayn.folder.parts)
    extra: Mapping[str, Any] = field(default_factory=dict)  # other keys, kept as written

    @property
    def has_data(self) -> bool:
        """config.json records the training data (data.* are not defaults)."""
        return "data" in self.sections

    @property
    def has_train(self) -> bool:
        return "train" in self.sections

    @property
    def decode_set(self) -> dict[str, Any]:
        """The decoding settings config.json records (the folder's recommendation), by field."""
        if "decode" not in self.sections:
            return {}
        decode = run_config_to_dict(self.config)["decode"]  # the removed keys left out
        keys = decode if self.decode_keys is None else self.decode_keys
        return {k: decode[k] for k in keys if k in decode}

    def to_dict(self) -> dict[str, Any]:
        """The config.json form (what :func:`write_folder_config` writes)."""
        out: dict[str, Any] = {}
        if self.format is not None:
            out["format"] = self.format
        out["kind"] = self.kind
        for name in SECTIONS:
            if name == "model" or name in self.sections:
                out[name] = to_dict(getattr(self.config, name))
        if "decode" in out:
            out["decode"] = self.decode_set
        for name in _OPTIONAL:
            value = getattr(self, name)
            if value is not None:
                out[name] = dict(value) if isinstance(value, Mapping) else value
        out.update(self.extra)
        return out


def parse_folder_config(meta: Any, folder: str | Path) -> FolderConfig:
    """The typed form of a config.json dict: the only reader of its raw keys. CheckpointError
    (naming ``folder``) when it is not an aiayn model config or a section is invalid."""
    folder = Path(folder)
    path = folder / CONFIG_FILE
    if not isinstance(meta, dict) or "model" not in meta or "kind" not in meta:
        raise CheckpointError(f"{path}: not an aiayn model config (needs 'kind' and 'model')")
    kind = kind_name(str(meta["kind"]))
    if kind not in KINDS:
        raise CheckpointError(f"{folder}: unknown model kind '{meta['kind']}'")
    try:
        config = run_config_from_dict(meta, str(path))
    except AiaynError as err:
        raise CheckpointError(f"{path}: {err}") from None
    decode = meta.get("decode")
    decode_keys = tuple(decode) if isinstance(decode, dict) else None
    optional: dict[str, Any] = {name: meta.get(name) for name in _OPTIONAL}
    for name in ("best", "averaged", "files", "parts"):
        if optional[name] is not None and not isinstance(optional[name], dict):
            raise CheckpointError(f"{path}: '{name}' must be a table, not {optional[name]!r}")
    fmt = meta.get("format")
    known = {"kind", "format", *SECTIONS, *_OPTIONAL, *_DROPPED}
    return FolderConfig(
        kind,
        config,
        tuple(name for name in SECTIONS if name in meta),
        decode_keys,
        None if fmt is None else str(fmt),
        extra={k: v for k, v in meta.items() if k not in known},
        **optional,
    )


def read_folder_config(folder: str | Path, expect_kind: str | None = None) -> FolderConfig:
    """Parse ``folder``'s config.json. CheckpointError when the folder or file is missing,
    unreadable, of an unknown kind or of another kind than ``expect_kind``."""
    folder = Path(folder)
    recover_folder(folder)
    if not folder.is_dir():
        writers = live_writers(folder)
        if writers:  # a writer swapping it in is alive: say where the folder is, never hide it
            entry, what, who = writers[0]
            where = f"its last version is in {entry}" if what == "old" else f"it is in {entry}"
            raise CheckpointError(
                f"{folder}: missing while a writer ({who}) replaces it; {where}: wait for the "
                "writer to finish, or stop it and run again"
            )
        raise CheckpointError(f"{folder}: model folder not found")
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"{folder}: not a model folder ({CONFIG_FILE} is missing)")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path}: not valid JSON ({err})") from None
    except OSError as err:
        raise CheckpointError(f"{path}: cannot read it ({err})") from None
    parsed = parse_folder_config(meta, folder)
    if expect_kind is not None and parsed.kind != kind_name(expect_kind):
        raise CheckpointError(
            f"{folder}: holds a '{parsed.kind}' model, this command needs '{expect_kind}'"
        )
    return parsed


def write_folder_config(folder: str | Path, cfg: FolderConfig | Mapping[str, Any]) -> Path:
    """Write ``cfg`` as ``folder``/config.json (atomically); returns the file's path. A mapping
    (what train and :func:`aiayn.folder.checkpoint.save_model_dir` build) is written as given."""
    path = Path(folder) / CONFIG_FILE
    write_json(path, cfg.to_dict() if isinstance(cfg, FolderConfig) else dict(cfg))
    return path
