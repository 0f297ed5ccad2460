"""The HTTP API and the web page of `aiayn serve` (FastAPI), put together.

Routes (all but ``/health`` need the API key when one is set):

    GET  /                 the page (aiayn/serve/page.py, static/): translate / classify /
                           generate, the n-best list, an attention explorer, the model card
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

By concern: the request bodies and the rules every field obeys (finite numbers, ranges, valid
Unicode) in aiayn/serve/schemas.py; the routes in routes.py; every error as one line of JSON
with its status in errors.py; the API key and the body size in guard.py; the page in page.py.
The limits are :class:`~aiayn.serve.limits.Limits`; the model behind the routes is a
:class:`~aiayn.serve.service.ModelService`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline

from aiayn.folder import ModelFolder
from aiayn.serve.errors import add_error_handlers
from aiayn.serve.guard import Guard
from aiayn.serve.limits import Limits
from aiayn.serve.page import add_page
from aiayn.serve.routes import add_routes
from aiayn.serve.service import ModelService

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
    add_error_handlers(app)
    add_routes(app, service, limits)
    add_page(app)
    return app
