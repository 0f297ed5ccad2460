"""The character tokenizer: its per-character Python encoding (before) against the vectorised one
(CharTokenizer.encode_array / encode_batch), the characters counted with Counter against
numpy (training), and the LM store built from the file read whole
against the streamed one; the same run, interleaved, median of 5. Not a timed test: the one-off
measurement behind docs/data.md's figure, kept to be rerun.

    .venv/bin/python docs/experiments/char_tokenizer_speed.py 8 \
        docs/experiments/char_tokenizer_speed.json
"""

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from aiayn.data import train_tokenizer
from aiayn.data.build import Cleaning, running_pieces, write_examples, write_running_text
from aiayn.data.readers import iter_text, read_text
from aiayn.data.tokenizer import _char_counts

LOAD_BEFORE = open("/proc/loadavg").read().split()[:3]
N = int(sys.argv[1]) if len(sys.argv) > 1 else 8
REPEATS = 5
MIRROR = Path(os.environ.get("AIAYN_DATA_MIRROR", "../shared/data"))
src = (MIRROR / "shakespeare" / "input.txt").read_text(encoding="utf-8")
tmp = Path(tempfile.mkdtemp())
path = tmp / "shakespeare_x.txt"
path.write_text(src * N, encoding="utf-8")
text = src * N
tok = train_tokenizer([src], "char", 1000)
lines = text.split("\n")


def old_encode_batch(texts):  # CharTokenizer.encode_batch before: encode per text
    return [tok.encode(t) for t in texts]


def store(build):  # a store built into a fresh folder, removed after
    folder = Path(tempfile.mkdtemp(dir=tmp))
    try:
        build(folder)
    finally:
        shutil.rmtree(folder)


def with_old_batch(fn):  # run fn with CharTokenizer.encode_batch as it was (encode per text)
    def run():
        tok.encode_batch = old_encode_batch
        try:
            return fn()
        finally:
            del tok.encode_batch

    return run


def lm_old(f):  # the LM store before: the file read whole, one example through write_examples
    return write_examples(
        f, tok, ("text",), [((read_text(path),), None)], Cleaning(limits=(2**62,), cut=True)
    )


def lines_store(f):  # one example per line (a classification-like split), CHUNK examples at a time
    return write_examples(
        f, tok, ("text",), (((t,), None) for t in lines), Cleaning(limits=(10**6,))
    )


def old_counts():  # the characters counted before: Counter.update over the pieces
    counts = Counter()
    for piece in running_pieces([text]):
        counts.update(piece)
    return counts


cases = {
    "character counts (tokenizer training)": (
        old_counts,
        lambda: _char_counts(running_pieces([text])),
    ),
    "running text to an id array": (
        lambda: np.fromiter(tok.encode(text), np.int64, len(text)),
        lambda: tok.encode_array(text),
    ),
    "LM store from the file": (
        with_old_batch(lambda: store(lm_old)),
        lambda: store(lambda f: write_running_text(f, tok, running_pieces(iter_text(path)))),
    ),
    "store of the lines (write_examples)": (
        with_old_batch(lambda: store(lines_store)),
        lambda: store(lines_store),
    ),
}
assert tok.encode_batch(lines) == old_encode_batch(lines)
results = {}
for name, (old, new) in cases.items():
    times = {"old": [], "new": []}
    for _ in range(REPEATS):
        for which, fn in (("old", old), ("new", new)):
            t = time.perf_counter()
            fn()
            times[which].append(time.perf_counter() - t)
    ratio = statistics.median(times["old"]) / statistics.median(times["new"])
    results[name] = {
        "old_s": times["old"],
        "new_s": times["new"],
        "speedup_median": ratio,
        "chars": len(text),
    }
    old_s, new_s = statistics.median(times["old"]), statistics.median(times["new"])
    print(f"{name}: old {old_s:.3f} s, new {new_s:.3f} s, x{ratio:.1f}")
cpu = next(
    line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")
)
commit = subprocess.run(
    ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
).stdout.strip()
report = {
    "date": time.strftime("%Y-%m-%d"),
    "cpu": cpu,
    "cores": len(os.sched_getaffinity(0)),
    "load_before": LOAD_BEFORE,
    "load_after": open("/proc/loadavg").read().split()[:3],
    "commit": commit,
    "corpus": f"Tiny Shakespeare x{N}",
    "repeats": REPEATS,
    "python": platform.python_version(),
    "results": results,
}
Path(sys.argv[2] if len(sys.argv) > 2 else "/tmp/lmstream/char_speed.json").write_text(
    json.dumps(report, indent=1)
)
shutil.rmtree(tmp)
