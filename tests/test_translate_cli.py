"""`aiayn translate` and `aiayn evaluate` end to end, BLEU scoring, and every bad input.

The fast tests use a small model folder with random weights (its translations are arbitrary but
deterministic, which is all alignment, batch invariance and error handling need). The slow test
trains a copy task, then checks that `evaluate` scores it near 100 BLEU.
"""

from __future__ import annotations

import io
import json
import random
import sys
from pathlib import Path

import pytest
import torch
from trainutil import fails, process_fails, tiny_model_config

from aiayn.folder.checkpoint import save_model_dir
from aiayn.cli import main
from aiayn.commands.translate import one_line
from aiayn.data import train_tokenizer
from aiayn.decode import translate_texts
from aiayn.folder import load_model_folder
from aiayn.errors import DataError
from aiayn.eval import corpus_scores
from aiayn.model import Transformer

WORDS = "the a cat dog sits runs on under mat table red blue".split()


pytestmark = pytest.mark.usefixtures("one_thread")


def sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6))) for _ in range(n)]


def make_model_dir(folder: Path, texts: list[str], max_len: int = 32, **extra) -> tuple[Path, Transformer]:
    tok = train_tokenizer(texts, "bpe", vocab_size=300)
    cfg = tiny_model_config(vocab=304, max_len=max_len)
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    save_model_dir(folder, model, cfg, tokenizer_json=tok.to_str(), extra=extra)
    return folder, model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    folder, _ = make_model_dir(tmp_path_factory.mktemp("model") / "m", sentences(500, 0))
    return folder


def cli(*argv: str, capsys=None) -> int:
    return main([str(a) for a in argv])


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


# ---- translate -------------------------------------------------------------------------------


def test_translating_a_file_equals_translating_each_line_alone(model_dir, tmp_path):
    lines = sentences(12, 1)
    lines[3] = ""  # a blank line stays a blank line, in place
    lines[7] = "   "
    src, out = write_lines(tmp_path / "in.txt", lines), tmp_path / "out.txt"
    assert cli("translate", model_dir, "--input", src, "--out", out, "--beam", 3,
               "--batch-tokens", 20, "--set", "decode.max_len_b=6") == 0
    got = out.read_text(encoding="utf-8").split("\n")
    assert got[-1] == "" and len(got) - 1 == len(lines)
    assert got[3] == "" and got[7] == ""
    folder = load_model_folder(model_dir)
    model, tokenizer = folder.torch_module(), folder.tokenizer
    for line, translation in zip(lines, got):
        assert [one_line(t) for t in translate_texts(model, tokenizer, [line], beam=3, max_len_b=6)] == [translation]


def test_stdin_to_stdout_and_nbest_format(model_dir, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"the cat\r\n\nred dog\n")))
    assert cli("translate", model_dir, "--beam", 3, "--nbest", 2, "--set", "decode.max_len_b=6") == 0
    rows = capsys.readouterr().out.splitlines()
    assert [r.split("\t")[0] for r in rows] == ["1", "1", "2", "2", "3", "3"]
    scores = [float(r.split("\t")[1]) for r in rows if not r.startswith("2\t")]
    assert scores[0] >= scores[1] and scores[2] >= scores[3]  # best first


def test_interactive_prompt_on_a_terminal(model_dir, monkeypatch, capsys):
    stdin = io.TextIOWrapper(io.BytesIO(b"the cat\nred dog\n"))
    monkeypatch.setattr(stdin, "isatty", lambda: True)
    monkeypatch.setattr(sys, "stdin", stdin)
    assert cli("translate", model_dir, "--beam", 2, "--set", "decode.max_len_b=6") == 0
    folder = load_model_folder(model_dir)
    model, tokenizer = folder.torch_module(), folder.tokenizer
    expected = translate_texts(model, tokenizer, ["the cat", "red dog"], beam=2, max_len_b=6)
    assert capsys.readouterr().out.split("\n")[:-1] == [one_line(t) for t in expected]


def test_over_long_line_is_cut_with_a_warning(tmp_path, caplog):
    folder, _ = make_model_dir(tmp_path / "short", sentences(500, 0), max_len=8)
    src = write_lines(tmp_path / "in.txt", ["the cat", " ".join(["table"] * 30), "red dog"])
    out = tmp_path / "out.txt"
    with caplog.at_level("WARNING"):
        assert cli("translate", folder, "--input", src, "--out", out, "--set", "decode.max_len_b=50") == 0
    assert "line 2" in caplog.text and "cut to the model's limit of 8" in caplog.text
    assert len(out.read_text(encoding="utf-8").split("\n")) == 4  # 3 lines + final newline


def test_non_utf8_input_names_the_line(model_dir, tmp_path, capsys):
    src = tmp_path / "bad.txt"
    src.write_bytes(b"the cat\nred \xff dog\n")
    fails(capsys, ["translate", model_dir, "--input", src], f"{src}:2: not valid UTF-8",
          unchanged=[model_dir, tmp_path])


@pytest.mark.parametrize("damage, message", [
    ("tokenizer.json", "tokenizer.json is missing"),
    ("model.safetensors", "weights file not found"),
    ("config.json", "config.json is missing"),
])
def test_incomplete_model_folder_is_a_clear_error(tmp_path, capsys, damage, message):
    folder, _ = make_model_dir(tmp_path / "m", sentences(200, 0))
    (folder / damage).unlink()
    fails(capsys, ["translate", folder, "--input", write_lines(tmp_path / "in.txt", ["a cat"])],
          message, unchanged=[tmp_path])


def test_wrong_kind_and_corrupt_weights_are_clear_errors(tmp_path, capsys):
    folder, _ = make_model_dir(tmp_path / "m", sentences(200, 0))
    meta = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**meta, "kind": "lm"}))
    src = write_lines(tmp_path / "in.txt", ["a cat"])
    fails(capsys, ["translate", folder, "--input", src],
          "holds a 'lm' model, this command needs 'translation'", unchanged=[tmp_path])
    (folder / "config.json").write_text(json.dumps(meta))
    (folder / "model.safetensors").write_bytes(b"not safetensors")
    fails(capsys, ["translate", folder, "--input", src], "not a readable safetensors file",
          unchanged=[tmp_path])


def test_errors_exit_nonzero_without_traceback_in_a_real_process(tmp_path):
    process_fails(["translate", tmp_path / "nowhere"], "model folder not found", unchanged=[tmp_path])


# ---- evaluate --------------------------------------------------------------------------------


def test_evaluate_src_ref_prints_and_saves_scores(model_dir, tmp_path, capsys):
    lines = sentences(10, 2)
    src = write_lines(tmp_path / "test.en", lines)
    ref = write_lines(tmp_path / "test.de", lines)
    hyps, out = tmp_path / "hyps.txt", tmp_path / "scores.json"
    assert cli("evaluate", model_dir, "--src", src, "--ref", ref, "--beam", 2, "--out", out,
               "--hyps", hyps, "--set", "decode.max_len_b=6") == 0
    printed = capsys.readouterr().out
    scores = json.loads(out.read_text())
    assert "BLEU = " in printed and "BLEU-lc = " in printed and "chrF2 = " in printed
    assert "case:mixed" in scores["bleu_signature"] and "case:lc" in scores["bleu_lc_signature"]
    assert scores["n"] == 10 and scores["sentences_per_s"] > 0 and scores["decoding"]["beam"] == 2
    translated = hyps.read_text(encoding="utf-8").split("\n")[:-1]
    assert scores["bleu"] == corpus_scores(translated, lines)["bleu"]


def test_evaluate_split_of_the_models_own_files(tmp_path, capsys):
    lines = sentences(6, 3)
    src = write_lines(tmp_path / "valid.en", lines)
    tgt = write_lines(tmp_path / "valid.de", lines)
    data = {"dataset": "", "valid_src": str(src), "valid_tgt": str(tgt)}
    folder, _ = make_model_dir(tmp_path / "m", sentences(200, 0), data=data)
    assert cli("evaluate", folder, "--split", "valid", "--beam", 1, "--set", "decode.max_len_b=6") == 0
    assert json.loads((folder / "eval_valid.json").read_text())["n"] == 6


def test_evaluate_argument_errors(model_dir, tmp_path, capsys):
    kept = [model_dir, tmp_path]
    fails(capsys, ["evaluate", model_dir], "either --split NAME or --src FILE --ref FILE", unchanged=kept)
    fails(capsys, ["evaluate", model_dir, "--split", "test"], "records no dataset", unchanged=kept)
    src = write_lines(tmp_path / "a.txt", ["a", "b"])
    ref = write_lines(tmp_path / "b.txt", ["a"])
    fails(capsys, ["evaluate", model_dir, "--src", src, "--ref", ref], "differ in length",
          unchanged=kept)


# ---- BLEU ------------------------------------------------------------------------------------


def test_corpus_scores_cased_lowercased_and_chrf():
    refs = ["The cat sits on the mat .", "A red dog runs ."]
    perfect = corpus_scores(refs, refs)
    assert perfect["bleu"] == 100.0 and perfect["bleu_lc"] == 100.0 and perfect["chrf"] == 100.0
    lower = corpus_scores([r.lower() for r in refs], refs)
    assert lower["bleu_lc"] == 100.0 and lower["bleu"] < 100.0
    assert "case:mixed" in lower["bleu_signature"] and "tok:13a" in lower["bleu_signature"]
    assert lower["chrf_signature"].startswith("nrefs:1|case:mixed")
    with pytest.raises(DataError, match="2 references"):
        corpus_scores(["one"], refs)


# ---- the whole chain, on a model that learned something ---------------------------------------


@pytest.mark.slow
def test_a_trained_copy_model_translates_and_scores_near_100(tmp_path, capsys):
    """Train a copy task (~400 updates), save, translate and evaluate through the CLI."""
    from aiayn.data import collate_translation
    from aiayn.data import Tokenizer

    texts = sentences(2000, 0)
    folder, model = make_model_dir(tmp_path / "copy", texts)
    tok = Tokenizer.from_file(folder / "tokenizer.json")
    ids = [tok.encode(t) for t in texts]
    opt, rng = torch.optim.Adam(model.parameters(), lr=2e-3), random.Random(0)
    model.train()
    for _ in range(400):
        batch = collate_translation([(x, x) for x in rng.sample(ids, 64)], 0, 1, 2)
        logits = model(batch.src, batch.tgt_in)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.tgt_out.flatten(),
                                                 ignore_index=0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    save_model_dir(folder, model.eval(), model.cfg, tokenizer_json=tok.to_str())
    test = sentences(50, 9)
    src = write_lines(tmp_path / "t.en", test)
    assert cli("evaluate", folder, "--src", src, "--ref", src, "--out", tmp_path / "s.json") == 0
    assert json.loads((tmp_path / "s.json").read_text())["bleu"] > 90


@pytest.mark.parametrize("native", [True, False])
def test_bf16_on_a_cpu_without_native_bf16_warns(monkeypatch, caplog, native):
    import aiayn.threads as threads
    from aiayn.folder import precision

    monkeypatch.setattr(threads, "cpu_has_bf16", lambda: native)
    with caplog.at_level("WARNING"), precision(torch.device("cpu"), True):
        assert torch.is_autocast_enabled("cpu")  # asked for: still applied, only warned about
    with caplog.at_level("WARNING"), precision(torch.device("cpu"), False):
        assert not torch.is_autocast_enabled("cpu")
    warned = [r.getMessage() for r in caplog.records if "no native bf16" in r.getMessage()]
    assert len(warned) == (0 if native else 1)


def test_a_limited_evaluation_never_stands_for_the_whole_set(tmp_path, capsys):
    """`evaluate --limit N` overwrote eval_<split>.json, and the card then showed the N-sentence
    score as the split's. It is saved beside it, named and marked as a part, and the card says so;
    a limit that covers the whole set is the set's score."""
    lines = sentences(6, 3)
    src = write_lines(tmp_path / "valid.en", lines)
    tgt = write_lines(tmp_path / "valid.de", lines)
    data = {"dataset": "", "valid_src": str(src), "valid_tgt": str(tgt)}
    folder, _ = make_model_dir(tmp_path / "m", sentences(200, 0), data=data)
    decode = ("--beam", 1, "--set", "decode.max_len_b=6")
    assert cli("evaluate", folder, "--split", "valid", *decode) == 0
    whole = (folder / "eval_valid.json").read_text()
    capsys.readouterr()
    assert cli("evaluate", folder, "--split", "valid", "--limit", 2, *decode) == 0
    assert "2 sentences (the first 2 of valid only) in" in capsys.readouterr().out
    assert (folder / "eval_valid.json").read_text() == whole  # the whole set's record stays
    part = json.loads((folder / "eval_valid_first2.json").read_text())
    assert (part["n"], part["limit"], part["test_set"]) == (2, 2, "valid")
    card = (folder / "README.md").read_text()
    assert "| `eval_valid.json` | valid |" in card
    assert "| `eval_valid_first2.json` | valid (first 2 only: not the set's score) |" in card
    assert cli("evaluate", folder, "--split", "valid", "--limit", 6, *decode) == 0
    assert "limit" not in json.loads((folder / "eval_valid.json").read_text())
    assert not (folder / "eval_valid_first6.json").exists()
