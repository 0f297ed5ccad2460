"""Restoring letter case in the output of a lower-cased model (``data.lowercase``).

A model trained on lower-cased text writes lower-cased text. :class:`Recaser` gives each output
word back its most frequent written form in the training targets, the classic frequency recaser
(as Moses' truecaser learns it; here on detokenised text, changing nothing but letter case):

1. a word seen after the same previous word often enough takes its most frequent form in that
   context (German "eine junge frau" -> "junge", "der junge spielt" -> "Junge");
2. otherwise a known word takes its most frequent form anywhere but at the start of a line;
3. an unknown word takes the case of its longest known ending (a German compound is capitalised
   like its head: "langarmshirt" -> "Langarmshirt" because of "Shirt");
4. the first word of a line is capitalised when most training lines start with a capital.

Words are ``\\w+`` runs; only words that are all lower case are changed. How close it comes to
the original casing on Multi30k: docs/design/data.md#in-short.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

from aiayn.errors import DataError

__all__ = ["Recaser"]

_WORD = re.compile(r"\w+")
# A context form is used only when the pair was seen at least this often.
MIN_PAIR_COUNT = 2
# Shortest ending of an unknown word that may decide its case.
MIN_SUFFIX = 3


class Recaser:
    """Most-frequent-form recasing learned from cased text (see the module docstring)."""

    def __init__(
        self, forms: dict[str, str], pairs: dict[str, str], capitalize_first: bool
    ) -> None:
        self.forms = forms  # every known word, lower-cased -> its most frequent form
        self.pairs = (
            pairs  # "previous word<TAB>word" (lower-cased) -> form, where it differs from forms
        )
        self.capitalize_first = capitalize_first

    @classmethod
    def fit(cls, texts: Iterable[str]) -> Recaser:
        """Learn from cased text, one sentence per item."""
        unigram: dict[str, Counter] = defaultdict(Counter)
        bigram: dict[tuple[str, str], Counter] = defaultdict(Counter)
        lines = starts_upper = 0
        for text in texts:
            words = _WORD.findall(text)
            if not words:
                continue
            lines += 1
            starts_upper += words[0][0].isupper()
            for prev, word in zip(
                words, words[1:]
            ):  # the first word's case is the line's, not its own
                unigram[word.lower()][word] += 1
                bigram[prev.lower(), word.lower()][word] += 1
        if not lines:
            raise DataError("no text to learn letter case from")
        best = {w: c.most_common(1)[0][0] for w, c in unigram.items()}
        pairs = {}
        for (prev, word), c in bigram.items():
            form, n = c.most_common(1)[0]
            if n >= MIN_PAIR_COUNT and form != best[word]:
                pairs[f"{prev}\t{word}"] = form
        return cls(best, pairs, starts_upper * 2 > lines)

    def word(self, word: str, prev: str | None = None) -> str:
        """The form of one word (as the model wrote it) after ``prev`` (lower-cased) or first."""
        if not word.islower():
            return word
        if prev is not None and (form := self.pairs.get(f"{prev}\t{word}")) is not None:
            return form
        if (form := self.forms.get(word)) is not None:
            return form
        for i in range(1, len(word) - MIN_SUFFIX + 1):  # longest known ending first
            if (head := self.forms.get(word[i:])) is not None:
                return word.capitalize() if head[0].isupper() else word
        return word

    def __call__(self, text: str) -> str:
        """``text`` with every all-lower-case word recased; nothing but letter case changes."""
        out, pos, prev = [], 0, None
        for m in _WORD.finditer(text):
            word = m.group()
            form = self.word(word, prev)
            if prev is None and self.capitalize_first:
                form = form[0].upper() + form[1:]
            out += [text[pos : m.start()], form]
            pos, prev = m.end(), word.lower()
        out.append(text[pos:])
        return "".join(out)

    def to_obj(self) -> dict[str, Any]:
        return {"forms": self.forms, "pairs": self.pairs, "capitalize_first": self.capitalize_first}

    @classmethod
    def from_obj(cls, obj: Any, origin: str = "recaser") -> Recaser:
        ok = (
            isinstance(obj, dict)
            and isinstance(obj.get("forms"), dict)
            and isinstance(obj.get("pairs"), dict)
            and isinstance(obj.get("capitalize_first"), bool)
            and all(
                isinstance(k, str) and isinstance(v, str)
                for table in (obj["forms"], obj["pairs"])
                for k, v in table.items()
            )
        )
        if not ok:
            raise DataError(f"{origin}: malformed recaser")
        return cls(dict(obj["forms"]), dict(obj["pairs"]), obj["capitalize_first"])
