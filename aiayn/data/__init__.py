"""The data pipeline: datasets (registry, verified download or mirror, cache), readers for the
user's own files, tokenizers, token stores (tokenized once, read by offset), token-budget batching
and collate functions.

Typical use (translation)::

    cfg = DataConfig(dataset="multi30k", vocab_size=8000, max_tokens=4096)
    tokenizer = train_tokenizer_for(cfg)             # trained on (a sample of) the training split
    train = translation_store(cfg, tokenizer, "train")  # tokenized once, read by offset, cleaned
    sampler = TokenBatchSampler(train.lengths("src"), train.lengths("tgt") + 1,
                                max_tokens=cfg.max_tokens, seed=cfg.seed)
    for epoch in range(n):
        sampler.set_epoch(epoch)
        for indices in sampler:
            batch = collate_translation(list(zip(train.rows("src", indices),
                                                 train.rows("tgt", indices))))
"""

from aiayn.data.batching import (
    ClassificationBatch,
    Seq2SeqBatch,
    TokenBatchSampler,
    collate_classification,
    collate_translation,
    pad_sequences,
    padding_fraction,
    pair_lengths,
)
from aiayn.data.config import DataConfig
from aiayn.data.loaders import (
    classification_store,
    data_source,
    lm_store,
    load_classification,
    load_lm_text,
    load_translation,
    prepare_classification,
    prepare_lm,
    prepare_translation,
    split_stores,
    train_tokenizer_for,
    training_texts,
    translation_files,
    translation_store,
)
from aiayn.data.readers import read_labelled, read_lines, read_parallel, read_text
from aiayn.data.registry import (
    DATASETS,
    cache_dir,
    download_dataset,
    get_spec,
    is_downloaded,
)
from aiayn.data.store import TokenStore, pair_store
from aiayn.data.tokenizer import (
    SPECIAL_TOKENS,
    CharTokenizer,
    SubwordTokenizer,
    Tokenizer,
    train_tokenizer,
)

__all__ = [
    "DataConfig",
    "DATASETS",
    "download_dataset",
    "get_spec",
    "cache_dir",
    "is_downloaded",
    "read_text",
    "read_lines",
    "read_parallel",
    "read_labelled",
    "load_translation",
    "load_classification",
    "load_lm_text",
    "training_texts",
    "data_source",
    "train_tokenizer_for",
    "prepare_translation",
    "translation_files",
    "translation_store",
    "classification_store",
    "lm_store",
    "split_stores",
    "TokenStore",
    "pair_store",
    "prepare_classification",
    "prepare_lm",
    "Tokenizer",
    "SubwordTokenizer",
    "CharTokenizer",
    "train_tokenizer",
    "SPECIAL_TOKENS",
    "TokenBatchSampler",
    "pair_lengths",
    "padding_fraction",
    "pad_sequences",
    "Seq2SeqBatch",
    "collate_translation",
    "ClassificationBatch",
    "collate_classification",
]
