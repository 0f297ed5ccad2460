"""Load benchmark of `aiayn serve`: concurrent clients on 127.0.0.1 against a translation model
folder (the demo model by default), compared in the same run with `aiayn translate` (what
`aiayn evaluate` does) on the same sentences, with the same decoding and thread settings.

For each client count (``--clients 8 32 64``) the server runs as its own process
(`aiayn serve MODEL --port P`); that many client connections each send one sentence per request
(/v1/translate), the next as soon as the last is answered. After ``--warmup`` seconds of that
load (the clients settle into the server's batches) the answers of the next ``--seconds`` are
counted. Reported: requests/s, sentences/s, latency p50/p95/p99, errors (must be 0), the server's
peak RSS (VmHWM, in MiB under the key peak_rss_mb), the mean number of requests per decoder step
(step-level batching, the PyTorch backend) or per batch (from /health, over all lanes). One
client always runs as well: a lone request's latency. ``--baseline`` adds the server with
`--set serve.batching=false` at the first client count, ``--compare FLAGS`` the server with
those flags right after each count's default run (e.g. `--set serve.step_batching=false`; the
default's sentences/s over its in
"targets", and a WARNING line where the default runs more than 10% slower).
`aiayn translate` translates the sentences in one process; its sentences/s
are given with and without model loading (the loading is measured by a translation of one
sentence), and the ratio server / translate (loading excluded) per client count. "targets"
gathers what docs/serving.md's targets compare: that ratio per client count, and each count's
p50 latency over the lone request's; both are printed per client count.

`aiayn translate` also runs at the settings of a small grid (``--grid``, default as
bench_engines.py --sweep's: W workers × T threads each, W × T at most the cores): `--workers W`
on W × T threads. "translate_sweep" gives each setting's sentences/s (loading excluded, medians
of ``--repeats`` alternated rounds), the best, the setting translate's default chose (asked of
aiayn in a process of its own just before), and default ÷ best; a WARNING line is printed when
the default runs more than 10% slower than the best. The model folder may be an export
(`aiayn export --format ctranslate2`, onnx): its engine is recorded ("engine").

The clients share the machine with the server, so they are made cheap (one asyncio loop,
keep-alive connections, request bytes encoded beforehand: about 1% of a core at 150 requests/s,
where 64 threads of httpx took 25-30%); every answer is still parsed and checked.

By default (``--threads 0``) the server and `aiayn translate` run at their own defaults: no
AIAYN_THREADS, OMP_NUM_THREADS or OMP_WAIT_POLICY, each chooses as a user's would. ``--threads
N`` pins both to N intra-op threads (AIAYN_THREADS and OMP_NUM_THREADS) with
OMP_WAIT_POLICY=PASSIVE: on a machine shared with other busy processes, OpenMP's default spinning
makes 2 threads many times slower than 1.

    python benchmarks/bench_serve.py --model runs/demo/m1/avg5 --clients 8 64 128 --seconds 20 \
        --out docs/experiments/serving.json
    python benchmarks/bench_serve.py --model /tmp/demo_ct2 --clients 8 64 128 --seconds 20 \
        --out serving_ct2.json                  # a CTranslate2 export, at its defaults

Sentences: Multi30k test2016 sources from the data mirror (AIAYN_DATA_MIRROR or ../shared/data),
else a few built-in ones.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engines import (  # noqa: E402  (the grid and the warning of --sweep, shared)
    cores,
    default_vs_best,
    default_warning,
    grid,
    label,
    parse_setting,
)

ROOT = Path(__file__).resolve().parents[1]
FALLBACK = [
    "A man in a blue shirt is riding a bike down the street.",
    "Two young girls are playing soccer in a park.",
    "A dog is running through the snow.",
    "A woman is reading a book on a bench.",
    "People are walking on a busy city street at night.",
]


def sentences(limit: int) -> list[str]:
    mirror = os.environ.get("AIAYN_DATA_MIRROR") or str(ROOT.parent / "shared" / "data")
    path = Path(mirror) / "multi30k" / "test_2016_flickr.en.gz"
    if path.is_file():
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return [line.strip() for line in f if line.strip()][:limit]
    return FALLBACK


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def thread_env(threads: int) -> dict[str, str]:
    """The environment of the server and of `aiayn translate`: the same threads for both; 0:
    none set, each chooses its own."""
    env = dict(os.environ)
    if threads == 0:
        for name in ("AIAYN_THREADS", "OMP_NUM_THREADS", "OMP_WAIT_POLICY"):
            env.pop(name, None)
        return env
    env["AIAYN_THREADS"] = env["OMP_NUM_THREADS"] = str(threads)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


def setting_env(threads: int, total: int) -> dict[str, str]:
    """The environment of `aiayn translate --workers W` on ``total`` threads in all: the
    benchmark's (``threads``, 0: a user's) with the thread count set."""
    env = thread_env(threads)
    env["AIAYN_THREADS"] = env["OMP_NUM_THREADS"] = str(total)
    return env


def translate_default(model: list[str], threads: int) -> tuple[str, str]:
    """The engine of ``model`` and the setting (W×T) `aiayn translate` chooses with no --workers
    in the benchmark's environment, as aiayn chooses it, asked in a process of its own."""
    code = (
        "import json, sys\n"
        "from aiayn.folder.config import read_folder_config\n"
        "from aiayn.threads import default_workers, threads_for_load\n"
        "engine = read_folder_config(sys.argv[1]).format or 'torch'\n"
        "threads = threads_for_load()\n"
        "workers = default_workers(engine, threads)\n"
        "print(json.dumps([engine, workers, max(1, threads // workers)]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, model[0]],
        env=thread_env(threads),
        capture_output=True,
        text=True,
        check=True,
    )
    engine, workers, per_worker = json.loads(done.stdout.strip().splitlines()[-1])
    return engine, label(workers, per_worker)


def translate_sweep(
    model: list[str],
    texts: list[str],
    threads: int,
    settings: list[tuple[int, int]],
    repeats: int,
    beam: int | None = None,
) -> tuple[dict, dict]:
    """`aiayn translate` at its default and at each (workers, threads per worker) setting,
    alternating within each of ``repeats`` rounds: the default's row (its median round) and the
    "translate_sweep" block (medians, the best, default ÷ best, the warning)."""
    engine, chosen = translate_default(model, threads)
    envs = {label(w, t): (setting_env(threads, w * t), w) for w, t in settings}
    default: list[dict] = []
    rounds: dict[str, list[dict]] = {s: [] for s in envs}
    for round_ in range(repeats):
        default.append(offline(model, texts, thread_env(threads), beam))
        for s, (env, workers) in envs.items():
            rounds[s].append(offline(model, texts, env, beam, workers))
        rates = {s: r[-1]["sentences_per_s_without_loading"] for s, r in rounds.items()}
        rates["default"] = default[-1]["sentences_per_s_without_loading"]
        rates_text = json.dumps(rates, ensure_ascii=False)
        print(f"aiayn translate, round {round_ + 1}: {rates_text}", flush=True)
    key = "sentences_per_s_without_loading"
    row = sorted(default, key=lambda r: r[key])[len(default) // 2]
    sweep: dict = {
        "engine": engine,
        "repeats": repeats,
        "default": {"setting": chosen, key: row[key], "rounds": [r[key] for r in default]},
        "settings": {
            s: {
                key: round(statistics.median(r[key] for r in rs), 2),
                "rounds": [r[key] for r in rs],
            }
            for s, rs in rounds.items()
        },
    }
    if rounds:
        rates = {s: [r[key] for r in rs] for s, rs in rounds.items()}
        best, ratio = default_vs_best(rates, sweep["default"]["rounds"])
        warning = default_warning(f"aiayn translate ({engine})", chosen, best, ratio)
        sweep.update(best=best, default_vs_best=ratio, warning=warning)
    return row, sweep


def start_server(model: list[str], flags: str, threads: int, extra: list[str]) -> tuple:
    """``flags``: more options of this run's server, one string ("": none;
    --set serve.batching=false, --set serve.join_steps=0, --lanes 1 …)."""
    port = free_port()
    cmd = [sys.executable, "-m", "aiayn", "serve", *model, "--port", str(port)]
    cmd += flags.split()
    cmd += ["--set", "serve.max_queue=4096", *extra]
    env = thread_env(threads)
    log = tempfile.TemporaryFile()  # not a pipe: nobody reads it while the server runs
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            raise SystemExit(f"the server stopped: {log.read().decode()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("the server did not start in 120 s")


COUNTERS = ("batches", "requests", "steps", "step_requests")


def health(url: str) -> dict:
    """The server's /health counters summed over its lanes. Each lane is a process with counters
    of its own, and a new connection reaches one of them (the kernel picks): /health is asked on
    new connections until every lane has answered."""
    lanes: dict[int, dict] = {}
    for _ in range(200):
        answer = httpx.get(url + "/health", timeout=30).json()
        lanes[answer.get("lane", 0)] = answer
        if len(lanes) >= answer.get("lanes", 1):
            break
    else:
        raise SystemExit(f"/health: {len(lanes)} lanes answered of {answer.get('lanes')}")
    return {key: sum(a.get(key, 0) for a in lanes.values()) for key in COUNTERS}


def batch_sizes(before: dict, after: dict) -> dict:
    """From the counters before and after a load (:func:`health`): the mean requests per batch
    (batch-boundary batching), and per decoder step where requests join between steps
    (step-level batching: PyTorch), over all lanes."""
    out = {}
    steps = after.get("steps", 0) - before.get("steps", 0)
    if steps:
        out["requests_per_step"] = round(
            (after["step_requests"] - before["step_requests"]) / steps, 2
        )
    batches = after["batches"] - before["batches"]
    if batches or not steps:
        out["requests_per_batch"] = round(
            (after["requests"] - before["requests"]) / max(batches, 1), 2
        )
    return out


def targets(rows: dict, clients: list[int], compared: list[str]) -> dict:
    """What docs/serving.md's targets compare: sentences/s against `aiayn translate` per client
    count (>= 0.9 at 64 and 128 clients), and p50 latency against a lone request's (one client:
    <= 1.5 at 8 clients)."""
    lone = rows.get("serve, 1 clients", {}).get("p50_ms")
    out: dict = {"lone_request_p50_ms": lone, "vs_translate": {}, "p50_vs_lone_request": {}}
    for c in clients:
        row = rows.get(f"serve, {c} clients")
        if row is None:
            continue
        out["vs_translate"][str(c)] = row["vs_translate"]
        for flags in compared:  # --compare: the default server's sentences/s over theirs
            other = rows.get(f"serve, {c} clients, {flags}")
            if other and other["sentences_per_s"]:
                ratio = row["sentences_per_s"] / other["sentences_per_s"]
                out.setdefault(f"default_vs {flags}", {})[str(c)] = round(ratio, 2)
        if lone:
            out["p50_vs_lone_request"][str(c)] = round(row["p50_ms"] / lone, 2)
    return out


def serve_warnings(goals: dict, clients: list[int], compared: list[str]) -> list[str | None]:
    """Per client count, the warning line when the default server runs more than 10% slower
    than the fastest server of ``--compare`` (e.g. ``--compare='--lanes 1'``); None when not."""
    out = []
    for c in clients:
        ratios = {f: goals.get(f"default_vs {f}", {}).get(str(c)) for f in compared}
        ratios = {f: r for f, r in ratios.items() if r is not None}
        if ratios:
            best = min(ratios, key=ratios.__getitem__)  # the default is slowest against it
            out.append(default_warning(f"aiayn serve, {c} clients", "no flags", best, ratios[best]))
    return out


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def load(
    url: str,
    texts: list[str],
    clients: int,
    seconds: float,
    beam: int | None = None,
    warmup: float = 0.0,
    per_request: int = 1,
) -> dict:
    """``clients`` connections, each with one request of ``per_request`` sentences in flight
    (the next sent as soon as the last is answered), for ``warmup + seconds``; counted: the
    requests answered in the last ``seconds`` (after the clients have settled into the server's
    batches)."""
    return asyncio.run(_load(url, texts, clients, seconds, beam, warmup, per_request))


async def _load(
    url: str,
    texts: list[str],
    clients: int,
    seconds: float,
    beam: int | None,
    warmup: float,
    per_request: int,
) -> dict:
    # The clients share the machine's cores with the server, so they are made cheap: one asyncio
    # loop, keep-alive HTTP/1.1 connections, request bytes encoded before the run. Each answer is
    # still parsed and checked (status 200, one translation per sentence).
    host, port = url.removeprefix("http://").split(":")
    requests = []
    for i in range(0, len(texts), per_request):
        some = (texts[i:] + texts)[:per_request]
        body = json.dumps({"texts": some} if beam is None else {"texts": some, "beam": beam})
        data = body.encode()
        head = (
            f"POST /v1/translate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n"
        )
        requests.append(head.encode() + data)
    latencies: list[float] = []
    errors: list[str] = []
    begin = time.monotonic()
    count_from, stop = begin + warmup, begin + warmup + seconds
    counter = iter(range(10**9))

    async def client() -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            while time.monotonic() < stop:
                request = requests[next(counter) % len(requests)]
                start = time.monotonic()
                writer.write(request)
                try:
                    status, body = await _response(reader)
                    ok = status == 200 and len(json.loads(body)["translations"]) == per_request
                    problem = "" if ok else f"{status} {body[:100]!r}"
                except (
                    OSError,
                    ValueError,
                    KeyError,
                    IndexError,
                    asyncio.IncompleteReadError,
                ) as err:
                    ok, problem = False, repr(err)
                end = time.monotonic()
                if count_from <= end <= stop:
                    (latencies if ok else errors).append(end - start if ok else problem)  # type: ignore[arg-type]
                if not ok:  # the connection may be in any state: open a new one
                    writer.close()
                    try:
                        reader, writer = await asyncio.open_connection(host, int(port))
                    except OSError as err:  # the server is gone
                        errors.append(repr(err))
                        return
        finally:
            writer.close()

    await asyncio.gather(*(client() for _ in range(clients)))
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [float("nan")] * 99
    return {
        "requests": len(latencies),
        "seconds": seconds,
        "requests_per_s": round(len(latencies) / seconds, 2),
        "sentences_per_s": round(len(latencies) * per_request / seconds, 2),
        "p50_ms": round(1000 * q[49], 1),
        "p95_ms": round(1000 * q[94], 1),
        "p99_ms": round(1000 * q[98], 1),
        "errors": len(errors),
        "error_samples": errors[:3],
    }


async def _response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """Status and body of one HTTP/1.1 response (uvicorn's JSON answers have Content-Length)."""
    status = int((await reader.readline()).split()[1])
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return status, await reader.readexactly(length)


def offline(
    model: list[str],
    texts: list[str],
    env: dict[str, str],
    beam: int | None = None,
    workers: int | None = None,
) -> dict:
    """The same sentences through `aiayn translate` in one process (token-bounded batches, the
    folder's decoding settings: what `aiayn evaluate` does) in ``env``, with ``--workers`` when
    given: seconds with model loading, and without it (less the seconds of a translation of one
    sentence, which is mostly loading)."""
    total = translate_seconds(model, texts, env, beam, workers)
    loading = translate_seconds(model, texts[:1], env, beam, workers)
    decoding = total - loading
    separated = decoding > 0
    if not separated:  # loading's noise hides the decoding: the rate with loading, said so
        print(
            f"aiayn translate: {len(texts)} sentences took no longer than one ({total:.2f} against "
            f"{loading:.2f} s): too few to tell decoding from loading; the rate below includes "
            "loading (raise --sentences)",
            flush=True,
        )
        decoding = total
    return {
        "sentences": len(texts),
        "seconds": round(total, 2),
        "sentences_per_s": round(len(texts) / total, 2),
        "loading_s": round(loading, 2),
        "sentences_per_s_without_loading": round(len(texts) / decoding, 2),
        "loading_separated": separated,
    }


def translate_seconds(
    model: list[str],
    texts: list[str],
    env: dict[str, str],
    beam: int | None = None,
    workers: int | None = None,
) -> float:
    tmp = Path("/tmp") / f"bench_serve_{os.getpid()}.txt"
    tmp.write_text("\n".join(texts) + "\n", encoding="utf-8")
    start = time.monotonic()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "aiayn",
            "translate",
            *model,
            "--input",
            str(tmp),
            "-o",
            f"{tmp}.out",
            *([] if beam is None else ["--beam", str(beam)]),
            *([] if workers is None else ["--workers", str(workers)]),
        ],
        check=True,
        env=env,
    )
    seconds = time.monotonic() - start
    tmp.unlink()
    Path(f"{tmp}.out").unlink()
    return seconds


def ceiling(model: list[str], texts: list[str], threads: int, sizes: list[int]) -> dict:
    """The decoding alone, no HTTP: sentences/s of ``aiayn.load(model).translate`` on consecutive
    slices of ``sizes[i]`` sentences (what the server gets from that many one-sentence clients),
    on the main thread and on another thread (where the server's batcher ran before), in a
    process of its own with the benchmark's thread settings."""
    code = (
        "import json, sys, threading, time\n"
        "import aiayn\n"
        "model, sizes, texts = json.loads(sys.stdin.read())\n"
        "folder = aiayn.load(model)\n"
        "def rate(n):\n"
        "    folder.translate(texts[:n])\n"  # the shapes of this size, once
        "    start = time.perf_counter()\n"
        "    for i in range(0, len(texts), n):\n"
        "        folder.translate(texts[i:i + n])\n"
        "    return round(len(texts) / (time.perf_counter() - start), 2)\n"
        "out = {f'batches of {n}, main thread': rate(n) for n in sizes}\n"
        "other = {}\n"
        "import torch\n"
        "threads = torch.get_num_threads()\n"  # torch.set_num_threads is per thread
        "def elsewhere():\n"
        "    torch.set_num_threads(threads)\n"
        "    other['r'] = rate(sizes[-1])\n"
        "t = threading.Thread(target=elsewhere); t.start(); t.join()\n"
        "out[f'batches of {sizes[-1]}, another thread'] = other['r']\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps([model, sizes, texts]),
        env=thread_env(threads),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def ceiling_steps(
    model: list[str],
    texts: list[str],
    threads: int,
    sizes: list[int],
    seconds: float,
    warmup: float,
    beam: int | None = None,
) -> dict:
    """Step-level batching alone, without HTTP and without tokenizing: ``sizes[i]`` closed-loop
    clients of one sentence each on the folder's running translation (what the server's worker
    drives), every client's next sentence joining at the step after its last one ended, all
    newcomers in one join (the server may hold them for ``serve.join_steps``). After ``warmup``
    seconds it counts ``seconds`` of answers: sentences/s, the p50 latency (from the step its
    client was answered to the step its next sentence ended, as a client of the server times
    it) and where the time went (ms per decoder step and per join, joins per step); 1 client
    too. What a step-level server can give on this decoder with nothing else in the way."""
    code = (
        "import json, statistics, sys, time\n"
        "import aiayn\n"
        "from aiayn.decode.translate import encode_sources\n"
        "model, sizes, texts, seconds, warmup, beam = json.loads(sys.stdin.read())\n"
        "folder = aiayn.load(model)\n"
        "decode = folder.decode_config(beam=beam) if beam else folder.decode\n"
        "ids = encode_sources(folder.tokenizer, texts, folder.backend.cfg.max_len)\n"
        "clock = time.perf_counter\n"
        "def run(n):\n"
        "    running = folder.backend.running_translation(decode)\n"
        "    nxt, waiting, client, latency = 0, list(range(n)), {}, []\n"
        "    in_step = in_join = 0.0; steps = joins = 0\n"
        "    now = clock(); counted = now + warmup; end = counted + seconds\n"
        "    ready = {c: now for c in waiting}\n"
        "    while clock() < end:\n"
        "        measured = clock() >= counted\n"
        "        if waiting:\n"
        "            start = clock()\n"
        "            batch = [ids[(nxt + i) % len(ids)] for i in range(len(waiting))]\n"
        "            nxt += len(waiting)\n"
        "            client.update(zip(running.add(batch), waiting))\n"
        "            waiting = []\n"
        "            if measured:\n"
        "                joins += 1; in_join += clock() - start\n"
        "        start = clock()\n"
        "        ended = running.step()\n"
        "        now = clock()\n"
        "        if measured:\n"
        "            steps += 1; in_step += now - start\n"
        "        for j in ended:\n"
        "            c = client.pop(j)\n"
        "            if measured:\n"
        "                latency.append(now - ready[c])\n"
        "            ready[c] = now; waiting.append(c)\n"
        "    return {'sentences_per_s': round(len(latency) / seconds, 2),\n"
        "            'p50_ms': round(1000 * statistics.median(latency), 1),\n"
        "            'sentences': len(latency), 'step_ms': round(1000 * in_step / steps, 2),\n"
        "            'join_ms': round(1000 * in_join / max(joins, 1), 2),\n"
        "            'joins_per_step': round(joins / steps, 2), 'beam': decode.beam}\n"
        "out = {f'{n} clients': run(n) for n in sorted({1, *sizes})}\n"
        "lone = out['1 clients']['p50_ms']\n"
        "for r in out.values():\n"
        "    r['p50_vs_lone'] = round(r['p50_ms'] / lone, 2)\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps([model, sizes, texts, seconds, warmup, beam]),
        env=thread_env(threads),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return "unknown"


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def quantization(folder: str) -> str | None:
    """An exported folder's quantization (config.json), None for a PyTorch one."""
    try:
        return json.loads((Path(folder) / "config.json").read_text(encoding="utf-8")).get(
            "quantization"
        )
    except (OSError, ValueError):
        return None


TABLE_BEGIN = "<!-- serving:begin (benchmarks/bench_serve.py --table) -->"
TABLE_END = "<!-- serving:end -->"


def engine_table(reports: list[dict]) -> str:
    """The engine × clients table of several runs (one per engine, each at its defaults):
    sentences/s served and its ratio to `aiayn translate` on the same engine, p50 at the fewest
    clients against a lone request, errors; the runs' date, CPU and commits under it."""
    counts = sorted({int(k) for r in reports for k in r["targets"]["vs_translate"]} - {1})
    head = ["engine", "`aiayn translate`"] + [f"{c} clients" for c in counts]
    head += [f"p50, {counts[0]} clients ÷ lone", "errors"]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for r in reports:
        name = {"torch": "native (PyTorch fp32)"}.get(r["engine"], r["engine"])
        if r.get("quantization"):
            name = f"{name} {r['quantization']}"
            if r.get("computed_as", r["quantization"]) != r["quantization"]:
                name = f"{name} (in {r['computed_as']})"
        offline = r["results"]["aiayn translate, one process"]["sentences_per_s_without_loading"]
        cells = [name, f"{offline:.1f}"]
        for c in counts:
            row = r["results"].get(f"serve, {c} clients", {})
            cells.append(f"{row.get('sentences_per_s', 0):.1f} ({row.get('vs_translate', 0):.2f}×)")
        cells.append(f"{r['targets']['p50_vs_lone_request'].get(str(counts[0]), 0):.2f}")
        cells.append(str(sum(x.get("errors", 0) for x in r["results"].values())))
        lines.append("| " + " | ".join(cells) + " |")
    dates = sorted({r["date"] for r in reports})
    commits = ", ".join(sorted({r["commit"] for r in reports}))
    lines.append("")
    lines.append(
        f"Sentences/s (× `aiayn translate` on the same engine), every engine at its defaults; "
        f"{reports[0]['cpu']}, {reports[0]['cores']} cores; {dates[0]}–{dates[-1][-9:]}; "
        f"commit {commits}; `python benchmarks/bench_serve.py --table "
        + " ".join(Path(r.get("file", "RUN.json")).name for r in reports)
        + "`."
    )
    return "\n".join(lines)


def write_table(files: list[str], pages: list[str]) -> None:
    """The engine × clients table of the runs in ``files`` between the markers of ``pages``."""
    reports = []
    for f in files:
        report = json.loads(Path(f).read_text(encoding="utf-8"))
        report["file"] = f
        reports.append(report)
    table = engine_table(reports)
    print(table)
    for page in pages:
        text = Path(page).read_text(encoding="utf-8")
        if TABLE_BEGIN not in text or TABLE_END not in text:
            raise SystemExit(f"{page}: no {TABLE_BEGIN} … {TABLE_END} markers")
        before, rest = text.split(TABLE_BEGIN, 1)
        after = rest.split(TABLE_END, 1)[1]
        Path(page).write_text(
            f"{before}{TABLE_BEGIN}\n{table}\n{TABLE_END}{after}", encoding="utf-8"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", nargs="+", default=[str(ROOT / "runs/demo/m1/avg5")])
    p.add_argument(
        "--clients", type=int, nargs="+", default=[8, 64, 128], help="default: 8 64 128 (and 1)"
    )
    p.add_argument("--seconds", type=float, default=20, help="per client count (default: 20)")
    p.add_argument(
        "--warmup", type=float, default=3, help="seconds of load before counting (default: 3)"
    )
    p.add_argument("--sentences", type=int, default=1000, help="test sentences cycled through")
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="intra-op threads of both, with OMP_WAIT_POLICY=PASSIVE (default 0: each "
        "command's own choice, as a user's)",
    )
    p.add_argument(
        "--grid",
        nargs="*",
        metavar="WxT",
        help="`aiayn translate --workers W` on W×T threads at these settings too (default: "
        "bench_engines.py --sweep's grid for the cores; none given: the default alone)",
    )
    p.add_argument(
        "--repeats", type=int, default=3, help="rounds of the translate settings (default: 3)"
    )
    p.add_argument("--beam", type=int, help="beam of both (default: the folder's); 1: overhead")
    p.add_argument(
        "--baseline", action="store_true", help="also the server with --set serve.batching=false"
    )
    p.add_argument(
        "--compare",
        action="append",
        default=[],
        metavar="FLAGS",
        help="also the server with these flags, right after each count's default run (e.g. "
        "--compare='--set serve.step_batching=false'); repeatable",
    )
    p.add_argument("--serve-args", default="", help="more options of `aiayn serve`, one string")
    p.add_argument(
        "--per-request",
        type=int,
        default=1,
        metavar="K",
        help="sentences in each request (default: 1)",
    )
    p.add_argument(
        "--ceiling",
        type=int,
        nargs="*",
        metavar="N",
        help="also the decoding alone (no HTTP) in batches of N sentences, e.g. 8 64 128",
    )
    p.add_argument(
        "--ceiling-steps",
        type=int,
        nargs="*",
        metavar="N",
        help="also step-level batching alone (no HTTP, no tokenizing) with N closed-loop "
        "one-sentence clients (whatever --per-request), joining at once",
    )
    p.add_argument("--out", help="write the figures here as JSON")
    p.add_argument(
        "--table",
        nargs="+",
        metavar="JSON",
        help="write the engine × clients table of these runs (--out files, one per engine) "
        "into --doc's pages and stop",
    )
    p.add_argument(
        "--doc",
        nargs="+",
        default=[str(ROOT / "docs" / "serving.md"), str(ROOT / "docs" / "decoding.md")],
        help="pages whose serving table --table writes (default: docs/serving.md, decoding.md)",
    )
    args = p.parse_args(argv)
    if args.table:
        write_table(args.table, args.doc)
        return 0
    if not all(1 <= c <= 256 for c in args.clients) or not 0 < args.seconds <= 600:
        p.error("--clients 1..256 and --seconds up to 600")
    if not 1 <= args.per_request <= 32:
        p.error("--per-request 1..32 (the server's serve.max_texts)")
    if args.ceiling_steps and not all(1 <= n <= 256 for n in args.ceiling_steps):
        p.error("--ceiling-steps 1..256")
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    try:
        settings = grid(cores()) if args.grid is None else [parse_setting(s) for s in args.grid]
    except ValueError as err:
        p.error(f"--grid: {err}")
    texts = sentences(args.sentences)
    extra = args.serve_args.split()
    load_before = load_average()
    rows: dict[str, dict] = {}
    ref, sweep = translate_sweep(args.model, texts, args.threads, settings, args.repeats, args.beam)
    rows["aiayn translate, one process"] = ref
    print(f"offline: {json.dumps(ref)}", flush=True)
    if args.ceiling:
        rows["decoding alone"] = ceiling(args.model, texts, args.threads, args.ceiling)
        print(f"decoding alone: {json.dumps(rows['decoding alone'])}", flush=True)
    if args.ceiling_steps:
        key = "step-level decoding alone"
        rows[key] = ceiling_steps(
            args.model,
            texts,
            args.threads,
            args.ceiling_steps,
            args.seconds,
            args.warmup,
            args.beam,
        )
        for row in rows[key].values():
            row["vs_translate"] = round(
                row["sentences_per_s"] / ref["sentences_per_s_without_loading"], 2
            )
        print(f"{key}: {json.dumps(rows[key])}", flush=True)
    # one client: the lone request's latency, what the other counts' p50 is compared with
    # each count's compared servers right after its default one: the same machine load
    runs = [(c, f) for c in sorted({1, *args.clients}) for f in ("", *args.compare)]
    if args.baseline:
        runs.append((args.clients[0], "--set serve.batching=false"))
    for clients, batching in runs:
        mode = f"serve, {clients} clients" + (f", {batching}" if batching else "")
        proc, url = start_server(args.model, batching, args.threads, extra)
        try:
            load(url, texts[:16], min(clients, 4), min(2.0, args.seconds))  # loads, first shapes
            before = health(url)
            result = load(
                url, texts, clients, args.seconds, args.beam, args.warmup, args.per_request
            )
            after = health(url)  # batches of this load, warm-up included
            result.update(batch_sizes(before, after))
            result["peak_rss_mb"] = round(peak_rss_mb(proc.pid), 1)
            result["vs_translate"] = round(
                result["sentences_per_s"] / ref["sentences_per_s_without_loading"], 2
            )
        finally:
            proc.terminate()
            proc.wait(30)
        rows[mode] = result
        print(f"{mode}: {json.dumps(result)}", flush=True)
    goals = targets(rows, sorted({1, *args.clients}), args.compare)
    print(f"targets: {json.dumps(goals)}", flush=True)
    for c in args.clients:
        served, p50 = goals["vs_translate"].get(str(c)), goals["p50_vs_lone_request"].get(str(c))
        print(f"{c} clients: served/translate {served}, p50/lone request {p50}", flush=True)
    warnings = [sweep.get("warning"), *serve_warnings(goals, args.clients, args.compare)]
    for line in filter(None, warnings):
        print(line, flush=True)
    from aiayn.runtime.ct2_backend import computed_as

    weights = quantization(args.model[0])
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "load_average": {"before": load_before, "after": load_average()},
        "commit": git_commit(),
        "command": " ".join(["bench_serve.py", *(sys.argv[1:] if argv is None else argv)]),
        "model": args.model,
        "engine": sweep["engine"],
        "quantization": weights,
        "computed_as": computed_as(weights),  # int8 runs in float32 on some CPUs
        "threads": args.threads,
        "per_request": args.per_request,
        "beam": args.beam,
        "seconds": args.seconds,
        "results": rows,
        "targets": goals,
        "translate_sweep": sweep,
        "warnings": [w for w in warnings if w],
    }
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    errors = sum(r.get("errors", 0) for r in rows.values())
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
