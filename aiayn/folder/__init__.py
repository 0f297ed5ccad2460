"""The model folder: what ``aiayn train``, ``aiayn average`` and ``aiayn export`` write, and the one
loader every command, the server and ``aiayn.load`` open it with.

A model folder holds config.json (the run's typed config, :mod:`aiayn.folder.config`), the weights
(model.safetensors, :mod:`aiayn.folder.checkpoint`; an export's graphs or CTranslate2 model
instead) and tokenizer.json; its parts are checked against each other when it is opened
(:mod:`aiayn.folder.parts`). :func:`load_model_folder` (``aiayn.load``) opens it
(:mod:`aiayn.folder.load`), with the backend that runs it (:mod:`aiayn.folder.open`), and returns
a :class:`ModelFolder`, which translates, classifies, generates and scores
(:mod:`aiayn.folder.score`). How a folder knows its own parts: docs/design/reliability.md, section 2.
"""

from aiayn.folder.checkpoint import WEIGHTS_FILE, save_model_dir
from aiayn.folder.config import (
    CONFIG_FILE,
    FolderConfig,
    parse_folder_config,
    read_folder_config,
    write_folder_config,
)
from aiayn.folder.load import ModelFolder, load_model_dir, load_model_folder, precision

__all__ = [
    "CONFIG_FILE",
    "WEIGHTS_FILE",
    "FolderConfig",
    "ModelFolder",
    "load_model_dir",
    "load_model_folder",
    "parse_folder_config",
    "precision",
    "read_folder_config",
    "save_model_dir",
    "write_folder_config",
]
