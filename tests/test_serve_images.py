"""/v1/classify on an image classifier (issue #67): base64 PNG/JPEG files or raw pixel arrays in,
the top-k classes out (the library's own probabilities), the attention heat maps on request (the
same maps as `aiayn plot attention --image`), and every bad image one line with a 4xx."""

from __future__ import annotations

import io
from base64 import b64encode

import numpy as np
import pytest
import torch
from PIL import Image
from serve_helpers import IMAGE_CLASSES, make_folder, make_image_folder

pytest.importorskip("httpx", reason="httpx (FastAPI's TestClient) is not installed")
from fastapi.testclient import TestClient  # noqa: E402

import aiayn  # noqa: E402
from aiayn.serve import Limits, create_app  # noqa: E402
from aiayn.viz.image_attention import attention_rollout, image_attention, patch_attention  # noqa: E402


def picture(seed: int = 0, size: int = 28, mode: str = "L") -> np.ndarray:
    rng = np.random.default_rng(seed)
    shape = (size, size) if mode == "L" else (size, size, 3)
    return rng.integers(0, 256, shape).astype(np.uint8)


def encoded(array: np.ndarray, fmt: str = "PNG") -> str:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format=fmt)
    return b64encode(buf.getvalue()).decode("ascii")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_image_folder(tmp_path_factory.mktemp("vit") / "model")


@pytest.fixture(scope="module")
def client(folder):
    with TestClient(create_app(aiayn.load(folder), Limits(max_texts=4, max_image_pixels=4096))) as c:
        yield c


def test_a_png_and_its_array_get_the_librarys_top_k(client, folder):
    a = picture(1)
    png = client.post("/v1/classify", json={"images": [encoded(a)], "top_k": 2}).json()
    raw = client.post("/v1/classify", json={"arrays": [a.tolist()], "top_k": 2}).json()
    floats = client.post("/v1/classify", json={"arrays": [(a / 255).tolist()], "top_k": 2}).json()
    probs = aiayn.load(folder).image_probs([a])[0]
    best = probs.topk(2)
    want = [{"label": IMAGE_CLASSES[i], "prob": pytest.approx(float(p), abs=1e-6)}
            for p, i in zip(best.values, best.indices)]
    for answer in (png, raw, floats):
        result = answer["results"][0]
        assert result["top"] == want and result["label"] == want[0]["label"]
        assert "converted" not in result and "attention" not in result
    assert want[0]["prob"] != want[1]["prob"]  # a model that tells the classes apart
    assert client.get("/v1/model").json()["routes"] == ["/v1/classify"]


def test_top_k_defaults_to_five_at_most_every_class_and_a_batch_keeps_each_images_answer(client):
    images = [encoded(picture(s)) for s in range(3)]
    together = client.post("/v1/classify", json={"images": images}).json()["results"]
    alone = [client.post("/v1/classify", json={"images": [i]}).json()["results"][0] for i in images]
    assert [len(r["top"]) for r in together] == [3, 3, 3]  # 3 classes
    for a, b in zip(together, alone):
        assert a["label"] == b["label"]
        assert [t["prob"] for t in a["top"]] == pytest.approx([t["prob"] for t in b["top"]], abs=1e-6)


def test_a_jpeg_of_colour_and_another_size_is_converted_and_says_so(client):
    jpeg = encoded(picture(2, size=40, mode="RGB"), "JPEG")
    url = "data:image/jpeg;base64," + jpeg  # what a browser's FileReader gives
    for image in (jpeg, url):
        result = client.post("/v1/classify", json={"images": [image]}).json()["results"][0]
        assert result["converted"] == "converted from RGB to grey, resized from 40x40 to 28x28"


def test_the_attention_maps_are_those_plot_attention_draws(client, folder, tmp_path):
    a = picture(3)
    np.save(tmp_path / "a.npy", a)
    answer = client.post("/v1/classify", json={"arrays": [a.tolist()], "attention": True}).json()
    att = answer["results"][0]["attention"]
    seen = image_attention(folder, tmp_path / "a.npy")  # what `aiayn plot attention --image` reads
    assert att["grid"] == 4 and att["source"] == "class token"
    assert np.array(att["maps"]).shape == (2, 2, 16)  # layers, heads, 4x4 patches
    np.testing.assert_allclose(att["maps"], patch_attention(seen.weights, True), atol=1e-4)
    rollout = patch_attention(attention_rollout(seen.weights), True)
    np.testing.assert_allclose(att["rollout"], rollout, atol=1e-4)
    assert answer["results"][0]["label"] == seen.label


@pytest.mark.parametrize(
    "body, status, message",
    [
        ({"images": ["not base64!"]}, 422, "images[0]: not base64"),
        ({"images": [b64encode(b"hello, not a picture").decode()]}, 422, "images[0]: not an image"),
        ({"images": ["R0lGODlhAQABAAAAACw="]}, 422, "images[0]: not an image"),  # a cut GIF
        ({"arrays": [[[1, 2], [3]]]}, 422, "arrays[0]: not an array of numbers"),
        ({"arrays": [[["a", "b"]]]}, 422, "arrays[0]: not an array of numbers"),
        ({"arrays": [[[0, 300], [0, 0]]]}, 422, "arrays[0]: integer pixels are 0-255, got 0 to 300"),
        ({"arrays": [[[0.0, 2.5], [0.0, 0.0]]]}, 422, "floats in [0, 1]"),
        ({"arrays": [[1, 2, 3]]}, 422, "arrays[0]: an image array must be (H, W)"),
        ({"arrays": [7]}, 422, "arrays[0]: an array is a list of pixel rows"),
        ({"arrays": [[[0] * 65] * 65]}, 422, "arrays[0]: 65x65 is 4225 pixels; the limit is 4096"),
        ({"images": [encoded(picture(0))] * 5}, 422, "images: at most 4 per request, got 5"),
        ({"texts": ["a cat"]}, 422, "send 'images' (base64 PNG or JPEG) or 'arrays'"),
        ({"images": ["x"], "arrays": [[[0]]]}, 422, "send one of 'texts', 'images' or 'arrays'"),
        ({}, 422, "send one of 'texts', 'images' or 'arrays', got none"),
        ({"images": [encoded(picture(0))], "top_k": 0}, 422, "top_k"),
        ({"images": []}, 422, "images"),
    ],
)
def test_bad_images_are_one_line(client, body, status, message):
    r = client.post("/v1/classify", json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert message in error and "\n" not in error


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_nan_or_infinity_in_an_array_is_one_line(client, value):
    raw = '{"arrays": [[[0.5, 0.5], [0.5, %s]]]}' % value  # Python's JSON parser reads them
    r = client.post("/v1/classify", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422
    assert r.json()["error"] == "arrays[0]: holds a value that is not a finite number"


def test_a_huge_picture_is_refused_from_its_header(client):
    buf = io.BytesIO()
    Image.new("L", (100, 100)).save(buf, format="PNG")  # 10,000 pixels in a few hundred bytes
    r = client.post("/v1/classify", json={"images": [b64encode(buf.getvalue()).decode()]})
    assert r.status_code == 422
    assert r.json()["error"] == (
        "images[0]: 100x100 is 10000 pixels; the limit is 4096 (serve.max_image_pixels)"
    )
    gif = io.BytesIO()
    Image.new("L", (28, 28)).save(gif, format="GIF")
    r = client.post("/v1/classify", json={"images": [b64encode(gif.getvalue()).decode()]})
    assert r.json()["error"] == "images[0]: a GIF image; send a PNG or JPEG file"


def test_a_text_model_refuses_images_and_attention(tmp_path):
    with TestClient(create_app(aiayn.load(make_folder(tmp_path / "c", kind="classifier")))) as c:
        r = c.post("/v1/classify", json={"images": [encoded(picture(0))]})
        assert r.status_code == 422
        assert r.json()["error"] == (
            "this server holds a classification model, which classifies texts: send 'texts'"
        )
        r = c.post("/v1/classify", json={"texts": ["the cat"], "attention": True})
        assert r.json()["error"] == "attention: only for images (an image classifier's)"
        assert c.post("/v1/classify", json={"texts": ["the cat"]}).status_code == 200


def test_an_exported_image_model_classifies_but_has_no_attention(folder, tmp_path):
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    from aiayn.cli import main

    out = tmp_path / "onnx"
    with torch.no_grad():
        assert main(["export", str(folder), "--format", "onnx", "--out", str(out)]) == 0
    a = encoded(picture(4))
    with TestClient(create_app(aiayn.load(out))) as c:
        ok = c.post("/v1/classify", json={"images": [a]}).json()["results"][0]
        r = c.post("/v1/classify", json={"images": [a], "attention": True})
    assert ok["label"] in IMAGE_CLASSES
    assert r.status_code == 422 and r.json()["error"].startswith("attention: ")
