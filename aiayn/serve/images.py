"""The images of a /v1/classify request to an image classifier, read at the door: base64 PNG or
JPEG files, or raw pixel arrays, each converted as the training images were
(:func:`aiayn.data.images.to_model_image`: grey or RGB as the model reads, resized to its image
size) and the conversion said in the answer. Each refusal is a one-line
:class:`~aiayn.serve.queue.RequestError` naming the item: not base64, not a PNG or JPEG, more
pixels than ``serve.max_image_pixels`` (checked from the header, before the pixels are
decoded: a small file may hold a huge picture), an array of no image shape or range.

Shape legend: N images · C channels · S side.
"""

from __future__ import annotations

import binascii
import io
from base64 import b64decode
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from aiayn.data.images import array_image, to_model_image
from aiayn.errors import DataError, require
from aiayn.serve.queue import RequestError

__all__ = ["FORMATS", "ImageInput", "read_images", "read_arrays"]

#: what Pillow must say a file is
FORMATS = ("PNG", "JPEG")


@dataclass(frozen=True)
class ImageInput:
    """One image of a /v1/classify request, as the model reads it: its pixels (C, H, W) uint8,
    the classes asked for, and what was converted ("" when nothing)."""

    pixels: np.ndarray
    top_k: int
    converted: str


def read_images(
    images: Sequence[str], size: int, channels: int, max_pixels: int
) -> tuple[np.ndarray, list[str]]:
    """(uint8 (N, C, S, S), per image what was converted: "" when nothing) of base64 files; a
    ``data:image/...;base64,`` prefix is allowed (what a browser's FileReader gives)."""
    image_module = require("PIL.Image", "image", "reading image files (Pillow)")
    out = np.empty((len(images), channels, size, size), dtype=np.uint8)
    notes = []
    for i, text in enumerate(images):
        where = f"images[{i}]"
        if text.startswith("data:"):
            text = text.partition(",")[2]
        try:
            raw = b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise RequestError(
                422, f"{where}: not base64 (send the file's bytes as base64)"
            ) from None
        try:
            img = image_module.open(io.BytesIO(raw))
        except (OSError, SyntaxError, ValueError):
            raise RequestError(422, f"{where}: not an image (send a PNG or JPEG file)") from None
        if img.format not in FORMATS:
            raise RequestError(422, f"{where}: a {img.format} image; send a PNG or JPEG file")
        check_pixels(where, img.size[0], img.size[1], max_pixels)
        try:
            img.load()
        except (OSError, SyntaxError, ValueError) as err:
            raise RequestError(422, f"{where}: a broken {img.format} file ({err})") from None
        out[i], said = to_model_image(img, size, channels)
        notes.append(", ".join(said))
    return out, notes


def read_arrays(
    arrays: Sequence[Any], size: int, channels: int, max_pixels: int
) -> tuple[np.ndarray, list[str]]:
    """(uint8 (N, C, S, S), per array what was converted) of nested lists of pixels: (H, W) grey
    or (H, W, C) / (C, H, W) with 1, 3 or 4 channels; integers 0-255 or floats in [0, 1]."""
    out = np.empty((len(arrays), channels, size, size), dtype=np.uint8)
    notes = []
    for i, item in enumerate(arrays):
        where = f"arrays[{i}]"
        a = as_pixels(where, item)
        h, w = (a.shape[0], a.shape[1]) if a.ndim >= 2 else (a.size, 1)
        check_pixels(where, w, h, max_pixels)
        try:
            out[i], said = array_image(a, size, channels)
        except DataError as err:
            raise RequestError(422, f"{where}: {err}") from None
        notes.append(", ".join(said))
    return out, notes


def as_pixels(where: str, item: Any) -> np.ndarray:
    """The numbers of ``item`` as an array (integers 0-255 as uint8); 422 for rows of unequal
    length, values that are not numbers, or numbers out of range."""
    if not isinstance(item, list):
        raise RequestError(422, f"{where}: an array is a list of pixel rows")
    try:
        a = np.asarray(item)
    except ValueError:
        a = np.asarray([], dtype=object)
    if a.dtype == object or a.dtype.kind not in "iuf" or a.size == 0:
        raise RequestError(
            422, f"{where}: not an array of numbers (rows of equal length of 0-255 or 0.0-1.0)"
        )
    if a.dtype.kind == "f" and not np.isfinite(a).all():
        raise RequestError(422, f"{where}: holds a value that is not a finite number")
    if a.dtype.kind in "iu":
        if a.min() < 0 or a.max() > 255:
            raise RequestError(
                422, f"{where}: integer pixels are 0-255, got {a.min()} to {a.max()}"
            )
        a = a.astype(np.uint8)
    return a


def check_pixels(where: str, width: int, height: int, max_pixels: int) -> None:
    if width * height > max_pixels:
        raise RequestError(
            422,
            f"{where}: {width}x{height} is {width * height} pixels; the limit is {max_pixels} "
            "(serve.max_image_pixels)",
        )
