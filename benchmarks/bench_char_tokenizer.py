"""The character tokenizer: its per-character Python encoding (before) against the vectorised one
(CharTokenizer.encode_array / encode_batch), the characters counted with Counter against numpy
(training), and the LM store built from the file read whole against the streamed one; the same
run, interleaved, medians. Not a timed test: the measurement behind docs/data.md's figure.

    python benchmarks/bench_char_tokenizer.py [--copies 8] [--repeats 5] \
        [--json docs/experiments/char_tokenizer_speed.json]
    python benchmarks/bench_char_tokenizer.py --smoke --json /tmp/char.json   # seconds

The corpus is Tiny Shakespeare from the data mirror (AIAYN_DATA_MIRROR), repeated ``--copies``
times (``--smoke``: its first 20,000 characters, one repeat).
"""

from __future__ import annotations

import argparse
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
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from aiayn.data import train_tokenizer  # noqa: E402
from aiayn.data.build import Cleaning, running_pieces, write_examples, write_running_text  # noqa: E402
from aiayn.data.readers import iter_text, read_text  # noqa: E402
from aiayn.data.tokenizer import _char_counts  # noqa: E402
from aiayn.env import cpu_name  # noqa: E402

SMOKE_CHARS = 20_000


def cases(text: str, path: Path, tmp: Path) -> dict[str, tuple[Callable, Callable]]:
    """name -> (before, after), each a callable that does the whole job once."""
    tok = train_tokenizer([text], "char", 1000)
    lines = text.split("\n")

    def old_encode_batch(texts):  # CharTokenizer.encode_batch before: encode per text
        return [tok.encode(t) for t in texts]

    def store(build):  # a store built into a fresh folder, removed after
        folder = Path(tempfile.mkdtemp(dir=tmp))
        try:
            build(folder)
        finally:
            shutil.rmtree(folder)

    def with_old_batch(fn):  # fn with CharTokenizer.encode_batch as it was (encode per text)
        def run():
            tok.encode_batch = old_encode_batch
            try:
                return fn()
            finally:
                del tok.encode_batch

        return run

    def lm_old(f):  # the LM store before: the file read whole, one example through write_examples
        return write_examples(f, tok, ("text",), [((read_text(path),), None)],
                              Cleaning(limits=(2**62,), cut=True))

    def lines_store(f):  # one example per line (a classification-like split)
        return write_examples(f, tok, ("text",), (((t,), None) for t in lines),
                              Cleaning(limits=(10**6,)))

    def old_counts():  # the characters counted before: Counter.update over the pieces
        counts: Counter = Counter()
        for piece in running_pieces([text]):
            counts.update(piece)
        return counts

    assert tok.encode_batch(lines) == old_encode_batch(lines), "encode_batch changed the ids"
    return {
        "character counts (tokenizer training)": (old_counts, lambda: _char_counts(running_pieces([text]))),
        "running text to an id array": (lambda: np.fromiter(tok.encode(text), np.int64, len(text)),
                                        lambda: tok.encode_array(text)),
        "LM store from the file": (
            with_old_batch(lambda: store(lm_old)),
            lambda: store(lambda f: write_running_text(f, tok, running_pieces(iter_text(path))))),
        "store of the lines (write_examples)": (with_old_batch(lambda: store(lines_store)),
                                                lambda: store(lines_store)),
    }


def measure(jobs: dict[str, tuple[Callable, Callable]], repeats: int, chars: int) -> dict:
    results = {}
    for name, (old, new) in jobs.items():
        times: dict[str, list[float]] = {"old": [], "new": []}
        for _ in range(repeats):
            for which, fn in (("old", old), ("new", new)):
                start = time.perf_counter()
                fn()
                times[which].append(time.perf_counter() - start)
        old_s, new_s = statistics.median(times["old"]), statistics.median(times["new"])
        results[name] = {"old_s": times["old"], "new_s": times["new"],
                         "speedup_median": old_s / new_s, "chars": chars}
        print(f"{name}: old {old_s:.3f} s, new {new_s:.3f} s, x{old_s / new_s:.1f}")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", type=int, default=8, help="Tiny Shakespeare repeated N times")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved runs of each case")
    parser.add_argument("--smoke", action="store_true", help="20,000 characters, one repeat")
    parser.add_argument("--json", default=str(ROOT / "docs/experiments/char_tokenizer_speed.json"))
    args = parser.parse_args(argv)
    mirror = Path(os.environ.get("AIAYN_DATA_MIRROR", ROOT.parent / "shared" / "data"))
    source = (mirror / "shakespeare" / "input.txt").read_text(encoding="utf-8")
    text = source[:SMOKE_CHARS] if args.smoke else source * args.copies
    repeats = 1 if args.smoke else args.repeats
    load_before = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="bench-char-"))
    try:
        path = tmp / "corpus.txt"
        path.write_text(text, encoding="utf-8")
        results = measure(cases(text, path, tmp), repeats, len(text))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT).stdout.strip()
    report = {"date": time.strftime("%Y-%m-%d"), "cpu": cpu_name(), "cores": os.cpu_count(),
              "load_before": load_before, "load_after": os.getloadavg(), "commit": commit,
              "corpus": "Tiny Shakespeare " + (f"first {SMOKE_CHARS} characters" if args.smoke
                                               else f"x{args.copies}"),
              "repeats": repeats, "python": platform.python_version(), "results": results}
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
