"""Translation task: an encoder–decoder on sentence pairs (Vaswani et al. 2017, §5–6).

The trainer's one loop (:mod:`aiayn.train.trainer`) sees this :class:`~aiayn.train.task.Task`:
sentence pairs are tokenised with one joint vocabulary, cut into token-bounded batches, and the
loss is the label-smoothed cross-entropy of the teacher-forced targets; validation can also decode
and score BLEU.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.data import SubwordTokenizer, collate_translation, load_translation
from aiayn.decode import translate_texts
from aiayn.errors import ConfigError
from aiayn.eval.bleu import corpus_scores
from aiayn.kinds import TRANSLATION
from aiayn.model import Transformer
from aiayn.train.loss import projected_label_smoothed_nll_loss, rdrop_loss
from aiayn.train.task import (
    Lengths,
    StepStats,
    TokenBatchedTask,
    output_bias,
    output_weight,
)

log = logging.getLogger(__name__)

__all__ = ["TranslationTask", "kept_outputs"]


def kept_outputs(
    model: nn.Module, target: Tensor, pad_id: int
) -> tuple[Tensor, Tensor | None, Tensor, int]:
    """The output weight, bias, targets and ignored id that the loss of ``model`` takes.

    Without an ``output_mask``: the generator's weight (V, D) and bias (V,) or None, ``target``
    and ``pad_id``. With one (``model.output_vocab = "targets"``): the kept rows (V', D) of the
    weight (and of the bias), ``target`` as
    positions among them, and -1, which marks padding and the rare target token never seen in
    the training targets (a validation sentence's), so that neither is predicted nor counted.
    """
    weight, bias = output_weight(model), output_bias(model)
    inner = getattr(model, "module", model)  # the model inside a DDP wrapper
    mask = inner.output_mask if isinstance(inner, Transformer) else None
    if mask is None:
        return weight, bias, target, pad_id
    ids = mask.nonzero().squeeze(1)  # (V',)
    position = torch.full_like(mask, -1, dtype=torch.long)  # (V,)
    position[ids] = torch.arange(ids.numel(), device=ids.device)
    position[pad_id] = -1
    kept_bias = None if bias is None else bias.index_select(0, ids)
    return weight.index_select(0, ids), kept_bias, position[target], -1


class TranslationTask(TokenBatchedTask):
    """Teacher-forced encoder–decoder training on (source, target) token-id pairs."""

    kind = TRANSLATION

    noisy_tokenizer: Any = None  # the BPE-dropout tokenizer of training batches (data.bpe_dropout)

    examples = "pairs"

    def check_data(self) -> None:
        """BPE-dropout: training batches are re-encoded by a tokenizer that skips merges at
        random (``data.bpe_dropout``). With a pretrained tokenizer (``train.init_from``), a count
        of the training tokens that are ``<unk>`` (characters it lacks) is logged."""
        if self.cfg.train.init_from:
            self._count_unknown()
        self.noisy_tokenizer = None
        if self.cfg.data.bpe_dropout:
            if not isinstance(self.tokenizer, SubwordTokenizer):
                raise ConfigError("data.bpe_dropout needs a subword tokenizer (bpe or unigram)")
            self.noisy_tokenizer = self.tokenizer.with_dropout(self.cfg.data.bpe_dropout)
            self.train_texts = self._kept_texts()

    def _count_unknown(self) -> None:
        """Log how many training tokens are ``<unk>``, per side (read from the token store)."""
        store, tok = self.stores["train"], self.tokenizer
        counts = {side: store.token_counts(side, tok.vocab_size) for side in ("src", "tgt")}
        unknown = {side: int(c[tok.unk_id]) for side, c in counts.items()}
        if any(unknown.values()):
            log.warning(
                "training data: %d of %d source and %d of %d target tokens are <unk> "
                "(characters the tokenizer of train.init_from lacks): trained as <unk>, and "
                "translated as <unk> too",
                unknown["src"],
                int(counts["src"].sum()),
                unknown["tgt"],
                int(counts["tgt"].sum()),
            )

    def _kept_texts(self) -> list[tuple[str, str]]:
        """The (source, target) texts of the stored training pairs, which BPE-dropout re-encodes
        (held in memory: a BPE-dropout run keeps its corpus' text in RAM)."""
        src, tgt = load_translation(self.cfg.data, self.cfg.data.train_split)
        return [(src[i], tgt[i]) for i in self.stores["train"].lines.tolist()]

    def model_config(self, model: ModelConfig) -> ModelConfig:
        v = self.tokenizer.vocab_size
        return replace(model, src_vocab_size=v, tgt_vocab_size=v)

    def build_model(self, model: ModelConfig) -> nn.Module:
        """The Transformer; with ``model.output_vocab = "targets"`` its ``output_mask`` marks the
        tokens of the training targets and EOS."""
        net = super().build_model(model)
        assert isinstance(net, Transformer)  # the shape's model class
        if net.output_mask is not None:
            counts = self.stores["train"].token_counts("tgt", model.tgt_vocab_size)
            net.output_mask.copy_(torch.from_numpy(counts[: model.tgt_vocab_size] > 0))
            net.output_mask[model.eos_id] = True
            log.info(
                "output vocabulary: the %d of %d tokens seen in the training targets",
                int(net.output_mask.sum()),
                model.tgt_vocab_size,
            )
        return net

    def example_lengths(self, split: str) -> tuple[Lengths, Lengths | None]:
        store = self.stores[split]
        return store.lengths("src"), store.lengths("tgt") + 1  # the target gains BOS/EOS

    def collate(self, split: str, indices: list[int]) -> Any:
        store, m = self.stores[split], self.cfg.model
        chosen: list[tuple[Any, Any]]
        if split == "train" and self.noisy_tokenizer is not None:
            chosen = self._noisy_pairs(indices)
        else:
            chosen = list(zip(store.rows("src", indices), store.rows("tgt", indices)))
        data = self.cfg.data
        return collate_translation(
            chosen, m.pad_id, m.bos_id, m.eos_id, data.pad_to_multiple, data.bucket_widths
        )

    def _noisy_pairs(self, indices: list[int]) -> list[tuple[list[int], list[int]]]:
        """Training pairs ``indices`` freshly encoded with BPE-dropout, cut to data.max_len (a
        noisier segmentation is longer; the cut is rare at Multi30k's lengths)."""
        n, encode = self.cfg.data.max_len, self.noisy_tokenizer.encode
        # One text at a time on this thread (docs/experiments/code_notes.md#bpe-dropouts-encoding),
        # so that no tokenizer threads run beside the training threads.
        return [
            (encode(x)[:n], encode(y)[: n - 1]) for x, y in (self.train_texts[i] for i in indices)
        ]

    def num_targets(self, batch: Any) -> int:
        return int(batch.n_tgt_tokens)

    def loss(self, model: nn.Module, batch: Any, device: torch.device) -> StepStats:
        batch = batch.to(device, non_blocking=True)
        weight, bias, target, ignore = kept_outputs(model, batch.tgt_out, self.cfg.model.pad_id)
        alpha = self.cfg.train.rdrop_alpha
        if alpha and torch.is_grad_enabled():  # R-Drop in training; validation: the plain loss
            loss, nll = self._rdrop_loss(model, batch, weight, bias, target, ignore, alpha)
        else:
            hidden = model(batch.src, batch.tgt_in, features_only=True)  # (B, T, D)
            loss, nll = projected_label_smoothed_nll_loss(
                hidden, weight, target, self.cfg.train.label_smoothing, ignore, bias
            )
        # with an output mask, a reference token outside it is skipped: not counted either
        n_targets = (
            batch.n_tgt_tokens if ignore == self.cfg.model.pad_id else int((target != ignore).sum())
        )
        return StepStats(loss, nll, n_targets, batch.n_src_tokens + batch.n_tgt_tokens)

    def _rdrop_loss(
        self,
        model: nn.Module,
        batch: Any,
        weight: Tensor,
        bias: Tensor | None,
        target: Tensor,
        ignore: int,
        alpha: float,
    ) -> tuple[Tensor, Tensor]:
        """R-Drop (:func:`~aiayn.train.loss.rdrop_loss`): the batch twice in one forward pass
        (fairseq's ``duplicate_input``, so a DDP model sees one forward per backward), each copy
        with its own dropout masks; the logits of the non-padding targets are built (K, V) per
        copy, which the projected loss avoids."""
        B = batch.src.size(0)
        src, tgt_in = torch.cat([batch.src, batch.src]), torch.cat([batch.tgt_in, batch.tgt_in])
        hidden = model(src, tgt_in, features_only=True)  # (2B, T, D)
        keep = (target.reshape(-1) != ignore).nonzero().squeeze(1)  # (K,)
        rows = [h.reshape(-1, h.size(-1)).index_select(0, keep) for h in (hidden[:B], hidden[B:])]
        logits = nn.functional.linear(torch.cat(rows), weight, bias)  # (2K, V)
        gold = target.reshape(-1).index_select(0, keep)  # (K,)
        return rdrop_loss(logits, gold, self.cfg.train.label_smoothing, ignore, alpha)

    def valid_metrics(self, model: nn.Module, step: int) -> dict[str, float]:
        """Corpus BLEU (sacreBLEU) of the model's translations of the validation sources."""
        t = self.cfg.train
        if not hasattr(self, "_bleu_data"):
            src, ref = load_translation(self.cfg.data, self.cfg.data.valid_split)
            n = t.bleu_max_sentences or len(src)
            self._bleu_data = (list(src[:n]), list(ref[:n]))
        src, ref = self._bleu_data
        hyps = translate_texts(
            model, self.tokenizer, src, beam=t.bleu_beam, alpha=self.cfg.decode.alpha
        )
        scores = corpus_scores(hyps, ref)
        return {
            "valid_bleu": float(scores["bleu"]),
            "valid_bleu_lc": float(scores["bleu_lc"]),
            "valid_chrf": float(scores["chrf"]),
        }
