"""The rules every setting from outside is checked by, where it enters: the command line, a
recipe, an imported ``generation_config.json`` or ``config.json``, an HTTP request, and the
weights of a model folder.

One rule set, so that a value refused in one place is refused in all of them, in the same words:
numbers are finite and in range, ids are in the vocabulary, a minimum is at most its maximum,
weights hold no NaN or infinity. Each check raises a one-line :class:`~aiayn.errors.ConfigError`
(or :class:`~aiayn.errors.CheckpointError` for weights) that names the setting; callers put the
file or flag in front.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from aiayn.errors import CheckpointError, ConfigError

if TYPE_CHECKING:  # the checks of numbers import without torch (`aiayn --help`)
    import torch

__all__ = [
    "check_number",
    "check_integer",
    "check_ids",
    "check_order",
    "check_finite_tensors",
    "as_texts",
    "check_device",
]


def _bounds(minimum: float | None, above: float | None, maximum: float | None) -> str:
    parts = []
    if minimum is not None:
        parts.append(f">= {minimum:g}")
    if above is not None:
        parts.append(f"> {above:g}")
    if maximum is not None:
        parts.append(f"<= {maximum:g}")
    return " and ".join(parts)


def check_number(
    name: str,
    value: Any,
    *,
    minimum: float | None = None,
    above: float | None = None,
    maximum: float | None = None,
) -> None:
    """ConfigError unless ``value`` is a finite real number (not a bool) within the bounds."""
    bounds = _bounds(minimum, above, maximum)
    real = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not real or not math.isfinite(float(value)):
        want = "a finite number" + (f" {bounds}" if bounds else "")
        raise ConfigError(f"{name} must be {want}, got {value if real else repr(value)}")
    if (
        (minimum is not None and value < minimum)
        or (above is not None and value <= above)
        or (maximum is not None and value > maximum)
    ):
        raise ConfigError(f"{name} must be {bounds}, got {value}")


def check_integer(
    name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None
) -> None:
    """ConfigError unless ``value`` is an integer (not a bool) within the bounds."""
    bounds = _bounds(minimum, None, maximum)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(
            f"{name} must be an integer{' ' + bounds if bounds else ''}, got {value!r}"
        )
    check_number(name, int(value), minimum=minimum, maximum=maximum)


def check_ids(name: str, ids: Iterable[Any], vocab_size: int) -> None:
    """ConfigError unless every id is an int of the vocabulary (0 … vocab_size - 1)."""
    bad = [
        i
        for i in ids
        if isinstance(i, bool)
        or not isinstance(i, numbers.Integral)
        or not 0 <= int(i) < vocab_size
    ]
    if bad:
        raise ConfigError(f"{name} {bad[:5]}: ids must be in the vocabulary (0 … {vocab_size - 1})")


def check_order(low_name: str, low: float, high_name: str, high: float) -> None:
    """ConfigError unless ``low`` <= ``high`` (a minimum and its maximum)."""
    if low > high:
        raise ConfigError(f"{low_name} ({low}) must not exceed {high_name} ({high})")


def check_finite_tensors(tensors: Mapping[str, torch.Tensor], path: Any) -> None:
    """CheckpointError naming ``path`` and the first tensor that holds a NaN or an infinity
    (weights that would make every output blank). One pass over the floating-point tensors."""
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and not bool(tensor.isfinite().all()):
            bad = tensor[~tensor.isfinite()]
            what = "NaN" if bool(bad.isnan().any()) else "infinite"
            raise CheckpointError(
                f"{path}: tensor '{name}' holds {what} values ({bad.numel()} of "
                f"{tensor.numel()}); the weights are corrupt"
            )


def as_texts(texts: str | Sequence[str], name: str = "texts") -> tuple[list[str], bool]:
    """``(texts as a list, whether one text was given)``: a str is one text, as a Hugging Face
    pipeline takes it (never a sequence of characters); a list or tuple of str stays a list.
    TypeError naming ``name`` for anything else (a number, None, a list holding one), as
    ``aiayn.load`` answers what is not a path: a mistake in the calling code."""
    if isinstance(texts, str):
        return [texts], True
    if isinstance(texts, (list, tuple)):
        bad = next((i for i, text in enumerate(texts) if not isinstance(text, str)), None)
        if bad is None:
            return list(texts), False
        raise TypeError(f"{name}[{bad}] must be a string, got {type(texts[bad]).__name__}")
    raise TypeError(f"{name} must be a string or a list of strings, got {type(texts).__name__}")


DEVICES = "auto, cpu, cuda, cuda:N"


def check_device(name: str, setting: str = "--device") -> torch.device:
    """The torch device ``name`` names (``auto``: CUDA when there is one, else the CPU), for
    every command and training alike; one ConfigError line, naming ``setting``, for a name torch
    does not know, a device aiayn does not run on (mps, xpu, meta, …: they ended in a torch
    traceback), or a CUDA device this machine lacks."""
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError, TypeError):
        raise ConfigError(f"{setting} {name}: unknown device (use {DEVICES})") from None
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"{setting} {name}: not supported; aiayn runs on {DEVICES}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"{setting} {name}: no CUDA device is available")
        if device.index is not None and device.index >= torch.cuda.device_count():
            count = torch.cuda.device_count()
            raise ConfigError(f"{setting} {name}: this machine has {count} CUDA device(s)")
    return device
