"""Score a Multi30k run (and its ablations) and write the results tables of docs/experiments/log.md and docs/experiments/multi30k_en_de.md.

    .venv/bin/python scripts/make_results.py --run runs/en_de \\
        --ablation "post-LN, dropout 0.1=runs/abl_post_d01" --ablation "pre-LN, dropout 0.1=runs/abl_pre_d01"

For the main run: the last ``--avg`` checkpoints are averaged (``aiayn average``), the beam's length
penalty α is chosen on ``val`` (never on a test set; with several ``--avg`` counts, the count and α
are chosen together), then the last checkpoint and the average are
scored with greedy and beam search on val, test2016 and test2017 (sacreBLEU cased and ``-lc``,
chrF; the protocol of ``aiayn evaluate``). With several ``--run`` folders (models trained side by
side) the main result is their ensemble (``aiayn evaluate A B``): the same rows for the ensemble
of their last checkpoints and of their averages, then each member's average alone. Each ablation
run is averaged the same way and scored with the chosen beam on val and test2016. Ten test2016
sentences with their references are kept as samples. Everything lands in docs/experiments/multi30k_en_de.json, the
marked section of docs/experiments/multi30k_en_de.md and the marked table of docs/experiments/log.md: no number in those tables is
typed by hand.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import time
from datetime import date
from pathlib import Path
from typing import Any

import torch

from aiayn.env import cpu_name
from aiayn.io import write_json, write_section

log = logging.getLogger("make_results")
ROOT = Path(__file__).resolve().parent.parent
SPLITS = ("val", "test_2016_flickr", "test_2017_flickr")
SHORT = {"val": "val", "test_2016_flickr": "test2016", "test_2017_flickr": "test2017"}
SAMPLE_LINES = tuple(range(0, 1000, 100))  # test2016 lines 1, 101, …, 901
README_MARKS = ("<!-- results:begin -->", "<!-- results:end -->")
DOC_MARKS = ("<!-- make_results:begin -->", "<!-- make_results:end -->")
ANCHORS = [
    ("Wu et al. 2021, Transformer-tiny, 8,000 updates × ~8k tokens, avg 10, beam 5",
     "test2016 41.02 (tokenised lowercased BLEU ≈ sacreBLEU -lc)"),
    ("community PyTorch implementations", "35–36.5 (cased tokenised, or greedy, or De→En)"),
]


def run_info(run: Path) -> dict[str, Any]:
    """Wall-clock, updates and throughput of a run, from its metrics.jsonl and config.json."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in rows if "tokens_per_s" in r]
    valid = [r for r in rows if "valid_loss" in r]
    meta = json.loads((run / "config.json").read_text())
    return {"run": str(run), "updates": rows[-1]["step"], "wall_s": rows[-1]["wall"],
            "epochs": rows[-1].get("epoch"),
            "tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in train),
            "best_valid_loss": min(r["valid_loss"] for r in valid) if valid else None,
            "model": meta["model"], "data": meta["data"], "train": meta["train"]}


def ensemble_info(runs: list[Path]) -> dict[str, Any]:
    """:func:`run_info` of the first run, with every run's as ``members`` when there are several."""
    infos = [run_info(r) for r in runs]
    return infos[0] if len(infos) == 1 else {**infos[0], "members": infos}


def averaged(run: Path, last: int) -> Path:
    """RUN/avgN, made by ``aiayn average`` unless it is already there."""
    out = run / f"avg{last}"
    if not (out / "model.safetensors").is_file():
        from aiayn.train.average import average_checkpoints

        steps = average_checkpoints(run, last, out)
        log.info("averaged %s steps %s -> %s", run, steps, out)
    return out


class Scorer:
    """Decode and score models on the run's dataset splits, caching sources and references."""

    def __init__(self, bf16_row: bool, limit: int = 0, workers: int = 1) -> None:
        self.bf16, self.bf16_row, self.limit, self._sets = False, bf16_row, limit, {}
        self.workers = workers

    def test_set(self, folder: Any, split: str) -> tuple[list[str], list[str]]:
        from aiayn.data import load_translation

        if split not in self._sets:
            src, ref = load_translation(folder.config.data, split)
            self._sets[split] = (src[: self.limit], ref[: self.limit]) if self.limit else (src, ref)
        return self._sets[split]

    def score(self, model_dirs: list[Path], split: str, beam: int, alpha: float) -> dict[str, Any]:
        """Scores of one model folder, or of the ensemble of several, on ``split``."""
        from aiayn.eval import corpus_scores
        from aiayn.folder import load_model_folder

        folder = load_model_folder(model_dirs, "cpu", "translation")
        model_dir = " + ".join(str(d) for d in model_dirs)
        src, ref = self.test_set(folder, split)
        start = time.perf_counter()
        hyps = folder.translate(src, beam=beam, alpha=alpha, workers=self.workers, bf16=self.bf16)
        seconds = time.perf_counter() - start
        s = corpus_scores(hyps, ref)
        out = {"model": str(model_dir), "split": split, "beam": beam, "alpha": alpha,
               "bleu": s["bleu"], "bleu_lc": s["bleu_lc"], "chrf": s["chrf"],
               "bleu_signature": s["bleu_signature"], "bleu_lc_signature": s["bleu_lc_signature"],
               "chrf_signature": s["chrf_signature"], "sentences_per_s": len(src) / seconds,
               "hyps": hyps}
        log.info("%s %s beam %d α %.1f: BLEU-lc %.2f, BLEU %.2f, chrF %.2f (%.1f sent/s)", model_dir,
                 split, beam, alpha, out["bleu_lc"], out["bleu"], out["chrf"], out["sentences_per_s"])
        return out


def count_parameters(model_dirs: list[Path]) -> int:
    """Parameters of a model, or of all the models of an ensemble."""
    from aiayn.folder import load_model_folder

    folder = load_model_folder(model_dirs, "cpu", "translation")
    return sum(p.numel() for p in folder.parameters())


def main_run(scorer: Scorer, runs: list[Path], lasts: list[int], beam: int,
             alphas: list[float]) -> dict[str, Any]:
    """The recipe's table: α, and the number of checkpoints averaged when there are several
    candidates, chosen on val (the first best wins a tie); then every split scored once."""
    tuning = []
    for n_avg in lasts:
        avgs = [averaged(run, n_avg) for run in runs]
        tuning += [dict(scorer.score(avgs, "val", beam, a), avg=n_avg) for a in alphas]
    chosen = max(tuning, key=lambda r: r["bleu_lc"])
    alpha, last = chosen["alpha"], chosen["avg"]
    avgs = [averaged(run, last) for run in runs]
    n = len(runs)
    ens = f"ensemble of {n}: " if n > 1 else ""
    rows = []
    for name, model_dirs in ((f"{ens}last checkpoint{'s' if n > 1 else ''}", runs),
                             (f"{ens}average{'s' if n > 1 else ''} of last {last}", avgs)):
        for search, b in (("greedy", 1), (f"beam {beam}, α={alpha}", beam)):
            scores = {split: scorer.score(model_dirs, split, b, alpha) for split in SPLITS}
            rows.append({"weights": name, "search": search, "scores": scores})
    headline = len(rows) - 1  # average + beam, fp32: the recipe's result
    best = rows[headline]["scores"]["test_2016_flickr"]
    if scorer.bf16_row:  # the same decoding under bf16 autocast: does the faster precision cost BLEU?
        scorer.bf16 = True
        rows.append({"weights": rows[headline]["weights"],
                     "search": f"beam {beam}, α={alpha}, bf16 autocast",
                     "scores": {split: scorer.score(avgs, split, beam, alpha) for split in SPLITS}})
        scorer.bf16 = False
    if n > 1:  # what the ensemble adds: each member alone, decoded the same way
        for i, avg in enumerate(avgs, 1):
            rows.append({"weights": f"model {i} alone: average of last {last}",
                         "search": f"beam {beam}, α={alpha}",
                         "scores": {split: scorer.score([avg], split, beam, alpha) for split in SPLITS}})
    src, ref = scorer.test_set(json.loads((runs[0] / "config.json").read_text()), "test_2016_flickr")
    samples = [{"line": i + 1, "source": src[i], "reference": ref[i], "hypothesis": best["hyps"][i]}
               for i in SAMPLE_LINES if i < len(src)]
    return {"info": ensemble_info(runs), "parameters": count_parameters(runs), "alpha": alpha,
            "avg": last,
            "alpha_tuning": [{k: r[k] for k in ("avg", "alpha", "bleu", "bleu_lc")} for r in tuning],
            "rows": rows, "headline": headline, "samples": samples}


def ablation_run(scorer: Scorer, label: str, run: Path, last: int, beam: int,
                 alpha: float) -> dict[str, Any]:
    avg = averaged(run, last)
    splits = ("val", "test_2016_flickr")
    return {"label": label, "info": run_info(run),
            "scores": {split: scorer.score([avg], split, beam, alpha) for split in splits}}


def _cell(s: dict[str, Any]) -> str:
    return f"{s['bleu_lc']:.2f} / {s['bleu']:.2f} / {s['chrf']:.1f}"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def readme_table(r: dict[str, Any], signatures: str = "experiments/results_lr30.md") -> str:
    """The headline table (between README_MARKS); ``signatures`` links, relative to that page, to
    the run's own record."""
    m, i = r["main"], r["main"]["info"]
    headline = m["rows"][m["headline"]]["scores"]["test_2016_flickr"]["bleu_lc"]
    lines = [
        "*Written by `scripts/make_results.py`; edit outside the markers.* Cells: sacreBLEU `-lc` / "
        f"sacreBLEU cased / chrF (signatures in [{signatures}]({signatures})).", "",
        "| weights | search | val | test2016 | test2017 |", "|---|---|---:|---:|---:|"]
    for row in m["rows"]:
        s = row["scores"]
        lines.append(f"| {row['weights']} | {row['search']} | {_cell(s['val'])} | "
                     f"**{_cell(s['test_2016_flickr'])}** | {_cell(s['test_2017_flickr'])} |")
    lines += ["", f"Run `{r['command']}`: {_training(i)}, "
                  f"{m['parameters']:,} parameters; {r['hardware']}, {r['threads']}; "
                  f"torch {r['torch']}; {r['date']}. {_tuning_sentence(m)}", "",
              f"Target (issue 6): ≥ 41.0 sacreBLEU `-lc` on test2016 within 60 minutes — measured "
              f"{headline:.2f} ({'met' if headline >= 41.0 else 'not met'}).", "",
              "Anchors (not measured here): " + "; ".join(f"{who}: {what}" for who, what in ANCHORS) + "."]
    return "\n".join(lines)


def _tuning_sentence(m: dict[str, Any]) -> str:
    """What was chosen on val: α, and the number of checkpoints averaged if it was a choice."""
    alphas = list(dict.fromkeys(a["alpha"] for a in m["alpha_tuning"]))
    counts = list(dict.fromkeys(a.get("avg") for a in m["alpha_tuning"]))
    if len(counts) < 2:
        return f"The length penalty α={m['alpha']} was chosen on val from {', '.join(map(str, alphas))}."
    return (f"The length penalty α={m['alpha']} and the number of checkpoints averaged, "
            f"{m['avg']}, were chosen together on val from α {', '.join(map(str, alphas))} × the "
            f"last {', '.join(map(str, counts))} checkpoints.")


def _training(i: dict[str, Any]) -> str:
    """Updates, wall-clock and throughput of a run, or of an ensemble's runs side by side."""
    members = i.get("members", [i])
    if len(members) == 1:
        return (f"{i['updates']:,} updates ({i['epochs']} epochs) in {_minutes(i['wall_s'])} of "
                f"training (validation included), median {i['tokens_per_s_median']:,.0f} tokens/s "
                "(source + target)")
    updates = " / ".join(f"{m['updates']:,}" for m in members)
    epochs = " / ".join(str(m["epochs"]) for m in members)
    minutes = " / ".join(f"{m['wall_s'] / 60:.1f}" for m in members)
    speeds = " / ".join(f"{m['tokens_per_s_median']:,.0f}" for m in members)
    total = sum(m["tokens_per_s_median"] for m in members)
    return (f"{len(members)} models trained side by side, {updates} updates ({epochs} epochs) in "
            f"{minutes} min of training (validation included), median {speeds} tokens/s (source + "
            f"target; {total:,.0f} together)")


def _ablation_origin(ablations: list[dict[str, Any]]) -> str:
    """Where copied ablation rows were scored (``--ablations-from``), or nothing."""
    origins = sorted({(a["scored_on"], a["scored_at"]) for a in ablations if "scored_at" in a})
    return "".join(f" Scored on {day} at commit {commit} (kept from that report; the run folders "
                   "are not kept)." for day, commit in origins)


def copied_ablations(results_json: Path) -> tuple[list[dict[str, Any]], int]:
    """The ablation rows of an earlier report and their averaging, tagged with where they were scored.

    Copied, not re-measured: for when the ablation run folders are gone. Rows copied twice keep
    their first origin.
    """
    earlier = json.loads(results_json.read_text())
    origin = {"scored_at": earlier["aiayn_commit"], "scored_on": earlier["date"]}
    return [{**origin, **a} for a in earlier["ablations"]], earlier["ablation_avg"]


def results_doc(r: dict[str, Any]) -> str:
    m = r["main"]
    sig = m["rows"][m["headline"]]["scores"]["test_2016_flickr"]
    lines = ["*Written by `scripts/make_results.py`; edit outside the markers.*", "",
             "## Main run", "", readme_table(r).split("\n", 2)[2], "",
             f"Signatures: `{sig['bleu_lc_signature']}`, `{sig['bleu_signature']}`, "
             f"`{sig['chrf_signature']}`.", "",
             "Length penalty on val (average, beam): " + ", ".join(
                 ("" if a.get("avg") is None else f"last {a['avg']}, ")
                 + f"α={a['alpha']}: BLEU-lc {a['bleu_lc']:.2f}" for a in m["alpha_tuning"]) + ".", ""]
    if r["ablations"]:
        lines += ["## Ablation", "",
                  f"Each run averaged over its last {r['ablation_avg']} checkpoints, beam {r['beam']} "
                  f"α={r['ablations'][0]['scores']['val']['alpha']} (chosen on val for the main run). "
                  "Cells: sacreBLEU `-lc` / cased / chrF." + _ablation_origin(r["ablations"]), "",
                  "| run | model | updates | training | best valid loss | val | test2016 |",
                  "|---|---|---:|---:|---:|---:|---:|"]
        for a in r["ablations"]:
            i = a["info"]
            model = (f"{'pre' if i['model'].get('norm_first') else 'post'}-LN, dropout "
                     f"{i['model'].get('dropout')}")
            lines.append(f"| {a['label']} | {model} | {i['updates']:,} | {_minutes(i['wall_s'])} | "
                         f"{i['best_valid_loss']:.3f} | {_cell(a['scores']['val'])} | "
                         f"{_cell(a['scores']['test_2016_flickr'])} |")
        lines.append("")
    lines += ["## Ten test2016 translations", "",
              f"{m['rows'][m['headline']]['weights'].capitalize()} checkpoints, beam {r['beam']}, "
              f"α={m['alpha']}; "
              "lines 1, 101, …, 901 of test_2016_flickr.", ""]
    for s in m["samples"]:
        lines += [f"{s['line']}. **src** {s['source']}  ", f"   **ref** {s['reference']}  ",
                  f"   **aiayn** {s['hypothesis']}", ""]
    return "\n".join(lines)


def strip_hyps(obj: Any) -> Any:
    """The JSON without the full hypothesis lists (kept in the samples)."""
    if isinstance(obj, dict):
        return {k: strip_hyps(v) for k, v in obj.items() if k != "hyps"}
    if isinstance(obj, list):
        return [strip_hyps(v) for v in obj]
    return obj


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", required=True, type=Path, nargs="+",
                   help="the main run folder; several: their ensemble (models trained side by side)")
    p.add_argument("--ablation", action="append", default=[], metavar="LABEL=RUN_DIR")
    p.add_argument("--ablations-from", type=Path, metavar="RESULTS_JSON",
                   help="keep the ablation rows of an earlier report (its run folders are gone) "
                        "instead of scoring --ablation runs")
    p.add_argument("--avg", type=int, nargs="+", default=[10],
                   help="checkpoints averaged (default 10); several: chosen on val together with α")
    p.add_argument("--ablation-avg", type=int, default=5,
                   help="checkpoints averaged in each ablation run (default 5, as make demo)")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--alphas", type=float, nargs="+", default=[0.6, 0.8, 1.0])
    p.add_argument("--limit", type=int, default=0, help="score only the first N sentences (a smoke test)")
    p.add_argument("--workers", type=int, default=2,
                   help="batches decoded at once (DecodeConfig.workers; the output does not depend on it)")
    p.add_argument("--bf16-row", action="store_true",
                   help="also score the final decoding under bf16 autocast (a row of its own)")
    p.add_argument("--threads", default="2 processes (torchrun, gloo) of 1 thread each",
                   help="how the main run was trained, for the table")
    p.add_argument("--command", default="OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2 "
                   "-m aiayn train configs/multi30k_en_de.toml --out runs/en_de")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "experiments" / "multi30k_en_de")
    p.add_argument("--readme", type=Path, default=ROOT / "docs" / "experiments" / "log.md",
                   help="the page whose results:begin/end markers get the headline table")
    args = p.parse_args(argv)
    if args.limit and (args.out == p.get_default("out") or args.readme == p.get_default("readme")):
        p.error("--limit: give --out and --readme too, so that a smoke test does not overwrite "
                "docs/experiments")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    scorer = Scorer(args.bf16_row, args.limit, args.workers)
    if min(args.avg) < 1:
        p.error("--avg: each count must be at least 1")
    main_result = main_run(scorer, args.run, args.avg, args.beam, args.alphas)
    ablations, ablation_avg = [], args.ablation_avg
    if args.ablations_from:
        ablations, ablation_avg = copied_ablations(args.ablations_from)
    for spec in args.ablation:
        label, _, folder = spec.rpartition("=")
        ablations.append(ablation_run(scorer, label, Path(folder), args.ablation_avg, args.beam,
                                      main_result["alpha"]))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    report = {"date": str(date.today()), "hardware": cpu_name(), "threads": args.threads,
              "torch": torch.__version__, "aiayn_commit": commit, "command": args.command,
              "avg": main_result["avg"], "avg_choices": args.avg, "ablation_avg": ablation_avg,
              "beam": args.beam,
              "main": main_result, "ablations": ablations}
    write_json(args.out.with_suffix(".json"), strip_hyps(report))
    write_section(args.out.with_suffix(".md"), *DOC_MARKS, results_doc(report),
                  new_file="# Multi30k En→De results\n")
    link = os.path.relpath(args.out.with_suffix(".md"), args.readme.resolve().parent)
    write_section(args.readme, *README_MARKS, readme_table(report, Path(link).as_posix()))
    best = main_result["rows"][main_result["headline"]]["scores"]["test_2016_flickr"]
    print(f"test2016 sacreBLEU -lc {best['bleu_lc']:.2f}, cased {best['bleu']:.2f}, chrF {best['chrf']:.2f}"
          f" -> {args.out.with_suffix('.md')}, {args.readme}")


if __name__ == "__main__":
    main()
