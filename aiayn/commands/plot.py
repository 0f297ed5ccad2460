"""``aiayn plot``: figures of the positional encoding, attention maps and learning curves.

    aiayn plot pe --length 2048 --d-model 512 -o pe.png
    aiayn plot pe-similarity --position 1000 -o sim.png
    aiayn plot attention MODEL_DIR --text "A man rides a bike." [--layer L] [--head H] -o att.png
    aiayn plot curves RUN_DIR [RUN_DIR ...] -o curves.png

Needs matplotlib (``pip install -e '.[plot]'``).
"""

from __future__ import annotations

import argparse
import logging
import os

from aiayn.commands.options import add_output_file
from aiayn.errors import AiaynError

log = logging.getLogger(__name__)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "plot",
        description="Figures of what the Transformer computes. Needs matplotlib.",
    )
    kinds = parser.add_subparsers(dest="plot", metavar="WHAT", required=True)
    pe = kinds.add_parser("pe", help="the sinusoidal positional encoding: position × depth (§3.5)")
    _shape_args(pe)
    add_output_file(pe, "PNG file to write", "pe.png")
    pe.set_defaults(run=run_pe)
    _add_pe_similarity(kinds)
    _add_attention(kinds)
    curves = kinds.add_parser("curves", help="loss, learning rate and validation metrics of a run")
    curves.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        nargs="+",
        help="a run folder holding metrics.jsonl (or the file); several are drawn "
        "on the same panels (e.g. an ensemble's models)",
    )
    add_output_file(curves, "PNG file to write", "curves.png")
    curves.set_defaults(run=run_curves)
    return parser


def _add_pe_similarity(kinds: argparse._SubParsersAction) -> None:
    sim = kinds.add_parser(
        "pe-similarity", help="cosine similarity of one position's encoding with all others"
    )
    sim.add_argument(
        "--position", type=int, default=1000, help="the position compared (default 1000)"
    )
    sim.add_argument(
        "--window",
        type=int,
        default=50,
        help="half-width of the zoomed panel, in positions (default 50)",
    )
    _shape_args(sim)
    add_output_file(sim, "PNG file to write", "pe-similarity.png")
    sim.set_defaults(run=run_pe_similarity)


def _add_attention(kinds: argparse._SubParsersAction) -> None:
    att = kinds.add_parser(
        "attention",
        help="attention maps of a model on its own translation of a sentence",
        description="Translate TEXT with the model (beam search, the paper's settings), then draw "
        "encoder self-attention, decoder self-attention and encoder-decoder attention for "
        "every layer and head (or the chosen ones), tokens on the axes.",
    )
    att.add_argument(
        "model_dir",
        metavar="MODEL_DIR",
        help="a model folder (config.json, weights, tokenizer.json)",
    )
    att.add_argument(
        "--text",
        metavar="TEXT",
        help="the source sentence, given on the command line (a translation model)",
    )
    att.add_argument(
        "--image",
        metavar="FILE",
        help="an image (PNG, JPEG or .npy) for an image classifier: each layer's and head's "
        "attention of the class token (or the mean over patches) drawn over it",
    )
    att.add_argument(
        "--rollout",
        action="store_true",
        help="with --image: one more panel, the attention rollout through all layers "
        "(Abnar & Zuidema 2020)",
    )
    att.add_argument(
        "--layer",
        type=int,
        action="append",
        metavar="L",
        help="only layer L (1-based, as in the paper); repeat for several",
    )
    att.add_argument(
        "--head",
        type=int,
        action="append",
        metavar="H",
        help="only head H (1-based); repeat for several",
    )
    att.add_argument(
        "--beam",
        type=int,
        default=None,
        help="beam size of the translation (default 4, the paper's; 1 = greedy)",
    )
    add_output_file(att, "PNG file to write", "attention.png")
    att.set_defaults(run=run_attention)


def _shape_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--length", type=int, default=2048, help="number of positions (default 2048)"
    )
    parser.add_argument(
        "--d-model",
        type=int,
        default=512,
        help="the encoding's width d_model, even (default 512)",
    )


def _save(fig, path: str) -> int:
    from aiayn.viz import save_figure

    log.info("wrote %s", save_figure(fig, path))
    return 0


def _check_d_model(args: argparse.Namespace) -> None:
    """``--d-model`` must give sin/cos pairs (named as the user typed it: the library says depth)."""
    if args.d_model < 2 or args.d_model % 2:
        raise AiaynError(
            f"--d-model must be an even number >= 2 (sin/cos pairs), got {args.d_model}"
        )


def run_pe(args: argparse.Namespace) -> int:
    from aiayn.viz.pe import plot_pe

    _check_d_model(args)
    return _save(plot_pe(args.length, args.d_model), args.output)


def run_pe_similarity(args: argparse.Namespace) -> int:
    from aiayn.viz.pe import plot_pe_similarity

    _check_d_model(args)
    return _save(
        plot_pe_similarity(args.position, args.length, args.d_model, args.window), args.output
    )


def run_labels(run_dirs: list) -> tuple[list[str], str]:
    """Legend labels and title for runs plotted together: each run's path below the folder they
    share, that folder named once in the title (runs/x/m1 runs/x/m2 -> m1, m2, "runs/x: m1 + m2");
    the whole paths where they share none, or where one run holds another."""
    paths = [os.path.normpath(str(d)) for d in run_dirs]
    try:
        common = os.path.commonpath(paths)
    except ValueError:  # absolute and relative paths mixed
        common = ""
    labels = [os.path.relpath(p, common) for p in paths] if common else paths
    if not common or "." in labels or len(set(labels)) < len(labels):
        return paths, " + ".join(paths)
    return labels, f"{common}: {' + '.join(labels)}"


def run_curves(args: argparse.Namespace) -> int:
    from aiayn.viz.curves import plot_runs, read_metrics

    labels, title = run_labels(args.run_dir)
    runs = [
        (label if len(args.run_dir) > 1 else "", read_metrics(d))
        for label, d in zip(labels, args.run_dir)
    ]
    return _save(plot_runs(runs, title=title), args.output)


def run_attention(args: argparse.Namespace) -> int:
    from aiayn.viz.attention import attention_of_model_dir, plot_attention

    if bool(args.text) == bool(args.image):
        raise AiaynError(
            "give --text TEXT (a translation model) or --image FILE (an image classifier)"
        )
    if args.image:
        return run_image_attention(args)

    pair = attention_of_model_dir(args.model_dir, args.text, beam=args.beam)
    log.info("translation: %s", pair.translation)
    fig = plot_attention(
        pair.maps,
        pair.src_tokens,
        pair.tgt_tokens,
        args.layer,
        args.head,
        title=f"{args.text}  →  {pair.translation}",
    )
    return _save(fig, args.output)


def run_image_attention(args: argparse.Namespace) -> int:
    from aiayn.viz.image_attention import image_attention, plot_image_attention

    seen = image_attention(args.model_dir, args.image)
    log.info("predicted: %s (%.4f)", seen.label, seen.prob)
    fig = plot_image_attention(seen, args.layer, args.head, args.rollout, title=args.image)
    return _save(fig, args.output)
