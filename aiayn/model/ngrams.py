"""Naive Bayes over a text's hashed n-grams, fused into the classifier's logits (not in the paper).

Shape legend: B batch · S sequence len · N n-gram slots (n · S) · C classes · H buckets.

Wang and Manning (2012), "Baselines and Bigrams", §2: multinomial naive Bayes over a text's
*binarized* n-grams (each counted once per text) is a strong sentiment baseline, and what it
knows (which n-grams go with which class, counted over the whole training set) is what a network
fitted by gradient descent in a few epochs learns slowest; Mesnil et al. (2015) combine it with
neural models. :class:`NaiveBayesNgrams` holds the counts (taken once from the training split
before the first update, kept in the weights file) and gives their class log-likelihoods, centred
over the classes. The classifier adds them, times ``model.nb_scale``, to its logits **outside
training** only (validation, evaluation, classification, export): shallow fusion, as an external
language model's scores join a translation model's at decoding (Gulcehre et al. 2015), with the
weight chosen on validation data. Trained together (the term in the training loss, with each text's
own counts left out, the scale learned or fixed) it gained nothing: the network memorises its
training texts in the second epoch and learns to ignore the term (docs/experiments/imdb.md, item
21); added to the network trained alone it gained 0.9 points there.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

_PRIME = 1_000_003
_MODULUS = 2_147_483_647  # 2**31 - 1: the running hash stays far below int64's range
_MIX = 2_654_435_761  # Knuth's multiplicative hash: a permutation mod _MODULUS, before the buckets


def ngram_buckets(ids: Tensor, pad_id: int, n: int, buckets: int) -> tuple[Tensor, Tensor]:
    """Each distinct hashed n-gram (orders 1 … n) of each row, once.

    Shape: ids (B, S) right-padded with ``pad_id`` -> (bucket ids (B, N), kept (B, N)): every
    bucket an n-gram of the row falls in appears once with ``kept`` true; the other slots are
    false (n-grams reaching into padding, and repeats of a bucket in the row)."""
    real = ids != pad_id  # (B, S)
    hashes, valid = [], []
    h = torch.zeros_like(ids)
    ok = torch.ones_like(real)
    for k in range(n):  # order k + 1: the tokens at i - k … i
        tok = torch.cat([ids.new_full((ids.size(0), k), pad_id), ids[:, : ids.size(1) - k]], 1)
        seen = torch.cat([real.new_zeros((ids.size(0), k)), real[:, : ids.size(1) - k]], 1)
        h = (h * _PRIME + tok + 1) % _MODULUS  # the order is in the hash: k + 1 tokens mixed in
        ok = ok & seen
        hashes.append((h * _MIX % _MODULUS + k) % buckets)
        valid.append(ok & real)
    b = torch.cat(hashes, 1).masked_fill(~torch.cat(valid, 1), -1)  # (B, N), -1 = not an n-gram
    b, _ = b.sort(dim=1)
    first = torch.cat([b.new_ones((b.size(0), 1), dtype=torch.bool), b[:, 1:] != b[:, :-1]], 1)
    kept = first & (b >= 0)
    return b.clamp(min=0), kept


class NaiveBayesNgrams(nn.Module):
    """Binarized multinomial naive Bayes over hashed n-grams (add-one smoothing), as a logit term.

    Buffers: ``counts`` (H, C), the training texts of each class that hold each bucket; ``texts``
    (C,), the training texts of each class. ``scale``: the weight of the scores in the logits."""

    counts: Tensor
    texts: Tensor

    def __init__(self, n: int, buckets: int, n_classes: int, pad_id: int, scale: float) -> None:
        super().__init__()
        self.n, self.buckets, self.pad_id, self.scale = n, buckets, pad_id, scale
        self.register_buffer("counts", torch.zeros(buckets, n_classes))
        self.register_buffer("texts", torch.zeros(n_classes))

    @torch.no_grad()
    def count(self, ids: Tensor, labels: Tensor) -> None:
        """Add a batch of training texts to the tables. Shape: ids (B, S), labels (B,)."""
        b, kept = ngram_buckets(ids, self.pad_id, self.n, self.buckets)
        rows = labels[:, None].expand_as(b)[kept]  # the class of each kept n-gram
        self.counts.index_put_(
            (b[kept], rows), torch.ones_like(rows, dtype=self.counts.dtype), True
        )
        self.texts.index_add_(0, labels, torch.ones_like(labels, dtype=self.texts.dtype))

    def scores(self, ids: Tensor) -> Tensor:
        """Naive Bayes log-likelihood of each class, centred over the classes.
        Shape: ids (B, S) -> (B, C)."""
        b, kept = ngram_buckets(ids, self.pad_id, self.n, self.buckets)
        k = kept[..., None].to(self.counts.dtype)  # (B, N, 1)
        loglik = ((self.counts[b] + 1.0).log() * k).sum(1)  # (B, C)
        totals = self.counts.sum(0)  # (C,)
        loglik = loglik - kept.sum(1, keepdim=True) * (totals + self.buckets).log()
        loglik = loglik + (self.texts + 1.0).log()  # the class prior, smoothed
        return loglik - loglik.mean(dim=1, keepdim=True)

    def forward(self, ids: Tensor) -> Tensor:
        """The logit term: ``scale`` × :meth:`scores`. Shape: (B, S) -> (B, C)."""
        return self.scale * self.scores(ids)
