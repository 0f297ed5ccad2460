"""aiayn — the Transformer of "Attention Is All You Need" (Vaswani et al. 2017), from scratch.

``aiayn.load(path)`` opens a trained model folder (:func:`aiayn.folder.load_model_folder`)::

    import aiayn
    aiayn.load("runs/demo/m1/avg5").translate(["A man rides a bike."])

On the CPU, ``aiayn.load`` also tunes glibc malloc for the whole process to keep freed memory
(faster decoding, docs/performance.md#in-short; peak memory kept until exit);
``AIAYN_MALLOC=default`` leaves it alone.

``import aiayn`` does not import torch: ``aiayn.Transformer`` and ``aiayn.load`` bring it in on
first use, so that ``aiayn --help`` (whose module, aiayn.cli, runs this file first) answers at once.
"""

from typing import TYPE_CHECKING, Any

from aiayn.config import ModelConfig
from aiayn.errors import AiaynError, CheckpointError, ConfigError, DataError

if TYPE_CHECKING:
    from aiayn.folder import load_model_folder as load
    from aiayn.model import Transformer

__version__ = "0.1.0"
__all__ = [
    "ModelConfig",
    "Transformer",
    "AiaynError",
    "ConfigError",
    "DataError",
    "CheckpointError",
    "load",
]


def __getattr__(name: str) -> Any:
    """``aiayn.load`` is :func:`aiayn.folder.load_model_folder`, ``aiayn.Transformer`` is
    :class:`aiayn.model.Transformer`, each imported on first use (PEP 562): ``import aiayn``
    alone needs neither torch nor the data, training and decoding modules."""
    if name == "load":
        from aiayn.folder import load_model_folder

        return load_model_folder
    if name == "Transformer":
        from aiayn.model import Transformer

        return Transformer
    raise AttributeError(f"module 'aiayn' has no attribute {name!r}")
