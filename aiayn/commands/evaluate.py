"""`aiayn evaluate`: translate a test set and score it with sacreBLEU (cased, -lc) and chrF.

The same protocol (:func:`aiayn.decode.translate_texts` + :func:`aiayn.eval.corpus_scores`) gives
the validation BLEU logged during training.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path
from typing import Any

from aiayn.commands.translate import (
    add_decode_options,
    decode_config,
    inference_device,
    load_for_decoding,
    precision,
)
from aiayn.errors import ConfigError

log = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "evaluate",
        help="BLEU/chrF of a model on a test split or your files (accuracy for a classifier)",
        description="Translate a test set, score it with sacreBLEU (BLEU cased and "
        "lowercased, chrF, with signatures), print and save as JSON.",
    )
    add_decode_options(p)
    p.add_argument("--split", help="a split of the model's dataset, e.g. test_2016_flickr")
    p.add_argument("--src", metavar="FILE", help="source sentences (instead of --split)")
    p.add_argument("--ref", metavar="FILE", help="reference translations, line by line with --src")
    p.add_argument("--limit", type=int, default=0, help="score only the first N sentences")
    p.add_argument(
        "--output",
        "-o",
        metavar="JSON",
        help="where to save the scores (default: MODEL_DIR/eval_<name>.json)",
    )
    p.add_argument("--hyps", metavar="FILE", help="also save the translations here")
    p.set_defaults(run=run)
    return p


def load_test_set(
    args: argparse.Namespace, meta: dict[str, Any]
) -> tuple[list[str], list[str], str]:
    """(sources, references, name) from --split (the model's dataset) or --src/--ref."""
    from aiayn.config import from_dict
    from aiayn.data import DataConfig, read_parallel

    if bool(args.split) == bool(args.src or args.ref):
        raise ConfigError("give either --split NAME or --src FILE --ref FILE")
    if args.src or args.ref:
        if not (args.src and args.ref):
            raise ConfigError("--src and --ref go together")
        src, ref = read_parallel(args.src, args.ref)
        return src, ref, Path(args.src).stem
    if "data" not in meta:
        raise ConfigError(f"{args.model[0]}: the model folder records no dataset; use --src/--ref")
    from aiayn.data import load_translation

    src, ref = load_translation(from_dict(DataConfig, meta["data"]), args.split)
    return src, ref, args.split


def report(scores: dict[str, Any]) -> str:
    """The human-readable summary printed by `aiayn evaluate`."""
    d = scores["decoding"]
    how = (
        f"beam {d['beam']}, {d['length_penalty']} α={d['alpha']}, max len "
        f"{d['max_len_a']}·src+{d['max_len_b']}, {d['device']}{', bf16' if d['bf16'] else ''}"
    )
    return "\n".join(
        [
            f"{scores['bleu_text']}  {scores['bleu_signature']}",
            f"{scores['bleu_lc_text'].replace('BLEU', 'BLEU-lc', 1)}  {scores['bleu_lc_signature']}",
            f"{scores['chrf_text']}  {scores['chrf_signature']}",
            f"{scores['n']} sentences in {scores['seconds']:.1f} s = {scores['sentences_per_s']:.1f} "
            f"sentences/s ({how})",
        ]
    )


def run(args: argparse.Namespace) -> int:
    from aiayn.checkpoint import read_config
    from aiayn.eval import corpus_scores
    from aiayn.export.engines import translate_hypotheses
    from aiayn.io import check_output_file, write_json, write_text

    folders = args.model
    if read_config(folders[0])["kind"] == "classifier":  # accuracy instead of BLEU
        from aiayn.commands.classify import evaluate_classifier_command

        if len(folders) > 1:
            raise ConfigError(
                "several MODEL_DIRs make a translation ensemble; a classifier is "
                "evaluated one model at a time"
            )
        args.model = folders[0]
        return evaluate_classifier_command(args)
    if args.limit < 0:
        raise ConfigError(f"--limit must be >= 0, got {args.limit}")
    cfg, device = decode_config(args), inference_device(args.device)
    if not args.output:  # the default output, in the model folder: checked before any work
        check_output_file(Path(folders[0]) / f"eval_{args.split or 'test'}.json", "--output")
    model, tokenizer, meta = load_for_decoding(args, device)
    src, ref, name = load_test_set(args, meta)
    if args.limit:
        src, ref = src[: args.limit], ref[: args.limit]
    start = time.perf_counter()
    with precision(device, args.bf16):
        hyps = [
            line[0][0] if line else "" for line in translate_hypotheses(model, tokenizer, src, cfg)
        ]
    seconds = time.perf_counter() - start
    scores = corpus_scores(hyps, ref)
    scores.update(
        test_set=name,
        seconds=round(seconds, 3),
        sentences_per_s=round(len(src) / max(seconds, 1e-9), 2),
        decoding={
            **vars(cfg),
            "device": str(device),
            "bf16": args.bf16,
            "engine": meta.get("format", "torch"),
        },
        model=str(folders[0]) if len(folders) == 1 else [str(f) for f in folders],
    )
    suffix = f"_ensemble{len(folders)}" if len(folders) > 1 else ""
    out = Path(args.output) if args.output else Path(folders[0]) / f"eval_{name}{suffix}.json"
    write_json(out, scores)
    if args.hyps:
        write_text(args.hyps, "".join(h + "\n" for h in hyps))
    print(report(scores))
    log.info("scores saved to %s", out)
    return 0
