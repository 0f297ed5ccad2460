"""The HTTP API and the web page of `aiayn serve` (FastAPI), put together.

Routes (all but ``/health`` need the API key when one is set):

    GET  /                 the page (aiayn/serve/page.py, static/): translate / classify /
                           generate, the n-best list, an attention explorer, the model card
    GET  /health           {"status": "ok", ...}
    GET  /v1/model         kind, config, parameters, vocabulary, data, decoding, measured scores
    POST /v1/translate     {"texts": [...], "beam", "alpha", "nbest", "repetition_penalty",
                           "no_repeat_ngram_size", "prefixes", "alignments"} -> n-best lists
                           (alignments: token index pairs), timing
    POST /v1/classify      {"texts": [...]} -> label and probabilities per text; an image
                           model: {"images": [base64 PNG/JPEG] or "arrays": [pixel rows],
                           "top_k", "attention"} -> per image its top-k classes (and the heat
                           maps of its attention over the patches)
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
import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import torch
from fastapi import FastAPI
from fastapi_offline import FastAPIOffline

from aiayn.folder.load import ModelFolder, load_model_folder
from aiayn.memory import keep_freed_memory
from aiayn.serve.errors import add_error_handlers
from aiayn.serve.guard import Guard
from aiayn.serve.lanes import LaneSpec, listening_socket, serve_forever, watch_parent
from aiayn.serve.limits import Limits
from aiayn.serve.page import add_page
from aiayn.serve.routes import add_routes
from aiayn.serve.service import ModelService
from aiayn.threads import LoadFollower, threads_for_load

__all__ = ["create_app", "serve_lane"]


def create_app(
    folder: ModelFolder,
    limits: Limits | None = None,
    api_key: str | None = None,
    worker_thread: bool = True,
    follow_load: bool | LoadFollower = True,
) -> FastAPI:
    """The app serving ``folder`` (:func:`aiayn.folder.load_model_folder`, or an exported
    folder) within ``limits``; with ``api_key`` every route but /health asks for it. With
    ``worker_thread=False`` the model runs where the caller runs ``app.state.service.batcher
    .work()`` (`aiayn serve`: the main thread, with uvicorn on another). ``follow_load``: as
    :class:`~aiayn.serve.service.ModelService` takes it."""
    limits = limits or Limits()
    service = ModelService(folder, limits, worker_thread, follow_load)

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


def serve_lane(spec: LaneSpec, lane: int, report: Any, alive: Any) -> None:
    """A lane process: load the folder, listen on the shared port, say "ready" (or the error)
    on ``report``, then serve until SIGTERM or until the parent's end of ``alive`` closes."""
    logging.basicConfig(level=spec.log_level, format=f"aiayn lane {lane}: %(message)s")
    try:
        torch.set_num_threads(spec.threads)
        device = torch.device(spec.device)
        if device.type == "cpu":
            keep_freed_memory()  # as inference_device does for the first lane
            threads_for_load()  # may lower the threads for the load
        folder = load_model_folder(spec.models, device, None, spec.engine, 1)
        follow = LoadFollower(spec.threads) if spec.threads > 1 else False
        app = create_app(
            folder, Limits(**spec.limits), spec.api_key, worker_thread=False, follow_load=follow
        )
        app.state.lane, app.state.lanes = lane, spec.lanes
        sock = listening_socket(spec.host, spec.port, share=True)
    except BaseException as err:  # said once, by the first lane
        report.send(str(err).splitlines()[0] if str(err) else type(err).__name__)
        raise SystemExit(1) from None
    threading.Thread(target=watch_parent, args=(alive,), daemon=True).start()
    report.send("ready")
    report.close()
    raise SystemExit(serve_forever(app, spec.host, spec.port, sock))
