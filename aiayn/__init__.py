"""aiayn — the Transformer of "Attention Is All You Need" (Vaswani et al. 2017), from scratch."""

from aiayn.config import ModelConfig
from aiayn.errors import AiaynError, CheckpointError, ConfigError, DataError
from aiayn.model import Transformer

__version__ = "0.1.0"
__all__ = [
    "ModelConfig",
    "Transformer",
    "AiaynError",
    "ConfigError",
    "DataError",
    "CheckpointError",
]
