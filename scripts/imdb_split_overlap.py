"""How much a held-out IMDB split shares movies with the training reviews (docs/data.md).

IMDB has no movie ids in the mirror, so a crude proxy: for each of 400 sampled held-out reviews,
the largest Jaccard overlap of its set of capitalised words (names, titles) with that of any
training review. The official test set, whose movies are disjoint from training's, is the
reference. Run: ``AIAYN_DATA_MIRROR=../shared/data python scripts/imdb_split_overlap.py``
(``--sample 20 --limit 300``: the code paths in seconds, on the first 300 reviews of each split).
"""

from __future__ import annotations

import argparse
import random
import re

import torch

from aiayn.data import DataConfig, load_classification


def names(text: str) -> set[str]:
    return set(re.findall(r"\b[A-Z][a-z]{3,}\b", text))


def overlap(held_out: list[str], train: list[str], seed: int = 0,
            n: int = 400) -> tuple[float, float]:
    """(mean of the largest Jaccard overlap with a training review, share of reviews above 0.3),
    over ``n`` held-out reviews drawn at random."""
    sample = random.Random(seed).sample(held_out, n)
    sets_t, sets_h = [names(t) for t in train], [names(t) for t in sample]
    vocab = {w: i for i, w in enumerate(sorted(set().union(*sets_t, *sets_h)))}

    def matrix(sets: list[set[str]]) -> torch.Tensor:
        m = torch.zeros(len(sets), len(vocab))
        for row, s in enumerate(sets):
            m[row, [vocab[w] for w in s]] = 1.0
        return m

    t, h = matrix(sets_t), matrix(sets_h)
    inter = h @ t.T  # (400, N)
    union = h.sum(1, keepdim=True) + t.sum(1)[None] - inter
    best = (inter / union.clamp(min=1)).max(1).values
    return float(best.mean()), float((best > 0.3).float().mean())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sample", type=int, default=400, help="held-out reviews drawn per split")
    p.add_argument("--limit", type=int, default=0,
                   help="only the first N reviews of each split (a smoke test); 0: all")
    args = p.parse_args(argv)
    cfg = DataConfig(kind="classification", dataset="imdb")
    text = {s: load_classification(cfg, s)[0][: args.limit or None]
            for s in ("train", "val", "train_head", "val_tail", "train_full", "test")}
    for held, train in (("val", "train"), ("val_tail", "train_head"), ("test", "train_full")):
        mean, above = overlap(text[held], text[train], n=min(args.sample, len(text[held])))
        print(f"{held:9s} vs {train:10s}: mean largest overlap {mean:.3f}, {above:.1%} above 0.3")


if __name__ == "__main__":
    main()
