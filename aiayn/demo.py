"""`make demo` until the headline recipe lands: the paper's base model on a real Multi30k batch.

Prepares Multi30k (download, or the mirror named by AIAYN_DATA_MIRROR), trains a joint BPE on
the training split, builds the `base` preset, runs one forward pass on a real validation batch and
prints the parameter summary and the untrained model's loss (≈ ln V, as it should be).
"""

from __future__ import annotations

import math
import sys

import torch
import torch.nn.functional as F

from aiayn import AiaynError, ModelConfig, Transformer
from aiayn.data import DataConfig, collate_translation, fit_tokenizer, load_translation
from aiayn.model.summary import format_summary, summarize


def main() -> int:
    cfg = DataConfig(dataset="multi30k", vocab_size=8000)
    tokenizer = fit_tokenizer(cfg)
    src, tgt = load_translation(cfg, "val")
    pairs = [(tokenizer.encode(s), tokenizer.encode(t)) for s, t in zip(src[:8], tgt[:8])]
    batch = collate_translation(pairs, tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id)
    V = tokenizer.vocab_size
    torch.manual_seed(0)
    model = Transformer(ModelConfig.preset("base", src_vocab_size=V, tgt_vocab_size=V)).eval()
    rows, total = summarize(model, lambda: model(batch.src, batch.tgt_in))
    print(format_summary(rows, total, title=f"base preset, joint BPE {V}, one real batch"))
    with torch.no_grad():
        logits = model(batch.src, batch.tgt_in)  # (B, T, V)
    loss = F.cross_entropy(logits.flatten(0, 1), batch.tgt_out.flatten(), ignore_index=tokenizer.pad_id)
    print(f"\nsource[0]: {src[0]}\ntarget[0]: {tgt[0]}")
    print(f"batch: src {tuple(batch.src.shape)}, tgt {tuple(batch.tgt_in.shape)}; "
          f"untrained loss {loss.item():.3f} nats/token (ln V = {math.log(V):.3f})")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AiaynError as err:
        print(f"aiayn: error: {err}", file=sys.stderr)
        sys.exit(2)
