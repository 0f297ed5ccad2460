"""`aiayn evaluate`: score a model on a test set: sacreBLEU (cased, -lc) and chrF of a translation
model's output, the accuracy of a classifier.

One evaluator for every kind, :meth:`aiayn.folder.ModelFolder.score`; for translation the same
protocol (:func:`aiayn.decode.translate_texts` + :func:`aiayn.eval.corpus_scores`) gives the
validation BLEU logged during training.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from aiayn.commands.options import (
    add_decode_options,
    add_device,
    add_model_dirs,
    add_output_file,
    decode_overrides,
    inference_device,
    open_models,
)

log = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "evaluate",
        description="Translate a test set, score it with sacreBLEU (BLEU cased and "
        "lowercased, chrF, with signatures), print and save as JSON. For a classifier: "
        "its accuracy.",
    )
    add_model_dirs(p)
    p.add_argument("--split", help="a split of the model's dataset, e.g. test_2016_flickr")
    p.add_argument(
        "--src",
        metavar="FILE",
        help="your test set's source side, one sentence per line (instead of --split); for a "
        "classifier, labelled texts (label<TAB>text .tsv or .jsonl)",
    )
    p.add_argument(
        "--ref", metavar="FILE", help="your test set's references, line by line with --src"
    )
    p.add_argument(
        "--limit",
        type=int,
        default=0,
        metavar="N",
        help="score only the first N examples, for a quick look (saved as "
        "eval_<name>_first<N>.json, beside the whole set's scores, never in their place)",
    )
    add_output_file(p, "where to save the scores as JSON", shown="MODEL_DIR/eval_<name>.json")
    p.add_argument(
        "--hyps", metavar="FILE", help="also save the translations here, to read or rescore"
    )
    p.add_argument(
        "--paper-bleu",
        action="store_true",
        help="also the paper's BLEU (Moses-tokenised, ##AT## compound-split, multi-bleu.perl; "
        "what 27.3/28.4 on newstest2014 mean), in the model's target language; needs sacremoses",
    )
    add_decode_options(p)
    add_device(p)
    p.set_defaults(run=run)
    return p


def report(scores: dict[str, Any]) -> str:
    """The human-readable summary printed by `aiayn evaluate`."""
    test_set, part = scores["test_set"], ""
    if "limit" in scores:  # --limit: a part of the set, said as such
        test_set = f"the first {scores['limit']} of {test_set} only"
        part = f" ({test_set})"
    if "images_per_s" in scores:
        return (
            f"accuracy {100 * scores['accuracy']:.2f}% ({scores['correct']}/{scores['n']}) "
            f"on {test_set}; {scores['seconds']:.1f} s = {scores['images_per_s']:.0f} "
            f"images/s ({scores['device']})"
        )
    if "accuracy" in scores:
        return (
            f"accuracy {100 * scores['accuracy']:.2f}% ({scores['correct']}/{scores['n']}) "
            f"on {test_set}; {scores['cut_to_max_len']} texts cut to "
            f"{scores['max_len']} tokens; {scores['seconds']:.1f} s = "
            f"{scores['texts_per_s']:.0f} texts/s ({scores['device']})"
        )
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
            *(
                [
                    f"{scores['bleu_paper_text'].replace('BLEU', 'BLEU-paper', 1)}  "
                    f"{scores['bleu_paper_signature']}"
                ]
                if "bleu_paper" in scores
                else []
            ),
            f"{scores['n']} sentences{part} in {scores['seconds']:.1f} s = "
            f"{scores['sentences_per_s']:.1f} sentences/s ({how})",
        ]
    )


def score_file_name(scores: dict[str, Any], paths: list[Path]) -> str:
    """``eval_<test set>.json`` in the model folder; ``_first<N>`` when ``--limit`` scored part
    of the set (so that it never replaces, nor reads as, the whole set's score), ``_ensemble<K>``
    for an ensemble of K folders."""
    part = f"_first{scores['limit']}" if "limit" in scores else ""
    ensemble = f"_ensemble{len(paths)}" if len(paths) > 1 else ""
    return f"eval_{scores['test_set']}{part}{ensemble}.json"


def run(args: argparse.Namespace) -> int:
    from aiayn.io import check_output_file, write_json, write_text

    if args.paper_bleu:  # before any decoding
        from aiayn.eval.paper_bleu import require_moses

        require_moses()
    if not args.output:  # the default output, in the model folder: checked before any work
        check_output_file(Path(args.model[0]) / f"eval_{args.split or 'test'}.json", "--out")
    overrides = decode_overrides(args)  # a bad --set before the model is loaded
    model = open_models(args, inference_device(args.device))
    scores = model.score(
        args.split, args.src, args.ref, args.limit, paper_bleu=args.paper_bleu, **overrides
    )
    hyps = scores.pop("hyps", None)
    out = Path(args.output) if args.output else model.path / score_file_name(scores, model.paths)
    write_json(out, scores)
    if out.parent.resolve() == model.path.resolve():  # the folder's own scores: refresh its card
        from aiayn.card import write_model_card

        write_model_card(model.path)
    if args.hyps and hyps is not None:
        write_text(args.hyps, "".join(h + "\n" for h in hyps))
    print(report(scores))
    log.info("scores saved to %s", out)
    return 0
