"""What the server does with a model folder, without HTTP: check a request against the limits,
queue it on the :class:`~aiayn.serve.batching.DynamicBatcher`, shape the answer. The service's
settings choose the batcher's scheduler (aiayn/serve/schedulers.py): step-level batching for
translations where the backend can step and ``--step-batching`` is on, whole batches for
everything else, and no merging at all with ``--no-batching``.

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
from pathlib import Path
from typing import Any, cast

import torch

from aiayn.config import to_dict
from aiayn.decode import DecodeConfig, Hypothesis
from aiayn.decode.generate import check_seed
from aiayn.decode.translate import encode_sources
from aiayn.errors import ConfigError
from aiayn.folder import ModelFolder, precision
from aiayn.kinds import KINDS
from aiayn.runtime import Unsupported, require
from aiayn.runtime.backend import Steps
from aiayn.serve.batching import BatchResult, DynamicBatcher, WorkerHooks
from aiayn.serve.limits import Limits
from aiayn.serve.queue import RequestError
from aiayn.serve.stepping import Stepper
from aiayn.threads import DEFAULT_THREADS, LoadFollower, user_threads
from aiayn.viz.attention import attention_of_translation, token_labels

log = logging.getLogger(__name__)

__all__ = ["RequestError", "ModelService"]


class GenerationStopped(Exception):
    """Raised inside a generation's token callback to stop it (time limit, client gone)."""


class ModelService:
    """One model folder (:class:`~aiayn.folder.ModelFolder`, any engine) behind a batcher."""

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
        self.folder, self.limits, self.engine = folder, limits, folder.engine
        self.kind: str = folder.kind
        # The kind's routes that its backend can answer (no attention weights from an export).
        self.routes = [r for r in KINDS[self.kind].routes if r in folder.backend.capabilities]
        self.max_text_tokens = min(limits.max_text_tokens, folder.config.model.max_len)
        follower = follow_load if isinstance(follow_load, LoadFollower) else None
        if follow_load is True and folder.device.type == "cpu" and user_threads() is None:
            follower = LoadFollower(DEFAULT_THREADS)
        # The scheduler: translations join a running decoding between steps (StepLevel) where
        # the backend can and the limits allow; else whole batches (WholeBatches).
        steps = limits.step_batching and "steps" in folder.backend.capabilities
        self.batcher = DynamicBatcher(
            self._run,
            max_batch_cost=limits.batch_tokens,
            wait_s=limits.batch_wait_ms / 1000.0,
            max_wait_s=limits.batch_max_wait_ms / 1000.0,
            max_queue=limits.max_queue,
            merge=limits.batching,
            thread=worker_thread,  # False: the caller runs self.batcher.work()
            stepper=self._stepper if steps else None,
            join_steps=limits.join_steps,  # 0: every waiting request joins at the next step
            hooks=worker_hooks(follower),
        )

    def close(self) -> None:
        self.batcher.close()

    def require(self, route: str) -> None:
        """404 with the routes this model does answer when ``route`` is not one of them."""
        if route in self.routes:
            return
        if route in KINDS[self.kind].routes:  # the kind's, but not this backend's
            try:
                require(self.folder.backend, route, "serve its model folder with --engine torch")
            except Unsupported as err:
                raise RequestError(404, f"no /v1/{route}: {err}") from None
        routes = ", ".join(f"/v1/{r}" for r in self.routes) or "none"
        raise RequestError(
            404, f"this server holds a {self.kind} model: no /v1/{route} (it answers {routes})"
        )

    # ---- requests -----------------------------------------------------------------------

    def check_at_most(self, name: str, value: float | None, limit: float) -> None:
        """422 naming ``name`` when ``value`` is above ``limit`` (a flag of the server)."""
        if value is not None and value > limit:
            raise RequestError(422, f"{name}: at most {limit:g} on this server, got {value:g}")

    def decode_config(
        self, beam: int | None, alpha: float | None, nbest: int | None, **controls: Any
    ) -> DecodeConfig:
        """The folder's own decoding settings, with what the request overrides (workers 1: the
        batcher's one thread decodes); 422 beyond --max-beam or --max-alpha. ``controls``:
        DecodeConfig fields (repetition_penalty, no_repeat_ngram_size, alignments), None left
        out; alignments a backend without attention weights cannot give are a 422 naming it."""
        self.check_at_most("beam", beam, self.limits.max_beam)
        self.check_at_most("nbest", nbest, self.limits.max_beam)
        self.check_at_most("alpha", alpha, self.limits.max_alpha)
        base = self.folder.decode
        beam = base.beam if beam is None else beam
        nbest = 1 if nbest is None else nbest
        if nbest > beam:
            raise RequestError(422, f"nbest ({nbest}) must be at most beam ({beam})")
        alpha = base.alpha if alpha is None else alpha
        chosen = {k: v for k, v in controls.items() if v is not None}
        if chosen.get("alignments"):
            try:
                require(self.folder.backend, "attention", "alignments need a PyTorch model")
            except Unsupported as err:
                raise RequestError(422, f"alignments: {err}") from None
        try:
            return dataclasses.replace(
                base, beam=beam, alpha=alpha, nbest=nbest, workers=1, **chosen
            )
        except ConfigError as err:
            raise RequestError(422, str(err)) from None

    def check_texts(self, texts: Sequence[str], cut: bool = False) -> int:
        """422 for an empty text or one past the token limit (``cut``: no limit, the text is cut
        as in training); returns the tokens of all, as the batch's cost."""
        if len(texts) > self.limits.max_texts:
            raise RequestError(
                422, f"texts: at most {self.limits.max_texts} per request, got {len(texts)}"
            )
        lengths = [len(ids) for ids in self.folder.tokenizer.encode_batch(list(texts))]
        for i, (text, n) in enumerate(zip(texts, lengths)):
            if not text.strip():
                raise RequestError(422, f"texts[{i}] is empty")
            if n > self.max_text_tokens and not cut:
                raise RequestError(
                    422, f"texts[{i}] has {n} tokens; the limit is {self.max_text_tokens}"
                )
        return sum(min(n, self.max_text_tokens) for n in lengths)

    def translate(
        self,
        texts: Sequence[str],
        decode: DecodeConfig,
        prefixes: Sequence[str | None] | None = None,
    ) -> Future:
        """Queue ``texts`` for translation; the result's outputs are, per text, its n-best list
        of ``{"text", "score", "log_prob"}`` (and ``"alignment"``, ``"src_tokens"``,
        ``"tokens"`` with ``decode.alignments``). With ``prefixes`` (per text the start its
        translation must have) the request runs as a batch of its own."""
        self.require("translate")
        cost = self.check_texts(texts)
        if prefixes is None:
            return self.batcher.submit(("translate", decode), texts, cost)
        self._check_prefixes(texts, prefixes)
        arrived = time.monotonic()

        def alone() -> BatchResult:
            start = time.monotonic()
            outputs = self._translations(texts, decode, prefixes)
            return BatchResult(outputs, start - arrived, time.monotonic() - start, 1, len(texts))

        return self.batcher.call(alone)

    def _check_prefixes(self, texts: Sequence[str], prefixes: Sequence[str | None] | None) -> None:
        """422 for prefixes that are not one per text, or one past the token limit."""
        if prefixes is None:
            return
        if len(prefixes) != len(texts):
            raise RequestError(422, f"prefixes: one per text ({len(texts)}), got {len(prefixes)}")
        for i, prefix in enumerate(prefixes):
            n = len(self.folder.tokenizer.encode(prefix)) if prefix else 0
            if n > self.max_text_tokens:
                raise RequestError(
                    422, f"prefixes[{i}] has {n} tokens; the limit is {self.max_text_tokens}"
                )

    def classify(self, texts: Sequence[str]) -> Future:
        """Queue ``texts`` for classification; outputs ``{"label", "probs"}`` per text. A long
        text is cut to the run's ``data.max_len``, as in training and `aiayn classify`."""
        self.require("classify")
        cost = self.check_texts(texts, cut=True)
        return self.batcher.submit(("classify",), texts, cost)

    def attention(
        self, text: str, decode: DecodeConfig, rank: int, prefix: str | None = None
    ) -> Future:
        """Queue the attention maps of ``text``'s translation (the ``rank``-th of its n-best;
        ``prefix``: the start it must have)."""
        self.require("attention")
        self.check_texts([text])
        self._check_prefixes([text], None if prefix is None else [prefix])
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
        options: dict[str, Any],
        on_token: Callable[[str], None],
    ) -> Future:
        """Queue a generation; ``on_token(text)`` runs on the worker thread with each new piece
        of text (raise :class:`GenerationStopped` in it to stop). The result is the text."""
        self.require("generate")
        try:
            check_seed(options.get("seed"))
        except ConfigError as err:
            raise RequestError(422, str(err)) from None
        if not prompt.strip():
            raise RequestError(422, "prompt is empty")
        n = len(self.folder.tokenizer.encode(prompt))
        if n > self.max_text_tokens:
            raise RequestError(422, f"prompt has {n} tokens; the limit is {self.max_text_tokens}")
        folder = self.folder
        return self.batcher.call(lambda: folder.generate(prompt, on_token=on_token, **options))

    # ---- the worker thread ------------------------------------------------------------------

    def _run(self, key: Hashable, inputs: list[Any]) -> list[Any]:
        what = key[0]  # type: ignore[index]
        if what == "translate":
            return self._translations(inputs, key[1])  # type: ignore[index]
        if what == "classify":
            return list(self.folder.classify(inputs))
        raise ValueError(f"unknown batch key {key!r}")

    def _translations(
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
            out.append([self._hypothesis(t, h, src) for t, h in hyps])
        return out

    def _hypothesis(self, text: str, h: Hypothesis, src: list[str]) -> dict[str, Any]:
        """One hypothesis as JSON; with its alignment, the token labels its indices point at."""
        out = {"text": text, "score": _finite(h.score), "log_prob": _finite(h.log_prob)}
        if h.alignment is not None:
            tokens = token_labels(self.folder.tokenizer, h.tokens)
            out.update(alignment=[list(p) for p in h.alignment], src_tokens=src, tokens=tokens)
        return out

    def _stepper(self, key: Hashable) -> Stepper | None:
        """Translations run step by step (their requests join between decoder steps); None
        for the other keys and for translations with alignments, batched at batch
        boundaries."""
        if key[0] != "translate" or key[1].alignments:  # type: ignore[index]
            return None  # alignments: a teacher-forced pass over each whole output
        return TextTranslation(self.folder, key[1], self._hypothesis)  # type: ignore[index]

    # ---- GET /v1/model ------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        """Kind, config, parameters, vocabulary, data, decoding, measured scores, limits."""
        folder = self.folder
        config = to_dict(folder.config)
        params = {id(p): p.numel() for p in folder.parameters()}
        return {
            "kind": self.kind,
            "engine": self.engine,
            "paths": [str(p) for p in folder.paths],
            "ensemble": len(folder.paths),
            "parameters": sum(params.values()) or None,  # None: an exported model's
            "vocab_size": tok.vocab_size
            if (tok := folder.text_tokenizer)
            else None,  # images: None
            "config": config,
            "data": config.get("data") if folder.has_data else None,  # else only defaults
            "decode": dataclasses.asdict(folder.decode),
            "scores": measured_scores(folder.paths),
            "card": _card(folder.path),
            "routes": [f"/v1/{r}" for r in self.routes],
            "limits": {**dataclasses.asdict(self.limits), "max_text_tokens": self.max_text_tokens},
        }


class TextTranslation:
    """A :class:`~aiayn.serve.stepping.Stepper` over texts: a running translation of the
    folder's backend (:class:`~aiayn.decode.continuous.RunningTranslation`) behind its
    tokenizer, under the folder's precision; outputs as ``/v1/translate`` answers each text.
    Texts are never blank here (:meth:`ModelService.check_texts` refuses them)."""

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
        scores[path.stem[len("eval_") :]] = _finite(data)
    return scores


def _finite(value: Any) -> Any:
    """JSON has no NaN: non-finite floats become None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _card(path: Path) -> str | None:
    """The folder's README.md model card, when it has one."""
    card = Path(path) / "README.md"
    try:
        return card.read_text(encoding="utf-8") if card.is_file() else None
    except (OSError, UnicodeDecodeError):
        return None
