"""`aiayn serve`: a model folder as an HTTP API and a web page (docs/serving.md).

Loads the folder(s) once (several translation folders decode as an ensemble), then serves
``/v1/translate``, ``/v1/classify``, ``/v1/generate``, ``/v1/attention``, ``/v1/model``,
``/health`` and the page at ``/`` with uvicorn. Binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from typing import TYPE_CHECKING

from aiayn.commands.options import add_device, add_engine, add_sets, section_sets
from aiayn.errors import ConfigError

if TYPE_CHECKING:
    from aiayn.serve.limits import Limits

log = logging.getLogger(__name__)

KEY_ENV = "AIAYN_API_KEY"


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "serve",
        description="Serve a model folder: POST /v1/translate (classify, generate, attention), "
        "GET /v1/model, /health, the page at /, OpenAPI at /docs. Needs the 'serve' extra.",
    )
    p.add_argument(
        "model",
        metavar="MODEL_DIR",
        nargs="+",
        help="a model folder (translation, classifier or language model); several "
        "translation folders decode as an ensemble",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    add_engine(p)
    add_device(p)
    p.add_argument(
        "--api-key",
        help=f"require this key on every route but /health (default: ${KEY_ENV} when set)",
    )
    p.add_argument(
        "--lanes",
        type=int,
        metavar="N",
        help="server processes sharing the port, each with its own batch and an equal share of "
        "the cores, at most one per core (default: one per core, or per thread AIAYN_THREADS / "
        "OMP_NUM_THREADS set, each on 1 thread; 1 on a GPU; docs/serving.md)",
    )
    add_sets(p, "serve", "serve.max_texts=64", "a limit of the server or how it batches")
    p.description = (p.description or "") + (
        " The server's limits and batching are --set serve.KEY=VALUE (every key: "
        "docs/reference/cli.md, [serve])."
    )
    p.set_defaults(run=run, workers=1)  # each lane's one worker thread decodes (the batcher's)
    return p


def run(args: argparse.Namespace) -> int:
    from aiayn.serve.extra import require_extra

    require_extra()
    import torch

    from aiayn.commands.options import inference_device, open_models
    from aiayn.serve.app import create_app, serve_lane
    from aiayn.serve.lanes import (
        Lanes,
        LaneSpec,
        lane_plan,
        listening_socket,
        serve_forever,
        server_threads,
    )
    from aiayn.threads import LoadFollower

    limits = limits_from(args)
    api_key = args.api_key or os.environ.get(KEY_ENV) or None
    device = inference_device(args.device)  # torch's threads: the cores not busy
    check_port(args.host, args.port)
    lanes, per_lane = lane_plan(args.lanes, server_threads(device.type), device.type)
    torch.set_num_threads(per_lane)  # before the folder opens: CTranslate2 takes it then
    folder = open_models(args, device)  # the loader of translate/evaluate, engines included
    follow = LoadFollower(per_lane) if lanes > 1 and per_lane > 1 else lanes == 1
    app = create_app(folder, limits, api_key, worker_thread=False, follow_load=follow)
    spec = LaneSpec(
        models=[str(p) for p in folder.paths],
        engine=folder.engine,
        device=str(device),
        host=args.host,
        port=args.port,
        threads=per_lane,
        limits=dataclasses.asdict(limits),
        api_key=api_key,
        log_level=logging.getLogger().level,
        lanes=lanes,
    )
    app.state.lanes = lanes
    if args.host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        log.warning(
            "serving on %s without an API key: anyone who reaches this port can use the model "
            "(set --api-key or %s)",
            args.host,
            KEY_ENV,
        )
    others = Lanes(spec, lanes - 1, serve_lane)
    others.start()  # each lane loads the folder and listens before this one does
    try:
        sock = listening_socket(args.host, args.port, share=lanes > 1)
        log.info(
            "serving %s model %s (%s) on http://%s:%d/ (API docs at /docs), %d lane(s) of %d "
            "thread(s)",
            *(folder.kind, " + ".join(map(str, folder.paths)), folder.engine, args.host),
            *(args.port, lanes, per_lane),
        )
        return serve_forever(app, args.host, args.port, sock)
    finally:
        others.stop()


def limits_from(args: argparse.Namespace) -> Limits:
    """The server's Limits from ``--set serve.KEY=VALUE`` (the others keep their defaults)."""
    from aiayn.config import coerce_keys
    from aiayn.serve.limits import Limits

    sets = section_sets(args.overrides, "serve")
    return Limits(**coerce_keys(Limits, sets, prefix="serve."))


def check_port(host: str, port: int) -> None:
    """ConfigError when ``host:port`` cannot be bound (in use, no such address)."""
    import socket

    if not 0 < port < 65536:
        raise ConfigError(f"--port must be between 1 and 65535, got {port}")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        with socket.socket(infos[0][0], socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(infos[0][4])
    except OSError as err:
        raise ConfigError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
