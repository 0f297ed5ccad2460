"""Attention maps of a Transformer on one sentence pair (Vaswani et al. 2017, §3.2, Figures 3–5).

Shape legend: S source len · T target len (decoder inputs: BOS + produced tokens) · H heads.

:func:`~aiayn.decode.align.record_attention` runs the model once with ``attn_record`` lists, which makes every layer
take the explicit-math path (:func:`aiayn.model.attention.attention_weights`) and keep its weights:
encoder self-attention, decoder (masked) self-attention and encoder–decoder ("cross") attention.
:func:`plot_attention` draws them, one panel per (kind, layer, head); a row of the figure is one
layer of one kind, its columns the heads. Layers and heads are numbered from 1, as in the paper.
"""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from torch import Tensor

from aiayn.decode import DecodeConfig
from aiayn.decode.align import AttentionMaps
from aiayn.decode.translate import encode_sources
from aiayn.errors import AiaynError
from aiayn.folder.load import load_model_folder
from aiayn.kinds import TRANSLATION
from aiayn.runtime.backend import Attention, Backend, require
from aiayn.viz import pyplot

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure


# kind -> (panel title prefix, which token list labels the queries, which labels the keys)
KINDS: dict[str, tuple[str, str, str]] = {
    "encoder": ("enc self", "src", "src"),
    "decoder": ("dec self", "tgt", "tgt"),
    "cross": ("enc-dec", "tgt", "src"),
}
LEGEND = (
    "enc self: encoder self-attention · dec self: decoder masked self-attention · "
    "enc-dec: decoder queries over the encoder output.  Rows: queries, columns: keys; "
    "colour: attention weight, 0 to 1."
)


def select_numbers(requested: Sequence[int] | None, available: int, what: str) -> list[int]:
    """1-based numbers -> 0-based indices, checked against ``available``."""
    if requested is None or len(requested) == 0:
        return list(range(available))
    bad = [n for n in requested if not 1 <= n <= available]
    if bad:
        raise AiaynError(f"{what} {bad[0]} does not exist: the model has {what}s 1 to {available}")
    return sorted(set(n - 1 for n in requested))


def _rows(maps: AttentionMaps, layers: Sequence[int] | None) -> list[tuple[str, int]]:
    """(kind, 0-based layer) for each figure row, in the order encoder, decoder, cross."""
    deepest = max(len(maps.encoder), len(maps.decoder))
    chosen = select_numbers(layers, deepest, "layer")
    rows = [(kind, i) for kind in KINDS for i in chosen if i < len(maps.of(kind))]
    if not rows:
        raise AiaynError("no attention to plot")
    return rows


def plot_attention(
    maps: AttentionMaps,
    src_tokens: Sequence[str],
    tgt_tokens: Sequence[str],
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    title: str | None = None,
) -> Figure:
    """One heat-map per (kind, layer, head): queries down, keys across, tokens on the axes.

    ``src_tokens`` label the S source positions, ``tgt_tokens`` the T decoder inputs. ``layers``
    and ``heads`` (1-based) restrict the panels; by default every layer and head is drawn.
    Panels: 3 kinds × len(layers) × len(heads) (fewer where the encoder and decoder depths differ).
    """
    sample = (maps.encoder or maps.decoder)[0]
    n_heads = sample.size(0)
    chosen_heads = select_numbers(heads, n_heads, "head")
    rows = _rows(maps, layers)
    tokens = {"src": list(src_tokens), "tgt": list(tgt_tokens)}
    _check_lengths(maps, tokens)
    cell = max(2.2, 0.16 * max(len(tokens["src"]), len(tokens["tgt"])))
    plt = pyplot()
    fig, axes = plt.subplots(
        len(rows),
        len(chosen_heads),
        squeeze=False,
        layout="constrained",
        figsize=(cell * len(chosen_heads) + 1.0, (cell + 0.5) * len(rows)),
    )
    for r, (kind, layer) in enumerate(rows):
        label, q_side, k_side = KINDS[kind]
        for c, head in enumerate(chosen_heads):
            ax = axes[r][c]
            weights = maps.of(kind)[layer][head]  # (Tq, Tk)
            image = ax.imshow(
                weights.numpy(),
                cmap="viridis",
                vmin=0.0,
                vmax=1.0,
                aspect="auto",
                interpolation="nearest",
            )
            ax.set_title(f"{label} · layer {layer + 1} · head {head + 1}", fontsize=8)
            _label_axes(ax, tokens[q_side], tokens[k_side], show_queries=c == 0)
    fig.colorbar(image, ax=axes, shrink=min(1.0, 4.0 / len(rows)), label="attention weight")
    legend = textwrap.fill(LEGEND, width=max(40, int(14 * fig.get_figwidth())))
    fig.suptitle(f"{title}\n{legend}" if title else legend, fontsize=8)
    return fig


def _check_lengths(maps: AttentionMaps, tokens: dict[str, list[str]]) -> None:
    for kind, (_, q_side, k_side) in KINDS.items():
        for w in maps.of(kind):
            if w.shape[-2:] != (len(tokens[q_side]), len(tokens[k_side])):
                raise AiaynError(
                    f"{kind} attention is {tuple(w.shape[-2:])} but there are "
                    f"{len(tokens[q_side])} query and {len(tokens[k_side])} key tokens"
                )


def _label_axes(ax, queries: list[str], keys: list[str], show_queries: bool) -> None:
    ax.set_xticks(range(len(keys)), keys, rotation=90, fontsize=6)
    ax.set_yticks(range(len(queries)), queries if show_queries else [], fontsize=6)
    ax.tick_params(length=0)


# ---- on a model's own translation -----------------------------------------------------------


@dataclass
class TranslationAttention:
    """A sentence, the model's translation of it, and the attention that produced it."""

    translation: str
    src_tokens: list[str]  # S labels: the source pieces as the encoder reads them
    tgt_tokens: list[str]  # T labels: <s>, then the produced pieces (the decoder inputs)
    maps: AttentionMaps
    score: float = float("nan")  # the hypothesis's search score (log-prob / length penalty)
    # [first, count, label]: the pieces of whole characters, for display (character_spans)
    src_spans: list[list] = dataclasses.field(default_factory=list)
    tgt_spans: list[list] = dataclasses.field(default_factory=list)

    def to_dict(self, digits: int = 4) -> dict:
        """Plain lists for JSON: ``encoder[l][h][i][j]`` is the weight of query i on key j in
        head h of layer l (0-based), weights rounded to ``digits`` decimals."""

        def lists(maps: list[Tensor]) -> list:
            return [w.round(decimals=digits).tolist() for w in maps]

        return dict(  # keyword names: these are JSON fields, not model kinds
            translation=self.translation,
            score=self.score,
            src_tokens=self.src_tokens,
            tgt_tokens=self.tgt_tokens,
            src_spans=self.src_spans,
            tgt_spans=self.tgt_spans,
            encoder=lists(self.maps.encoder),
            decoder=lists(self.maps.decoder),
            cross=lists(self.maps.cross),
        )


def token_labels(tokenizer, ids: Sequence[int]) -> list[str]:
    """A readable label per id: special tokens by name, a piece as the text it decodes to, a
    leading space (a word start) shown as '▁'."""
    return [_label(tokenizer, [i]) for i in ids]


def _label(tokenizer, ids: Sequence[int]) -> str:
    """The label of one piece, or of the pieces of one character (:func:`character_spans`)."""
    special = tokenizer.special_name(ids[0]) if len(ids) == 1 else None
    if special is not None:
        return special
    text = tokenizer.decode(list(ids)).replace("\n", "\\n")
    return "▁" + text[1:] if text.startswith(" ") else text


def character_spans(tokenizer, ids: Sequence[int], longest: int = 8) -> list[list]:
    """The pieces of ``ids`` grouped into whole characters, for display: ``[first, count,
    label]`` per group. Byte-level BPE cuts a character outside its training text (a Chinese
    character, an emoji) into pieces that each decode to "�"; consecutive pieces are grouped
    until they decode to whole characters (at most ``longest``; a piece that never completes
    stays alone). Other pieces are groups of one, labelled as :func:`token_labels` does."""
    spans: list[list] = []
    i = 0
    while i < len(ids):
        n = 1
        if tokenizer.special_name(ids[i]) is None:
            while (
                "\ufffd" in tokenizer.decode(list(ids[i : i + n]))
                and i + n < len(ids)
                and n < longest
                and tokenizer.special_name(ids[i + n]) is None
            ):
                n += 1
            if "\ufffd" in tokenizer.decode(list(ids[i : i + n])):
                n = 1
        spans.append([i, n, _label(tokenizer, ids[i : i + n])])
        i += n
    return spans


def attention_of_translation(
    backend: Backend,
    tokenizer,
    text: str,
    beam: int | None = None,
    decode=None,
    rank: int = 1,
    prefix: str | None = None,
) -> TranslationAttention:
    """Translate ``text`` with ``backend`` (one that declares "attention": the torch backend of
    a translation folder), then record the attention of the model re-reading its own output
    (teacher forcing over BOS + the produced tokens): the same weights the search computed step
    by step.

    ``decode`` (a :class:`~aiayn.decode.DecodeConfig`, default: its defaults, the paper's beam
    search) sets the search; ``beam`` overrides its beam size (1: greedy). ``rank`` picks the
    hypothesis of the n-best list (1: the best); ``prefix``, the start the translation must have
    (:func:`~aiayn.decode.step.force_prefix`). An :class:`~aiayn.decode.Ensemble` translates
    as one model; the weights shown are then those of its first model reading that translation.
    """
    require(backend, "attention")
    decode = decode or DecodeConfig()
    if beam is not None:
        decode = dataclasses.replace(decode, beam=beam, nbest=min(decode.nbest, beam))
    if not 1 <= rank <= decode.beam:
        raise AiaynError(f"rank must be between 1 and the beam size ({decode.beam}), got {rank}")
    decode = dataclasses.replace(decode, nbest=max(decode.nbest, rank))
    cfg = backend.cfg
    (src,) = encode_sources(tokenizer, [text], cfg.max_len)
    if not src:
        raise AiaynError("--text is empty: give a sentence to translate")
    forced = [tokenizer.encode_prefix(prefix)] if prefix and prefix.strip() else None
    hyps = backend.translate_ids([src], decode, prefixes=forced)[0]  # the sentence's n-best
    chosen = hyps[min(rank, len(hyps)) - 1]
    # The decoder inputs the search fed: BOS and every token but one cut at the length cap (the
    # last token of an unfinished hypothesis was produced, never read).
    fed = chosen.tokens if chosen.finished else chosen.tokens[:-1]
    tgt = [cfg.bos_id] + fed
    return TranslationAttention(
        tokenizer.decode(chosen.tokens),
        token_labels(tokenizer, src),
        token_labels(tokenizer, tgt),
        cast(Attention, backend).attention(src, tgt),
        chosen.score,
        character_spans(tokenizer, src),
        character_spans(tokenizer, tgt),
    )


def attention_of_model_dir(model_dir, text: str, beam: int | None = None) -> TranslationAttention:
    """:func:`attention_of_translation` for a model folder (config.json, weights, tokenizer.json)."""
    # An exported folder has no PyTorch weights: engine="torch" refuses it with one line.
    folder = load_model_folder(model_dir, expect_kind=TRANSLATION, engine="torch")
    return attention_of_translation(folder.backend, folder.tokenizer, text, beam)
