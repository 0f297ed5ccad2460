"""Run exported models: ONNX Runtime behind aiayn's own search, CTranslate2 behind its own.

Shape legend: B sentences · N decoder rows (B, or B·k with a beam of k) · S source len · T new
tokens · V vocab · C classes.

An ONNX engine is an ``nn.Module`` without weights that has the methods aiayn's decoding code
calls on a model, so that greedy search, beam search, n-best lists, ensembles
(:class:`~aiayn.decode.ensemble.Ensemble`), classification and sampling run unchanged:

- :class:`OnnxTranslator`: ``encode(src)``, ``init_cache(memory, src)`` and
  ``decode(tgt, memory, cache)`` of a :class:`~aiayn.model.Transformer`. Its cache *is* a
  :class:`~aiayn.model.cache.DecoderCache` holding the ONNX outputs as tensors (so ``length``,
  ``with_beam`` and ``reorder`` behave exactly as for the PyTorch model);
- :class:`OnnxLM`: ``forward(ids, cache)`` and ``init_cache()`` of a
  :class:`~aiayn.model.TransformerLM`;
- :class:`OnnxClassifier`: ``forward(ids) -> logits`` of a
  :class:`~aiayn.model.TransformerClassifier`.

:class:`Ct2Translator` wraps ``ctranslate2.Translator``, which runs its own beam search over token
strings: :meth:`Ct2Translator.translate_ids` is the ``search`` that
:func:`aiayn.decode.translate.translate_hypotheses` is given for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.decode.config import DecodeConfig
from aiayn.decode.search import Hypothesis
from aiayn.errors import CheckpointError, ConfigError
from aiayn.export import FORMATS, require
from aiayn.export.onnx import state_names
from aiayn.folder_config import FolderConfig, read_folder_config
from aiayn.folder_parts import read_tokenizer, verify_model_section, verify_parts
from aiayn.model.cache import DecoderCache, LayerCache

log = logging.getLogger(__name__)

__all__ = [
    "OnnxTranslator",
    "OnnxLM",
    "OnnxClassifier",
    "Ct2Translator",
    "load_exported",
    "open_exported",
]


class _Engine(nn.Module):
    """What an exported model shares: its config, and the device aiayn's decoding code reads from
    its first parameter (an empty one: the engines run on the CPU)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.device_marker = nn.Parameter(torch.empty(0), requires_grad=False)


def _session(path: Path, threads: int | None) -> Any:
    """An ONNX Runtime session of one graph; CheckpointError when the file is missing or corrupt."""
    ort = require("onnxruntime", "export", "running an ONNX model")
    if not path.is_file():
        raise CheckpointError(f"{path}: not found (the exported folder is incomplete)")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or torch.get_num_threads()
    options.inter_op_num_threads = 1
    options.log_severity_level = 4  # errors come back as exceptions, not as log lines
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime raises its own Fail/InvalidGraph/… types
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"{path}: not a readable ONNX graph ({first[:200]})") from None


def _check_graph(
    session: Any,
    path: Path,
    checks: dict[str, dict[int, tuple[str, int]]],
    state: tuple[str, int] | None = None,
) -> None:
    """CheckpointError when config.json's model section does not describe the graph at ``path``
    (an edited config.json, or a graph from another export). ``checks`` maps an input or output
    to ``{axis: (config field, value)}`` for its fixed axes; ``state`` is the prefix of the
    per-layer key/value tensors and the number of decoder layers config.json gives."""
    shapes = {a.name: a.shape for a in (*session.get_inputs(), *session.get_outputs())}
    found: list[tuple[str, int, int]] = []
    if state is not None:
        prefix, layers = state
        found.append(
            ("n_decoder_layers", layers, sum(n.startswith(f"{prefix}_k.") for n in shapes))
        )
    for name, axes in checks.items():
        shape = shapes.get(name)
        if shape is None:
            raise CheckpointError(f"{path}: has no '{name}' (not a graph of this kind of model)")
        found += [(field, value, shape[axis]) for axis, (field, value) in axes.items()]
    for field, value, got in found:
        if isinstance(got, int) and got != value:  # a named (dynamic) axis fits any value
            raise CheckpointError(
                f"{path.parent}: config.json says {field} = {value}, {path.name} was exported "
                f"with {got} (the folder's parts come from different models)"
            )


def _head_checks(cfg: ModelConfig, prefix: str) -> dict[str, dict[int, tuple[str, int]]]:
    """The fixed axes of layer 0's keys and values (rows, H, length, K or Kv)."""
    return {
        f"{prefix}_k.0": {1: ("n_heads", cfg.n_heads), 3: ("d_k", cfg.head_dim_k)},
        f"{prefix}_v.0": {3: ("d_v", cfg.head_dim_v)},
    }


def _run(session: Any, feeds: dict[str, np.ndarray]) -> list[Tensor]:
    """Run a session; its outputs as CPU tensors sharing the numpy buffers."""
    return [torch.from_numpy(out) for out in session.run(None, feeds)]


def _numpy(t: Any) -> np.ndarray:
    return np.ascontiguousarray(t.detach().cpu().numpy())


def _past(layer: LayerCache, rows: int, heads: int, d_k: int, d_v: int) -> tuple[np.ndarray, ...]:
    """A layer's cached self-attention keys/values, or empty ones (rows, H, 0, K) at the start."""
    if layer.self_k is None:
        return (
            np.zeros((rows, heads, 0, d_k), np.float32),
            np.zeros((rows, heads, 0, d_v), np.float32),
        )
    return _numpy(layer.self_k), _numpy(layer.self_v)


@dataclass
class OnnxMemory:
    """What the encoder graph gives the decoder: the source mask and cross-attention keys/values."""

    mask: Tensor  # (B, 1, 1, S) True at real source tokens
    cross: list[Tensor]  # [k0, v0, k1, v1, …] each (B, H, S, K)


class OnnxTranslator(_Engine):
    """A translation model exported by :func:`aiayn.export.onnx.export_translation`."""

    def __init__(
        self, folder: Path, cfg: ModelConfig, files: dict[str, str], threads: int | None = None
    ) -> None:
        super().__init__(cfg)
        self.encoder = _session(folder / files["encoder"], threads)
        self.decoder = _session(folder / files["decoder"], threads)
        self.n_layers = cfg.n_decoder_layers
        memory = {"memory": {2: ("d_model", cfg.d_model)}}
        logits = {"logits": {2: ("tgt_vocab_size", cfg.tgt_vocab_size)}}
        cross, past = ("cross", self.n_layers), ("past", self.n_layers)
        _check_graph(
            self.encoder, folder / files["encoder"], memory | _head_checks(cfg, "cross"), cross
        )
        _check_graph(
            self.decoder, folder / files["decoder"], logits | _head_checks(cfg, "past"), past
        )
        self._past_names = state_names("past", self.n_layers)
        self._cross_names = state_names("cross", self.n_layers)

    def encode(self, src: Tensor) -> OnnxMemory:
        """Shape: src (B, S) -> the source mask and every layer's cross-attention K/V."""
        memory_and_cross = _run(self.encoder, {"src": _numpy(src.long())})
        return OnnxMemory((src != self.cfg.pad_id)[:, None, None, :].cpu(), memory_and_cross[1:])

    def init_cache(self, memory: OnnxMemory, src: Tensor | None = None) -> DecoderCache:
        layers = [
            LayerCache(cross_k=memory.cross[2 * i], cross_v=memory.cross[2 * i + 1])
            for i in range(self.n_layers)
        ]
        return DecoderCache(layers, memory.mask)

    def log_probs(self, tgt: Tensor, memory: OnnxMemory, cache: DecoderCache) -> Tensor:
        """The :class:`~aiayn.decode.step.Seq2SeqModel` step: (N, T, V) float32 normalised
        log-probabilities of :meth:`decode`'s logits."""
        return torch.log_softmax(self.decode(tgt, memory, cache).float(), dim=-1)

    def decode(self, tgt: Tensor, memory: OnnxMemory, cache: DecoderCache) -> Tensor:
        """Shape: tgt (N, T) tokens after the cache's ``length`` -> logits (N, T, V); the cache
        is extended (in place) by the step's present keys/values."""
        mask: Any = cache.memory_mask  # (B, 1, 1, S), set by init_cache
        feeds = {"tokens": _numpy(tgt.long()), "src_mask": _numpy(mask[:, 0, 0, :])}
        for i, layer in enumerate(cache.layers):
            feeds[self._cross_names[2 * i]] = _numpy(layer.cross_k)
            feeds[self._cross_names[2 * i + 1]] = _numpy(layer.cross_v)
        return _cached_step(self, self.decoder, feeds, tgt, cache)


def _cached_step(
    engine: Any, session: Any, feeds: dict[str, Any], tokens: Tensor, cache: DecoderCache
) -> Tensor:
    """One decoder step of an ONNX graph whose self-attention cache is explicit: ``feeds`` with
    every layer's past keys/values added, run, the present ones stored back in ``cache``.
    Shape: tokens (N, T) -> logits (N, T, V)."""
    heads, d_k, d_v = engine.cfg.n_heads, engine.cfg.head_dim_k, engine.cfg.head_dim_v
    for i, layer in enumerate(cache.layers):
        past = _past(layer, tokens.size(0), heads, d_k, d_v)
        feeds[engine._past_names[2 * i]], feeds[engine._past_names[2 * i + 1]] = past
    logits, *present = _run(session, feeds)
    for i, layer in enumerate(cache.layers):
        layer.self_k, layer.self_v = present[2 * i], present[2 * i + 1]
    cache.length += tokens.size(1)
    return logits


class OnnxLM(_Engine):
    """A language model exported by :func:`aiayn.export.onnx.export_lm`."""

    def __init__(
        self, folder: Path, cfg: ModelConfig, files: dict[str, str], threads: int | None = None
    ) -> None:
        super().__init__(cfg)
        self.decoder = _session(folder / files["decoder"], threads)
        self._past_names = state_names("past", cfg.n_decoder_layers)
        logits = {"logits": {2: ("tgt_vocab_size", cfg.tgt_vocab_size)}}
        past = ("past", cfg.n_decoder_layers)
        _check_graph(
            self.decoder, folder / files["decoder"], logits | _head_checks(cfg, "past"), past
        )

    def init_cache(self) -> DecoderCache:
        return DecoderCache.empty(self.cfg.n_decoder_layers)

    def forward(self, ids: Tensor, cache: DecoderCache | None = None) -> Tensor:
        """Shape: ids (N, T) -> logits (N, T, V). Without a cache the sequence starts at position 0
        (no padding mask: a generated text has none)."""
        cache = self.init_cache() if cache is None else cache
        return _cached_step(self, self.decoder, {"tokens": _numpy(ids.long())}, ids, cache)


class OnnxClassifier(_Engine):
    """A classifier exported by :func:`aiayn.export.onnx.export_classifier`."""

    def __init__(
        self, folder: Path, cfg: ModelConfig, files: dict[str, str], threads: int | None = None
    ) -> None:
        super().__init__(cfg)
        self.session = _session(folder / files["classifier"], threads)
        logits = {"logits": {1: ("n_classes", cfg.n_classes)}}
        _check_graph(self.session, folder / files["classifier"], logits)

    def forward(self, ids: Tensor) -> Tensor:
        """Shape: ids (B, S) padded with ``cfg.pad_id`` -> logits (B, C)."""
        return _run(self.session, {"ids": _numpy(ids.long())})[0]


# ---- CTranslate2 ---------------------------------------------------------------------------------


class Ct2Translator:
    """A translation model exported by :func:`aiayn.export.ctranslate2.export_translation`, decoded
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
    ) -> list[list[Hypothesis]]:
        """Decode source ids; per source its ``cfg.nbest`` hypotheses ([] for an empty source).

        Settings map onto ``translate_batch`` as follows. Length penalty: CTranslate2 ranks
        finished hypotheses by log P / |Y|^lp, |Y| counting EOS here (``return_end_token``), so
        ``average`` is lp = 1 and ranks exactly as aiayn does; ``none`` is lp = 0, but CTranslate2
        then stops a sentence as soon as its best beam ends instead of waiting for k finished
        hypotheses; GNMT's ((5 + |Y|) / 6)^α has no equivalent and is approximated by |Y|^α
        (a warning says so); ``power`` is lp = α. ``bad_ids`` are ``suppress_sequences``;
        ``forced_eos`` replaces the last token of a hypothesis cut at the cap by EOS (exact for
        greedy search; a beam's ranking then differs from aiayn's, as ``early_stopping=False``
        has no CTranslate2 equivalent). The cap a·src_len + b is per sentence: sentences are
        sent in groups of one cap each.
        """
        from aiayn.decode.translate import max_output_lengths

        if cfg.length_penalty == "gnmt":
            log.warning(
                "ctranslate2 has no GNMT length penalty; ranking by log P / |Y|^%s instead "
                "(--length-penalty average ranks exactly as aiayn does)",
                cfg.alpha,
            )
        if cfg.beam > 1 and not cfg.early_stopping:
            log.warning(
                "ctranslate2 has no early_stopping=false (Hugging Face's heuristic); a sentence "
                "stops at %d finished hypotheses instead",
                cfg.beam,
            )
        lp = {"gnmt": cfg.alpha, "average": 1.0, "none": 0.0, "power": cfg.alpha}[
            cfg.length_penalty
        ]
        suppress = [[self.tokens[i]] for i in cfg.bad_ids] or None
        todo = [i for i, s in enumerate(sources) if s]
        caps = max_output_lengths(
            torch.tensor([len(sources[i]) for i in todo]), cfg, self.cfg.max_len
        ).tolist()
        groups: dict[int, list[int]] = {}
        for i, cap in zip(todo, caps):
            groups.setdefault(cap, []).append(i)
        pending = []
        for cap, index in groups.items():
            batch = [[self.tokens[t] for t in sources[i]] for i in index]
            pending.append(
                (
                    index,
                    self.translator.translate_batch(
                        batch,
                        max_batch_size=cfg.max_tokens,
                        batch_type="tokens",
                        asynchronous=True,
                        beam_size=cfg.beam,
                        num_hypotheses=cfg.nbest,
                        length_penalty=lp,
                        return_end_token=True,
                        return_scores=True,
                        max_input_length=0,
                        max_decoding_length=cap,
                        min_decoding_length=cfg.min_len,
                        suppress_sequences=suppress,
                    ),
                )
            )
        results: list[list[Hypothesis]] = [[] for _ in sources]
        for (index, futures), cap in zip(pending, groups):
            for i, future in zip(index, futures):
                results[i] = [
                    self._hypothesis(h, s, lp, cfg.forced_eos and len(h) >= cap)
                    for h, s in zip(future.result().hypotheses, future.result().scores)
                ]
            if progress is not None:
                progress(len(index))
        return results

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


# ---- loading ------------------------------------------------------------------------------------


def read_exported_config(folder: Path, expect_kind: str | None = None) -> FolderConfig:
    """config.json of an exported folder; CheckpointError when it is not one, or not of
    ``expect_kind`` (:func:`aiayn.folder_config.read_folder_config`)."""
    parsed = read_folder_config(folder, expect_kind)
    if parsed.format not in FORMATS[1:]:
        raise CheckpointError(
            f"{folder}: not an exported model (its config.json has no 'format' of "
            f"{' or '.join(FORMATS[1:])}); write one with `aiayn export`"
        )
    return parsed


def load_exported(
    folder: str | Path,
    expect_kind: str | None = None,
    engine: str | None = None,
    threads: int | None = None,
    workers: int = 1,
) -> tuple[Any, Any, dict[str, Any]]:
    """(engine model, tokenizer, config.json in its written form) of a folder written by
    ``aiayn export``: :func:`open_export` with the config as a dict."""
    model, tokenizer, parsed = open_export(folder, expect_kind, engine, threads, workers)
    return model, tokenizer, parsed.to_dict()


def open_export(
    folder: str | Path,
    expect_kind: str | None = None,
    engine: str | None = None,
    threads: int | None = None,
    workers: int = 1,
) -> tuple[Any, Any, FolderConfig]:
    """(engine model, tokenizer, parsed config.json) of a folder written by ``aiayn export``.

    ``engine`` ('onnx' or 'ctranslate2'), when given, must be the folder's format; ``expect_kind``
    likewise its kind. The folder's parts are checked first (:mod:`aiayn.folder_parts`; the
    graphs' shapes and CTranslate2's vocabulary against config.json and tokenizer.json). Every
    problem is a one-line CheckpointError or ConfigError.
    """
    folder = Path(folder)
    parsed = read_exported_config(folder, expect_kind)
    fmt, kind = str(parsed.format), parsed.kind
    if engine is not None and engine != fmt:
        raise ConfigError(
            f"{folder}: holds a '{fmt}' export; --engine {engine} needs a folder "
            f"written by `aiayn export --format {engine}`"
        )
    verify_parts(folder, parsed)  # every file the one written at export
    cfg, files = parsed.config.model, dict(parsed.files or {})
    tokenizer = read_tokenizer(folder, cfg)
    if fmt == "ctranslate2":
        from aiayn.export.ctranslate2 import check_vocabulary, token_strings

        if kind != "translation":
            raise CheckpointError(
                f"{folder}: aiayn runs CTranslate2 translation models only; "
                f"this is a '{kind}' model"
            )
        tokens = token_strings(tokenizer, max(cfg.src_vocab_size, cfg.tgt_vocab_size))
        model_dir = folder / files.get("model", "ctranslate2")
        check_vocabulary(model_dir, tokens, cfg)
        model: Any = Ct2Translator(model_dir, cfg, tokens, threads, workers)
    else:
        engines = {"translation": OnnxTranslator, "lm": OnnxLM, "classification": OnnxClassifier}
        if kind not in engines:
            raise CheckpointError(f"{folder}: no ONNX engine for a '{kind}' model")
        try:
            # `workers` batches run at once, each on its share of the threads (as in aiayn's own
            # decoding): one session's intra-op pool is shared by the worker threads calling it.
            share = max(1, (threads or torch.get_num_threads()) // workers)
            model = engines[kind](folder, cfg, files, share)
        except KeyError as err:
            raise CheckpointError(f"{folder / 'config.json'}: 'files' lacks {err}") from None
    verify_model_section(folder, parsed)  # after the engines named the fields they could check
    return model, tokenizer, parsed


def load_translation(
    folders: Sequence[str | Path], engine: str | None = None, workers: int = 1
) -> tuple[Any, Any, FolderConfig]:
    """(model, tokenizer, parsed config.json) of exported translation folders: one engine, or an
    :class:`~aiayn.decode.ensemble.Ensemble` of ONNX engines (one shared tokenizer)."""
    from aiayn.decode.ensemble import ensemble_of

    loaded = [open_export(f, "translation", engine, workers=workers) for f in folders]
    if len(loaded) > 1 and any(isinstance(m, Ct2Translator) for m, _, _ in loaded):
        raise ConfigError(
            "CTranslate2 models decode one at a time (aiayn ensembles run on "
            "PyTorch or ONNX models)"
        )
    models, tokenizers, parsed = zip(*loaded)
    return ensemble_of(folders, models, tokenizers), tokenizers[0], parsed[0]


def open_exported(
    folders: Sequence[Path], engine: str | None = None, workers: int = 1
) -> tuple[Any, Any, FolderConfig, str, Any]:
    """What :func:`aiayn.folder.load_model_folder` needs to open folders written by `aiayn
    export`: (model, tokenizer, parsed config.json, engine name, the engine's own search in
    translate_ids's signature, or None). Translation (one folder, or an ONNX ensemble), classification and lm (ONNX); on the
    CPU. ``engine`` None: whatever the folders hold; 'torch' or a plain model folder among
    exports is a ConfigError that says what to do."""
    if engine not in (None, *FORMATS):
        raise ConfigError(f"--engine must be one of {', '.join(FORMATS)}, got '{engine}'")
    parsed = [read_folder_config(f) for f in folders]
    for folder, p in zip(folders, parsed):
        if engine == "torch" and p.format is not None:
            raise ConfigError(
                f"{folder}: holds an exported model; --engine torch needs the model "
                "folder it was exported from"
            )
        if p.format is None:
            fmt = engine or "onnx"
            raise ConfigError(
                f"{folder}: a PyTorch model folder; --engine {fmt} runs what "
                f"`aiayn export {folder} --format {fmt} -o OUT` writes"
            )
    if parsed[0].kind == "translation":
        model, tokenizer, first = load_translation(folders, engine, workers)
    else:
        if len(folders) > 1:
            raise CheckpointError("several model folders make an ensemble of translation models")
        model, tokenizer, first = open_export(folders[0], engine=engine, workers=workers)
    ct2 = isinstance(model, Ct2Translator)
    return model, tokenizer, first, str(first.format), Ct2Translator.translate_ids if ct2 else None
