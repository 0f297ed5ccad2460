"""`aiayn import hf` (aiayn/interop/marian.py) against transformers, on the tiny Marian folder of
tests/hf_helpers.py (built locally, no network): logits to 1e-4 on a padded batch; greedy and
beam-4 tokens equal ``model.generate`` on 24 sentences under several generation settings;
``aiayn translate`` with no flags gives ``generate()``'s text; the ONNX and CTranslate2 exports of
the imported folder give the same tokens; every input that cannot be mapped is one clear line."""

import dataclasses
import json
import shutil

import pytest
import torch
from hf_helpers import MAX_LENGTH, sentences
from trainutil import fails, torch_threads

from aiayn.decode import DecodeConfig
from aiayn.decode.translate import translate_ids
from aiayn.folder import load_model_folder
from aiayn.interop.marian import decode_settings, import_marian, read_generation


@pytest.fixture(scope="module")
def imported(marian_folder, tmp_path_factory):
    """(HF folder, imported aiayn folder, MarianMTModel, MarianTokenizer)."""
    from transformers import MarianMTModel, MarianTokenizer

    out = import_marian(marian_folder, tmp_path_factory.mktemp("imported") / "opus-mt-tiny")
    hf = MarianMTModel.from_pretrained(marian_folder).eval()
    return marian_folder, out, hf, MarianTokenizer.from_pretrained(marian_folder)


def short_sources(n: int = 24) -> list[str]:
    """Multi30k English sentences of up to 10 words (outputs end before max_length, or not)."""
    return [s for s in sentences("en", 400, skip=1000) if len(s.split()) <= 10][:n]


def test_logits_equal_transformers_on_a_padded_batch(imported):
    _, out, hf, tok = imported
    model = load_model_folder(out).torch_module()
    batch = tok(short_sources(8), return_tensors="pt", padding=True)
    assert (batch.input_ids == tok.pad_token_id).any()  # the batch is padded
    generator = torch.Generator().manual_seed(0)
    tgt = torch.randint(2, tok.pad_token_id, (8, 6), generator=generator)
    tgt[:, 0] = tok.pad_token_id  # the decoder start
    with torch.no_grad():
        theirs = hf(**batch, decoder_input_ids=tgt).logits
        ours = model(batch.input_ids, tgt)
    assert (ours - theirs).abs().max() < 1e-4


VARIANTS = [
    {},  # the folder's own settings: beam 4, length_penalty 1, early_stopping false, forced EOS
    {"length_penalty": 0.6, "early_stopping": True},
    {"length_penalty": 2.0, "renormalize_logits": True, "min_length": 4},
]


@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_and_beam_tokens_equal_generate(imported, variant):
    folder, out, hf, tok = imported
    loaded = load_model_folder(out)
    generation, path = read_generation(folder, {})
    texts = short_sources()
    batch = tok(texts, return_tensors="pt", padding=True)
    sources = [loaded.tokenizer.encode(t) for t in texts]
    settings = decode_settings({**generation, **variant}, loaded.backend.cfg, path)
    ended = 0
    for beam in (1, 4):
        cfg = DecodeConfig(**{**settings, "beam": beam, "bad_ids": tuple(settings["bad_ids"])})
        with torch_threads(1):
            ours = [line[0].tokens for line in translate_ids(loaded.torch_module(), sources, cfg)]
            out_ids = hf.generate(**batch, **variant, num_beams=beam).tolist()
        special = {tok.pad_token_id, tok.eos_token_id}
        theirs = [[i for i in row[1:] if i not in special] for row in out_ids]
        assert ours == theirs, beam
        ended += sum(len(t) < MAX_LENGTH - 2 for t in theirs)  # before the forced EOS
    assert ended > 0  # not every output ran to max_length: EOS decisions were tested


def test_the_length_cap_is_generates_with_or_without_max_length(imported):
    """transformers generates max_new_tokens, else max_length - 1 (it counts the start token),
    else 20 new tokens, its default (measured with 4.57.6 and 5.24.0: docs/huggingface.md)."""
    folder, out, _, _ = imported
    cfg = load_model_folder(out).backend.cfg
    path = folder / "generation_config.json"
    for generation, cap in (
        ({}, 20),
        ({"max_length": 22}, 21),
        ({"max_length": 22, "max_new_tokens": 7}, 7),
    ):
        assert decode_settings(generation, cfg, path)["max_len_b"] == cap, generation


def test_translate_with_no_flags_gives_generates_text(imported, tmp_path, capsys):
    from aiayn.cli import main

    _, out, hf, tok = imported
    texts = short_sources(20)
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["translate", str(out), "--input", str(tmp_path / "in.txt")]) == 0
    ours = capsys.readouterr().out.splitlines()
    with torch_threads(1):
        generated = hf.generate(**tok(texts, return_tensors="pt", padding=True))
    assert ours == tok.batch_decode(generated, skip_special_tokens=True)


def test_exports_of_the_imported_folder_give_the_same_tokens(imported, tmp_path, caplog):
    """ONNX runs aiayn's own search: the same tokens under the folder's settings and others.
    CTranslate2 runs its own: greedy is exact; its beam search stops at k finished hypotheses and
    has no forced EOS at the cap, so a beam is compared with early_stopping=true and no forced
    EOS, and the folder's early_stopping=false and forced EOS are each said in a warning."""
    pytest.importorskip("onnxruntime", reason="needs the export extra")
    pytest.importorskip("ctranslate2", reason="needs the ctranslate2 extra")
    from aiayn.export import export_model

    _, out, _, _ = imported
    loaded = load_model_folder(out)
    assert loaded.decode.forced_eos and not loaded.decode.early_stopping  # OPUS-MT's
    sources = [loaded.tokenizer.encode(t) for t in short_sources()]
    onnx = load_model_folder(export_model(out, "onnx", tmp_path / "onnx")).backend
    ct2 = load_model_folder(export_model(out, "ctranslate2", tmp_path / "ct2")).backend
    for beam, early_stopping, forced_eos in (
        (1, False, True),
        (4, False, True),
        (4, True, True),
        (4, True, False),
    ):
        cfg = dataclasses.replace(
            loaded.decode, beam=beam, early_stopping=early_stopping, forced_eos=forced_eos
        )
        with torch_threads(1):
            native = [line[0].tokens for line in translate_ids(loaded.torch_module(), sources, cfg)]
            assert [line[0].tokens for line in onnx.translate_ids(sources, cfg)] == native
            caplog.clear()
            by_ct2 = [line[0].tokens for line in ct2.translate_ids(sources, cfg)]
        if beam == 1 or (early_stopping and not forced_eos):
            assert by_ct2 == native
        else:
            assert ("no early_stopping=false" in caplog.text) == (not early_stopping)
            assert ("no forced EOS" in caplog.text) == forced_eos


def test_the_folder_records_source_licence_and_settings(marian_folder, tmp_path):
    source = tmp_path / "opus-mt-en-de"
    shutil.copytree(marian_folder, source)
    (source / "README.md").write_text("---\nlanguage: [en, de]\nlicense: cc-by-4.0\n---\n# x\n")
    out = import_marian(source, tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    assert config["imported_from"]["licence"] == "cc-by-4.0"
    assert (config["imported_from"]["src_lang"], config["imported_from"]["tgt_lang"]) == (
        "en",
        "de",
    )
    assert config["decode"]["beam"] == 4 and config["decode"]["length_penalty"] == "power"
    card = (out / "README.md").read_text()
    assert "| licence | cc-by-4.0 |" in card and str(source.resolve()) in card
    assert "| task | translation (en → de) |" in card


def test_pytorch_model_bin_is_read_without_pickled_code(marian_folder, tmp_path):
    from safetensors.torch import load_file

    source = tmp_path / "bin"
    shutil.copytree(marian_folder, source)
    state = load_file(str(source / "model.safetensors"))
    (source / "model.safetensors").unlink()
    torch.save(state, source / "pytorch_model.bin")
    out = import_marian(source, tmp_path / "out")
    ours = load_model_folder(out).torch_module().state_dict()
    theirs = load_model_folder(import_marian(marian_folder, tmp_path / "ref")).torch_module().state_dict()
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)


class _Payload:
    def __reduce__(self):
        return (print, ("pickled code ran",))


def _edit_json(name, **values):
    def edit(folder):
        path = folder / name
        obj = json.loads(path.read_text())
        obj.update(values)
        path.write_text(json.dumps(obj))

    return edit


def _extra_weight(folder):
    from safetensors.torch import load_file, save_file

    state = load_file(str(folder / "model.safetensors"))
    state["model.encoder.layernorm_embedding.weight"] = torch.ones(16)
    save_file(state, str(folder / "model.safetensors"))


def _nan_weight(folder):
    from safetensors.torch import load_file, save_file

    state = load_file(str(folder / "model.safetensors"))
    state["model.encoder.layers.0.fc1.weight"][0, 0] = float("nan")
    save_file(state, str(folder / "model.safetensors"))


def _pickled_code(folder):
    (folder / "model.safetensors").unlink()
    torch.save({"model.shared.weight": _Payload()}, folder / "pytorch_model.bin")


BAD = {
    "no vocab": (lambda f: (f / "vocab.json").unlink(), "vocab.json is missing"),
    "bart": (_edit_json("config.json", model_type="bart"), "model_type 'bart' is not a Marian"),
    "pre-LN": (_edit_json("config.json", normalize_before=True), "a pre-LN Marian variant"),
    "no weights": (
        lambda f: (f / "model.safetensors").unlink(),
        "no model.safetensors or pytorch_model.bin",
    ),
    "corrupt weights": (
        lambda f: (f / "model.safetensors").write_bytes(b"\x00" * 64),
        "not a readable safetensors file",
    ),
    "pickled code": (_pickled_code, "not loadable as plain tensors (weights_only"),
    "extra weight": (_extra_weight, "weights aiayn has no place for"),
    "ngram rule": (
        _edit_json("generation_config.json", no_repeat_ngram_size=3),
        "no_repeat_ngram_size = 3 cannot be mapped",
    ),
    "long bad word": (
        _edit_json("generation_config.json", bad_words_ids=[[5, 6]]),
        "only single-token bad words",
    ),
    "sampling": (_edit_json("generation_config.json", do_sample=True), "do_sample = True"),
    "vocab size": (
        _edit_json("config.json", vocab_size=300, decoder_vocab_size=300),
        "vocab.json has 255 tokens",
    ),
    # settings every later command refused, or that made every translation blank (issue #55):
    # refused at the door, naming the file and the key
    "no beams": (
        _edit_json("generation_config.json", num_beams=0),
        "generation_config.json: num_beams must be >= 1, got 0",
    ),
    "bad word outside the vocabulary": (
        _edit_json("generation_config.json", bad_words_ids=[[5], [100000]]),
        "generation_config.json: bad_words_ids [100000]: ids must be in the vocabulary (0 … 254)",
    ),
    "min above max": (
        _edit_json("generation_config.json", min_length=30, max_length=10),
        "generation_config.json: min_length (30) must not exceed max_length (10)",
    ),
    "negative max_length": (
        _edit_json("generation_config.json", max_length=-5),
        "generation_config.json: max_length must be >= 1, got -5",
    ),
    "NaN length penalty": (
        _edit_json("generation_config.json", length_penalty=float("nan")),
        "generation_config.json: length_penalty must be a finite number >= 0, got nan",
    ),
    "inf length penalty": (
        _edit_json("generation_config.json", length_penalty=float("inf")),
        "generation_config.json: length_penalty must be a finite number >= 0, got inf",
    ),
    "NaN dropout": (
        _edit_json("config.json", dropout=float("nan")),
        "config.json: dropout must be a finite number >= 0 and <= 1, got nan",
    ),
    "NaN weights": (_nan_weight, "model.safetensors: tensor 'model.encoder.layers.0.fc1.weight' holds NaN"),
    "corrupt source.spm": (
        lambda f: (f / "source.spm").write_bytes(b"\x00" * 64),
        "source.spm: not a SentencePiece model",
    ),
}


@pytest.mark.parametrize("case", BAD)
def test_what_cannot_be_mapped_is_one_clear_line(marian_folder, tmp_path, capsys, case):
    edit, message = BAD[case]
    source = tmp_path / "src"
    shutil.copytree(marian_folder, source)
    edit(source)
    out = tmp_path / "out"
    fails(capsys, ["import", "hf", source, "-o", out], message, unchanged=[tmp_path])
    assert "pickled code ran" not in capsys.readouterr().out


def test_bad_paths_are_one_clear_line(marian_folder, tmp_path, capsys):
    source = tmp_path / "src"
    shutil.copytree(marian_folder, source)
    argv = ["import", "hf", source, "-o"]
    fails(capsys, ["import", "hf", tmp_path / "nothing", "-o", tmp_path / "o"], "no such folder")
    fails(capsys, argv + [source / "inside"], "-o", unchanged=[tmp_path])
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    fails(capsys, argv + [tmp_path / "full"], "--overwrite", unchanged=[tmp_path])


def test_a_bad_id_outside_the_vocabulary_is_one_clear_line(imported, tmp_path, capsys):
    _, out, _, _ = imported
    folder = tmp_path / "edited"
    shutil.copytree(out, folder)
    config = json.loads((folder / "config.json").read_text())
    config["decode"]["bad_ids"] = [100000]
    (folder / "config.json").write_text(json.dumps(config))
    (tmp_path / "in.txt").write_text("A dog.\n")
    argv = ["translate", folder, "--input", tmp_path / "in.txt"]
    fails(
        capsys, argv, "decode.bad_ids [100000]: ids must be in the vocabulary", unchanged=[folder]
    )


def test_an_imported_folder_exports_back_to_the_model_it_came_from(imported, tmp_path):
    """Marian -> aiayn -> Marian: the same weights, tokenizer and generate() output."""
    from safetensors.torch import load_file
    from transformers import MarianMTModel, MarianTokenizer

    from aiayn.export import export_model

    folder, out, hf, tok = imported
    back = export_model(out, "hf", tmp_path / "back")
    original, written = (
        load_file(str(folder / "model.safetensors")),
        load_file(str(back / "model.safetensors")),
    )
    assert set(written) == set(original)
    assert all(torch.equal(written[k], original[k]) for k in original)
    texts = short_sources(8)
    their_tok = MarianTokenizer.from_pretrained(back)
    assert their_tok(texts).input_ids == tok(texts).input_ids
    model = MarianMTModel.from_pretrained(back).eval()
    batch = tok(texts, return_tensors="pt", padding=True)
    with torch_threads(1):
        assert torch.equal(model.generate(**batch), hf.generate(**batch))
