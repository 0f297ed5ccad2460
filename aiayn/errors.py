"""User-facing errors.

Anything a user can get wrong (a config value, a file, a flag, a checkpoint) raises a subclass of
:class:`AiaynError`. The CLI prints its message on one line and exits non-zero, without a
traceback. ``ConfigError`` is also a ``ValueError`` so library callers can catch either.
"""

import importlib
from types import ModuleType


class AiaynError(Exception):
    """An error caused by user input; its message is shown as is."""


class ConfigError(AiaynError, ValueError):
    """A configuration value or key is invalid."""


class DataError(AiaynError, ValueError):
    """A data file or dataset is missing, malformed or fails its checksum."""


class CheckpointError(AiaynError, ValueError):
    """A model folder or checkpoint is missing, incomplete, corrupt or of the wrong kind."""


class OutputError(AiaynError, OSError):
    """An output could not be written (full disk, read-only place); the message names the path."""


def require(module: str, extra: str, purpose: str) -> ModuleType:
    """Import an optional dependency, or a one-line ConfigError naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(
            f"{purpose} needs the '{extra}' extra: pip install -e '.[{extra}]' in the aiayn checkout"
        ) from None
