"""Images for the image classifier: Fashion-MNIST or a folder of one's own, decoded once.

Shape legend: N images · C channels · H = W side (``model.image_size``).

A source (Fashion-MNIST's IDX files, or a folder with one subfolder of PNG/JPEG files per class)
is decoded once into an image store in ``$AIAYN_CACHE/images/``: ``images.npy`` (N, C, H, W)
uint8, ``labels.npy`` (N,) int64 and ``classes.json``, with a manifest of what it was built from
and CRC-32s of its files (:mod:`aiayn.checksum`), opened memory-mapped: an epoch reads pixels,
it never decodes an image again. A split is an index array over a store: Fashion-MNIST's
``val`` (and a folder's validation images without ``data.valid_dir``) is a seeded
``data.valid_fraction`` of the training images.

Images of another size, colour or channel count are converted, as one line says
(:func:`to_model_image`): to grey (``L``) or RGB, as the model reads, alpha dropped, then
resized to image_size × image_size (bilinear; a non-square picture is stretched). A file Pillow
cannot read is refused, naming it. Pillow is the optional extra ``image`` (matplotlib brings it
too); without it, reading an image file is one line saying how to install it.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from aiayn.checksum import checksum_problem, checksums
from aiayn.data.config import DataConfig
from aiayn.data.registry import cache_dir, download_dataset, get_spec
from aiayn.data.store import cache_key, fingerprint
from aiayn.errors import DataError, require
from aiayn.io import new_folder, write_json

__all__ = [
    "FASHION_MNIST_CLASSES",
    "IMAGE_SUFFIXES",
    "ImageSet",
    "read_idx",
    "scan_folder",
    "read_image",
    "to_model_image",
    "image_store",
    "split_images",
    "augment",
]

log = logging.getLogger(__name__)

FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
#: the files of a class folder that are read as images (others are skipped, said once)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
_IDX_MAGIC = {2051: 3, 2049: 1}  # images (N, rows, cols), labels (N,)
_STORE_FORMAT = 1
# A class with this many times fewer images than the largest is called out (unbalanced).
_UNBALANCED = 3.0


def _pil() -> Any:
    """The PIL.Image module; one line naming the extra to install when Pillow is absent."""
    return require("PIL.Image", "image", "reading image files (Pillow)")


# ---- reading -----------------------------------------------------------------------------------


def read_idx(path: Path) -> np.ndarray:
    """The array of an IDX file (Fashion-MNIST's format: big-endian magic 2051 for uint8 images
    (N, rows, cols), 2049 for uint8 labels (N,)); DataError naming the file when it is not one."""
    raw = path.read_bytes()
    magic = int.from_bytes(raw[:4], "big") if len(raw) >= 4 else -1
    dims = _IDX_MAGIC.get(magic)
    if dims is None:
        raise DataError(f"{path}: not an IDX file of images or labels (magic {magic})")
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims))
    body = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims)
    if body.size != int(np.prod(shape)):
        raise DataError(f"{path}: holds {body.size} bytes, its header says {shape}")
    return body.reshape(shape)


def scan_folder(root: Path) -> tuple[list[str], list[tuple[Path, int]]]:
    """(class names, (file, label) per image) of a folder with one subfolder per class, names
    sorted (label i = the i-th name). DataError for a missing or empty folder or class; files
    that are not PNG/JPEG are skipped (one warning line); an unbalanced folder is one warning."""
    if not root.is_dir():
        raise DataError(f"{root}: no such folder of images (one subfolder per class)")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise DataError(f"{root}: no class folders (put each class's images in a subfolder)")
    items: list[tuple[Path, int]] = []
    skipped: list[Path] = []
    for label, name in enumerate(classes):
        files = sorted(p for p in (root / name).rglob("*") if p.is_file())
        images = [p for p in files if p.suffix.lower() in IMAGE_SUFFIXES]
        skipped += [p for p in files if p.suffix.lower() not in IMAGE_SUFFIXES]
        if not images:
            raise DataError(f"{root / name}: an empty class folder (no PNG or JPEG images)")
        items += [(p, label) for p in images]
    if skipped:
        log.warning(
            "%s: %d files are not PNG or JPEG and were skipped (e.g. %s)",
            root,
            len(skipped),
            skipped[0],
        )
    counts = Counter(label for _, label in items)
    big, small = max(counts.values()), min(counts.values())
    if big >= _UNBALANCED * small:
        least = classes[min(counts, key=lambda k: counts[k])]
        log.warning(
            "%s: unbalanced classes: '%s' has %d images, the largest class %d: accuracy will "
            "favour the larger classes",
            root,
            least,
            small,
            big,
        )
    return classes, items


def read_image(path: Path) -> Any:
    """The decoded Pillow image of ``path``; DataError naming the file when it cannot be read."""
    image_module = _pil()
    try:
        with image_module.open(path) as img:
            img.load()
            return img.copy()
    except (OSError, SyntaxError, ValueError) as err:  # UnidentifiedImageError is an OSError
        raise DataError(f"{path}: not an image Pillow can read ({err})") from None


def read_array(path: Path) -> np.ndarray:
    """The array of a .npy file (no pickled objects); DataError naming the file otherwise."""
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise DataError(f"{path}: not a .npy array ({err})") from None


def to_model_image(img: Any, size: int, channels: int) -> tuple[np.ndarray, list[str]]:
    """(``(C, size, size)`` uint8 array, what was converted) of a Pillow image: to grey ("L") or
    RGB as ``channels`` says (alpha dropped), then resized (bilinear) to size × size."""
    notes = []
    mode = "L" if channels == 1 else "RGB"
    if img.mode != mode:
        notes.append(f"converted from {img.mode} to {'grey' if channels == 1 else 'RGB'}")
        img = img.convert(mode)
    if img.size != (size, size):
        notes.append(f"resized from {img.size[0]}x{img.size[1]} to {size}x{size}")
        img = img.resize((size, size), resample=_pil().Resampling.BILINEAR)
    array = np.asarray(img, dtype=np.uint8)
    array = array[None] if array.ndim == 2 else array.transpose(2, 0, 1)  # (C, H, W)
    return np.ascontiguousarray(array), notes


def array_image(array: Any, size: int, channels: int) -> tuple[np.ndarray, list[str]]:
    """A raw image array as the model reads it, ``(C, size, size)`` uint8: (H, W), (H, W, C) or
    (C, H, W), uint8 or floats in [0, 1], converted as :func:`to_model_image` converts a
    picture. DataError for any other shape or range."""
    a = np.asarray(array)
    if a.ndim == 3 and a.shape[0] in (1, 3, 4) and a.shape[-1] not in (1, 3, 4):
        a = a.transpose(1, 2, 0)  # (C, H, W) -> (H, W, C)
    if a.ndim == 3 and a.shape[-1] == 1:
        a = a[..., 0]
    if not (a.ndim == 2 or (a.ndim == 3 and a.shape[-1] in (3, 4))) or 0 in a.shape:
        raise DataError(
            f"an image array must be (H, W), (H, W, C) or (C, H, W) with 1, 3 or 4 channels, "
            f"got shape {tuple(np.shape(array))}"
        )
    if a.dtype != np.uint8:
        if not np.issubdtype(a.dtype, np.number) or a.min() < 0 or a.max() > 1:
            raise DataError(
                "an image array holds uint8 values (0-255) or floats in [0, 1], got "
                f"{a.dtype} from {a.min()} to {a.max()}"
            )
        a = np.rint(a * 255).astype(np.uint8)
    image_module = _pil()
    return to_model_image(image_module.fromarray(a), size, channels)


# ---- the image store ---------------------------------------------------------------------------


@dataclass
class ImageSet:
    """A decoded source: ``images`` (N, C, H, W) uint8, memory-mapped; ``labels`` (N,) int64;
    the class names in label order."""

    images: np.ndarray
    labels: np.ndarray
    classes: list[str]

    def __len__(self) -> int:
        return len(self.labels)


def image_store(cfg: DataConfig, source: str, size: int, channels: int) -> ImageSet:
    """The decoded images of ``source`` ("train" or "test" of the registered dataset, or the
    path of a folder of one's own), as the model reads them: built on first use, then opened
    memory-mapped as long as its sources and files are unchanged."""
    files, build = _source(cfg, source, size, channels)
    key = {
        "format": _STORE_FORMAT,
        "source": source,
        "dataset": cfg.dataset,
        "size": size,
        "channels": channels,
        "files": [fingerprint(p) for p in files],
    }
    folder = cache_dir() / "images" / f"{cfg.dataset or 'folder'}-{cache_key(key)}"
    opened = _open_store(folder, key)
    if opened is None:
        with new_folder(folder, overwrite=True) as tmp:
            images, labels, classes = build()
            np.save(tmp / "images.npy", images)
            np.save(tmp / "labels.npy", labels.astype(np.int64))
            write_json(tmp / "classes.json", classes)
            names = ["images.npy", "labels.npy", "classes.json"]
            write_json(tmp / "manifest.json", {"key": key, "checksums": checksums(tmp, names)})
        log.info("image store: %d images of %s in %s", len(labels), source, folder)
        opened = _open_store(folder, key)
        assert opened is not None  # just written and checked
    return opened


def _open_store(folder: Path, key: dict[str, Any]) -> ImageSet | None:
    """The store in ``folder`` when its manifest says it was built from ``key`` and its files
    are unchanged; else None (said why, when there was one)."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    problem = (
        "built from other sources or settings"
        if manifest.get("key") != json.loads(json.dumps(key))
        else checksum_problem(folder, manifest.get("checksums", {}))
    )
    if problem:
        log.warning("image store %s: %s; building it again", folder, problem)
        return None
    images = np.load(folder / "images.npy", mmap_mode="r")
    labels = np.load(folder / "labels.npy")
    classes = json.loads((folder / "classes.json").read_text(encoding="utf-8"))
    return ImageSet(images, labels, classes)


def _source(cfg: DataConfig, source: str, size: int, channels: int) -> tuple[list[Path], Any]:
    """(the files ``source`` is read from, a function that decodes it)."""
    if cfg.uses_own_files:
        root = Path(source)
        classes, items = scan_folder(root)
        return [p for p, _ in items], lambda: _decode_folder(root, classes, items, size, channels)
    spec = get_spec(cfg.dataset)
    if spec.task != cfg.kind:
        raise DataError(f"dataset '{cfg.dataset}' is for {spec.task}, not {cfg.kind} (data.kind)")
    folder = download_dataset(cfg.dataset)
    stem = "train" if source == "train" else "t10k"
    paths = [folder / f"{stem}-images-idx3-ubyte", folder / f"{stem}-labels-idx1-ubyte"]
    return paths, lambda: _decode_idx(paths, size, channels)


def _decode_idx(paths: list[Path], size: int, channels: int) -> tuple[np.ndarray, np.ndarray, list]:
    images, labels = read_idx(paths[0]), read_idx(paths[1])
    if len(images) != len(labels):
        raise DataError(f"{paths[0]}: {len(images)} images, {paths[1]}: {len(labels)} labels")
    pixels = images[:, None]  # (N, 1, 28, 28)
    if pixels.shape[-1] != size or channels != 1:
        log.warning(
            "Fashion-MNIST: 28x28 grey images converted to %dx%d with %d channel(s), as the "
            "model reads",
            size,
            size,
            channels,
        )
        pixels = np.stack([_convert_array(x[0], size, channels) for x in pixels])
    return np.ascontiguousarray(pixels), labels.astype(np.int64), list(FASHION_MNIST_CLASSES)


def _convert_array(grey: np.ndarray, size: int, channels: int) -> np.ndarray:
    return to_model_image(_pil().fromarray(grey), size, channels)[0]


def _decode_folder(
    root: Path, classes: list[str], items: list[tuple[Path, int]], size: int, channels: int
) -> tuple[np.ndarray, np.ndarray, list]:
    """Every image of a class folder decoded and converted; one line says how many were
    converted and how."""
    pixels = np.empty((len(items), channels, size, size), dtype=np.uint8)
    converted: Counter[str] = Counter()
    for i, (path, _) in enumerate(items):
        pixels[i], notes = to_model_image(read_image(path), size, channels)
        converted.update(notes)
    if converted:
        common = converted.most_common()
        said = "; ".join(f"{n} images {what}" for what, n in common[:4])
        log.warning(
            "%s: %s%s (as the model reads: model.image_size, model.channels)",
            root,
            said,
            f"; and {len(common) - 4} other conversions" if len(common) > 4 else "",
        )
    labels = np.array([label for _, label in items], dtype=np.int64)
    return pixels, labels, classes


# ---- splits ------------------------------------------------------------------------------------


def split_images(
    cfg: DataConfig, split: str, size: int, channels: int
) -> tuple[ImageSet, np.ndarray]:
    """(the store ``split`` reads, the indices of its images in it). Registered dataset: train,
    val (a seeded ``data.valid_fraction`` of the training images), train_full, test. One's own
    folder: train (train_dir, less the validation share when there is no valid_dir) and
    valid (valid_dir, or that share)."""
    if cfg.uses_own_files:
        is_valid = split in ("valid", "val", "validation", cfg.valid_split)
        if not is_valid and split not in ("train", cfg.train_split):
            raise DataError(f"your own images have splits 'train' and 'valid', not '{split}'")
        if is_valid and cfg.valid_dir:
            store = image_store(cfg, cfg.valid_dir, size, channels)
            return store, np.arange(len(store))
        if not cfg.train_dir:
            raise DataError(
                "data.train_dir is not set (data.dataset is '', so your own images are read)"
            )
        store = image_store(cfg, cfg.train_dir, size, channels)
        if cfg.valid_dir:
            return store, np.arange(len(store))
        return store, _held_out(len(store), cfg, is_valid)
    if split == "test":
        store = image_store(cfg, "test", size, channels)
        return store, np.arange(len(store))
    if split not in ("train", "val", "train_full"):
        raise DataError(
            f"dataset '{cfg.dataset}' has no split '{split}'; splits: train, val, train_full, test"
        )
    store = image_store(cfg, "train", size, channels)
    if split == "train_full":
        return store, np.arange(len(store))
    return store, _held_out(len(store), cfg, split == "val")


def _held_out(n: int, cfg: DataConfig, valid: bool) -> np.ndarray:
    """The sorted indices of the validation share (``valid``) or of the rest, of ``n`` images:
    a permutation seeded with ``data.valid_seed``."""
    order = np.random.default_rng(cfg.valid_seed).permutation(n)
    k = max(1, round(n * cfg.valid_fraction))
    if k >= n:
        raise DataError(f"{n} training images: too few to hold out data.valid_fraction of them")
    return np.sort(order[:k] if valid else order[k:])


# ---- augmentation ------------------------------------------------------------------------------


def augment(pixels: Tensor, cfg: DataConfig, generator: torch.Generator) -> Tensor:
    """``pixels`` (B, C, H, W) floats in [0, 1] augmented as ``data.augment`` says (see
    :class:`~aiayn.data.config.DataConfig`); the draws come from ``generator``."""
    b, _, h, w = pixels.shape
    if "crop" in cfg.augment and cfg.crop_padding:
        p = cfg.crop_padding
        padded = torch.nn.functional.pad(pixels, (p, p, p, p))  # background is 0
        dy = torch.randint(0, 2 * p + 1, (b,), generator=generator)
        dx = torch.randint(0, 2 * p + 1, (b,), generator=generator)
        pixels = torch.stack(
            [
                padded[i, :, y : y + h, x : x + w]
                for i, (y, x) in enumerate(zip(dy.tolist(), dx.tolist()))
            ]
        )
    if "flip" in cfg.augment:
        flip = torch.rand(b, generator=generator) < 0.5
        pixels = torch.where(flip[:, None, None, None], pixels.flip(-1), pixels)
    if "erase" in cfg.augment:
        pixels = pixels.clone()
        for i in range(b):
            if float(torch.rand(1, generator=generator)) < cfg.erase_prob:
                _erase(pixels[i], generator)
    return pixels


def _erase(image: Tensor, generator: torch.Generator) -> None:
    """Random erasing (Zhong et al. 2020, torchvision's defaults): a rectangle of 2-33% of the
    image, aspect ratio in [0.3, 3.3], filled with uniform noise, in place. Shape: (C, H, W)."""
    _, h, w = image.shape
    for _ in range(10):  # a few tries for a rectangle that fits, as torchvision does
        area = h * w * float(torch.empty(1).uniform_(0.02, 1 / 3, generator=generator))
        ratio = float(
            torch.exp(torch.empty(1).uniform_(np.log(0.3), np.log(1 / 0.3), generator=generator))
        )
        eh, ew = int(round((area * ratio) ** 0.5)), int(round((area / ratio) ** 0.5))
        if 0 < eh < h and 0 < ew < w:
            y = int(torch.randint(0, h - eh + 1, (1,), generator=generator))
            x = int(torch.randint(0, w - ew + 1, (1,), generator=generator))
            image[:, y : y + eh, x : x + ew] = torch.rand(
                image.shape[0], eh, ew, generator=generator
            )
            return


def class_counts(labels: Sequence[int] | np.ndarray) -> Counter[int]:
    """Images per label."""
    return Counter(int(x) for x in labels)
