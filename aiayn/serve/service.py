"""What the server does with a model folder, without HTTP, split by job:
:class:`~aiayn.serve.checks.RequestChecks` checks a request against the limits (one-line 4xx
before anything is queued); :class:`ModelService` queues it on the
:class:`~aiayn.serve.batching.DynamicBatcher`, under a typed batch key (:class:`TranslateBatch`,
:class:`ClassifyBatch`, :class:`ClassifyImagesBatch`: what must be equal for requests to share a
batch); the batcher's worker thread runs :class:`BatchWork`; :func:`model_info` answers
``GET /v1/model``.

The limits choose the batcher's scheduler (aiayn/serve/schedulers.py): step-level batching for
translations where the backend can step and ``Limits.step_batching`` is on, whole batches for
everything else, and no merging at all without ``Limits.batching``.

Every method that queues work returns a :class:`concurrent.futures.Future`; the HTTP layer
(:mod:`aiayn.serve.app`) awaits it under the request's time limit. A request the limits refuse
raises :class:`RequestError` (status and one-line reason) before anything is queued.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from aiayn.config import to_dict
from aiayn.decode import DecodeConfig, Hypothesis, SamplingConfig
from aiayn.decode.images import top_k as top_k_classes
from aiayn.decode.translate import encode_sources
from aiayn.folder.load import ModelFolder, precision
from aiayn.model.vision import n_patches
from aiayn.runtime.backend import Steps, Unsupported, require
from aiayn.serve.batching import BatchResult, DynamicBatcher, WorkerHooks
from aiayn.serve.checks import RequestChecks
from aiayn.serve.images import ImageInput
from aiayn.serve.limits import Limits
from aiayn.serve.queue import RequestError
from aiayn.serve.stepping import Stepper
from aiayn.threads import DEFAULT_THREADS, LoadFollower, user_threads
from aiayn.viz.attention import attention_of_translation, token_labels
from aiayn.viz.image_attention import attention_maps, attention_of_pixels

log = logging.getLogger(__name__)

__all__ = [
    "RequestError",
    "ModelService",
    "TranslateBatch",
    "ClassifyBatch",
    "ClassifyImagesBatch",
    "BatchWork",
    "model_info",
]


class GenerationStopped(Exception):
    """Raised inside a generation's token callback to stop it (time limit, client gone)."""


@dataclass(frozen=True)
class TranslateBatch:
    """Translations decoded with ``decode``: requests with equal settings share a batch."""

    decode: DecodeConfig


@dataclass(frozen=True)
class ClassifyBatch:
    """Classifications: any requests share a batch."""


@dataclass(frozen=True)
class ClassifyImagesBatch:
    """Images classified: any requests share a batch (each input an :class:`ImageInput`)."""


class BatchWork:
    """The batches of one model folder, run on the worker thread: ``run(key, inputs)`` for a
    whole batch, ``stepper(key)`` for translations that requests join between steps."""

    def __init__(self, folder: ModelFolder) -> None:
        self.folder = folder

    def run(self, key: Hashable, inputs: list[Any]) -> list[Any]:
        if isinstance(key, TranslateBatch):
            return self.translations(inputs, key.decode)
        if isinstance(key, ClassifyBatch):
            return list(self.folder.classify(inputs))
        if isinstance(key, ClassifyImagesBatch):
            probs = self.folder.backend.image_probs(np.stack([i.pixels for i in inputs]))
            return [self.image_result(item, row) for item, row in zip(inputs, probs)]
        raise ValueError(f"unknown batch key {key!r}")

    def image_result(self, item: ImageInput, probs: torch.Tensor) -> dict[str, Any]:
        """``{"label", "top": [{"label", "prob"}, …]}`` of one image's probabilities (K,), best
        first, and ``"converted"`` when its picture was converted."""
        best = top_k_classes(probs[None], self.folder.label_names(), item.top_k)[0]
        out: dict[str, Any] = {"label": best[0][0]}
        out["top"] = [{"label": name, "prob": p} for name, p in best]
        if item.converted:
            out["converted"] = item.converted
        return out

    def image_attention(self, inputs: Sequence[ImageInput], arrived: float) -> BatchResult:
        """The images' results, each with ``"attention"`` (its heat maps:
        :func:`~aiayn.viz.image_attention.attention_maps`), from one pass of the PyTorch module."""
        start = time.monotonic()
        seen, probs = attention_of_pixels(self.folder, np.stack([i.pixels for i in inputs]))
        outputs = [
            {**self.image_result(item, row), "attention": attention_maps(one)}
            for item, row, one in zip(inputs, probs, seen)
        ]
        return BatchResult(outputs, start - arrived, time.monotonic() - start, 1, len(inputs))

    def stepper(self, key: Hashable) -> Stepper | None:
        """Translations run step by step (their requests join between decoder steps); None
        for the other keys and for translations with alignments, batched at batch
        boundaries (alignments: a teacher-forced pass over each whole output)."""
        if not isinstance(key, TranslateBatch) or key.decode.alignments:
            return None
        return TextTranslation(self.folder, key.decode, self.hypothesis)

    def translations(
        self,
        texts: Sequence[str],
        decode: DecodeConfig,
        prefixes: Sequence[str | None] | None = None,
    ) -> list[list[dict[str, Any]]]:
        """Per text its n-best list as the API answers it."""
        lines = self.folder.translate_hypotheses(texts, decode, prefixes=prefixes)
        out = []
        for text, hyps in zip(texts, lines):
            src = token_labels(self.folder.tokenizer, self.folder.tokenizer.encode(text))
            out.append([self.hypothesis(t, h, src) for t, h in hyps])
        return out

    def hypothesis(self, text: str, h: Hypothesis, src: list[str]) -> dict[str, Any]:
        """One hypothesis as JSON; with its alignment, the token labels its indices point at."""
        out = {"text": text, "score": finite(h.score), "log_prob": finite(h.log_prob)}
        if h.alignment is not None:
            tokens = token_labels(self.folder.tokenizer, h.tokens)
            out.update(alignment=[list(p) for p in h.alignment], src_tokens=src, tokens=tokens)
        return out


def blanks_kept(
    texts: Sequence[str],
    blank: Callable[[], Any],
    queue: Callable[[list[str], list[int]], Future],
) -> Future:
    """The future of ``queue(filled texts, their indices)`` with ``blank()`` answering each blank
    text (empty or whitespace) in its place: a request keeps a blank line blank, as the
    commands do (it was a 422). A request of blank texts alone is answered at once."""
    at = [i for i, text in enumerate(texts) if text.strip()]
    if len(at) == len(texts):
        return queue(list(texts), at)
    outer: Future = Future()
    if not at:
        outer.set_result(BatchResult([blank() for _ in texts], 0.0, 0.0, 0, 0))
        return outer
    inner = queue([texts[i] for i in at], at)

    def done(future: Future) -> None:
        if future.cancelled():
            outer.cancel()
        elif outer.set_running_or_notify_cancel():  # False: the caller cancelled it meanwhile
            if (error := future.exception()) is not None:
                outer.set_exception(error)
                return
            result = future.result()
            outputs = [blank() for _ in texts]
            for i, output in zip(at, result.outputs):
                outputs[i] = output
            outer.set_result(dataclasses.replace(result, outputs=outputs))

    outer.add_done_callback(lambda f: inner.cancel() if f.cancelled() else None)
    inner.add_done_callback(done)
    return outer


class TextTranslation:
    """A :class:`~aiayn.serve.stepping.Stepper` over texts: a running translation of the
    folder's backend (:class:`~aiayn.decode.continuous.RunningTranslation`) behind its
    tokenizer, under the folder's precision; outputs as ``/v1/translate`` answers each text.
    Texts are never blank here (the service's checks refuse them)."""

    def __init__(
        self,
        folder: ModelFolder,
        decode: DecodeConfig,
        to_json: Callable[[str, Hypothesis, list[str]], dict[str, Any]],
    ) -> None:
        self.folder, self.decode, self.to_json = folder, decode, to_json
        self.running = cast(Steps, folder.backend).running_translation(decode)

    @property
    def active(self) -> int:
        return int(self.running.active)

    def add(self, texts: Sequence[str]) -> list[int]:
        folder = self.folder
        sources = encode_sources(folder.tokenizer, texts, folder.backend.cfg.max_len)
        with precision(folder.device, self.decode.bf16):
            return list(self.running.add(sources))

    def step(self) -> dict[int, Any]:
        with precision(self.folder.device, self.decode.bf16):
            ended = self.running.step()
        decode = self.folder.tokenizer.decode
        return {
            i: [self.to_json(decode(h.tokens), h, []) for h in hyps] for i, hyps in ended.items()
        }

    def drop(self, ids: Sequence[int]) -> None:
        self.running.drop(ids)


def finite(value: Any) -> Any:
    """JSON has no NaN: non-finite floats become None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


class ModelService:
    """One model folder (:class:`~aiayn.folder.ModelFolder`, any engine) behind a batcher: the
    requests' checks (``checks``), their queueing (the methods below) and the batches the worker
    thread runs (``work``)."""

    def __init__(
        self,
        folder: ModelFolder,
        limits: Limits,
        worker_thread: bool = True,
        follow_load: bool | LoadFollower = True,
    ) -> None:
        """``follow_load``: True, the worker chooses torch's thread count again for the load
        (:func:`worker_hooks`) on a CPU unless the user fixed it (AIAYN_THREADS or
        OMP_NUM_THREADS); False, never; a :class:`~aiayn.threads.LoadFollower`, that one."""
        self.folder, self.limits, self.kind = folder, limits, folder.kind
        self.checks = RequestChecks(folder, limits)
        self.work = BatchWork(folder)
        follower = follow_load if isinstance(follow_load, LoadFollower) else None
        if follow_load is True and folder.device.type == "cpu" and user_threads() is None:
            follower = LoadFollower(DEFAULT_THREADS)
        # The scheduler: translations join a running decoding between steps (StepLevel) where
        # the backend can and the limits allow; else whole batches (WholeBatches).
        steps = limits.step_batching and "steps" in folder.backend.capabilities
        self.batcher = DynamicBatcher(
            self.work.run,
            max_batch_cost=limits.batch_tokens,
            wait_s=limits.batch_wait_ms / 1000.0,
            max_wait_s=limits.batch_max_wait_ms / 1000.0,
            max_queue=limits.max_queue,
            merge=limits.batching,
            thread=worker_thread,  # False: the caller runs self.batcher.work()
            stepper=self.work.stepper if steps else None,
            join_steps=limits.join_steps,  # 0: every waiting request joins at the next step
            hooks=worker_hooks(follower),
        )

    def close(self) -> None:
        self.batcher.close()

    def translate(
        self,
        texts: Sequence[str],
        decode: DecodeConfig,
        prefixes: Sequence[str | None] | None = None,
    ) -> Future:
        """Queue ``texts`` for translation; the result's outputs are, per text, its n-best list
        of ``{"text", "score", "log_prob"}`` (and ``"alignment"``, ``"src_tokens"``,
        ``"tokens"`` with ``decode.alignments``); a blank text's is empty, as `aiayn translate`
        keeps a blank line blank. With ``prefixes`` (per text the start its translation must
        have) the request runs as a batch of its own."""
        self.checks.require("translate")
        self.checks.check_prefixes(texts, prefixes)

        def queue(filled: list[str], at: list[int]) -> Future:
            kept = None if prefixes is None else [prefixes[i] for i in at]
            return self._translate_filled(filled, decode, kept)

        return blanks_kept(texts, lambda: [], queue)

    def _translate_filled(
        self, texts: Sequence[str], decode: DecodeConfig, prefixes: Sequence[str | None] | None
    ) -> Future:
        cost = self.checks.check_texts(texts)
        if prefixes is None:
            return self.batcher.submit(TranslateBatch(decode), texts, cost)
        self.checks.check_prefixes(texts, prefixes)
        arrived = time.monotonic()

        def alone() -> BatchResult:
            start = time.monotonic()
            outputs = self.work.translations(texts, decode, prefixes)
            return BatchResult(outputs, start - arrived, time.monotonic() - start, 1, len(texts))

        return self.batcher.call(alone)

    def classify(self, texts: Sequence[str]) -> Future:
        """Queue ``texts`` for classification; outputs ``{"label", "probs"}`` per text (a blank
        text's ``{"label": "", "probs": {}}``, as `aiayn classify` answers a blank line). A long
        text is cut to the run's ``data.max_len``, as in training and `aiayn classify`."""
        self.checks.require("classify")
        if self.folder.kind_info.does("classify_images"):
            raise RequestError(
                422,
                f"this server holds an {self.kind} model: send 'images' (base64 PNG or JPEG) or "
                "'arrays' (pixel rows), not texts",
            )

        def queue(filled: list[str], at: list[int]) -> Future:
            cost = self.checks.check_texts(filled, cut=True)
            return self.batcher.submit(ClassifyBatch(), filled, cost)

        return blanks_kept(texts, lambda: {"label": "", "probs": {}}, queue)

    def classify_images(
        self,
        images: Sequence[str] | None,
        arrays: Sequence[Any] | None,
        top_k: int,
        attention: bool = False,
    ) -> Future:
        """Queue images (base64 PNG/JPEG files) or arrays (pixel rows) for an image classifier,
        each converted as the training images were; outputs per image ``{"label", "top"}`` (its
        ``top_k`` likeliest classes), ``"converted"`` when its picture was, and with
        ``attention`` its heat maps (a request of its own: the PyTorch module's weights)."""
        self.checks.require("classify")
        items = self.checks.images(images, arrays, top_k)
        if attention:
            try:
                require(self.folder.backend, "attention", "serve it with --engine torch")
            except Unsupported as err:
                raise RequestError(422, f"attention: {err}") from None
            arrived = time.monotonic()
            return self.batcher.call(lambda: self.work.image_attention(items, arrived))
        cost = len(items) * (n_patches(self.folder.config.model) + 1)
        return self.batcher.submit(ClassifyImagesBatch(), items, cost)

    def attention(
        self, text: str, decode: DecodeConfig, rank: int, prefix: str | None = None
    ) -> Future:
        """Queue the attention maps of ``text``'s translation (the ``rank``-th of its n-best;
        ``prefix``: the start it must have)."""
        self.checks.require("attention")
        self.checks.check_texts([text])
        self.checks.check_prefixes([text], None if prefix is None else [prefix])
        if rank > decode.beam:
            raise RequestError(422, f"rank ({rank}) must be at most beam ({decode.beam})")
        backend, tokenizer = self.folder.backend, self.folder.tokenizer
        return self.batcher.call(
            lambda: attention_of_translation(
                backend, tokenizer, text, decode=decode, rank=rank, prefix=prefix
            ).to_dict()
        )

    def generate(
        self,
        prompt: str,
        sampling: SamplingConfig,
        on_token: Callable[[str], None],
    ) -> Future:
        """Queue a generation; ``on_token(text)`` runs on the worker thread with each new piece
        of text (raise :class:`GenerationStopped` in it to stop). The result is the text."""
        self.checks.require("generate")
        if not prompt.strip():
            raise RequestError(422, "prompt is empty")
        n = len(self.folder.tokenizer.encode(prompt))
        if n > self.checks.max_text_tokens:
            limit = self.checks.max_text_tokens
            raise RequestError(422, f"prompt has {n} tokens; the limit is {limit}")
        folder = self.folder
        return self.batcher.call(lambda: folder.generate(prompt, sampling, on_token=on_token))

    def info(self) -> dict[str, Any]:
        """``GET /v1/model`` (:func:`model_info`)."""
        return model_info(self.folder, self.checks)


def model_info(folder: ModelFolder, checks: RequestChecks) -> dict[str, Any]:
    """Kind, config, parameters, vocabulary, data, decoding, measured scores, limits."""
    config = to_dict(folder.config)
    params = {id(p): p.numel() for p in folder.parameters()}
    limits = {**dataclasses.asdict(checks.limits), "max_text_tokens": checks.max_text_tokens}
    return {
        "kind": folder.kind,
        "engine": folder.engine,
        "paths": [str(p) for p in folder.paths],
        "ensemble": len(folder.paths),
        "parameters": sum(params.values()) or None,  # None: an exported model's
        "vocab_size": tok.vocab_size if (tok := folder.text_tokenizer) else None,  # images: None
        "config": config,
        "data": config.get("data") if folder.has_data else None,  # else only defaults
        "decode": dataclasses.asdict(folder.decode),
        "scores": measured_scores(folder.paths),
        "card": _card(folder.path),
        "routes": [f"/v1/{r}" for r in checks.routes],
        "limits": limits,
    }


def worker_hooks(follower: LoadFollower | None) -> WorkerHooks:
    """The worker's jobs besides requests: it decodes with the intra-op threads of the thread
    that made the service (a per-thread setting); with ``follower``, a server that runs for days
    chooses the count again for the load of the moment (the one chosen at start fits the load
    of that moment): when idle for a second (at most once a minute) and, under steady traffic,
    between rounds at most once per the follower's ``busy_every_s``."""
    threads = torch.get_num_threads()
    if follower is None:
        return WorkerHooks(on_start=lambda: torch.set_num_threads(threads))
    return WorkerHooks(
        on_start=lambda: torch.set_num_threads(threads),
        between_rounds=follower.between_batches,
        on_idle=follower.choose,
    )


def measured_scores(paths: Sequence[Path]) -> dict[str, Any]:
    """The ``eval_*.json`` files `aiayn evaluate` left in the (first) folder, by test set."""
    scores: dict[str, Any] = {}
    for path in sorted(Path(paths[0]).glob("eval_*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            log.warning("%s: not readable JSON, left out of /v1/model", path)
            continue
        scores[path.stem[len("eval_") :]] = finite(data)
    return scores


def _card(path: Path) -> str | None:
    """The folder's README.md model card, when it has one."""
    card = Path(path) / "README.md"
    try:
        return card.read_text(encoding="utf-8") if card.is_file() else None
    except (OSError, UnicodeDecodeError):
        return None
