"""Model folders: ``config.json`` + ``model.safetensors`` (+ ``tokenizer.json``): writing them, and
reading their weights. Loading a whole folder is :func:`aiayn.folder.load_model_folder`.

A model folder is everything needed to use a trained model with no flags: the resolved config
(model shape, and whatever else the producer recorded, e.g. data and training settings), the
weights in safetensors (loading never executes pickled code) and the tokenizer. Writes are atomic.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from aiayn.checks import check_finite_tensors
from aiayn.config import ModelConfig, to_dict
from aiayn.errors import CheckpointError, ConfigError
from aiayn.folder.config import read_folder_config, write_folder_config
from aiayn.folder.parts import TOKENIZER_FILE, folder_parts, verify_folder_parts
from aiayn.io import atomic_path, new_folder
from aiayn.kinds import TRANSLATION

log = logging.getLogger(__name__)
WEIGHTS_FILE = "model.safetensors"


def save_weights(
    model: nn.Module, path: str | Path, metadata: dict[str, str] | None = None
) -> None:
    """Atomically write ``model``'s state to safetensors (tied tensors stored once), with
    ``metadata`` (:func:`aiayn.folder.parts.folder_parts`) in its header."""
    state = {}
    seen: dict[int, str] = {}
    for name, tensor in model.state_dict().items():
        key = tensor.data_ptr()
        if key in seen and tensor.numel() > 0:
            continue  # a tied weight (shared embedding / output projection)
        seen[key] = name
        state[name] = tensor.detach().contiguous().cpu()
    write_safetensors(state, path, metadata)


def write_safetensors(
    tensors: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None
) -> None:
    """Atomically write ``tensors`` as a safetensors file: a failed write (a full disk) is an
    OutputError naming ``path``, as every write (:func:`aiayn.io.atomic_path`)."""
    with atomic_path(path) as tmp:
        try:
            save_file(tensors, str(tmp), metadata=metadata)
        except SafetensorError as err:
            raise _os_error(err) from None


# safetensors reports a failed write as SafetensorError("Error while serializing: I/O error: No
# space left on device (os error 28)"), which is no OSError.
_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def _os_error(err: SafetensorError) -> OSError:
    """The OSError a SafetensorError of a failed write stands for (atomic_path names the path)."""
    found = _OS_ERROR.search(str(err))
    if found is None:
        return OSError(str(err))
    code = int(found[1])
    return OSError(code, os.strerror(code))


def load_weights(model: nn.Module, path: str | Path) -> None:
    """Load safetensors weights into ``model``; a missing/corrupt file or mismatched tensor is a
    CheckpointError."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: weights file not found")
    try:
        state = load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise CheckpointError(f"{path}: not a readable safetensors file ({err})") from None
    upgrade_state(model, state)
    expected = model.state_dict()
    missing = [k for k in expected if k not in state and not _is_tied(model, k, state)]
    unexpected = [k for k in state if k not in expected]
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: weights do not match the model in config.json "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    for name, tensor in state.items():
        if tensor.shape != expected[name].shape:
            raise CheckpointError(
                f"{path}: tensor '{name}' has shape {tuple(tensor.shape)}, "
                f"the model expects {tuple(expected[name].shape)}"
            )
    check_finite_tensors(state, path)  # NaN weights would make every output blank
    model.load_state_dict(state, strict=False)


def upgrade_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Bring an older file's tensors into today's form, in place: each module that changed its
    tensors says how (``upgrade_state_dict_named``, as in fairseq)."""
    for name, module in model.named_modules():
        upgrade = getattr(module, "upgrade_state_dict_named", None)
        if upgrade is not None:
            upgrade(state, name)


def _is_tied(model: nn.Module, name: str, state: dict) -> bool:
    """True when ``name`` shares storage with a tensor present in ``state``."""
    sd = model.state_dict()
    ptr = sd[name].data_ptr()
    return any(k in state for k, t in sd.items() if t.data_ptr() == ptr and k != name)


def save_model_dir(
    folder: str | Path,
    model: nn.Module,
    cfg: ModelConfig,
    kind: str = TRANSLATION,
    tokenizer_json: str | None = None,
    extra: dict[str, Any] | None = None,
    weights_name: str = WEIGHTS_FILE,
    overwrite: bool = False,
) -> Path:
    """Write a loadable model folder: config.json (kind, model config, extras), weights, tokenizer.

    The folder is written whole (:func:`aiayn.io.new_folder`): built beside ``folder`` and swapped
    in, so a kill leaves the complete old folder or the complete new one. An existing non-empty
    ``folder`` is refused (ConfigError) unless ``overwrite``."""
    folder = Path(folder)
    with new_folder(folder, overwrite=overwrite) as tmp:
        save_weights(model, tmp / weights_name, folder_parts(cfg, tokenizer_json))
        if tokenizer_json is not None:
            with atomic_path(tmp / TOKENIZER_FILE) as path:
                path.write_text(tokenizer_json, encoding="utf-8")
        meta = {"kind": kind, "model": to_dict(cfg), **(extra or {})}
        write_folder_config(tmp, meta)
    return folder


def init_from_model_dir(model: nn.Module, folder: str | Path) -> tuple[list[str], list[str]]:
    """Copy into ``model`` every tensor of ``folder``'s weights that ``model`` has under the same
    name (a pre-trained embedding and encoder into a classifier, ``train.init_from``).

    Returns (names copied, names of ``model`` left as initialised). A shared name with another
    shape, or no shared name at all, is a ConfigError: the two models do not fit together.
    """
    folder = Path(folder)
    verify_folder_parts(folder, WEIGHTS_FILE, read_folder_config(folder).config.model)
    path = folder / WEIGHTS_FILE
    try:
        state = load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise CheckpointError(f"{path}: not a readable safetensors file ({err})") from None
    own = model.state_dict()
    # not weights: output_mask (model.output_vocab) belongs to this run's training data
    shared = [k for k in own if k in state and k != "output_mask"]
    for name in shared:
        if state[name].shape != own[name].shape:
            raise ConfigError(
                f"train.init_from: '{name}' has shape {tuple(state[name].shape)} in "
                f"{folder}, {tuple(own[name].shape)} in this model: the model "
                "settings differ"
            )
    if not shared:
        raise ConfigError(f"train.init_from: {folder} has no weights this model can use")
    with torch.no_grad():
        for name in shared:
            own[name].copy_(state[name])
    return shared, [k for k in own if k not in state and not _is_tied(model, k, state)]
