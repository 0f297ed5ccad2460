"""Every error of the HTTP API as one line of JSON, ``{"error": "..."}``, with its status.

400 malformed JSON, 401 API key (aiayn/serve/guard.py), 404/405 route, 413 body too large
(guard.py), 422 a value out of range or a request the library refuses (the reason names the
field; a request of more texts than the queue ever holds included), 503 queue full (with
Retry-After) or the server stopping, 504 time limit. Anything else is a bug: 500, and a
traceback in the log.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from aiayn.errors import AiaynError
from aiayn.serve.queue import QueueFull, RequestError, Stopping, TooLarge

log = logging.getLogger(__name__)

__all__ = ["add_error_handlers", "error", "one_line"]


def one_line(err: BaseException) -> str:
    """An exception's message on one line (its type's name when it has none)."""
    return " ".join(str(err).split()) or type(err).__name__


def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """The answer for an error. Characters UTF-8 cannot hold (a lone surrogate the client sent,
    quoted back in the message) are written as escapes."""
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def validation_message(err: RequestValidationError) -> tuple[int, str]:
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
    if kind == "string_unicode":  # pydantic's own check, on a field's name
        return 422, f"{where or 'a field name'}: a lone surrogate is not valid Unicode"
    return 422, f"{where}: {first.get('msg', 'invalid')}"


def http_message(request: Request, err: StarletteHTTPException) -> str:
    """A routing or parsing error's line: the route or method it is about."""
    if err.status_code == 404:
        return f"no route {request.url.path}"
    if err.status_code == 405:
        return f"{request.method} is not allowed on {request.url.path}"
    if err.status_code == 400:
        return f"malformed JSON: {one_line(Exception(err.detail))}"
    return one_line(Exception(err.detail))


def add_error_handlers(app: FastAPI) -> None:
    """Every exception a route can raise, as its one-line JSON answer."""

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        return error(*validation_message(err))

    @app.exception_handler(RequestError)
    async def refused(request: Request, err: RequestError) -> JSONResponse:
        return error(err.status, err.message, err.headers)

    @app.exception_handler(AiaynError)
    async def library(request: Request, err: AiaynError) -> JSONResponse:
        return error(422, one_line(err))  # the library refused the request (a bad value)

    @app.exception_handler(QueueFull)
    async def busy(request: Request, err: QueueFull) -> JSONResponse:
        return error(503, str(err), {"Retry-After": str(err.retry_after)})

    @app.exception_handler(TooLarge)
    async def too_large(request: Request, err: TooLarge) -> JSONResponse:
        return error(422, str(err))

    @app.exception_handler(Stopping)
    async def stopping(request: Request, err: Stopping) -> JSONResponse:
        return error(503, str(err))

    @app.exception_handler(StarletteHTTPException)
    async def http(request: Request, err: StarletteHTTPException) -> JSONResponse:
        return error(err.status_code, http_message(request, err), getattr(err, "headers", None))

    @app.exception_handler(Exception)
    async def crashed(request: Request, err: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return error(500, f"internal error: {one_line(err)}")
