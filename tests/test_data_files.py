"""Users' own files and every kind of bad input: a clear error naming file and line, exit 2 from
the CLI with one line and no traceback, nothing written."""

from __future__ import annotations

import gzip
import json
import logging
import re
import subprocess
import sys

import pytest

from _data_helpers import files_in, needs_mirror, real_cache, use_real_cache  # noqa: F401
from aiayn.cli import main
from aiayn.config import apply_overrides, from_dict, to_dict
from aiayn.data import (DataConfig, load_classification, load_lm_text, load_translation,
                        prepare_classification, prepare_translation, read_labelled, read_lines,
                        read_parallel, train_tokenizer)
from aiayn.errors import ConfigError, DataError


def write(path, data: bytes | str):
    path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return path


def own(**kw) -> DataConfig:
    return DataConfig(dataset="", **kw)


# ---- readers ------------------------------------------------------------------------------------


def test_lines_keep_content_and_split_only_on_newline(tmp_path):
    text = "a\u0085b\r\n  two  spaces \n\ttab\n"  # U+0085 is not a line break here
    assert read_lines(write(tmp_path / "x.txt", text)) == ["a\u0085b", "  two  spaces ", "\ttab"]
    assert read_lines(write(tmp_path / "y.txt", "\ufeffno newline at end")) == ["no newline at end"]
    with gzip.open(tmp_path / "z.txt.gz", "wt", encoding="utf-8") as f:
        f.write("eins\nzwei\n")
    assert read_lines(tmp_path / "z.txt.gz") == ["eins", "zwei"]


def test_non_utf8_names_file_line_and_column(tmp_path):
    path = write(tmp_path / "bad.de", b"gut\nauch gut\nschlecht \xff hier\n")
    with pytest.raises(DataError, match=r"bad\.de:3: not valid UTF-8 \(byte 0xff at column 10\)"):
        read_lines(path)


def test_empty_and_missing_files(tmp_path):
    with pytest.raises(DataError, match=r"empty\.txt: file is empty"):
        read_lines(write(tmp_path / "empty.txt", ""))
    with pytest.raises(DataError, match=r"blank\.txt: file is empty"):
        read_lines(write(tmp_path / "blank.txt", "\n\n"))
    with pytest.raises(DataError, match=r"nope\.txt: no such file"):
        read_lines(tmp_path / "nope.txt")
    with pytest.raises(DataError, match="is a folder"):
        read_lines(tmp_path)
    with pytest.raises(DataError, match=r"broken\.gz: cannot read"):
        read_lines(write(tmp_path / "broken.gz", gzip.compress(b"abc\n" * 100)[:-10]))


def test_parallel_files_of_different_lengths(tmp_path):
    src = write(tmp_path / "a.en", "one\ntwo\nthree\n")
    tgt = write(tmp_path / "a.de", "eins\nzwei\n")
    with pytest.raises(DataError, match=r"a\.en:3: parallel files differ in length .*has 3 lines.*has 2"):
        read_parallel(src, tgt)
    with pytest.raises(DataError, match=r"a\.en:3: "):
        read_parallel(tgt, src)
    assert read_parallel(src, write(tmp_path / "b.de", "eins\nzwei\ndrei")) == (
        ["one", "two", "three"], ["eins", "zwei", "drei"])


def test_tsv_and_jsonl_labels(tmp_path):
    assert read_labelled(write(tmp_path / "ok.tsv", "1\tgood\tstill text\n0\t\n")) == (
        ["good\tstill text", ""], [1, 0])
    rows = [{"text": "good", "label": 1}, {"text": "bad", "label": 0}]
    path = write(tmp_path / "ok.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    assert read_labelled(path) == (["good", "bad"], [1, 0])


@pytest.mark.parametrize("name,content,error", [
    ("x.tsv", "1\tfine\nno tab here\n", r"x\.tsv:2: expected label<TAB>text"),
    ("x.tsv", "1\tfine\npos\ttext\n", r"x\.tsv:2: label 'pos' is not a class id"),
    ("x.tsv", "-1\ttext\n", r"x\.tsv:1: label '-1' is not a class id"),
    ("x.tsv", "\ttext\n", r"x\.tsv:1: label '' is not a class id"),
    ("x.jsonl", '{"text": "a", "label": 0}\n{"text": "b"\n', r"x\.jsonl:2: invalid JSON"),
    ("x.jsonl", '{"text": "a"}\n', r"x\.jsonl:1: expected an object with keys"),
    ("x.jsonl", '{"text": "a", "label": 1.5}\n', r"x\.jsonl:1: label 1\.5 is not a class id"),
    ("x.jsonl", '{"text": "a", "label": 0}\n\n{"text": "b", "label": 1}\n', r"x\.jsonl:2: blank line"),
    ("x.csv", "1,text\n", r"x\.csv: unknown format"),
])
def test_bad_labelled_rows(tmp_path, name, content, error):
    with pytest.raises(DataError, match=error):
        read_labelled(write(tmp_path / name, content))


# ---- config -------------------------------------------------------------------------------------


def test_config_overrides_and_round_trip():
    cfg = apply_overrides(DataConfig(), {"vocab_size": "10000", "tokenizer": "unigram"})
    assert cfg.vocab_size == 10000 and cfg.tokenizer == "unigram"
    assert from_dict(DataConfig, to_dict(cfg)) == cfg
    with pytest.raises(ConfigError, match="did you mean 'max_tokens'"):
        apply_overrides(DataConfig(), {"max_token": "1"})
    with pytest.raises(ConfigError, match="'wordpiece' is not one of"):
        apply_overrides(DataConfig(), {"tokenizer": "wordpiece"})
    with pytest.raises(ConfigError, match="data.max_len must be positive"):
        DataConfig(max_len=0)
    with pytest.raises(ConfigError, match="set data.dataset='' to use your own files"):
        DataConfig(train_src="a.en")


# ---- the user's own data --------------------------------------------------------------------------


@pytest.fixture
def parallel(tmp_path):
    words = ["a", "b c", "d e f", "g h i j"]
    write(tmp_path / "train.src", "".join(f"{w}\n" for w in words * 5) + "x " * 40 + "\n")
    write(tmp_path / "train.tgt", "".join(f"{w.upper()}\n" for w in words * 5) + "Y\n")
    write(tmp_path / "valid.src", "a\nb c\n")
    write(tmp_path / "valid.tgt", "A\nB C\n")
    return own(train_src=str(tmp_path / "train.src"), train_tgt=str(tmp_path / "train.tgt"),
               valid_src=str(tmp_path / "valid.src"), valid_tgt=str(tmp_path / "valid.tgt"),
               tokenizer="char", max_len=30)


def test_own_parallel_files_and_long_pairs_are_dropped_and_counted(parallel, caplog):
    src, tgt = load_translation(parallel, "train")
    assert len(src) == len(tgt) == 21 and tgt[1] == "B C"
    assert load_translation(parallel, "valid") == (["a", "b c"], ["A", "B C"])
    tok = train_tokenizer(src + tgt, "char", 100)
    with caplog.at_level(logging.WARNING):
        train, valid = prepare_translation(parallel, tok)
    assert len(train) == 20 and len(valid) == 2  # the 80-character line is dropped...
    assert "dropped 1 of 21 training pairs: 1 longer than max_len=30" in caplog.text  # ...and logged
    assert train[1] == (tok.encode("b c"), tok.encode("B C"))
    with pytest.raises(DataError, match="splits 'train' and 'valid', not 'test'"):
        load_translation(parallel, "test")


def test_own_files_not_set(tmp_path):
    with pytest.raises(DataError, match="data.train_src is not set"):
        load_translation(own(), "train")


def test_own_classification_filter_or_truncate(tmp_path, caplog):
    write(tmp_path / "train.tsv", "1\tshort\n0\t" + "long " * 20 + "\n")
    write(tmp_path / "valid.jsonl", json.dumps({"text": "okay", "label": 1}) + "\n")
    cfg = own(kind="classification", train_file=str(tmp_path / "train.tsv"),
              valid_file=str(tmp_path / "valid.jsonl"), tokenizer="char", max_len=10)
    tok = train_tokenizer(load_classification(cfg, "train")[0], "char", 100)
    with caplog.at_level(logging.WARNING):
        train, valid = prepare_classification(cfg, tok)
    assert train == [(tok.encode("short"), 1)] and valid == [(tok.encode("okay"), 1)]
    assert "train: dropped 1 of 2 texts: 1 longer than max_len=10 tokens" in caplog.text
    cut = apply_overrides(cfg, {"long_examples": "truncate"})
    train, _ = prepare_classification(cut, tok)
    assert [len(ids) for ids, _ in train] == [5, 10]


def test_own_lm_text(tmp_path):
    write(tmp_path / "lm.txt", "To be,\nor not to be.\n")
    cfg = own(kind="lm", train_file=str(tmp_path / "lm.txt"), tokenizer="char")
    assert load_lm_text(cfg, "train") == "To be,\nor not to be.\n"


def test_task_and_split_mismatches():
    with pytest.raises(DataError, match="dataset 'multi30k' is for translation, not classification"):
        load_classification(DataConfig(kind="classification"), "train")
    with pytest.raises(DataError, match="has no split 'dev'; splits: train, val"):
        load_translation(DataConfig(), "dev")


# ---- the command line -------------------------------------------------------------------------


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("case", ["lengths", "utf8", "empty", "missing", "label"])
def test_cli_bad_input_is_one_line_exit_2_nothing_written(tmp_path, capsys, case):
    a = write(tmp_path / "a.txt", "one\ntwo\n")
    b = write(tmp_path / "b.txt", {"lengths": "eins\n", "utf8": b"eins\nzw\xe4i\n", "empty": "",
                                   "missing": "x", "label": "x"}[case])
    if case == "missing":
        b.unlink()
    if case == "label":
        tsv = write(tmp_path / "c.tsv", "1\tok\nyes\tno\n")
        args = ["--set", "data.kind=classification", "--set", f"data.train_file={tsv}"]
    else:
        args = ["--set", f"data.train_src={a}", "--set", f"data.train_tgt={b}"]
    before = files_in(tmp_path)
    rc, out, err = run_cli(capsys, "data", "tokenizer", "--set", "data.dataset=", *args,
                           "-o", str(tmp_path / "tokenizer.json"))
    expected = {"lengths": r"a\.txt:2: parallel files differ", "utf8": r"b\.txt:2: not valid UTF-8",
                "empty": r"b\.txt: file is empty", "missing": r"b\.txt: no such file",
                "label": r"c\.tsv:2: label 'yes' is not a class id"}[case]
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aiayn: error: ")
    assert re.search(expected, lines[0])
    assert files_in(tmp_path) == before  # no tokenizer.json, nothing else


def test_cli_tokenizer_and_prepare(tmp_path, capsys, parallel):
    rc, out, _ = run_cli(capsys, "data", "tokenizer", "--set", "data.dataset=", "--set",
                         "data.tokenizer=bpe", "--set", "data.vocab_size=300", "--set",
                         f"data.train_src={parallel.train_src}",
                         "--set", f"data.train_tgt={parallel.train_tgt}", "-o", str(tmp_path / "t.json"))
    assert rc == 0 and "bpe tokenizer" in out and (tmp_path / "t.json").is_file()
    rc, _, err = run_cli(capsys, "data", "prepare", "multi3k")
    assert rc == 2 and "unknown dataset 'multi3k' (did you mean 'multi30k'?)" in err
    rc, _, err = run_cli(capsys, "data", "stats", "--set", "data.max_tokenz=5")
    assert rc == 2 and "unknown config key 'data.max_tokenz' (did you mean 'data.max_tokens'?)" in err


def test_cli_config_file(tmp_path, capsys, parallel):
    toml = write(tmp_path / "run.toml", f'[data]\ndataset = ""\ntrain_src = "{parallel.train_src}"\n'
                                        f'train_tgt = "{parallel.train_tgt}"\ntokenizer = "char"\n')
    rc, out, _ = run_cli(capsys, "data", "tokenizer", "--config", str(toml), "-o", str(tmp_path / "c.json"))
    assert rc == 0 and "char tokenizer" in out


def test_cli_process_exit_code_without_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "aiayn", "data", "prepare", "nosuch"],
                          capture_output=True, text=True, env={"AIAYN_CACHE": str(tmp_path), "PATH": ""})
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("aiayn: error: unknown dataset 'nosuch'; "
                                   "known: multi30k, imdb, tiny_shakespeare, fashion_mnist, wmt14, wmt14_en_fr")
    assert files_in(tmp_path) == []


# ---- the real datasets --------------------------------------------------------------------------


@needs_mirror
def test_real_splits(use_real_cache):
    sizes = {s: len(load_translation(DataConfig(), s)[0])
             for s in ("train", "val", "test_2016_flickr", "test_2017_flickr")}
    assert sizes == {"train": 29000, "val": 1014, "test_2016_flickr": 1000, "test_2017_flickr": 1000}
    de_en = DataConfig(src_lang="de", tgt_lang="en")
    src, tgt = load_translation(de_en, "val")
    assert src[0].startswith("Eine Gruppe von Männern") and tgt[0].startswith("A group of men")
    with pytest.raises(DataError, match="has no language 'fr'"):
        load_translation(DataConfig(tgt_lang="fr"), "val")
    imdb = DataConfig(kind="classification", dataset="imdb")
    texts, labels = load_classification(imdb, "train")
    assert len(texts) == 22500 and sum(labels) == 11250
    v_texts, v_labels = load_classification(imdb, "val")
    assert len(v_texts) == 2500 and sum(v_labels) == 1250
    full = load_classification(imdb, "train_full")
    assert len(full[0]) == 25000 and sorted(texts + v_texts) == sorted(full[0])  # a partition
    head, tail = load_classification(imdb, "train_head"), load_classification(imdb, "val_tail")
    assert len(tail[0]) == 2500 and sum(tail[1]) == 1250 and sorted(head[0] + tail[0]) == sorted(full[0])
    assert tail[0][:1250] == full[0][11250:12500] and tail[0][1250:] == full[0][23750:]  # the last ids
    assert len(load_classification(imdb, "test")[0]) == 25000
    lm = DataConfig(kind="lm", dataset="tiny_shakespeare", tokenizer="char")
    train, val = load_lm_text(lm, "train"), load_lm_text(lm, "val")
    assert len(train) + len(val) == 1115394 and len(val) == 111540 and train.startswith("First Citizen")


def test_iter_text_streams_what_read_text_reads(tmp_path):
    from aiayn.data.readers import iter_text, read_text

    path = tmp_path / "t.txt"
    data = "\ufeffé€𝄞 a\r\nb\n".encode() * 3  # multi-byte characters cut by every small block
    path.write_bytes(data)
    whole = read_text(path)
    assert not whole.startswith("\ufeff") and whole.count("\ufeff") == 2  # only the leading one
    for block in (1, 2, 3, 7):
        assert "".join(iter_text(path, block)) == whole
    path.write_bytes(data + "x€".encode() + b"\xff")
    for block in (1, 2, 5, 1000):  # the line and column in the whole file, whatever the blocks
        with pytest.raises(DataError, match=r"t\.txt:7: not valid UTF-8 \(byte 0xff at column 5\)"):
            "".join(iter_text(path, block))
    path.write_bytes(b" \n\t" * 100)
    with pytest.raises(DataError, match=r"t\.txt: file is empty"):
        "".join(iter_text(path, 16))
