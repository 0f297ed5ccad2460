"""Decoding controls: repetition penalty and no-repeat n-grams (against transformers' logits
processors), a forced target prefix, and alignments from cross-attention, through search, the
Python call and `aiayn translate`; the engines pass them through or refuse them by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from serve_helpers import PAIRS, make_folder, make_trained_folder
from trainutil import fails, tiny_model_config

from aiayn.folder.checkpoint import save_model_dir
from aiayn.cli import main
from aiayn.data import train_tokenizer
from aiayn.decode import DecodeConfig, SearchSettings, greedy_search
from aiayn.decode.rules import Rows, Rules
from aiayn.decode.step import force_prefix
from aiayn.errors import ConfigError
from aiayn.folder import load_model_folder
from aiayn.model import Transformer

pytestmark = pytest.mark.usefixtures("one_thread")

# The new user's sentence: an emoji and Chinese characters (byte-level pieces).
EMOJI_CHINESE = "I love 北京 🙂 so much"


def random_rows(seed: int, n: int = 6, t: int = 12, vocab: int = 9) -> tuple[torch.Tensor, ...]:
    """(tokens (n, t) with many repeats, log-probs (n, 40))."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (n, t), generator=g)
    return tokens, torch.randn(n, 40, generator=g).log_softmax(-1)


@pytest.mark.parametrize("penalty", [0.7, 1.0, 1.3, 2.5])
@pytest.mark.parametrize("seed", [0, 1])
def test_repetition_penalty_equals_transformers(penalty, seed):
    transformers = pytest.importorskip("transformers", reason="needs the test extra")
    tokens, log_probs = random_rows(seed)
    log_probs[0, 3] = 0.5  # a positive score is divided, not multiplied
    tokens[0, 0] = 3
    want = transformers.RepetitionPenaltyLogitsProcessor(penalty)(tokens, log_probs.clone())
    got = Rules(repetition_penalty=penalty).apply(log_probs.clone(), Rows(tokens, 2))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    if penalty > 1:
        assert bool((got[0, tokens[0]] < log_probs[0, tokens[0]]).all())


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("t", [1, 3, 12])
def test_no_repeat_ngram_equals_transformers(n, t):
    transformers = pytest.importorskip("transformers", reason="needs the test extra")
    tokens, log_probs = random_rows(n * 10 + t, t=t, vocab=4)
    want = transformers.NoRepeatNGramLogitsProcessor(n)(tokens, log_probs.clone())
    got = Rules(no_repeat_ngram_size=n).apply(log_probs.clone(), Rows(tokens, 2))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    if t >= n >= 2:  # something is banned: the row's last n-1 tokens occurred before
        assert bool(torch.isinf(got).any()) == bool(torch.isinf(want).any())


def test_a_ban_that_would_empty_a_row_leaves_it_alone():
    """A forced prefix token that repeats an n-gram stays possible (the row would die)."""
    tokens = torch.tensor([[1, 5, 6, 5]])
    log_probs = torch.full((1, 8), float("-inf"))
    log_probs[0, 6] = -0.3  # the only token left, and it would repeat (5, 6)
    got = Rules(no_repeat_ngram_size=2).apply(log_probs.clone(), Rows(tokens, 2))
    assert got[0, 6] == -0.3
    log_probs[0, 7] = -2.0  # another token is allowed: the ban applies
    got = Rules(no_repeat_ngram_size=2).apply(log_probs.clone(), Rows(tokens, 2))
    assert got[0, 6] == float("-inf") and got[0, 7] == -2.0


def test_decode_config_checks_the_controls():
    for bad in (dict(repetition_penalty=0.0), dict(repetition_penalty=float("nan")),
                dict(no_repeat_ngram_size=-1)):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            DecodeConfig(**bad)


# ---- a forced prefix, in search -------------------------------------------------------------


def fixed_step(table: torch.Tensor):
    """A step function whose next-token log-probabilities are table[last token]."""

    def step(tokens, cache):
        return table[tokens[:, -1]].clone(), cache

    return step


def test_forced_prefix_keeps_the_models_log_probs_and_search_goes_on():
    V = 6
    table = torch.full((V, V), -5.0)
    table[:, 3] = -0.1  # 3 is always the best
    table[3, 2] = -0.2  # after 3: EOS next-best
    table[4, 5] = -0.05
    table = table.log_softmax(-1)
    forced = torch.tensor([[4, 5, -1], [-1, -1, -1]])  # row 0: prefix 4 5; row 1: none
    step, cache = force_prefix(fixed_step(table), None, forced)
    hyps = greedy_search(step, cache, 2, 6, SearchSettings(1, 2))
    assert hyps[0].tokens[:2] == [4, 5] and hyps[0].tokens[2] == 3
    assert hyps[1].tokens[0] == 3
    path = [1, *hyps[0].tokens, *([2] if hyps[0].finished else [])]
    want = sum(float(table[a, b]) for a, b in zip(path, path[1:]))  # the model's own
    assert hyps[0].log_prob == pytest.approx(want)


# ---- a model that repeats ---------------------------------------------------------------------


def repeating_folder(path: Path) -> tuple[Path, int]:
    """A tiny translation model that outputs one piece for ever: every output logit is a bias,
    that piece's highest and EOS's next. Returns (folder, the piece's id)."""
    tok = train_tokenizer([EMOJI_CHINESE, "the cat sits on the mat"] * 20, "bpe", vocab_size=300)
    cfg = tiny_model_config(vocab=tok.vocab_size, max_len=128, final_logits_bias=True)
    torch.manual_seed(0)
    model = Transformer(cfg)
    piece = tok.encode("北")[0]  # one byte-level piece of a Chinese character
    with torch.no_grad():
        model.generator.weight.zero_()
        model.generator.bias.zero_()
        model.generator.bias[piece] = 6.0
        model.generator.bias[cfg.eos_id] = 5.5
    folder = save_model_dir(path, model.eval(), cfg, tokenizer_json=tok.to_str(),
                            extra={"decode": {"beam": 4, "max_len_a": 0.0, "max_len_b": 100}})
    return folder, piece


@pytest.mark.parametrize("beam", [1, 4])
def test_the_controls_end_a_repeating_output_short(tmp_path, beam):
    """The new user's case: a sentence with an emoji and Chinese characters made the model repeat
    one piece to its cap; either control ends the output after a few tokens."""
    folder, piece = repeating_folder(tmp_path / "m")
    model = load_model_folder(folder)
    (hyp,) = model.translate_hypotheses([EMOJI_CHINESE], beam=1)[0]
    assert hyp[1].tokens == [piece] * 100 and not hyp[1].finished  # repeats to the cap
    assert len(hyp[0]) >= 30  # the ~100 characters of repeated pieces the user saw
    (hyp,) = model.translate_hypotheses([EMOJI_CHINESE], beam=beam, no_repeat_ngram_size=2)[0]
    assert len(hyp[1].tokens) <= 2 and hyp[1].finished and len(hyp[0]) <= 2
    (hyp,) = model.translate_hypotheses([EMOJI_CHINESE], beam=beam, repetition_penalty=2.0)[0]
    assert len(hyp[1].tokens) <= 1 and hyp[1].finished and len(hyp[0]) <= 1
    if beam == 1:  # exactly: the piece until it would repeat, then EOS
        assert hyp[1].tokens == [piece]


# ---- prefixes and alignments through the Python call and the command line -------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    torch.set_num_threads(1)
    return make_trained_folder(tmp_path_factory.mktemp("controls") / "m")


@pytest.mark.parametrize("beam", [1, 4])
def test_a_prefix_starts_the_output_and_the_models_own_output_changes_nothing(trained, beam):
    model = load_model_folder(trained)
    sources = [s for s, _ in PAIRS]
    plain = model.translate(sources, beam=beam)
    assert plain == [t for _, t in PAIRS]  # it learned them
    assert model.translate(sources, prefixes=plain, beam=beam) == plain
    half = [" ".join(t.split()[:2]) for t in plain]
    assert model.translate(sources, prefixes=half, beam=beam) == plain
    steer = ["ein hund", None, "eine katze sitzt"]  # another start: the output keeps it
    out = model.translate(sources, prefixes=steer, beam=beam)
    assert out[0].startswith("ein hund") and out[1] == plain[1]
    assert out[2].startswith("eine katze sitzt")


def test_alignments_pair_every_output_token_with_a_source_token(trained):
    model = load_model_folder(trained)
    source = PAIRS[0][0]
    n_src = len(model.tokenizer.encode(source))
    for (text, hyp) in model.translate_hypotheses([source], nbest=2, beam=4, alignments=True)[0]:
        assert hyp.alignment is not None
        assert [j for _, j in hyp.alignment] == list(range(len(hyp.tokens)))
        assert all(0 <= i < n_src for i, _ in hyp.alignment)
    (_, hyp), = model.translate_hypotheses([source])[0]
    assert hyp.alignment is None  # only when asked


def test_bad_prefixes_are_one_line_errors(trained, tmp_path, capsys):
    model = load_model_folder(trained)
    with pytest.raises(ConfigError, match="2 prefixes for 1 texts"):
        model.translate(["a cat"], prefixes=["a", "b"])
    with pytest.raises(ConfigError, match="prefix 1 has .* tokens; the decoder holds at most 47"):
        model.translate(["a cat"], prefixes=["katze " * 60])
    src, pre = tmp_path / "in.txt", tmp_path / "pre.txt"
    src.write_text("a cat sits on the mat\na dog runs in the park\n", encoding="utf-8")
    pre.write_text("eine\n", encoding="utf-8")
    fails(capsys, ["translate", str(trained), "-i", str(src), "--prefixes", str(pre)],
          "1 lines for 2 input lines")
    fails(capsys, ["translate", str(trained), "-i", str(src), "--set", "decode.repetition_penalty=0"],
          "repetition_penalty must be a number > 0")
    fails(capsys, ["translate", str(trained), "-i", str(src), "--set", "decode.no_repeat_ngram_size=-2"],
          "no_repeat_ngram_size must be >= 0")


def test_cli_prefixes_alignments_and_controls(trained, tmp_path, capsys):
    src, pre = tmp_path / "in.txt", tmp_path / "pre.txt"
    src.write_text("a cat sits on the mat\na dog runs in the park\n", encoding="utf-8")
    pre.write_text("ein hund\n\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["translate", str(trained), "-i", str(src), "--prefixes", str(pre),
                 "--alignments", "--set", "decode.no_repeat_ngram_size=3",
                 "--set", "decode.repetition_penalty=1.1"]) == 0
    first, second = capsys.readouterr().out.splitlines()
    text, pairs = first.split("\t")
    assert text.startswith("ein hund")
    assert all(p.count("-") == 1 for p in pairs.split())
    same = load_model_folder(trained).translate_hypotheses(
        [PAIRS[1][0]], no_repeat_ngram_size=3, repetition_penalty=1.1, alignments=True)[0][0]
    assert second == same[0] + "\t" + " ".join(f"{i}-{j}" for i, j in same[1].alignment)


# ---- the engines --------------------------------------------------------------------------


def test_engines_pass_the_controls_through_or_refuse_alignments_by_name(tmp_path, capsys):
    pytest.importorskip("onnxruntime", reason="the 'export' extra")
    pytest.importorskip("ctranslate2", reason="the 'ctranslate2' extra")
    from aiayn.export import export_model
    from aiayn.runtime import Unsupported

    folder = make_folder(tmp_path / "m")
    native = load_model_folder(folder)
    texts = ["the cat sits on the mat", "a red dog"]
    for fmt in ("onnx", "ctranslate2"):
        model = load_model_folder(export_model(folder, fmt, tmp_path / fmt))
        with pytest.raises(Unsupported, match=f"the {fmt} backend has no attention weights"):
            model.translate(texts, alignments=True)
        for hyps in model.translate_hypotheses(texts, beam=1, no_repeat_ngram_size=2,
                                               max_len_b=30):
            tokens = hyps[0][1].tokens
            grams = list(zip(tokens, tokens[1:]))
            assert len(grams) == len(set(grams))  # no bigram twice
        prefix = native.translate(texts, beam=1, max_len_b=6)
        steer = [p.split(" ")[0] for p in prefix]
        out = model.translate(texts, beam=1, max_len_b=6, prefixes=steer)
        assert all(o.startswith(s) for o, s in zip(out, steer))
        assert out == native.translate(texts, beam=1, max_len_b=6, prefixes=steer)
    fails(capsys, ["translate", str(tmp_path / "onnx"), "-i", str(write(tmp_path, "abc")),
                   "--alignments"], "the onnx backend has no attention weights")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "text.txt"
    path.write_text(text + "\n", encoding="utf-8")
    return path
