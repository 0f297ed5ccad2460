"""The token store (aiayn/data/store.py, build.py): built once and reused, the same batches as the
in-memory path it replaced, stale and damaged stores rebuilt, atomic and race-safe building,
cleaning with counts, and the bounded tokenizer sample."""

from __future__ import annotations

import copy
import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from _data_helpers import MIRROR, real_cache, use_real_cache  # noqa: F401
from aiayn.data import (DataConfig, TokenBatchSampler, TokenStore, collate_translation,
                        read_parallel, split_stores, train_tokenizer, train_tokenizer_for,
                        translation_store)
from aiayn.data.build import reservoir_sample
from aiayn.data.store import StoreWriter, open_store, token_dtype
from aiayn.errors import DataError
from trainutil import ROOT, base_values, run_aiayn, subprocess_env, write_reverse_data, write_toml


def own_files(tmp_path: Path, n_train: int = 300, **over) -> DataConfig:
    keys = write_reverse_data(tmp_path / "data", n_train=n_train)
    values = {k.removeprefix("data."): v for k, v in keys.items()}
    return DataConfig(**{**values, **over})


def in_memory_pairs(cfg: DataConfig, tokenizer, split: str):
    """The in-memory path the store replaced (loaders.prepare_translation_texts before the store),
    kept here as the reference: read whole, encode whole, filter as lists."""
    n = cfg.max_len
    src, tgt = read_parallel(*[getattr(cfg, f"{split}_{s}") for s in ("src", "tgt")]) \
        if cfg.uses_own_files else _registered_split(cfg, split)
    if split == "valid" or split == cfg.valid_split:
        pairs = list(zip(tokenizer.encode_batch(src), tokenizer.encode_batch(tgt)))
        return [(x[:n], y[: n - 1]) for x, y in pairs]
    texts = [(x, y) for x, y in zip(src, tgt)
             if tokenizer.min_tokens(x) <= n and tokenizer.min_tokens(y) + 1 <= n]
    train = list(zip(tokenizer.encode_batch([x for x, _ in texts]),
                     tokenizer.encode_batch([y for _, y in texts])))
    return [(x, y) for x, y in train if x and y and len(x) <= n and len(y) + 1 <= n]


def _registered_split(cfg: DataConfig, split: str):
    from aiayn.data import load_translation

    return load_translation(cfg, split)


def assert_same_batches(cfg: DataConfig, tokenizer, store: TokenStore, pairs, world_size: int = 1):
    """Indices and tensors of two epochs, every rank, agree between the store and the lists."""
    lengths = ([len(x) for x, _ in pairs], [len(y) + 1 for _, y in pairs])
    for rank in range(world_size):
        kw = dict(max_tokens=cfg.max_tokens, seed=cfg.seed, rank=rank, world_size=world_size)
        old = TokenBatchSampler(*lengths, **kw)
        new = TokenBatchSampler(store.lengths("src"), store.lengths("tgt") + 1, **kw)
        for epoch in (1, 2):
            assert old.batches(epoch) == new.batches(epoch)
            for indices in new.batches(epoch)[:50]:
                a = collate_translation([pairs[i] for i in indices])
                b = collate_translation(list(zip(store.rows("src", indices), store.rows("tgt", indices))))
                for name in ("src", "tgt_in", "tgt_out"):
                    assert torch.equal(getattr(a, name), getattr(b, name))
                assert (a.n_src_tokens, a.n_tgt_tokens) == (b.n_src_tokens, b.n_tgt_tokens)


# ---- the same batches as the in-memory path -----------------------------------------------------

def test_own_files_store_gives_the_in_memory_batches(tmp_path):
    cfg = own_files(tmp_path, n_train=400, max_tokens=200)
    tok = train_tokenizer_for(cfg)
    store = translation_store(cfg, tok, cfg.train_split)
    pairs = in_memory_pairs(cfg, tok, "train")
    assert len(store) == len(pairs) == 400 and store.dtype("src") == np.uint16
    assert_same_batches(cfg, tok, store, pairs, world_size=1)
    assert_same_batches(cfg, tok, store, pairs, world_size=2)


def test_store_reads_rows_without_mapping_the_ids(tmp_path):
    """A batch's ids are read by offset, not through a mapping: a mapped 2 MB page-cache folio
    counted in each rank's RSS (docs/data.md). Counting reads in chunks and equals bincount."""
    cfg = own_files(tmp_path, n_train=400, max_tokens=200)
    tok = train_tokenizer_for(cfg)
    store = translation_store(cfg, tok, cfg.train_split)
    pairs = in_memory_pairs(cfg, tok, "train")
    order = list(range(len(store)))[::-1]
    assert [r.tolist() for r in store.rows("tgt", order)] == [pairs[i][1] for i in order]
    maps = Path("/proc/self/maps")
    if maps.exists():
        assert str(store.path / "tgt.bin") not in maps.read_text()
    every = np.concatenate([np.asarray(y) for _, y in pairs])
    assert np.array_equal(store.token_counts("tgt", tok.vocab_size),
                          np.bincount(every, minlength=tok.vocab_size))
    (store.path / "tgt.bin").write_bytes(b"")  # cut short under an open store: one clear error
    with pytest.raises(DataError, match="shorter than its manifest"):
        store.rows("tgt", [len(store) - 1])


@pytest.mark.skipif(not MIRROR, reason="real data: AIAYN_DATA_MIRROR is not set (the own-files "
                                       "test above covers the synthetic case)")
def test_multi30k_store_gives_the_in_memory_batches(use_real_cache):
    cfg = DataConfig(dataset="multi30k", max_tokens=4096, max_len=128)
    tok = train_tokenizer_for(cfg)
    # the tokenizer of the whole split, as before the sample existed (29,000 pairs < the bound)
    src, tgt = _registered_split(cfg, "train")
    assert tok.to_str() == train_tokenizer(src + tgt, "bpe", 8000).to_str()
    stores = split_stores(cfg, tok)
    for split, name in (("train", "train"), ("valid", "val")):
        pairs = in_memory_pairs(cfg, tok, name)
        assert len(stores[split]) == len(pairs)
        assert_same_batches(cfg, tok, stores[split], pairs, world_size=1 if split == "valid" else 2)


# ---- built once, reused; stale or damaged: rebuilt ----------------------------------------------

def test_store_is_built_once_then_reused(tmp_path, caplog):
    cfg = own_files(tmp_path)
    tok = train_tokenizer_for(cfg)
    with caplog.at_level(logging.INFO):
        first = translation_store(cfg, tok, "train")
        caplog.clear()
        again = translation_store(cfg, tok, "train")
    assert again.path == first.path and "reused" in caplog.text and "built in" not in caplog.text
    manifest = json.loads((first.path / "manifest.json").read_text())
    assert manifest["tokens"]["src"] == int(first.lengths("src").sum())
    assert manifest["sources"][0]["path"] == str(Path(cfg.train_src).resolve())
    assert manifest["key"]["cleaning"]["limits"] == [cfg.max_len, cfg.max_len - 1]
    # the same tokenizer restored from JSON (what --resume and other ranks do) opens the same store
    restored = type(tok).from_str(tok.to_str())
    assert translation_store(cfg, restored, "train").path == first.path


def test_changed_source_file_rebuilds_the_store(tmp_path, caplog):
    cfg = own_files(tmp_path)
    tok = train_tokenizer_for(cfg)
    before = translation_store(cfg, tok, "train")
    n = len(before)
    with open(cfg.train_src, "a", encoding="utf-8") as f, open(cfg.train_tgt, "a", encoding="utf-8") as g:
        f.write("a b c\n")
        g.write("c b a\n")
    with caplog.at_level(logging.WARNING):
        after = translation_store(cfg, tok, "train")
    assert "changed since it was built; building it again" in caplog.text
    assert len(after) == n + 1 and after.path == before.path


def test_damaged_store_is_rebuilt_not_read(tmp_path, caplog):
    cfg = own_files(tmp_path)
    tok = train_tokenizer_for(cfg)
    store = translation_store(cfg, tok, "train")
    expected = store.rows("tgt", range(len(store)))
    expected = [x.copy() for x in expected]
    with open(store.path / "tgt.bin", "r+b") as f:
        f.truncate(10)
    with pytest.raises(DataError, match="damaged token store"):
        TokenStore(store.path)
    with caplog.at_level(logging.WARNING):
        again = translation_store(cfg, tok, "train")
    assert "tgt.bin has 10 bytes; building it again" in caplog.text
    assert all(np.array_equal(a, b) for a, b in zip(expected, again.rows("tgt", range(len(again)))))


def test_other_settings_are_another_store(tmp_path):
    cfg = own_files(tmp_path)
    tok = train_tokenizer_for(cfg)
    a = translation_store(cfg, tok, "train").path
    b = translation_store(DataConfig(**{**cfg.__dict__, "max_len": 20}), tok, "train").path
    other_tok = train_tokenizer(["xyz abc"], "char", 40)
    c = translation_store(cfg, other_tok, "train").path
    assert len({a, b, c}) == 3


def test_token_dtype_fits_the_vocabulary(tmp_path):
    assert token_dtype(8000) == np.uint16 and token_dtype(65536) == np.uint16
    assert token_dtype(65537) == np.uint32
    (tmp_path / "s").mkdir()
    writer = StoreWriter(tmp_path / "s", ["text"], 70000)
    writer.add({"text": [[69999, 5], [65536]]}, [0, 1])
    assert writer.finish() == 2
    assert np.fromfile(tmp_path / "s" / "text.bin", np.uint32).tolist() == [69999, 5, 65536]


# ---- atomic and race-safe building ---------------------------------------------------------------

def test_failed_build_leaves_no_store(tmp_path, monkeypatch):
    monkeypatch.setenv("AIAYN_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "a.txt"
    src.write_text("x\n")

    def build(folder: Path) -> dict:
        (folder / "src.bin").write_bytes(b"\0\0")
        raise DataError("a.txt:7: not valid UTF-8")

    with pytest.raises(DataError, match="a.txt:7"):
        open_store("t", {"k": 1}, [src], build)
    left = [p.name for p in (tmp_path / "cache" / "stores").iterdir()]
    assert left == [next(n for n in left if n.endswith(".lock"))]  # the lock file only


def test_bad_line_is_reported_by_file_and_line(tmp_path):
    cfg = own_files(tmp_path, n_train=50)
    tok = train_tokenizer_for(cfg)
    lines = Path(cfg.train_src).read_bytes().split(b"\n")
    lines[30] = b"caf\xe9"
    Path(cfg.train_src).write_bytes(b"\n".join(lines))
    with pytest.raises(DataError, match=r"train\.src:31: not valid UTF-8 \(byte 0xe9 at column 4\)"):
        translation_store(cfg, tok, "train")


_BUILD = """
import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
from aiayn.data import DataConfig, Tokenizer, translation_store
cfg = DataConfig(**__import__("json").loads(sys.argv[1]))
tok = Tokenizer.from_file(sys.argv[2])
store = translation_store(cfg, tok, "train")
print(len(store), store.path)
"""


def _builder(cfg: DataConfig, tok_path: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _BUILD, json.dumps(cfg.__dict__), str(tok_path)],
                            cwd=ROOT, env=subprocess_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_two_processes_racing_build_once(tmp_path):
    cfg = own_files(tmp_path, n_train=20000)
    tok = train_tokenizer_for(cfg)
    tok.save(tmp_path / "tok.json")
    procs = [_builder(cfg, tmp_path / "tok.json") for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e[-2000:] for _, e in outs]
    assert outs[0][0] == outs[1][0] and outs[0][0].startswith("20000 ")
    logs = "".join(e for _, e in outs)
    assert logs.count("built in") == 1 and logs.count("built before, reused") == 1, logs


def test_sigkill_mid_build_leaves_no_store_that_looks_complete(tmp_path, monkeypatch):
    # a cache of its own: under pytest-xdist the session's cache is shared by every worker, and
    # another module's stores appearing meanwhile are not this build's
    monkeypatch.setenv("AIAYN_CACHE", str(tmp_path / "cache"))
    cfg = own_files(tmp_path, n_train=150000)
    tok = train_tokenizer_for(cfg)
    tok.save(tmp_path / "tok.json")
    stores = Path(os.environ["AIAYN_CACHE"]) / "stores"
    before = set(stores.iterdir()) if stores.is_dir() else set()
    victim = _builder(cfg, tmp_path / "tok.json")
    deadline = time.monotonic() + 60
    while not any(".tmp-" in p.name for p in (set(stores.iterdir()) if stores.is_dir() else set()) - before):
        assert victim.poll() is None and time.monotonic() < deadline, "the build did not start"
        time.sleep(0.01)
    time.sleep(0.2)
    victim.send_signal(signal.SIGKILL)
    victim.communicate()
    new = {p for p in set(stores.iterdir()) - before if not p.name.endswith(".lock")}
    assert all(".tmp-" in p.name for p in new), new  # only the killed builder's temporary folder
    store = translation_store(cfg, tok, "train")  # the next start builds it whole
    assert len(store) == 150000 and not any(".tmp-" in p.name for p in stores.iterdir())


# ---- cleaning ---------------------------------------------------------------------------------

def test_cleaning_counts_ratio_duplicates_and_empty_lines(tmp_path, caplog):
    data = tmp_path / "d"
    data.mkdir()
    src = ["a b", "a b", "c", "", "d e f g h i j k", "x " * 30, "a b"]
    tgt = ["b a", "b a", "c", "z", "k", "y", "b a!"]
    (data / "t.src").write_text("\n".join(src) + "\n")
    (data / "t.tgt").write_text("\n".join(tgt) + "\n")
    cfg = DataConfig(dataset="", tokenizer="char", vocab_size=60, max_len=40, max_len_ratio=3.0,
                     dedup=True, train_src=str(data / "t.src"), train_tgt=str(data / "t.tgt"),
                     valid_src=str(data / "t.src"), valid_tgt=str(data / "t.tgt"))
    tok = train_tokenizer_for(cfg)
    with caplog.at_level(logging.WARNING):
        store = translation_store(cfg, tok, "train")
    counts = store.manifest["counts"]
    assert counts == {"read": 7, "kept": 3, "too_long": 1, "empty": 1, "ratio": 1, "duplicate": 1,
                      "cut": 0}
    assert store.lines.tolist() == [0, 2, 6]  # the repeat of line 0 (line 1) is gone
    assert "train: dropped 4 of 7 training pairs: 1 longer than max_len=40 tokens, 1 with an " \
           "empty side, 1 over max_len_ratio=3.0, 1 repeating an earlier one (dedup)" in caplog.text
    valid = translation_store(cfg, tok, "valid")  # validation: nothing dropped, long pairs cut
    assert len(valid) == 7 and valid.manifest["counts"]["cut"] == 1
    assert max(valid.lengths("src")) == 40


# ---- the bounded tokenizer sample -----------------------------------------------------------------

def test_reservoir_sample_is_bounded_seeded_and_ordered():
    assert reservoir_sample(range(5), 10) == (list(range(5)), 5)  # under the bound: everything
    sample, n = reservoir_sample(iter(range(10000)), 100, seed=3)
    assert n == 10000 and len(sample) == 100 and sample == sorted(sample)
    assert reservoir_sample(iter(range(10000)), 100, seed=3)[0] == sample
    assert reservoir_sample(iter(range(10000)), 100, seed=4)[0] != sample
    assert 3000 < np.mean(sample) < 7000  # spread over the stream, not its head


def test_tokenizer_sample_bound_and_cache(tmp_path, caplog):
    cfg = own_files(tmp_path, n_train=300, tokenizer="bpe", vocab_size=60)
    src, tgt = read_parallel(cfg.train_src, cfg.train_tgt)
    whole = train_tokenizer(src + tgt, "bpe", 60)
    assert train_tokenizer_for(cfg).to_str() == whole.to_str()  # 300 < 1,000,000: all of it
    with caplog.at_level(logging.INFO):
        again = train_tokenizer_for(cfg)
    assert "trained before on the same files" in caplog.text and again.to_str() == whole.to_str()
    caplog.clear()
    small = DataConfig(**{**cfg.__dict__, "tokenizer_sample": 50})
    with caplog.at_level(logging.INFO):
        sampled = train_tokenizer_for(small)
    assert "a sample of 50 of the 300 training pairs" in caplog.text
    pairs, _ = reservoir_sample(zip(src, tgt), 50)
    expected = train_tokenizer([x for x, _ in pairs] + [y for _, y in pairs], "bpe", 60)
    assert sampled.to_str() == expected.to_str()


# ---- training, resume and a second run open the same store ---------------------------------------

def test_resume_and_a_second_run_reuse_tokenizer_and_store(tmp_path):
    values = base_values(tmp_path / "data", max_steps=4, save_every=2, valid_every=2)
    cfg = write_toml(tmp_path / "run.toml", values)
    first = run_aiayn("train", str(cfg), "--out", str(tmp_path / "a"))
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.stderr.count("examples built in") == 2  # train and valid stores
    resumed = run_aiayn("train", str(cfg), "--out", str(tmp_path / "a"), "--resume",
                        "--set", "train.max_steps=6")
    second = run_aiayn("train", str(cfg), "--out", str(tmp_path / "b"))
    for run in (resumed, second):
        assert run.returncode == 0, run.stderr[-3000:]
        assert "built in" not in run.stderr and run.stderr.count("built before, reused") == 2
    assert "tokenizer: trained before on the same files" in second.stderr
    assert (tmp_path / "a" / "tokenizer.json").read_text() == (tmp_path / "b" / "tokenizer.json").read_text()


def test_data_build_and_stats_commands(tmp_path):
    keys = write_reverse_data(tmp_path / "data")
    sets = [a for k, v in keys.items() for a in ("--set", f"{k}={v}")]
    built = run_aiayn("data", "build", *sets)
    assert built.returncode == 0, built.stderr[-2000:]
    lines = built.stdout.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("store ") and "120 examples" in lines[0]
    stats = run_aiayn("data", "stats", *sets)
    assert stats.returncode == 0, stats.stderr[-2000:]
    assert lines[0].split(": ")[0] in stats.stdout and "built before, reused" in stats.stderr


# ---- classification and LM go through the store too ----------------------------------------------

def test_classification_and_lm_stores_hold_what_the_lists_held(tmp_path):
    from aiayn.data import classification_store, lm_store
    from aiayn.data.clean import clean_text
    from trainutil import reviews, write_tsv

    rows = reviews(200, seed=1) + [(1, "word " * 80)]
    cfg = DataConfig(kind="classification", dataset="", tokenizer="char", vocab_size=80, max_len=150,
                     train_file=write_tsv(tmp_path / "train.tsv", rows),
                     valid_file=write_tsv(tmp_path / "valid.tsv", rows[:20]))
    tok = train_tokenizer_for(cfg)
    assert tok.to_str() == train_tokenizer([clean_text(t) for _, t in rows], "char", 80).to_str()
    store = classification_store(cfg, tok, "train")
    expected = [(tok.encode(clean_text(t)), y) for y, t in rows if len(tok.encode(clean_text(t))) <= 150]
    got = [(ids.tolist(), int(y)) for ids, y in zip(store.rows("text", range(len(store))), store.labels)]
    assert got == expected and len(got) == 200 and store.manifest["counts"]["too_long"] == 1
    text = "To be, or not to be: that is the question.\n" * 50
    (tmp_path / "lm.txt").write_text(text)
    lm = DataConfig(kind="lm", dataset="", tokenizer="char", train_file=str(tmp_path / "lm.txt"),
                    valid_file=str(tmp_path / "lm.txt"))
    tok = train_tokenizer_for(lm)
    assert lm_store(lm, tok, "train").row("text", 0).tolist() == tok.encode(text)


# ---- the LM's running text streams into its store; IMDB's splits stream ------------------------

def running_text(n_words: int, seed: int = 0) -> str:
    """Words with the whitespace and characters that a piecewise encoding could get wrong: runs
    of spaces, tabs, CRLF, blank lines, NBSP, ligatures, combining accents, leading and trailing
    whitespace."""
    rng = random.Random(seed)
    words = "the king ﬁne café cafe\u0301 don't Speak, 12 speak. ÆTHER \u00a0 — ".split(" ")
    seps = [" ", " ", " ", "  ", "\n", "\n\n", "\t", "\r\n", " \n "]
    return "  \n" + "".join(rng.choice(words) + rng.choice(seps) for _ in range(n_words)) + " \n"


def lm_config(path: Path, kind: str, **over):
    from aiayn.run_config import build_run_config

    return build_run_config({"data.kind": "lm", "data.dataset": "", "data.train_file": str(path),
                             "data.valid_file": str(path), "data.tokenizer": kind,
                             "data.vocab_size": 400, "data.max_len": 16, "data.max_tokens": 128,
                             "model.max_len": 16, **over})


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_lm_store_streams_to_the_whole_texts_ids_and_batches(tmp_path, monkeypatch, caplog, kind):
    from aiayn.data import build, readers
    from aiayn.train.lm import LanguageModelTask

    monkeypatch.setattr(readers, "TEXT_BLOCK", 1000)  # bytes read at a time
    monkeypatch.setattr(build, "PIECE", 300)  # characters per piece, 3 pieces encoded at a time
    monkeypatch.setattr(build, "PIECES", 3)
    path = tmp_path / "lm.txt"
    path.write_bytes(running_text(4000).encode("utf-8"))
    cfg = lm_config(path, kind)
    task = LanguageModelTask(cfg)
    task.setup(None)
    # today's path: the text read whole, the tokenizer trained on it, encoded whole
    whole = path.read_bytes().decode("utf-8")
    assert len(whole) > 15 * 1000  # many blocks, many more pieces
    tok = train_tokenizer([whole], kind, 400)  # bpe: 140 merges
    assert task.tokenizer.to_str() == tok.to_str()
    reference = copy.copy(task)
    reference.ids = {split: np.asarray(tok.encode(whole)) for split in ("train", "valid")}
    assert all(np.array_equal(task.ids[s], reference.ids[s]) for s in ("train", "valid"))
    for rank, world_size in ((0, 1), (0, 2), (1, 2)):
        for epoch in (1, 2):
            batches = task.epoch_batches(epoch, rank, world_size)
            assert batches == reference.epoch_batches(epoch, rank, world_size) and batches
            for indices in batches[:10]:
                assert all(map(torch.equal, task.collate("train", indices),
                               reference.collate("train", indices)))
    assert task.valid_batches(0, 1) == reference.valid_batches(0, 1)
    # a resumed run (the tokenizer restored) opens the same store, built once
    with caplog.at_level(logging.INFO):
        LanguageModelTask(cfg).setup(task.tokenizer.to_str())
    assert caplog.text.count("built before, reused") == 2 and "built in" not in caplog.text


def test_lm_subword_tokenizer_learns_from_a_sample_of_lines_beyond_the_bound(tmp_path, caplog):
    path = tmp_path / "lm.txt"
    text = running_text(3000, seed=5)
    path.write_text(text, encoding="utf-8")
    lines = text.split("\n")
    cfg = DataConfig(kind="lm", dataset="", tokenizer="bpe", vocab_size=400, train_file=str(path),
                     valid_file=str(path), tokenizer_sample=len(lines))
    whole = train_tokenizer([text], "bpe", 400)
    assert train_tokenizer_for(cfg).to_str() == whole.to_str()  # every line: the whole text's
    for k in (len(lines) - 1, 50):
        with caplog.at_level(logging.INFO):
            sampled = train_tokenizer_for(DataConfig(**{**cfg.__dict__, "tokenizer_sample": k}))
        assert f"a sample of {k} of the {len(lines)} training lines" in caplog.text
        expected = train_tokenizer(reservoir_sample(lines, k)[0], "bpe", 400)
        assert sampled.to_str() == expected.to_str() != whole.to_str()


@pytest.mark.skipif(not MIRROR, reason="real data: AIAYN_DATA_MIRROR is not set")
def test_shakespeare_store_streams_its_90_10_split(use_real_cache, monkeypatch):
    from aiayn.data import readers
    from aiayn.data.loaders import lm_file

    monkeypatch.setattr(readers, "TEXT_BLOCK", 65537)  # the 90% cut falls inside a block
    cfg = DataConfig(kind="lm", dataset="tiny_shakespeare", tokenizer="char")
    whole = lm_file(cfg, "train").read_text(encoding="utf-8")
    cut = int(len(whole) * 0.9)
    tok = train_tokenizer_for(cfg)
    assert tok.to_str() == train_tokenizer([whole[:cut]], "char", cfg.vocab_size).to_str()
    stores = split_stores(cfg, tok)
    assert stores["train"].row("text", 0).tolist() == tok.encode(whole[:cut])
    assert stores["valid"].row("text", 0).tolist() == tok.encode(whole[cut:])


def test_lm_bad_byte_late_in_the_text_leaves_no_store(tmp_path, monkeypatch, caplog):
    from aiayn.data import CharTokenizer, build, lm_store, readers

    monkeypatch.setattr(readers, "TEXT_BLOCK", 512)
    monkeypatch.setattr(build, "PIECE", 100)
    lines = [f"line {i} of the text" for i in range(1000)]
    path = tmp_path / "lm.txt"
    path.write_bytes("\n".join(lines[:299]).encode() + b"\n\xff" + "\n".join(lines[299:]).encode())
    cfg = DataConfig(kind="lm", dataset="", tokenizer="char", train_file=str(path),
                     valid_file=str(path))
    tok = CharTokenizer(sorted(set("".join(lines))))
    stores = Path(os.environ["AIAYN_CACHE"]) / "stores"
    before = set(stores.iterdir()) if stores.is_dir() else set()
    with pytest.raises(DataError, match=r"lm\.txt:300: not valid UTF-8 \(byte 0xff at column 1\)"):
        lm_store(cfg, tok, "train")  # pieces of the first 299 lines were written by then
    assert all(p.name.endswith(".lock") for p in set(stores.iterdir()) - before)
    path.write_text("\n".join(lines), encoding="utf-8")
    with caplog.at_level(logging.INFO):
        store = lm_store(cfg, tok, "train")
        again = lm_store(cfg, tok, "train")
    assert store.row("text", 0).tolist() == tok.encode("\n".join(lines))
    assert again.path == store.path and "built before, reused" in caplog.text


def old_imdb_split(path: Path, split: str):
    """The in-memory IMDB splits that streaming replaced (loaders.load_classification before),
    kept here as the reference."""
    from aiayn.data import read_labelled

    texts, labels = read_labelled(path)
    if split == "train_full":
        return texts, labels
    if split in ("train_head", "val_tail"):
        tail: set[int] = set()
        for label in sorted(set(labels)):
            ids = [i for i, y in enumerate(labels) if y == label]
            tail.update(ids[len(ids) - len(ids) // 10:])
        keep = [i for i in range(len(texts)) if (i in tail) == (split == "val_tail")]
    else:
        keep = [i for i in range(len(texts)) if (i % 10 == 9) == (split == "val")]
    return [texts[i] for i in keep], [labels[i] for i in keep]


def fake_imdb(tmp_path: Path, monkeypatch, n: int, repeat: int = 8) -> Path:
    """A registered-IMDB folder of ``n`` generated training reviews (uneven classes, 3 labels),
    each the text of trainutil's review ``repeat`` times."""
    import gzip

    from aiayn.data import loaders
    from trainutil import reviews

    folder = tmp_path / "imdb"
    folder.mkdir(parents=True)
    rows = [(label if i % 7 else 2, text * repeat)
            for i, (label, text) in enumerate(reviews(n, seed=2))]
    for name in ("train", "test"):
        with gzip.open(folder / f"{name}.tsv.gz", "wt", encoding="utf-8") as f:
            f.writelines(f"{y}\t{t}\n" for y, t in rows)
    monkeypatch.setattr(loaders, "download_dataset", lambda name: folder)
    return folder


def test_imdb_splits_stream_as_the_in_memory_splits(tmp_path, monkeypatch):
    from aiayn.data import classification_store, load_classification
    from aiayn.data.clean import clean_text

    folder = fake_imdb(tmp_path, monkeypatch, 997)
    cfg = DataConfig(kind="classification", dataset="imdb", tokenizer="char", max_len=4000)
    tok = train_tokenizer_for(cfg)
    for split in ("train", "val", "train_full", "train_head", "val_tail"):
        texts, labels = old_imdb_split(folder / "train.tsv.gz", split)
        assert load_classification(cfg, split) == (texts, labels)
        store = classification_store(cfg, tok, split)
        assert store.labels.tolist() == labels
        assert [x.tolist() for x in store.rows("text", range(len(store)))] == \
            [tok.encode(clean_text(t)) for t in texts]
    assert load_classification(cfg, "test") == old_imdb_split(folder / "test.tsv.gz", "train_full")


def traced_peak(build_store, folder: Path) -> int:
    """The most memory (bytes, tracemalloc) that ``build_store(folder)`` held at once."""
    import tracemalloc

    folder.mkdir(parents=True)
    tracemalloc.start()
    try:
        build_store(folder)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_building_memory_is_bounded_by_the_chunks_not_the_file(tmp_path, monkeypatch):
    """tracemalloc over the two streaming builders, on a file and on one 4 times as large: the
    LM's running text (pieces of 4,096 characters) and IMDB's training split (16 examples at a
    time, from its .gz, 4 times as many reviews). The LM's peak does not grow with the file;
    IMDB's grows by the few integers kept per example (its index), not by the text; both stay
    far below the file."""
    from aiayn.data import CharTokenizer, build, readers
    from aiayn.data.build import Cleaning, running_pieces, write_examples, write_running_text
    from aiayn.data.clean import clean_text
    from aiayn.data.loaders import classification_source

    monkeypatch.setattr(readers, "TEXT_BLOCK", 1 << 14)
    monkeypatch.setattr(build, "PIECE", 1 << 12)
    monkeypatch.setattr(build, "PIECES", 4)
    monkeypatch.setattr(build, "CHUNK", 16)
    tok = CharTokenizer(sorted(set(running_text(1000))))
    tok.encode_array("")  # its lookup table (256 KiB: "ﬁ" is U+FB01) belongs to the tokenizer
    peaks, sizes = {}, {}
    cfg = DataConfig(kind="classification", dataset="imdb", tokenizer="char", max_len=10**6)
    for scale in (1, 4):
        text = running_text(150_000 * scale, seed=scale)
        path = tmp_path / f"lm{scale}.txt"
        path.write_text(text, encoding="utf-8")
        peaks["lm", scale] = traced_peak(
            lambda f: write_running_text(f, tok, running_pieces(readers.iter_text(path))),
            tmp_path / "stores" / f"lm{scale}")
        stored = np.fromfile(tmp_path / "stores" / f"lm{scale}" / "text.bin", np.uint16)
        assert np.array_equal(stored, tok.encode_array(text))
        sizes["lm", scale] = path.stat().st_size
        fake_imdb(tmp_path / f"imdb{scale}", monkeypatch, 1000 * scale, repeat=24)
        items = classification_source(cfg, "train")[1]  # from fake_imdb's folder
        peaks["imdb", scale] = traced_peak(
            lambda f: write_examples(f, tok, ["text"], (((t,), y) for t, y in items()),
                                     Cleaning(limits=(10**6,)), clean_text),
            tmp_path / "stores" / f"imdb{scale}")
        sizes["imdb", scale] = sum(len(t.encode()) for t, _ in items())
    for name, per_example in (("lm", 0), ("imdb", 64)):
        assert sizes[name, 4] > 3.5 * sizes[name, 1] and sizes[name, 4] > 2 * 2**20
        growth = 1.1 * peaks[name, 1] + per_example * 900 * 3  # 900 of 1000 reviews: "train"
        assert peaks[name, 4] < growth, (name, peaks)
        assert peaks[name, 4] < sizes[name, 4] / 6, (name, peaks, sizes)
