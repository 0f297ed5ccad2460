"""Choose a classifier's NBSVM scale (``model.nb_scale``) on a validation split.

    .venv/bin/python scripts/nb_scale.py runs/imdb/avg5 --split val_tail
    .venv/bin/python scripts/nb_scale.py runs/imdb/avg5 --split val_tail --write

The folder's classifier must have been trained with ``model.nb_ngrams`` (its fitted NBSVM is in its
weights). Its network's logits and NBSVM's scores are computed once for the split's texts; each
scale of ``--scales`` is then scored (accuracy and mean negative log-likelihood, the logits being
``network + scale × NBSVM``), as a translation's length penalty is chosen on val; the accuracy of
NBSVM alone is printed with them. ``--write`` puts the most accurate scale (the smallest among
ties) into the folder's config.json, which every later ``evaluate``, ``classify``, ``serve`` and
``export`` then uses. The split should be held out from training: a split the model was trained
on favours the network.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from aiayn.data.batching import TokenBatchSampler, pad_sequences
from aiayn.data.loaders import load_classification
from aiayn.decode.classify import MAX_TOKENS, encode_texts
from aiayn.errors import AiaynError
from aiayn.folder.load import load_model_folder
from aiayn.io import write_json

SCALES = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 12.0, 16.0, 24.0)


@torch.no_grad()
def network_and_nb(model: torch.nn.Module, ids: list[list[int]]) -> tuple[torch.Tensor, ...]:
    """(network logits, NBSVM scores) of token-id lists, in input order: (N, C) each."""
    c = model.cfg.n_classes  # type: ignore[union-attr]
    net, nb = torch.empty(len(ids), c), torch.empty(len(ids), c)
    sampler = TokenBatchSampler([max(len(x), 1) for x in ids], max_tokens=MAX_TOKENS, shuffle=False)
    scale, model.nb.scale = model.nb.scale, 0.0  # type: ignore[union-attr]
    try:
        for batch in sampler.batches(0):
            x = pad_sequences([ids[i] for i in batch], model.cfg.pad_id)  # type: ignore[union-attr]
            net[batch] = model(x).float()
            nb[batch] = model.nb.scores(x).float()  # type: ignore[union-attr]
    finally:
        model.nb.scale = scale  # type: ignore[union-attr]
    return net, nb


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("folder", help="a classifier model folder trained with model.nb_ngrams")
    ap.add_argument("--split", required=True, help="a held-out split of its dataset, e.g. val_tail")
    ap.add_argument("--scales", type=float, nargs="+", default=list(SCALES))
    ap.add_argument("--write", action="store_true", help="keep the best scale in config.json")
    args = ap.parse_args(argv)
    try:
        folder = load_model_folder(args.folder, expect_kind="classification")
        model = getattr(folder.backend, "model", None)
        if model is None or getattr(model, "nb", None) is None:
            raise AiaynError(f"{args.folder}: not a PyTorch classifier with model.nb_ngrams")
        texts, labels = load_classification(folder.config.data, args.split)
    except AiaynError as err:
        print(f"nb_scale: {err}", file=sys.stderr)
        return 2
    ids = [x[: folder.text_limit] for x in encode_texts(folder.tokenizer, texts)]
    gold = torch.tensor(labels)
    net, nb = network_and_nb(model, ids)
    rows = []
    for s in args.scales:
        logp = (net + s * nb).log_softmax(-1)
        acc = float((logp.argmax(-1) == gold).float().mean())
        nll = float(-logp[torch.arange(len(gold)), gold].mean())
        rows.append((s, acc, nll))
        print(f"nb_scale {s:<6g} accuracy {100 * acc:.2f}%  nll {nll:.4f}")
    alone = float((nb.argmax(-1) == gold).float().mean())
    print(f"NBSVM alone    accuracy {100 * alone:.2f}%")
    best = max(rows, key=lambda r: (r[1], -r[0]))[0]
    print(f"best on {args.split}: {best:g} (the folder's: {model.nb.scale:g})")
    if args.write:
        path = Path(args.folder) / "config.json"
        config = json.loads(path.read_text(encoding="utf-8"))
        config["model"]["nb_scale"] = best
        write_json(path, config)
        print(f"wrote model.nb_scale = {best:g} into {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
