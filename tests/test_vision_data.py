"""Images for the Vision Transformer (issue #67, points 2 and 6): Fashion-MNIST checked against
its decompressed sha256s, class folders read through Pillow, the image store, the seeded
validation share, augmentation, and every bad input one clear line."""

from __future__ import annotations

import gzip
import logging
import os
import sys

import numpy as np
import pytest
import torch
from PIL import Image
from test_vision import run_values, write_images
from trainutil import fails, write_toml

from aiayn.data import DataConfig
from aiayn.data.images import (
    FASHION_MNIST_CLASSES,
    array_image,
    augment,
    image_store,
    read_idx,
    scan_folder,
    split_images,
)
from aiayn.data.registry import FASHION_MNIST_SHA, download_dataset, fashion_mnist_decompress
from aiayn.decode.images import model_images
from aiayn.errors import ConfigError, DataError

MIRROR = "/work/shared/data"
needs_mirror = pytest.mark.skipif(
    not os.path.isdir(os.path.join(os.environ.get("AIAYN_DATA_MIRROR", MIRROR), "fashion_mnist")),
    reason="needs the Fashion-MNIST mirror (AIAYN_DATA_MIRROR)",
)


def own(tmp_path, **kw) -> DataConfig:
    return DataConfig(kind="image_classification", dataset="", train_dir=str(tmp_path), **kw)


# ---- Fashion-MNIST --------------------------------------------------------------------------


@needs_mirror
def test_fashion_mnist_from_the_mirror_is_checked_and_split(tmp_path, monkeypatch):
    monkeypatch.setenv("AIAYN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("AIAYN_DATA_MIRROR", os.environ.get("AIAYN_DATA_MIRROR", MIRROR))
    folder = download_dataset("fashion_mnist")
    assert sorted(
        p.name for p in folder.iterdir() if "-" in p.name and p.suffix != ".gz"
    ) == sorted(FASHION_MNIST_SHA)
    labels = read_idx(folder / "train-labels-idx1-ubyte")
    assert labels.shape == (60000,) and set(np.unique(labels)) == set(range(10))
    cfg = DataConfig(kind="image_classification", dataset="fashion_mnist", valid_split="val")
    store, train = split_images(cfg, "train", 28, 1)
    _, val = split_images(cfg, "val", 28, 1)
    assert store.images.shape == (60000, 1, 28, 28) and store.images.dtype == np.uint8
    assert isinstance(store.images, np.memmap)  # read from disk, not decoded again
    assert len(val) == 6000 and len(train) == 54000 and not set(val) & set(train)
    assert store.classes == list(FASHION_MNIST_CLASSES)
    test_store, test = split_images(cfg, "test", 28, 1)
    assert len(test) == 10000 and test_store.images.shape[0] == 10000


def test_a_text_dataset_is_refused_before_anything_is_read():
    cfg = DataConfig(kind="image_classification", dataset="imdb")
    with pytest.raises(DataError, match="dataset 'imdb' is for classification, not image_classif"):
        split_images(cfg, "train", 28, 1)


def test_a_download_whose_contents_differ_is_refused(tmp_path):
    for name in FASHION_MNIST_SHA:
        with gzip.open(tmp_path / f"{name}.gz", "wb") as f:
            f.write(b"\x00\x00\x08\x01" + bytes(8))
    with pytest.raises(DataError, match="its contents are not Fashion-MNIST's train-images"):
        fashion_mnist_decompress(tmp_path)


def test_an_idx_file_of_another_format_is_refused(tmp_path):
    (tmp_path / "x").write_bytes(b"\x00\x00\x08\x05" + bytes(20))
    with pytest.raises(DataError, match="not an IDX file"):
        read_idx(tmp_path / "x")
    (tmp_path / "y").write_bytes((2049).to_bytes(4, "big") + (5).to_bytes(4, "big") + bytes(3))
    with pytest.raises(DataError, match=r"holds 3 bytes, its header says \(5,\)"):
        read_idx(tmp_path / "y")


# ---- class folders and the store --------------------------------------------------------------


def test_a_folder_is_decoded_once_into_a_store(tmp_path, monkeypatch):
    monkeypatch.setenv("AIAYN_CACHE", str(tmp_path / "cache"))
    images = write_images(tmp_path / "images", per_class=5)
    cfg = own(images)
    first = image_store(cfg, str(images), 8, 1)
    assert first.classes == ["bottom", "top"] and first.images.shape == (10, 1, 8, 8)
    expected = np.asarray(Image.open(images / "top" / "0.png"))
    np.testing.assert_array_equal(first.images[5, 0], expected)
    import aiayn.data.images as module

    monkeypatch.setattr(module, "read_image", lambda path: pytest.fail("decoded again"))
    again = image_store(cfg, str(images), 8, 1)
    np.testing.assert_array_equal(again.images, first.images)


def test_the_validation_share_is_seeded_and_disjoint(tmp_path, monkeypatch):
    monkeypatch.setenv("AIAYN_CACHE", str(tmp_path / "cache"))
    images = write_images(tmp_path / "images", per_class=10)
    cfg = own(images, valid_fraction=0.25)
    _, train = split_images(cfg, "train", 8, 1)
    _, valid = split_images(cfg, "valid", 8, 1)
    assert len(valid) == 5 and sorted([*train, *valid]) == list(range(20))
    _, same = split_images(own(images, valid_fraction=0.25, seed=7), "valid", 8, 1)
    np.testing.assert_array_equal(valid, same)  # data.seed shuffles batches, not the split
    _, other = split_images(own(images, valid_fraction=0.25, valid_seed=1), "valid", 8, 1)
    assert list(other) != list(valid)
    with pytest.raises(
        DataError, match="your own images have splits 'train' and 'valid', not 'test'"
    ):
        split_images(cfg, "test", 8, 1)
    held = write_images(tmp_path / "held", per_class=2, seed=1)
    store, rows = split_images(own(images, valid_dir=str(held)), "val", 8, 1)
    assert len(rows) == 4 and store.images.shape[0] == 4  # valid_dir: all of it, none held out
    _, rows = split_images(own(images, valid_dir=str(held)), "train", 8, 1)
    assert len(rows) == 20


def test_other_sizes_and_colours_are_converted_as_one_line_says(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("AIAYN_CACHE", str(tmp_path / "cache"))
    images = write_images(tmp_path / "images", per_class=3)
    Image.new("RGB", (16, 12), (200, 10, 10)).save(images / "top" / "big.jpg")
    with caplog.at_level(logging.WARNING):
        store = image_store(own(images), str(images), 8, 1)
    assert store.images.shape == (7, 1, 8, 8)
    assert "1 images converted from RGB to grey; 1 images resized from 16x12 to 8x8" in caplog.text
    with caplog.at_level(logging.WARNING):
        pixels = model_images([str(images / "top" / "big.jpg")], 8, 1)
    assert pixels.shape == (1, 1, 8, 8)
    assert "big.jpg: converted from RGB to grey, resized from 16x12 to 8x8" in caplog.text


def test_an_empty_class_folder_is_refused(tmp_path):
    images = write_images(tmp_path / "images", per_class=2)
    (images / "empty").mkdir()
    (images / "empty" / "notes.txt").write_text("no images here")
    with pytest.raises(DataError, match=r"empty: an empty class folder \(no PNG or JPEG"):
        scan_folder(images)
    with pytest.raises(DataError, match="no such folder of images"):
        scan_folder(tmp_path / "missing")
    (tmp_path / "flat").mkdir()
    with pytest.raises(DataError, match="no class folders"):
        scan_folder(tmp_path / "flat")


def test_unbalanced_classes_and_other_files_are_one_warning_each(tmp_path, caplog):
    images = write_images(tmp_path / "images", per_class=9)
    for p in sorted((images / "bottom").iterdir())[2:]:
        p.unlink()
    (images / "top" / "README.txt").write_text("labels by hand")
    with caplog.at_level(logging.WARNING):
        classes, items = scan_folder(images)
    assert len(items) == 11
    lines = caplog.text.splitlines()
    assert sum("1 files are not PNG or JPEG and were skipped" in x for x in lines) == 1
    assert (
        sum("unbalanced classes: 'bottom' has 2 images, the largest class 9" in x for x in lines)
        == 1
    )


def test_an_unreadable_image_in_the_training_folder_names_the_file(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("AIAYN_CACHE", str(tmp_path / "cache"))
    images = write_images(tmp_path / "images", per_class=3)
    (images / "top" / "broken.png").write_bytes(b"not a png at all")
    cfg = write_toml(tmp_path / "vit.toml", run_values(images, **{"train.max_steps": 2}))
    fails(
        capsys,
        ["train", cfg, "--out", tmp_path / "run"],
        "broken.png: not an image Pillow can read",
    )
    assert not (tmp_path / "run").exists()


def test_classifying_a_file_that_is_not_an_image_is_one_line(tmp_path):
    (tmp_path / "notes.png").write_text("hello")
    with pytest.raises(DataError, match="notes.png: not an image Pillow can read"):
        model_images([str(tmp_path / "notes.png")], 8, 1)
    np.save(tmp_path / "a.npy", np.zeros((2, 2, 2, 2)))
    with pytest.raises(DataError, match=r"must be \(H, W\), \(H, W, C\) or \(C, H, W\)"):
        model_images([str(tmp_path / "a.npy")], 8, 1)


@pytest.mark.parametrize(
    "array, message",
    [
        (np.zeros((5, 5, 2)), "with 1, 3 or 4 channels"),
        (np.full((4, 4), 3.0), "uint8 values .0-255. or floats in .0, 1."),
        (np.zeros((0, 4)), "got shape"),
    ],
)
def test_a_bad_array_is_refused(array, message):
    with pytest.raises(DataError, match=message):
        array_image(array, 8, 1)


@pytest.mark.parametrize("shape", [(8, 8), (8, 8, 1), (1, 8, 8), (8, 8, 3), (3, 8, 8), (8, 8, 4)])
def test_arrays_of_each_layout_become_the_model_image(shape):
    out, _ = array_image(np.full(shape, 7, dtype=np.uint8), 8, 1)
    assert out.shape == (1, 8, 8) and out.dtype == np.uint8 and (out == 7).all()


def test_without_pillow_reading_an_image_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "PIL", None)
    monkeypatch.setitem(sys.modules, "PIL.Image", None)
    with pytest.raises(ConfigError, match=r"\(Pillow\) needs the 'image' extra: pip install"):
        model_images([str(tmp_path / "x.png")], 8, 1)


# ---- augmentation ---------------------------------------------------------------------------


def test_augmentation_is_off_by_default_and_documented_when_on():
    assert DataConfig().augment == ()
    pixels = torch.rand(6, 1, 8, 8)
    gen = lambda: torch.Generator().manual_seed(3)  # noqa: E731
    assert torch.equal(augment(pixels, DataConfig(kind="image_classification"), gen()), pixels)
    flip = DataConfig(kind="image_classification", augment=("flip",))
    flipped = augment(pixels, flip, gen())
    for i in range(6):
        assert torch.equal(flipped[i], pixels[i]) or torch.equal(flipped[i], pixels[i].flip(-1))
    crop = DataConfig(kind="image_classification", augment=("crop",), crop_padding=2)
    cropped = augment(pixels, crop, gen())
    assert cropped.shape == pixels.shape
    torch.testing.assert_close(cropped, augment(pixels, crop, gen()))  # same draws, same images
    padded = torch.nn.functional.pad(pixels, (2, 2, 2, 2))
    for i in range(6):  # each a window of the padded image
        assert any(
            torch.equal(cropped[i], padded[i, :, y : y + 8, x : x + 8])
            for y in range(5)
            for x in range(5)
        )
    erase = DataConfig(kind="image_classification", augment=("erase",), erase_prob=1.0)
    erased = augment(pixels, erase, gen())
    changed = (erased != pixels).flatten(1).any(1)
    assert changed.all() and ((erased != pixels).flatten(1).float().mean(1) <= 0.34).all()


def test_training_batches_are_augmented_validation_batches_are_not(tmp_path, monkeypatch):
    from aiayn.run_config import build_run_config
    from aiayn.train.images import ImageClassificationTask

    monkeypatch.setenv("AIAYN_CACHE", str(tmp_path / "cache"))
    images = write_images(tmp_path / "images", per_class=6)
    values = run_values(images, **{"data.augment": ["erase"], "data.erase_prob": 1.0})
    task = ImageClassificationTask(build_run_config(values))
    assert task.setup(None) is None
    store, rows = task.splits["valid"]
    valid = task.collate("valid", [0, 1])
    np.testing.assert_array_equal(
        (valid.pixels * 255).round().byte().numpy(), store.images[np.sort(rows[[0, 1]])]
    )
    train_store, train_rows = task.splits["train"]
    batch = task.collate("train", [0, 1])
    raw = torch.from_numpy(train_store.images[np.sort(train_rows[[0, 1]])]).float() / 255
    assert not torch.equal(batch.pixels, raw)
    assert torch.equal(task.collate("train", [0, 1]).pixels, batch.pixels)  # seeded per batch
