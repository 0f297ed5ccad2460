"""The compiled decoder step against the module code, A/B in one process (issue #42 point 4).

One model folder, two decodings that alternate: the module code (``decode.compile`` off) and the
decoder step as one AOTInductor call (``decode.compile`` on; ``--step eager`` runs the same step
function uncompiled instead, which measures the formulation alone). One sentence at a time they
alternate sentence by sentence (the per-sentence time ratios' median and quartiles); in batches
they alternate round by round over the first ``--limit`` sentences (the per-round ratios). On a
shared machine only these same-run ratios mean anything. Both must give the same n-best lists;
the script counts the sentences where they do not.

    python benchmarks/bench_compiled_step.py --model runs/demo/m1/avg5 --sentences 60 --limit 200
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(ROOT / "runs" / "demo" / "m1" / "avg5"))
    p.add_argument("--split", default="test_2016_flickr")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--sentences", type=int, default=60, help="decoded one at a time")
    p.add_argument("--limit", type=int, default=200, help="sentences decoded in batches")
    p.add_argument("--rounds", type=int, default=3, help="batched rounds per decoding")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--step", choices=("compiled", "eager"), default="compiled",
                   help="the step function compiled (the product) or run eagerly")  # fmt: skip
    p.add_argument("--out", help="write the results as JSON here")
    return p.parse_args(argv)


def decodings(folder, cfg, step: str) -> dict:
    """Name -> a function translating a list of texts: the module code and the step function."""
    from aiayn.decode.translate import translate_hypotheses
    from aiayn.runtime.compiled import CompiledDecoding, CompiledStep, EagerRunner

    start = time.perf_counter()
    if step == "compiled":  # compiled into $AIAYN_CACHE (or loaded from it)
        model = folder.backend.compiled(replace(cfg, compile=True))
    else:
        module = folder.torch_module()
        model = CompiledDecoding(module, CompiledStep(module, EagerRunner(module)))
    first = time.perf_counter() - start
    return {
        "module": lambda texts: folder.translate_hypotheses(texts, cfg),
        step: lambda texts: translate_hypotheses(model, folder.tokenizer, texts, cfg),
        "first_call_seconds": first,
    }


def ratios(a: list[float], b: list[float]) -> dict:
    """Per-pair a/b: median and quartiles (one pair: itself)."""
    r = [x / y for x, y in zip(a, b)]
    q = statistics.quantiles(r, n=4) if len(r) > 1 else [r[0]] * 3
    return {"median": round(statistics.median(r), 3), "quartiles": [round(x, 3) for x in q]}


def alternate(run: dict, names: list[str], inputs: list[list[str]]) -> tuple[dict, dict]:
    """Each input decoded by each name in turn: seconds and n-best texts per name."""
    seconds: dict[str, list[float]] = {n: [] for n in names}
    texts: dict[str, list] = {n: [] for n in names}
    for texts_in in inputs:
        for name in names:
            start = time.perf_counter()
            out = run[name](texts_in)
            seconds[name].append(time.perf_counter() - start)
            texts[name].append([[t for t, _ in line] for line in out])
    return seconds, texts


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch

    from aiayn.data import load_translation
    from aiayn.decode import DecodeConfig
    from aiayn.env import cpu_name
    from aiayn.folder import load_model_folder
    from aiayn.folder.config import read_folder_config
    from aiayn.memory import keep_freed_memory

    torch.set_num_threads(args.threads)
    keep_freed_memory()
    src, _ = load_translation(read_folder_config(args.model).config.data, args.split)
    folder = load_model_folder([args.model], "cpu", workers=1)
    cfg = DecodeConfig(beam=args.beam, length_penalty="average", workers=1)
    run = decodings(folder, cfg, args.step)
    names = ["module", args.step]
    for name in names:
        run[name](src[:16])  # warm-up
    one, one_texts = alternate(run, names, [[s] for s in src[: args.sentences]])
    batched, batch_texts = alternate(run, names, [src[: args.limit]] * args.rounds)
    report = {
        "hardware": cpu_name(),
        "command": " ".join(["python benchmarks/bench_compiled_step.py", *(argv or sys.argv[1:])]),
        "load_average": [round(x, 1) for x in os.getloadavg()],
        "first_call_seconds": round(run["first_call_seconds"], 1),
        "batch1_sentences_per_s": {n: round(len(one[n]) / sum(one[n]), 1) for n in names},
        "batch1_speedup": ratios(one["module"], one[args.step]),
        "batched_sentences_per_s": {
            n: [round(args.limit / s, 1) for s in batched[n]] for n in names
        },
        "batched_speedup": ratios(batched["module"], batched[args.step]),
        "differing_sentences": sum(
            a != b
            for a, b in zip(
                one_texts["module"] + batch_texts["module"][:1],
                one_texts[args.step] + batch_texts[args.step][:1],
            )
        ),  # fmt: skip
    }
    print(json.dumps(report, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
