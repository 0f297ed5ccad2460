"""Training speed: aiayn's trainer against a plain ``torch.nn.Transformer`` and Hugging Face Marian.

Three systems with the same shape (aiayn's SMALL or BASE preset, one joint vocabulary, tied
embeddings and output projection, post-LN, sinusoidal positions, dropout 0.1 on residuals and
embeddings only, label smoothing 0.1, Adam-type optimizer with fp32 master weights):

* ``aiayn``  — the trainer's own update (:meth:`aiayn.train.trainer.Trainer.update`: collate,
  ``TranslationTask.loss``, backward, gradient norm, optimizer step), so every change to the model,
  the loss or the trainer shows up here as users get it;
* ``torch``  — the straightforward PyTorch model: ``nn.Embedding`` × √d + sinusoids, ``nn.Transformer``
  (batch-first, bool masks), the tied projection and ``F.cross_entropy(label_smoothing=0.1,
  ignore_index=pad)``, ``torch.optim.AdamW``;
* ``marian`` — ``transformers.MarianMTModel`` from a ``MarianConfig`` of the same shape (random init,
  SDPA attention), logits through the same ``F.cross_entropy``, AdamW.

The batches are real Multi30k En→De batches from aiayn's data pipeline (joint BPE tokenizer trained
with the config's vocabulary size, length-bucketed, ``--max-tokens`` padded tokens per batch, about
3.9k target tokens; full batches only): the same token ids go to every system. Each system runs in its own worker
process (so that its peak RSS is its own, and a baseline never imports aiayn or inherits its
start-up settings); the parent hands the workers one batch at a time, round-robin, so that load from
other jobs on the machine hits all systems alike. Warm-up steps are excluded; every number is the
median over the timed steps. tokens/s counts source + target tokens without padding.

Image presets (``vit``, and ``dry-vit`` for the smoke tests): the patch Vision Transformer of
configs/fashion_mnist_vit.toml as it was when this preset was written (issue 67): width 128,
4 layers, 28x28 images in 4x4 patches (the recipe now makes its tokens with a conv stem,
``model.stem = "conv"``, which PlainViT does not have, and has 3 layers); two systems:

* ``aiayn`` — the trainer's own update on an ``ImageClassificationTask`` (collate from the image
  store, loss, backward, gradient norm, optimizer step);
* ``torch`` — :class:`PlainViT`: a ``Conv2d`` patch projection, a class token, learned positions,
  ``nn.TransformerEncoder`` (batch-first, pre-LN, GELU) and a linear head, trained with
  ``F.cross_entropy(label_smoothing=0.1)`` and ``torch.optim.AdamW``.

The batches are the recipe's 128 Fashion-MNIST training images each (``vit``: from aiayn's image
store, read from ``AIAYN_DATA_MIRROR`` or downloaded; ``dry-vit``: random pixels), the same images
to both systems; tokens/s counts 50 tokens per image (49 patches and the class token). The same
math: PlainViT's weights copied into aiayn's model give the same fp32 loss on the first batch.

MFU = model FLOPs per step / step time / the matmul peak (bf16 or fp32, as the run) measured by this
script on the same cores (or GPU) in the same run; the FLOP count is :func:`train_flops` (see
docs/performance.md).

    python benchmarks/bench_train.py [--threads N] [--presets small base] [--precisions fp32 bf16]
    python benchmarks/bench_train.py --device cuda --out DIR/bench_train   # bf16 on a GPU

writes docs/experiments/performance.json (one entry per thread count, or per device on a GPU, kept across runs)
and the table between the markers of docs/experiments/performance.md. With ``--device cuda`` every system runs
on the GPU (aiayn through its trainer with ``train.device``), step times include a
``torch.cuda.synchronize()``, and memory is the peak of ``torch.cuda.max_memory_allocated``.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import pickle
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ROOT = Path(__file__).resolve().parent.parent
CLEAN_ENV = dict(os.environ)  # the environment before anything of aiayn is imported
SYSTEMS = ("aiayn", "torch", "marian")
IMAGE_SYSTEMS = ("aiayn", "torch")  # no Marian for images
BEGIN, END = "<!-- bench_train:begin -->", "<!-- bench_train:end -->"
# Steps per preset (warm-up, timed): a BASE step costs ~8x a SMALL one (train_flops).
STEPS = {"small": (2, 6), "base": (1, 6), "dry": (1, 1), "dry-base": (1, 1), "vit": (2, 10),
         "dry-vit": (1, 2)}


# --------------------------------------------------------------------------------------------
# Shapes, batches and the FLOP count
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """The model shape shared by all three systems (fields named as in aiayn's ModelConfig)."""

    vocab_size: int
    d_model: int
    n_heads: int
    d_ff: int
    n_encoder_layers: int
    n_decoder_layers: int
    dropout: float = 0.1
    max_len: int = 256
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2


PRESETS = {  # aiayn's presets "small" and "base" with the vocabulary of issue 7
    "small": Shape(8000, 256, 4, 1024, 3, 3),
    "base": Shape(32000, 512, 8, 2048, 6, 6),
    # benchmarks/gpu_check.py --dry-run and the smoke tests: the code paths, fast. Two of them, as
    # small and base are two, so that a run of several presets is exercised too.
    "dry": Shape(500, 32, 2, 64, 1, 1),
    "dry-base": Shape(500, 48, 4, 96, 2, 2),
}


@dataclass(frozen=True)
class VitShape:
    """An image preset: a Vision Transformer (fields named as in aiayn's ModelConfig, so that
    :class:`PlainViT` takes either) and the images per batch."""

    d_model: int
    n_heads: int
    d_ff: int
    n_encoder_layers: int
    image_size: int = 28
    patch_size: int = 4
    channels: int = 1
    n_classes: int = 10
    norm_first: bool = True
    activation: str = "gelu"
    dropout: float = 0.1
    images: int = 128  # per batch: the recipe's data.max_tokens 6400 / 50 tokens per image

    @property
    def tokens(self) -> int:
        """Tokens per image: the patches and the class token."""
        return (self.image_size // self.patch_size) ** 2 + 1


VIT_PRESETS = {  # the recipe's first patch ViT (width 128, 4 layers); a tiny stand-in for smoke tests
    "vit": VitShape(128, 4, 256, 4),
    "dry-vit": VitShape(16, 2, 32, 2, images=8),
}


@dataclass
class ImageSteps:
    """One image step's data: rows of the shipped images (the same for both systems)."""

    indices: list[int]
    n_tokens: int  # images × tokens per image


@dataclass
class Batch:
    """One step's data, the same token ids for every system."""

    indices: list[int]  # positions in the pairs list (aiayn's trainer collates them itself)
    src: Tensor  # (B, S)
    tgt_in: Tensor  # (B, T) BOS + y
    tgt_out: Tensor  # (B, T) y + EOS
    n_src: int  # non-pad source tokens
    n_tgt: int  # non-pad target tokens (the loss normaliser)

    @property
    def n_tokens(self) -> int:
        return self.n_src + self.n_tgt


def expected_params(s: Shape) -> int:
    """Trainable parameters of the shape: one tied embedding/projection, biases everywhere.

    Encoder layer: attention 4D²+4D, FFN 2DF+F+D, two LayerNorms 4D. Decoder layer: two attentions,
    FFN, three LayerNorms. (Sinusoidal positions are not trained.)
    """
    d, f = s.d_model, s.d_ff
    enc = 4 * d * d + 2 * d * f + 9 * d + f
    dec = 8 * d * d + 2 * d * f + 15 * d + f
    return s.vocab_size * d + s.n_encoder_layers * enc + s.n_decoder_layers * dec


def train_flops(s: Shape, src_lengths: list[int], tgt_lengths: list[int]) -> float:
    """Model FLOPs of one training step (forward + backward = 3 × forward), non-pad tokens only.

    Forward, per sentence of s source and t target tokens (one multiply-add = 2 FLOPs):
      encoder layer:  s·2(4D² + 2DF)                      projections and FFN
                      + 4s²D                              QKᵀ and AV
      decoder layer:  t·2(4D² + 2D² + 2DF) + s·2(2D²)     self-attn, cross-attn Q/O, FFN; cross K/V
                      + 2t²D                              causal self-attention (half of 4t²D)
                      + 4tsD                              cross-attention
      output:         t·2DV                               vocabulary projection
    LayerNorm, softmax, dropout, embeddings and the optimizer are not counted.
    """
    d, f, v = s.d_model, s.d_ff, s.vocab_size
    fwd = 0.0
    for n_s, n_t in zip(src_lengths, tgt_lengths):
        enc = n_s * 2 * (4 * d * d + 2 * d * f) + 4 * n_s * n_s * d
        dec = (n_t * 2 * (6 * d * d + 2 * d * f) + n_s * 2 * (2 * d * d)
               + 2 * n_t * n_t * d + 4 * n_t * n_s * d)
        fwd += s.n_encoder_layers * enc + s.n_decoder_layers * dec + n_t * 2 * d * v
    return 3.0 * fwd


def batch_flops(s: Shape, batch: Batch) -> float:
    src_len = (batch.src != s.pad_id).sum(1).tolist()
    tgt_len = (batch.tgt_out != s.pad_id).sum(1).tolist()
    return train_flops(s, src_len, tgt_len)


@functools.cache
def multi30k_pairs(vocab_size: int) -> tuple[list, int]:
    """Multi30k En→De training pairs as token ids of a joint BPE tokenizer of ``vocab_size``
    trained on them, and the tokenizer's vocabulary size (once per size: presets may share it)."""
    from aiayn.data import DataConfig, prepare_translation, train_tokenizer_for

    cfg = DataConfig(dataset="multi30k", src_lang="en", tgt_lang="de", train_split="train",
                     valid_split="val", tokenizer="bpe", vocab_size=vocab_size, max_len=128)
    tokenizer = train_tokenizer_for(cfg)
    pairs, _ = prepare_translation(cfg, tokenizer)
    return pairs, tokenizer.vocab_size


def multi30k_batches(s: Shape, max_tokens: int, n: int) -> tuple[list, list[Batch], dict]:
    """The first ``n`` batches of epoch 1 of Multi30k En→De through aiayn's data pipeline."""
    from aiayn.data import TokenBatchSampler, collate_translation, pair_lengths

    pairs, vocab = multi30k_pairs(s.vocab_size)
    sampler = TokenBatchSampler(*pair_lengths(pairs), max_tokens=max_tokens, seed=1)
    # Full batches only (the last batch of a length bucket can be tiny), so every step is ~4k
    # target tokens: padded size (B × widest side) at least 90% of the budget.
    widths = [max(len(x), len(y) + 1) for x, y in pairs]
    chosen = [b for b in sampler.batches(1) if len(b) * max(widths[i] for i in b) >= 0.9 * max_tokens][:n]
    used = sorted({i for b in chosen for i in b})  # ship only the pairs the batches use
    where = {i: k for k, i in enumerate(used)}
    pairs = [pairs[i] for i in used]
    batches = []
    for b in chosen:
        idx = [where[i] for i in b]
        c = collate_translation([pairs[i] for i in idx], s.pad_id, s.bos_id, s.eos_id)
        batches.append(Batch(idx, c.src, c.tgt_in, c.tgt_out, c.n_src_tokens, c.n_tgt_tokens))
    info = {"dataset": "multi30k en-de train: the first full batches of epoch 1 (seed 1)",
            "tokenizer": "joint BPE",
            "tokenizer_vocab": vocab, "max_tokens": max_tokens}
    return pairs, batches, info


# --------------------------------------------------------------------------------------------
# The three systems
# --------------------------------------------------------------------------------------------


class TrainerSystem:
    """What aiayn's two systems share: the Trainer on a task whose data is the benchmark's, and
    one update of it, its loss per counted unit (target token or image)."""

    def start(self, cfg: Any, task: Any, folder: str, device: str) -> None:
        from aiayn.train.distributed import DistContext
        from aiayn.train.run_folder import RunFolder
        from aiayn.train.trainer import Trainer

        self.task = task
        run = RunFolder(folder)
        run.prepare(resume=False)
        dist = DistContext(device=torch.device(device))
        self.trainer = Trainer(cfg, task, run, dist, {}, "", resume=False)
        self.model = self.trainer.model

    def update(self, indices: list[int], count: int) -> float:
        before = self.trainer._interval.loss  # summed loss of the applied updates so far
        if not self.trainer.update([indices]):
            return math.nan
        return (self.trainer._interval.loss - before) / count


class AiaynSystem(TrainerSystem):
    """aiayn's Trainer on a TranslationTask whose training pairs are the benchmark's pairs."""

    def __init__(self, s: Shape, precision: str, pairs: list, folder: str, seed: int = 1,
                 device: str = "cpu", **train_settings: Any) -> None:
        from aiayn.config import ModelConfig
        from aiayn.data import DataConfig, pair_store
        from aiayn.run_config import RunConfig, TrainConfig
        from aiayn.train.translation import TranslationTask

        model = ModelConfig(
            src_vocab_size=s.vocab_size, tgt_vocab_size=s.vocab_size, d_model=s.d_model,
            n_heads=s.n_heads, d_ff=s.d_ff, n_encoder_layers=s.n_encoder_layers,
            n_decoder_layers=s.n_decoder_layers, dropout=s.dropout, attention_dropout=0.0,
            activation_dropout=0.0, max_len=s.max_len, pad_id=s.pad_id, bos_id=s.bos_id,
            eos_id=s.eos_id)
        # AdamW (weight_decay > 0) like the peers; Adam costs the same.
        train = TrainConfig(**{"precision": precision, "weight_decay": 0.01, "label_smoothing": 0.1,
                               "seed": seed, "device": device,
                               **train_settings})
        cfg = RunConfig(model=model, data=DataConfig(), train=train)
        task = TranslationTask(cfg)
        self.pairs = pairs
        task.stores = {"train": pair_store(pairs), "valid": pair_store([])}
        self.start(cfg, task, folder, device)

    def step(self, batch: Batch) -> float:
        return self.update(batch.indices, batch.n_tgt)

    @torch.no_grad()
    def eval_loss(self, batch: Batch) -> float:
        """Label-smoothed loss per target token, dropout off, through the task's own loss."""
        from aiayn.data import collate_translation

        self.model.eval()
        pairs = [self.pairs[i] for i in batch.indices]
        m = self.task.cfg.model
        stats = self.task.loss(self.model, collate_translation(pairs, m.pad_id, m.bos_id, m.eos_id),
                               torch.device("cpu"))
        return float(stats.loss) / batch.n_tgt


def sinusoids(length: int, d_model: int) -> Tensor:
    """The paper's PE table (§3.5), (length, D): sin on even, cos on odd dimensions."""
    pos = torch.arange(length, dtype=torch.float64)[:, None]
    div = torch.pow(10000.0, torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    table = torch.zeros(length, d_model, dtype=torch.float64)
    table[:, 0::2], table[:, 1::2] = torch.sin(pos / div), torch.cos(pos / div)
    return table.float()


class PlainTransformer(nn.Module):
    """How one writes the paper's model with ``nn.Transformer``: embeddings × √D + sinusoids,
    dropout, post-LN stacks (nn.Transformer's extra final LayerNorms removed, as the paper has
    none), the output projection tied to the embedding. nn.Transformer's one ``dropout`` also
    drops attention weights and the FFN's inner activation; those two are switched off so that
    the regularisation equals aiayn's and Marian's (residual and embedding dropout only)."""

    def __init__(self, s: Shape) -> None:
        super().__init__()
        self.shape = s
        self.embed = nn.Embedding(s.vocab_size, s.d_model, padding_idx=s.pad_id)
        nn.init.normal_(self.embed.weight, std=s.d_model ** -0.5)
        with torch.no_grad():
            self.embed.weight[s.pad_id].zero_()
        self.register_buffer("pe", sinusoids(s.max_len, s.d_model), persistent=False)
        self.dropout = nn.Dropout(s.dropout)
        self.transformer = nn.Transformer(
            s.d_model, s.n_heads, s.n_encoder_layers, s.n_decoder_layers, s.d_ff, s.dropout,
            batch_first=True)
        self.transformer.encoder.norm = None
        self.transformer.decoder.norm = None
        self.transformer.encoder.use_nested_tensor = False  # eval takes the training path's math
        for layer in [*self.transformer.encoder.layers, *self.transformer.decoder.layers]:
            layer.dropout = nn.Identity()  # FFN inner activation
            for attn in (layer.self_attn, getattr(layer, "multihead_attn", None)):
                if attn is not None:
                    attn.dropout = 0.0  # attention weights

    def _embed(self, ids: Tensor) -> Tensor:
        x = self.embed(ids) * math.sqrt(self.shape.d_model)  # (B, L, D)
        return self.dropout(x + self.pe[: ids.size(1)])

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """Shape: src (B, S), tgt (B, T) -> logits (B, T, V)."""
        pad = self.shape.pad_id
        t = tgt.size(1)
        causal = torch.triu(torch.ones(t, t, dtype=torch.bool, device=tgt.device), 1)  # True = hidden
        h = self.transformer(
            self._embed(src), self._embed(tgt), tgt_mask=causal, src_key_padding_mask=src == pad,
            tgt_key_padding_mask=tgt == pad, memory_key_padding_mask=src == pad, tgt_is_causal=True)
        return F.linear(h, self.embed.weight)  # (B, T, V)


def marian_model(s: Shape) -> nn.Module:
    """A random ``MarianMTModel`` of the shape (shared, tied embeddings; ReLU; post-LN)."""
    from transformers import MarianConfig, MarianMTModel

    cfg = MarianConfig(
        vocab_size=s.vocab_size, decoder_vocab_size=s.vocab_size, d_model=s.d_model,
        encoder_layers=s.n_encoder_layers, decoder_layers=s.n_decoder_layers,
        encoder_attention_heads=s.n_heads, decoder_attention_heads=s.n_heads,
        encoder_ffn_dim=s.d_ff, decoder_ffn_dim=s.d_ff, activation_function="relu",
        max_position_embeddings=s.max_len, pad_token_id=s.pad_id, decoder_start_token_id=s.bos_id,
        bos_token_id=s.bos_id, eos_token_id=s.eos_id, scale_embedding=True,
        share_encoder_decoder_embeddings=True, tie_word_embeddings=True, dropout=s.dropout,
        attention_dropout=0.0, activation_dropout=0.0)
    return MarianMTModel(cfg)


class PeerSystem:
    """A baseline model trained the usual way: autocast forward, F.cross_entropy with label
    smoothing, backward of the per-target mean, AdamW."""

    def __init__(self, kind: str, s: Shape, precision: str, seed: int = 1,
                 device: str = "cpu") -> None:
        torch.manual_seed(seed)
        self.kind, self.shape, self.device = kind, s, torch.device(device)
        model = PlainTransformer(s) if kind == "torch" else marian_model(s)
        self.model = model.to(self.device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4, betas=(0.9, 0.98),
                                           eps=1e-9, weight_decay=0.01)
        self.dtype = torch.bfloat16 if precision == "bf16" else None

    def logits(self, batch: Batch) -> Tensor:
        batch = on_device(batch, self.device)
        if self.kind == "torch":
            return self.model(batch.src, batch.tgt_in)
        pad = self.shape.pad_id
        return self.model(input_ids=batch.src, attention_mask=(batch.src != pad).long(),
                          decoder_input_ids=batch.tgt_in,
                          decoder_attention_mask=(batch.tgt_in != pad).long()).logits

    def loss(self, batch: Batch) -> Tensor:
        """Summed label-smoothed loss over the non-pad targets."""
        with torch.autocast(self.device.type, dtype=self.dtype or torch.bfloat16,
                            enabled=self.dtype is not None):
            logits = self.logits(batch)  # (B, T, V)
            gold = batch.tgt_out.to(self.device).reshape(-1)
            return F.cross_entropy(logits.reshape(-1, logits.size(-1)), gold,
                                   ignore_index=self.shape.pad_id, label_smoothing=0.1,
                                   reduction="sum")

    def step(self, batch: Batch) -> float:
        self.model.train()
        loss = self.loss(batch)
        (loss / batch.n_tgt).backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.item() / batch.n_tgt

    @torch.no_grad()
    def eval_loss(self, batch: Batch) -> float:
        self.model.eval()
        return self.loss(batch).item() / batch.n_tgt


def on_device(batch: Batch, device: torch.device) -> Batch:
    """The batch with its tensors on ``device`` (the same object on the CPU)."""
    if device.type == "cpu":
        return batch
    move = lambda t: t.to(device, non_blocking=True)  # noqa: E731
    return Batch(batch.indices, move(batch.src), move(batch.tgt_in), move(batch.tgt_out),
                 batch.n_src, batch.n_tgt)


class PlainViT(nn.Module):
    """How one writes the ViT with PyTorch's own modules (Dosovitskiy et al. 2021, §3.1): a
    ``Conv2d`` patch projection (kernel = stride = P) of the pixels normalised to [-1, 1], a
    class token, learned positions, embedding dropout, ``nn.TransformerEncoder`` (its final
    LayerNorm when pre-LN), dropout and a linear head on the class token. ``cfg``: a
    :class:`VitShape` or an aiayn ModelConfig (the same field names). nn.TransformerEncoderLayer's
    one ``dropout`` also drops attention weights and the FFN's inner activation; those two are off,
    as in aiayn's model (residual and embedding dropout only). tests/test_vision.py checks aiayn's
    VisionTransformer against it (logits, loss, gradients)."""

    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.cfg = cfg
        n = (cfg.image_size // cfg.patch_size) ** 2
        self.proj = nn.Conv2d(cfg.channels, cfg.d_model, cfg.patch_size, cfg.patch_size)
        self.cls = nn.Parameter(torch.zeros(1, 1, cfg.d_model))
        self.pos = nn.Parameter(torch.zeros(1, n + 1, cfg.d_model))
        nn.init.trunc_normal_(self.pos, std=0.02)
        layer = nn.TransformerEncoderLayer(
            cfg.d_model, cfg.n_heads, cfg.d_ff, dropout=cfg.dropout, activation=cfg.activation,
            batch_first=True, norm_first=cfg.norm_first)
        layer.dropout = nn.Identity()  # FFN inner activation
        layer.self_attn.dropout = 0.0  # attention weights
        norm = nn.LayerNorm(cfg.d_model) if cfg.norm_first else None
        self.encoder = nn.TransformerEncoder(layer, cfg.n_encoder_layers, norm=norm,
                                             enable_nested_tensor=False)
        self.dropout = nn.Dropout(cfg.dropout)
        self.head = nn.Linear(cfg.d_model, cfg.n_classes)

    def forward(self, pixels: Tensor) -> Tensor:
        """Shape: pixels (B, C, H, W) in [0, 1] -> logits (B, K)."""
        x = self.proj((pixels - 0.5) / 0.5).flatten(2).transpose(1, 2)  # (B, N, D)
        x = torch.cat([self.cls.expand(x.size(0), -1, -1), x], dim=1) + self.pos  # (B, 1+N, D)
        h = self.encoder(self.dropout(x))  # (B, 1+N, D)
        return self.head(self.dropout(h[:, 0]))  # (B, K)


def vit_model_config(v: VitShape) -> Any:
    """aiayn's ModelConfig of the preset (dropout on residuals and embeddings only, as PlainViT)."""
    from aiayn.config import ModelConfig

    return ModelConfig(
        d_model=v.d_model, n_heads=v.n_heads, d_ff=v.d_ff, n_encoder_layers=v.n_encoder_layers,
        n_decoder_layers=0, dropout=v.dropout, attention_dropout=0.0, activation_dropout=0.0,
        norm_first=v.norm_first, activation=v.activation, image_size=v.image_size,
        patch_size=v.patch_size, channels=v.channels, pooling="cls", n_classes=v.n_classes,
        class_names=tuple(str(i) for i in range(v.n_classes)))


class AiaynVitSystem(TrainerSystem):
    """aiayn's Trainer on an ImageClassificationTask whose training images are the benchmark's."""

    def __init__(self, v: VitShape, precision: str, images: Tensor, labels: Tensor, folder: str,
                 seed: int = 1, device: str = "cpu") -> None:
        import numpy as np

        from aiayn.data import DataConfig
        from aiayn.data.images import ImageSet
        from aiayn.kinds import IMAGE_CLASSIFICATION
        from aiayn.run_config import RunConfig, TrainConfig
        from aiayn.train.images import ImageClassificationTask

        model = vit_model_config(v)
        data = DataConfig(kind=IMAGE_CLASSIFICATION, dataset="fashion_mnist",
                          max_tokens=v.images * v.tokens)
        train = TrainConfig(precision=precision, weight_decay=0.05, label_smoothing=0.1,
                            seed=seed, device=device)
        cfg = RunConfig(model=model, data=data, train=train)
        task = ImageClassificationTask(cfg)
        store = ImageSet(images.numpy(), labels.numpy(), list(model.class_names))
        task.classes = list(model.class_names)
        task.splits = {"train": (store, np.arange(len(store))), "valid": (store, np.arange(0))}
        self.start(cfg, task, folder, device)

    def step(self, batch: ImageSteps) -> float:
        return self.update(batch.indices, len(batch.indices))

    @torch.no_grad()
    def eval_loss(self, batch: ImageSteps) -> float:
        """Label-smoothed loss per image, dropout off, through the task's own loss."""
        self.model.eval()
        images = self.task.collate("train", batch.indices)
        return float(self.task.loss(self.model, images, torch.device("cpu")).loss) / len(images)


class PeerVitSystem:
    """:class:`PlainViT` trained the usual way: uint8 images to floats, autocast forward,
    F.cross_entropy with label smoothing, backward of the per-image mean, AdamW."""

    def __init__(self, v: VitShape, precision: str, images: Tensor, labels: Tensor,
                 seed: int = 1, device: str = "cpu") -> None:
        torch.manual_seed(seed)
        self.device, self.images, self.labels = torch.device(device), images, labels
        self.model = PlainViT(v).to(self.device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4, betas=(0.9, 0.999),
                                           eps=1e-8, weight_decay=0.05)
        self.dtype = torch.bfloat16 if precision == "bf16" else None

    def loss(self, batch: ImageSteps) -> Tensor:
        """Summed label-smoothed loss over the batch's images (rows in ascending order, as
        aiayn's collate reads them)."""
        rows = torch.tensor(sorted(batch.indices))
        pixels = self.images[rows].to(self.device).float().div_(255.0)  # (B, C, H, W)
        with torch.autocast(self.device.type, dtype=self.dtype or torch.bfloat16,
                            enabled=self.dtype is not None):
            logits = self.model(pixels)  # (B, K)
            return F.cross_entropy(logits.float(), self.labels[rows].to(self.device),
                                   label_smoothing=0.1, reduction="sum")

    def step(self, batch: ImageSteps) -> float:
        self.model.train()
        loss = self.loss(batch)
        (loss / len(batch.indices)).backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.item() / len(batch.indices)

    @torch.no_grad()
    def eval_loss(self, batch: ImageSteps) -> float:
        self.model.eval()
        return self.loss(batch).item() / len(batch.indices)


def build_vit_system(name: str, v: VitShape, precision: str, images: Tensor, labels: Tensor,
                     folder: str, seed: int = 1, device: str = "cpu"):
    if name == "aiayn":
        return AiaynVitSystem(v, precision, images, labels, folder, seed, device=device)
    if name == "torch":
        return PeerVitSystem(v, precision, images, labels, seed, device=device)
    raise ValueError(f"no system {name!r} for images (have: {', '.join(IMAGE_SYSTEMS)})")


def build_system(name: str, s: Shape, precision: str, pairs: list, folder: str, seed: int = 1,
                 device: str = "cpu"):
    if name == "aiayn":
        return AiaynSystem(s, precision, pairs, folder, seed, device=device)
    if name in ("torch", "marian"):
        return PeerSystem(name, s, precision, seed, device=device)
    raise ValueError(f"unknown system {name!r} (have: {', '.join(SYSTEMS)})")


def trainable_params(model: nn.Module) -> int:
    seen = {id(p): p for p in model.parameters() if p.requires_grad}  # tied weights once
    return sum(p.numel() for p in seen.values())


# --------------------------------------------------------------------------------------------
# "Same math": the torch baseline's weights copied into aiayn give the same loss
# --------------------------------------------------------------------------------------------


def _linears(module: nn.Module, skip: tuple[nn.Module, ...] = ()) -> list[nn.Linear]:
    """Linear layers of ``module`` in registration order, leaving out those inside ``skip``."""
    skipped = {id(m) for s in skip for m in s.modules()}
    return [m for m in module.modules() if isinstance(m, nn.Linear) and id(m) not in skipped]


def _copy_attention(ours: nn.Module, ref: nn.MultiheadAttention) -> None:
    """nn.MultiheadAttention packs Q, K, V in one in_proj; ours may keep them apart or fused, as
    long as its projections are registered in Q, K, V order with out_proj last."""
    projs = [m for m in _linears(ours) if m is not ours.out_proj]
    sizes = [m.out_features for m in projs]
    for lin, w, b in zip(projs, ref.in_proj_weight.split(sizes), ref.in_proj_bias.split(sizes)):
        lin.weight.copy_(w)
        lin.bias.copy_(b)
    ours.out_proj.load_state_dict(ref.out_proj.state_dict())


def _copy_layer(ours: nn.Module, ref: nn.Module, decoder: bool) -> None:
    attns = [m for m in ours.children() if hasattr(m, "out_proj")]  # self (and cross) attention
    for a, r in zip(attns, [ref.self_attn] + ([ref.multihead_attn] if decoder else [])):
        _copy_attention(a, r)
    norms = [m for m in ours.modules() if isinstance(m, nn.LayerNorm)]
    for n, r in zip(norms, [ref.norm1, ref.norm2] + ([ref.norm3] if decoder else [])):
        n.load_state_dict(r.state_dict())
    ffn = _linears(ours, skip=tuple(attns))
    ffn[0].load_state_dict(ref.linear1.state_dict())
    ffn[1].load_state_dict(ref.linear2.state_dict())


@torch.no_grad()
def copy_plain_to_aiayn(plain: PlainTransformer, model: nn.Module) -> None:
    """Load the torch baseline's weights into an aiayn Transformer of the same shape."""
    model.src_embed.token.weight.copy_(plain.embed.weight)  # shared with tgt and the projection
    for ours, ref in zip(model.encoder.layers, plain.transformer.encoder.layers):
        _copy_layer(ours, ref, decoder=False)
    for ours, ref in zip(model.decoder.layers, plain.transformer.decoder.layers):
        _copy_layer(ours, ref, decoder=True)


def same_math(s: Shape, batch: Batch, pairs: list, folder: str) -> dict[str, float]:
    """fp32 eval loss of the torch baseline and of aiayn with the baseline's weights copied in."""
    plain = PeerSystem("torch", s, "fp32")
    ours = AiaynSystem(s, "fp32", pairs, folder)
    copy_plain_to_aiayn(plain.model, ours.model)
    ref, got = plain.eval_loss(batch), ours.eval_loss(batch)
    return {"torch_loss": ref, "aiayn_loss": got, "abs_diff": abs(ref - got),
            "sentences": len(batch.indices)}


@torch.no_grad()
def copy_plain_vit_to_aiayn(plain: PlainViT, model: nn.Module) -> None:
    """Load PlainViT's weights into an aiayn VisionTransformer of the same shape."""
    model.embed.proj.load_state_dict(plain.proj.state_dict())
    model.embed.cls.copy_(plain.cls)
    model.embed.pos.copy_(plain.pos)
    model.head.load_state_dict(plain.head.state_dict())
    for ours, ref in zip(model.encoder.layers, plain.encoder.layers):
        _copy_layer(ours, ref, decoder=False)
    if plain.encoder.norm is not None:
        model.encoder.norm.load_state_dict(plain.encoder.norm.state_dict())


def same_math_vit(v: VitShape, batch: ImageSteps, images: Tensor, labels: Tensor,
                  folder: str) -> dict[str, float]:
    """fp32 eval loss of PlainViT and of aiayn's ViT with PlainViT's weights copied in."""
    plain = PeerVitSystem(v, "fp32", images, labels)
    ours = AiaynVitSystem(v, "fp32", images, labels, folder)
    copy_plain_vit_to_aiayn(plain.model, ours.model)
    ref, got = plain.eval_loss(batch), ours.eval_loss(batch)
    return {"torch_loss": ref, "aiayn_loss": got, "abs_diff": abs(ref - got),
            "images": len(batch.indices)}


# --------------------------------------------------------------------------------------------
# Matmul peak
# --------------------------------------------------------------------------------------------


def matmul_peak(dtype: torch.dtype, sizes: tuple[int, ...] = (1024, 2048), reps: int = 5,
                device: str = "cpu") -> float:
    """Best GFLOP/s of an n×n×n matmul on this process's threads (or on the GPU ``device``;
    there each timing spans 10 products between two synchronisations)."""
    dev = torch.device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    inner = 10 if dev.type == "cuda" else 1
    best = 0.0
    for n in sizes:
        a, b = (torch.randn(n, n, device=dev).to(dtype) for _ in range(2))
        for _ in range(2):
            a @ b
        for _ in range(reps):
            sync()
            start = time.perf_counter()
            for _ in range(inner):
                a @ b
            sync()
            best = max(best, inner * 2 * n**3 / (time.perf_counter() - start) / 1e9)
    return best


def matmul_peaks(device: str = "cpu", sizes: tuple[int, ...] | None = None) -> dict[str, float]:
    """bf16 and fp32 matmul peaks in GFLOP/s at ``sizes`` (default: 4096 and 8192 on a GPU, 1024
    and 2048 on the CPU); on a GPU fp32 is true fp32, as TF32 is off."""
    if sizes is None:
        sizes = (4096, 8192) if torch.device(device).type == "cuda" else (1024, 2048)
    return {"bf16": matmul_peak(torch.bfloat16, sizes, device=device),
            "fp32": matmul_peak(torch.float32, sizes, device=device)}


# --------------------------------------------------------------------------------------------
# Workers: one process per system, driven step by step over pipes
# --------------------------------------------------------------------------------------------


def worker_main() -> None:
    """Run in a child: read a spec, build the system, then answer step/rss/quit requests."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed by libraries goes to stderr, not into the protocol
    inp = os.fdopen(0, "rb")
    spec = pickle.load(inp)
    torch.set_num_threads(spec["threads"])
    data = torch.load(spec["data"], weights_only=True)  # lists, ints and tensors only
    image = "images" in data  # an image preset
    batches = [(ImageSteps if image else Batch)(**b) for b in data["batches"]]
    device = spec.get("device", "cpu")
    cuda = torch.device(device).type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    with tempfile.TemporaryDirectory() as folder:
        if image:
            system = build_vit_system(spec["system"], VitShape(**spec["shape"]), spec["precision"],
                                      data["images"], data["labels"], folder, device=device)
        else:
            system = build_system(spec["system"], Shape(**spec["shape"]), spec["precision"],
                                  data["pairs"], folder, device=device)
        _send(out, {"params": trainable_params(system.model)})
        while True:
            req = pickle.load(inp)
            if req[0] == "step":
                sync()
                start = time.perf_counter()
                loss = system.step(batches[req[1]])
                sync()
                _send(out, {"seconds": time.perf_counter() - start, "loss": loss})
            elif req[0] == "rss":
                mem = {"max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}
                if cuda:
                    mem["max_gpu_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
                _send(out, mem)
            else:
                return


def _send(stream, obj: Any) -> None:
    pickle.dump(obj, stream)
    stream.flush()


class Worker:
    """The parent's handle on one worker process."""

    def __init__(self, spec: dict[str, Any], script: str = __file__) -> None:
        """``script --worker`` (this benchmark's by default; bench_finetune.py reuses it)."""
        env = {**CLEAN_ENV, "OMP_NUM_THREADS": str(spec["threads"]),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), CLEAN_ENV.get("PYTHONPATH")]))}
        self.name = spec["system"]
        self.proc = subprocess.Popen([sys.executable, script, "--worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, cwd=ROOT)
        _send(self.proc.stdin, spec)

    def ask(self, *request: Any) -> dict[str, Any]:
        if request:
            _send(self.proc.stdin, request)
        try:
            return pickle.load(self.proc.stdout)
        except EOFError:
            raise RuntimeError(f"benchmark worker '{self.name}' died (exit code "
                               f"{self.proc.wait()}); its error is above") from None

    def quit(self) -> None:
        """Ask the worker to exit, without waiting for it (a group's workers exit side by side)."""
        if self.proc.poll() is None:
            _send(self.proc.stdin, ("quit",))


def run_group(systems: list[str], spec: dict[str, Any], n_steps: int, warmup: int = 0,
              warm_pass: bool = False) -> dict[str, Any]:
    """Start one worker per system, then run steps 0..n_steps-1 round-robin (the order rotates
    each step). With ``warm_pass``, the timed batches (``warmup``..n_steps-1) are first stepped
    through once each, by every system alike, after the warm-up steps: their seconds are kept
    apart (``first_sight_seconds``), so that every timed step sees a batch shape seen before.
    Returns per-system step seconds, losses, parameter count and peak RSS."""
    workers = [Worker({**spec, "system": name}) for name in systems]
    steps = list(range(n_steps))
    if warm_pass:
        steps = steps[:warmup] + [-1 - i for i in steps[warmup:]] + steps[warmup:]  # -1-i: warm i
    try:
        result = {w.name: {"params": w.ask()["params"], "seconds": [], "loss": [],
                           "first_sight_seconds": []} for w in workers}
        for k, i in enumerate(steps):
            for w in workers[k % len(workers):] + workers[:k % len(workers)]:
                r = w.ask("step", i if i >= 0 else -1 - i)
                if i < 0:
                    result[w.name]["first_sight_seconds"].append(r["seconds"])
                    continue
                result[w.name]["seconds"].append(r["seconds"])
                result[w.name]["loss"].append(r["loss"])
            what = f"step {i + 1}/{n_steps}" if i >= 0 else f"warm pass {-i}/{n_steps}"
            key = "seconds" if i >= 0 else "first_sight_seconds"
            print(f"  {what}: " + ", ".join(
                f"{n} {result[n][key][-1]:.2f}s" for n in systems), flush=True)
        for w in workers:
            mem = w.ask("rss")
            result[w.name]["max_rss_mib"] = mem["max_rss_kib"] / 1024
            if "max_gpu_mib" in mem:
                result[w.name]["max_gpu_mib"] = mem["max_gpu_mib"]
    finally:
        for w in workers:
            w.quit()
        for w in workers:
            w.proc.wait(timeout=60)
    return result


# --------------------------------------------------------------------------------------------
# Summary and reports
# --------------------------------------------------------------------------------------------


def summarise(raw: dict[str, Any], batches: list[Batch], flops: list[float], warmup: int,
              peak: float) -> dict[str, Any]:
    """Medians over the timed steps, and aiayn's paired speed-up over the faster peer."""
    timed = range(warmup, len(batches))
    out = {}
    for name, r in raw.items():
        sec = [r["seconds"][i] for i in timed]
        tok_s = [batches[i].n_tokens / r["seconds"][i] for i in timed]
        mfu = [flops[i] / r["seconds"][i] / 1e9 / peak for i in timed]
        first = r.get("first_sight_seconds") or []
        seen = {"first_sight_step_s": statistics.median(first),
                "first_sight_ratio": statistics.median(first) / statistics.median(sec)} if first else {}
        out[name] = {"tokens_per_s": statistics.median(tok_s), "step_s": statistics.median(sec),
                     "mfu": statistics.median(mfu), "max_rss_mib": r["max_rss_mib"], **seen,
                     **({"max_gpu_mib": r["max_gpu_mib"]} if "max_gpu_mib" in r else {}),
                     "params": r["params"], "loss_first": r["loss"][0], "loss_last": r["loss"][-1],
                     "tokens_per_s_steps": tok_s}
    peers = [n for n in out if n != "aiayn"]
    if "aiayn" in out and peers:
        best = max(peers, key=lambda n: out[n]["tokens_per_s"])
        ratio = [raw[best]["seconds"][i] / raw["aiayn"]["seconds"][i] for i in timed]
        out["aiayn"]["speedup_vs"] = best
        out["aiayn"]["speedup"] = statistics.median(ratio)
    return out


def _fmt(x: float) -> str:
    return f"{x / 1000:.2f}k" if x >= 1000 else f"{x:.0f}"


def markdown(report: dict[str, Any]) -> str:
    lines = ["", "*Written by `benchmarks/bench_train.py`; edit outside the markers.*", ""]
    for key in sorted(report["runs"]):
        run = report["runs"][key]
        m = run["meta"]
        gpu = m.get("device", "cpu") != "cpu"
        mem, mem_key = ("peak GPU MiB", "max_gpu_mib") if gpu else ("peak RSS MiB", "max_rss_mib")
        title = m["hardware"] if gpu else f"{m['threads']} thread{'s' if m['threads'] > 1 else ''}"
        lines += [f"### {title} — {m['date']}", "",
                  f"`{m['command']}` (aiayn {m.get('aiayn', 'commit not recorded')})  ",
                  f"{m['hardware']}; torch {m['torch']}, transformers "
                  f"{m['transformers']}; load average (1/5/15 min) {_load(m['load_start'])} at start, "
                  f"{_load(m['load_end'])} at end; matmul peak bf16 {m['peak_gflops']['bf16']:.0f} "
                  f"GFLOP/s, fp32 {m['peak_gflops']['fp32']:.0f} GFLOP/s.", "",
                  f"| config | precision | system | tokens/s | step s | MFU | {mem} | params | "
                  "aiayn speed-up |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]
        for g in run["groups"]:
            for name, r in g["systems"].items():
                up = f"{r['speedup']:.2f}× vs {r['speedup_vs']}" if "speedup" in r else ""
                lines.append(f"| {g['preset']} | {g['precision']} | {name} | {_fmt(r['tokens_per_s'])} | "
                             f"{r['step_s']:.3f} | {100 * r['mfu']:.1f}% | {r.get(mem_key, 0):.0f} | "
                             f"{r['params'] / 1e6:.2f}M | {up} |")
        seen = [f"{g['preset']} {name} {r['first_sight_step_s']:.3f} s ({r['first_sight_ratio']:.1f}× "
                f"its timed step)" for g in run["groups"] for name, r in g["systems"].items()
                if "first_sight_step_s" in r]
        if seen:
            lines += ["", "Every timed batch was stepped through once before (a warm pass, every "
                      "system alike); the warm pass's median step, the first sight of each "
                      "batch's shape: " + "; ".join(seen) + "."]
        lines += ["", *targets(run), ""]
        for preset, sm in run["same_math"].items():
            if "images" in sm:  # an image preset
                lines.append(f"Same math ({preset}, fp32, dropout off, {sm['images']} images): "
                             f"nn.TransformerEncoder ViT loss {sm['torch_loss']:.6f}, aiayn with "
                             f"its weights {sm['aiayn_loss']:.6f} (|Δ| {sm['abs_diff']:.1e}).  ")
                continue
            lines.append(f"Same math ({preset}, fp32, dropout off, {sm['sentences']} sentences): "
                         f"nn.Transformer loss {sm['torch_loss']:.6f}, aiayn with its weights "
                         f"{sm['aiayn_loss']:.6f} (|Δ| {sm['abs_diff']:.1e}).  ")
        for preset, d in run["data"].items():
            if "images_per_step" in d:
                lines.append(f"Batches ({preset}): {d['steps']} batches ({d['warmup']} warm-up) "
                             f"of {d['images_per_step']} images, {d['tokens_per_image']} tokens "
                             f"each; {d['dataset']}.  ")
                continue
            lines.append(f"Batches ({preset}): {d['steps']} real Multi30k batches "
                         f"({d['warmup']} warm-up), {d['src_tokens']:.0f} source + "
                         f"{d['tgt_tokens']:.0f} target tokens per step on average, "
                         f"{d['sentences']:.0f} sentences, tokenizer vocabulary "
                         f"{d['tokenizer_vocab']}.  ")
        lines += [""]
    return "\n".join(lines)


def targets(run: dict[str, Any]) -> list[str]:
    """Issue 7's targets, as measured in ``run``: bf16 speed-up ≥ 2.0×, BASE bf16 MFU ≥ 25 %,
    SMALL peak RSS ≤ 2 GiB; issue 67's: the ViT ≥ 1.5× the nn.TransformerEncoder ViT."""
    got = {(g["preset"], g["precision"]): g["systems"].get("aiayn") for g in run["groups"]}
    lines = []
    for preset in ("small", "base"):
        a = got.get((preset, "bf16"))
        if a and "speedup" in a:
            lines.append(f"Target: {preset} bf16 ≥ 2.0× the faster peer — measured "
                         f"{a['speedup']:.2f}× ({'met' if a['speedup'] >= 2.0 else 'not met'}).  ")
    a = got.get(("base", "bf16"))
    if a:
        lines.append(f"Target: base bf16 MFU ≥ 25 % — measured {100 * a['mfu']:.1f}% "
                     f"({'met' if a['mfu'] >= 0.25 else 'not met'}).  ")
    for precision in ("fp32", "bf16"):  # issue 67
        a = got.get(("vit", precision))
        if a and "speedup" in a:
            lines.append(f"Target: vit {precision} ≥ 1.5× the nn.TransformerEncoder ViT — measured "
                         f"{a['speedup']:.2f}× ({'met' if a['speedup'] >= 1.5 else 'not met'}).  ")
    rss = [a["max_rss_mib"] for (p, _), a in got.items() if p == "small" and a]
    if rss:
        lines.append(f"Target: small peak RSS ≤ 2 GiB — measured {max(rss):.0f} MiB "
                     f"({'met' if max(rss) <= 2048 else 'not met'}).  ")
    return lines


def _load(avg: list[float]) -> str:
    return "/".join(f"{x:.2f}" for x in avg)


def write_reports(run: dict[str, Any], out: Path) -> None:
    """Merge ``run`` into OUT.json (keyed by thread count) and rewrite OUT.md's marked section."""
    from aiayn.io import write_section

    json_path, md_path = out.with_suffix(".json"), out.with_suffix(".md")
    out.parent.mkdir(parents=True, exist_ok=True)
    report = json.loads(json_path.read_text()) if json_path.exists() else {"runs": {}}
    device = run["meta"].get("device", "cpu")
    key = f"threads={run['meta']['threads']}" if device == "cpu" else f"device={device}"
    report["runs"][key] = run
    json_path.write_text(json.dumps(report, indent=1) + "\n")
    write_section(md_path, BEGIN, END, markdown(report), new_file="# Performance\n")


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def aiayn_version() -> str:
    """The commit measured, with "+dirty" when aiayn/ has uncommitted changes (they are measured)."""
    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        except OSError:  # no git (a copy of the checkout on a GPU machine)
            return ""
    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return commit + ("+dirty" if git("status", "--porcelain", "--", "aiayn") else "")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads per worker")
    p.add_argument("--device", default="cpu", help="cpu, or cuda (cuda:N): every system on the GPU")
    p.add_argument("--presets", nargs="+", default=["small", "base"],
                   choices=[*PRESETS, *VIT_PRESETS],
                   help="translation presets, or vit (the Fashion-MNIST ViT recipe's model)")
    p.add_argument("--precisions", nargs="+", default=None, choices=["fp32", "bf16"],
                   help="default: fp32 and bf16, or fp32 alone on a CPU without AVX512-BF16/AMX; "
                   "bf16 alone on a GPU")
    p.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=list(SYSTEMS))
    p.add_argument("--max-tokens", type=int, default=4096, help="padded tokens per batch")
    p.add_argument("--steps", type=int, nargs=2, metavar=("WARMUP", "TIMED"), action="append",
                   help="override the steps of every preset (default small 2+6, base 1+6)")
    p.add_argument("--warm-pass", choices=["auto", "on", "off"], default="auto",
                   help="step through the timed batches once before timing them, every system "
                   "alike, so that no timed step sees a batch shape first (auto: on a GPU, where "
                   "a first sight costs ~0.3 s; the CPU's figures stay comparable with before)")
    p.add_argument("--peak-sizes", type=int, nargs="+", default=None, metavar="N",
                   help="n of the n×n×n matmuls of the peak (default 1024 2048; 4096 8192 on a GPU)")
    p.add_argument("--date", default=str(date.today()))
    p.add_argument("--hardware", default=None,
                   help="the machine, for the table (default: the CPU's name and flags, shared with other jobs)")
    p.add_argument("--out", default=str(ROOT / "docs" / "experiments" / "performance"), help="writes OUT.json, OUT.md")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:  # a baseline's worker never imports aiayn (its spec says everything)
        return args
    from aiayn.env import cpu_name  # here, not at the top: CLEAN_ENV is taken before aiayn loads
    from aiayn.train.distributed import cpu_has_bf16

    cuda = torch.device(args.device).type == "cuda"
    if cuda and not torch.cuda.is_available():
        p.error(f"--device {args.device}: CUDA is not available on this machine")
    args.warm_pass = args.warm_pass == "on" or (args.warm_pass == "auto" and cuda)
    if args.hardware is None:
        args.hardware = (torch.cuda.get_device_name(args.device) if cuda
                         else f"{cpu_name()}, shared with other jobs")
    if args.precisions is None and cuda:
        args.precisions = ["bf16"]
    if args.precisions is None:
        args.precisions = ["fp32", "bf16"] if cpu_has_bf16() else ["fp32"]
        if len(args.precisions) == 1:
            print("bf16 left out: this CPU has no AVX512-BF16/AMX (--precisions bf16 runs it "
                  "anyway, in a slow fallback)", flush=True)
    return args


def vit_batches(v: VitShape, preset: str, n: int) -> tuple[Tensor, Tensor, list[ImageSteps], dict]:
    """``n`` batches of ``v.images`` training images: the images (uint8 (N, C, H, W)) and labels
    shipped to the workers, the batches' rows in them, and what the data is. ``vit``: the first
    images of a seeded shuffle of Fashion-MNIST's training split (aiayn's image store); ``dry-vit``:
    random pixels and labels."""
    import numpy as np

    count = n * v.images
    if preset.startswith("dry"):
        rng = np.random.default_rng(1)
        images = rng.integers(0, 256, (count, v.channels, v.image_size, v.image_size), dtype=np.uint8)
        labels = rng.integers(0, v.n_classes, count)
        info = {"dataset": "random pixels and labels (seed 1)"}
    else:
        from aiayn.data import DataConfig
        from aiayn.data.images import split_images
        from aiayn.kinds import IMAGE_CLASSIFICATION

        cfg = DataConfig(kind=IMAGE_CLASSIFICATION, dataset="fashion_mnist")
        store, rows = split_images(cfg, "train", v.image_size, v.channels)
        picked = np.random.default_rng(1).permutation(rows)[:count]
        images, labels = store.images[picked], store.labels[picked]
        info = {"dataset": "fashion_mnist train split: the first images of a shuffle (seed 1)"}
    batches = [ImageSteps(list(range(i, i + v.images)), v.images * v.tokens)
               for i in range(0, count, v.images)]
    return (torch.from_numpy(np.ascontiguousarray(images)),
            torch.from_numpy(labels.astype(np.int64)), batches, info)


def bench_vit_preset(preset: str, args, folder: str) -> tuple[list[dict], dict, dict]:
    """An image preset: aiayn's ViT against PlainViT (and the same-math check)."""
    from aiayn.model.vision import flops_per_image

    v = VIT_PRESETS[preset]
    warmup, timed = tuple(args.steps[-1]) if args.steps else STEPS[preset]
    images, labels, batches, info = vit_batches(v, preset, warmup + timed)
    n = len(batches)
    data_file = os.path.join(folder, f"{preset}.pt")
    torch.save({"images": images, "labels": labels, "batches": [vars(b) for b in batches]},
               data_file)
    flops = [3.0 * flops_per_image(vit_model_config(v)) * len(b.indices) for b in batches]
    check = same_math_vit(v, batches[0], images, labels, os.path.join(folder, f"same_math_{preset}"))
    data = {**info, "steps": n, "warmup": warmup, "images_per_step": v.images,
            "tokens_per_image": v.tokens, "flops_per_step": flops}
    systems = [name for name in args.systems if name in IMAGE_SYSTEMS]
    groups = []
    for precision in args.precisions:
        print(f"{preset} {precision}: {n} steps ({warmup} warm-up) x {len(systems)} systems, "
              f"{args.threads} threads", flush=True)
        spec = {"shape": vars(v), "precision": precision, "threads": args.threads,
                "data": data_file, "device": args.device}
        raw = run_group(systems, spec, n, warmup, args.warm_pass)
        groups.append({"preset": preset, "precision": precision, "raw": raw, "batches": batches,
                       "flops": flops, "warmup": warmup})
    return groups, check, data


def bench_preset(preset: str, args, folder: str) -> tuple[list[dict], dict, dict]:
    if preset in VIT_PRESETS:
        return bench_vit_preset(preset, args, folder)
    s = PRESETS[preset]
    warmup, timed = tuple(args.steps[-1]) if args.steps else STEPS[preset]
    pairs, batches, info = multi30k_batches(s, args.max_tokens, warmup + timed)
    n = len(batches)
    data_file = os.path.join(folder, f"{preset}.pt")
    torch.save({"pairs": pairs, "batches": [vars(b) for b in batches]}, data_file)
    flops = [batch_flops(s, b) for b in batches]
    probe = batches[0]
    k = min(32, len(probe.indices))  # a slice of the first batch is enough for the loss check
    sub = Batch(probe.indices[:k], probe.src[:k], probe.tgt_in[:k], probe.tgt_out[:k],
                int((probe.src[:k] != s.pad_id).sum()), int((probe.tgt_out[:k] != s.pad_id).sum()))
    # A run folder of its own per preset: the trainer refuses a folder that exists (no overwrite).
    check = same_math(s, sub, pairs, os.path.join(folder, f"same_math_{preset}"))
    data = {**info, "steps": n, "warmup": warmup, "sentences": statistics.mean(len(b.indices) for b in batches),
            "src_tokens": statistics.mean(b.n_src for b in batches),
            "tgt_tokens": statistics.mean(b.n_tgt for b in batches), "flops_per_step": flops}
    groups = []
    for precision in args.precisions:
        print(f"{preset} {precision}: {n} steps ({warmup} warm-up) x {len(args.systems)} systems, "
              f"{args.threads} threads", flush=True)
        spec = {"shape": vars(s), "precision": precision, "threads": args.threads, "data": data_file,
                "device": args.device}
        raw = run_group(args.systems, spec, n, warmup, args.warm_pass)
        groups.append({"preset": preset, "precision": precision, "raw": raw, "batches": batches,
                       "flops": flops, "warmup": warmup})
    return groups, check, data


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        return worker_main()
    try:
        import transformers

        transformers_version = transformers.__version__
    except ImportError:
        if "marian" in args.systems:
            raise
        transformers_version = "not installed"
    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()
    started = time.time()
    sizes = tuple(args.peak_sizes) if args.peak_sizes else None
    peaks = matmul_peaks(args.device, sizes)
    groups, checks, data = [], {}, {}
    with tempfile.TemporaryDirectory() as folder:
        for preset in args.presets:
            g, checks[preset], data[preset] = bench_preset(preset, args, folder)
            groups += g
    end_peaks = matmul_peaks(args.device, sizes)
    peaks = {k: max(peaks[k], end_peaks[k]) for k in peaks}
    meta = {"command": "python benchmarks/bench_train.py " + shlex.join(sys.argv[1:] if argv is None else argv),
            "date": args.date, "hardware": args.hardware, "threads": args.threads,
            "device": args.device,
            "cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
            "transformers": transformers_version, "python": platform.python_version(),
            "load_start": list(load_start), "load_end": list(os.getloadavg()),
            "wall_s": round(time.time() - started, 1), "peak_gflops": peaks, "aiayn": aiayn_version(),
            "warm_pass": args.warm_pass,
            "tokens": "source + target tokens without padding",
            "flops": "train_flops(): 3 x forward matmul FLOPs of non-pad tokens (docs/performance.md)"}
    run = {"meta": meta, "same_math": checks, "data": data, "groups": [
        {"preset": g["preset"], "precision": g["precision"],
         "systems": summarise(g["raw"], g["batches"], g["flops"], g["warmup"],
                              peaks[g["precision"]])} for g in groups]}
    write_reports(run, Path(args.out))
    print(markdown({"runs": {"this": run}}))


if __name__ == "__main__":
    main()
