"""`aiayn export` to ONNX and CTranslate2, and the engines that run the exports.

Random models check that every graph computes what the PyTorch model computes (logits to 1e-4,
post-LN and pre-LN, tied and untied embeddings, output_vocab = "targets", learned positions,
GELU, every classifier pooling, the LM). A small model trained on a reversal task checks that
greedy and beam-5 tokens are those of native decoding, through the CLI too; then every bad input.
Tests skip, with the reason shown, when the 'export' or 'ctranslate2' extra is not installed.
"""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from trainutil import base_values, fails, tiny_model_config, torch_threads, write_toml  # noqa: E402

from aiayn.folder.checkpoint import save_model_dir
from aiayn.cli import main
from aiayn.config import ModelConfig
from aiayn.data.tokenizer import CharTokenizer
from aiayn.decode import DecodeConfig, Ensemble, SamplingConfig, translate_ids
from aiayn.decode.generate import generate
from aiayn.errors import ConfigError
from aiayn.export import export_model
from aiayn.runtime.onnx_backend import OnnxBackend
from aiayn.folder import load_model_folder
from aiayn.model import Transformer, TransformerClassifier, TransformerLM

pytestmark = pytest.mark.usefixtures("one_thread")

CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMN")  # 50 + 4 specials = 54 ids


def needs(module: str, extra: str):
    return pytest.importorskip(
        module, reason=f"the '{extra}' extra is not installed: pip install -e '.[{extra}]'"
    )


def small_cfg(**over) -> ModelConfig:
    return tiny_model_config(vocab=54, max_len=64, **over)


def save(folder: Path, model, kind: str, **extra) -> Path:
    tok = CharTokenizer(CHARS)
    return save_model_dir(
        folder, model.eval(), model.cfg, kind=kind, tokenizer_json=tok.to_str(), extra=extra
    )


def exported(tmp_path: Path, model, kind: str, fmt: str = "onnx", **options):
    """(the export's model as its backend runs it, its config.json)."""
    src = save(tmp_path / "model", model, kind)
    out = export_model(src, fmt, tmp_path / fmt, **options)
    return load_model_folder(out).backend.model, json.loads((out / "config.json").read_text())


def random_sources(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(4, vocab) for _ in range(rng.randint(1, 9))] for _ in range(n)]


def test_an_export_drops_the_sources_bf16_decoding(tmp_path):
    """A recipe's [decode] bf16 = true is PyTorch autocast, compile = true PyTorch's compiled
    step: the exported folder keeps neither (else every translation would be refused with
    "--bf16 applies to PyTorch models")."""
    needs("onnxruntime", "export")
    src = save(
        tmp_path / "model",
        Transformer(small_cfg()),
        "translation",
        decode={"bf16": True, "compile": True},
    )
    assert load_model_folder(src).decode.bf16 is True
    assert load_model_folder(src).decode.compile is True
    folder = load_model_folder(export_model(src, "onnx", tmp_path / "onnx"))
    assert folder.decode.bf16 is False and folder.decode.compile is False
    assert len(folder.translate(["abc", "de"])) == 2


def test_an_engine_is_opened_with_the_machines_workers_unless_told(tmp_path):
    """The threads of a CTranslate2 translator are split between its workers when it is opened:
    one per thread (aiayn.threads.default_workers), or the --workers flag; a folder's stored
    [decode] workers (a machine's setting, written by older versions) is not read."""
    needs("ctranslate2", "ctranslate2")
    src = save(tmp_path / "model", Transformer(small_cfg()), "translation", decode={"workers": 3})
    out = export_model(src, "ctranslate2", tmp_path / "ct2")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert load_model_folder(out).backend.model.translator.num_translators == 2
        assert load_model_folder(out, workers=1).backend.model.translator.num_translators == 1
    finally:
        torch.set_num_threads(before)


# ---- ONNX: the graphs compute what the model computes --------------------------------------------

TRANSLATION_CONFIGS = {
    "post-ln-tied": {},
    "pre-ln-untied": dict(
        norm_first=True, share_embeddings=False, tie_output=False, tgt_vocab_size=60
    ),
    "pre-ln-tied-output": dict(
        norm_first=True,
        share_embeddings=False,
        tie_output=True,
        positional="learned",
        activation="gelu",
    ),
    "targets-no-scale": dict(output_vocab="targets", scale_embeddings=False, bias=False),
}


@pytest.mark.parametrize("name", list(TRANSLATION_CONFIGS))
def test_onnx_translation_logits_equal_torch(tmp_path, name):
    needs("onnxruntime", "export")
    torch.manual_seed(1)
    model = Transformer(small_cfg(**TRANSLATION_CONFIGS[name])).eval()
    if model.output_mask is not None:
        model.output_mask[10:20] = False  # tokens never seen as targets
    engine, meta = exported(tmp_path, model, "seq2seq")
    assert meta["format"] == "onnx" and meta["kind"] == "translation"
    src = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 0, 0, 0], [14, 0, 0, 0, 0, 0]])
    with torch.no_grad():
        memory, mem = model.encode(src), engine.encode(src)
        ours = model.init_cache(memory, src=src).with_beam(2)
        theirs = engine.init_cache(mem, src).with_beam(2)
        tgt = torch.ones(3, 1, dtype=torch.long)  # BOS, one row per sentence
        for step in range(4):
            a = model.decode(tgt, memory, cache=ours)
            b = engine.decode(tgt, mem, cache=theirs)
            assert a.shape == b.shape
            assert torch.equal(torch.isinf(a), torch.isinf(b))
            finite = torch.isfinite(a)
            assert (a[finite] - b[finite]).abs().max() < 1e-4, (name, step)
            rows = (
                torch.arange(3).repeat_interleave(2)
                if step == 0
                else torch.tensor([1, 0, 2, 2, 5, 4])
            )
            ours.reorder(rows), theirs.reorder(rows)  # beams move, as in beam search
            tgt = (
                a[rows, -1].argmax(-1, keepdim=True)
                if step == 0
                else a[:, -1].argmax(-1, keepdim=True)[rows]
            )
        assert theirs.length == ours.length == 4
    if model.output_mask is not None:
        assert torch.isinf(b[:, :, 10:20]).all()


def test_onnx_prompt_of_several_tokens_and_empty_past(tmp_path):
    """A step of several new tokens (causal mask inside the graph), then single tokens."""
    needs("onnxruntime", "export")
    torch.manual_seed(2)
    model = Transformer(small_cfg(norm_first=True)).eval()
    engine, _ = exported(tmp_path, model, "seq2seq")
    src = torch.tensor([[5, 6, 7], [8, 9, 0]])
    with torch.no_grad():
        memory, mem = model.encode(src), engine.encode(src)
        ours, theirs = model.init_cache(memory, src=src), engine.init_cache(mem, src)
        for tgt in (torch.tensor([[1, 7, 8], [1, 9, 9]]), torch.tensor([[4], [5]])):
            a, b = model.decode(tgt, memory, cache=ours), engine.decode(tgt, mem, cache=theirs)
            assert (a - b).abs().max() < 1e-4


def test_onnx_search_tokens_equal_torch_greedy_beam_nbest_ensemble(tmp_path):
    """aiayn's own search over the ONNX engine: greedy, beam 5, 3-best lists, an ensemble of one."""
    needs("onnxruntime", "export")
    torch.manual_seed(3)
    model = Transformer(small_cfg()).eval()
    engine, _ = exported(tmp_path, model, "seq2seq")
    sources = random_sources(24, 54)
    for beam, nbest in ((1, 1), (5, 3)):
        cfg = DecodeConfig(beam=beam, nbest=nbest, max_len_a=0.0, max_len_b=12)
        native = translate_ids(model, sources, cfg)
        for runner in (engine, Ensemble([engine])):
            onnx = OnnxBackend(runner).translate_ids(sources, cfg)  # through the protocol
            assert [[h.tokens for h in line] for line in onnx] == [
                [h.tokens for h in line] for line in native
            ]
            assert [[round(h.score, 3) for h in line] for line in onnx] == [
                [round(h.score, 3) for h in line] for line in native
            ]


@pytest.mark.parametrize(
    "pooling,buckets,nb", [("mean", 0, 0), ("max", 0, 0), ("cls", 0, 0), ("mean", 16, 0), ("max", 0, 3)]
)
def test_onnx_classifier_logits_equal_torch(tmp_path, pooling, buckets, nb):
    needs("onnxruntime", "export")
    torch.manual_seed(4)
    model = TransformerClassifier(
        small_cfg(n_decoder_layers=0, n_classes=3, pooling=pooling, bigram_buckets=buckets,
                  nb_ngrams=nb, nb_buckets=64, nb_scale=1.0)  # its term as large as the net's
    ).eval()
    if model.bigrams is not None:
        torch.nn.init.normal_(model.bigrams.weight)  # not the zeros of initialisation
    if model.nb is not None:  # words of several pieces, a fitted model (not initial zeros)
        v = model.nb.piece_hash.numel()
        model.nb.set_pieces(["", "", "", ""] + [(" w", "a", "!", "9")[i % 4] + str(i) for i in range(4, v)])
        model.nb.fit([(torch.randint(1, 30, (8, 6)), torch.arange(8) % 3)])
    engine, meta = exported(tmp_path, model, "classifier")
    assert meta["kind"] == "classification"
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11], [12, 13, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0]])
    with torch.no_grad():
        assert (model(ids) - engine(ids)).abs().max() < 1e-4


def test_onnx_lm_logits_and_sampling_equal_torch(tmp_path):
    needs("onnxruntime", "export")
    torch.manual_seed(5)
    model = TransformerLM(small_cfg(n_encoder_layers=0, norm_first=True)).eval()
    engine, _ = exported(tmp_path, model, "lm")
    with torch.no_grad():
        ids = torch.tensor([[5, 6, 7, 8, 9]])
        assert (model(ids) - engine(ids)).abs().max() < 1e-4
        ours, theirs = model.init_cache(), engine.init_cache()
        for chunk in (ids[:, :3], ids[:, 3:4], ids[:, 4:]):
            assert (model(chunk, ours) - engine(chunk, theirs)).abs().max() < 1e-4
    sampling = SamplingConfig(max_new_tokens=20, seed=0)
    a = generate(model, [5, 6, 7], 16, sampling)
    # past the window: cache restarts
    b = OnnxBackend(engine).generate_ids([5, 6, 7], 16, sampling)
    assert a == b and len(a) == 20


# ---- CTranslate2: the spec computes what the model computes ---------------------------------------


@pytest.mark.parametrize("name", list(TRANSLATION_CONFIGS))
def test_ctranslate2_log_probs_equal_torch(tmp_path, name):
    ct2 = needs("ctranslate2", "ctranslate2")
    torch.manual_seed(6)
    model = Transformer(small_cfg(**TRANSLATION_CONFIGS[name])).eval()
    if model.output_mask is not None:
        model.output_mask[10:20] = False
    engine, meta = exported(tmp_path, model, "seq2seq", "ctranslate2")
    assert meta["quantization"] == "float32"
    src, tgt = [5, 6, 7, 8, 9], [21, 22, 30, 25]  # none of them masked
    tokens = engine.tokens
    scored = engine.translator.score_batch([[tokens[i] for i in src]], [[tokens[i] for i in tgt]])
    with torch.no_grad():
        lp = model(torch.tensor([src]), torch.tensor([[1, *tgt]])).log_softmax(-1)[0]
    expected = [lp[i, t].item() for i, t in enumerate([*tgt, 2])]  # EOS scored last
    assert max(abs(a - b) for a, b in zip(scored[0].log_probs, expected)) < 1e-4, name
    assert isinstance(ct2.__version__, str)


def test_ctranslate2_lm_logits_equal_torch(tmp_path):
    ct2 = needs("ctranslate2", "ctranslate2")
    torch.manual_seed(7)
    model = TransformerLM(small_cfg(n_encoder_layers=0)).eval()
    src = save(tmp_path / "model", model, "lm")
    out = export_model(src, "ctranslate2", tmp_path / "ct2")
    generator = ct2.Generator(str(out / "ctranslate2"))
    from aiayn.export.ctranslate2 import token_strings

    tokens = token_strings(CharTokenizer(CHARS), 54)
    ids = [5, 6, 7, 8]
    logits = torch.as_tensor(np.asarray(generator.forward_batch([[tokens[i] for i in ids]])))
    with torch.no_grad():
        assert (model(torch.tensor([ids])) - logits).abs().max() < 1e-4


def test_ctranslate2_cannot_express_a_classifier_or_unequal_heads(tmp_path, capsys):
    needs("ctranslate2", "ctranslate2")
    clf = save(tmp_path / "clf", TransformerClassifier(small_cfg(n_decoder_layers=0)), "classifier")
    fails(
        capsys,
        ["export", str(clf), "--format", "ctranslate2", "-o", str(tmp_path / "o")],
        "pooling head",
    )
    dv = save(tmp_path / "dv", Transformer(small_cfg(d_k=8, d_v=4)), "seq2seq")
    with pytest.raises(ConfigError, match="d_v=4"):
        export_model(dv, "ctranslate2", tmp_path / "o")
    assert not (tmp_path / "o").exists()  # refused before anything is written


# ---- a trained model: the same tokens as native decoding, through the CLI too ---------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, list[str]]:
    """A tiny model trained to reverse letter sequences (~25 s on one thread)."""
    tmp = tmp_path_factory.mktemp("reverse")
    values = base_values(
        tmp / "data",
        max_steps=400,
        valid_every=400,
        save_every=400,
        lr=5e-3,
        warmup_steps=40,
        log_every=100,
    )
    values.update(
        {
            "model.dropout": 0.0,
            "model.d_model": 32,
            "model.d_ff": 64,
            "model.n_heads": 4,
            "model.n_encoder_layers": 2,
            "model.n_decoder_layers": 2,
        }
    )
    toml = write_toml(tmp / "run.toml", values)
    with torch_threads(1):
        assert main(["train", str(toml), "--out", str(tmp / "run")]) == 0
    sources = (tmp / "data" / "valid.src").read_text().splitlines()
    sources += (tmp / "data" / "train.src").read_text().splitlines()[:24]
    return tmp / "run", sources


def _tokens(results) -> list[list[list[int]]]:
    return [[h.tokens for h in line] for line in results]


def test_trained_model_onnx_and_ctranslate2_tokens_equal_native(trained, tmp_path):
    needs("onnxruntime", "export")
    needs("ctranslate2", "ctranslate2")
    folder, texts = trained
    opened = load_model_folder(folder)
    tokenizer = opened.tokenizer
    sources = [tokenizer.encode(t) for t in texts]
    onnx = load_model_folder(export_model(folder, "onnx", tmp_path / "onnx")).backend
    ct2 = load_model_folder(export_model(folder, "ctranslate2", tmp_path / "ct2")).backend
    assert (onnx.name, ct2.name) == ("onnx", "ctranslate2")
    for beam in (1, 5):
        cfg = DecodeConfig(beam=beam, length_penalty="average")
        native = opened.backend.translate_ids(sources, cfg)  # the one protocol, every backend
        assert _tokens(onnx.translate_ids(sources, cfg)) == _tokens(native)
        if beam == 5:  # CTranslate2's beam search ranks as aiayn's with length penalty "average"
            theirs = ct2.translate_ids(sources, cfg)
            assert _tokens(theirs) == _tokens(native)
            assert [round(line[0].score, 3) for line in theirs] == [
                round(line[0].score, 3) for line in native
            ]
    reversed_ok = sum(
        tokenizer.decode(line[0].tokens) == " ".join(reversed(t.split()))
        for t, line in zip(texts, native)
    )
    assert reversed_ok >= len(texts) * 0.5  # the model learned the task: the test is not vacuous


def test_cli_export_translate_evaluate_each_engine(trained, tmp_path, capsys):
    needs("onnxruntime", "export")
    needs("ctranslate2", "ctranslate2")
    folder, texts = trained
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("\n".join(texts[:16]) + "\n")
    ref.write_text("\n".join(" ".join(reversed(t.split())) for t in texts[:16]) + "\n")
    outputs = {}
    for engine, extra in (("torch", []), ("onnx", []), ("ctranslate2", [])):
        target = folder if engine == "torch" else tmp_path / engine
        if engine != "torch":
            assert main(["export", str(folder), "--format", engine, "-o", str(target), *extra]) == 0
        capsys.readouterr()
        assert (
            main(
                [
                    "translate",
                    str(target),
                    "--engine",
                    engine,
                    "--beam",
                    "5",
                    "-i",
                    str(src),
                    "--set",
                    "decode.length_penalty=average",
                ]
            )
            == 0
        )
        outputs[engine] = capsys.readouterr().out.splitlines()
        assert (
            main(
                [
                    "evaluate",
                    str(target),
                    "--src",
                    str(src),
                    "--ref",
                    str(ref),
                    "-o",
                    str(tmp_path / f"{engine}.json"),
                    "--set",
                    "decode.length_penalty=average",
                ]
            )
            == 0
        )
        scores = json.loads((tmp_path / f"{engine}.json").read_text())
        assert scores["decoding"]["engine"] == engine and scores["n"] == 16
    assert outputs["onnx"] == outputs["torch"] and len(outputs["torch"]) == 16
    same = sum(a == b for a, b in zip(outputs["ctranslate2"], outputs["torch"]))
    assert same >= 15, (same, outputs)  # its own beam search over float32: one may differ
    # n-best lists, and an ensemble of two ONNX folders (the same model twice: the same output)
    for targets in ([folder], [tmp_path / "onnx"], [tmp_path / "onnx", tmp_path / "onnx"]):
        capsys.readouterr()
        assert (
            main(
                [
                    "translate",
                    *map(str, targets),
                    "--beam",
                    "5",
                    "--nbest",
                    "3",
                    "-i",
                    str(src),
                    "--set",
                    "decode.length_penalty=average",
                ]
            )
            == 0
        )
        outputs[len(outputs)] = [
            line.split("\t")[2] for line in capsys.readouterr().out.splitlines()
        ]
    assert outputs[3] == outputs[4] == outputs[5] and len(outputs[3]) == 48
    config = json.loads((tmp_path / "ctranslate2" / "config.json").read_text())
    assert config["format"] == "ctranslate2" and config["quantization"] == "float32"
    assert (tmp_path / "onnx" / "tokenizer.json").is_file()


def test_ctranslate2_int8_keeps_what_the_model_learned(trained, tmp_path, capsys):
    """An int8 export keeps what the model learned: it reverses the training sentences about as
    often as the float32 model. On a CPU where CTranslate2's int8 kernels saturate (no VNNI) a
    model this small lost it there (15 of 24 against 21 on a 2-core AMD EPYC with AVX2 only,
    CT2_USE_MKL=0), so aiayn computes its int8 weights in float32 on such a CPU (22 of 24)."""
    needs("ctranslate2", "ctranslate2")
    folder, texts = trained
    seen = texts[-24:]  # training sentences: the model reverses most of them
    src = tmp_path / "src.txt"
    src.write_text("\n".join(seen) + "\n")
    target = tmp_path / "int8"
    assert main(["export", str(folder), "--format", "ctranslate2", "-o", str(target),
                 "--quantization", "int8"]) == 0  # fmt: skip
    config = json.loads((target / "config.json").read_text())
    assert config["format"] == "ctranslate2" and config["quantization"] == "int8"
    reversed_ok = {}
    for model in (folder, target):
        capsys.readouterr()
        assert main(["translate", str(model), "--beam", "5", "-i", str(src)]) == 0
        lines = capsys.readouterr().out.splitlines()
        reversed_ok[model] = sum(
            line == " ".join(reversed(t.split())) for t, line in zip(seen, lines)
        )
    assert reversed_ok[folder] >= 12, reversed_ok  # the float32 model learned the task
    assert reversed_ok[target] >= reversed_ok[folder] - 4, reversed_ok


# ---- bad input: one line, exit 2 ------------------------------------------------------------------


def forget_parts(folder: Path) -> None:
    """Drop config.json's record of the export's parts (what an older aiayn wrote)."""
    meta = json.loads((folder / "config.json").read_text())
    del meta["parts"]
    (folder / "config.json").write_text(json.dumps(meta))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    torch.manual_seed(8)
    return save(tmp_path_factory.mktemp("m") / "model", Transformer(small_cfg()), "seq2seq")


def test_export_bad_input(model_dir, tmp_path, capsys):
    needs("onnxruntime", "export")
    out = tmp_path / "out"
    fails(
        capsys,
        ["export", str(tmp_path / "nowhere"), "--format", "onnx", "-o", str(out)],
        "model folder not found",
    )
    (tmp_path / "empty").mkdir()
    fails(
        capsys,
        ["export", str(tmp_path / "empty"), "--format", "onnx", "-o", str(out)],
        "config.json is missing",
    )
    fails(
        capsys,
        ["export", str(model_dir), "--format", "onnx", "-o", str(out), "--quantization", "int8"],
        "--quantization applies to --format ctranslate2",
    )
    assert main(["export", str(model_dir), "--format", "onnx", "-o", str(out)]) == 0
    before = (out / "decoder.onnx").stat().st_mtime_ns
    fails(
        capsys,
        ["export", str(model_dir), "--format", "onnx", "-o", str(out)],
        "pass --overwrite to replace it",
    )
    assert (out / "decoder.onnx").stat().st_mtime_ns == before  # left alone
    assert main(["export", str(model_dir), "--format", "onnx", "-o", str(out), "--overwrite"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "out"]  # no temporaries left
    fails(
        capsys,
        ["export", str(out), "--format", "onnx", "-o", str(tmp_path / "again")],
        "already an exported 'onnx' model",
    )


def test_engine_bad_input(model_dir, tmp_path, capsys):
    needs("onnxruntime", "export")
    out = export_model(model_dir, "onnx", tmp_path / "onnx")
    text = tmp_path / "in.txt"
    text.write_text("abc\n")
    fails(
        capsys,
        ["translate", str(out), "--engine", "ctranslate2", "-i", str(text)],
        "holds a 'onnx' export; --engine ctranslate2 needs",
    )
    fails(
        capsys,
        ["translate", str(out), "--engine", "torch", "-i", str(text)],
        "--engine torch needs the model folder",
    )
    fails(
        capsys,
        ["translate", str(model_dir), "--engine", "onnx", "-i", str(text)],
        "a PyTorch model folder; --engine onnx runs",
    )
    fails(capsys, ["translate", str(out), "--bf16", "-i", str(text)], "--bf16 applies to PyTorch")
    (out / "decoder.onnx").write_bytes(b"not a graph")
    fails(
        capsys,
        ["translate", str(out), "--engine", "onnx", "-i", str(text)],
        "decoder.onnx is not the file this export wrote (changed, corrupted",
    )
    forget_parts(out)  # as exported before the record existed: ONNX Runtime's reader says it
    fails(
        capsys,
        ["translate", str(out), "--engine", "onnx", "-i", str(text)],
        "decoder.onnx: not a readable ONNX graph",
    )
    (out / "decoder.onnx").unlink()
    fails(capsys, ["translate", str(out), "-i", str(text)], "decoder.onnx: not found")
    (out / "config.json").write_text("{not json")
    fails(capsys, ["translate", str(out), "--engine", "onnx", "-i", str(text)], "not valid JSON")


def test_corrupt_ctranslate2_folder(model_dir, tmp_path, capsys):
    needs("ctranslate2", "ctranslate2")
    out = export_model(model_dir, "ctranslate2", tmp_path / "ct2")
    (out / "ctranslate2" / "model.bin").write_bytes(b"\0" * 10)
    text = tmp_path / "in.txt"
    text.write_text("abc\n")
    fails(
        capsys,
        ["translate", str(out), "--engine", "ctranslate2", "-i", str(text)],
        "ctranslate2/model.bin is not the file this export wrote",
    )
    forget_parts(out)  # as exported before the record existed: CTranslate2's reader says it
    fails(
        capsys,
        ["translate", str(out), "--engine", "ctranslate2", "-i", str(text)],
        "not a readable CTranslate2 model",
    )


ENGINES = [("onnx", "onnxruntime", "export"), ("ctranslate2", "ctranslate2", "ctranslate2")]


def refused_everywhere(capsys, folder: Path, tmp_path: Path, message: str) -> None:
    """translate, evaluate and serve (at start-up, before listening) each end in one line with
    ``message`` and exit 2; aiayn.load raises it. A server that starts fails the test (instead of
    serving for ever)."""
    from serve_helpers import free_port

    from aiayn.errors import CheckpointError

    def never_serve(server, batcher, sock=None):
        raise AssertionError(f"{folder}: the server started; it should have been refused")

    text = tmp_path / "in.txt"
    text.write_text("abc\nde\n")
    with pytest.raises(CheckpointError, match=re.escape(message)):
        load_model_folder(folder)
    fails(capsys, ["translate", str(folder), "-i", str(text)], message)
    fails(capsys, ["evaluate", str(folder), "--src", str(text), "--ref", str(text)], message)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("aiayn.serve.lanes.run_on_main_thread", never_serve)
        fails(capsys, ["serve", str(folder), "--port", str(free_port())], message)
    assert not list(folder.glob("eval_*.json"))  # nothing was scored


@pytest.mark.parametrize("fmt,module,extra", ENGINES)
def test_a_tokenizer_from_another_run_is_refused(model_dir, tmp_path, capsys, fmt, module, extra):
    """A same-size tokenizer.json of another run copied into an export changed its output
    silently: the parts recorded at export refuse it; CTranslate2's own vocabulary refuses it
    even in an export written before the record."""
    needs(module, extra)
    out = export_model(model_dir, fmt, tmp_path / fmt)
    (out / "tokenizer.json").write_text(CharTokenizer(CHARS[::-1]).to_str())
    refused_everywhere(
        capsys, out, tmp_path, "tokenizer.json is not the tokenizer this export was written with"
    )
    if fmt == "ctranslate2":
        forget_parts(out)
        refused_everywhere(
            capsys, out, tmp_path, "tokenizer.json is not the tokenizer the CTranslate2 model"
        )


@pytest.mark.parametrize("fmt,module,extra", ENGINES)
def test_an_edited_model_section_is_refused(model_dir, tmp_path, capsys, fmt, module, extra):
    """n_heads edited in an exported folder's config.json: ONNX Runtime's traceback from
    translate and a 500 from a server that had started; now one line, and serve does not start.
    ONNX graphs name the field from their own shapes, record or not."""
    needs(module, extra)
    out = export_model(model_dir, fmt, tmp_path / fmt)
    meta = json.loads((out / "config.json").read_text())
    meta["model"]["n_heads"] = 2
    (out / "config.json").write_text(json.dumps(meta))
    if fmt == "onnx":
        message = "config.json says n_heads = 2, encoder.onnx was exported with 4"
        refused_everywhere(capsys, out, tmp_path, message)
        forget_parts(out)
        refused_everywhere(capsys, out, tmp_path, message)
        meta["model"].update(n_heads=4, src_vocab_size=60, tgt_vocab_size=60)
        (out / "config.json").write_text(json.dumps(meta))
        message = "config.json says tgt_vocab_size = 60, decoder.onnx was exported with 54"
    else:  # CTranslate2 reads its own copy of the shape: the recorded digest says it
        message = "config.json's model section was changed after export"
    refused_everywhere(capsys, out, tmp_path, message)


def test_an_export_records_its_parts(model_dir, tmp_path):
    """The record of an export is the one its model folder's weights carry (the model section,
    the tokenizer's content), plus the sha256 of each file the export wrote."""
    needs("onnxruntime", "export")
    from aiayn.folder.parts import MODEL, TOKENIZER, weights_record

    out = export_model(model_dir, "onnx", tmp_path / "onnx")
    parts = json.loads((out / "config.json").read_text())["parts"]
    assert sorted(parts) == sorted([MODEL, TOKENIZER, "decoder.onnx", "encoder.onnx"])
    assert {k: parts[k] for k in (MODEL, TOKENIZER)} == weights_record(model_dir / "model.safetensors")
    assert json.loads(parts[MODEL])["n_heads"] == 4
    assert all(len(parts[k]) == 64 for k in parts if k != MODEL)


def test_an_export_written_before_the_shared_record_is_still_checked(model_dir, tmp_path, capsys):
    """Exports written before PyTorch folders and exports shared one record recorded the model
    section's digest under "config.json:model" and tokenizer.json by its bytes: they load, and
    a changed part is still refused."""
    needs("onnxruntime", "export")
    import hashlib

    from aiayn.config import to_dict
    from aiayn.folder.parts import MODEL, TOKENIZER

    out = export_model(model_dir, "onnx", tmp_path / "onnx")
    meta = json.loads((out / "config.json").read_text())
    default = json.loads(json.dumps(to_dict(ModelConfig())))  # as config.json holds it
    section = {k: v for k, v in meta["model"].items() if default.get(k) != v}
    parts = {k: v for k, v in meta["parts"].items() if k not in (MODEL, TOKENIZER)}
    parts["config.json:model"] = hashlib.sha256(json.dumps(section, sort_keys=True).encode()).hexdigest()
    parts["tokenizer.json"] = hashlib.sha256((out / "tokenizer.json").read_bytes()).hexdigest()
    meta["parts"] = parts
    (out / "config.json").write_text(json.dumps(meta))
    assert load_model_folder(out).translate(["abc"])
    dropout = meta["model"]["dropout"]
    meta["model"]["dropout"] = 0.5 if dropout != 0.5 else 0.25  # no graph shape shows it
    (out / "config.json").write_text(json.dumps(meta))
    refused_everywhere(capsys, out, tmp_path, "config.json's model section was changed after export")
    meta["model"]["dropout"] = dropout
    (out / "config.json").write_text(json.dumps(meta))
    tok = json.loads((out / "tokenizer.json").read_text())
    (out / "tokenizer.json").write_text(json.dumps(tok, indent=3))  # its bytes were recorded
    refused_everywhere(capsys, out, tmp_path, "tokenizer.json is not the file this export wrote")


@pytest.mark.parametrize("module,extra", [("onnx", "export"), ("ctranslate2", "ctranslate2")])
def test_missing_extra_names_it(model_dir, tmp_path, capsys, monkeypatch, module, extra):
    monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    fmt = "onnx" if module == "onnx" else "ctranslate2"
    fails(
        capsys,
        ["export", str(model_dir), "--format", fmt, "-o", str(tmp_path / "o")],
        f"pip install -e '.[{extra}]'",
    )


def test_loader_and_commands_open_exports_of_every_kind(tmp_path, capsys):
    """aiayn.load / classify / generate open exported folders like model folders."""
    needs("onnxruntime", "export")
    import aiayn
    from aiayn.folder import load_model_folder

    torch.manual_seed(9)
    clf = save(
        tmp_path / "clf",
        TransformerClassifier(small_cfg(n_decoder_layers=0, pooling="max")),
        "classifier",
    )
    lm = save(tmp_path / "lm", TransformerLM(small_cfg(n_encoder_layers=0)), "lm")
    texts = ["abc def", "", "ghij"]
    exported_clf = export_model(clf, "onnx", tmp_path / "clf-onnx")
    opened = aiayn.load(exported_clf)
    assert (opened.engine, opened.kind) == ("onnx", "classification")
    ours, native = opened.classify(texts), load_model_folder(clf).classify(texts)
    assert [r["label"] for r in ours] == [r["label"] for r in native]
    for a, b in zip(ours, native):
        assert all(abs(a["probs"][k] - b["probs"][k]) < 1e-4 for k in b["probs"])
    exported_lm = export_model(lm, "onnx", tmp_path / "lm-onnx")
    kwargs = dict(max_new_tokens=12, seed=3)
    assert aiayn.load(exported_lm).generate("abc", **kwargs) == load_model_folder(lm).generate(
        "abc", **kwargs
    )
    text = tmp_path / "in.txt"
    text.write_text("abc def\nghij\n")
    capsys.readouterr()
    assert main(["classify", str(exported_clf), "-i", str(text)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    assert (
        main(
            [
                "generate",
                str(exported_lm),
                "--prompt",
                "abc",
                "--max-new-tokens",
                "5",
                "--seed",
                "1",
            ]
        )
        == 0
    )
    fails(capsys, ["classify", str(exported_lm), "-i", str(text)], "holds a 'lm' model")


def test_a_backend_refuses_what_it_cannot_do_in_one_line_naming_itself(model_dir, tmp_path, capsys):
    """Capabilities are declared by each backend and asked for: an ensemble of CTranslate2
    models, a CTranslate2 language model and bf16 autocast on ONNX are refused, naming the
    backend, exit 2 on the command line."""
    needs("onnxruntime", "export")
    needs("ctranslate2", "ctranslate2")
    from aiayn.runtime import Unsupported

    ct2 = export_model(model_dir, "ctranslate2", tmp_path / "ct2")
    assert load_model_folder(ct2).backend.capabilities == {"translate", "nbest"}
    with pytest.raises(Unsupported, match="the ctranslate2 backend has no ensembles"):
        load_model_folder([ct2, ct2])
    text = tmp_path / "in.txt"
    text.write_text("abc\n")
    fails(
        capsys,
        ["translate", str(ct2), str(ct2), "-i", str(text)],
        "the ctranslate2 backend has no ensembles of several model folders",
    )
    torch.manual_seed(5)
    lm = save(tmp_path / "lm", TransformerLM(small_cfg(n_encoder_layers=0)), "lm")
    lm_ct2 = export_model(lm, "ctranslate2", tmp_path / "lm-ct2")
    with pytest.raises(Unsupported, match="the ctranslate2 backend has no language models"):
        load_model_folder(lm_ct2)
    onnx = load_model_folder(export_model(model_dir, "onnx", tmp_path / "onnx"))
    assert "attention" not in onnx.backend.capabilities and onnx.engine == "onnx"
    with pytest.raises(Unsupported, match="the onnx backend has no bf16 autocast"):
        onnx.translate(["abc"], bf16=True)
    with pytest.raises(Unsupported, match="the onnx backend has no compiled decoder step"):
        onnx.translate(["abc"], compile=True)
    with pytest.raises(Unsupported, match="the onnx backend has no PyTorch module"):
        onnx.torch_module()  # what exporters convert: a model folder's, not an export's
    from aiayn.viz.attention import attention_of_translation

    with pytest.raises(Unsupported, match="the onnx backend has no attention weights"):
        attention_of_translation(onnx.backend, onnx.tokenizer, "abc")
    assert load_model_folder(model_dir).backend.capabilities >= {
        "attention",
        "bf16",
        "ensemble",
        "module",
    }


def test_int8_is_computed_in_float32_where_ctranslate2s_int8_kernels_saturate(
    tmp_path, monkeypatch
):
    """An int8 export runs in float32 on an x86 CPU not from Intel without VNNI (CTranslate2
    would run oneDNN's saturating u8·s8 kernels there), and only there, and never when the user
    chose the kernels with CT2_USE_MKL."""
    from aiayn.runtime.ct2_backend import int8_computed_in_float32

    def chosen(flags: str, vendor: str = "AuthenticAMD", preset: str | None = None) -> bool:
        info = tmp_path / "cpuinfo"
        info.write_text(f"vendor_id\t: {vendor}\nflags\t\t: fpu sse2 {flags} sha_ni\n")
        monkeypatch.delenv("CT2_USE_MKL", raising=False)
        if preset is not None:
            monkeypatch.setenv("CT2_USE_MKL", preset)
        return int8_computed_in_float32(str(info))

    assert chosen("avx avx2 fma")
    assert chosen("avx avx2 avx512f avx512bw avx512vl")  # AVX-512 without VNNI saturates too
    assert not chosen("avx avx2 avx512f avx512bw avx512_vnni avx512_bf16")  # Zen 4
    assert not chosen("avx avx2 avx_vnni")
    assert not chosen("avx avx2 fma", vendor="GenuineIntel")  # MKL: CTranslate2's own choice
    assert not chosen("avx avx2 fma", preset="0") and not chosen("avx avx2 fma", preset="1")
    assert chosen("avx avx2 fma", preset="") and chosen("avx avx2 fma", preset=" ")  # not a choice
    assert not chosen("neon asimd", vendor="")  # not x86
    assert not int8_computed_in_float32(str(tmp_path / "missing"))  # no /proc/cpuinfo


def test_ctranslate2_decodes_a_batch_in_one_call_and_each_sentence_at_its_own_cap(
    trained, tmp_path
):
    """A served batch of sentences with different caps (a·src_len + b) goes to CTranslate2 as
    one call at the largest cap; sentences whose search reached their own cap are decoded again
    at it. Every result is the sentence's own, alone, and native's."""
    needs("ctranslate2", "ctranslate2")
    folder, texts = trained
    opened = load_model_folder(folder)
    sources = [opened.tokenizer.encode(t) for t in texts]
    backend = load_model_folder(export_model(folder, "ctranslate2", tmp_path / "ct2")).backend
    translator = backend.model.translator
    calls: list[int] = []

    class Counting:  # CTranslate2's Translator cannot take attributes: stand in front of it
        def translate_batch(self, batch, *args, **kwargs):
            calls.append(len(batch))
            return translator.translate_batch(batch, *args, **kwargs)

    backend.model.translator = Counting()
    lengths = sorted(len(s) for s in sources)
    middle = lengths[len(lengths) // 2]
    # outputs are as long as their sources (+ EOS): short ones end before a·len + b, long
    # ones are cut there, at caps that differ
    capped = {"max_len_a": 0.5, "max_len_b": middle // 2 + 1}
    for cfg in (
        DecodeConfig(beam=1, **capped),
        DecodeConfig(beam=5, nbest=2, length_penalty="average", **capped),
        DecodeConfig(beam=5, length_penalty="none", **capped),  # not readable: one call a cap
        DecodeConfig(beam=5, length_penalty="average"),  # none reaches its cap: one call
    ):
        calls.clear()
        together = backend.translate_ids(sources, cfg)
        in_batch = list(calls)
        alone = [backend.translate_ids([s], cfg)[0] for s in sources]
        assert _tokens(together) == _tokens(alone), cfg
        # the same scores, but for the rounding of batches of other sizes
        assert [h.score for line in together for h in line] == pytest.approx(
            [h.score for line in alone for h in line], abs=1e-3
        )
        if cfg.length_penalty == "average":
            assert _tokens(together) == _tokens(opened.backend.translate_ids(sources, cfg))
        caps = {len(s) // 2 + capped["max_len_b"] for s in sources}
        if cfg.max_len_a == 0.5 and cfg.length_penalty != "none":
            cut = sum(
                len(line[0].tokens) + 1 >= len(s) // 2 + capped["max_len_b"]
                for line, s in zip(together, sources)
            )
            assert 0 < cut < len(sources)  # some settled in the first call, some decoded again
            assert in_batch[0] == len(sources) and 1 < len(in_batch) <= 1 + len(caps)
        elif cfg.max_len_a == 0.5:
            assert len(in_batch) == len(caps) and sum(in_batch) == len(sources)
        else:
            assert in_batch == [len(sources)]


def doc_block(page: Path, needle: str) -> str:
    """The fenced Python block of ``page`` that holds ``needle``."""
    blocks = re.findall(r"^```python\n(.*?)^```", page.read_text(encoding="utf-8"), re.S | re.M)
    found = [code for code in blocks if needle in code]
    assert len(found) == 1, f"{page}: {len(found)} python blocks hold {needle!r}"
    return found[0]


def test_the_documented_plain_ctranslate2_code_translates_as_aiayn(tmp_path, monkeypatch, capsys):
    """docs/export.md's block that runs a CTranslate2 export with ctranslate2 and tokenizers
    alone (issue 66: it meant guessing how a source is written) runs as printed on a tiny BPE
    model exported here, and prints what aiayn's engine gives with the settings the page names."""
    import ast

    needs("ctranslate2", "ctranslate2")
    from aiayn.data.tokenizer import train_tokenizer

    code = doc_block(Path(__file__).resolve().parent.parent / "docs" / "export.md",
                     "ctranslate2.Translator")
    tree = ast.parse(code)
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                for a in n.names}
    imported |= {str(n.module).split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= {"ctranslate2", "tokenizers"}, imported
    tokenizer = train_tokenizer(["a dog runs", "two men play chess", "the snow"] * 20, "bpe", 60)
    cfg = tiny_model_config(tokenizer.vocab_size, 300)  # random: every output runs to the cap
    model = Transformer(cfg).eval()
    src = save_model_dir(tmp_path / "model", model, cfg, tokenizer_json=tokenizer.to_str())
    export_model(src, "ctranslate2", tmp_path / "runs" / "demo" / "ct2")
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    namespace: dict = {}
    exec(compile(code, "docs/export.md", "exec"), namespace)
    printed = capsys.readouterr().out.splitlines()
    texts = namespace["texts"]
    ours = load_model_folder(tmp_path / "runs" / "demo" / "ct2").translate(
        texts, beam=5, length_penalty="average", max_len_a=0, max_len_b=256)
    assert printed == ours and len(printed) == len(texts) and all(printed)
