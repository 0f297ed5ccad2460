"""Plots (issue 9): each writes a non-empty PNG with the expected panels; attention maps show the
weights of the explicit-math attention path."""

from __future__ import annotations

import json
import math

import pytest
import torch

pytest.importorskip("matplotlib", reason="plots need the optional matplotlib dependency")

from PIL import Image  # noqa: E402  (matplotlib depends on Pillow)
from trainutil import thread_fixture, tiny_model_config  # noqa: E402

from aiayn.cli import main  # noqa: E402
from aiayn.errors import AiaynError, DataError  # noqa: E402
from aiayn.model import Transformer, sinusoidal_table  # noqa: E402
from aiayn.model.attention import attention_weights  # noqa: E402
from aiayn.viz import panels, save_figure  # noqa: E402
from aiayn.decode.align import record_attention  # noqa: E402
from aiayn.viz.attention import plot_attention  # noqa: E402
from aiayn.viz.curves import plot_curves, plot_runs, read_metrics  # noqa: E402
from aiayn.viz.pe import pe_similarity, plot_pe, plot_pe_similarity  # noqa: E402


def png_panels(path) -> list[str]:
    """The panel titles a PNG written by save_figure records; asserts it is a real, non-empty PNG."""
    assert path.stat().st_size > 1000
    with Image.open(path) as im:
        assert im.format == "PNG" and im.width > 100 and im.height > 100
        im.load()
        return im.info["Description"].split("\n")


def panel_data(fig) -> dict[str, torch.Tensor]:
    """Title -> the array an image panel draws."""
    return {ax.get_title(): torch.as_tensor(ax.images[0].get_array().data) for ax in panels(fig)}


# ---- positional encoding --------------------------------------------------------------------


def test_plot_pe_cli_writes_one_panel(tmp_path):
    out = tmp_path / "pe.png"
    assert main(["plot", "pe", "--length", "64", "--d-model", "16", "-o", str(out)]) == 0
    titles = png_panels(out)
    assert len(titles) == 1 and "64 positions" in titles[0]


def test_plot_pe_draws_the_model_table():
    fig = plot_pe(length=50, depth=8)
    (ax,) = panels(fig)
    drawn = torch.as_tensor(ax.collections[0].get_array()).reshape(50, 8)
    torch.testing.assert_close(drawn, sinusoidal_table(50, 8))


def test_pe_similarity_cli_two_panels_and_zoom(tmp_path):
    out = tmp_path / "sim.png"
    assert main(["plot", "pe-similarity", "--position", "1000", "-o", str(out)]) == 0
    titles = png_panels(out)
    assert len(titles) == 2 and "zoom: positions 950…1050" in titles[1]


def test_pe_similarity_values():
    table = sinusoidal_table(300, 64).double()
    sim = pe_similarity(table, 100)
    assert sim[100].item() == pytest.approx(1.0)
    # cosine of two encodings depends only on their offset: sum_i cos(k·ω_i) / (D/2)
    for k in (1, 7, 50):
        expected = torch.cos(k / torch.pow(10000.0, torch.arange(0, 64, 2).double() / 64)).mean()
        assert sim[100 + k].item() == pytest.approx(expected.item(), abs=1e-6)
        assert sim[100 - k].item() == pytest.approx(expected.item(), abs=1e-6)
    fig = plot_pe_similarity(position=100, length=300, depth=64, window=10)
    full, zoom = panels(fig)
    assert list(zoom.lines[0].get_xdata()) == list(range(90, 111))


@pytest.mark.parametrize("argv, message", [
    (["pe-similarity", "--position", "5000"], "--position must be in [0, 2047]"),
    (["pe", "--d-model", "7"], "--d-model must be an even number"),
    (["pe", "--length", "0"], "--length must be at least 1"),
    (["pe", "-o", "pe.jpg"], "ending in .png"),
])
def test_plot_pe_bad_input(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["plot", *argv]) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_save_into_missing_folder_is_created_and_unwritable_is_clear(tmp_path):
    path = save_figure(plot_pe(8, 4), tmp_path / "a" / "b" / "pe.png")
    assert path.stat().st_size > 0
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(AiaynError, match="cannot write the figure"):
        save_figure(plot_pe(8, 4), blocker / "pe.png")


def test_missing_matplotlib_is_a_clear_error(monkeypatch):
    import sys

    from aiayn import viz

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    with pytest.raises(AiaynError, match=r"pip install -e '\.\[plot\]'"):
        viz.pyplot()


# ---- attention ------------------------------------------------------------------------------


def tiny_model(n_enc=2, n_dec=2) -> Transformer:
    cfg = tiny_model_config(vocab=24, max_len=32, d_model=16, n_heads=2, d_ff=32,
                            n_encoder_layers=n_enc, n_decoder_layers=n_dec, dropout=0.1,
                            attention_dropout=0.1)
    return Transformer(cfg)


def reference_weights(model, src, tgt):
    """Each layer's weights recomputed with attention_weights from the inputs its attention sees,
    captured with hooks (post-LN: a sub-layer sees the residual stream as is)."""
    inputs: dict[str, torch.Tensor] = {}
    hooks = []
    for name, module in model.named_modules():
        if name.endswith(("attn_block", "self_block", "cross_block")):
            hooks.append(module.register_forward_pre_hook(
                lambda m, a, name=name: inputs.__setitem__(name, a[0])))
    with torch.no_grad():
        model.eval()
        model(src, tgt)
    for h in hooks:
        h.remove()
    memory = model.encode(src)
    src_mask, tgt_mask = model.src_mask(src), torch.ones(1, 1, tgt.size(1), tgt.size(1)).tril().bool()
    ref = {}
    for l, layer in enumerate(model.encoder.layers):
        x = inputs[f"encoder.layers.{l}.attn_block"]
        k, _ = layer.self_attn.project_kv(x, x)
        ref[("encoder", l)] = attention_weights(layer.self_attn.project_q(x), k, src_mask)[0]
    for l, layer in enumerate(model.decoder.layers):
        x = inputs[f"decoder.layers.{l}.self_block"]
        k, _ = layer.self_attn.project_kv(x, x)
        ref[("decoder", l)] = attention_weights(layer.self_attn.project_q(x), k, tgt_mask)[0]
        x = inputs[f"decoder.layers.{l}.cross_block"]
        k, _ = layer.cross_attn.project_kv(memory, memory)
        ref[("cross", l)] = attention_weights(layer.cross_attn.project_q(x), k, src_mask)[0]
    return ref


TITLES = {"encoder": "enc self", "decoder": "dec self", "cross": "enc-dec"}


def test_plotted_attention_equals_explicit_math_path():
    model = tiny_model().train()  # record_attention must switch dropout off itself
    src, tgt = torch.tensor([[5, 9, 11, 4, 2]]), torch.tensor([[1, 7, 8, 13]])
    maps = record_attention(model, src[0], tgt[0].tolist())
    assert model.training  # and restore the mode
    fig = plot_attention(maps, [f"s{i}" for i in range(5)], [f"t{i}" for i in range(4)])
    drawn = panel_data(fig)
    assert len(drawn) == 3 * 2 * 2
    ref = reference_weights(model, src, tgt)
    for (kind, l), w in ref.items():
        for h in range(2):
            torch.testing.assert_close(drawn[f"{TITLES[kind]} · layer {l + 1} · head {h + 1}"],
                                       w[h], rtol=1e-5, atol=1e-6)
    # decoder self-attention is causal; every row is a distribution
    assert drawn["dec self · layer 2 · head 1"].triu(1).abs().max() == 0
    for w in drawn.values():
        torch.testing.assert_close(w.sum(-1), torch.ones(w.size(0), dtype=w.dtype))


def test_attention_layer_and_head_selection_and_tokens():
    model = tiny_model()
    maps = record_attention(model, [5, 9, 11, 2], [1, 7, 8])
    fig = plot_attention(maps, ["a", "b", "c", "</s>"], ["<s>", "x", "y"], layers=[2], heads=[1])
    axes = panels(fig)
    assert [ax.get_title() for ax in axes] == [
        f"{TITLES[k]} · layer 2 · head 1" for k in ("encoder", "decoder", "cross")]
    cross = axes[2]
    assert [t.get_text() for t in cross.get_xticklabels()] == ["a", "b", "c", "</s>"]
    assert [t.get_text() for t in cross.get_yticklabels()] == ["<s>", "x", "y"]
    torch.testing.assert_close(panel_data(fig)[axes[2].get_title()], maps.cross[1][0])


def test_attention_unequal_depths():
    maps = record_attention(tiny_model(n_enc=3, n_dec=1), [5, 9], [1, 7])
    assert len(panels(plot_attention(maps, ["a", "b"], ["<s>", "x"], heads=[2]))) == 3 + 1 + 1


@pytest.mark.parametrize("kwargs, message", [
    (dict(layers=[3]), "layer 3 does not exist: the model has layers 1 to 2"),
    (dict(heads=[0]), "head 0 does not exist"),
    (dict(tgt_tokens=["<s>"]), "query and"),
])
def test_attention_bad_selection(kwargs, message):
    maps = record_attention(tiny_model(), [5, 9, 2], [1, 7])
    args = {"src_tokens": ["a", "b", "c"], "tgt_tokens": ["<s>", "x"], **kwargs}
    with pytest.raises(AiaynError, match=message):
        plot_attention(maps, **args)


# ---- learning curves ------------------------------------------------------------------------


def write_metrics(folder, n=40, bleu=True, tail=""):
    lines = []
    for step in range(1, n + 1):
        row = dict(step=step * 10, wall=step * 3.0, epoch=step // 20, loss=8.0 * math.exp(-step / 15),
                   lr=min(step / 10, (10 / step) ** 0.5) * 1e-3, tokens_per_s=1000.0)
        if step % 10 == 0:
            row["valid_loss"] = row["loss"] + 0.3
            if bleu:
                row["valid_bleu"] = 3.0 * step / 10
        lines.append(json.dumps(row))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n" + tail)
    return folder


def test_plot_curves_cli_six_panels(tmp_path):
    run = write_metrics(tmp_path / "run")
    out = tmp_path / "curves.png"
    assert main(["plot", "curves", str(run), "-o", str(out)]) == 0
    titles = png_panels(out)
    assert len(titles) == 6
    assert sum("vs step" in t for t in titles) == 3 and sum("vs wall" in t for t in titles) == 3


def test_plot_curves_plots_the_logged_values(tmp_path):
    rows = read_metrics(write_metrics(tmp_path / "run"))
    loss_step, lr_step, metric_step, loss_wall, _, _ = panels(plot_curves(rows))
    train, valid = loss_step.lines
    assert list(train.get_xdata()) == [r["step"] for r in rows]
    assert list(valid.get_ydata()) == [r["valid_loss"] for r in rows if "valid_loss" in r]
    assert list(metric_step.lines[0].get_ydata()) == [3.0, 6.0, 9.0, 12.0]
    assert metric_step.lines[0].get_label() == "valid_bleu"
    # 120 s of wall-clock are shown in minutes
    assert loss_wall.get_xlabel() == "wall-clock (min)" and max(loss_wall.lines[0].get_xdata()) == 2.0


def test_plot_curves_without_bleu_shows_perplexity(tmp_path):
    rows = read_metrics(write_metrics(tmp_path / "run", bleu=False))
    metric = panels(plot_curves(rows))[2]
    (line,) = metric.lines
    assert line.get_label() == "valid_ppl"
    assert line.get_ydata()[0] == pytest.approx(math.exp(rows[9]["valid_loss"]))


def test_plot_curves_logged_perplexity_and_nll(tmp_path):
    rows = [dict(step=s, wall=float(s), loss=3.0, nll=2.5, lr=1e-3) for s in range(1, 5)]
    rows[-1].update(valid_loss=2.0, valid_ppl=7.0)
    loss_ax, _, metric = panels(plot_curves(rows))[:3]
    assert [line.get_label() for line in loss_ax.lines] == ["loss", "nll", "valid_loss"]
    assert [list(line.get_ydata()) for line in metric.lines] == [[7.0]]


def test_plot_curves_of_several_runs_share_the_panels(tmp_path):
    first, second = write_metrics(tmp_path / "m1"), write_metrics(tmp_path / "m2", n=20, bleu=False)
    out = tmp_path / "both.png"
    assert main(["plot", "curves", str(first), str(second), "-o", str(out)]) == 0
    assert len(png_panels(out)) == 6
    fig = plot_runs([("m1", read_metrics(first)), ("m2", read_metrics(second))])
    loss_step, lr_step, metric_step = panels(fig)[:3]
    assert [line.get_label() for line in loss_step.lines] == ["m1 loss", "m1 valid_loss",
                                                             "m2 loss", "m2 valid_loss"]
    assert [line.get_label() for line in lr_step.lines] == ["m1 lr", "m2 lr"]
    assert [line.get_label() for line in metric_step.lines] == ["m1 valid_bleu", "m2 valid_ppl"]
    assert len(loss_step.lines[2].get_xdata()) == 20


def test_read_metrics_skips_an_unfinished_last_line(tmp_path):
    run = write_metrics(tmp_path / "run", n=5, tail='{"step": 60, "wa')
    assert len(read_metrics(run)) == 5


@pytest.mark.parametrize("content, message", [
    ('{"step": 1, "wall": 0.1, "loss": 3}\nnot json\n{"step": 2, "wall": 1, "loss": 2}\n',
     "metrics.jsonl:2: not a JSON object"),
    ('{"wall": 0.1, "loss": 3}\n', "metrics.jsonl:1: 'step' is missing"),
    ("[1, 2]\n", "metrics.jsonl:1: not a JSON object"),
    ("", "no metrics yet"),
])
def test_read_metrics_bad_files(tmp_path, content, message):
    (tmp_path / "metrics.jsonl").write_text(content)
    with pytest.raises(DataError, match=message):
        read_metrics(tmp_path)


def test_plot_curves_missing_run_dir_cli(tmp_path, capsys):
    assert main(["plot", "curves", str(tmp_path / "nope"), "-o", str(tmp_path / "c.png")]) == 2
    assert "no metrics file" in capsys.readouterr().err


# ---- attention on a model's own translation -------------------------------------------------

PAIRS = [("a man rides a bike .", "ein mann fährt ein fahrrad ."),
         ("two dogs play in the snow .", "zwei hunde spielen im schnee .")]


one_thread = thread_fixture(scope="module")  # tiny models: threads only contend


@pytest.fixture(scope="module")
def trained_dir(tmp_path_factory, one_thread):
    """A tiny model that has learned the two PAIRS by heart (40 Adam steps, ~1 s)."""
    import torch.nn.functional as F

    from aiayn.folder.checkpoint import save_model_dir
    from aiayn.data.batching import collate_translation
    from aiayn.data.tokenizer import train_tokenizer

    tokenizer = train_tokenizer([s for pair in PAIRS for s in pair] * 5, kind="bpe", vocab_size=300)
    cfg = tiny_model_config(vocab=tokenizer.vocab_size, max_len=64, n_heads=2)
    torch.manual_seed(1)
    model = Transformer(cfg)
    batch = collate_translation([(tokenizer.encode(s), tokenizer.encode(t)) for s, t in PAIRS])
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(40):
        logits = model(batch.src, batch.tgt_in)  # (B, T, V)
        loss = F.cross_entropy(logits.flatten(0, 1), batch.tgt_out.flatten(),
                               ignore_index=cfg.pad_id)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return save_model_dir(tmp_path_factory.mktemp("viz") / "model", model, cfg,
                          tokenizer_json=tokenizer.to_str())


@pytest.fixture
def model_dir(trained_dir, tmp_path):
    """A throw-away copy of the trained model folder (tests may damage it)."""
    import shutil

    return shutil.copytree(trained_dir, tmp_path / "model")


def test_attention_of_translation_uses_the_produced_translation(model_dir):
    from aiayn.folder import load_model_dir
    from aiayn.data.tokenizer import Tokenizer
    from aiayn.decode import translate_texts
    from aiayn.viz.attention import attention_of_model_dir

    model, _, _ = load_model_dir(model_dir)
    tokenizer = Tokenizer.from_file(model_dir / "tokenizer.json")
    text, learned = PAIRS[0]
    pair = attention_of_model_dir(model_dir, text, beam=1)
    assert pair.translation == translate_texts(model, tokenizer, [text], beam=1)[0] == learned
    assert pair.tgt_tokens[0] == "<s>"
    assert "".join(pair.src_tokens).replace("▁", " ") == text
    assert "".join(pair.tgt_tokens[1:]).replace("▁", " ") == learned  # "fährt" in one piece
    assert pair.maps.cross[0].shape == (2, len(pair.tgt_tokens), len(pair.src_tokens))


def test_recorded_attention_equals_step_by_step_decoding(trained_dir):
    """Teacher forcing over the produced tokens gives the weights the cached search computed."""
    from aiayn.folder import load_model_dir

    model, cfg, _ = load_model_dir(trained_dir)
    src, tgt = torch.tensor([[9, 12, 15, 2]]), [1, 20, 7, 30, 11]
    maps = record_attention(model, src[0], tgt)
    with torch.no_grad():
        memory = model.encode(src)
        cache = model.init_cache(memory, src=src)
        steps = []
        for t in range(len(tgt)):
            record: list = []
            model.decode(torch.tensor([[tgt[t]]]), memory, cache=cache, attn_record=record)
            steps.append(record)
    for layer in range(2):
        cross = torch.stack([s[2 * layer + 1][1][0, :, 0] for s in steps], dim=1)  # (H, T, S)
        torch.testing.assert_close(cross, maps.cross[layer], rtol=1e-5, atol=1e-6)
        last = steps[-1][2 * layer][1][0, :, 0]  # the last query's self-attention (H, T)
        torch.testing.assert_close(last, maps.decoder[layer][:, -1], rtol=1e-5, atol=1e-6)


def test_plot_attention_cli(model_dir, tmp_path):
    out = tmp_path / "att.png"
    argv = ["plot", "attention", str(model_dir), "--text", PAIRS[1][0], "--beam", "2"]
    assert main([*argv, "-o", str(out)]) == 0
    assert len(png_panels(out)) == 3 * 2 * 2
    assert main([*argv, "--layer", "2", "--head", "1", "--head", "2", "-o", str(out)]) == 0
    assert png_panels(out) == [f"{TITLES[k]} · layer 2 · head {h}"
                               for k in ("encoder", "decoder", "cross") for h in (1, 2)]


@pytest.mark.parametrize("setup, argv, message", [
    (None, ["--text", "  "], "--text is empty"),
    (None, ["--text", "a", "--layer", "9"], "layer 9 does not exist"),
    ("no-tokenizer", ["--text", "a"], "tokenizer.json is missing"),
    ("no-model", ["--text", "a"], "model folder not found"),
])
def test_plot_attention_cli_bad_input(model_dir, tmp_path, capsys, setup, argv, message):
    folder = model_dir
    if setup == "no-tokenizer":
        (model_dir / "tokenizer.json").unlink()
    elif setup == "no-model":
        folder = tmp_path / "missing"
    assert main(["plot", "attention", str(folder), *argv, "-o", str(tmp_path / "a.png")]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("dirs, labels, title", [
    (["runs/x/m1", "runs/x/m2/"], ["m1", "m2"], "runs/x: m1 + m2"),
    (["/a/b/run1", "/a/c/run2"], ["b/run1", "c/run2"], "/a: b/run1 + c/run2"),
    (["m1", "m2"], ["m1", "m2"], "m1 + m2"),  # nothing shared: whole paths
    (["runs/x", "runs/x/avg10"], ["runs/x", "runs/x/avg10"], "runs/x + runs/x/avg10"),
    (["runs/x"], ["runs/x"], "runs/x"),
])
def test_plot_curves_labels_name_the_shared_folder_once(dirs, labels, title):
    from aiayn.commands.plot import run_labels

    assert run_labels(dirs) == (labels, title)
