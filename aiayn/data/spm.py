"""SentencePiece tokenizers with one joint vocabulary: the tokenizer of Marian (OPUS-MT) models.

A Marian model folder holds two SentencePiece models (``source.spm`` segments the input,
``target.spm`` the output) and ``vocab.json``, the joint vocabulary that maps each piece of
either model to the model's id. :class:`SentencePieceTokenizer` does what transformers'
``MarianTokenizer`` does, and is tested against it (ids and text, tests/test_hf_tokenizer.py):

- ``encode`` (the source side): a leading language code ``>>xx<<`` is a token of its own, the
  rest is cut into pieces by the source model, a piece outside ``vocab.json`` is ``<unk>``, and
  ``</s>`` ends the ids (Marian models read their source with it, unlike aiayn's own);
- ``encode_target``: the target model's pieces, without ``</s>`` (the collate functions add it);
- ``decode``: special tokens skipped, the pieces joined by the SentencePiece model that
  ``MarianTokenizer`` uses for it (the source model when the vocabulary is joint, as it does).

The special ids are the model's own (OPUS-MT: ``</s>`` 0, ``<unk>`` 1, ``<pad>`` last), not
aiayn's 0-3; the decoder starts from ``<pad>``. Saved as one ``tokenizer.json`` (both models
base64-encoded inside), so that a model folder keeps one tokenizer file whatever its kind.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from aiayn.data.tokenizer import Tokenizer
from aiayn.errors import ConfigError, DataError

__all__ = ["SentencePieceTokenizer", "SPM_TYPE"]

SPM_TYPE = "aiayn-sentencepiece"  # the "type" of its tokenizer.json
_WORD = "\u2581"  # SentencePiece's word-start mark


def load_processor(model: bytes, origin: str) -> Any:
    """A ``sentencepiece.SentencePieceProcessor`` of a serialised model; DataError when it is not
    one, ConfigError naming the extra when sentencepiece is not installed."""
    try:
        import sentencepiece
    except ImportError:
        raise ConfigError(
            "SentencePiece tokenizers need the 'hf' extra: pip install -e '.[hf]'"
        ) from None
    processor = sentencepiece.SentencePieceProcessor()
    try:
        processor.LoadFromSerializedProto(model)
    except (RuntimeError, OSError, TypeError) as err:
        first = (str(err).strip().splitlines() or ["unreadable"])[0]
        raise DataError(f"{origin}: not a SentencePiece model ({first[:200]})") from None
    return processor


class SentencePieceTokenizer(Tokenizer):
    """Source and target SentencePiece models over one joint vocabulary (``MarianTokenizer``)."""

    kind = "sentencepiece"

    def __init__(
        self,
        source: bytes,
        target: bytes,
        vocab: Mapping[str, int],
        specials: Mapping[str, str] | None = None,
        origin: str = "tokenizer",
    ) -> None:
        specials = dict(specials or {"pad": "<pad>", "eos": "</s>", "unk": "<unk>"})
        for role, piece in specials.items():
            if piece not in vocab:
                raise DataError(f"{origin}: the {role} token {piece!r} is not in the vocabulary")
        ids = sorted(vocab.values())
        if ids != list(range(len(ids))):
            raise DataError(f"{origin}: vocabulary ids are not 0 … {len(ids) - 1}, each once")
        self.source_model, self.target_model = bytes(source), bytes(target)
        self.source = load_processor(self.source_model, f"{origin} (source model)")
        self.target = load_processor(self.target_model, f"{origin} (target model)")
        self.vocab, self.specials = dict(vocab), specials
        self.pieces = [""] * len(ids)
        for piece, i in self.vocab.items():
            self.pieces[i] = piece
        self.pad_id, self.eos_id = self.vocab[specials["pad"]], self.vocab[specials["eos"]]
        self.unk_id = self.vocab[specials["unk"]]
        self.bos_id = self.pad_id  # Marian's decoder starts from <pad>
        self._special_ids = {self.pad_id, self.eos_id, self.unk_id}

    @property
    def vocab_size(self) -> int:
        return len(self.pieces)

    def piece(self, i: int) -> str:
        """The vocabulary's piece of id ``i``."""
        return self.pieces[i]

    def special_name(self, i: int) -> str | None:
        return self.pieces[i] if i in self._special_ids else None

    def normalize(self, text: str) -> str:
        """The text as the source model sees it (its normaliser, NFKC and spaces by default)."""
        return self.source.normalize(text).replace(_WORD, " ").strip()

    def _ids_of(self, pieces: Iterable[str]) -> list[int]:
        get, unk = self.vocab.get, self.unk_id
        return [get(p, unk) for p in pieces]

    def encode(self, text: str) -> list[int]:
        """Source ids of ``text``, ``</s>`` last (``MarianTokenizer(text).input_ids``)."""
        code: list[str] = []
        if text.startswith(">>") and (end := text.find("<<")) != -1:
            code, text = [text[: end + 2]], text[end + 2 :]
        return self._ids_of(code + self.source.encode(text, out_type=str)) + [self.eos_id]

    def encode_target(self, text: str) -> list[int]:
        """Target ids of ``text``, without ``</s>``."""
        return self._ids_of(self.target.encode(text, out_type=str))

    def encode_target_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Target ids of ``texts`` (training targets: the collate functions add ``</s>``)."""
        return [self.encode_target(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``, special tokens skipped (``MarianTokenizer.decode(ids,
        skip_special_tokens=True)``)."""
        n = len(self.pieces)
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)  # a list or a 1-D tensor
        pieces = [self.pieces[i] for i in ids if 0 <= i < n and i not in self._special_ids]
        return self.source.decode_pieces(pieces).replace(_WORD, " ").strip()

    def to_str(self) -> str:
        return json.dumps(
            {
                "type": SPM_TYPE,
                "source": base64.b64encode(self.source_model).decode("ascii"),
                "target": base64.b64encode(self.target_model).decode("ascii"),
                "vocab": self.vocab,
                "specials": self.specials,
            },
            ensure_ascii=False,
        )

    @classmethod
    def from_obj(cls, obj: dict, origin: str = "tokenizer") -> SentencePieceTokenizer:
        """Load what :meth:`to_str` wrote; DataError naming ``origin`` when it is malformed."""
        try:
            source = base64.b64decode(obj["source"], validate=True)
            target = base64.b64decode(obj["target"], validate=True)
            vocab, specials = obj["vocab"], obj["specials"]
        except (KeyError, TypeError, ValueError, binascii.Error):
            raise DataError(f"{origin}: malformed SentencePiece tokenizer") from None
        if not isinstance(vocab, dict) or not all(
            isinstance(k, str) and type(v) is int for k, v in vocab.items()
        ):
            raise DataError(f"{origin}: malformed SentencePiece vocabulary")
        if not isinstance(specials, dict) or set(specials) != {"pad", "eos", "unk"}:
            raise DataError(f"{origin}: malformed SentencePiece special tokens")
        return cls(source, target, vocab, specials, origin)
