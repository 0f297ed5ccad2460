"""The CTranslate2 backend: a translation model written by ``aiayn export --format ctranslate2``,
decoded by CTranslate2's own beam search on the CPU.

CTranslate2 reads and writes token strings: :func:`token_strings` names every id (the exporter
writes the same list as the model's vocabulary, :func:`check_vocabulary` checks it when the folder
is opened). It runs translation with n-best lists, its threads split between ``workers`` batches
decoded at once; no ensembles, attention weights, bf16 autocast (quantise at export instead),
language models or classifiers.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from aiayn.config import ModelConfig
from aiayn.data.spm import SentencePieceTokenizer
from aiayn.data.tokenizer import SPECIAL_TOKENS, CharTokenizer, SubwordTokenizer
from aiayn.decode.config import DecodeConfig, SamplingConfig
from aiayn.decode.search import Hypothesis
from aiayn.decode.translate import max_output_lengths
from aiayn.env import cpu_flags, cpu_info, env_value
from aiayn.errors import CheckpointError, require
from aiayn.runtime.backend import refuse

log = logging.getLogger(__name__)

__all__ = [
    "Ct2Translator",
    "Ct2Backend",
    "computed_as",
    "token_strings",
    "check_vocabulary",
    "open_ct2",
]


def token_strings(tokenizer: Any, size: int) -> list[str]:
    """One distinct string per token id 0 … size-1: CTranslate2's vocabulary (and what its
    translator reads and writes). Ids without a name of their own get ``<aiayn:ID>``."""
    if isinstance(tokenizer, SentencePieceTokenizer):  # its own pieces, its own special ids
        return [tokenizer.piece(i) for i in range(size)]
    names: list[str] = []
    seen: set[str] = set()
    for i in range(size):
        name = SPECIAL_TOKENS[i] if i < len(SPECIAL_TOKENS) else None
        if name is None and isinstance(tokenizer, SubwordTokenizer):
            name = tokenizer.hf.id_to_token(i)
        elif (
            name is None
            and isinstance(tokenizer, CharTokenizer)
            and i - len(SPECIAL_TOKENS) < len(tokenizer.chars)
        ):
            name = tokenizer.chars[i - len(SPECIAL_TOKENS)]
        if name is None or name in seen:
            name = f"<aiayn:{i}>"
        seen.add(name)
        names.append(name)
    return names


def check_vocabulary(model_dir: Path, tokens: list[str], cfg: Any) -> None:
    """CheckpointError when the CTranslate2 model's vocabularies are not ``tokens`` (the token
    strings of the folder's tokenizer.json, :func:`token_strings`) cut to config.json's sizes:
    a tokenizer.json or config.json from another model. A file CTranslate2 did not write here
    (an older layout) is left to CTranslate2's own reader."""
    expected = {
        "shared_vocabulary.json": ("src_vocab_size", cfg.src_vocab_size),
        "source_vocabulary.json": ("src_vocab_size", cfg.src_vocab_size),
        "target_vocabulary.json": ("tgt_vocab_size", cfg.tgt_vocab_size),
    }
    for name, (field, size) in expected.items():
        try:
            vocabulary = json.loads((model_dir / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(vocabulary, list):
            continue
        if len(vocabulary) != size:
            raise CheckpointError(
                f"{model_dir.parent}: config.json says {field} = {size}, the CTranslate2 model "
                f"has {len(vocabulary)} tokens (the folder's parts come from different models)"
            )
        if vocabulary != tokens[:size]:
            raise CheckpointError(
                f"{model_dir.parent}: tokenizer.json is not the tokenizer the CTranslate2 model "
                "was exported with (their tokens differ; the folder's parts come from different "
                "models)"
            )


def _length_penalty(cfg: DecodeConfig) -> float:
    """CTranslate2's length penalty exponent lp (it ranks by log P / |Y|^lp) for ``cfg``'s
    (GNMT approximated by |Y|^α: warned)."""
    return {"gnmt": cfg.alpha, "average": 1.0, "none": 0.0, "power": cfg.alpha}[cfg.length_penalty]


def _warn_unmapped(cfg: DecodeConfig) -> None:
    """A warning for each setting of ``cfg`` that CTranslate2 can only approximate."""
    if cfg.length_penalty == "gnmt":
        log.warning(
            "ctranslate2 has no GNMT length penalty; ranking by log P / |Y|^%s instead "
            "(length_penalty='average' ranks exactly as aiayn does: --set "
            "decode.length_penalty=average, or translate(length_penalty='average'))",
            cfg.alpha,
        )
    if cfg.beam > 1 and not cfg.early_stopping:
        log.warning(
            "ctranslate2 has no early_stopping=false (Hugging Face's heuristic); a sentence "
            "stops at %d finished hypotheses instead",
            cfg.beam,
        )
    if cfg.beam > 1 and cfg.forced_eos:
        log.warning(
            "ctranslate2 has no forced EOS at the length cap; beams cut there are ranked "
            "with their last token's log-probability, not EOS at 0, and another may win"
        )


def int8_computed_in_float32(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether an int8 model runs in float32 on this CPU (``compute_type="float32"``: its int8
    weights widened once at load): where CTranslate2's own choice of int8 kernels is oneDNN's
    without VNNI (an x86 CPU with AVX2, not from Intel, with neither AVX512-VNNI nor AVX-VNNI),
    and the user has not chosen them with ``CT2_USE_MKL`` (empty: not chosen). There oneDNN's u8·s8 products
    saturate, and MKL's int8 (``CT2_USE_MKL=1``) is slow. On a 2-core AMD EPYC with AVX2 only,
    the demo model's int8 export computed in float32 kept the float32 export's speed and most of
    its sentences; oneDNN's int8 changed more of them and lost BLEU, MKL's took twice the time
    (docs/runtime.md#which-backend-when). A tiny model decodes fewer of its training sentences
    right on oneDNN's int8 than in float32 (tests/test_export.py;
    docs/experiments/fast_defaults_2026-11-29.md#third-run-int8-on-a-cpu-without-vnni)."""
    info = cpu_info(cpuinfo)
    if env_value("CT2_USE_MKL") is not None or info is None:  # CT2_USE_MKL="": not chosen
        return False
    flags = cpu_flags(info)
    return (
        "avx2" in flags
        and info.get("vendor_id") != "GenuineIntel"
        and not flags & {"avx512_vnni", "avx_vnni"}
    )


class Ct2Translator:
    """A translation model exported by ``aiayn export --format ctranslate2``, decoded
    by CTranslate2's own beam search (see :meth:`translate_ids` for how settings map)."""

    def __init__(
        self,
        folder: Path,
        cfg: ModelConfig,
        tokens: list[str],
        threads: int | None = None,
        workers: int = 1,
        compute_type: str = "default",
    ) -> None:
        ct2 = require("ctranslate2", "ctranslate2", "running a CTranslate2 model")
        self.cfg = cfg
        self.tokens = tokens
        self.ids = {token: i for i, token in enumerate(tokens)}
        try:
            self.translator = ct2.Translator(
                str(folder),
                device="cpu",
                compute_type=compute_type,
                inter_threads=workers,
                intra_threads=max(1, (threads or torch.get_num_threads()) // workers),
            )
        except Exception as err:  # RuntimeError, IndexError, ValueError…: whatever the reader met
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise CheckpointError(
                f"{folder}: not a readable CTranslate2 model ({first[:200]})"
            ) from None

    def translate_ids(
        self,
        sources: Sequence[list[int]],
        cfg: DecodeConfig = DecodeConfig(),
        progress: Callable[[int], None] | None = None,
        prefixes: Sequence[list[int]] | None = None,
    ) -> list[list[Hypothesis]]:
        """Decode source ids; per source its ``cfg.nbest`` hypotheses ([] for an empty source).

        Settings map onto ``translate_batch`` as follows. Length penalty: CTranslate2 ranks
        finished hypotheses by log P / |Y|^lp, |Y| counting EOS here (``return_end_token``), so
        ``average`` is lp = 1 and ranks exactly as aiayn does; ``none`` is lp = 0, but CTranslate2
        then stops a sentence as soon as its best beam ends instead of waiting for k finished
        hypotheses; GNMT's ((5 + |Y|) / 6)^α has no equivalent and is approximated by |Y|^α
        (a warning says so); ``power`` is lp = α. ``bad_ids`` are ``suppress_sequences``;
        ``forced_eos`` replaces the last token of a hypothesis cut at the cap by EOS (exact for
        greedy search; a beam search ranks the beams cut there with their last token's
        log-probability, not EOS at 0, and a warning says so); ``early_stopping=False`` has no
        CTranslate2 equivalent (docs/huggingface.md says why) and is warned. ``prefixes`` are
        ``target_prefix``; ``repetition_penalty`` and ``no_repeat_ngram_size`` are CTranslate2's
        own, which penalise the generated tokens' scores before its softmax, where aiayn
        penalises log-probabilities with BOS counted (Hugging Face's way): outputs may differ.
        The cap a·src_len + b is per sentence: one call at the batch's largest cap, then one per
        cap for the sentences whose own cap could change their result (:meth:`_settled`).
        """
        _warn_unmapped(cfg)
        lp = _length_penalty(cfg)
        todo = [i for i, s in enumerate(sources) if s]
        results: list[list[Hypothesis]] = [[] for _ in sources]
        if not todo:
            return results
        prefix = {i: [self.tokens[t] for t in prefixes[i]] if prefixes else [] for i in todo}
        asked = prefix if prefixes else None
        caps = self._caps(todo, sources, prefix, cfg)
        again = todo  # lp 0 with a beam: where a search ended does not show, each at its cap
        if cfg.beam == 1 or lp != 0:  # asked for all `beam`: the longest ended the search
            top, again = max(caps.values()), []
            futures = self._submit(todo, sources, asked, top, cfg.beam, cfg, lp)
            for i, future in zip(todo, futures):
                found = future.result()
                if caps[i] == top or self._settled(found, caps[i]):
                    results[i] = self._hypotheses(found, caps[i], cfg, lp)
                    if progress is not None:
                        progress(1)
                else:
                    again.append(i)
        by_cap: dict[int, list[int]] = {}
        for i in again:
            by_cap.setdefault(caps[i], []).append(i)
        pending = [  # all submitted at once: several workers decode them side by side
            (cap, index, self._submit(index, sources, asked, cap, cfg.nbest, cfg, lp))
            for cap, index in by_cap.items()
        ]
        for cap, index, futures in pending:
            for i, future in zip(index, futures):
                results[i] = self._hypotheses(future.result(), cap, cfg, lp)
            if progress is not None:
                progress(len(index))
        return results

    def _caps(
        self,
        todo: list[int],
        sources: Sequence[list[int]],
        prefix: dict[int, list[str]],
        cfg: DecodeConfig,
    ) -> dict[int, int]:
        """The output cap of each source of ``todo`` (index -> cap): a·src_len + b, at least a
        prefix's length + b, as aiayn's own search caps it."""
        caps = max_output_lengths(
            torch.tensor([len(sources[i]) for i in todo]),
            cfg,
            self.cfg.max_len,
            torch.tensor([len(prefix[i]) for i in todo]),
        ).tolist()
        return dict(zip(todo, caps))

    @staticmethod
    def _settled(result: Any, cap: int) -> bool:
        """Whether ``result``, decoded at a larger cap, is what the sentence's own ``cap``
        gives. A cap decides only a search's last step (the hypotheses still open there end), so
        a search that ended before step ``cap`` is the same under both: one whose longest
        hypothesis (its last to finish, counted with EOS as CTranslate2 counts the cap) is
        shorter than ``cap``. Greedy search ends with its one hypothesis; a beam search with a
        length penalty ends with its beam-th, and all ``beam`` were asked for."""
        return max((len(h) for h in result.hypotheses), default=0) < cap

    def _hypotheses(self, result: Any, cap: int, cfg: DecodeConfig, lp: float) -> list[Hypothesis]:
        """The best ``cfg.nbest`` of a result (CTranslate2 returns them best first)."""
        return [
            self._hypothesis(h, s, lp, cfg.forced_eos and len(h) >= cap)
            for h, s in zip(result.hypotheses[: cfg.nbest], result.scores)
        ]

    def _submit(
        self,
        index: list[int],
        sources: Sequence[list[int]],
        prefix: dict[int, list[str]] | None,
        cap: int,
        k: int,
        cfg: DecodeConfig,
        lp: float,
    ) -> list[Any]:
        """``translate_batch`` of the sources ``index`` (and their target prefixes) at the output
        cap ``cap``, ``k`` hypotheses each, asynchronously: one future per source."""
        return self.translator.translate_batch(
            [[self.tokens[t] for t in sources[i]] for i in index],
            [prefix[i] or None for i in index] if prefix is not None else None,
            max_batch_size=cfg.batch_tokens,
            batch_type="tokens",
            asynchronous=True,
            beam_size=cfg.beam,
            num_hypotheses=k,
            length_penalty=lp,
            return_end_token=True,
            return_scores=True,
            max_input_length=0,
            max_decoding_length=cap,
            min_decoding_length=cfg.min_len,
            suppress_sequences=[[self.tokens[i]] for i in cfg.bad_ids] or None,
            repetition_penalty=cfg.repetition_penalty,
            no_repeat_ngram_size=cfg.no_repeat_ngram_size,
        )

    def _hypothesis(self, tokens: list[str], score: float, lp: float, force: bool) -> Hypothesis:
        """``force``: a hypothesis that reached the cap, whose last token becomes EOS (what
        ``forced_eos`` does; CTranslate2 has no such option)."""
        ids = [self.ids[t] for t in tokens]
        if force and ids[-1] != self.cfg.eos_id:
            ids[-1] = self.cfg.eos_id
        finished = bool(ids) and ids[-1] == self.cfg.eos_id
        body = ids[:-1] if finished else ids
        log_prob = score * max(len(ids), 1) ** lp  # undo the length normalisation
        return Hypothesis(body, score, log_prob, finished)


class Ct2Backend:
    """A CTranslate2 translator behind the :class:`~aiayn.runtime.backend.Backend` protocol."""

    name = "ctranslate2"
    capabilities = frozenset({"translate", "nbest"})
    device = torch.device("cpu")

    def __init__(self, translator: Ct2Translator) -> None:
        self.model = translator
        self.cfg: ModelConfig = translator.cfg

    def parameters(self) -> list[Tensor]:
        return []

    def translate_ids(
        self,
        sources: Sequence[list[int]],
        cfg: DecodeConfig,
        progress: Callable[[int], None] | None = None,
        prefixes: Sequence[list[int]] | None = None,
    ) -> list[list[Hypothesis]]:
        return self.model.translate_ids(sources, cfg, progress, prefixes)

    def class_probs(self, ids: Sequence[Sequence[int]], max_tokens: int | None) -> Tensor:
        refuse(self, "classify")

    def generate_ids(
        self,
        prompt_ids: list[int],
        window: int,
        sampling: SamplingConfig,
        use_cache: bool = True,
        on_token: Callable[[int], Any] | None = None,
    ) -> list[int]:
        refuse(self, "generate")

    def image_probs(self, images: Any) -> Tensor:
        refuse(self, "classify_images")


def computed_as(quantization: str | None) -> str | None:
    """The type an exported folder's weights are computed in on this CPU: its ``quantization``
    (config.json), or "float32" for int8 weights where :func:`int8_computed_in_float32`."""
    if (quantization or "").startswith("int8") and int8_computed_in_float32():
        return "float32"
    return quantization


def open_ct2(
    folder: Path,
    cfg: ModelConfig,
    tokenizer: Any,
    files: dict[str, str],
    threads: int,
    workers: int,
    quantization: str | None = None,
) -> Ct2Translator:
    """The CTranslate2 translator in ``folder`` (``files["model"]``), its vocabulary checked
    against the folder's tokenizer and config.json; int8 weights (``quantization``, as
    config.json records it) computed in float32 where :func:`int8_computed_in_float32`."""
    tokens = token_strings(tokenizer, max(cfg.src_vocab_size, cfg.tgt_vocab_size))
    model_dir = folder / files.get("model", "ctranslate2")
    check_vocabulary(model_dir, tokens, cfg)
    compute_type = "default"  # the weights' own type
    if computed_as(quantization) != quantization:
        compute_type = "float32"
        log.info("%s: int8 weights computed in float32 on this CPU (docs/runtime.md)", folder)
    return Ct2Translator(model_dir, cfg, tokens, threads, workers, compute_type)
