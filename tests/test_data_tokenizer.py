"""Tokenizers: special ids, normalisation, exact round trips, save/load, the character tokenizer."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from _data_helpers import (files_in, multi30k_bpe, needs_mirror, real_cache,  # noqa: F401
                           use_real_cache)
from aiayn.config import ModelConfig
from aiayn.data import (CharTokenizer, DataConfig, Tokenizer, train_tokenizer_for, load_translation,
                        train_tokenizer)
from aiayn.errors import DataError

CORPUS = [
    "A man in an orange hat starring at something.",
    "Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.",
    "Two young, White males are outside near many bushes.",
    "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche.",
    "A little girl climbing into a wooden playhouse.",
    "Ein kleines Mädchen klettert in ein Spielhaus aus Holz.",
] * 20

TRICKY = [
    "Ein\u00a0Mann  mit   Hut.",        # non-breaking and double spaces (as in Multi30k)
    "  leading and trailing\t",
    "Straße, Œuvre, ﬁne ligature, ①",   # NFKC folds ligatures and circled digits
    "never seen: 漢字 😀 ñ",              # characters absent from the training text
    "",
]


@pytest.fixture(scope="module", params=["bpe", "unigram"])
def subword(request):
    return train_tokenizer(CORPUS, request.param, vocab_size=300)


def test_special_ids_match_the_model_config(subword):
    m = ModelConfig()
    assert (subword.pad_id, subword.bos_id, subword.eos_id, subword.unk_id) == (
        m.pad_id, m.bos_id, m.eos_id, m.unk_id) == (0, 1, 2, 3)
    assert [subword.hf.id_to_token(i) for i in range(4)] == ["<pad>", "<s>", "</s>", "<unk>"]
    assert 4 < subword.vocab_size <= 300


def test_normalisation_is_nfkc_and_single_spaces(subword):
    assert subword.normalize(TRICKY[0]) == "Ein Mann mit Hut."
    assert subword.normalize(TRICKY[1]) == "leading and trailing"
    assert subword.normalize(TRICKY[2]) == "Straße, Œuvre, fine ligature, 1"


@pytest.mark.parametrize("text", CORPUS[:6] + TRICKY)
def test_decode_inverts_encode_up_to_normalisation(subword, text):
    ids = subword.encode(text)
    assert all(4 <= i < subword.vocab_size for i in ids)  # no BOS/EOS, never <unk> (byte-level)
    assert subword.decode(ids) == subword.normalize(text)


def test_decode_skips_special_tokens_and_takes_tensors(subword):
    ids = subword.encode("Ein Mann.")
    wrapped = [subword.bos_id] + ids + [subword.eos_id, subword.pad_id, subword.pad_id]
    assert subword.decode(wrapped) == "Ein Mann."
    assert subword.decode(torch.tensor(wrapped)) == "Ein Mann."
    assert subword.decode_batch([wrapped, ids]) == ["Ein Mann.", "Ein Mann."]


def test_encode_batch_equals_encode(subword):
    assert subword.encode_batch(CORPUS[:6] + TRICKY) == [subword.encode(t) for t in CORPUS[:6] + TRICKY]


def test_save_and_load_give_the_same_tokenizer(subword, tmp_path):
    subword.save(tmp_path / "tokenizer.json")
    assert files_in(tmp_path) == ["tokenizer.json"]  # written atomically, no temporary left
    for loaded in (Tokenizer.from_file(tmp_path / "tokenizer.json"), Tokenizer.from_str(subword.to_str())):
        assert loaded.kind == subword.kind and loaded.vocab_size == subword.vocab_size
        assert loaded.encode_batch(CORPUS[:6] + TRICKY) == subword.encode_batch(CORPUS[:6] + TRICKY)


def test_training_is_deterministic():
    a, b = train_tokenizer(CORPUS, "bpe", 300), train_tokenizer(CORPUS, "bpe", 300)
    assert a.to_str() == b.to_str()


def test_bpe_dropout_zero_is_the_plain_segmentation_and_more_varies_it():
    """BPE-dropout (Provilkov et al. 2020, data.bpe_dropout): p = 0 segments as the tokenizer
    does; p > 0 segments some word otherwise on some draw, into pieces that decode back to the
    same text, and leaves the tokenizer it was made from (validation, decoding) unchanged."""
    tok = train_tokenizer(CORPUS, "bpe", vocab_size=300)
    words = sorted({w for line in CORPUS for w in line.split()})
    plain = [tok.encode(w) for w in words]
    assert [tok.with_dropout(0.0).encode(w) for w in words] == plain
    noisy = tok.with_dropout(0.3)
    draws = [[noisy.encode(w) for w in words] for _ in range(5)]
    assert any(draw != plain for draw in draws)
    assert any(a != b for a, b in zip(draws, draws[1:]))  # a new segmentation at each encode
    for draw in draws:
        assert [tok.decode(ids) for ids in draw] == [tok.decode(ids) for ids in plain]
        assert sum(map(len, draw)) >= sum(map(len, plain))  # skipped merges: more pieces
    assert [tok.encode(w) for w in words] == plain
    with pytest.raises(DataError, match="BPE-dropout needs a BPE tokenizer"):
        train_tokenizer(CORPUS, "unigram", vocab_size=300).with_dropout(0.1)


def test_bad_tokenizer_files(tmp_path):
    with pytest.raises(DataError, match=r"missing\.json: no such file"):
        Tokenizer.from_file(tmp_path / "missing.json")
    (tmp_path / "garbage.json").write_text("{\n  not json")
    with pytest.raises(DataError, match=r"garbage\.json:2: not a tokenizer"):
        Tokenizer.from_file(tmp_path / "garbage.json")
    (tmp_path / "other.json").write_text('{"some": "object"}')
    with pytest.raises(DataError, match=r"other\.json: not a tokenizer"):
        Tokenizer.from_file(tmp_path / "other.json")


def test_foreign_special_ids_are_refused():
    from tokenizers import Tokenizer as HF, models
    hf = HF(models.WordLevel({"<unk>": 0, "<pad>": 1, "<s>": 2, "</s>": 3}, unk_token="<unk>"))
    with pytest.raises(DataError, match=r"theirs\.json: special token <pad> has id 1, expected 0"):
        Tokenizer.from_str(hf.to_str(), "theirs.json")


def test_unknown_kind_and_empty_text():
    with pytest.raises(DataError, match="unknown tokenizer kind 'wordpiece'"):
        train_tokenizer(CORPUS, "wordpiece", 100)
    with pytest.raises(DataError, match="no training text"):
        train_tokenizer(["", "  "], "bpe", 100)


# ---- characters -------------------------------------------------------------------------------

SHAKESPEARE = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n"


def test_char_tokenizer_round_trips_text_exactly(tmp_path):
    tok = train_tokenizer([SHAKESPEARE], "char", vocab_size=1000)
    assert isinstance(tok, CharTokenizer) and tok.kind == "char"
    assert tok.vocab_size == 4 + len(set(SHAKESPEARE))
    ids = tok.encode(SHAKESPEARE)
    assert len(ids) == len(SHAKESPEARE) and min(ids) >= 4
    assert tok.decode(ids) == SHAKESPEARE  # newlines and double spaces kept
    assert tok.decode([tok.bos_id] + ids[:5] + [tok.eos_id, tok.pad_id]) == SHAKESPEARE[:5]
    assert tok.encode("FQ") == [tok.encode("F")[0], tok.unk_id]  # no Q in the text
    tok.save(tmp_path / "tokenizer.json")
    loaded = Tokenizer.from_file(tmp_path / "tokenizer.json")
    assert isinstance(loaded, CharTokenizer) and loaded.encode(SHAKESPEARE) == ids


def test_char_vocabulary_cap_keeps_the_most_frequent():
    tok = train_tokenizer(["aaaabbbc"], "char", vocab_size=6)
    assert tok.chars == ["a", "b"] and tok.encode("abc") == [4, 5, 3]
    # counted as the texts come, ties kept in the order first seen: pieces give the whole's
    assert train_tokenizer(iter(["ccab", "ab"]), "char", 6).chars == ["a", "c"]
    assert train_tokenizer(["ccabab"], "char", 6).chars == ["a", "c"]
    from aiayn.data.tokenizer import _char_counts

    texts = ["ba", "", "c😀b", "\ud800a\n", "zzzz", "é"]
    expected = Counter()
    for text in texts:
        expected.update(text)
    for group in (1, 3, 1 << 16):  # counted with numpy, a few texts joined at a time
        counts = _char_counts(iter(texts), group)
        assert list(counts.items()) == list(expected.items())  # the order first seen, too


def test_char_batch_array_and_running_encodings_equal_encode():
    tok = train_tokenizer([SHAKESPEARE + "é😀"], "char", vocab_size=1000)
    texts = [SHAKESPEARE, "", "FQ é😀 漢字 \U000e0001", "lone \ud800 surrogate", "a" * 5]
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]
    assert tok.encode_batch([]) == [] and tok.encode_batch([""]) == [[]]
    assert tok.encode_array(texts[2]).tolist() == tok.encode(texts[2])  # unknown: <unk>, any code
    pieces = ["First", " Citizen:", "\nBefore"]
    assert tok.encode_running(pieces, False, False).tolist() == tok.encode("".join(pieces))


@pytest.mark.parametrize("lowercase", [False, True])
def test_running_pieces_encode_and_train_as_the_whole_text(subword, lowercase):
    from aiayn.data.build import running_pieces

    whole = "  \n" + "\r\n".join(TRICKY[:4] + CORPUS[:12]).replace("Mann", "Mann \t\n ") + " \n"
    tok = train_tokenizer([whole], subword.kind, 300, lowercase)
    for size in (5, 40, 1000):
        blocks = [whole[i : i + 17] for i in range(0, len(whole), 17)]
        pieces = list(running_pieces(blocks, size))
        assert "".join(pieces) == whole and (size > len(whole) or len(pieces) > 3)
        got = [tok.encode_running(pieces[i : i + 3], i == 0, i + 3 >= len(pieces))
               for i in range(0, len(pieces), 3)]
        assert [int(x) for ids in got for x in ids] == tok.encode(whole)
        if subword.kind == "bpe":  # Unigram's training is not repeatable even on the same text
            streamed = train_tokenizer(running_pieces(blocks, size), "bpe", 300, lowercase,
                                       running=True)
            assert streamed.to_str() == tok.to_str()


# ---- Multi30k -----------------------------------------------------------------------------------


@needs_mirror
def test_multi30k_validation_round_trips_exactly(use_real_cache, multi30k_bpe):
    cfg = DataConfig(dataset="multi30k", vocab_size=8000)
    tok = multi30k_bpe  # trained on the training split only
    assert tok.kind == "bpe" and tok.vocab_size == 8000
    src, tgt = load_translation(cfg, "val")
    texts = src + tgt
    decoded = tok.decode_batch(tok.encode_batch(texts))
    assert decoded == [tok.normalize(t) for t in texts]
    assert sum("\u00a0" in t or "  " in t for t in load_translation(cfg, "train")[1]) > 0  # the quirks exist
    assert sum(i == tok.unk_id for ids in tok.encode_batch(texts) for i in ids) == 0


@pytest.mark.slow
@needs_mirror
def test_multi30k_validation_round_trips_with_unigram(use_real_cache):
    cfg = DataConfig(dataset="multi30k", tokenizer="unigram", vocab_size=8000)
    tok = train_tokenizer_for(cfg)
    src, tgt = load_translation(cfg, "val")
    assert tok.decode_batch(tok.encode_batch(src + tgt)) == [tok.normalize(t) for t in src + tgt]


def test_lowercase_is_part_of_the_saved_tokenizer(tmp_path):
    from aiayn.errors import ConfigError

    tok = train_tokenizer(CORPUS, "bpe", 300, lowercase=True)
    assert tok.encode("A Dog RUNS") == tok.encode("a dog runs")
    cased = train_tokenizer(CORPUS, "bpe", 300)
    assert cased.encode("A Dog") != cased.encode("a dog")
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    assert Tokenizer.from_file(path).encode("A Dog RUNS") == tok.encode("a dog runs")
    with pytest.raises(ConfigError, match="data.lowercase needs a subword tokenizer"):
        DataConfig(kind="lm", tokenizer="char", lowercase=True)
    with pytest.raises(DataError, match="lower-casing needs a subword tokenizer"):
        train_tokenizer(["abc"], "char", 10, lowercase=True)
