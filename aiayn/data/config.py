"""The data section of a run's configuration (``[data]`` in the trainer's TOML file).

One frozen dataclass, changed only through :func:`aiayn.config.apply_overrides` (dotted keys such
as ``data.vocab_size=10000``), like every other config in aiayn.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Literal

from aiayn.errors import ConfigError
from aiayn.kinds import KINDS, TRANSLATION, get_kind, kinds_taking

__all__ = ["DataConfig"]

# The keys that name the user's own data files (or folders of images).
OWN_FILE_KEYS = (
    "train_src",
    "train_tgt",
    "valid_src",
    "valid_tgt",
    "train_file",
    "valid_file",
    "train_dir",
    "valid_dir",
)
#: the augmentations data.augment may name (docs/vision.md#augmentation)
AUGMENTATIONS = ("crop", "flip", "erase")


@dataclass(frozen=True)
class DataConfig:
    """Which data a run reads, how it is tokenised and how it is batched."""

    # What the examples are: sentence pairs, labelled texts, or one running text.
    # masked_lm: BERT's masked-token pre-training of an encoder on a classification dataset's
    # texts (labels unused), for a classifier run to start from (train.init_from).
    # One of aiayn.kinds.KINDS: translation, classification, lm, masked_lm; the same word as
    # config.json's "kind". Was `data.task` (still read, with a warning).
    kind: str = TRANSLATION
    # A registered dataset (`aiayn data list`), or "" to read your own files given below.
    dataset: str = "multi30k"
    # Source and target language of a translation dataset (Multi30k: en, de).
    src_lang: str = "en"
    tgt_lang: str = "de"
    # Split names used for training and validation (Multi30k: train, val, test_2016_flickr, ...).
    train_split: str = "train"
    valid_split: str = "val"
    # Your own parallel text files, one sentence per line, line i of src translating line i of tgt.
    train_src: str = ""
    train_tgt: str = ""
    valid_src: str = ""
    valid_tgt: str = ""
    # Your own classification data (.tsv `label<TAB>text` or .jsonl {"text", "label"}) or LM text.
    train_file: str = ""
    valid_file: str = ""
    # Your own images (image_classification): a folder with one subfolder of PNG/JPEG files per
    # class, the subfolder's name the class's name. Without valid_dir, a seeded share
    # (valid_fraction) of train_dir's images is held out for validation.
    train_dir: str = ""
    valid_dir: str = ""
    # image_classification: the share of the training images held out as the validation split
    # (Fashion-MNIST's "val", or train_dir's without valid_dir), drawn with valid_seed: the same
    # images whatever data.seed, so settings chosen on them compare across runs.
    valid_fraction: float = 0.1
    valid_seed: int = 0
    # image_classification, training only, off by default: "crop" (pad by crop_padding pixels
    # of background, cut back to the image size at a random offset), "flip" (left-right, half of
    # the images: for classes that have no handedness) and "erase" (random erasing, Zhong et al.
    # 2020: with probability erase_prob a rectangle of 2-33% of the image filled with noise).
    augment: tuple[str, ...] = ()
    crop_padding: int = 4
    erase_prob: float = 0.25
    # Subword model (one joint vocabulary for source and target, §3.4) or characters.
    tokenizer: Literal["bpe", "unigram", "char"] = "bpe"
    # Vocabulary size including the 4 special tokens (the paper: 37000 BPE for WMT En-De).
    vocab_size: int = 8000
    # Lower-case all text in the subword tokenizer's normaliser (saved with it, so decoding,
    # `classify` and `evaluate` lower-case too); the paper's models keep case. A translation
    # model's output is recased (aiayn/data/recase.py, learned from the training targets).
    lowercase: bool = False
    # BPE-dropout (Provilkov et al. 2020), translation training only: every time a training pair
    # goes into a batch it is re-encoded with each BPE merge skipped with this probability, so the
    # model sees many segmentations of the same words. Batches are planned on the plain encoding's
    # lengths; validation, BLEU and decoding use the plain tokenizer. The draws come from the
    # tokenizers library's own generator, which takes no seed: such runs do not repeat exactly.
    bpe_dropout: float = 0.0
    # Token budget per batch, padding included (the paper: ~25000 source + 25000 target tokens).
    max_tokens: int = 4096
    # Translation: pad each batch's source and target widths up to a multiple of this (1: off),
    # within the token budget, as Hugging Face's pad_to_multiple_of; the padding is masked, so the
    # loss is unchanged. Fewer distinct batch shapes (a GPU pays for each new one) for more
    # batches per epoch (docs/design/data.md#batching).
    pad_to_multiple: int = 1
    # Translation: pad each batch's source and target widths up to the smallest of these widths
    # (ascending; the largest at least max_len) that holds them, and cut each bucket's examples
    # into batches of the same rows (budget // width; the bucket's last batch fewer), so that an
    # epoch's batch shapes are a few dozen, each seen again every epoch: what a GPU's first sight
    # of a shape, a warm-up (train.warm_shapes) or a captured graph wants. () = off.
    bucket_widths: tuple[int, ...] = ()
    # Longest sequence kept for training, in tokens with BOS/EOS; longer examples are dropped.
    max_len: int = 256
    # What to do with classification texts longer than max_len: drop them, or cut them (logged).
    long_examples: Literal["filter", "truncate"] = "filter"
    # Cleaning of the training split while its token store is built (docs/data.md#cleaning):
    # drop a pair whose longer side has more than this many times the tokens of the shorter
    # (Moses' clean-corpus-n uses 9; 0 turns it off), and exact repeats of an earlier example.
    max_len_ratio: float = 0.0
    dedup: bool = False
    # The subword (or char) tokenizer learns from at most this many training examples (pairs,
    # texts, lines of an LM's text; an LM's characters are all counted): a uniform sample with a
    # fixed seed when there are more, so its time and memory stop growing with the corpus
    # (docs/experiments/code_notes.md#the-tokenizers-sample-memory). A split with fewer gives the
    # tokenizer of the whole split.
    tokenizer_sample: int = 1_000_000
    # masked_lm: the share of each text's tokens the model must predict (BERT: 0.15).
    mask_prob: float = 0.15
    # Seed of the per-epoch batch shuffle (with the epoch number).
    seed: int = 0

    def __post_init__(self) -> None:
        self.validate()

    def _check_buckets(self) -> None:
        widths = self.bucket_widths
        if "bucket_widths" not in get_kind(self.kind).takes:
            raise ConfigError(
                f"data.bucket_widths pads the batches of data.kind = "
                f"{kinds_taking('bucket_widths')}; data.kind is {self.kind!r}"
            )
        if self.pad_to_multiple > 1:
            raise ConfigError("data.bucket_widths pads batches without data.pad_to_multiple")
        if list(widths) != sorted(set(widths)) or widths[0] < 1 or widths[-1] < self.max_len:
            raise ConfigError(
                f"data.bucket_widths must be positive, ascending and reach data.max_len "
                f"({self.max_len}), got {list(widths)}"
            )

    def _check_images(self, takes: frozenset[str]) -> None:
        unknown = [a for a in self.augment if a not in AUGMENTATIONS]
        if unknown:
            raise ConfigError(
                f"data.augment: unknown augmentation '{unknown[0]}' (have: {', '.join(AUGMENTATIONS)})"
            )
        if self.augment and "augment" not in takes:
            raise ConfigError(
                f"data.augment applies to data.kind = {kinds_taking('augment')}, not '{self.kind}'"
            )
        if not 0.0 < self.valid_fraction < 1.0:
            raise ConfigError(f"data.valid_fraction must be in (0, 1), got {self.valid_fraction}")
        if self.crop_padding < 0 or not 0.0 <= self.erase_prob <= 1.0:
            raise ConfigError(
                "data.crop_padding must be >= 0 and data.erase_prob in [0, 1], got "
                f"{self.crop_padding} and {self.erase_prob}"
            )

    @property
    def own_files(self) -> list[str]:
        """The user's data files the config names (``train_src``, …, ``valid_file``)."""
        return [getattr(self, name) for name in OWN_FILE_KEYS if getattr(self, name)]

    def with_absolute_paths(self) -> DataConfig:
        """This config with its own files' paths absolute (``~`` expanded, relative ones against
        the working directory): what a run folder records, so that ``--resume`` from another
        directory, or of a moved run folder, reads the same files."""
        paths = {n: getattr(self, n) for n in OWN_FILE_KEYS if getattr(self, n)}
        return replace(
            self, **{n: os.path.abspath(os.path.expanduser(p)) for n, p in paths.items()}
        )

    @property
    def uses_own_files(self) -> bool:
        """True when the run reads the user's files instead of a registered dataset."""
        return self.dataset == ""

    def validate(self) -> None:
        """Raise ConfigError naming the field when a value makes no sense."""
        if self.kind not in KINDS:
            kinds = ", ".join(map(repr, KINDS))
            raise ConfigError(f"data.kind: {self.kind!r} is not one of {kinds}")
        for name in ("vocab_size", "max_tokens", "max_len", "tokenizer_sample", "pad_to_multiple"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"data.{name} must be positive, got {getattr(self, name)}")
        takes = get_kind(self.kind).takes
        if self.pad_to_multiple > 1 and "pad_to_multiple" not in takes:
            raise ConfigError(
                f"data.pad_to_multiple pads the batches of data.kind = "
                f"{kinds_taking('pad_to_multiple')}; data.kind is {self.kind!r}"
            )
        if self.bucket_widths:
            self._check_buckets()
        if not 0.0 <= self.bpe_dropout < 1.0:
            raise ConfigError(f"data.bpe_dropout must be in [0, 1), got {self.bpe_dropout}")
        if self.bpe_dropout and (self.tokenizer != "bpe" or "bpe_dropout" not in takes):
            raise ConfigError(
                "data.bpe_dropout needs data.tokenizer = 'bpe' and data.kind = "
                f"{kinds_taking('bpe_dropout')}"
            )
        if self.max_len_ratio and self.max_len_ratio < 1.0:
            raise ConfigError(
                f"data.max_len_ratio must be 0 (off) or at least 1, got {self.max_len_ratio}"
            )
        self._check_images(takes)
        if not 0.0 < self.mask_prob < 1.0:
            raise ConfigError(f"data.mask_prob must be in (0, 1), got {self.mask_prob}")
        if self.lowercase and self.tokenizer == "char":
            raise ConfigError("data.lowercase needs a subword tokenizer (bpe or unigram), not char")
        if self.tokenizer != "char" and self.vocab_size <= 4:
            raise ConfigError(
                f"data.vocab_size must exceed the 4 special tokens, got {self.vocab_size}"
            )
        given = [name for name in OWN_FILE_KEYS if getattr(self, name)]
        if given and self.dataset:
            raise ConfigError(
                f"data.dataset='{self.dataset}' and data.{given[0]} are both set; "
                "set data.dataset='' to use your own files"
            )
        if "langs" in takes and self.src_lang == self.tgt_lang and self.dataset:
            raise ConfigError(f"data.src_lang and data.tgt_lang are both '{self.src_lang}'")
