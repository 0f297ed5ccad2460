"""`aiayn serve`: a model folder over HTTP, with dynamic batching and a web page (extra ``serve``).

Without a web dependency: :mod:`aiayn.serve.queue` (the bounded request queue),
:mod:`aiayn.serve.schedulers` (what runs next: whole batches or step-level batching, behind one
interface), :mod:`aiayn.serve.batching` (the worker that runs them), :mod:`aiayn.serve.limits`
(the bounds) and :mod:`aiayn.serve.service` (requests checked and queued, answers shaped). With
FastAPI: :mod:`aiayn.serve.app` puts together ``schemas`` (request bodies and their rules),
``routes``, ``errors``, ``guard`` (API key, body size) and ``page`` (the page in ``static/``).
docs/serving.md is the guide.
"""

from aiayn.serve.extra import require_extra
from aiayn.serve.limits import Limits

__all__ = ["Limits", "create_app", "require_extra"]


def create_app(*args, **kwargs):
    """:func:`aiayn.serve.app.create_app` (imported here lazily: FastAPI is an extra)."""
    require_extra()
    from aiayn.serve.app import create_app as create

    return create(*args, **kwargs)
