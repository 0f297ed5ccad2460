"""`aiayn classify`: one text per line in, ``LABEL<TAB>PROBABILITY`` per line out.

Texts are cleaned and cut to the run's ``data.max_len`` exactly as in training. A blank input line
gives a blank output line, so output line i always answers input line i. Also
:func:`evaluate_classifier_command`, which `aiayn evaluate` runs for classifier folders.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from aiayn.errors import ConfigError

log = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "classify",
        help="label texts with a trained classifier (IMDB sentiment)",
        description="Classify one text per line; print LABEL<TAB>PROBABILITY per "
        "line (blank lines stay blank).",
    )
    p.add_argument("model", metavar="MODEL_DIR", help="a classifier model folder, e.g. RUN/best")
    p.add_argument(
        "--input",
        "-i",
        default="-",
        metavar="FILE|-",
        help="UTF-8 text, one text per line (default: stdin)",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=16384,
        help="batch budget: texts × padded length (default: 16384)",
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, … (default: cpu)")
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    from aiayn.commands.translate import inference_device, read_input_lines
    from aiayn.decode.classify import (
        encode_texts,
        label_names,
        load_classifier,
        predict_ids,
        text_limit,
    )

    if args.max_tokens < 1:
        raise ConfigError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    device = inference_device(args.device)
    model, tokenizer, meta = load_classifier(args.model, device)
    lines = read_input_lines(args.input)
    filled = [i for i, line in enumerate(lines) if line.strip()]
    limit = text_limit(model, meta)
    ids = [x[:limit] for x in encode_texts(tokenizer, [lines[i] for i in filled])]
    probs = predict_ids(model, ids, args.max_tokens, device)
    names = label_names(meta, probs.size(1))
    out = [""] * len(lines)
    for i, row in zip(filled, probs):
        best = int(row.argmax())
        out[i] = f"{names[best]}\t{float(row[best]):.4f}"
    print("\n".join(out), flush=True)
    return 0


def evaluate_classifier_command(args: argparse.Namespace) -> int:
    """`aiayn evaluate CLASSIFIER_DIR --split test` (or ``--src FILE.tsv|.jsonl``): accuracy."""
    from aiayn.commands.translate import inference_device
    from aiayn.config import from_dict
    from aiayn.data import DataConfig, load_classification, read_labelled
    from aiayn.decode.classify import evaluate_classifier, load_classifier
    from aiayn.io import write_json

    if bool(args.split) == bool(args.src):
        raise ConfigError("give either --split NAME or --src FILE (label<TAB>text .tsv or .jsonl)")
    if args.limit < 0:
        raise ConfigError(f"--limit must be >= 0, got {args.limit}")
    device = inference_device(args.device)
    model, tokenizer, meta = load_classifier(args.model, device)
    if args.src:
        texts, labels = read_labelled(args.src)
        name = Path(args.src).stem
    else:
        if "data" not in meta:
            raise ConfigError(f"{args.model}: the model folder records no dataset; use --src FILE")
        texts, labels = load_classification(from_dict(DataConfig, meta["data"]), args.split)
        name = args.split
    if args.limit:
        texts, labels = texts[: args.limit], labels[: args.limit]
    scores = evaluate_classifier(model, tokenizer, meta, texts, labels, args.max_tokens, device)
    scores.update(test_set=name, model=str(args.model), device=str(device))
    out = Path(args.output) if args.output else Path(args.model) / f"eval_{name}.json"
    write_json(out, scores)
    print(
        f"accuracy {100 * scores['accuracy']:.2f}% ({scores['correct']}/{scores['n']}) "
        f"on {name}; "
        f"{scores['cut_to_max_len']} texts cut to {scores['max_len']} tokens; "
        f"{scores['seconds']:.1f} s = {scores['texts_per_s']:.0f} texts/s ({device})"
    )
    log.info("scores saved to %s", out)
    return 0
