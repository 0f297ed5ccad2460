"""NBSVM over a text's hashed word n-grams, fused into the classifier's logits (not in the paper).

Shape legend: B batch · S sequence len · N n-gram slots (n · S) · C classes · H buckets · V vocab.

Wang and Manning (2012), "Baselines and Bigrams", §2: a linear model over a text's *binarized*
word n-grams (each counted once per text), each n-gram's feature scaled by its naive Bayes
log-count ratio r (how much likelier it is in one class than in the others, counted over the
training set), is a strong sentiment baseline (NBSVM; here with the logistic loss, as in Mesnil et
al. 2015, who combine it with neural models). What it knows, which of millions of n-grams go with
which class, is what a network fitted by gradient descent in a few epochs learns slowest.

:class:`NBSVM` holds the fitted model as one table of weights per bucket and class (the
products r × w) and a bias, kept in the weights file. The task fits it once, on the training split,
before the network's first update (:meth:`NBSVM.fit`; not again on resume, nor when the run starts
from a folder that holds it). The classifier adds its scores, centred over the classes and times
``model.nb_scale``, to its logits **outside training** only (validation, evaluation,
classification, export): shallow fusion, as an external language model's scores join a
translation model's at decoding (Gulcehre et al. 2015), with the weight chosen on validation data. The network is trained alone: trained together, the term
gained nothing (docs/experiments/imdb.md, item 21).

Words are rebuilt from the subword ids: a piece that begins with a space, or whose first character
is not of the class (letter, digit, other) that ends the piece before it, begins a word; every
punctuation piece is a word of its own; words are lower-cased and hashed by their characters, so a
word of letters (or of digits) hashes the same however it was split. The tables that say this per
piece (``piece_*``) come from the tokenizer (:meth:`NBSVM.set_pieces`). With more than two
classes there is one model per class against the others (their scores are not calibrated
against each other). Weights files written before NBSVM (multinomial naive Bayes counts over
token n-grams) load as what they were (:meth:`NBSVM.upgrade_state_dict_named`).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

_PRIME = 1_000_003
_MODULUS = 2_147_483_647  # 2**31 - 1: the running hash stays far below int64's range
_MIX = 2_654_435_761  # Knuth's multiplicative hash: a permutation mod _MODULUS, before the buckets
_LETTER, _DIGIT, _OTHER = 0, 1, 2
_LONGEST_WORD = 4096  # characters with a power of their own: beyond, the first ones share one
C_REG = 0.1  # the inverse L2 strength of the logistic regression (liblinear's C), as in NBSVM
LBFGS_STEPS = 100


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


def _token_tables(vocab_size: int) -> dict[str, Tensor]:
    """The piece tables under which each token is a word of its own, its id its hash."""
    v = vocab_size
    return {
        "piece_hash": torch.arange(v, dtype=torch.long),
        "piece_len": torch.zeros(v, dtype=torch.long),
        "piece_space": torch.ones(v, dtype=torch.bool),
        "piece_first": torch.full((v,), _OTHER, dtype=torch.long),
        "piece_last": torch.full((v,), _OTHER, dtype=torch.long),
        "piece_skip": torch.zeros(v, dtype=torch.bool),
    }


def _char_class(ch: str) -> int:
    return _LETTER if ch.isalpha() else _DIGIT if ch.isdigit() else _OTHER


def word_hash(word: str) -> int:
    """The hash :meth:`NBSVM.words` gives a word: of its lower-cased characters."""
    return _text_hash(word.lower())


def _text_hash(text: str) -> int:
    h = 0
    for ch in text:
        h = (h * _PRIME + ord(ch) + 1) % _MODULUS
    return h


class NBSVM(nn.Module):
    """NBSVM (logistic loss) over hashed binarized word n-grams, as a logit term.

    Buffers: ``weight`` (H, C) and ``bias`` (C,), the fitted model; ``piece_hash``,
    ``piece_len``, ``piece_space``, ``piece_first``, ``piece_last`` and ``piece_skip`` (V,), what
    each vocabulary piece adds to a word (:meth:`set_pieces`). Until those are set every piece is a
    word of its own (token n-grams). ``scale``: the weight of the scores in the logits."""

    weight: Tensor
    bias: Tensor
    powers: Tensor
    piece_hash: Tensor
    piece_len: Tensor
    piece_space: Tensor
    piece_first: Tensor
    piece_last: Tensor
    piece_skip: Tensor

    def __init__(
        self, n: int, buckets: int, n_classes: int, pad_id: int, scale: float, vocab_size: int
    ) -> None:
        super().__init__()
        self.n, self.buckets, self.pad_id, self.scale = n, buckets, pad_id, scale
        self.register_buffer("weight", torch.zeros(buckets, n_classes))
        self.register_buffer("bias", torch.zeros(n_classes))
        for name, table in _token_tables(vocab_size).items():
            self.register_buffer(name, table)
        powers = [1]
        for _ in range(_LONGEST_WORD - 1):
            powers.append(powers[-1] * _PRIME % _MODULUS)
        self.register_buffer("powers", torch.tensor(powers), persistent=False)

    def set_pieces(self, texts: Sequence[str]) -> None:
        """Read the vocabulary: ``texts[i]`` is piece i's text as decoded alone (a leading space
        if it begins a spaced word; "" for special tokens, which are left out of words)."""
        if len(texts) != self.piece_hash.numel():
            raise ValueError(
                f"{len(texts)} piece texts for a vocabulary of {self.piece_hash.numel()}"
            )
        stripped = [t.lstrip().lower() for t in texts]
        self.piece_hash.copy_(torch.tensor([_text_hash(s) for s in stripped]))
        self.piece_len.copy_(torch.tensor([len(s) for s in stripped]))
        self.piece_space.copy_(torch.tensor([t[:1].isspace() for t in texts]))
        self.piece_first.copy_(torch.tensor([_char_class(s[0]) if s else _OTHER for s in stripped]))
        self.piece_last.copy_(torch.tensor([_char_class(s[-1]) if s else _OTHER for s in stripped]))
        self.piece_skip.copy_(torch.tensor([not s for s in stripped]))

    def words(self, ids: Tensor) -> Tensor:
        """The hashed words of each row, left-aligned, -1 after the last.
        Shape: ids (B, S) -> (B, S)."""
        real = (ids != self.pad_id) & ~self.piece_skip[ids]  # (B, S): pieces inside words
        first, last = self.piece_first[ids], self.piece_last[ids]
        before = torch.cat([last.new_full((ids.size(0), 1), -1), last[:, :-1]], 1)
        before = before.masked_fill(
            ~torch.cat([real.new_zeros((ids.size(0), 1)), real[:, :-1]], 1), -1
        )
        new = real & (self.piece_space[ids] | (first == _OTHER) | (first != before))
        at = (new.long().cumsum(1) - 1).clamp(min=0)  # (B, S): the word each piece is in
        length = self.piece_len[ids] * real
        through = length.cumsum(1)  # characters up to and including each piece
        zeros = torch.zeros_like(ids)
        total = zeros.scatter_add(1, at, length)  # (B, S): characters of each word
        start = zeros.scatter_add(1, at, (through - length) * new)  # characters before each word
        after = total.gather(1, at) - (through - start.gather(1, at))  # in the word, after a piece
        power = self.powers[after.clamp(max=_LONGEST_WORD - 1)]
        part = (self.piece_hash[ids] * power % _MODULUS) * real  # the piece's share of the hash
        words = zeros.scatter_add(1, at, part) % _MODULUS
        count = new.sum(1, keepdim=True)
        slot = torch.arange(ids.size(1), device=ids.device)[None]
        return words.masked_fill(slot >= count, -1)

    def buckets_of(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """Each distinct hashed word n-gram of each row once: see :func:`ngram_buckets`."""
        return ngram_buckets(self.words(ids), -1, self.n, self.buckets)

    def scores(self, ids: Tensor) -> Tensor:
        """The linear model's score of each class, centred over the classes.
        Shape: ids (B, S) -> (B, C)."""
        b, kept = self.buckets_of(ids)
        s = (self.weight[b] * kept[..., None].to(self.weight.dtype)).sum(1) + self.bias  # (B, C)
        return s - s.mean(dim=1, keepdim=True)

    def forward(self, ids: Tensor) -> Tensor:
        """The logit term: ``scale`` × :meth:`scores`. Shape: (B, S) -> (B, C)."""
        return self.scale * self.scores(ids)

    @torch.no_grad()
    def fit(self, batches: Iterable[tuple[Tensor, Tensor]]) -> dict[str, Any]:
        """Fit the model on training texts: ``batches`` of (ids (B, S), labels (B,)).

        Per class c (once for two classes): r = log((1 + n_c) / |1 + n_c|) - log((1 + n_¬c) /
        |1 + n_¬c|) with n the texts of c (of the other classes) that hold each bucket; then L2
        logistic regression of "is c" on the binarized features scaled by r, minimising
        ½|w|² + C_REG × the summed loss (full batch, L-BFGS). Returns what it found, to log."""
        t0 = time.perf_counter()
        cols, ys = [], []
        for ids, labels in batches:
            b, kept = self.buckets_of(ids)
            cols += [r[k] for r, k in zip(b, kept)]
            ys.append(labels)
        c = self.weight.size(1)
        if not ys or not sum(len(labels) for labels in ys):
            raise ValueError("NBSVM has no training text to fit on")
        y = torch.cat(ys)
        if int(y.min()) < 0 or int(y.max()) >= c:
            raise ValueError(
                f"NBSVM: labels must lie in 0 … {c - 1}, got {int(y.min())} … {int(y.max())}"
            )
        lengths = torch.tensor([len(x) for x in cols])
        # the buckets some text holds, numbered 0 … U - 1: the others keep weight 0
        used, col = torch.unique(torch.cat(cols), return_inverse=True)
        index = torch.int32 if len(col) < 2**31 else torch.int64  # CSR indices
        crow = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(index)
        counts = torch.zeros(len(used), c)
        counts.index_put_(
            (col, y.repeat_interleave(lengths)), torch.ones(len(col)), accumulate=True
        )
        col = col.to(index)
        unused = self.buckets - len(used)  # buckets no text holds: a count of 0 (+1) each
        weight, bias, margins = torch.zeros_like(counts), torch.zeros(c), torch.zeros(len(y), c)
        for k in [1] if c == 2 else range(c):
            p = counts[:, k] + 1.0
            q = counts.sum(1) - counts[:, k] + 1.0
            r = (p / (p.sum() + unused)).log() - (q / (q.sum() + unused)).log()  # (U,)
            w, b0, z = _logistic(crow, col, r, (y == k).float())
            weight[:, k], bias[k] = r * w, b0
            margins[:, k] = z
        if c == 2:  # one model: class 1 against 0, centred
            weight[:, 0], weight[:, 1] = -weight[:, 1] / 2, weight[:, 1] / 2
            bias[0], bias[1] = -bias[1] / 2, bias[1] / 2
        self.weight.zero_()
        self.weight[used] = weight
        self.bias.copy_(bias)
        return {
            "texts": len(y),
            "buckets_used": len(used),
            "train_accuracy": float((margins.argmax(1) == y).float().mean()),
            "seconds": time.perf_counter() - t0,
        }

    def upgrade_state_dict_named(self, state: dict[str, Tensor], name: str) -> None:
        """Weights files from before NBSVM (``counts`` and ``texts``: multinomial naive Bayes
        over token n-grams) become the same model: their log-likelihoods as weights, each token a
        word of its own. Called with the whole file's ``state`` before loading (fairseq's hook)."""
        prefix = f"{name}." if name else ""
        if prefix + "counts" in state and prefix + "weight" not in state:
            counts, texts = state.pop(prefix + "counts"), state.pop(prefix + "texts")
            state[prefix + "weight"] = (counts + 1.0).log() - (counts.sum(0) + len(counts)).log()
            state[prefix + "bias"] = (texts + 1.0).log()
            tables = _token_tables(self.piece_hash.numel())
            state.update({prefix + key: table for key, table in tables.items()})


def _logistic(crow: Tensor, col: Tensor, r: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """L2 logistic regression on the sparse rows x̂ ⊙ r: (w (U,), bias, training scores (T,))."""
    buckets = len(r)
    with warnings.catch_warnings():  # "sparse CSR support is in beta": matrix products only here
        warnings.simplefilter("ignore", UserWarning)
        shape = (len(y), buckets)
        x = torch.sparse_csr_tensor(crow, col, r[col.long()], shape, check_invariants=False)
        xt = x.to_sparse_coo().t().coalesce().to_sparse_csr()
    w = torch.zeros(buckets + 1, requires_grad=True)
    opt = torch.optim.LBFGS(
        [w],
        max_iter=LBFGS_STEPS,
        history_size=10,
        line_search_fn="strong_wolfe",
        tolerance_grad=1e-7,
        tolerance_change=1e-12,
    )

    def loss() -> Tensor:
        with torch.no_grad():
            z = (x @ w[:buckets, None])[:, 0] + w[buckets]
            value = nn.functional.binary_cross_entropy_with_logits(z, y, reduction="sum")
            value = C_REG * value + 0.5 * (w[:buckets] ** 2).sum()
            d = C_REG * (torch.sigmoid(z) - y)
            w.grad = torch.cat([(xt @ d[:, None])[:, 0] + w[:buckets], d.sum()[None]])
        return value

    opt.step(loss)
    w = w.detach()
    z = (x @ w[:buckets, None])[:, 0] + w[buckets]
    return w[:buckets], w[buckets], z
