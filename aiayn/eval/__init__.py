"""Evaluation: corpus BLEU and chrF with sacreBLEU, the protocol shared by training and `evaluate`;
the paper's tokenised, compound-split BLEU beside it on request (``aiayn evaluate --paper-bleu``)."""

from aiayn.eval.bleu import corpus_scores
from aiayn.eval.paper_bleu import multi_bleu, paper_bleu, split_compounds

__all__ = ["corpus_scores", "paper_bleu", "multi_bleu", "split_compounds"]
