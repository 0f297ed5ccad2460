"""Opening a model folder's backend: which runtime runs it, and the model it runs.

:func:`open_backend` is what :func:`aiayn.load` calls once it has read the folders' config.json:
PyTorch for a model folder, ONNX Runtime or CTranslate2 for a folder ``aiayn export`` wrote (or
the one ``engine`` names, which must be what the folders hold). Each folder's parts are checked
before its backend runs it. Which backend to use when: docs/runtime.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from aiayn.data import Tokenizer
from aiayn.decode.ensemble import ensemble_of
from aiayn.errors import CheckpointError, ConfigError
from aiayn.folder.checkpoint import WEIGHTS_FILE, load_weights
from aiayn.folder.config import FolderConfig
from aiayn.folder.parts import (
    check_files,
    check_model,
    export_record,
    read_tokenizer,
    verify_folder_parts,
)
from aiayn.kinds import KINDS
from aiayn.runtime.backend import ENGINES, Backend, require
from aiayn.runtime.ct2_backend import Ct2Backend, open_ct2
from aiayn.runtime.onnx_backend import OnnxBackend, open_onnx
from aiayn.runtime.torch_backend import TorchBackend
from aiayn.threads import default_workers

__all__ = ["open_backend", "build_model", "engine_of"]

#: what a kind's uses need from a backend
_NEEDS = {
    "translate": "translate",
    "classify": "classify",
    "generate": "generate",
    "classify_images": "classify_images",
}
#: the backends of exported folders, by format
_EXPORTED: dict[str, type[OnnxBackend] | type[Ct2Backend]] = {
    "onnx": OnnxBackend,
    "ctranslate2": Ct2Backend,
}


def build_model(
    folder: Path, parsed: FolderConfig, device: torch.device, weights: str
) -> torch.nn.Module:
    """The PyTorch model of ``folder`` (its kind's model class, ``weights`` loaded, checked
    against config.json and tokenizer.json), in eval mode on ``device``."""
    verify_folder_parts(folder, weights, parsed.config.model)
    model = KINDS[parsed.kind].model_class(parsed.config.model)
    load_weights(model, folder / weights)
    return model.to(device).eval()


def engine_of(folders: Sequence[Path], parsed: Sequence[FolderConfig], engine: str | None) -> str:
    """The backend that runs ``folders``: ``engine`` when given, else what they hold (the first
    export's format, or torch). ConfigError, saying what to do, when a folder is not what it
    needs."""
    if engine not in (None, *ENGINES):
        raise ConfigError(f"--engine must be one of {', '.join(ENGINES)}, got '{engine}'")
    name = engine or next((str(p.format) for p in parsed if p.format is not None), "torch")
    for folder, p in zip(folders, parsed):
        if name == "torch" and p.format is not None:
            raise ConfigError(
                f"{folder}: holds an exported model; --engine torch needs the model "
                "folder it was exported from"
            )
        if name != "torch" and p.format is None:
            raise ConfigError(
                f"{folder}: a PyTorch model folder; --engine {name} runs what "
                f"`aiayn export {folder} --format {name} -o OUT` writes"
            )
        if name != "torch" and p.format != name:
            raise ConfigError(
                f"{folder}: holds a '{p.format}' export; --engine {name} needs a folder "
                f"written by `aiayn export --format {name}`"
            )
    return name


def open_backend(
    folders: Sequence[Path],
    parsed: Sequence[FolderConfig],
    engine: str | None,
    device: torch.device,
    workers: int | None,
) -> tuple[Backend, Tokenizer | None]:
    """The backend that runs ``folders`` (one folder, or several translation or text classifier
    folders as an ensemble) and the tokenizer they share; ``parsed`` their config.json, already read.
    ``workers``: batches an exported model decodes at once (default: chosen for the machine
    and the engine, :func:`aiayn.threads.default_workers`), each on its share of the threads."""
    name = engine_of(folders, parsed, engine)
    kind = KINDS[parsed[0].kind]
    if len(folders) > 1:
        ensembles = ("translate", "classify")  # what several folders can do as one
        for folder, p in zip(folders, parsed):
            if p.kind != parsed[0].kind or not any(KINDS[p.kind].does(u) for u in ensembles):
                raise CheckpointError(
                    f"{folder}: holds a '{p.kind}' model, {folders[0]} a '{parsed[0].kind}' "
                    "one; several model folders make a translation or a text classifier "
                    "ensemble of one kind, other models are used one folder at a time"
                )
        if kind.does("classify") and name != "torch":
            raise ConfigError(f"{folders[0]}: a classifier ensemble runs on PyTorch models")
    if name == "torch":
        models = [build_model(f, p, device, WEIGHTS_FILE) for f, p in zip(folders, parsed)]
        tokenizers = [_tokenizer(f, p) for f, p in zip(folders, parsed)]
        return TorchBackend(ensemble_of(folders, models, tokenizers), device), tokenizers[0]
    if device.type != "cpu":
        raise ConfigError(f"{folders[0]}: an exported model runs on the CPU")
    runtime = _EXPORTED[name]
    for use in kind.uses:  # before anything is opened: what the kind needs, the backend has
        if use in _NEEDS:
            require(runtime, _NEEDS[use], f"{folders[0]} holds a '{kind.name}' model")
    if len(folders) > 1:
        require(runtime, "ensemble", "aiayn ensembles run on PyTorch or ONNX models")
    workers = workers or default_workers(name)
    opened = [_open_export(f, p, name, workers) for f, p in zip(folders, parsed)]
    engines, tokenizers = [m for m, _ in opened], [t for _, t in opened]
    return runtime(ensemble_of(folders, engines, tokenizers)), tokenizers[0]


def _tokenizer(folder: Path, parsed: FolderConfig) -> Tokenizer | None:
    """``folder``'s tokenizer; None for a kind that reads no text (an image classifier)."""
    if not KINDS[parsed.kind].tokenized:
        return None
    return read_tokenizer(folder, parsed.config.model)


def _open_export(
    folder: Path, parsed: FolderConfig, name: str, workers: int
) -> tuple[object, Tokenizer | None]:
    """(engine model, tokenizer) of one exported folder; its parts checked against config.json's
    record (:mod:`aiayn.folder.parts`): the tokenizer and every file first, the model section
    after the engine named, from its own shapes, what it could check."""
    record = export_record(folder, parsed.parts)
    check_files(folder, record, exported=True)
    cfg, files = parsed.config.model, dict(parsed.files or {})
    tokenizer = _tokenizer(folder, parsed)
    # `workers` batches run at once, each on its share of the threads (as in aiayn's own decoding)
    threads = torch.get_num_threads()
    if name == "ctranslate2":
        model: object = open_ct2(
            folder, cfg, tokenizer, files, threads, workers, parsed.quantization
        )
    else:
        model = open_onnx(folder, parsed.kind, cfg, files, max(1, threads // workers))
    check_model(folder, record, cfg, exported=True)
    return model, tokenizer
