"""Whether the 'serve' extra (FastAPI, uvicorn, fastapi-offline) is installed: one line if not."""

from __future__ import annotations

from aiayn.errors import ConfigError

__all__ = ["require_extra"]


def require_extra() -> None:
    """ConfigError (one line) when FastAPI, uvicorn or fastapi-offline (the API page's assets)
    is missing."""
    try:
        import fastapi  # noqa: F401
        import fastapi_offline  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as err:
        raise ConfigError(
            f"aiayn serve needs the 'serve' extra ({err.name} is missing): "
            "pip install -e '.[serve]'"
        ) from None
