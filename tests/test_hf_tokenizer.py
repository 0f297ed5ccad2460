"""aiayn's SentencePiece tokenizer (aiayn/data/spm.py) against transformers' MarianTokenizer on
the tiny Marian folder of tests/hf_helpers.py: the same ids, the same text, round trips, and
its tokenizer.json saved and read back."""

import json

import pytest
from hf_helpers import sentences

from aiayn.data.tokenizer import Tokenizer
from aiayn.errors import DataError
from aiayn.interop.marian import read_tokenizer

ODD = [
    ">>de<< A dog runs.",  # a language code: a token of its own (here <unk>: not in vocab.json)
    "Ein Mann fährt Fahrrad.",  # the target language on the source side
    "naïve café — 東京 ★",  # characters the SentencePiece models never saw
    "  spaces   inside  ",
    "",
]


@pytest.fixture(scope="module")
def both(marian_folder):
    from transformers import MarianTokenizer

    return read_tokenizer(marian_folder), MarianTokenizer.from_pretrained(marian_folder)


def test_ids_equal_marian_tokenizer(both):
    ours, theirs = both
    texts = sentences("en", 60, skip=2000) + ODD
    assert [ours.encode(t) for t in texts] == theirs(texts).input_ids
    targets = sentences("de", 60, skip=2000)
    expected = [ids[:-1] for ids in theirs(text_target=targets).input_ids]  # without </s>
    assert [ours.encode_target(t) for t in targets] == expected
    assert (ours.pad_id, ours.eos_id, ours.unk_id) == (
        theirs.pad_token_id,
        theirs.eos_token_id,
        theirs.unk_token_id,
    )
    assert ours.bos_id == ours.pad_id  # Marian's decoder starts from <pad>


def test_text_equals_marian_tokenizer(both):
    ours, theirs = both
    texts = sentences("de", 60, skip=3000) + ODD
    ids = [ours.encode_target(t) + [ours.eos_id, ours.pad_id] for t in texts]
    assert [ours.decode(i) for i in ids] == theirs.batch_decode(ids, skip_special_tokens=True)
    assert ours.decode([ours.pad_id, ours.eos_id, ours.unk_id]) == ""
    for text in sentences("de", 60, skip=3000):  # round trips (normalised text)
        assert ours.decode(ours.encode_target(text)) == ours.normalize(text)


def test_saved_and_read_back(both, tmp_path):
    ours, _ = both
    ours.save(tmp_path / "tokenizer.json")
    back = Tokenizer.from_file(tmp_path / "tokenizer.json")
    texts = sentences("en", 20, skip=4000)
    assert [back.encode(t) for t in texts] == [ours.encode(t) for t in texts]
    assert back.to_str() == ours.to_str() and back.special_name(ours.eos_id) == "</s>"
    assert back.special_name(2) is None  # an ordinary piece, not aiayn's </s>


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda o: o.pop("vocab"), "malformed SentencePiece tokenizer"),
        (lambda o: o.update(source="%%%"), "malformed SentencePiece tokenizer"),
        (lambda o: o.update(source="AAAA"), "not a SentencePiece model"),
        (lambda o: o["vocab"].pop("<pad>"), "pad token '<pad>' is not in the vocabulary"),
        (lambda o: o["vocab"].update({"▁extra": 0}), "vocabulary ids are not 0"),
        (lambda o: o.update(specials={"pad": "<pad>"}), "malformed SentencePiece special"),
    ],
)
def test_a_broken_tokenizer_json_is_one_clear_error(both, edit, message):
    ours, _ = both
    obj = json.loads(ours.to_str())
    edit(obj)
    with pytest.raises(DataError, match=message):
        Tokenizer.from_str(json.dumps(obj), "tok.json")
