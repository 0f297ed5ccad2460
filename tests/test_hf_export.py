"""`aiayn export --format hf` (aiayn/export/hf.py): aiayn's own translation models as Hugging
Face MarianMTModel folders. Logits equal transformers' to 1e-4 for each option the mapping
handles (the paper's interleaved sinusoids by a permutation of the hidden dimensions); a small
trained model's export, loaded by transformers, translates 24 sentences as `aiayn translate`
does, token for token, with the folder's own settings on both sides; what Marian cannot express
is one clear line."""

import json
from pathlib import Path

import pytest
import torch
from trainutil import base_values, fails, tiny_model_config, torch_threads, write_toml

from aiayn.folder.checkpoint import save_model_dir
from aiayn.cli import main
from aiayn.data.tokenizer import train_tokenizer
from aiayn.export import export_model
from aiayn.folder import load_model_folder
from aiayn.model import Transformer

pytest.importorskip("transformers", reason="needs transformers (the test or hf extra)")

TEXTS = ["a b c d", "e f g", "h i j a b", "c c d e f g"]


def random_folder(path, **options):
    tokenizer = train_tokenizer(TEXTS * 20, "bpe", vocab_size=40)
    cfg = tiny_model_config(tokenizer.vocab_size, 32, **options)
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:  # not the zeros / ones of init
                p.add_(0.1 * torch.randn_like(p))
        if model.output_mask is not None:
            model.output_mask[5:9] = False
    return save_model_dir(path, model, cfg, tokenizer_json=tokenizer.to_str())


OPTIONS = {
    "the paper's": {},
    "halves, silu, logits bias": dict(
        sinusoid_layout="halves", activation="silu", final_logits_bias=True
    ),
    "no biases, gelu, unscaled": dict(bias=False, activation="gelu", scale_embeddings=False),
    "targets only": dict(output_vocab="targets"),
}


@pytest.mark.parametrize("name", OPTIONS)
def test_logits_equal_transformers(tmp_path, name):
    from transformers import MarianMTModel

    folder = random_folder(tmp_path / "m", **OPTIONS[name])
    out = export_model(folder, "hf", tmp_path / "hf")
    ours = load_model_folder(folder).torch_module()
    theirs = MarianMTModel.from_pretrained(out).eval()
    src = torch.randint(4, ours.cfg.src_vocab_size, (3, 7))
    src[1, 5:] = ours.cfg.pad_id
    tgt = torch.randint(4, ours.cfg.tgt_vocab_size, (3, 5))
    tgt[:, 0] = ours.cfg.bos_id
    mask = src != ours.cfg.pad_id
    with torch.no_grad():
        expected = ours(src, tgt)
        got = theirs(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
    kept = expected > -1e8  # output_vocab=targets: -inf here, -1e9 there
    assert (got[kept] - expected[kept]).abs().max() < 1e-4
    assert (got[~kept] < -1e8).all()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny BPE model trained a little on letter reversal, with decoding settings transformers
    can express (beam 4, log P / |Y|, a fixed cap)."""
    tmp = tmp_path_factory.mktemp("reverse")
    values = base_values(tmp / "data", max_steps=150, valid_every=150, save_every=150, lr=5e-3)
    values.update({"data.tokenizer": "bpe", "data.vocab_size": 48, "model.dropout": 0.0})
    values.update({"decode.beam": 4, "decode.length_penalty": "average"})
    values.update({"decode.max_len_a": 0.0, "decode.max_len_b": 20})
    with torch_threads(1):
        assert (
            main(["train", str(write_toml(tmp / "run.toml", values)), "--out", str(tmp / "run")])
            == 0
        )
    sources = (tmp / "data" / "valid.src").read_text().splitlines()
    return tmp / "run", sources + (tmp / "data" / "train.src").read_text().splitlines()[:8]


def translate_with_transformers(folder, texts):
    """pipeline("translation", model=folder) where transformers has it (4.x; checked with 4.57.6,
    docs/huggingface.md); transformers 5 removed that pipeline: there, the steps it took, by
    hand."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline
    from transformers.pipelines import SUPPORTED_TASKS

    if "translation" in SUPPORTED_TASKS:
        return [r["translation_text"] for r in pipeline("translation", model=str(folder))(texts)]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    return tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True)


def test_transformers_translates_the_export_as_aiayn_does(trained, tmp_path, capsys):
    folder, texts = trained
    assert len(texts) >= 20
    out = export_model(folder, "hf", tmp_path / "hf")
    generation = json.loads((out / "generation_config.json").read_text())
    assert (generation["num_beams"], generation["length_penalty"]) == (4, 1.0)
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    with torch_threads(1):
        capsys.readouterr()
        assert main(["translate", str(folder), "--input", str(tmp_path / "in.txt")]) == 0
        ours = capsys.readouterr().out.splitlines()
        theirs = translate_with_transformers(out, texts)
    assert theirs == ours
    assert len(set(ours)) > len(texts) // 2  # not a constant output
    greedy = load_model_folder(folder).translate(texts, beam=1)
    with torch_threads(1):
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(out)
        model = AutoModelForSeq2SeqLM.from_pretrained(out).eval()
        batch = tokenizer(texts, return_tensors="pt", padding=True)
        assert sorted(batch) == ["attention_mask", "input_ids"]  # what generate() takes
        ids = model.generate(**batch, num_beams=1)
    assert tokenizer.batch_decode(ids, skip_special_tokens=True) == greedy


def test_the_length_cap_reads_the_same_in_transformers_4_and_5():
    """max_length counts the start token; 20, transformers 4.x's default, would mean 20 new tokens
    there and 19 in 5.x, so that cap is written as max_new_tokens (the same in both); aiayn's
    import reads every one back."""
    from aiayn.decode import DecodeConfig
    from aiayn.export.hf import generation_config
    from aiayn.interop.marian import decode_settings

    cfg = tiny_model_config(40, 64)
    for cap, written in (
        (18, {"max_length": 19}),
        (19, {"max_new_tokens": 19}),
        (63, {"max_length": 64}),
    ):
        decode = DecodeConfig(length_penalty="average", max_len_a=0.0, max_len_b=cap)
        generation = generation_config(cfg, decode)
        assert {k: generation.get(k) for k in written} == written
        assert ("max_length" in generation) != ("max_new_tokens" in generation)
        assert decode_settings(generation, cfg, Path("g.json"))["max_len_b"] == cap


def test_the_pre_ln_refusal_names_the_formats_and_recipes_that_work(tmp_path, capsys):
    """The default recipes are pre-LN (issue 66): the refusal names the formats that take such a
    model, and recipes whose models --format hf takes (they exist, post-LN translation)."""
    from aiayn.export.hf import POST_LN_RECIPES
    from aiayn.run_config import load_run_config

    folder = random_folder(tmp_path / "m", norm_first=True)
    argv = ["export", folder, "--format", "hf", "-o", tmp_path / "out"]
    line = fails(capsys, argv, "pre-LN", unchanged=[tmp_path])
    assert "--format onnx" in line and "--format ctranslate2" in line
    assert POST_LN_RECIPES
    root = Path(__file__).resolve().parent.parent
    for recipe in POST_LN_RECIPES:
        assert recipe in line
        cfg, _ = load_run_config(root / recipe)
        assert not cfg.model.norm_first and cfg.data.kind == "translation", recipe


def test_what_marian_cannot_express_is_one_clear_line(tmp_path, capsys):
    for options, message in (
        (dict(norm_first=True), "pre-LN"),
        (dict(positional="learned"), "learned"),
        (dict(d_k=4), "d_k"),
    ):
        folder = random_folder(tmp_path / str(len(list(tmp_path.iterdir()))), **options)
        argv = ["export", folder, "--format", "hf", "-o", tmp_path / "out"]
        fails(capsys, argv, message, unchanged=[tmp_path])
