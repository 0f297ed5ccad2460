"""The paper's BLEU (tokenised, ##AT## compound-split, multi-bleu.perl) against sacreBLEU on
pre-tokenised text, the perl one-liner's exact behaviour, and `aiayn evaluate --paper-bleu`."""

from __future__ import annotations

import json
import random
import sys

import pytest
from sacrebleu.metrics import BLEU

from aiayn.eval.paper_bleu import multi_bleu, paper_bleu, split_compounds
from serve_helpers import PAIRS, make_trained_folder
from trainutil import fails

WORDS = "der die das ein eine Haus Katze Hund läuft sitzt auf im Park , . ##AT##-##AT##".split()


def _corpus(seed: int, n: int = 200) -> tuple[list[str], list[str]]:
    """Pre-tokenised hypotheses and references that share most n-grams (none of BLEU's orders
    without a match, where sacreBLEU's default smoothing and multi-bleu.perl's 0 differ)."""
    rng = random.Random(seed)
    hyps, refs = [], []
    for _ in range(n):
        ref = [rng.choice(WORDS) for _ in range(rng.randint(1, 30))]
        hyp = [w if rng.random() < 0.8 else rng.choice(WORDS) for w in ref]
        hyp = hyp[: len(hyp) - rng.randint(0, 2)] or ref[:1]
        hyps.append(" ".join(hyp))
        refs.append("  ".join(ref))  # multiple spaces: whitespace tokens either way
    return hyps, refs


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_multi_bleu_agrees_with_sacrebleu_tokenize_none(seed):
    hyps, refs = _corpus(seed)
    ours = multi_bleu(hyps, refs)
    theirs = BLEU(tokenize="none", force=True).corpus_score(hyps, [refs])
    assert ours.score == pytest.approx(theirs.score, abs=1e-9)
    assert ours.precisions == pytest.approx(theirs.precisions, abs=1e-9)
    assert (ours.hyp_len, ours.ref_len) == (theirs.sys_len, theirs.ref_len)
    assert ours.bp == pytest.approx(theirs.bp, abs=1e-12) and ours.bp < 1.0  # shorter hyps


def test_multi_bleu_prints_as_the_perl_script_does():
    perfect = multi_bleu(["the cat sat on the mat"], ["the cat sat on the mat"])
    assert perfect.format() == (
        "BLEU = 100.00, 100.0/100.0/100.0/100.0 (BP=1.000, ratio=1.000, hyp_len=6, ref_len=6)")
    # an order without any match: multi-bleu.perl gives 0 (sacreBLEU's default smoothing does not)
    no_4gram = multi_bleu(["a b c x y z"], ["a b c d y z"])
    assert no_4gram.score == 0.0 and no_4gram.precisions[3] == 0.0
    assert BLEU(tokenize="none").corpus_score(["a b c x y z"], [["a b c d y z"]]).score > 0
    assert multi_bleu([""], ["a b"]).score == 0.0


def test_split_compounds_as_the_perl_one_liner():
    assert split_compounds("rich-text format") == "rich ##AT##-##AT## text format"
    assert split_compounds("E-Mail-Programm") == "E ##AT##-##AT## Mail ##AT##-##AT## Programm"
    assert split_compounds("a-b-c") == "a ##AT##-##AT## b-c"  # matches do not overlap
    assert split_compounds("ein - zwei -drei vier-") == "ein - zwei -drei vier-"


def test_paper_bleu_tokenises_splits_and_scores():
    hyps = ['Das E-Mail-Programm läuft, sagte er: "gut".']
    refs = ['Das E-Mail-Programm funktioniert, sagte er: "gut".']
    scores = paper_bleu(hyps, refs, "de")
    expected = multi_bleu(
        ["Das E ##AT##-##AT## Mail ##AT##-##AT## Programm läuft , sagte er : &quot; gut &quot; ."],
        ["Das E ##AT##-##AT## Mail ##AT##-##AT## Programm funktioniert , sagte er : &quot; gut "
         "&quot; ."])
    assert scores["bleu_paper"] == round(expected.score, 4) and 0 < expected.score < 100
    assert scores["bleu_paper_text"] == expected.format()
    assert scores["bleu_paper_signature"].startswith("tok:moses-de+escape|split:##AT##|multi-bleu")


def test_evaluate_reports_the_paper_bleu_beside_sacrebleu(tmp_path, capsys, monkeypatch):
    from aiayn.cli import main

    folder = make_trained_folder(tmp_path / "m")
    src, ref = tmp_path / "src.en", tmp_path / "ref.de"
    src.write_text("".join(s + "\n" for s, _ in PAIRS))
    ref.write_text("".join(t + "\n" for _, t in PAIRS))
    argv = ["evaluate", str(folder), "--src", str(src), "--ref", str(ref), "--paper-bleu",
            "-o", str(tmp_path / "scores.json"), "--device", "cpu"]
    fails(capsys, argv, "--paper-bleu needs the target language")  # the folder records no data
    config = json.loads((folder / "config.json").read_text())
    config["data"] = {"dataset": "", "src_lang": "en", "tgt_lang": "de"}
    (folder / "config.json").write_text(json.dumps(config))
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "sacremoses", None)  # not installed: said before any decoding
        fails(capsys, argv, "--paper-bleu needs the Moses tokenizer: pip install -e '.[paper]'")
    assert main(argv) == 0
    out = capsys.readouterr().out
    scores = json.loads((tmp_path / "scores.json").read_text())
    assert scores["bleu_paper_text"].replace("BLEU", "BLEU-paper", 1) in out
    assert scores["bleu_text"] in out and 0.0 <= scores["bleu_paper"] <= 100.0


def test_paper_bleu_is_refused_for_a_classifier(tmp_path, capsys):
    from serve_helpers import make_folder

    folder = make_folder(tmp_path / "clf", kind="classifier")
    texts = tmp_path / "t.tsv"
    texts.write_text("1\tgood\n0\tbad\n")
    fails(capsys, ["evaluate", str(folder), "--src", str(texts), "--paper-bleu"],
          "--paper-bleu scores translations; this is a classifier")
