"""Checkpoint averaging (Vaswani et al. 2017, §6.1: "averaging the last 5 checkpoints").

The element-wise mean of the last N weight snapshots of a run (``RUN/checkpoints/``), written as a
loadable model folder with the run's config.json (plus which steps were averaged) and tokenizer.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from aiayn.card import write_model_card
from aiayn.errors import CheckpointError, ConfigError
from aiayn.folder.checkpoint import WEIGHTS_FILE, write_safetensors
from aiayn.folder.config import CONFIG_FILE, write_folder_config
from aiayn.folder.load import load_model_dir
from aiayn.folder.parts import TOKENIZER_FILE, folder_parts
from aiayn.io import (
    CHECKPOINT_DIR,
    atomic_path,
    check_not_input,
    check_output_folder,
    list_steps,
    new_folder,
    recover_folder,
)
from aiayn.progress import progress_bar
from aiayn.train.run_folder import RunFolder

__all__ = ["average_checkpoints", "average_state_dicts"]


def average_state_dicts(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Element-wise mean (accumulated in float64) of state dicts with the same keys and shapes."""
    first = states[0]
    out = {}
    for name, tensor in first.items():
        if not tensor.is_floating_point():
            out[name] = tensor.clone()  # counters and the like: keep the first
            continue
        total = torch.zeros_like(tensor, dtype=torch.float64)
        for state in states:
            total += state[name].to(torch.float64)
        out[name] = (total / len(states)).to(tensor.dtype)
    return out


def _load_snapshot(
    path: Path, reference: dict[str, torch.Tensor] | None
) -> dict[str, torch.Tensor]:
    try:
        state = load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise CheckpointError(f"{path}: not a readable safetensors file ({err})") from None
    if reference is not None:
        if state.keys() != reference.keys() or any(
            state[k].shape != reference[k].shape for k in state
        ):
            raise CheckpointError(f"{path}: holds different tensors than the other snapshots")
    return state


def _chosen_steps(folder: RunFolder, last: int, until: int | None) -> list[int]:
    """The last ``last`` snapshot steps (at ``until`` or before); CheckpointError saying which
    steps there are when there are too few."""
    kept = folder.snapshot_steps()
    steps = [step for step in kept if until is None or step <= until]
    if len(steps) >= last:
        return steps[-last:]
    if not kept:
        raise CheckpointError(f"{folder.path}: has no checkpoint to average ({CHECKPOINT_DIR}/)")
    if not steps:
        raise CheckpointError(
            f"{folder.path}: no checkpoint at step {until} or before; its checkpoints are at "
            f"steps {list_steps(kept)}"
        )
    where = "are kept" if until is None else f"are at step {until} or before"
    raise CheckpointError(
        f"{folder.path}: asked to average the last {last} checkpoints but only {len(steps)} "
        f"{where} (steps {list_steps(steps)}); give --last {len(steps)} or fewer (a run keeps "
        "its last train.keep_last snapshots)"
    )


def average_checkpoints(
    run_dir: str | Path,
    last: int,
    out: str | Path,
    until: int | None = None,
    overwrite: bool = False,
) -> list[int]:
    """Average the last ``last`` snapshots of ``run_dir`` (of those at step ``until`` or before,
    when given) into the model folder ``out``, written whole (built beside ``out``, swapped in).

    Returns the averaged steps. ``out`` may not be, hold or lie inside what the average reads
    (the run's checkpoints/, config.json, tokenizer.json); an existing non-empty ``out`` is
    refused unless ``overwrite``.
    """
    folder = RunFolder(run_dir)
    out = Path(out)
    if last < 1:
        raise ConfigError(f"--last must be >= 1, got {last}")
    recover_folder(folder.path)
    if not folder.config.is_file():
        raise CheckpointError(f"{folder.path}: not a training run folder ({CONFIG_FILE} not found)")
    check_not_input(out, [folder.checkpoints, folder.config, folder.tokenizer], "-o")
    check_output_folder(out, overwrite=overwrite)
    steps = _chosen_steps(folder, last, until)
    states: list[dict[str, torch.Tensor]] = []
    with progress_bar(len(steps), "average", "snapshot") as bar:
        for step in steps:
            states.append(_load_snapshot(folder.snapshot_path(step), states[0] if states else None))
            bar.update()
    averaged = average_state_dicts(states)
    meta = replace(folder.read_meta(), averaged={"steps": steps, "run": str(folder.path)})
    tokenizer = folder.tokenizer.read_bytes() if folder.tokenizer.is_file() else None
    with new_folder(out, overwrite=overwrite) as tmp:
        write_safetensors(averaged, tmp / WEIGHTS_FILE, folder_parts(meta.config.model, tokenizer))
        if tokenizer is not None:
            with atomic_path(tmp / TOKENIZER_FILE) as path:
                path.write_bytes(tokenizer)
        write_folder_config(tmp, meta)
        load_model_dir(tmp)  # the result must load before it replaces anything
        write_model_card(tmp, shown_as=out)  # README.md; a failure is logged, not raised
    return steps
