"""The HTTP API and the web page of `aiayn serve` (FastAPI).

Routes (all but ``/health`` need the API key when one is set):

    GET  /                 the page (aiayn/serve/static/): translate / classify / generate, the
                           n-best list, an attention explorer, the model card
    GET  /health           {"status": "ok", ...}
    GET  /v1/model         kind, config, parameters, vocabulary, data, decoding, measured scores
    POST /v1/translate     {"texts": [...], "beam", "alpha", "nbest", "repetition_penalty",
                           "no_repeat_ngram_size", "prefixes", "alignments"} -> n-best lists
                           (alignments: token index pairs), timing
    POST /v1/classify      {"texts": [...]} -> label and probabilities per text
    POST /v1/generate      {"prompt", ...} -> tokens as server-sent events
    POST /v1/attention     {"text", "beam", "alpha", "rank", the controls, "prefix"} -> tokens
                           (and their spans of whole characters) and every layer's and head's
                           attention weights for that translation
    GET  /docs             OpenAPI (Swagger UI, served from the package: no CDN),
                           /openapi.json the schema

Every error is one line of JSON, ``{"error": "..."}``, with its status: 400 malformed JSON, 401
API key, 404/405 route, 413 body too large, 422 a value out of range (the reason names it; a
request of more texts than the queue ever holds included), 503
queue full (with Retry-After), 504 time limit. The limits are :class:`~aiayn.serve.limits.Limits`.
"""

import asyncio
import dataclasses
import hmac
import json
import logging
import threading
import time
from base64 import b64decode
from collections.abc import AsyncIterator
from concurrent.futures import Future
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from aiayn.decode import DecodeConfig
from aiayn.errors import AiaynError
from aiayn.folder import ModelFolder
from aiayn.serve.batching import BatchResult, QueueFull, Stopping, TooLarge
from aiayn.serve.limits import Limits
from aiayn.serve.service import GenerationStopped, ModelService, RequestError

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"

__all__ = ["create_app"]


def create_app(
    folder: ModelFolder,
    limits: Limits | None = None,
    api_key: str | None = None,
    worker_thread: bool = True,
) -> FastAPI:
    """The app serving ``folder`` (:func:`aiayn.folder.load_model_folder`, or an exported
    folder) within ``limits``; with ``api_key`` every route but /health asks for it. With
    ``worker_thread=False`` the model runs where the caller runs ``app.state.service.batcher
    .work()`` (`aiayn serve`: the main thread, with uvicorn on another)."""
    limits = limits or Limits()
    service = ModelService(folder, limits, worker_thread)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        service.close()

    # Swagger UI (/docs) from fastapi-offline's copy: no CDN, so the API page works on a machine
    # without internet access. No ReDoc: its page fetches a logo from Redocly's CDN.
    app = FastAPIOffline(
        redoc_url=None,
        static_url="/docs-assets",
        title="aiayn",
        summary="A Transformer model folder served over HTTP (docs/serving.md).",
        description="Limits of this server: "
        + ", ".join(f"{k} {v}" for k, v in dataclasses.asdict(limits).items()),
        lifespan=lifespan,
    )
    app.state.service = service
    app.add_middleware(Guard, max_body_bytes=limits.max_body_bytes, api_key=api_key)
    _error_handlers(app)
    _model_routes(app, service, limits)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    @app.get("/health", summary="Liveness and queue: needs no API key")
    async def health() -> dict[str, Any]:
        stats = service.batcher.stats
        return {
            "status": "ok",
            "kind": service.kind,
            "waiting": service.batcher.waiting,
            "batches": stats.batches,
            "requests": stats.requests,
            "steps": stats.steps,  # decoder steps of step-level batches
            "step_requests": stats.step_requests,  # requests in them, summed over the steps
        }

    return app


# ---- request bodies --------------------------------------------------------------------------


# Strict types: "4" is not a beam size, true is not a number; an unknown field is an error. The
# upper bounds are the server's flags (Limits), checked by ModelService with one-line reasons.
_STRICT = ConfigDict(extra="forbid")
_Texts = Annotated[
    list[Annotated[str, Field(strict=True)]],
    Field(min_length=1, description="one text per item (at most --max-texts)"),
]
_Size = Annotated[int | None, Field(strict=True, ge=1, description="at most --max-beam")]
_Alpha = Annotated[
    float | None,
    Field(strict=True, ge=0.0, allow_inf_nan=False, description="at most --max-alpha"),
]


_Penalty = Annotated[
    float | None,
    Field(strict=True, gt=0.0, le=10.0, allow_inf_nan=False, description="1: off"),
]
_NGram = Annotated[int | None, Field(strict=True, ge=0, le=64, description="0: off")]


class TranslateBody(BaseModel):
    """Texts to translate; beam and alpha default to the model folder's settings, nbest to 1;
    the controls of docs/decoding.md (repetition, a forced prefix per text, alignments)."""

    model_config = _STRICT
    texts: _Texts
    beam: _Size = None
    alpha: _Alpha = None
    nbest: _Size = None
    repetition_penalty: _Penalty = None
    no_repeat_ngram_size: _NGram = None
    prefixes: Annotated[
        list[Annotated[str, Field(strict=True)] | None] | None,
        Field(description="per text the start its translation must have (null: none)"),
    ] = None
    alignments: Annotated[
        bool, Field(strict=True, description="source-output token index pairs per hypothesis")
    ] = False


class ClassifyBody(BaseModel):
    """Texts to label; a long text is cut as in training."""

    model_config = _STRICT
    texts: _Texts


class AttentionBody(BaseModel):
    """A sentence; its translation is searched with beam/alpha (default: the folder's) and the
    rank-th hypothesis of the n-best list (1: the best) is the one shown."""

    model_config = _STRICT
    text: Annotated[str, Field(strict=True)]
    beam: _Size = None
    alpha: _Alpha = None
    rank: Annotated[int, Field(strict=True, ge=1, description="at most the beam size")] = 1
    repetition_penalty: _Penalty = None
    no_repeat_ngram_size: _NGram = None
    prefix: Annotated[
        str | None, Field(strict=True, description="the start the translation must have")
    ] = None


class GenerateBody(BaseModel):
    """A prompt to continue; sampling settings as `aiayn generate`."""

    model_config = _STRICT
    prompt: Annotated[str, Field(strict=True)]
    max_new_tokens: Annotated[
        int, Field(strict=True, ge=1, description="at most --max-new-tokens")
    ] = 100
    temperature: Annotated[float, Field(strict=True, gt=0.0, le=10.0, allow_inf_nan=False)] = 1.0
    top_k: Annotated[int, Field(strict=True, ge=0)] = 0
    top_p: Annotated[float, Field(strict=True, gt=0.0, le=1.0, allow_inf_nan=False)] = 1.0
    seed: Annotated[int | None, Field(strict=True)] = None


# ---- model routes ------------------------------------------------------------------------------


def _model_routes(app: FastAPI, service: ModelService, limits: Limits) -> None:
    @app.get("/v1/model", summary="What the server holds: kind, config, size, data, scores")
    async def model() -> dict[str, Any]:
        return service.info()

    @app.post("/v1/translate", summary="Translate texts (n-best lists with scores)")
    async def translate(body: TranslateBody) -> dict[str, Any]:
        start = time.monotonic()
        decode = service.decode_config(
            body.beam,
            body.alpha,
            body.nbest,
            repetition_penalty=body.repetition_penalty,
            no_repeat_ngram_size=body.no_repeat_ngram_size,
            alignments=body.alignments,
        )
        queued = service.translate(body.texts, decode, body.prefixes)
        result = await _answer(service, queued, start, limits)
        return {
            "translations": [{"text": hyps[0]["text"], "nbest": hyps} for hyps in result.outputs],
            "decode": _settings(decode),
            "timing": _timing(result, start),
        }

    @app.post("/v1/classify", summary="Label texts (probabilities per label)")
    async def classify(body: ClassifyBody) -> dict[str, Any]:
        start = time.monotonic()
        result = await _answer(service, service.classify(body.texts), start, limits)
        return {"results": result.outputs, "timing": _timing(result, start)}

    @app.post("/v1/attention", summary="Attention weights of every layer and head")
    async def attention(body: AttentionBody) -> dict[str, Any]:
        start = time.monotonic()
        decode = service.decode_config(
            body.beam,
            body.alpha,
            None,
            repetition_penalty=body.repetition_penalty,
            no_repeat_ngram_size=body.no_repeat_ngram_size,
        )
        queued = service.attention(body.text, decode, body.rank, body.prefix)
        maps = await _answer(service, queued, start, limits)
        return {
            **maps,
            "rank": body.rank,
            "decode": {k: v for k, v in _settings(decode).items() if k != "nbest"},
            "timing": {"total_ms": _ms(time.monotonic() - start)},
        }

    @app.post(
        "/v1/generate",
        summary="Continue a prompt; tokens streamed as server-sent events",
        response_class=StreamingResponse,
    )
    async def generate(body: GenerateBody) -> StreamingResponse:
        service.check_at_most("max_new_tokens", body.max_new_tokens, limits.max_new_tokens)
        options = body.model_dump(exclude={"prompt"})
        return _stream_generation(service, body.prompt, options, limits)


async def _answer(service: ModelService, future: Future, start: float, limits: Limits) -> Any:
    """The future's result within the request's time limit; 504 (and the request dropped from
    the queue when it has not started) after it. The batcher hears of each answer handed out
    (its window stays open while a batch's answers are written: their clients come back after)."""
    left = limits.timeout - (time.monotonic() - start)
    try:
        return await asyncio.wait_for(asyncio.wrap_future(future), timeout=max(left, 0.001))
    except TimeoutError:
        future.cancel()
        raise RequestError(
            504, f"the request took longer than the time limit ({limits.timeout:g} s)"
        ) from None
    except AiaynError as err:
        raise RequestError(422, str(err)) from None
    finally:
        service.batcher.answered()


def _settings(decode: DecodeConfig) -> dict[str, Any]:
    """The decoding settings a translation was made with: beam, alpha, nbest, and the
    repetition controls when they are on."""
    out: dict[str, Any] = {"beam": decode.beam, "alpha": decode.alpha, "nbest": decode.nbest}
    if decode.repetition_penalty != 1.0:
        out["repetition_penalty"] = decode.repetition_penalty
    if decode.no_repeat_ngram_size:
        out["no_repeat_ngram_size"] = decode.no_repeat_ngram_size
    return out


def _ms(seconds: float) -> float:
    return round(1000.0 * seconds, 2)


def _timing(result: BatchResult, start: float) -> dict[str, Any]:
    return {
        "queue_ms": _ms(result.queue_s),
        "compute_ms": _ms(result.compute_s),
        "total_ms": _ms(time.monotonic() - start),
        "batch_requests": result.batch_requests,
        "batch_texts": result.batch_inputs,
    }


def _sse(event: str, data: dict[str, Any]) -> str:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def _stream_generation(
    service: ModelService, prompt: str, options: dict[str, Any], limits: Limits
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

    future = service.generate(prompt, options, on_token)
    future.add_done_callback(lambda _: post(None))

    async def events() -> AsyncIterator[str]:
        pieces = 0
        try:
            while True:
                try:
                    item = await asyncio.wait_for(queue.get(), deadline - time.monotonic())
                except TimeoutError:
                    yield _sse("error", {"error": _late(limits)})
                    return
                if item is not None:
                    pieces += 1
                    yield _sse("token", {"text": item})
                    continue
                if future.cancelled() or isinstance(future.exception(), GenerationStopped):
                    yield _sse("error", {"error": _late(limits)})
                elif (err := future.exception()) is not None:
                    yield _sse("error", {"error": _one_line(err)})
                else:
                    timing = {"total_ms": _ms(time.monotonic() - start)}
                    done = {"text": future.result(), "pieces": pieces, "timing": timing}
                    yield _sse("done", done)
                return
        finally:
            stop.set()  # the generation stops at its next token
            future.cancel()

    return StreamingResponse(
        events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


def _late(limits: Limits) -> str:
    return f"the request took longer than the time limit ({limits.timeout:g} s)"


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


# ---- errors ------------------------------------------------------------------------------------


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _validation_message(err: RequestValidationError) -> tuple[int, str]:
    """The first problem of a request body as (status, one line)."""
    first = err.errors()[0]
    kind, loc = first.get("type", ""), [p for p in first.get("loc", ()) if p != "body"]
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    if kind == "json_invalid":
        return 400, f"malformed JSON: {first.get('ctx', {}).get('error', 'cannot parse')}"
    if kind == "missing" and not loc:
        return 400, "the body is empty: send a JSON object"
    if kind == "extra_forbidden":
        return 422, f"unknown field '{where}'"
    if kind in ("model_attributes_type", "dict_type") and len(loc) == 0:
        return 422, "the body must be a JSON object"
    if kind == "missing":
        return 422, f"'{where}' is required"
    return 422, f"{where}: {first.get('msg', 'invalid')}"


def _error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        return _error(*_validation_message(err))

    @app.exception_handler(RequestError)
    async def refused(request: Request, err: RequestError) -> JSONResponse:
        return _error(err.status, err.message, err.headers)

    @app.exception_handler(QueueFull)
    async def busy(request: Request, err: QueueFull) -> JSONResponse:
        return _error(503, str(err), {"Retry-After": str(err.retry_after)})

    @app.exception_handler(TooLarge)
    async def too_large(request: Request, err: TooLarge) -> JSONResponse:
        return _error(422, str(err))

    @app.exception_handler(Stopping)
    async def stopping(request: Request, err: Stopping) -> JSONResponse:
        return _error(503, str(err))

    @app.exception_handler(StarletteHTTPException)
    async def http(request: Request, err: StarletteHTTPException) -> JSONResponse:
        if err.status_code == 404:
            message = f"no route {request.url.path}"
        elif err.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
        elif err.status_code == 400:
            message = f"malformed JSON: {_one_line(Exception(err.detail))}"
        else:
            message = _one_line(Exception(err.detail))
        return _error(err.status_code, message, getattr(err, "headers", None))

    @app.exception_handler(Exception)
    async def crashed(request: Request, err: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return _error(500, f"internal error: {_one_line(err)}")


# ---- API key and body size (pure ASGI, before FastAPI reads anything) --------------------------


class Guard:
    """Refuses a request without the API key (401; /health is open) and reads the body up to
    ``max_body_bytes`` before the app sees it (413 beyond, whether Content-Length says so or a
    chunked body runs over). The key may come as ``Authorization: Bearer KEY``, ``X-API-Key:
    KEY``, or HTTP Basic auth with KEY as the password (so that a browser asks for it on the
    page and then sends it with the page's own calls)."""

    def __init__(self, app: Any, max_body_bytes: int, api_key: str | None) -> None:
        self.app, self.max_body_bytes, self.api_key = app, max_body_bytes, api_key

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.api_key and scope["path"] != "/health" and not self._has_key(headers):
            await _send(send, 401, "missing or wrong API key", {"WWW-Authenticate": _CHALLENGE})
            return
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            await _send(send, 413, self._too_large(int(declared)))
            return
        body, more = bytearray(), True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_body_bytes:
                await _send(send, 413, self._too_large(len(body), at_least=more))
                return
        await self.app(scope, _replay(bytes(body), receive), send)

    def _too_large(self, size: int, at_least: bool = False) -> str:
        more = " at least" if at_least else ""
        return f"the body is{more} {size} bytes; the limit is {self.max_body_bytes}"

    def _has_key(self, headers: dict[str, str]) -> bool:
        if not self.api_key:
            return True
        given = headers.get("x-api-key", "")
        scheme, _, value = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            given = value.strip()
        elif scheme.lower() == "basic":
            try:
                given = b64decode(value.strip()).decode("utf-8").partition(":")[2]
            except (ValueError, UnicodeDecodeError):
                return False
        return bool(given) and hmac.compare_digest(given.encode(), self.api_key.encode())


_CHALLENGE = 'Basic realm="aiayn (any user name, the API key as password)"'


def _replay(body: bytes, receive: Any) -> Any:
    sent = False

    async def replayed() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


async def _send(send: Any, status: int, message: str, headers: dict[str, str] | None = None):
    payload = json.dumps({"error": message}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})
