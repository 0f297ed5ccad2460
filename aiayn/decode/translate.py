"""Translation: text in, text out, through a trained encoder–decoder and :mod:`aiayn.decode.search`.

Shape legend: B sentences in a batch · k beam size · S source len · D d_model · V vocab.

Sentences are tokenised, sorted by length into token-bounded batches (sentences × padded source
length ≤ ``batch_tokens``), decoded, put back in input order and detokenised. A sentence decodes the
same alone or inside a batch (tested). The source is the subword ids followed by EOS; the decoder
starts from BOS (the convention of :mod:`aiayn.data` and fairseq).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import torch
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.data.batching import TokenBatchSampler
from aiayn.decode.config import DecodeConfig, merge_decode
from aiayn.decode.generator import beam_search, greedy_search
from aiayn.decode.packed import prepacked
from aiayn.decode.rules import Rules
from aiayn.decode.search import Hypothesis, SearchSettings
from aiayn.decode.step import Seq2SeqModel, decoding_device, force_prefix, transformer_step
from aiayn.errors import ConfigError
from aiayn.threads import default_workers

log = logging.getLogger(__name__)

__all__ = [
    "token_batches",
    "max_output_lengths",
    "translate_ids",
    "in_workers",
    "encode_sources",
    "translate_texts",
    "translate_hypotheses",
]


def token_batches(lengths: Sequence[int], max_tokens: int) -> Sequence[list[int]]:
    """Indices in batches of similar length, longest first, whose padded size (sentences ×
    longest length) stays within ``max_tokens`` (a longer sentence goes alone): the training
    batcher's cut (:class:`~aiayn.data.batching.TokenBatchSampler`), unshuffled."""
    if not lengths:
        return []
    sampler = TokenBatchSampler(lengths, max_tokens=max_tokens, shuffle=False, warn_long=False)
    return sampler.batches(0)[::-1]


def max_output_lengths(
    src_lengths: Tensor, cfg: DecodeConfig, cap: int, prefix_lengths: Tensor | None = None
) -> Tensor:
    """a · src_len + b, at least a forced prefix's length + b, at most ``cap`` (the decoder's
    positional table). Shape: (B,), prefix_lengths (B,) -> (B,)."""
    lengths = (src_lengths.double() * cfg.max_len_a).floor().long() + cfg.max_len_b
    if prefix_lengths is not None:
        lengths = torch.maximum(lengths, prefix_lengths.cpu() + cfg.max_len_b)
    return lengths.clamp(min=1, max=cap)


def pad_rows(rows: list[list[int]], pad_id: int, device: Any) -> Tensor:
    """Ragged ids -> (B, S) LongTensor padded with ``pad_id``."""
    width = max(len(r) for r in rows)
    return torch.tensor(
        [r + [pad_id] * (width - len(r)) for r in rows], dtype=torch.long, device=device
    )


@torch.no_grad()
def _decode_batch(
    model: Seq2SeqModel, src: Tensor, cfg: DecodeConfig, forced: Tensor | None = None
) -> list[list[Hypothesis]]:
    """Search one padded batch. Shape: src (B, S), forced (B, P) target prefixes (-1 padded) or
    None -> B lists of ``cfg.nbest`` hypotheses."""
    model_cfg, B, k = model.cfg, src.size(0), cfg.beam
    check_bad_ids(model_cfg, cfg)
    src_lengths = (src != model_cfg.pad_id).sum(1).cpu()
    prefix_lengths = (forced >= 0).sum(1) if forced is not None else None
    max_len = max_output_lengths(src_lengths, cfg, model_cfg.max_len, prefix_lengths)
    memory = model.encode(src)  # (B, S, D)
    cache = model.init_cache(memory, src=src)
    if k > 1:
        cache = cache.with_beam(k)  # B·k rows share B memory rows
    step = transformer_step(model, memory)
    if forced is not None:
        step, cache = force_prefix(step, cache, forced)
    settings = search_settings(model_cfg, cfg)
    if k == 1:
        return [[h] for h in greedy_search(step, cache, B, max_len, settings, src.device)]
    return beam_search(step, cache, B, max_len, settings, src.device)


def check_bad_ids(model_cfg: ModelConfig, cfg: DecodeConfig) -> None:
    """ConfigError unless ``cfg.bad_ids`` are ids of the model's target vocabulary."""
    if any(not 0 <= i < model_cfg.tgt_vocab_size for i in cfg.bad_ids):
        raise ConfigError(
            f"decode.bad_ids {list(cfg.bad_ids)}: ids must be in the vocabulary "
            f"(0 … {model_cfg.tgt_vocab_size - 1})"
        )


def search_settings(model_cfg: ModelConfig, cfg: DecodeConfig) -> SearchSettings:
    """What search is told (:class:`~aiayn.decode.search.SearchSettings`): the model's special
    ids and the choices ``cfg`` sets, its per-step rules included."""
    rules = Rules(
        repetition_penalty=cfg.repetition_penalty,
        no_repeat_ngram_size=cfg.no_repeat_ngram_size,
        bad_ids=tuple(cfg.bad_ids),
        min_len=cfg.min_len,
        forced_eos=cfg.forced_eos,
        renormalize=cfg.renormalize,
    )
    return SearchSettings(
        model_cfg.bos_id,
        model_cfg.eos_id,
        rules,
        beam=cfg.beam,
        alpha=cfg.alpha,
        penalty=cfg.length_penalty,
        nbest=cfg.nbest,
        early_stopping=cfg.early_stopping,
    )


def translate_ids(
    model: Seq2SeqModel,
    sources: Sequence[list[int]],
    cfg: DecodeConfig = DecodeConfig(),
    progress: Callable[[int], None] | None = None,
    device: torch.device | None = None,
    prefixes: Sequence[Sequence[int]] | None = None,
) -> list[list[Hypothesis]]:
    """Decode source id sequences in token-bounded batches; input order kept.

    ``prefixes``: per source the target tokens its output must start with (empty: none), forced
    before search goes on (:func:`~aiayn.decode.step.force_prefix`); the output holds them.

    Empty sources give no hypotheses (an empty list). ``progress(n)`` is called after each batch.
    ``cfg.workers`` batches are decoded at once (see :func:`in_workers`; 0: as many as
    :func:`aiayn.threads.default_workers` chooses for the machine);
    each batch's result does not depend on it. ``cfg.bf16`` runs it under bfloat16 autocast.
    ``device``: where the model runs (default: where its weights are).
    """
    was_training = isinstance(model, nn.Module) and model.training
    device = decoding_device(model, device)
    decoder = prepacked(model)  # a Transformer's output projection packed once per decoding
    results: list[list[Hypothesis]] = [[] for _ in sources]
    todo = [i for i, s in enumerate(sources) if s]
    lock = threading.Lock()

    def decode(batch: list[int]) -> None:
        index = [todo[j] for j in batch]
        src = pad_rows([list(sources[i]) for i in index], model.cfg.pad_id, device)
        forced = _forced([prefixes[i] for i in index], device) if prefixes else None
        for i, hyps in zip(index, _decode_batch(decoder, src, cfg, forced)):
            results[i] = hyps
        if progress is not None:
            with lock:
                progress(len(index))

    try:
        with (
            torch.autocast(device.type, dtype=torch.bfloat16)
            if cfg.bf16
            else contextlib.nullcontext()
        ):
            batches = token_batches([len(sources[i]) for i in todo], cfg.batch_tokens)
            in_workers(decode, batches, cfg.workers or default_workers("torch", device=device.type))
    finally:
        if was_training:
            cast(nn.Module, model).train()
    return results


def _forced(prefixes: list[Sequence[int]], device: Any) -> Tensor | None:
    """Ragged target prefixes -> (B, P) LongTensor padded with -1; None when all are empty."""
    if not any(prefixes):
        return None
    return pad_rows([list(p) for p in prefixes], -1, device)


def in_workers(fn: Callable[[Any], None], items: Sequence[Any], workers: int) -> None:
    """``fn(item)`` for every item, on ``workers`` threads at once (in order when 1).

    Each worker thread gets its share of the caller's intra-op threads (``torch.set_num_threads``
    is per thread under OpenMP) and the caller's autocast state (which is thread-local), so
    ``with torch.autocast(...)`` around the call still applies. The first error is re-raised.
    """
    if workers == 1 or len(items) < 2:
        for item in items:
            fn(item)
        return
    threads = max(1, torch.get_num_threads() // workers)
    autocast = [
        (d, torch.get_autocast_dtype(d)) for d in ("cpu", "cuda") if torch.is_autocast_enabled(d)
    ]

    def work(item: Any) -> None:
        torch.set_num_threads(threads)
        with contextlib.ExitStack() as stack:
            for device_type, dtype in autocast:
                stack.enter_context(torch.autocast(device_type, dtype=dtype))
            fn(item)

    with ThreadPoolExecutor(min(workers, len(items)), thread_name_prefix="aiayn-decode") as pool:
        for future in [pool.submit(work, item) for item in items]:
            future.result()


def encode_sources(tokenizer: Any, texts: Iterable[str], max_len: int) -> list[list[int]]:
    """Tokenise source lines. Blank lines give []; a line longer than ``max_len`` tokens (the
    model's positional table) is cut to fit, with a warning naming it."""
    out = []
    for n, text in enumerate(texts, 1):
        ids = list(tokenizer.encode(text)) if text.strip() else []
        if len(ids) > max_len:
            log.warning("line %d: %d tokens, cut to the model's limit of %d", n, len(ids), max_len)
            ids = ids[:max_len]
        out.append(ids)
    return out


def translate_hypotheses(
    model: Any,
    tokenizer: Any,
    texts: Sequence[str],
    cfg: DecodeConfig = DecodeConfig(),
    progress: Callable[[int], None] | None = None,
) -> list[list[tuple[str, Hypothesis]]]:
    """Translate raw text lines with aiayn's search over ``model`` (:func:`translate_ids`); per
    line its ``cfg.nbest`` (detokenised text, hypothesis) pairs, best first ([] for a blank line).
    Another backend's own search runs through :mod:`aiayn.runtime`."""
    sources = encode_sources(tokenizer, texts, model.cfg.max_len)
    hyps = translate_ids(model, sources, cfg, progress)
    return [[(tokenizer.decode(h.tokens), h) for h in line] for line in hyps]


def translate_texts(
    model: Any,
    tokenizer: Any,
    texts: Sequence[str],
    cfg: DecodeConfig | None = None,
    **overrides: Any,
) -> list[str]:
    """Translate raw text lines into one best line each ("" for a blank line).

    ``cfg`` (default: :class:`DecodeConfig`'s defaults) with ``overrides``, further DecodeConfig
    fields (``beam=5``, ``max_len_b=6`` …), applied (:func:`~aiayn.decode.config.merge_decode`).
    Validation BLEU during training and :meth:`aiayn.folder.ModelFolder.translate` call this.
    """
    cfg = merge_decode(cfg or DecodeConfig(), overrides)
    return [
        line[0][0] if line else "" for line in translate_hypotheses(model, tokenizer, texts, cfg)
    ]
