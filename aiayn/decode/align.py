"""Word alignments from cross-attention, and the attention weights they are read from.

Shape legend: S source len · T target len (decoder inputs: BOS + produced tokens) · H heads.

:func:`record_attention` runs the model once with ``attn_record`` lists, which makes every layer
take the explicit-math path (:func:`aiayn.model.attention.attention_weights`) and keep its weights:
encoder self-attention, decoder (masked) self-attention and encoder–decoder ("cross") attention.
The attention view (:mod:`aiayn.viz.attention`) draws them; :func:`align` reads alignments off the
cross-attention of one layer, the *alignment layer*: the decoder's second-to-last (the last when
it has one layer), averaged over its heads. Garg et al. (2019, "Jointly Learning to Align and
Translate with Transformer Models") found the penultimate layer's attention aligns best of all
layers, and fairseq's alignment models read that layer too; the last layer attends to what helps
predict the next token, often the source's end. Alignments are token level: pairs (i, j), source
token i (0-based, the source's subword pieces) and output token j (0-based, the hypothesis's
tokens), one pair per output token, to the source token it attends to most.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from aiayn.config import ModelConfig
from aiayn.decode.search import Hypothesis
from aiayn.errors import AiaynError
from aiayn.model import Transformer

__all__ = ["AttentionMaps", "record_attention", "alignment_layer", "align"]


@dataclass
class AttentionMaps:
    """Per-layer attention weights of one sentence pair, batch dimension removed.

    ``encoder[l]`` (H, S, S), ``decoder[l]`` (H, T, T), ``cross[l]`` (H, T, S).
    """

    encoder: list[Tensor]
    decoder: list[Tensor]
    cross: list[Tensor]

    def of(self, kind: str) -> list[Tensor]:
        return getattr(self, kind)


@torch.no_grad()
def record_attention(
    model: Transformer, src_ids: Sequence[int] | Tensor, tgt_ids: Sequence[int] | Tensor
) -> AttentionMaps:
    """Attention weights of ``model`` (a :class:`aiayn.model.Transformer`) for one pair.

    ``src_ids`` are the source ids as the model encodes them; ``tgt_ids`` the decoder inputs
    (BOS followed by the tokens it produced). The model is run in eval mode (no dropout), the
    same computation that produced the translation.
    """
    device = next(model.parameters()).device
    src = torch.as_tensor(src_ids, dtype=torch.long, device=device).reshape(1, -1)  # (1, S)
    tgt = torch.as_tensor(tgt_ids, dtype=torch.long, device=device).reshape(1, -1)  # (1, T)
    if src.size(1) == 0 or tgt.size(1) == 0:
        raise AiaynError("attention needs at least one source and one target token")
    was_training = model.training
    model.eval()
    try:
        enc_record: list = []
        dec_record: list = []
        memory = model.encode(src, attn_record=enc_record)  # (1, S, D)
        model.decode(tgt, memory, model.src_mask(src), attn_record=dec_record)
    finally:
        model.train(was_training)
    return AttentionMaps(
        encoder=[w[0].float().cpu() for _, w in enc_record],  # each (H, S, S)
        decoder=[w[0].float().cpu() for kind, w in dec_record if kind == "self"],  # (H, T, T)
        cross=[w[0].float().cpu() for kind, w in dec_record if kind == "cross"],  # (H, T, S)
    )


def alignment_layer(n_layers: int) -> int:
    """The 0-based decoder layer alignments are read from: the second-to-last (module docstring)."""
    return max(n_layers - 2, 0)


class Reader(Protocol):
    """What reads a sentence pair's attention: a backend with "attention"
    (:class:`aiayn.runtime.backend.Attention`)."""

    cfg: ModelConfig

    def attention(self, src_ids: Sequence[int], tgt_ids: Sequence[int]) -> AttentionMaps: ...


def align(reader: Reader, src_ids: Sequence[int], hyp: Hypothesis) -> list[tuple[int, int]]:
    """(source token, output token) index pairs of ``hyp``, a translation of ``src_ids``, read by
    ``reader`` (a backend's model; an ensemble's first model, as the attention view does): each
    output token j with the source token its alignment layer's cross-attention, averaged over
    the heads, weighs most, read by one teacher-forced pass over the output."""
    if not hyp.tokens:
        return []
    fed = hyp.tokens if hyp.finished else hyp.tokens[:-1]  # the last token of a cut one: unread
    maps = reader.attention(src_ids, [reader.cfg.bos_id, *fed])
    weights = maps.cross[alignment_layer(len(maps.cross))].mean(0)  # (T, S), heads averaged
    # Query j (BOS + j tokens read) is where output token j was chosen.
    source = weights[: len(hyp.tokens)].argmax(-1).tolist()  # (m,)
    return [(i, j) for j, i in enumerate(source)]
