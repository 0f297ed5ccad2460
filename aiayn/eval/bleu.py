"""Corpus BLEU and chrF computed by sacreBLEU (Post 2018), with their signatures.

One protocol for every score aiayn reports: detokenised hypotheses against raw references, BLEU
with sacreBLEU's default 13a tokenisation, both cased and lowercased (``-lc``), and chrF. The
signature printed next to each number says exactly how it was computed, so that numbers can be
compared with published ones. The paper's tokenised, compound-split BLEU, which cannot be, is
added under its own name on request (:mod:`aiayn.eval.paper_bleu`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sacrebleu.metrics import BLEU, CHRF

from aiayn.errors import DataError
from aiayn.eval.paper_bleu import paper_bleu

__all__ = ["corpus_scores"]


def corpus_scores(
    hyps: Sequence[str], refs: Sequence[str], paper_lang: str | None = None
) -> dict[str, Any]:
    """BLEU (cased and lowercased) and chrF of ``hyps`` against one reference each.

    Returns ``{"bleu", "bleu_lc", "chrf"}`` (floats, 0–100), their ``*_signature`` strings, the
    sacreBLEU summary lines ``*_text``, and ``n`` (sentences); with ``paper_lang`` (the target
    language) also the paper's ``bleu_paper`` (:func:`aiayn.eval.paper_bleu.paper_bleu`). Raises
    DataError when the two lists differ in length.
    """
    if len(hyps) != len(refs):
        raise DataError(f"{len(hyps)} hypotheses but {len(refs)} references: they must pair up")
    hyps, ref_streams = list(hyps), [list(refs)]
    out: dict[str, Any] = {"n": len(hyps)}
    metrics = {"bleu": BLEU(), "bleu_lc": BLEU(lowercase=True), "chrf": CHRF()}
    for name, metric in metrics.items():
        result = metric.corpus_score(hyps, ref_streams)
        out[name] = round(float(result.score), 4)
        out[f"{name}_signature"] = str(metric.get_signature())
        out[f"{name}_text"] = result.format()
    if paper_lang is not None:
        out.update(paper_bleu(hyps, refs, paper_lang))
    return out
