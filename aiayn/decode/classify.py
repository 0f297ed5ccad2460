"""Classification with a trained encoder-only model: texts in, labels and probabilities out.

Shape legend: N texts · B batch · S longest text in the batch · C classes.

Texts go through the same steps as in training (:func:`encode_texts`: :func:`clean_text`, the
run's tokenizer, cut to the run's ``data.max_len``), are sorted by length into token-bounded
batches and padded; predictions come back in input order. Padding is masked out of attention and
pooling, so a text's prediction does not depend on which texts share its batch (tested).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from aiayn.data.batching import TokenBatchSampler, pad_sequences
from aiayn.data.clean import clean_text
from aiayn.decode.step import decoding_device
from aiayn.errors import ConfigError
from aiayn.model.classifier import TransformerClassifier

__all__ = [
    "LABEL_NAMES",
    "encode_texts",
    "predict_ids",
    "MAX_TOKENS",
    "evaluate_classifier",
]

# Names of the class ids of registered datasets (the data files store integer labels).
LABEL_NAMES: dict[str, tuple[str, ...]] = {"imdb": ("negative", "positive")}
# Default token budget of one inference batch: texts × padded length.
MAX_TOKENS = 16384


def encode_texts(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of cleaned ``texts`` (no BOS/EOS, not cut: callers cut to their ``max_len``)."""
    return tokenizer.encode_batch([clean_text(t) for t in texts])


@torch.no_grad()
def predict_ids(
    model: TransformerClassifier,
    items: Sequence[Sequence[int]],
    max_tokens: int | None = None,
    device: torch.device | str = "cpu",
) -> Tensor:
    """Class probabilities of token-id sequences, in input order. Shape: N lists -> (N, C) float32.

    Batches hold texts of similar length, at most ``max_tokens`` (default :data:`MAX_TOKENS`)
    padded tokens each.
    """
    if max_tokens is not None and max_tokens < 1:
        raise ConfigError(f"batch_tokens must be >= 1, got {max_tokens}")
    decoding_device(model, torch.device(device))  # eval mode for a torch module
    probs = torch.empty(len(items), model.cfg.n_classes)
    if not items:
        return probs
    lengths = [max(len(x), 1) for x in items]
    sampler = TokenBatchSampler(lengths, max_tokens=max_tokens or MAX_TOKENS, shuffle=False)
    for batch in sampler.batches(0):
        ids = pad_sequences([items[i] for i in batch], model.cfg.pad_id).to(device)  # (B, S)
        probs[batch] = model(ids).float().softmax(-1).cpu()  # (B, C)
    return probs


def evaluate_classifier(
    class_probs: Callable[[Sequence[Sequence[int]], int | None], Tensor],
    tokenizer: Any,
    texts: Sequence[str],
    labels: Sequence[int],
    limit: int,
    max_tokens: int | None = None,
) -> dict[str, Any]:
    """Accuracy (and counts, timing) of a classifier on labelled ``texts``, cut to ``limit``
    tokens as in training; ``class_probs(ids, max_tokens)`` runs it (a backend's, or
    :func:`predict_ids` over a model)."""
    start = time.perf_counter()
    ids = encode_texts(tokenizer, texts)
    n_cut = sum(len(x) > limit for x in ids)
    probs = class_probs([x[:limit] for x in ids], max_tokens)
    seconds = time.perf_counter() - start
    correct = int((probs.argmax(-1) == torch.as_tensor(list(labels))).sum())
    return {
        "accuracy": correct / max(len(texts), 1),
        "correct": correct,
        "n": len(texts),
        "cut_to_max_len": n_cut,
        "max_len": limit,
        "seconds": round(seconds, 3),
        "texts_per_s": round(len(texts) / max(seconds, 1e-9), 1),
    }
