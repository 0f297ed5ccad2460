"""The web page of `aiayn serve` (GET /): translate, classify or generate, the n-best list, an
attention explorer (over an uploaded picture for an image classifier) and the model card, from aiayn/serve/static/ (no CDN, no build step). It
calls the same API as any client (tests/test_serve_page.py drives it in a real browser)."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).parent / "static"

__all__ = ["STATIC", "add_page"]


def add_page(app: FastAPI) -> None:
    """GET / (the page) and /static/ (its script and style)."""
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")
