"""Score every two-model ensemble of several runs of one recipe: how much do the seeds move the result?

    .venv/bin/python scripts/seed_pairs.py --run runs/lr30/m1 runs/lr30/m2 runs/rep/m3 runs/rep/m4 \\
        runs/s56/m5 runs/s56/m6

Each run is one model of the recipe trained with its own seed. What trains beside a model does not
change it (training is deterministic given the seed), so any two runs make one draw of the
two-model recipe. For every pair, the pair is scored the way scripts/make_results.py scores the
headline: each model's last ``--avg`` checkpoints averaged, the two averages decoded as an ensemble
with beam 5, the length penalty α chosen on val (the first best wins a tie). Then test2016 and
test2017 are scored at that α, and at the α given in the recipe (``--recipe-alpha``), the latter
with cased BLEU and chrF beside the lower-cased BLEU. A user who keeps the config's α, without
tuning it, gets the second number. A third α is chosen once for all pairs, as the α with the best
mean val over the pairs: the recipe's α chosen on more seeds than its own, and test2016 is scored
at it too. Each model alone is scored at the recipe's α.
The pairs share models, so they are not independent draws. Their mean estimates what the recipe
scores with other seeds, but their spread understates the uncertainty of that mean. Writes
``--out``.json and ``--out``.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import statistics
from datetime import date
from pathlib import Path
from typing import Any

import torch

from aiayn.env import cpu_name
from aiayn.io import write_json
from make_results import ROOT, Scorer, averaged

TESTS = {"test2016": "test_2016_flickr", "test2017": "test_2017_flickr"}
SCORES = ("bleu_lc", "bleu", "chrf")


def seed(run: Path) -> int:
    return json.loads((run / "config.json").read_text())["train"]["seed"]


class Pair:
    """One two-model ensemble: its val scores over the α grid and its test scores, each decoded once."""

    def __init__(self, scorer: Scorer, runs: tuple[Path, Path], avgs: list[Path], beam: int) -> None:
        self.scorer, self.runs, self.avgs, self.beam = scorer, runs, avgs, beam
        self.val: dict[float, dict[str, float]] = {}
        self.tests: dict[tuple[str, float], dict[str, float]] = {}

    def tune(self, alphas: list[float]) -> float:
        self.val = {a: scores(self.scorer, self.avgs, "val", self.beam, a) for a in alphas}
        return max(alphas, key=lambda a: self.val[a]["bleu_lc"])  # max keeps the first of equal scores

    def test(self, name: str, alpha: float) -> dict[str, float]:
        """``name``'s scores (test2016 or test2017) at ``alpha``."""
        if (name, alpha) not in self.tests:
            self.tests[name, alpha] = scores(self.scorer, self.avgs, TESTS[name], self.beam, alpha)
        return self.tests[name, alpha]


def scores(scorer: Scorer, dirs: list[Path], split: str, beam: int, alpha: float) -> dict[str, float]:
    s = scorer.score(dirs, split, beam, alpha)
    return {k: s[k] for k in SCORES}


def score_pairs(scorer: Scorer, runs: list[Path], avgs: dict[Path, Path], alphas: list[float],
                recipe_alpha: float, beam: int) -> tuple[list[dict[str, Any]], float]:
    """Every pair of runs: α chosen on val for the pair, test2016 and test2017 at it and at the
    recipe's α; then one α chosen on the mean val of all pairs, and test2016 of every pair at it."""
    pairs, rows = [Pair(scorer, (x, y), [avgs[x], avgs[y]], beam)
                   for x, y in itertools.combinations(runs, 2)], []
    for pair in pairs:
        alpha = pair.tune(alphas)
        rows.append({"runs": [str(r) for r in pair.runs], "seeds": [seed(r) for r in pair.runs],
                     "alpha": alpha, "val": pair.val[alpha]["bleu_lc"],
                     **{name: pair.test(name, alpha)["bleu_lc"] for name in TESTS},
                     "val_recipe_alpha": pair.val[recipe_alpha]["bleu_lc"] if recipe_alpha in pair.val
                     else None,
                     **{f"{name}_recipe_alpha": pair.test(name, recipe_alpha)["bleu_lc"]
                        for name in TESTS},
                     "recipe_alpha_scores": {name: pair.test(name, recipe_alpha) for name in TESTS}})
    pooled = max(alphas, key=lambda a: statistics.mean(p.val[a]["bleu_lc"] for p in pairs))
    for pair, row in zip(pairs, rows):
        row.update(val_pooled_alpha=pair.val[pooled]["bleu_lc"],
                   test2016_pooled_alpha=pair.test("test2016", pooled)["bleu_lc"],
                   val_by_alpha={str(a): v["bleu_lc"] for a, v in pair.val.items()})
    return rows, pooled


def summary(values: list[float]) -> str:
    return (f"mean {statistics.mean(values):.2f}, median {statistics.median(values):.2f}, "
            f"min {min(values):.2f}, max {max(values):.2f}")


def report_md(r: dict[str, Any], target: float) -> str:
    a, b = r["recipe_alpha"], r["pooled_alpha"]
    runs = ", ".join(f"`{m['run']}` (seed {m['seed']})" for m in r["models"])
    lines = ["# Seed pairs: every two-model ensemble of the recipe's runs", "",
             f"*Written by `scripts/seed_pairs.py` on {r['date']}; {r['hardware']}; torch {r['torch']}.*", "",
             f"Runs: {runs}. "
             f"Each model's last {r['avg']} checkpoints averaged; beam {r['beam']}; sacreBLEU `-lc`. "
             f"α chosen on val from {', '.join(str(x) for x in r['alphas'])}, for each pair, and "
             f"once for all pairs (the best mean val: α={b}); the recipe's α is {a}.", "",
             f"| seeds | α (val) | val | test2016 | test2017 | val, α={a} | test2016, α={a} | "
             f"test2017, α={a} | val, α={b} | test2016, α={b} |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for p in r["pairs"]:
        va = "" if p["val_recipe_alpha"] is None else f"{p['val_recipe_alpha']:.2f}"
        lines.append(f"| {p['seeds'][0]}, {p['seeds'][1]} | {p['alpha']} | {p['val']:.2f} | "
                     f"{p['test2016']:.2f} | {p['test2017']:.2f} | {va} | "
                     f"{p['test2016_recipe_alpha']:.2f} | {p['test2017_recipe_alpha']:.2f} | "
                     f"{p['val_pooled_alpha']:.2f} | "
                     f"{p['test2016_pooled_alpha']:.2f} |")
    lines += ["", f"| seed alone | val, α={a} | test2016, α={a} | test2017, α={a} |",
              "|---|---:|---:|---:|"]
    lines += [f"| {m['seed']} | {m['val']:.2f} | {m['test2016']:.2f} | {m['test2017']:.2f} |"
              for m in r["models"]]
    pairs = r["pairs"]
    for key, name in (("test2016", "α chosen on val for each pair"), ("test2016_recipe_alpha", f"α={a}"),
                      ("test2016_pooled_alpha", f"α={b} (chosen on val for all pairs)")):
        vals = [p[key] for p in pairs]
        hit = sum(v >= target for v in vals)
        lines += ["", f"test2016 of the {len(pairs)} pairs, {name}: {summary(vals)}; "
                      f"{hit} of {len(pairs)} reach {target}."]
    for key, name in (("test2017", "α chosen on val for each pair"),
                      ("test2017_recipe_alpha", f"α={a}")):
        lines += ["", f"test2017 of the {len(pairs)} pairs, {name}: {summary([p[key] for p in pairs])}."]
    means = {(t, k): statistics.mean(p["recipe_alpha_scores"][t][k] for p in pairs)
             for t in TESTS for k in SCORES}
    cells = "; ".join(f"{t} {means[t, 'bleu_lc']:.2f} / {means[t, 'bleu']:.2f} / {means[t, 'chrf']:.2f}"
                      for t in TESTS)
    lines += ["", f"Means of the {len(pairs)} pairs at α={a}, BLEU `-lc` / cased / chrF: {cells}."]
    lines += ["", f"val of the pairs (α chosen on val): {summary([p['val'] for p in pairs])}.",
              "", f"Models alone, test2016: {summary([m['test2016'] for m in r['models']])}; "
                  f"test2017: {summary([m['test2017'] for m in r['models']])}.",
              "", "The pairs share models: they are not independent draws (see the script's docstring)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", required=True, type=Path, nargs="+", help="run folders, one model (seed) each")
    p.add_argument("--avg", type=int, default=10)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--alphas", type=float, nargs="+",
                   default=[0.6, 0.8, 1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.2, 2.4])
    p.add_argument("--recipe-alpha", type=float, default=1.4)
    p.add_argument("--target", type=float, default=42.0, help="test2016 -lc to count pairs against")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--limit", type=int, default=0, help="score only the first N sentences (a smoke test)")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "experiments" / "seed_pairs")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if len(args.run) < 2:
        p.error("--run: give at least two run folders")
    if args.limit and args.out == p.get_default("out"):
        p.error("--limit: give --out too, so that a smoke test does not overwrite docs/experiments/seed_pairs")
    scorer = Scorer(bf16_row=False, limit=args.limit, workers=args.workers)
    avgs = {run: averaged(run, args.avg) for run in args.run}
    models = [{"run": str(run), "seed": seed(run),
               **{k: scorer.score([avgs[run]], split, args.beam, args.recipe_alpha)["bleu_lc"]
                  for k, split in (("val", "val"), *TESTS.items())}} for run in args.run]
    rows, pooled = score_pairs(scorer, args.run, avgs, args.alphas, args.recipe_alpha, args.beam)
    report = {"date": str(date.today()), "hardware": cpu_name(), "torch": torch.__version__,
              "avg": args.avg, "beam": args.beam, "alphas": args.alphas,
              "recipe_alpha": args.recipe_alpha, "pooled_alpha": pooled, "models": models, "pairs": rows}
    write_json(args.out.with_suffix(".json"), report)
    args.out.with_suffix(".md").write_text(report_md(report, args.target))
    print(report_md(report, args.target))


if __name__ == "__main__":
    main()
