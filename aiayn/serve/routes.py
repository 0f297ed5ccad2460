"""The routes of the HTTP API, per kind of model: /v1/translate and /v1/attention
(translation), /v1/classify (texts, or images: top-k classes and attention heat maps), /v1/generate (tokens streamed as server-sent events), and /v1/model
and /health for every kind. Each checks its body (aiayn/serve/schemas.py), hands it to the
:class:`~aiayn.serve.service.ModelService` and awaits the answer within the time limit."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import Future
from typing import Any

from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from aiayn.decode import DecodeConfig, SamplingConfig
from aiayn.errors import AiaynError
from aiayn.serve.errors import one_line
from aiayn.serve.limits import Limits
from aiayn.serve.queue import BatchResult, RequestError
from aiayn.serve.schemas import AttentionBody, ClassifyBody, GenerateBody, TranslateBody
from aiayn.serve.service import GenerationStopped, ModelService

__all__ = ["add_routes"]


def add_routes(app: FastAPI, service: ModelService, limits: Limits) -> None:
    """Every route of the API (a route the model's kind has not answers 404, naming those it
    has: :meth:`ModelService.require`)."""
    info_routes(app, service)
    translation_routes(app, service, limits)
    classification_routes(app, service, limits)
    generation_routes(app, service, limits)


def info_routes(app: FastAPI, service: ModelService) -> None:
    @app.get("/health", summary="Liveness and queue: needs no API key")
    async def health() -> dict[str, Any]:
        stats = service.batcher.stats
        return {
            "status": "ok",
            "kind": service.kind,
            "lane": getattr(app.state, "lane", 0),  # which process answered (aiayn/serve/lanes.py)
            "lanes": getattr(app.state, "lanes", 1),  # of how many (each with its own counters)
            "waiting": service.batcher.waiting,
            "batches": stats.batches,
            "requests": stats.requests,
            "steps": stats.steps,  # decoder steps of step-level batches
            "step_requests": stats.step_requests,  # requests in them, summed over the steps
        }

    @app.get("/v1/model", summary="What the server holds: kind, config, size, data, scores")
    async def model() -> dict[str, Any]:
        return service.info()


def translation_routes(app: FastAPI, service: ModelService, limits: Limits) -> None:
    @app.post("/v1/translate", summary="Translate texts (n-best lists with scores)")
    async def translate(body: TranslateBody) -> dict[str, Any]:
        start = time.monotonic()
        decode = service.checks.decode_config(
            body.beam,
            body.alpha,
            body.nbest,
            repetition_penalty=body.repetition_penalty,
            no_repeat_ngram_size=body.no_repeat_ngram_size,
            alignments=body.alignments,
        )
        queued = service.translate(body.texts, decode, body.prefixes)
        result = await answer(service, queued, start, limits)
        return {
            "translations": [  # a blank text: "" and no hypotheses
                {"text": hyps[0]["text"] if hyps else "", "nbest": hyps} for hyps in result.outputs
            ],
            "decode": settings(decode),
            "timing": timing(result, start),
        }

    @app.post("/v1/attention", summary="Attention weights of every layer and head")
    async def attention(body: AttentionBody) -> dict[str, Any]:
        start = time.monotonic()
        decode = service.checks.decode_config(
            body.beam,
            body.alpha,
            None,
            repetition_penalty=body.repetition_penalty,
            no_repeat_ngram_size=body.no_repeat_ngram_size,
        )
        queued = service.attention(body.text, decode, body.rank, body.prefix)
        maps = await answer(service, queued, start, limits)
        return {
            **maps,
            "rank": body.rank,
            "decode": {k: v for k, v in settings(decode).items() if k != "nbest"},
            "timing": {"total_ms": ms(time.monotonic() - start)},
        }


def classification_routes(app: FastAPI, service: ModelService, limits: Limits) -> None:
    @app.post(
        "/v1/classify",
        summary="Label texts (probabilities per label), or images (the top-k classes, and with "
        "attention the heat maps)",
    )
    async def classify(body: ClassifyBody) -> dict[str, Any]:
        start = time.monotonic()
        given = [f for f in ("texts", "images", "arrays") if getattr(body, f) is not None]
        if len(given) != 1:
            got = " and ".join(given) or "none"
            raise RequestError(422, f"send one of 'texts', 'images' or 'arrays', got {got}")
        if body.texts is not None:
            if body.attention:
                raise RequestError(422, "attention: only for images (an image classifier's)")
            queued = service.classify(body.texts)
        else:
            queued = service.classify_images(body.images, body.arrays, body.top_k, body.attention)
        result = await answer(service, queued, start, limits)
        return {"results": result.outputs, "timing": timing(result, start)}


def generation_routes(app: FastAPI, service: ModelService, limits: Limits) -> None:
    @app.post(
        "/v1/generate",
        summary="Continue a prompt; tokens streamed as server-sent events",
        response_class=StreamingResponse,
    )
    async def generate(body: GenerateBody) -> StreamingResponse:
        sampling = service.checks.sampling_config(
            body.model_dump(exclude={"prompt"}, exclude_none=True)
        )
        return stream_generation(service, body.prompt, sampling, limits)


async def answer(service: ModelService, future: Future, start: float, limits: Limits) -> Any:
    """The future's result within the request's time limit; 504 (and the request dropped from
    the queue when it has not started) after it; an aiayn error (the library refusing the
    request) is a 422 with its line. The batcher hears of each answer handed out (its window
    stays open while a batch's answers are written: their clients come back after)."""
    left = limits.timeout - (time.monotonic() - start)
    try:
        return await asyncio.wait_for(asyncio.wrap_future(future), timeout=max(left, 0.001))
    except TimeoutError:
        future.cancel()
        raise RequestError(504, late(limits)) from None
    except AiaynError as err:
        raise RequestError(422, one_line(err)) from None
    finally:
        service.batcher.answered()


def late(limits: Limits) -> str:
    return f"the request took longer than the time limit ({limits.timeout:g} s)"


def settings(decode: DecodeConfig) -> dict[str, Any]:
    """The decoding settings a translation was made with: beam, alpha, nbest, and the
    repetition controls when they are on."""
    out: dict[str, Any] = {"beam": decode.beam, "alpha": decode.alpha, "nbest": decode.nbest}
    if decode.repetition_penalty != 1.0:
        out["repetition_penalty"] = decode.repetition_penalty
    if decode.no_repeat_ngram_size:
        out["no_repeat_ngram_size"] = decode.no_repeat_ngram_size
    return out


def ms(seconds: float) -> float:
    return round(1000.0 * seconds, 2)


def timing(result: BatchResult, start: float) -> dict[str, Any]:
    return {
        "queue_ms": ms(result.queue_s),
        "compute_ms": ms(result.compute_s),
        "total_ms": ms(time.monotonic() - start),
        "batch_requests": result.batch_requests,
        "batch_texts": result.batch_inputs,
    }


def sse(event: str, data: dict[str, Any]) -> str:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def stream_generation(
    service: ModelService, prompt: str, sampling: SamplingConfig, limits: Limits
) -> StreamingResponse:
    """Server-sent events: ``token`` ({"text"}: the text it adds) for each token, then
    ``done`` ({"text", "tokens", "timing"}) or ``error`` ({"error"}). Refusals before the first
    token (limits, full queue) are ordinary JSON errors."""
    start = time.monotonic()
    deadline = start + limits.timeout
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[str | None] = asyncio.Queue()
    stop = threading.Event()

    def post(item: str | None) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the event loop has closed: nobody is listening
            stop.set()

    def on_token(text: str) -> None:  # on the worker thread
        if stop.is_set() or time.monotonic() > deadline:
            raise GenerationStopped("stopped: time limit or client gone")
        post(text)

    future = service.generate(prompt, sampling, on_token)
    future.add_done_callback(lambda _: post(None))

    async def events() -> AsyncIterator[str]:
        pieces = 0
        try:
            while True:
                try:
                    item = await asyncio.wait_for(queue.get(), deadline - time.monotonic())
                except TimeoutError:
                    yield sse("error", {"error": late(limits)})
                    return
                if item is not None:
                    pieces += 1
                    yield sse("token", {"text": item})
                    continue
                if future.cancelled() or isinstance(future.exception(), GenerationStopped):
                    yield sse("error", {"error": late(limits)})
                elif (err := future.exception()) is not None:
                    yield sse("error", {"error": one_line(err)})
                else:
                    took = {"total_ms": ms(time.monotonic() - start)}
                    done = {"text": future.result(), "pieces": pieces, "timing": took}
                    yield sse("done", done)
                return
        finally:
            stop.set()  # the generation stops at its next token
            future.cancel()

    return StreamingResponse(
        events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )
