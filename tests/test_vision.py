"""The Vision Transformer kind (issue #67): its registry entry, the patch arithmetic, batch
invariance, FLOPs, and a tiny run on synthetic images trained through the CLI, then evaluated,
classified, summarised, plotted and exported to ONNX (the export gives the native probabilities)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from trainutil import fails, torch_threads, write_toml

import aiayn
from aiayn.cli import main
from aiayn.config import ModelConfig
from aiayn.errors import ConfigError
from aiayn.kinds import IMAGE_CLASSIFICATION, KINDS, PIXELS, get_kind
from aiayn.model import VisionTransformer
from aiayn.model.vision import flops_per_image, n_patches
from aiayn.run_config import build_run_config
from aiayn.train.task import task_class

SIDE = 8


def tiny_vit(pooling: str = "cls", **kw) -> ModelConfig:
    return ModelConfig(
        d_model=16,
        n_heads=2,
        d_ff=32,
        n_encoder_layers=2,
        n_decoder_layers=0,
        dropout=0.0,
        image_size=SIDE,
        patch_size=4,
        pooling=pooling,
        n_classes=3,
        **kw,
    )


def write_images(root: Path, per_class: int = 30, seed: int = 0) -> Path:
    """Two classes of 8x8 grey PNGs: bright top half ("top") or bright bottom half ("bottom")."""
    rng = np.random.default_rng(seed)
    for label, name in enumerate(("bottom", "top")):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            a = rng.integers(0, 60, (SIDE, SIDE)).astype(np.uint8)
            rows = slice(0, SIDE // 2) if label else slice(SIDE // 2, SIDE)
            a[rows] += 150
            Image.fromarray(a).save(root / name / f"{i}.png")
    return root


def run_values(images: Path, **more) -> dict:
    values = {
        "model.d_model": 16,
        "model.n_heads": 2,
        "model.d_ff": 32,
        "model.n_encoder_layers": 1,
        "model.n_decoder_layers": 0,
        "model.dropout": 0.0,
        "model.image_size": SIDE,
        "model.patch_size": 4,
        "model.pooling": "cls",
        "data.kind": IMAGE_CLASSIFICATION,
        "data.dataset": "",
        "data.train_dir": str(images),
        "data.max_tokens": 100,
        "data.valid_fraction": 0.25,
        "train.precision": "fp32",
        "train.device": "cpu",
        "train.lr_schedule": "inverse_sqrt",
        "train.lr": 1e-2,
        "train.warmup_steps": 4,
        "train.max_steps": 60,
        "train.valid_every": 30,
        "train.save_every": 30,
        "train.metrics_every": 30,
        "train.log_every": 10,
    }
    return {**values, **more}


# ---- the registry entry and the model -------------------------------------------------------


def test_the_kind_is_one_registry_entry():
    kind = get_kind(IMAGE_CLASSIFICATION)
    assert kind.model_class is VisionTransformer and kind.input == PIXELS
    assert not kind.tokenized and kind.does("classify_images") and "onnx" in kind.exporters
    assert task_class(IMAGE_CLASSIFICATION).kind == IMAGE_CLASSIFICATION
    assert KINDS[IMAGE_CLASSIFICATION].takes == frozenset({"augment"})


@pytest.mark.parametrize("pooling, tokens", [("cls", 1 + 49), ("mean", 49)])
def test_patch_arithmetic(pooling, tokens):
    """N = HW/P²: a 28x28 image in 4x4 patches is 49 tokens (a class token adds one)."""
    cfg = ModelConfig(
        d_model=16,
        n_heads=2,
        d_ff=32,
        n_encoder_layers=1,
        n_decoder_layers=0,
        image_size=28,
        patch_size=4,
        pooling=pooling,
    )
    assert n_patches(cfg) == 49
    model = VisionTransformer(cfg).eval()
    x = model.embed(torch.rand(3, 1, 28, 28))
    assert x.shape == (3, tokens, 16)
    assert model(torch.rand(3, 1, 28, 28)).shape == (3, cfg.n_classes)


def test_the_patch_projection_is_a_linear_map_of_each_flattened_patch():
    """Eq. 1: x_p^i E, patches in row-major order: the convolution equals unfold + linear."""
    cfg = tiny_vit("mean", channels=3)
    model = VisionTransformer(cfg).eval()
    pixels = torch.rand(2, 3, SIDE, SIDE)
    proj = model.embed.proj
    patches = torch.nn.functional.unfold((pixels - 0.5) / 0.5, 4, stride=4).transpose(1, 2)
    expected = patches @ proj.weight.flatten(1).T + proj.bias  # (B, N, D)
    got = proj((pixels - 0.5) / 0.5).flatten(2).transpose(1, 2)
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_an_images_logits_do_not_depend_on_its_batch(pooling):
    torch.manual_seed(0)
    model = VisionTransformer(tiny_vit(pooling)).eval()
    torch.nn.init.normal_(model.head.weight)  # the zero-initialised head would hide differences
    pixels = torch.rand(5, 1, SIDE, SIDE)
    with torch.no_grad():
        together = model(pixels)
        alone = torch.cat([model(pixels[i : i + 1]) for i in range(5)])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)


def test_the_model_refuses_images_of_another_shape():
    model = VisionTransformer(tiny_vit())
    with pytest.raises(ValueError, match=r"images of shape \(B, 1, 8, 8\), got \(2, 3, 8, 8\)"):
        model(torch.rand(2, 3, SIDE, SIDE))


@pytest.mark.parametrize(
    "stem, patch, depths",
    [("patch", 7, ()), ("conv", 4, ()), ("conv", 8, ()), ("conv", 8, (1, 1, 2, 3))],
)
def test_flops_per_image_match_torchs_count_of_the_matmuls(stem, patch, depths):
    from torch.utils.flop_counter import FlopCounterMode

    cfg = ModelConfig(
        stem=stem,
        stem_depths=depths,
        d_model=32,
        n_heads=4,
        d_ff=64,
        n_encoder_layers=2,
        n_decoder_layers=0,
        image_size=32 if patch == 8 else 28,
        patch_size=patch,
        pooling="cls",
        n_classes=10,
    )
    model = VisionTransformer(cfg).eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.rand(1, 1, cfg.image_size, cfg.image_size))
    assert flops_per_image(cfg) == counter.get_total_flops()


def test_the_conv_stem_gives_the_patch_grid_and_keeps_images_apart():
    """stem = 'conv': log2(P) stride-2 convolutions give the same (H/P)² tokens as the patch
    projection, and GroupNorm (not BatchNorm) keeps an image's logits independent of its batch."""
    torch.manual_seed(0)
    cfg = replace(tiny_vit("cls"), stem="conv")
    model = VisionTransformer(cfg).eval()
    strides = [m.stride for m in model.embed.proj.modules() if isinstance(m, torch.nn.Conv2d)]
    assert strides == [(1, 1), (2, 2), (2, 2), (1, 1)]  # P = 4: two halvings, then the 1x1
    torch.nn.init.normal_(model.head.weight)
    pixels = torch.rand(4, 1, SIDE, SIDE)
    assert model.embed(pixels).shape == (4, 1 + n_patches(cfg), cfg.d_model)
    with torch.no_grad():
        together = model(pixels)
        alone = torch.cat([model(pixels[i : i + 1]) for i in range(4)])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)


def test_stem_depths_stack_convolutions_at_each_resolution():
    """model.stem_depths (1, 2, 3) at P = 4: one convolution at full resolution, two at half
    (the first of stride 2), three at a quarter; the same tokens, one image's logits still
    independent of its batch."""
    torch.manual_seed(0)
    cfg = replace(tiny_vit("cls"), stem="conv", stem_depths=(1, 2, 3))
    model = VisionTransformer(cfg).eval()
    convs = [m for m in model.embed.proj.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [m.stride[0] for m in convs] == [1, 2, 1, 2, 1, 1, 1]  # the last: the 1x1 to D
    assert [m.out_channels for m in convs[:-1]] == [4, 8, 8, 16, 16, 16]  # D = 16: D/4, D/2, D
    assert [m.kernel_size for m in convs] == [(3, 3)] * 6 + [(1, 1)]
    pixels = torch.rand(3, 1, SIDE, SIDE)
    assert model.embed(pixels).shape == (3, 1 + n_patches(cfg), cfg.d_model)
    torch.nn.init.normal_(model.head.weight)
    with torch.no_grad():
        together, alone = model(pixels), torch.cat([model(pixels[i : i + 1]) for i in range(3)])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("model.patch_size", 3, r"patch_size \(3\) must divide image_size \(8\)"),
        ("model.channels", 2, "channels must be 1 .grey. or 3 .RGB., got 2"),
        ("data.augment", ["rotate"], "unknown augmentation 'rotate'"),
        ("data.train_file", "x.tsv", "reads data.train_dir, not data.train_file"),
    ],
)
def test_bad_settings_are_one_clear_error(tmp_path, key, value, message):
    values = run_values(tmp_path)
    build_run_config(values)
    with pytest.raises(ConfigError, match=message):
        build_run_config({**values, key: value})


def test_the_conv_stem_needs_a_power_of_2_patch(tmp_path):
    values = {**run_values(tmp_path), "model.stem": "conv"}
    build_run_config(values)
    with pytest.raises(ConfigError, match=r"patch_size must be a power of 2 \(2, 4, 8, …\), got 1"):
        build_run_config({**values, "model.patch_size": 1})


@pytest.mark.parametrize(
    "stem, depths",
    [("conv", [1, 2]), ("conv", [1, 0, 1]), ("patch", [1, 1, 1])],
)
def test_stem_depths_name_each_resolution_of_the_conv_stem(tmp_path, stem, depths):
    values = {**run_values(tmp_path), "model.stem": "conv", "model.patch_size": 4}
    build_run_config({**values, "model.stem_depths": [1, 2, 2]})
    with pytest.raises(ConfigError, match=r"stem_depths gives the convolutions at each of .* = 3 "):
        build_run_config({**values, "model.stem": stem, "model.stem_depths": depths})


def test_augment_is_refused_for_a_text_kind():
    from aiayn.data import DataConfig

    with pytest.raises(ConfigError, match="data.augment applies to data.kind = 'image_classif"):
        DataConfig(kind="classification", augment=("flip",))


# ---- a run through the CLI ------------------------------------------------------------------


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vit")
    images = write_images(tmp / "images")
    cfg = write_toml(tmp / "vit.toml", run_values(images))
    with torch_threads(1):
        assert main(["train", str(cfg), "--out", str(tmp / "run")]) == 0
    return tmp


def test_training_lowers_the_loss_and_learns_the_task(run):
    rows = [json.loads(x) for x in (run / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if "loss" in r]
    assert losses[-1] < losses[0]
    acc = [r["valid_acc"] for r in rows if "valid_acc" in r]
    assert acc[-1] >= 0.9  # a bright top half or bottom half: easy
    assert not (run / "run" / "best" / "tokenizer.json").exists()  # it reads pixels
    card = (run / "run" / "best" / "README.md").read_text()
    assert "| input | 8x8 grey images, 4 patches of 4x4, cls pooling |" in card
    assert "| tokenizer |" not in card and "aiayn classify" in card


def test_evaluate_and_classify_through_the_cli(run, capsys):
    best = run / "run" / "best"
    with torch_threads(1):
        assert (
            main(
                ["evaluate", str(best), "--src", str(run / "images"), "-o", str(run / "eval.json")]
            )
            == 0
        )
    scores = json.loads((run / "eval.json").read_text())
    assert scores["n"] == 60 and scores["accuracy"] >= 0.9
    assert "accuracy" in capsys.readouterr().out
    top = run / "images" / "top" / "0.png"
    assert main(["classify", str(best), "--image", str(top), "--top-k", "2"]) == 0
    line = capsys.readouterr().out.splitlines()
    assert len(line) == 1
    path, first, p1, second, p2 = line[0].split("\t")
    assert (path, first, second) == (str(top), "top", "bottom")
    assert float(p1) > 0.5 and abs(float(p1) + float(p2) - 1) < 1e-3


def test_average_gives_a_loadable_folder(run):
    out = run / "avg"
    assert main(["average", str(run / "run"), "--last", "2", "-o", str(out)]) == 0
    probs = aiayn.load(out).image_probs([str(run / "images" / "top" / "1.png")])
    assert probs.shape == (1, 2)


def test_a_raw_array_classifies_as_its_picture_does(run):
    model = aiayn.load(run / "run" / "best")
    path = run / "images" / "bottom" / "3.png"
    array = np.asarray(Image.open(path))
    from_file, from_array, from_floats = model.image_probs([str(path), array, array / 255.0])
    torch.testing.assert_close(from_file, from_array)
    torch.testing.assert_close(from_file, from_floats)
    assert model.classify_images([array])[0]["label"] == "bottom"


@pytest.fixture(scope="module")
def conv_run(tmp_path_factory):
    """A few updates of the hybrid (stem = 'conv', two convolutions at the lower resolutions, as
    the recipe): enough to export and compare, and its config.json reloads the same stem."""
    tmp = tmp_path_factory.mktemp("vit_conv")
    images = write_images(tmp / "images", per_class=8)
    more = {"model.stem": "conv", "model.stem_depths": [1, 2, 2], "train.max_steps": 6}
    values = run_values(images, **more)
    cfg = write_toml(tmp / "vit.toml", values)
    with torch_threads(1):
        assert main(["train", str(cfg), "--out", str(tmp / "run")]) == 0
    return tmp


@pytest.mark.parametrize("stem", ["patch", "conv"])
def test_onnx_export_gives_the_native_probabilities(stem, request):
    pytest.importorskip("onnxruntime")
    run = request.getfixturevalue("run" if stem == "patch" else "conv_run")
    out = run / "onnx"
    assert main(["export", str(run / "run" / "best"), "--format", "onnx", "-o", str(out)]) == 0
    files = [str(p) for p in sorted((run / "images").rglob("*.png"))[:12]]
    native = aiayn.load(run / "run" / "best").image_probs(files)
    assert float(native.max() - native.min()) > 1e-3  # trained: not the zero head's uniform
    exported = aiayn.load(out)
    assert exported.engine == "onnx" and not (out / "tokenizer.json").exists()
    torch.testing.assert_close(exported.image_probs(files), native, atol=1e-5, rtol=1e-4)


def test_summary_prints_parameters_and_flops_per_image(run, capsys):
    assert main(["summary", str(run / "run" / "best")]) == 0
    out = capsys.readouterr().out
    cfg = aiayn.load(run / "run" / "best").config.model
    assert "Total params" in out and f"({flops_per_image(cfg):,}; a 8x8x1 image" in out


def test_plot_attention_over_an_image_with_rollout(run):
    pytest.importorskip("matplotlib")
    out = run / "att.png"
    image = str(run / "images" / "top" / "2.png")
    assert (
        main(
            [
                "plot",
                "attention",
                str(run / "run" / "best"),
                "--image",
                image,
                "--rollout",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    titles = Image.open(out).text["Description"].splitlines()
    assert titles == ["layer 1 head 1", "layer 1 head 2", "attention rollout"]


def test_attention_rollout_follows_the_residual_and_the_heads():
    from aiayn.viz.image_attention import attention_rollout, patch_attention

    s = 3
    uniform = torch.full((2, 2, s, s), 1 / s)  # (L, H, S, S)
    rolled = attention_rollout(uniform)
    assert torch.allclose(rolled.sum(-1), torch.ones(s))
    a = 0.5 * torch.full((s, s), 1 / s) + 0.5 * torch.eye(s)
    torch.testing.assert_close(rolled, a @ a)
    assert patch_attention(rolled, cls=True).shape == (s - 1,)
    assert patch_attention(rolled, cls=False).shape == (s,)


def test_a_text_flag_or_a_text_model_is_one_clear_error(run, capsys):
    best = str(run / "run" / "best")
    fails(capsys, ["plot", "attention", best], "give --text TEXT")
    fails(capsys, ["classify", best], "classification")


def test_an_image_model_is_served_with_its_info(run):
    pytest.importorskip("httpx", reason="httpx (FastAPI's TestClient) is not installed")
    from fastapi.testclient import TestClient

    from aiayn.serve import Limits, create_app

    with TestClient(create_app(aiayn.load(run / "run" / "best"), Limits())) as client:
        info = client.get("/v1/model").json()
    assert info["kind"] == IMAGE_CLASSIFICATION and info["vocab_size"] is None
    assert info["config"]["model"]["class_names"] == ["bottom", "top"]


def bench_train():
    """benchmarks/bench_train.py, whose PlainViT (nn.TransformerEncoder) is the reference here and
    the baseline of its image preset."""
    import importlib.util
    import sys

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_train.py"
    if "bench_train" not in sys.modules:
        spec = importlib.util.spec_from_file_location("bench_train", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["bench_train"] = module
        spec.loader.exec_module(module)
    return sys.modules["bench_train"]


@pytest.mark.parametrize("norm_first", [False, True])
def test_the_vit_equals_one_built_from_nn_transformer_encoder(norm_first):
    """Same weights, same logits, loss and gradients as PyTorch's own encoder stack."""
    torch.manual_seed(0)
    cfg = tiny_vit("cls", norm_first=norm_first, activation="gelu")
    bench = bench_train()
    plain = bench.PlainViT(cfg)
    torch.nn.init.normal_(plain.cls)
    torch.nn.init.normal_(plain.pos, std=0.02)
    ours = VisionTransformer(cfg)
    bench.copy_plain_vit_to_aiayn(plain, ours)
    pixels, labels = torch.rand(4, 1, SIDE, SIDE), torch.tensor([0, 1, 2, 1])
    logits, expected = ours(pixels), plain(pixels)
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)
    loss = torch.nn.functional.cross_entropy(logits, labels)
    ref_loss = torch.nn.functional.cross_entropy(expected, labels)
    torch.testing.assert_close(loss, ref_loss)
    loss.backward()
    ref_loss.backward()
    torch.testing.assert_close(
        ours.embed.proj.weight.grad, plain.proj.weight.grad, atol=1e-5, rtol=1e-4
    )
    torch.testing.assert_close(ours.embed.pos.grad, plain.pos.grad, atol=1e-5, rtol=1e-4)
