"""Make the figures and measured numbers of docs/walkthrough.md, from the code and from real runs.

    .venv/bin/python scripts/make_figures.py                       # what needs no run: PE, schedule, sizes
    .venv/bin/python scripts/make_figures.py --run RUN_DIR         # + learning curves and attention maps

RUN_DIR is a run folder of ``aiayn train`` (docs/figures/run.toml is the run used for the committed
figures); its ``best/`` model (or the latest weights) draws the attention maps. Everything lands in
``--out`` (docs/figures): PNGs, and numbers.json with every number the walkthrough quotes. Nothing
here is drawn or typed by hand: rerun the script and the walkthrough's figures are reproduced.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
from pathlib import Path

import torch

from aiayn.config import ModelConfig
from aiayn.viz import pyplot, save_figure

log = logging.getLogger("make_figures")

# Multi30k test 2016, line 1 (not seen in training).
DEFAULT_TEXT = "A man in an orange hat starring at something."


def unique_parameters(model: torch.nn.Module) -> int:
    """Parameters counted once even when tied (shared embeddings and output projection)."""
    return sum(p.numel() for p in model.parameters())  # .parameters() already skips duplicates


def model_sizes() -> dict:
    """§3.1–§3.4 sizes of the paper's models, measured on the built modules (37000-token vocab)."""
    from aiayn.model import Transformer

    out = {}
    for preset in ("base", "big"):
        cfg = ModelConfig.preset(preset)
        with torch.device("meta"):  # shapes only: no memory, no initialisation cost
            model = Transformer(cfg)
        layer = model.encoder.layers[0]
        out[preset] = {
            "parameters": unique_parameters(model),
            "embedding_parameters": model.src_embed.token.weight.numel(),
            "encoder_layer_parameters": sum(p.numel() for p in layer.parameters()),
            "attention_parameters_per_sublayer": sum(p.numel() for p in layer.self_attn.parameters()),
            "ffn_parameters_per_layer": sum(p.numel() for p in layer.feed_forward.parameters()),
            "decoder_layer_parameters": sum(p.numel() for p in model.decoder.layers[0].parameters()),
        }
    unshared = ModelConfig.preset("base", share_embeddings=False, tie_output=False)
    with torch.device("meta"):
        out["base"]["parameters_without_sharing"] = unique_parameters(Transformer(unshared))
    return out


def positional_figures(out: Path) -> dict:
    """§3.5: the table and the cosine similarity of one position with all others."""
    from aiayn.model.embeddings import sinusoidal_table
    from aiayn.viz.pe import pe_similarity, plot_pe, plot_pe_similarity

    save_figure(plot_pe(2048, 512), out / "pe.png", dpi=80)  # 2048 x 512 cells: keep it light
    save_figure(plot_pe_similarity(1000, 2048, 512, 50), out / "pe-similarity.png")
    sim = pe_similarity(sinusoidal_table(2048, 512).double(), 1000)
    return {"pe_cosine_similarity_pos1000": {
        f"offset_{k}": round(sim[1000 + k].item(), 4) for k in (1, 10, 100, 1000)}}


def schedule_figure(out: Path) -> dict:
    """§5.3: the learning rate of the base model (d_model 512, warmup 4000) by update."""
    from aiayn.train.schedule import noam_lr

    steps = list(range(1, 100_001, 50))
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.5), layout="constrained")
    for d_model, warmup in ((512, 4000), (512, 8000), (256, 4000)):
        ax.plot(steps, [noam_lr(s, d_model, warmup) for s in steps],
                label=f"d_model {d_model}, warmup {warmup}")
    ax.set(xlabel="update", ylabel="learning rate", title="lrate = d_model^-0.5 · min(step^-0.5, "
           "step · warmup^-1.5)  (§5.3, aiayn.train.schedule.noam_lr)")
    ax.legend()
    ax.grid(alpha=0.3)
    save_figure(fig, out / "lr-schedule.png")
    return {"noam_peak_lr_base": noam_lr(4000, 512, 4000)}


def run_figures(run: Path, out: Path, text: str, limit: int = 0) -> dict:
    """Learning curves of a real run, and attention maps of its model on a test sentence."""
    from aiayn.viz.attention import attention_of_model_dir, plot_attention
    from aiayn.viz.curves import plot_curves, read_metrics

    rows = read_metrics(run)
    save_figure(plot_curves(rows, title=f"aiayn train {run.name}"), out / "curves.png")
    model_dir = run / "best" if (run / "best" / "config.json").is_file() else run
    pair = attention_of_model_dir(model_dir, text, beam=1)
    depth = len(pair.maps.encoder)
    title = f"{text}  →  {pair.translation}   (greedy; {model_dir.name} model of the run)"
    save_figure(plot_attention(pair.maps, pair.src_tokens, pair.tgt_tokens, layers=[depth],
                               title=title), out / "attention-last-layer.png")
    save_figure(plot_attention(pair.maps, pair.src_tokens, pair.tgt_tokens, title=title),
                out / "attention-all.png", dpi=80)
    return {"run": _run_numbers(run, rows), "test_bleu": test_bleu(model_dir, limit=limit),
            "attention_example": {"text": text, "translation": pair.translation,
                                  "model": str(model_dir.name)}}


def test_bleu(model_dir: Path, split: str = "test_2016_flickr", limit: int = 0) -> dict:
    """§6.1: sacreBLEU of the model on a test split of its dataset (its first ``limit`` sentences
    when given), beam 4, α = 0.6 (as `aiayn evaluate MODEL_DIR --split SPLIT` computes it)."""
    import time

    from aiayn.data import load_translation
    from aiayn.eval import corpus_scores
    from aiayn.folder import load_model_folder

    folder = load_model_folder(model_dir, expect_kind="translation")
    src, ref = load_translation(folder.config.data, split)
    if limit:
        src, ref = src[:limit], ref[:limit]
    start = time.perf_counter()
    hyps = folder.translate(src, beam=4, alpha=0.6)
    seconds = time.perf_counter() - start
    scores = corpus_scores(hyps, ref)
    return {"split": split, "sentences": len(src), "beam": 4, "alpha": 0.6,
            "bleu": scores["bleu"], "bleu_signature": scores["bleu_signature"],
            "chrf": scores["chrf"], "sentences_per_s_one_cpu_thread": round(len(src) / seconds, 1)}


def _run_numbers(run: Path, rows: list[dict]) -> dict:
    valid = [r for r in rows if "valid_loss" in r]
    config = json.loads((run / "config.json").read_text(encoding="utf-8"))
    from aiayn.folder import load_model_dir

    model, _, _ = load_model_dir(run)
    last = rows[-1]
    numbers = {
        "config": {k: config[k] for k in ("model", "train") if k in config},
        "parameters": unique_parameters(model),
        "steps": last["step"], "wall_s": last["wall"],
        "tokens_per_s_median": statistics.median(
            r["tokens_per_s"] for r in rows if "tokens_per_s" in r),
        "first_loss": rows[0].get("loss"), "last_loss": last.get("loss"),
    }
    if valid:
        best = min(valid, key=lambda r: r["valid_loss"])
        numbers.update(best_valid_loss=best["valid_loss"], best_valid_step=best["step"],
                       best_valid_ppl=math.exp(best["valid_loss"]))
        if "valid_bleu" in best:
            numbers["valid_bleu_at_best"] = best["valid_bleu"]
    return numbers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, help="a run folder of `aiayn train`")
    parser.add_argument("--text", default=DEFAULT_TEXT, help="sentence of the attention figures")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "docs" / "figures")
    parser.add_argument("--limit", type=int, default=0,
                        help="score only the first N test sentences (a smoke test; needs --out)")
    args = parser.parse_args(argv)
    if args.limit and args.out == parser.get_default("out"):
        parser.error("--limit: give --out too, so that a smoke test does not overwrite docs/figures")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    numbers_file = args.out / "numbers.json"
    numbers = json.loads(numbers_file.read_text()) if numbers_file.is_file() else {}
    numbers["model_sizes"] = model_sizes()
    numbers.update(positional_figures(args.out))
    numbers.update(schedule_figure(args.out))
    if args.run is not None:
        numbers.update(run_figures(args.run, args.out, args.text, args.limit))
    numbers_file.write_text(json.dumps(numbers, indent=2) + "\n", encoding="utf-8")
    log.info("wrote figures and %s", numbers_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
