"""Evaluation: corpus BLEU and chrF with sacreBLEU, the protocol shared by training and `evaluate`."""

from aiayn.eval.bleu import corpus_scores

__all__ = ["corpus_scores"]
