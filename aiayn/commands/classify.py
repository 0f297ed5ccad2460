"""`aiayn classify`: one text per line in, ``LABEL<TAB>PROBABILITY`` per line out.

Texts are cleaned and cut to the run's ``data.max_len`` exactly as in training. A blank input line
gives a blank output line, so output line i always answers input line i. Accuracy on a labelled
test set: `aiayn evaluate`.

An image classifier reads ``--image FILE`` (PNG, JPEG, or a .npy array; repeatable) instead and
prints ``FILE<TAB>LABEL<TAB>PROBABILITY`` per image, its ``--top-k`` likeliest classes, best
first (docs/vision.md).
"""

from __future__ import annotations

import argparse
import sys

from aiayn.commands.options import (
    add_batch_tokens,
    add_device,
    add_input_file,
    advanced,
    check_batch_tokens,
    inference_device,
    read_input_lines,
)
from aiayn.decode.classify import MAX_TOKENS
from aiayn.kinds import CLASSIFICATION


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "classify",
        description="Classify one text per line; print LABEL<TAB>PROBABILITY per "
        "line (blank lines stay blank).",
    )
    p.add_argument(
        "model",
        metavar="MODEL_DIR",
        nargs="+",
        help="a classifier model folder, e.g. RUN/best; several text classifier folders "
        "classify as an ensemble (their class probabilities averaged)",
    )
    add_input_file(p, "one text")
    add_device(p)
    add_batch_tokens(advanced(p), MAX_TOKENS, "texts × longest padded length")
    p.add_argument(
        "--image",
        action="append",
        metavar="FILE",
        help="an image to classify with an image classifier (PNG, JPEG or a .npy array; "
        "repeat for more); converted as the training images were",
    )
    p.add_argument(
        "--top-k",
        type=int,
        default=1,
        metavar="K",
        help="with --image: print the K likeliest classes of each image (default: 1)",
    )
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    from aiayn.folder.load import load_model_folder

    check_batch_tokens(args)
    if args.image:
        return classify_images(args)
    model = load_model_folder(args.model, inference_device(args.device), CLASSIFICATION)
    out = []
    for result in model.classify(read_input_lines(args.input), args.batch_tokens):
        label = result["label"]
        out.append(f"{label}\t{result['probs'][label]:.4f}" if label else "")
    sys.stdout.write("".join(line + "\n" for line in out))  # no input line: no output line
    sys.stdout.flush()
    return 0


def classify_images(args: argparse.Namespace) -> int:
    """``--image``: one line per image, ``FILE<TAB>LABEL<TAB>PROBABILITY`` for its top k."""
    from aiayn.folder import load_model_folder

    model = load_model_folder(args.model, inference_device(args.device))
    results = model.classify_images(args.image, top_k=args.top_k)
    for path, result in zip(args.image, results):
        best = "\t".join(f"{c['label']}\t{c['prob']:.4f}" for c in result["top"])
        sys.stdout.write(f"{path}\t{best}\n")
    sys.stdout.flush()
    return 0
