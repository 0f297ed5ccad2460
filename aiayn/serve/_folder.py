"""The server opens model folders through the one loader: :func:`aiayn.folder.load_model_folder`,
or for folders written by `aiayn export` :func:`aiayn.export.engines.load_exported_folder`; both
give a :class:`~aiayn.folder.ModelFolder` (the temporary adapter that stood in for it is gone)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from aiayn.errors import ConfigError
from aiayn.folder import ModelFolder, load_model_folder


def load_folder(
    paths: Sequence[str | Path], device: str = "cpu", engine: str | None = None
) -> ModelFolder:
    """The folders as one ModelFolder; ``engine`` None: whatever the folders hold."""
    from aiayn.export.engines import is_exported, load_exported_folder

    folders = [Path(p) for p in paths]
    exported = any(is_exported(p) for p in folders)
    if exported or engine not in (None, "torch"):
        if engine == "torch":
            raise ConfigError(
                f"{folders[0]}: holds an exported model; --engine torch needs the model folder "
                "it was exported from"
            )
        if not all(is_exported(p) for p in folders):
            raise ConfigError(
                f"--engine {engine}: runs what `aiayn export MODEL_DIR --format {engine} -o OUT` "
                "writes; give that folder"
            )
        if torch.device(device).type != "cpu":
            raise ConfigError("exported models (ONNX, CTranslate2) run on the CPU")
        return load_exported_folder(folders, engine)
    return load_model_folder(folders, device=device)
