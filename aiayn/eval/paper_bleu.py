"""The paper's BLEU: tokenised, compound-split BLEU as tensor2tensor's ``get_ende_bleu.sh``
computes it (Vaswani et al. 2017, Table 2: 27.3 base, 28.4 big on newstest2014 En-De).

The recipe, step by step: the hypotheses and the references are tokenised by the Moses tokenizer
(``tokenizer.perl -l LANG``: its default escaping, no aggressive hyphen splitting; here
``sacremoses``, its Python port), every hyphen between two non-space characters is split off as
``##AT##-##AT##`` (``perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'``, as GNMT and ConvS2S
did), and BLEU is computed by ``multi-bleu.perl`` (cased, one reference, whitespace tokens, no
smoothing: an n-gram order with no match gives 0). The number is not comparable with sacreBLEU's
(detokenised text, its own 13a tokenisation, no compound splitting) and is reported beside it
under its own name. :func:`multi_bleu` is checked against sacreBLEU with ``tokenize='none'`` on
pre-tokenised text in tests/test_paper_bleu.py.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiayn.errors import ConfigError, DataError

__all__ = [
    "MultiBleu",
    "multi_bleu",
    "split_compounds",
    "moses_tokenize",
    "paper_bleu",
    "require_moses",
]

# Perl reads bytes here: \s is ASCII whitespace only, and so is multi-bleu.perl's split.
_WS = r" \t\n\r\f\v"
_COMPOUND = re.compile(rf"([^{_WS}])-([^{_WS}])")
_SPACES = re.compile(rf"[{_WS}]+")


def split_compounds(line: str) -> str:
    """``rich-text`` -> ``rich ##AT##-##AT## text``, exactly as the perl one-liner: matches do not
    overlap, so ``a-b-c`` -> ``a ##AT##-##AT## b-c``."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


def require_moses() -> Any:
    """The sacremoses module; ConfigError when it is not installed (checked before any work)."""
    try:
        import sacremoses
    except ImportError:
        raise ConfigError(
            "--paper-bleu needs the Moses tokenizer: pip install -e '.[paper]' (sacremoses)"
        ) from None
    return sacremoses


def moses_tokenize(lines: Sequence[str], lang: str) -> list[str]:
    """``tokenizer.perl -l LANG`` (default escaping, no ``-a``) of each line, via sacremoses."""
    tokenizer = require_moses().MosesTokenizer(lang=lang)
    return [tokenizer.tokenize(line, escape=True, return_str=True) for line in lines]


@dataclass(frozen=True)
class MultiBleu:
    """multi-bleu.perl's result: BLEU and its parts (precisions and score in 0-100)."""

    score: float
    precisions: tuple[float, float, float, float]
    bp: float
    hyp_len: int
    ref_len: int

    def format(self) -> str:
        """multi-bleu.perl's own output line."""
        ratio = self.hyp_len / self.ref_len if self.ref_len else 0.0
        p = "/".join(f"{x:.1f}" for x in self.precisions)
        return (
            f"BLEU = {self.score:.2f}, {p} (BP={self.bp:.3f}, ratio={ratio:.3f}, "
            f"hyp_len={self.hyp_len}, ref_len={self.ref_len})"
        )


def _ngrams(words: list[str], n: int) -> Counter:
    return Counter(tuple(words[i : i + n]) for i in range(len(words) - n + 1))


def multi_bleu(hyps: Sequence[str], refs: Sequence[str]) -> MultiBleu:
    """Corpus BLEU of pre-tokenised ``hyps`` against one pre-tokenised reference each, as
    ``multi-bleu.perl`` computes it (cased; n-gram matches clipped by the reference counts)."""
    if len(hyps) != len(refs):
        raise DataError(f"{len(hyps)} hypotheses but {len(refs)} references: they must pair up")
    correct, total = [0] * 4, [0] * 4
    hyp_len = ref_len = 0
    for hyp, ref in zip(hyps, refs):
        h, r = _SPACES.split(hyp.strip()), _SPACES.split(ref.strip())
        h, r = [w for w in h if w], [w for w in r if w]
        hyp_len, ref_len = hyp_len + len(h), ref_len + len(r)
        for n in range(1, 5):
            ref_counts = _ngrams(r, n)
            for gram, count in _ngrams(h, n).items():
                total[n - 1] += count
                correct[n - 1] += min(count, ref_counts[gram])
    precisions = [c / t if t else 0.0 for c, t in zip(correct, total)]
    if ref_len == 0 or hyp_len == 0:
        return MultiBleu(0.0, (0.0,) * 4, 0.0, hyp_len, ref_len)
    bp = math.exp(1 - ref_len / hyp_len) if hyp_len < ref_len else 1.0
    log_mean = sum(math.log(p) if p else -9999999999 for p in precisions) / 4
    return MultiBleu(
        100 * bp * math.exp(log_mean),
        (100 * precisions[0], 100 * precisions[1], 100 * precisions[2], 100 * precisions[3]),
        bp,
        hyp_len,
        ref_len,
    )


def paper_bleu(hyps: Sequence[str], refs: Sequence[str], lang: str) -> dict[str, Any]:
    """The paper's protocol on detokenised ``hyps`` and raw ``refs`` in language ``lang``:
    ``{"bleu_paper", "bleu_paper_text", "bleu_paper_signature"}``."""
    tokenized = [
        [split_compounds(line) for line in moses_tokenize(side, lang)] for side in (hyps, refs)
    ]
    result = multi_bleu(tokenized[0], tokenized[1])
    moses_version = require_moses().__version__
    return {
        "bleu_paper": round(result.score, 4),
        "bleu_paper_text": result.format(),
        "bleu_paper_signature": (
            f"tok:moses-{lang}+escape|split:##AT##|multi-bleu.perl|sacremoses:{moses_version}"
        ),
    }
