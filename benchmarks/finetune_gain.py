"""The gain of fine-tuning over training from scratch on a small corpus (docs/finetuning.md#measured).

Shows the fine-tuning workflow on what is here (no model hub): Multi30k En->De's training set is
split (seeded) into "most" and ``--held`` held-back pairs, written as files. Then, each step a
command of aiayn's CLI:

1. base:    ``aiayn train configs/multi30k_quick.toml`` on "most", post-LN (the `--format hf`
            export takes post-LN models), for ``--base-steps`` updates (cosine over updates);
2. export:  ``aiayn export BASE --format hf``, then ``aiayn import hf`` of that export;
3. ft:      ``aiayn train configs/finetune.toml --set train.init_from=IMPORTED`` on the held-back
            pairs for ``--steps`` updates (the recipe's settings otherwise), and once more with
            the recipe's peak lr a tenth of the base's and a warm-up of a quarter of the budget
            (the recipe's warm-up was 200 updates when this ran on 2026-11-29; it is 30 now);
4. scratch: the base's recipe and model shape, from random weights, on the same held-back pairs
            for the same ``--steps`` updates and the same batch budget (data.max_tokens), its
            warm-up cut to a quarter of the budget;
5. ``aiayn evaluate --beam 5`` of the base, the imported base, both fine-tuned models and the
   from-scratch one on test2016 (Multi30k's test_2016_flickr), with the same decoding flags.

``--reuse`` keeps the steps that an earlier run with the same commands finished.

Budgets are update counts, not seconds, so that a busy machine changes the wall time (recorded)
but not the models. Writes a JSON record (BLEU of each model, commands, settings, wall seconds).

    python benchmarks/finetune_gain.py --work runs/finetune_gain \
        --out docs/experiments/finetune_gain_2026-11-29.json
    python benchmarks/finetune_gain.py --smoke --work /tmp/fg --out /tmp/fg.json   # seconds
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import random
import shlex
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASE_CONFIG = ROOT / "configs" / "multi30k_quick.toml"
FT_CONFIG = ROOT / "configs" / "finetune.toml"
DECODE = ["--alpha", "0.6", "--set", "decode.length_penalty=gnmt", "--set", "decode.max_len_a=1.0",
          "--set", "decode.max_len_b=50"]


def mirror() -> Path:
    path = Path(os.environ.get("AIAYN_DATA_MIRROR", "/nonexistent")) / "multi30k"
    if not (path / "train.en.gz").is_file():
        raise SystemExit(f"needs the Multi30k mirror ({path}/train.en.gz; set AIAYN_DATA_MIRROR)")
    return path


def read_gz(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def write_lines(path: Path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def split_data(work: Path, held: int, seed: int, limit: int) -> dict[str, str]:
    """most.{en,de} and held.{en,de} (a seeded split of the training pairs), val and test2016."""
    src = mirror()
    en, de = read_gz(src / "train.en.gz"), read_gz(src / "train.de.gz")
    assert len(en) == len(de)
    order = list(range(len(en)))
    random.Random(seed).shuffle(order)
    held_ids, most_ids = sorted(order[:held]), sorted(order[held:])
    if limit:  # smoke: a few pairs of each
        most_ids, held_ids = most_ids[:limit], held_ids[:limit]
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    files = {
        "most_src": write_lines(data / "most.en", [en[i] for i in most_ids]),
        "most_tgt": write_lines(data / "most.de", [de[i] for i in most_ids]),
        "held_src": write_lines(data / "held.en", [en[i] for i in held_ids]),
        "held_tgt": write_lines(data / "held.de", [de[i] for i in held_ids]),
    }
    for name, split in (("valid", "val"), ("test", "test_2016_flickr")):
        for side, lang in (("src", "en"), ("tgt", "de")):
            lines = read_gz(src / f"{split}.{lang}.gz")
            files[f"{name}_{side}"] = write_lines(data / f"{split}.{lang}", lines[: limit or None])
    files["held_pairs"] = len(held_ids)  # type: ignore[assignment]
    files["most_pairs"] = len(most_ids)  # type: ignore[assignment]
    return files


def aiayn(args: list[str], log: Path, inprocess: bool = False) -> dict:
    """``python -m aiayn ARGS`` in a subprocess (its own threads and memory; its output in
    ``log``), or in this process (the smoke run: no start-up per command); its wall time."""
    cmd = [sys.executable, "-m", "aiayn", *args]
    start = time.perf_counter()
    if inprocess:
        from aiayn.cli import main as aiayn_main

        code = aiayn_main(args)
    else:
        with log.open("w", encoding="utf-8") as out:
            code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    wall = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"failed ({code}): {shlex.join(cmd)}; see {log}")
    return {"command": "aiayn " + shlex.join(args), "wall_s": round(wall, 1)}


def sets(values: dict[str, object]) -> list[str]:
    out: list[str] = []
    for key, value in values.items():
        out += ["--set", f"{key}={value}"]
    return out


def rel(path: Path | str) -> str:
    """A path as the record shows it (relative to the checkout where it can be)."""
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="folder for data, runs, models")
    parser.add_argument("--out", type=Path, required=True, help="the JSON record to write")
    parser.add_argument("--held", type=int, default=1000, help="held-back training pairs")
    parser.add_argument("--base-steps", type=int, default=600, help="updates of the base model")
    parser.add_argument("--steps", type=int, default=200, help="updates of fine-tune and scratch")
    parser.add_argument("--max-tokens", type=int, default=4096, help="padded tokens per batch")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--lr", type=float, default=2e-3, help="peak lr of base and scratch")
    parser.add_argument("--warmup", type=int, default=150, help="warm-up of base and scratch")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="a d_model-16 model, 2 updates")
    parser.add_argument("--reuse", action="store_true",
                        help="keep the steps an earlier run of the same commands finished")
    args = parser.parse_args(argv)

    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    limit = 40 if args.smoke else 0
    files = split_data(work, args.held, args.seed, limit)
    own = {"data.dataset": "", "data.valid_src": files["valid_src"],
           "data.valid_tgt": files["valid_tgt"], "data.max_tokens": args.max_tokens}
    # The base's recipe (configs/multi30k_quick.toml) with post-LN and an update budget: the
    # cosine decays over updates, not seconds (robust to a shared machine).
    recipe = {"model.norm_first": "false", "train.schedule_clock": "updates", "train.max_time": 0,
              "train.save_every": 0, "train.metrics_every": 0, "train.best_metric": "valid_loss",
              "train.lr": args.lr, "train.warmup_steps": args.warmup}
    if args.smoke:
        recipe |= {"model.d_model": 16, "model.n_heads": 2, "model.d_ff": 32,
                   "model.n_encoder_layers": 1,
                   "model.n_decoder_layers": 1, "data.vocab_size": 120,
                   "train.warmup_steps": 1, "model.max_len": 64, "data.max_len": 64}
        args.base_steps, args.steps, args.beam = 2, 2, 2

    def train_sets(steps: int, prefix: str) -> dict[str, object]:
        return {"data.train_src": files[f"{prefix}_src"], "data.train_tgt": files[f"{prefix}_tgt"],
                "train.max_steps": steps, "train.valid_every": max(1, steps // 4),
                "train.save_every": max(1, steps // 4), "train.log_every": max(1, steps // 20)}

    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    base, hf, imported = work / "base", work / "base_hf", work / "base_imported"
    ft, scratch = work / "finetuned", work / "scratch"
    ft_short = work / "finetuned_short_warmup"
    scratch_warmup = min(args.warmup, max(1, args.steps // 4))
    steps: dict[str, dict] = {}
    inproc = args.smoke

    done = work / "steps.json"  # each finished step, for --reuse
    before = json.loads(done.read_text()) if args.reuse and done.is_file() else {}

    def run(name: str, argv_: list[str], output: Path | None = None) -> None:
        command = "aiayn " + shlex.join(argv_)
        if name in before and before[name]["command"] == command:
            steps[name] = before[name]
        elif args.reuse and output is not None and (output / "config.json").is_file():
            # done by an earlier invocation that recorded no steps.json (its wall time unknown)
            steps[name] = {"command": command, "wall_s": None, "reused": True}
        else:
            steps[name] = aiayn(argv_, logs / f"{name}.log", inproc)
        done.write_text(json.dumps(steps, indent=2))

    run("base", ["train", str(BASE_CONFIG), "--out", str(base), "--overwrite",
                 *sets(own | recipe | train_sets(args.base_steps, "most"))], base / "best")
    run("export", ["export", str(base / "best"), "--format", "hf", "-o", str(hf), "--overwrite"],
        hf)
    run("import", ["import", "hf", str(hf), "-o", str(imported), "--overwrite"], imported)
    # The fine-tuning recipe as it ships: only the budget, validation and data are set.
    ft_sets = own | train_sets(args.steps, "held") | {"train.init_from": str(imported),
                                                      "train.metrics_every": 0,
                                                      "train.best_metric": "valid_loss"}
    run("finetune", ["train", str(FT_CONFIG), "--out", str(ft), "--overwrite", *sets(ft_sets)],
        ft / "best")
    # The same recipe with its peak lr a tenth of the base's and the scratch run's warm-up (the
    # recipe's own warm-up was 200 updates on 2026-11-29, longer than a short budget; now 30).
    short = {"train.lr": args.lr / 10, "train.warmup_steps": scratch_warmup}
    run("finetune_short_warmup", ["train", str(FT_CONFIG), "--out", str(ft_short), "--overwrite",
                                  *sets(ft_sets | short)], ft_short / "best")
    # From scratch: the base's recipe, its warm-up cut to a quarter of the budget (the cosine
    # needs max_steps > warmup_steps).
    run("scratch", ["train", str(BASE_CONFIG), "--out", str(scratch), "--overwrite",
                    *sets(own | recipe | train_sets(args.steps, "held")
                          | {"train.warmup_steps": scratch_warmup})], scratch / "best")

    models = {"base": base / "best", "base_imported": imported, "finetuned": ft / "best",
              "finetuned_short_warmup": ft_short / "best", "scratch": scratch / "best"}
    scores: dict[str, dict] = {}
    for name, folder in models.items():
        out = work / f"eval_{name}.json"
        # The same decoding for all four (aiayn's defaults; an imported folder would otherwise
        # take the export's generation settings: another length penalty, no per-length cap).
        run(f"evaluate_{name}", ["evaluate", str(folder), "--src", files["test_src"], "--ref",
                                 files["test_tgt"], "-o", str(out), "-q", *DECODE,
                                 "--beam", str(args.beam)])
        scores[name] = json.loads(out.read_text(encoding="utf-8"))

    def bleu(name: str) -> dict:
        s = scores[name]
        keep = ("bleu", "bleu_lc", "chrf", "bleu_signature", "n", "sentences_per_s")
        return {k: s[k] for k in keep if k in s} or s

    def valid_losses(run: Path) -> list[list[float]]:
        """(update, validation loss) of each validation of a run."""
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return [[r["step"], round(r["valid_loss"], 4)] for r in rows if "valid_loss" in r]

    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model_name = next((line.split(":", 1)[1].strip() for line in cpu.splitlines()
                       if line.startswith("Model name")), platform.processor())
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    record = {
        "what": "fine-tuning a model trained on most of Multi30k (exported --format hf, imported) "
                "on held-back pairs, against training from scratch on them for the same updates",
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": f"{model_name}, {os.cpu_count()} cores",
        "commit": commit,
        "smoke": args.smoke,
        "command": "python benchmarks/finetune_gain.py " + shlex.join(argv or sys.argv[1:]),
        "split": {"seed": args.seed, "most_pairs": files["most_pairs"],
                  "held_pairs": files["held_pairs"], "valid": "Multi30k val",
                  "test": "Multi30k test_2016_flickr"},
        "settings": {"base_updates": args.base_steps, "updates": args.steps,
                     "max_tokens": args.max_tokens, "base_and_scratch_lr": args.lr,
                     "base_warmup": args.warmup, "scratch_warmup": scratch_warmup, "decode": DECODE + ["--beam", str(args.beam)]},
        "test2016": {name: bleu(name) for name in models},
        "valid_loss": {name: valid_losses(run) for name, run in
                       (("base", base), ("finetuned", ft), ("finetuned_short_warmup", ft_short),
                        ("scratch", scratch))},
        "steps": steps,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    summary = {name: record["test2016"][name].get("bleu") for name in models}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
