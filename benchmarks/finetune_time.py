"""Time per update of a fine-tune of an OPUS-MT-sized model on this CPU, built locally (no Hub).

An OPUS-MT model is a Marian "base" Transformer: 6+6 post-LN layers, d_model 512, d_ff 2048,
8 heads, SiLU, sinusoids, one shared vocabulary of ~58k (opus-mt-en-de: 58,101) tied to the
output layer, a ``final_logits_bias``: about 74 M parameters. This builds a model folder of that
shape with random weights (a BPE tokenizer learnt on Multi30k; the model's vocabulary is padded to
``--vocab`` with tokens that never occur, so that the embedding, the output projection and its softmax cost what a 58k
vocabulary costs), then runs ``aiayn train configs/finetune.toml`` on Multi30k pairs for
``--steps`` updates, logging every update, and reads the wall-clock of each update from the run's
metrics.jsonl. The first ``--skip`` updates (allocations, first sight of each shape) are left out;
the rest give the median seconds per update, and the expected time per 1,000 updates.

    nice -n 10 python benchmarks/finetune_time.py --work /tmp/ft_time \
        --out docs/experiments/finetune_time_2026-12-06.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "configs" / "finetune.toml"


def multi30k(lang: str, n: int, skip: int = 0) -> list[str]:
    path = (
        Path(os.environ.get("AIAYN_DATA_MIRROR", "/nonexistent")) / "multi30k" / f"train.{lang}.gz"
    )
    if not path.is_file():
        sys.exit(f"{path}: not found (set AIAYN_DATA_MIRROR to the data mirror)")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.strip() for _, line in zip(range(skip + n), f)][skip:]


# OPUS-MT's shape (Marian base), and the smoke test's.
OPUS_MT = dict(d_model=512, n_heads=8, d_ff=2048, n_encoder_layers=6, n_decoder_layers=6)
SMOKE = dict(d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1, n_decoder_layers=1)


def build_folder(folder: Path, vocab: int, sizes: dict, lines: int, bpe: int) -> int:
    """A model folder of ``sizes`` with random weights (Marian's options, a ``vocab``-token
    vocabulary); its parameter count."""
    import torch

    from aiayn.folder import save_model_dir
    from aiayn.config import ModelConfig
    from aiayn.data.tokenizer import train_tokenizer
    from aiayn.model import Transformer

    tokenizer = train_tokenizer(multi30k("en", lines) + multi30k("de", lines), "bpe", bpe)
    # Tokens that never occur, up to the vocabulary of an OPUS-MT model: the run takes its
    # vocabulary from the tokenizer, so the embedding and the output layer have ``vocab`` rows.
    tokenizer.hf.add_tokens([f"<unused{i}>" for i in range(vocab - tokenizer.vocab_size)])
    assert tokenizer.vocab_size == vocab, tokenizer.vocab_size
    cfg = ModelConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, activation="silu", norm_first=False,
        sinusoid_layout="halves", final_logits_bias=True, share_embeddings=True, max_len=512,
        **sizes,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    save_model_dir(folder, model, cfg, tokenizer_json=tokenizer.to_str(), overwrite=True)
    return sum(p.numel() for p in model.parameters())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, required=True, help="folder for the model, data and run")
    ap.add_argument("--out", type=Path, required=True, help="the JSON record to write")
    ap.add_argument("--vocab", type=int, default=58101, help="model vocabulary (opus-mt-en-de's)")
    ap.add_argument("--steps", type=int, default=6, help="updates to run")
    ap.add_argument("--skip", type=int, default=2, help="first updates left out of the timing")
    ap.add_argument("--pairs", type=int, default=4000, help="Multi30k training pairs")
    ap.add_argument("--smoke", action="store_true", help="a d_model-16 model, seconds")
    args = ap.parse_args(argv)
    from aiayn.env import cpu_name

    sizes, lines, bpe = (SMOKE, 300, 500) if args.smoke else (OPUS_MT, 20000, 8000)
    if args.smoke:
        args.vocab, args.steps, args.skip, args.pairs = 800, 3, 1, 100
    work = args.work
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    for lang in ("en", "de"):
        (data / f"train.{lang}").write_text("\n".join(multi30k(lang, args.pairs)) + "\n")
        (data / f"valid.{lang}").write_text("\n".join(multi30k(lang, 4, skip=args.pairs)) + "\n")
    parameters = build_folder(work / "model", args.vocab, sizes, lines, bpe)
    run = work / "run"
    sets = {
        "train.init_from": work / "model",
        "data.train_src": data / "train.en", "data.train_tgt": data / "train.de",
        "data.valid_src": data / "valid.en", "data.valid_tgt": data / "valid.de",
        "train.max_steps": args.steps, "train.log_every": 1,
        "train.valid_every": 0, "train.save_every": 0, "train.warmup_steps": 1, "train.patience": 0,
    }  # fmt: skip
    trainer_argv = [
        sys.executable,
        "-m",
        "aiayn",
        "train",
        str(RECIPE),
        "--out",
        str(run),
        "--overwrite",
    ]
    for key, value in sets.items():
        trainer_argv += ["--set", f"{key}={value}"]
    started = time.time()
    proc = subprocess.run(trainer_argv, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(proc.stderr[-2000:])
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    train = [m for m in lines if "loss" in m and "step" in m and "wall" in m]
    walls = {m["step"]: m["wall"] for m in train}
    steps = sorted(walls)
    seconds = [round(walls[b] - walls[a], 3) for a, b in zip(steps, steps[1:])]
    timed = seconds[max(args.skip - 1, 0) :]
    per_update = statistics.median(timed)
    record = {
        "what": "seconds per update of `aiayn train configs/finetune.toml` on an OPUS-MT-sized "
        "model (random weights, built locally), Multi30k En->De pairs",
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu_name(),
        "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                 cwd=ROOT).stdout.strip(),
        "command": "python benchmarks/finetune_time.py "
        + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)),
        "threads": [line for line in proc.stderr.splitlines() if "threads:" in line][:1],
        "load_average_at_end": os.getloadavg(),
        "smoke": args.smoke,
        "model": {"parameters": parameters, "vocab": args.vocab, **sizes},
        "max_tokens": "the recipe's (configs/finetune.toml data.max_tokens)",
        "tokens_per_update": [round(m["tokens_per_s"] * s) for m, s in zip(train[1:], seconds)],
        "seconds_per_update": seconds,
        "timed_updates": len(timed),
        "median_seconds_per_update": per_update,
        "hours_per_1000_updates": round(per_update * 1000 / 3600, 2),
        "run_wall_s": round(time.time() - started, 1),
        "train_log_tail": proc.stderr.splitlines()[-12:],
    }  # fmt: skip
    args.out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({k: record[k] for k in ("seconds_per_update", "hours_per_1000_updates")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
