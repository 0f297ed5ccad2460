"""The API key and the body size, checked before FastAPI reads anything (pure ASGI)."""

from __future__ import annotations

import hmac
import json
from base64 import b64decode
from typing import Any

__all__ = ["Guard"]


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
