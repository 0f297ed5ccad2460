"""Model folders for the server tests: tiny, random or briefly trained."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import torch
from trainutil import tiny_model_config

from aiayn.folder.checkpoint import save_model_dir
from aiayn.config import ModelConfig
from aiayn.data import train_tokenizer
from aiayn.model import Transformer, TransformerClassifier, TransformerLM

WORDS = "the a cat dog sits runs on under mat table red blue".split()


def sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6))) for _ in range(n)]


def tiny_cfg(**kw) -> ModelConfig:
    return tiny_model_config(vocab=304, max_len=32, **kw)


def make_folder(path: Path, kind: str = "seq2seq", **extra) -> Path:
    tok = train_tokenizer(sentences(400, 0), "bpe", vocab_size=300)
    torch.manual_seed(0)
    if kind == "seq2seq":
        cfg = tiny_cfg()
        model = Transformer(cfg)
    elif kind == "classifier":
        cfg = tiny_cfg(n_decoder_layers=0, n_classes=3)
        model = TransformerClassifier(cfg)
    else:
        cfg = tiny_cfg(n_encoder_layers=0)
        model = TransformerLM(cfg)
    return save_model_dir(
        path, model.eval(), cfg, kind=kind, tokenizer_json=tok.to_str(), extra=extra
    )


PAIRS = [
    ("a cat sits on the mat", "eine katze sitzt auf der matte"),
    ("a dog runs in the park", "ein hund rennt im park"),
    ("two girls play football", "zwei mädchen spielen fußball"),
]


def make_trained_folder(path: Path, steps: int = 60) -> Path:
    """A small translation model that has learned PAIRS by heart (a few seconds on one thread):
    its translations are real words, so the page shows something readable."""
    import torch.nn.functional as F

    from aiayn.data.batching import collate_translation

    tok = train_tokenizer([s for pair in PAIRS for s in pair] * 5, "bpe", vocab_size=300)
    cfg = tiny_model_config(vocab=tok.vocab_size, max_len=48, n_heads=2)
    torch.manual_seed(1)
    model = Transformer(cfg)
    batch = collate_translation([(tok.encode(s), tok.encode(t)) for s, t in PAIRS])
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        logits = model(batch.src, batch.tgt_in)  # (B, T, V)
        loss = F.cross_entropy(
            logits.flatten(0, 1), batch.tgt_out.flatten(), ignore_index=cfg.pad_id
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    return save_model_dir(
        path,
        model.eval(),
        cfg,
        tokenizer_json=tok.to_str(),
        extra={"decode": {"beam": 4, "alpha": 0.6}},
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


IMAGE_CLASSES = ["dark", "light", "striped"]


def make_image_folder(path: Path, pooling: str = "cls") -> Path:
    """A random tiny Vision Transformer of 28x28 grey images (patches of 7: a 4x4 grid), 3
    classes with names."""
    from aiayn.model import VisionTransformer

    torch.manual_seed(0)
    cfg = ModelConfig(
        d_model=16, n_heads=2, d_ff=32, n_encoder_layers=2, n_decoder_layers=0, dropout=0.0,
        image_size=28, patch_size=7, pooling=pooling, n_classes=3, class_names=IMAGE_CLASSES,
    )
    model = VisionTransformer(cfg)
    torch.nn.init.normal_(model.head.weight, std=0.5)  # zero-initialised: all classes equal
    return save_model_dir(path, model.eval(), cfg, kind="image_classification")
