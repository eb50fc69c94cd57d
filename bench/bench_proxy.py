"""Proxy-added latency of specwatch's shadow proxy vs direct calls, side by side with nginx.

Processes: a fake OpenAI-compatible upstream (aiohttp), the specwatch sidecar (shadow pipeline in
``proxy`` + ``mirror`` modes, sampling p = 1 with the default shadow caps, so every request runs
the whole ingest path and replays go to the same upstream), nginx (Debian ``/usr/sbin/nginx``,
temporary config on loopback, ``proxy_buffering off``, upstream keepalive) and this load generator.

For each request kind (``nonstream``: small JSON; ``stream``: SSE with ``--chunks`` events) and
each path (``direct``, ``specwatch``, ``nginx``, ``direct+mirror``: the live call goes direct while
a fire-and-forget copy goes to specwatch's mirror route as Envoy would send it), the generator
sends requests open-loop at a fixed rate (``--rps``, default 200) for ``--seconds`` and records
the full response time (and time to first byte for streams). Paths are interleaved in rounds so
drift hits all of them alike. Added latency = quantile(path) - quantile(direct), both over all
rounds pooled, and as the median over rounds of the same difference taken within each round (robust
to stalls caused by other work on a shared machine, which hit one round of one path).

Shadow side loaded or not: ``--busy-ms B --busy-every-ms E`` runs B ms of pure-Python work every
E ms on the sidecar's event loop (a statistics refresh as the live path sees it: the GIL held),
``--max-shadow-rps`` raises the replay cap; ``--proxy-mode`` runs the proxy in its own process
(``process``, the default, as ``shadow.proxy_own_process``) or on a thread of the sidecar
(``thread``).

Run from the repository root::

    PYTHONPATH=. python bench/bench_proxy.py --rps 200 --seconds 3 --rounds 10
    PYTHONPATH=. python bench/bench_proxy.py --busy-ms 100 --busy-every-ms 200 \
        --max-shadow-rps 50
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from aiohttp import web

STREAM_BODY = {"model": "m", "prompt": "bench", "stream": True, "max_tokens": 16}
PLAIN_BODY = {"model": "m", "prompt": "bench", "max_tokens": 16}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------------------------------
# child processes


def run_upstream(port: int, chunks: int) -> None:
    plain = json.dumps(
        {
            "id": "cmpl-bench",
            "object": "text_completion",
            "choices": [{"index": 0, "text": "x" * 64, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 16, "total_tokens": 19},
        }
    ).encode()
    event = (
        b'data: {"id":"cmpl-bench","choices":[{"index":0,"text":"tok ","finish_reason":null}]}\n\n'
    )

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body.get("stream"):
            return web.Response(body=plain, content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(chunks):
            await resp.write(event)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


def busy_python(budget: float) -> int:
    """Pure-Python work (holds the GIL) for about ``budget`` seconds: what a statistics
    refresh over the ledger is, from the live path's point of view."""
    end = time.perf_counter() + budget
    n = 0
    while time.perf_counter() < end:
        acc = 0.0
        for i in range(2000):
            acc += (i * 0.5) ** 0.5
        n += 1
    return n


async def shadow_load(busy_ms: float, every_ms: float) -> None:
    """The loaded shadow side: every ``every_ms`` the sidecar's loop runs ``busy_ms`` of Python."""
    while True:
        busy_python(busy_ms / 1e3)
        await asyncio.sleep(max(0.0, (every_ms - busy_ms) / 1e3))


def run_specwatch(
    proxy_port: int, mirror_port: int, upstream: str, mode: str, load: tuple[float, float, float]
) -> None:
    from specwatch.shadow.pipeline import ShadowPipeline
    from specwatch.shadow.settings import ArmEndpoint, ShadowSettings
    from specwatch.shadow.values import ReplayPair

    busy_ms, every_ms, max_rps = load
    settings = ShadowSettings(
        enabled=True,
        modes=("proxy", "mirror"),
        sample_probability=1.0,
        max_shadow_rps=max_rps,
        standard=ArmEndpoint(url=upstream),
        fly=ArmEndpoint(url=upstream),
        proxy_listen_host="127.0.0.1",
        proxy_listen_port=proxy_port,
        proxy_upstream=upstream,
        proxy_own_thread=mode == "thread",
        proxy_own_process=mode == "process",
    )

    delivered = [0]  # replayed pairs handed to the sink (the pipeline never classifies them)

    async def sink(pair: ReplayPair) -> None:
        delivered[0] += 1

    async def make_app() -> web.Application:
        session = aiohttp.ClientSession()
        pipe = ShadowPipeline.from_settings(settings, session=session, on_pair=sink)
        app = web.Application()
        pipe.mount(app)
        if busy_ms > 0:
            loader: list[asyncio.Task[None]] = []

            async def start_load(app: web.Application) -> None:
                loader.append(asyncio.create_task(shadow_load(busy_ms, every_ms)))

            app.on_startup.append(start_load)

        async def close_session(app: web.Application) -> None:
            m = pipe.metrics()
            print(
                f"specwatch: proxied={m.proxy_requests} offered={m.offered} admitted={m.admitted} "
                f"dropped={dict(m.dropped)} replays={delivered[0]}",
                file=sys.stderr,
                flush=True,
            )
            await session.close()

        app.on_cleanup.append(close_session)
        return app

    web.run_app(make_app(), host="127.0.0.1", port=mirror_port, access_log=None, print=None)


NGINX_CONF = """
worker_processes 1;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {d}/body; proxy_temp_path {d}/proxy;
  fastcgi_temp_path {d}/fcgi; uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;
  upstream live {{ server 127.0.0.1:{up}; keepalive 64; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://live;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
    }}
  }}
}}
"""


# ---------------------------------------------------------------------------------------------
# load generator

Sample = tuple[float, float]  # (ttfb, total) seconds


async def one(session: aiohttp.ClientSession, url: str, body: bytes, mirror: str | None) -> Sample:
    headers = {"Content-Type": "application/json"}
    if mirror is not None:
        # fire-and-forget copy, as a mesh mirror sends it (Host gets the -shadow suffix)
        asyncio.get_running_loop().create_task(
            _mirror(session, mirror, body, {**headers, "Host": "live-shadow"})
        )
    t0 = time.perf_counter()
    async with session.post(url, data=body, headers=headers) as r:
        first = await r.content.readany()
        t1 = time.perf_counter()
        while first:
            first = await r.content.readany()
        t2 = time.perf_counter()
        if r.status != 200:
            raise RuntimeError(f"{url}: HTTP {r.status}")
    return t1 - t0, t2 - t0


async def _mirror(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]
) -> None:
    try:
        async with session.post(url, data=body, headers=headers) as r:
            await r.read()
    except aiohttp.ClientError as exc:  # a mirror failure must not fail the bench either
        print(f"mirror copy failed: {exc!r}", file=sys.stderr)


async def open_loop(
    call: Callable[[], Coroutine[Any, Any, Sample]], rps: float, seconds: float
) -> list[Sample]:
    n = int(rps * seconds)
    start = time.perf_counter() + 0.05
    tasks: list[asyncio.Task[Sample]] = []
    for i in range(n):
        delay = start + i / rps - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(call()))
    return list(await asyncio.gather(*tasks))


async def wait_port(port: int, limit: float = 20.0) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            await w.wait_closed()
            return
        except OSError:
            await asyncio.sleep(0.1)
    raise RuntimeError(f"port {port} did not open")


def start_processes(args: argparse.Namespace, tmp: str) -> tuple[dict[str, int], list[Proc]]:
    """Start upstream, specwatch and (unless disabled) nginx; returns their ports and handles."""
    ports = {k: free_port() for k in ("upstream", "proxy", "mirror", "nginx")}
    upstream = f"http://127.0.0.1:{ports['upstream']}"
    me = str(Path(__file__).resolve())
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    procs: list[Proc] = [
        Proc(
            subprocess.Popen(
                [sys.executable, me, "_upstream", str(ports["upstream"]), str(args.chunks)],
                env=env,
            ),
            signal.SIGTERM,
        ),
        Proc(
            subprocess.Popen(
                [
                    sys.executable,
                    me,
                    "_specwatch",
                    str(ports["proxy"]),
                    str(ports["mirror"]),
                    upstream,
                    "same-loop" if args.proxy_same_loop else args.proxy_mode,
                    str(args.busy_ms),
                    str(args.busy_every_ms),
                    str(args.max_shadow_rps),
                ],
                env=env,
            ),
            signal.SIGTERM,
        ),
    ]
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not args.no_nginx and Path(nginx).exists():
        conf = Path(tmp) / "nginx.conf"
        conf.write_text(NGINX_CONF.format(d=tmp, up=ports["upstream"], port=ports["nginx"]))
        procs.append(Proc(subprocess.Popen([nginx, "-c", str(conf), "-p", tmp]), signal.SIGQUIT))
    else:
        del ports["nginx"]
    return ports, procs


@dataclass
class Proc:
    popen: subprocess.Popen[bytes]
    stop_signal: signal.Signals


def children(pid: int) -> list[int]:
    """Direct child processes of ``pid``, started from any of its threads (Linux ``/proc``: each
    thread lists the children it forked; the proxy process is started from a worker thread);
    empty where unreadable."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        with contextlib.suppress(OSError):
            out += [int(x) for x in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
    return out


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds used so far by ``pids`` (Linux ``/proc/PID/stat``)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def proxy_pids(procs: list[Proc], mode: str) -> dict[str, list[int]]:
    """Whose CPU each path costs: the proxy process (process mode; else the whole sidecar,
    shadow work included) and nginx's master and workers."""
    sidecar = procs[1].popen.pid
    if mode == "process":
        kids = children(sidecar)
        if not kids:
            raise RuntimeError(f"no proxy process found under the sidecar (pid {sidecar})")
        out = {"specwatch": kids}
    else:
        out = {"specwatch": [sidecar]}
    if len(procs) > 2:
        master = procs[2].popen.pid
        out["nginx"] = [master, *children(master)]
    return out


def pin(pids: list[int], cpu: int) -> None:
    """Put every thread of ``pids`` on CPU ``cpu`` (Linux ``sched_setaffinity`` per task)."""
    for pid in pids:
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
        for tid in tids:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, {cpu})


def pin_live_path(procs: list[Proc], pids: dict[str, list[int]], nice_shadow: bool) -> None:
    """``--pin``: the proxy under test (specwatch's proxy process, nginx's master and workers)
    on the last CPU, everything else (this load generator, the upstream, the sidecar with its
    shadow work) on CPU 0, as a pod whose proxy has a CPU of its own. The paths take turns
    (interleaved rounds), so the proxies never share their CPU with each other.
    ``nice_shadow``: the sidecar's shadow side (its main process: copies, sampling, replays,
    statistics) at nice 19 on CPU 0, standing in for the CPU of its own it has in a pod, so
    the shadow work the proxy's traffic causes does not slow this load generator and the
    upstream that share CPU 0 on a 2-CPU box."""
    live = [*pids.get("specwatch", []), *pids.get("nginx", [])]
    last = max(os.sched_getaffinity(0))
    rest = [os.getpid(), *(p.popen.pid for p in procs[:2])]
    pin([p for p in rest if p not in live], 0)
    pin(live, last)
    if nice_shadow:
        sidecar = procs[1].popen.pid
        for tid in os.listdir(f"/proc/{sidecar}/task"):
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, int(tid), 19)


def stop_processes(procs: list[Proc]) -> None:
    for p in reversed(procs):
        p.popen.send_signal(p.stop_signal)
    for p in procs:
        try:
            p.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.popen.kill()


async def measure(
    args: argparse.Namespace, ports: dict[str, int], procs: list[Proc], cpu: dict[str, float]
) -> dict[str, dict[str, list[list[Sample]]]]:
    """Interleaved rounds of every path; ``cpu[kind/path]`` gets the CPU seconds the proxy
    process (or nginx) used during that path's rounds."""
    paths = {"direct": ports["upstream"], "specwatch": ports["proxy"]}
    if "nginx" in ports:
        paths["nginx"] = ports["nginx"]
    for port in ports.values():
        await wait_port(port)
    mirror_url = f"http://127.0.0.1:{ports['mirror']}/v1/completions"
    await asyncio.sleep(0.5)  # the proxy process is up once its port answers
    pids = proxy_pids(procs, "same-loop" if args.proxy_same_loop else args.proxy_mode)
    if args.pin:
        pin_live_path(procs, pids, args.nice_shadow)
    results: dict[str, dict[str, list[list[Sample]]]] = {}
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, auto_decompress=False) as s:
        kinds = (("nonstream", PLAIN_BODY), ("stream", STREAM_BODY))
        for kind, body in (k for k in kinds if k[0] in args.kinds):
            raw = json.dumps(body).encode()
            targets = [*paths, "direct+mirror"]

            def caller(name: str, raw: bytes = raw) -> Callable[[], Coroutine[Any, Any, Sample]]:
                url = f"http://127.0.0.1:{paths[name.split('+')[0]]}/v1/completions"
                mir = mirror_url if name == "direct+mirror" else None
                return lambda: one(s, url, raw, mir)

            for name in targets:  # warm-up: open connections on every path
                await open_loop(caller(name), args.rps, 1.0)
            for _ in range(args.rounds):
                for name in targets:
                    watched = pids.get(name, [])
                    c0 = cpu_seconds(watched)
                    got = await open_loop(caller(name), args.rps, args.seconds)
                    key = f"{kind}/{name}"
                    cpu[key] = cpu.get(key, 0.0) + cpu_seconds(watched) - c0
                    results.setdefault(kind, {}).setdefault(name, []).append(got)
    return results


def summarise(
    results: dict[str, dict[str, list[list[Sample]]]], cpu: dict[str, float]
) -> dict[str, dict[str, dict[str, float]]]:
    out: dict[str, dict[str, dict[str, float]]] = {}
    for kind, by_path in results.items():
        direct_rounds = [np.array([t for _, t in r]) for r in by_path["direct"]]
        direct_ttfb = [np.array([f for f, _ in r]) for r in by_path["direct"]]
        d50, d99 = np.percentile(np.concatenate(direct_rounds), [50, 99])
        out[kind] = {}
        for name, rounds in by_path.items():
            samples = [x for r in rounds for x in r]
            total = np.array([t for _, t in samples])
            ttfb = np.array([f for f, _ in samples])
            p50, p99 = np.percentile(total, [50, 99])
            per_round = [
                np.percentile(np.array([t for _, t in r]), [50, 99]) - np.percentile(d, [50, 99])
                for r, d in zip(rounds, direct_rounds, strict=True)
            ]
            per_round_ttfb = [
                np.percentile(np.array([f for f, _ in r]), [50, 99]) - np.percentile(d, [50, 99])
                for r, d in zip(rounds, direct_ttfb, strict=True)
            ]
            out[kind][name] = {
                "n": float(len(samples)),
                "p50_ms": 1e3 * p50,
                "p99_ms": 1e3 * p99,
                "ttfb_p50_ms": 1e3 * float(np.percentile(ttfb, 50)),
                "added_p50_ms": 1e3 * (p50 - d50),
                "added_p99_ms": 1e3 * (p99 - d99),
                "round_median_added_p50_ms": 1e3 * float(np.median([r[0] for r in per_round])),
                "round_median_added_p99_ms": 1e3 * float(np.median([r[1] for r in per_round])),
                "round_median_added_ttfb_p50_ms": 1e3
                * float(np.median([r[0] for r in per_round_ttfb])),
                "round_median_added_ttfb_p99_ms": 1e3
                * float(np.median([r[1] for r in per_round_ttfb])),
                "cpu_us_per_request": 1e6 * cpu.get(f"{kind}/{name}", 0.0) / len(samples),
                "max_ms": 1e3 * float(total.max()),
                "over_50ms": float((total > 0.05).sum()),
            }
    return out


def nginx_bin() -> str:
    return shutil.which("nginx") or "/usr/sbin/nginx"


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_upstream":
        run_upstream(int(sys.argv[2]), int(sys.argv[3]))
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "_specwatch":
        load = (float(sys.argv[6]), float(sys.argv[7]), float(sys.argv[8]))
        run_specwatch(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], load)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rps", type=float, default=200.0)
    ap.add_argument("--seconds", type=float, default=3.0, help="length of one round per path")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--chunks", type=int, default=16, help="SSE events per streamed response")
    ap.add_argument("--no-nginx", action="store_true")
    ap.add_argument(
        "--kinds",
        nargs="+",
        choices=("nonstream", "stream"),
        default=["nonstream", "stream"],
        help="request kinds to measure (default both)",
    )
    ap.add_argument(
        "--proxy-same-loop",
        action="store_true",
        help="run specwatch's proxy on the sidecar's event loop instead of its own thread",
    )
    ap.add_argument(
        "--proxy-mode",
        choices=("thread", "process"),
        default="process",
        help="the proxy in its own process (default, as shadow.proxy_own_process) or on its own "
        "thread",
    )
    ap.add_argument(
        "--busy-ms",
        type=float,
        default=0.0,
        help="shadow load: Python work on the sidecar's loop, this many ms ...",
    )
    ap.add_argument("--busy-every-ms", type=float, default=200.0, help="... every this many ms")
    ap.add_argument(
        "--max-shadow-rps", type=float, default=5.0, help="shadow.max_shadow_rps (replay rate cap)"
    )
    ap.add_argument(
        "--pin",
        action="store_true",
        help="the proxy under test (process mode) and nginx on the last CPU, the rest on CPU 0",
    )
    ap.add_argument(
        "--nice-shadow",
        action="store_true",
        help="with --pin: the sidecar's shadow side at nice 19 (stands in for its own CPU)",
    )
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args()
    if args.pin and (args.proxy_mode != "process" or args.proxy_same_loop):
        ap.error("--pin needs --proxy-mode process")
    tmp = tempfile.mkdtemp(prefix="swbench-")
    ports, procs = start_processes(args, tmp)
    cpu: dict[str, float] = {}
    load_before = os.getloadavg()
    try:
        res = summarise(asyncio.run(measure(args, ports, procs, cpu)), cpu)
    finally:
        stop_processes(procs)
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
        f", aiohttp {aiohttp.__version__}; rate {args.rps:g} req/s, "
        f"{args.rounds} x {args.seconds:g} s per path; proxy "
        f"{'same-loop' if args.proxy_same_loop else args.proxy_mode}, shadow load "
        f"{args.busy_ms:g} ms every {args.busy_every_ms:g} ms, max_shadow_rps "
        f"{args.max_shadow_rps:g}{'; pinned' if args.pin else ''}"
        f"{', shadow side at nice 19' if args.nice_shadow else ''}; "
        f"load average {load_before[0]:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after"
    )
    print(
        f"{'kind':<10}{'path':<15}{'n':>6}{'p50 ms':>9}{'p99 ms':>9}{'ttfb p50':>10}"
        f"{'added p50':>11}{'added p99':>11}{'rm p50':>8}{'rm p99':>8}{'rm ttfb':>8}"
        f"{'rm ttfb99':>10}{'cpu us':>8}{'max ms':>9}{'>50ms':>7}"
    )
    for kind, by_path in res.items():
        for name, r in by_path.items():
            print(
                f"{kind:<10}{name:<15}{int(r['n']):>6}{r['p50_ms']:>9.2f}{r['p99_ms']:>9.2f}"
                f"{r['ttfb_p50_ms']:>10.2f}{r['added_p50_ms']:>11.2f}{r['added_p99_ms']:>11.2f}"
                f"{r['round_median_added_p50_ms']:>8.2f}{r['round_median_added_p99_ms']:>8.2f}"
                f"{r['round_median_added_ttfb_p50_ms']:>8.2f}"
                f"{r['round_median_added_ttfb_p99_ms']:>10.2f}{r['cpu_us_per_request']:>8.0f}"
                f"{r['max_ms']:>9.1f}{int(r['over_50ms']):>7}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
