"""A tiny Hugging Face Marian model in the Hub's layout, built locally (no network).

:func:`build_marian` (the session fixture ``marian_folder`` of conftest.py) trains two small
SentencePiece models on Multi30k (English source, German target, from the data mirror), writes
the joint ``vocab.json`` the way OPUS-MT folders have it (``</s>`` 0, ``<unk>`` 1, the pieces of
both models, ``<pad>`` last), builds a seeded ``MarianMTModel``, trains it for a few seconds (a
random one repeats one token to max_length) and gives it a random ``final_logits_bias`` with an
EOS bias (outputs end at different lengths, some at max_length), and saves model, tokenizer and
generation settings as ``save_pretrained`` does. The tests skip, saying why, without
transformers, sentencepiece or the data.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest
import torch

VOCAB = 160  # pieces per SentencePiece model
# Not 20: transformers 4.x reads a max_length equal to its default (20) as unset and generates
# 20 new tokens, where 5.x generates max_length - 1 (docs/huggingface.md).
MAX_LENGTH = 22
STEPS = 300  # AdamW steps (seconds): a model that writes German-like pieces and learnt EOS
# generation_config.json as OPUS-MT folders have it (the ids of <pad> filled in).
GENERATION = {"max_length": MAX_LENGTH, "num_beams": 4, "eos_token_id": 0, "forced_eos_token_id": 0}
EOS_BIAS = 3.0  # on final_logits_bias: outputs of varied length, some cut at max_length


def sentences(lang: str, n: int, skip: int = 0) -> list[str]:
    """Lines ``skip`` … ``skip + n`` of Multi30k's training text in ``lang`` (en or de)."""
    mirror = os.environ.get("AIAYN_DATA_MIRROR")
    path = Path(mirror or "/nonexistent") / "multi30k" / f"train.{lang}.gz"
    if not path.is_file():
        pytest.skip(f"needs the Multi30k mirror ({path} not found; set AIAYN_DATA_MIRROR)")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = [line.strip() for _, line in zip(range(skip + n), f)]
    return lines[skip:]


def _train_spm(lines: list[str], prefix: Path) -> Path:
    import sentencepiece

    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_prefix=str(prefix),
        vocab_size=VOCAB,
        character_coverage=1.0,
        minloglevel=2,
        num_threads=1,  # the same pieces on every run
    )
    return prefix.with_suffix(".model")


def write_marian_tokenizer(folder: Path) -> dict[str, int]:
    """source.spm, target.spm, vocab.json (and tokenizer files) in ``folder``; the vocabulary."""
    import sentencepiece

    folder.mkdir(parents=True, exist_ok=True)
    source = _train_spm(sentences("en", 600), folder / "src")
    target = _train_spm(sentences("de", 600), folder / "tgt")
    vocab = {"</s>": 0, "<unk>": 1}
    for path in (source, target):
        processor = sentencepiece.SentencePieceProcessor(model_file=str(path))
        for i in range(processor.get_piece_size()):
            piece = processor.id_to_piece(i)
            if not processor.is_control(i) and not processor.is_unknown(i):
                vocab.setdefault(piece, len(vocab))
    vocab["<pad>"] = len(vocab)
    source.rename(folder / "source.spm")
    target.rename(folder / "target.spm")
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    for name in ("src.vocab", "tgt.vocab"):
        (folder / name).unlink()
    return vocab


def _train(model, tokenizer, steps: int, seed: int) -> None:
    """A few hundred AdamW steps on Multi30k En→De: outputs of varied length that end with EOS
    (a random Marian model repeats one token to max_length), then a random final_logits_bias
    (a buffer that training leaves at 0) so that the import must carry it."""
    torch.manual_seed(seed)
    src, tgt = sentences("en", 600), sentences("de", 600)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        index = torch.randint(0, len(src), (32,)).tolist()
        batch = tokenizer(
            [src[i] for i in index],
            text_target=[tgt[i] for i in index],
            return_tensors="pt",
            padding=True,
            truncation=True,
            max_length=32,
        )
        batch["labels"] = batch["labels"].masked_fill(
            batch["labels"] == tokenizer.pad_token_id, -100
        )
        loss = model(**batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        generator = torch.Generator().manual_seed(seed)
        bias = 0.3 * torch.randn(model.final_logits_bias.shape, generator=generator)
        bias[0, model.config.eos_token_id] += EOS_BIAS  # ends before max_length, not always
        model.final_logits_bias.copy_(bias)


def _init(model, seed: int) -> None:
    """Weights drawn here as Marian's init draws them (normal, std ``init_std``; biases 0,
    LayerNorms 1 and 0; the pad row 0), not by transformers' own init, which draws differently in
    4.x and 5.x: the same starting model, and so much the same trained one, with either."""
    generator = torch.Generator().manual_seed(seed)
    std = model.config.init_std
    with torch.no_grad():
        for name, p in model.named_parameters():  # the tied embeddings once; the same order
            if "embed_positions" in name:  # the sinusoids: computed, not drawn
                continue
            if "layer_norm" in name:
                p.fill_(1.0 if name.endswith("weight") else 0.0)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=generator) * std)
        model.get_input_embeddings().weight[model.config.pad_token_id] = 0.0


def build_marian(folder: Path, seed: int = 0, **config) -> Path:
    """A tiny random MarianMTModel with its tokenizer, saved in the Hub's layout."""
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    vocab = write_marian_tokenizer(folder)
    pad = vocab["<pad>"]
    values = dict(
        vocab_size=len(vocab),
        decoder_vocab_size=len(vocab),
        d_model=16,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=64,
        activation_function="swish",
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        scale_embedding=True,
        pad_token_id=pad,
        eos_token_id=0,
        decoder_start_token_id=pad,
        forced_eos_token_id=0,
    )
    model = MarianMTModel(MarianConfig(**{**values, **config}))
    _init(model, seed)  # the same model on every run, with transformers 4.x or 5.x
    tokenizer = MarianTokenizer(
        str(folder / "source.spm"), str(folder / "target.spm"), str(folder / "vocab.json")
    )
    _train(model, tokenizer, STEPS, seed)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    generation = dict(GENERATION, bad_words_ids=[[pad]], decoder_start_token_id=pad)
    generation["pad_token_id"] = pad
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2))
    return folder
