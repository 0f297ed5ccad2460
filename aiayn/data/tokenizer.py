"""Tokenizers: a joint subword model (BPE or Unigram, trained with Hugging Face ``tokenizers``) and
a character-level one, behind one interface.

Special ids are fixed and match :class:`aiayn.config.ModelConfig`: ``<pad>`` 0, ``<s>`` 1 (BOS),
``</s>`` 2 (EOS), ``<unk>`` 3. ``encode`` never adds BOS/EOS (the collate functions do);
``decode`` skips special tokens.

Subword text is normalised first: NFKC (which also turns Multi30k's non-breaking spaces into
plain ones), every run of whitespace to one space, ends stripped. Pieces are byte-level (GPT-2
style), so any text encodes without ``<unk>`` and ``decode(encode(t)) == normalize(t)`` exactly.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import itertools
import json
import logging
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

from aiayn.data.readers import read_text
from aiayn.data.recase import Recaser
from aiayn.errors import ConfigError, DataError
from aiayn.io import write_text
from aiayn.progress import bar_shown

__all__ = ["Tokenizer", "SubwordTokenizer", "CharTokenizer", "train_tokenizer", "SPECIAL_TOKENS"]

log = logging.getLogger(__name__)

# A run of characters without a space longer than this is no word: tokenizer training leaves its
# text out (counted in the log). The trainers' time grows with the square of a word's length
# (docs/experiments/code_notes.md#tokenizer-training-on-a-long-word); no vocabulary needs it.
MAX_WORD_CHARS = 1000

# In id order: pad 0, bos 1, eos 2, unk 3 (ModelConfig's defaults).
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")
_CHAR_TYPE = "aiayn-char"
# tokenizer.json "type"s of tokenizers in modules of their own, imported when a file needs one
# (they build on this module; sentencepiece is an optional dependency): type -> "module:class".
TOKENIZER_TYPES = {"aiayn-sentencepiece": "aiayn.data.spm:SentencePieceTokenizer"}
_RECASED_TYPE = "aiayn-recased"  # {"type", "recaser", "tokenizer": a Hugging Face tokenizer.json}


def tokenizer_digest(tokenizer: str | bytes) -> str | None:
    """sha256 of a tokenizer.json's content (parsed and written canonically, so that the same
    tokenizer re-indented or re-ordered has the same digest); None when it is not JSON."""
    try:
        canonical = json.dumps(json.loads(tokenizer), sort_keys=True, ensure_ascii=False)
    except (ValueError, UnicodeDecodeError):
        return None
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class Tokenizer:
    """The interface shared by the subword and the character tokenizer."""

    pad_id, bos_id, eos_id, unk_id = 0, 1, 2, 3
    kind: str = ""

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    def normalize(self, text: str) -> str:
        """The text as the tokenizer sees it; ``decode(encode(text))`` gives this back."""
        raise NotImplementedError

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, without BOS/EOS."""
        raise NotImplementedError

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def encode_target_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of translation targets (the same as :meth:`encode_batch` but where source
        and target have their own models: Marian's SentencePiece pair)."""
        return self.encode_batch(texts)

    def encode_running(self, pieces: Sequence[str], start: bool, end: bool) -> np.ndarray:
        """The ids of ``pieces``, consecutive pieces of one running text, as ``encode`` of the
        whole text gives them (an integer array): ``start`` when the first piece begins the text,
        ``end`` when the last one ends it. Every piece but the text's first begins at a run of
        whitespace that follows a non-space character (as
        :func:`aiayn.data.build.running_pieces` cuts them)."""
        raise NotImplementedError

    def min_tokens(self, text: str) -> int:
        """A lower bound of ``len(self.encode(text))``, found without encoding (0: no bound)."""
        return 0

    def encode_target(self, text: str) -> list[int]:
        """Ids of ``text`` as the decoder writes it (without BOS/EOS): ``encode`` unless the
        tokenizer segments its output otherwise."""
        return self.encode(text)

    def encode_prefix(self, text: str) -> list[int]:
        """Target ids of ``text``, the forced start of a translation, kept exactly: ConfigError
        naming the characters that the vocabulary cannot represent (they would become ``<unk>``,
        which the output drops: the prefix silently cut)."""
        ids = self.encode_target(text)
        if self.unk_id in ids:
            chars = sorted({c for c in text if self.unk_id in self.encode_target(c)})
            named = (
                ", ".join(f"{c!r} (U+{ord(c):04X})" for c in chars[:8]) or "a special token's text"
            )
            raise ConfigError(
                f"prefix {text[:60]!r}: the tokenizer cannot represent {named}; the prefix "
                "would be cut (remove or replace those characters)"
            )
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` (a list or a 1-D tensor), special tokens skipped."""
        raise NotImplementedError

    def special_name(self, i: int) -> str | None:
        """The name of special id ``i`` (``<pad>``, ``<s>``, ``</s>``, ``<unk>``), else None."""
        return SPECIAL_TOKENS[i] if 0 <= i < len(SPECIAL_TOKENS) else None

    def decode_batch(self, batch: Iterable[Iterable[int]]) -> list[str]:
        return [self.decode(ids) for ids in batch]

    def to_str(self) -> str:
        """The tokenizer as JSON (the content of ``tokenizer.json``)."""
        raise NotImplementedError

    def save(self, path: str | os.PathLike) -> None:
        """Write ``tokenizer.json`` atomically."""
        write_text(path, self.to_str())

    @classmethod
    def from_str(cls, text: str, origin: str = "tokenizer") -> Tokenizer:
        """Load what :meth:`to_str` wrote (either kind); DataError naming ``origin`` when invalid."""
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as err:
            raise DataError(
                f"{origin}:{err.lineno}: not a tokenizer (invalid JSON: {err.msg})"
            ) from None
        if isinstance(obj, dict) and obj.get("type") == _CHAR_TYPE:
            return CharTokenizer.from_obj(obj, origin)
        if isinstance(obj, dict) and obj.get("type") in TOKENIZER_TYPES:
            module, _, name = TOKENIZER_TYPES[obj["type"]].partition(":")
            tokenizer_class = getattr(importlib.import_module(module), name)
            return tokenizer_class.from_obj(obj, origin)
        recaser = None
        if isinstance(obj, dict) and obj.get("type") == _RECASED_TYPE:
            recaser = Recaser.from_obj(obj.get("recaser"), origin)
            text = json.dumps(obj.get("tokenizer"), ensure_ascii=False)
        try:
            hf = HFTokenizer.from_str(text)
        except Exception as err:  # tokenizers raises plain Exception subclasses from Rust
            raise DataError(f"{origin}: not a tokenizer ({err})") from None
        return SubwordTokenizer(hf, origin, recaser)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> Tokenizer:
        return cls.from_str(read_text(path), str(path))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kind={self.kind!r}, vocab_size={self.vocab_size})"


def _ids(ids: Iterable[int]) -> list[int]:
    return ids.tolist() if hasattr(ids, "tolist") else list(ids)


class SubwordTokenizer(Tokenizer):
    """A Hugging Face ``tokenizers`` model (BPE or Unigram) with aiayn's special ids.

    A lower-casing tokenizer may carry a :class:`Recaser`: ``decode`` then gives the text its
    letter case back (saved together: ``tokenizer.json`` wraps the Hugging Face file).
    """

    def __init__(
        self, hf: HFTokenizer, origin: str = "tokenizer", recaser: Recaser | None = None
    ) -> None:
        for expected, token in enumerate(SPECIAL_TOKENS):
            if hf.token_to_id(token) != expected:
                raise DataError(
                    f"{origin}: special token {token} has id {hf.token_to_id(token)}, "
                    f"expected {expected}"
                )
        self.hf, self.recaser = hf, recaser
        self.kind = type(hf.model).__name__.lower()  # "bpe" or "unigram"

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    def normalize(self, text: str) -> str:
        return self.hf.normalizer.normalize_str(text) if self.hf.normalizer else text

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False).ids

    def min_tokens(self, text: str) -> int:
        """Bytes of the normalised text over the longest token's bytes (byte-level pieces: one
        character of a token is one byte); texts shorter than 256 characters are not looked at."""
        if len(text) < 256:
            return 0
        return len(self.normalize(text).encode("utf-8")) // self._longest_token

    @functools.cached_property
    def _longest_token(self) -> int:
        return max(len(token) for token in self.hf.get_vocab())

    def with_dropout(self, p: float) -> SubwordTokenizer:
        """A copy whose BPE merges are each skipped with probability ``p`` at every encode
        (BPE-dropout, Provilkov et al. 2020): the same vocabulary, a random segmentation."""
        if self.kind != "bpe":
            raise DataError(f"BPE-dropout needs a BPE tokenizer, this one is {self.kind}")
        hf = HFTokenizer.from_str(self.hf.to_str())
        hf.model.dropout = p
        return SubwordTokenizer(hf, recaser=self.recaser)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Encodes in parallel (Rust threads; ``TOKENIZERS_PARALLELISM`` controls them)."""
        return [e.ids for e in self.hf.encode_batch(list(texts), add_special_tokens=False)]

    def encode_running(self, pieces: Sequence[str], start: bool, end: bool) -> np.ndarray:
        """Encodes in parallel like :meth:`encode_batch`. A piece is normalised as within the
        whole text: its ends are stripped only where the text's are (the normaliser's Strip is
        the one step that is not local), and a pre-token never spans two pieces, as the byte-level
        pre-tokenizer breaks before every run of whitespace that follows a non-space."""
        texts = list(pieces)
        running, plain = self._running
        ids = [e.ids for e in running.encode_batch(texts, add_special_tokens=False)]
        edges = {i for i, edge in ((0, start), (len(texts) - 1, end)) if edge}
        for i in sorted(edges):
            text = running.normalizer.normalize_str(texts[i]) if running.normalizer else texts[i]
            text = text.lstrip(" ") if start and i == 0 else text
            text = text.rstrip(" ") if end and i == len(texts) - 1 else text
            ids[i] = plain.encode(text, add_special_tokens=False).ids
        return np.fromiter(itertools.chain.from_iterable(ids), np.int64)

    @functools.cached_property
    def _running(self) -> tuple[HFTokenizer, HFTokenizer]:
        """Two copies of the Hugging Face tokenizer: normalising without Strip, and not
        normalising (for a piece normalised and stripped here)."""
        obj = json.loads(self.hf.to_str())
        running, plain = dict(obj), dict(obj, normalizer=None)
        running["normalizer"] = _without_strip(obj.get("normalizer"))
        return HFTokenizer.from_str(json.dumps(running)), HFTokenizer.from_str(json.dumps(plain))

    def decode(self, ids: Iterable[int]) -> str:
        text = self.hf.decode(_ids(ids), skip_special_tokens=True)
        return self.recaser(text) if self.recaser else text

    def decode_batch(self, batch: Iterable[Iterable[int]]) -> list[str]:
        texts = self.hf.decode_batch([_ids(ids) for ids in batch], skip_special_tokens=True)
        return [self.recaser(t) for t in texts] if self.recaser else texts

    def to_str(self) -> str:
        if self.recaser is None:
            return self.hf.to_str()
        return json.dumps(
            {
                "type": _RECASED_TYPE,
                "recaser": self.recaser.to_obj(),
                "tokenizer": json.loads(self.hf.to_str()),
            },
            ensure_ascii=False,
        )


class CharTokenizer(Tokenizer):
    """One token per character, no normalisation (newlines and spacing are part of the text)."""

    kind = "char"

    def __init__(self, chars: Sequence[str]) -> None:
        if len(set(chars)) != len(chars) or any(len(c) != 1 for c in chars):
            raise DataError("character vocabulary must be distinct single characters")
        self.chars = list(chars)
        self._stoi = {c: i + len(SPECIAL_TOKENS) for i, c in enumerate(self.chars)}
        self._itos = [""] * len(SPECIAL_TOKENS) + self.chars  # specials decode to nothing

    @property
    def vocab_size(self) -> int:
        return len(SPECIAL_TOKENS) + len(self.chars)

    def normalize(self, text: str) -> str:
        return "".join(c for c in text if c in self._stoi)

    def encode(self, text: str) -> list[int]:
        get, unk = self._stoi.get, self.unk_id
        return [get(c, unk) for c in text]

    def encode_array(self, text: str) -> np.ndarray:
        """``encode(text)`` as an int32 array, vectorised: the text's code points (UTF-32) looked
        up in a table of ids by code point."""
        points, table = _code_points(text), self._table
        return table[np.minimum(points, len(table) - 1)]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Every text at once through :meth:`encode_array` (the texts joined, the ids split)."""
        flat = self.encode_array("".join(texts)).tolist()
        ends = list(itertools.accumulate(map(len, texts)))
        return [flat[a:b] for a, b in zip([0, *ends], ends)]

    def encode_running(self, pieces: Sequence[str], start: bool, end: bool) -> np.ndarray:
        return self.encode_array("".join(pieces))

    @functools.cached_property
    def _table(self) -> np.ndarray:
        """Id by code point up to the vocabulary's largest, then one more entry: ``<unk>``."""
        points = [ord(c) for c in self.chars]
        table = np.full(max(points, default=0) + 2, self.unk_id, np.int32)
        table[points] = np.arange(len(SPECIAL_TOKENS), self.vocab_size, dtype=np.int32)
        return table

    def min_tokens(self, text: str) -> int:
        return len(text)  # one token per character, unknown ones included

    def decode(self, ids: Iterable[int]) -> str:
        itos, n = self._itos, len(self._itos)
        return "".join(itos[i] for i in _ids(ids) if 0 <= i < n)

    def to_str(self) -> str:
        return json.dumps(
            {"type": _CHAR_TYPE, "special_tokens": list(SPECIAL_TOKENS), "chars": self.chars},
            ensure_ascii=False,
        )

    @classmethod
    def from_obj(cls, obj: dict, origin: str = "tokenizer") -> CharTokenizer:
        if obj.get("special_tokens") != list(SPECIAL_TOKENS) or not isinstance(
            obj.get("chars"), list
        ):
            raise DataError(f"{origin}: malformed character tokenizer")
        return cls(obj["chars"])


def _normalizer(lowercase: bool = False, strip: bool = True) -> normalizers.Normalizer:
    steps = [normalizers.NFKC(), normalizers.Replace(Regex(r"\s+"), " ")]
    steps += [normalizers.Strip()] * strip + [normalizers.Lowercase()] * lowercase
    return normalizers.Sequence(steps)


def _without_strip(normalizer: dict[str, Any] | None) -> dict[str, Any] | None:
    """A tokenizer.json normaliser without its Strip steps (at the top or in a Sequence)."""
    if not normalizer or normalizer.get("type") == "Strip":
        return None
    if normalizer.get("type") != "Sequence":
        return normalizer
    steps = [n for n in normalizer.get("normalizers", []) if n.get("type") != "Strip"]
    return {"type": "Sequence", "normalizers": steps}


def _without_long_words(texts: Iterable[str]) -> Iterator[str]:
    """``texts`` without those holding a run of more than MAX_WORD_CHARS non-space characters
    (a binary file read as text, a line of base64, a page without spaces); the count is logged
    once the texts are read."""
    n = dropped = 0
    for t in texts:
        n += 1
        if len(t) <= MAX_WORD_CHARS or max(map(len, t.split()), default=0) <= MAX_WORD_CHARS:
            yield t
        else:
            dropped += 1
    if dropped:
        log.warning(
            "tokenizer training: left out %d of %d texts with more than %d characters without "
            "a space",
            dropped,
            n,
            MAX_WORD_CHARS,
        )


def _running_texts(pieces: Iterable[str], lowercase: bool) -> Iterator[str]:
    """Consecutive pieces of one running text, each normalised as within the whole text (see
    :meth:`SubwordTokenizer.encode_running`): the text's first piece stripped on the left, its
    last on the right. Read one piece ahead, never all at once."""
    normalize = _normalizer(lowercase, strip=False).normalize_str
    it = iter(pieces)
    ahead = next(it, None)
    first = True
    while ahead is not None:
        piece, ahead = normalize(ahead), next(it, None)
        piece = piece.lstrip(" ") if first else piece
        yield piece.rstrip(" ") if ahead is None else piece
        first = False


def _code_points(text: str) -> np.ndarray:
    """The code points of ``text`` (uint32; a lone surrogate as itself)."""
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), np.uint32)


def _char_counts(texts: Iterable[str], group: int = 1 << 16) -> Counter[str]:
    """How often each character occurs in ``texts``, in the order first seen (as
    ``Counter.update`` over the texts counts them), vectorised: a bincount of the code points of
    about ``group`` characters of the texts at a time."""
    counts: dict[int, int] = {}

    def count(text: str) -> None:
        points = _code_points(text)
        bins = np.bincount(points)
        present = np.flatnonzero(bins).tolist()
        if any(p not in counts for p in present):  # new characters: in the order first seen
            unique, first = np.unique(points, return_index=True)
            for p in unique[np.argsort(first)].tolist():
                counts.setdefault(p, 0)
        for p, n in zip(present, bins[present].tolist()):
            counts[p] += n

    pending: list[str] = []
    size = 0
    for text in texts:
        pending.append(text)
        size += len(text)
        if size >= group:
            count("".join(pending))
            pending, size = [], 0
    count("".join(pending))
    return Counter({chr(p): n for p, n in counts.items()})


def _char_tokenizer(texts: Iterable[str], vocab_size: int) -> CharTokenizer:
    """The ``vocab_size`` - 4 most frequent characters of ``texts`` (read one at a time)."""
    counts = _char_counts(texts)
    if all(c.isspace() for c in counts):
        raise DataError("no training text to build a tokenizer from")
    keep = max(vocab_size - len(SPECIAL_TOKENS), 1)
    if len(counts) > keep:
        log.warning(
            "char tokenizer: %d distinct characters, keeping the %d most frequent",
            len(counts),
            keep,
        )
    return CharTokenizer(sorted(c for c, _ in counts.most_common(keep)))


def _subword_model(kind: str, vocab_size: int) -> tuple[HFTokenizer, Any]:
    """An untrained byte-level BPE or Unigram tokenizer and its trainer."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    specials = list(SPECIAL_TOKENS)
    if kind == "bpe":
        hf = HFTokenizer(models.BPE(unk_token="<unk>"))
        trainer: Any = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=specials,
            initial_alphabet=alphabet,
            show_progress=bar_shown(),  # the tokenizers library's own bar, on a terminal
        )
    else:
        hf = HFTokenizer(models.Unigram())
        trainer = trainers.UnigramTrainer(
            vocab_size=vocab_size,
            special_tokens=specials,
            unk_token="<unk>",
            initial_alphabet=alphabet,
            show_progress=bar_shown(),
        )
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    return hf, trainer


def train_tokenizer(
    texts: Iterable[str],
    kind: str = "bpe",
    vocab_size: int = 8000,
    lowercase: bool = False,
    recase_texts: Iterable[str] | None = None,
    running: bool = False,
) -> Tokenizer:
    """Train a tokenizer on ``texts`` (the training split only; source and target together).

    ``kind``: "bpe", "unigram" or "char". For "char", ``vocab_size`` caps the vocabulary (the
    most frequent characters are kept; the others become ``<unk>``). ``lowercase`` (subword
    kinds only) adds lower-casing to the normaliser saved with the tokenizer; with it,
    ``recase_texts`` (cased text of the kind the model writes: a translation's targets) trains a
    :class:`Recaser` that ``decode`` applies. ``running``: ``texts`` are consecutive pieces of
    one running text (:func:`aiayn.data.build.running_pieces`), learnt from as the whole text
    would be. The char kind and running texts are read as they come, never all in memory.
    """
    if kind == "char":
        if lowercase:
            raise DataError("lower-casing needs a subword tokenizer (bpe or unigram), not char")
        return _char_tokenizer(texts, vocab_size)
    if kind not in ("bpe", "unigram"):
        raise DataError(f"unknown tokenizer kind '{kind}'; choose bpe, unigram or char")
    hf, trainer = _subword_model(kind, vocab_size)
    seen = Counter[str]()

    def counted(items: Iterable[str]) -> Iterator[str]:
        for t in items:
            seen["texts"] += 1
            seen["text"] += bool(t.strip())
            yield t

    if running:  # normalised here, piece by piece; the tokenizer's own normaliser is set after
        hf.train_from_iterator(
            counted(_running_texts(_without_long_words(texts), lowercase)), trainer
        )
    else:
        kept = list(_without_long_words(texts))
        hf.normalizer = _normalizer(lowercase)
        hf.train_from_iterator(counted(kept), trainer, length=len(kept))
    if not seen["text"]:
        raise DataError("no training text to build a tokenizer from")
    hf.normalizer = _normalizer(lowercase)
    recaser = Recaser.fit(recase_texts) if lowercase and recase_texts is not None else None
    tokenizer = SubwordTokenizer(hf, recaser=recaser)
    log.info(
        "trained a %s tokenizer: %d tokens from %d texts", kind, tokenizer.vocab_size, seen["texts"]
    )
    return tokenizer
