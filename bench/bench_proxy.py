"""The live path: latency added by ``specwatch run``'s proxy and by nginx against a direct
connection, and CPU per request, at several request rates in one interleaved run.

What runs, all on fixed loopback ports (``--base-port``, default 18470, and the next four):

- two ``specwatch simulate`` servers, ``standard`` (the live upstream and the standard arm) and
  ``fly`` (the FLy arm);
- the real sidecar, ``python -m specwatch run --config FILE``: a settings file with both
  simulators as scrape targets (``--scrape-interval``, 5 s), the shadow side in ``proxy`` mode in
  front of the standard simulator, sampling ``--probability`` (0.05) with the replay cap
  ``--cap`` (``shadow.max_shadow_rps``, 5/s, the default), the load-aware pause off so the cap
  is what limits the replays, and a SQLite ledger in a temporary directory;
- nginx (Debian ``/usr/sbin/nginx``, one worker, an upstream block with ``keepalive``,
  ``proxy_http_version 1.1``, ``proxy_buffering off`` and ``proxy_request_buffering off``, no
  access log) in front of the same simulator;
- this open-loop client (aiohttp): each of ``--rps`` requests a second (50 and 200) whatever
  the answers do, each body distinct (its prompt numbers it), so sampling by a stable hash of
  the request picks ``probability`` of them and the shadow side runs at its cap at every rate
  (50 x 0.2 = 10 sampled a second against a cap of 5).

Each window sends one kind (``json``: a completion answered with one JSON body; ``sse``: the
same with ``"stream": true``) at one rate through one path (``specwatch``, ``nginx``, and
``direct`` unless ``--no-direct``) for ``--seconds``; windows are interleaved in rounds, the
path order rotating each round, so drift on a shared machine hits every path alike. Over each
window it reads the CPU (user + system, ``/proc/PID/stat``) of the whole sidecar process tree
(``specwatch run`` and any descendant) and of nginx's master and workers. Latency is clocked
from the client's first byte sent (aiohttp's ``on_request_headers_sent``) to the first and to the
last byte of the answer; how late each send left against the open-loop schedule is reported
apart (``lag``: the client's own stalls, which a closed-loop or late clock hides).

Printed: per rate, kind and path, latency percentiles (first byte and whole answer) and what
each proxy adds to them against ``direct`` in the same rounds, CPU per request of each path
and the ratio specwatch / nginx, the replays a second the
shadow side made during specwatch's windows (and its drops by reason: ``rate_limit`` is the cap
at work), and the load average before and after.

Run from the repository root (about 4 minutes with the defaults)::

    PYTHONPATH=. python bench/bench_proxy.py
    PYTHONPATH=. python bench/bench_proxy.py --rps 200 --rounds 6 --seconds 5 --json
    PYTHONPATH=. python bench/bench_proxy.py --profile-main /tmp/main.pstats  # cProfile the
    # sidecar's process (the proxy and the shadow side share it)
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
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
MODEL = "sim-model"
PATHS = ("specwatch", "before", "nginx", "direct")
#: The paths whose proxy is a sidecar process tree (``before``: the sidecar of ``--before DIR``).
SIDECARS = ("specwatch", "before")
KINDS = ("json", "sse")
#: ``--profile-main``: ``specwatch ARGS`` under cProfile timed by the process's CPU clock (not
#: the wall clock, which would charge a busy machine's preemptions to whatever ran), dumped on exit.
PROFILE_MAIN = """
import cProfile, runpy, sys, time
out, sys.argv = sys.argv[1], ["specwatch", *sys.argv[2:]]
prof = cProfile.Profile(time.process_time)
prof.enable()
try:
    runpy.run_module("specwatch", run_name="__main__")
except SystemExit:
    pass
finally:
    prof.disable()
    prof.dump_stats(out)
"""
#: Seconds to wait before reading the shadow counters (published every ``refresh_seconds``, 2 s).
SETTLE_SECONDS = 3.0


@dataclass(frozen=True)
class Ports:
    """The fixed loopback ports of one run: ``base`` and the next four (six with ``--before``:
    the older sidecar's metrics and proxy ports)."""

    base: int
    canned: bool = False

    @property
    def standard(self) -> int:
        return self.base

    @property
    def live(self) -> int:
        """The live upstream: the standard simulator, or the canned server (``--live canned``)."""
        return self.base + 7 if self.canned else self.base

    @property
    def fly(self) -> int:
        return self.base + 1

    @property
    def metrics(self) -> int:
        return self.base + 2

    @property
    def proxy(self) -> int:
        return self.base + 3

    @property
    def nginx(self) -> int:
        return self.base + 4

    def sidecar(self, path: str) -> tuple[int, int]:
        """(metrics port, proxy port) of the sidecar of ``path`` (``specwatch`` or ``before``)."""
        return (self.metrics, self.proxy) if path == "specwatch" else (self.base + 5, self.base + 6)

    def path_port(self, path: str) -> int:
        """The port the client sends ``path``'s requests to."""
        if path in SIDECARS:
            return self.sidecar(path)[1]
        return {"nginx": self.nginx, "direct": self.live}[path]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The bench's command line (``argv``: ``None`` reads ``sys.argv``)."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument(
        "--rps", type=float, nargs="+", default=[50.0, 200.0], help="request rates (open loop)"
    )
    ap.add_argument("--seconds", type=float, default=3.0, help="length of one window")
    ap.add_argument("--rounds", type=int, default=4, help="rounds of every path and kind")
    ap.add_argument("--warmup", type=float, default=2.0, help="seconds per path before round 1")
    ap.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    ap.add_argument("--no-direct", action="store_true", help="skip the direct path")
    ap.add_argument("--base-port", type=int, default=18470, help="first of five fixed ports")
    ap.add_argument("--cap", type=float, default=5.0, help="shadow.max_shadow_rps")
    ap.add_argument("--probability", type=float, default=0.2, help="shadow.sample_probability")
    ap.add_argument("--max-tokens", type=int, default=16, help="max_tokens of every request")
    ap.add_argument(
        "--scrape-interval", type=float, default=5.0, help="the sidecar's scrape interval (s)"
    )
    ap.add_argument(
        "--live",
        choices=("simulate", "canned"),
        default="simulate",
        help="the live upstream: the standard simulator (default; about 2.4 ms of CPU a "
        "request), or a canned-answer aiohttp server (less load on a small machine); the arms "
        "are the simulators either way",
    )
    ap.add_argument("--nginx", default=shutil.which("nginx") or "/usr/sbin/nginx")
    ap.add_argument("--profile-main", metavar="FILE", help="cProfile the sidecar's main process")
    ap.add_argument(
        "--before",
        type=Path,
        metavar="DIR",
        help="a source tree of an older revision: its sidecar is measured as the path 'before' "
        "in the same rounds (e.g. git archive main | tar -x -C DIR)",
    )
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = ap.parse_args(argv)
    if min(args.rps) <= 0 or args.seconds <= 0 or args.rounds < 1:
        ap.error("--rps and --seconds must be positive and --rounds at least 1")
    if not 1024 <= args.base_port <= 65528:
        ap.error("--base-port must be in 1024..65528")
    if args.before is not None and not (args.before / "specwatch" / "__main__.py").is_file():
        ap.error(f"--before {args.before}: no specwatch package there")
    return args


def paths_of(args: argparse.Namespace) -> list[str]:
    """The paths measured, in their first round's order."""
    skip = {"direct"} if args.no_direct else set()
    if args.before is None:
        skip.add("before")
    return [p for p in PATHS if p not in skip]


def sidecar_config(
    args: argparse.Namespace, ports: Ports, state: Path, path: str = "specwatch"
) -> dict[str, Any]:
    """The settings file of the sidecar of ``path`` (written as YAML for ``--config``)."""
    standard = f"http://127.0.0.1:{ports.standard}"
    fly = f"http://127.0.0.1:{ports.fly}"
    metrics, proxy = ports.sidecar(path)
    return {
        "server": {"host": "127.0.0.1", "port": metrics},
        "scrape": {"interval_seconds": args.scrape_interval},
        "targets": [
            {"name": "standard", "url": standard, "role": "standard"},
            {"name": "fly", "url": fly, "role": "fly"},
        ],
        "shadow": {
            "enabled": True,
            "modes": ["proxy"],
            "proxy_listen_host": "127.0.0.1",
            "proxy_listen_port": proxy,
            "proxy_upstream": f"http://127.0.0.1:{ports.live}",
            "sample_probability": args.probability,
            "max_shadow_rps": args.cap,
            "pause_on_waiting": False,
            "pause_running_fraction": 1.0,
            "standard": {"target": "standard"},
            "fly": {"target": "fly"},
        },
        "ledger": {"path": str(state / "ledger.sqlite")},
        "log": {"level": "WARNING", "format": "json"},
    }


NGINX_CONF = """worker_processes 1;
daemon off;
pid {d}/nginx.pid;
error_log {d}/nginx-error.log warn;
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


def nginx_config(ports: Ports, state: Path) -> str:
    """nginx's configuration: one worker proxying to the standard simulator."""
    return NGINX_CONF.format(d=state, up=ports.live, port=ports.nginx)


def request_body(n: int, kind: str, max_tokens: int) -> bytes:
    """Request number ``n``: a distinct prompt, so each has its own sampling hash."""
    body: dict[str, Any] = {
        "model": MODEL,
        "prompt": f"Request {n}: what is {n % 97} + {n % 89}?",
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    if kind == "sse":
        body["stream"] = True
    return json.dumps(body).encode()


# ---------------------------------------------------------------------------------------------
# processes and their CPU


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (children of any of its threads, recursively, from
    Linux ``/proc``); processes that are gone are left out."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{p}/task"):
                with contextlib.suppress(OSError):
                    kids = Path(f"/proc/{p}/task/{tid}/children").read_text().split()
                    todo += [int(c) for c in kids]
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by one process (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu(root: int) -> dict[int, float]:
    """CPU seconds so far of ``root`` and each of its descendants, by pid."""
    return {p: cpu_seconds(p) for p in descendants(root)}


def role_of(pid: int, root: int) -> str:
    """``main`` (the sidecar or nginx's master) or ``other`` (a descendant)."""
    return "main" if pid == root else "other"


@dataclass
class Stack:
    """The processes of one run: ``sidecars`` by path (``specwatch``, ``before``)."""

    sidecars: dict[str, subprocess.Popen[bytes]]
    nginx: subprocess.Popen[bytes]
    simulators: list[subprocess.Popen[bytes]]
    live: subprocess.Popen[bytes]  # the live upstream (one of ``simulators``)
    logs: Path

    def all(self) -> list[subprocess.Popen[bytes]]:
        return [*self.sidecars.values(), self.nginx, *self.simulators]


def port_free(port: int) -> bool:
    """Nothing listens on 127.0.0.1:``port`` and it can be bound."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def start_stack(args: argparse.Namespace, ports: Ports, state: Path) -> Stack:
    """Start the two simulators, the sidecar and nginx (ports checked free first)."""
    count = 8 if ports.canned else 7 if args.before is not None else 5
    busy = [p for p in range(ports.base, ports.base + count) if not port_free(p)]
    if busy:
        raise SystemExit(f"ports in use: {busy} (pick another --base-port)")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    py = [sys.executable, "-m", "specwatch"]

    def spawn(cmd: list[str], name: str, tree: Path = REPO) -> subprocess.Popen[bytes]:
        log = (state / f"{name}.log").open("wb")
        here = {**env, "PYTHONPATH": str(tree)}
        return subprocess.Popen(cmd, env=here, stdout=log, stderr=subprocess.STDOUT, cwd=tree)

    sims = [
        spawn(
            [
                *py,
                "simulate",
                "--role",
                role,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--time-scale",
                "0",
                "--seed",
                "7",
            ],
            role,
        )
        for role, port in (("standard", ports.standard), ("fly", ports.fly))
    ]
    live = sims[0]
    if ports.canned:
        me = str(Path(__file__).resolve())
        live = spawn([sys.executable, me, "_canned", str(ports.live), str(args.max_tokens)], "live")
        sims.append(live)
    sidecars: dict[str, subprocess.Popen[bytes]] = {}
    for path, tree in (("specwatch", REPO), ("before", args.before)):
        if tree is None:
            continue
        home = state / path
        home.mkdir()
        cfg = home / "specwatch.yaml"
        cfg.write_text(yaml.safe_dump(sidecar_config(args, ports, home, path)), encoding="utf-8")
        run = [*py, "run", "--config", str(cfg)]
        if args.profile_main and path == "specwatch":
            run = [sys.executable, "-c", PROFILE_MAIN, args.profile_main, *run[3:]]
        sidecars[path] = spawn(run, path, tree.resolve())
    conf = state / "nginx.conf"
    conf.write_text(nginx_config(ports, state), encoding="utf-8")
    nginx = spawn([args.nginx, "-c", str(conf), "-p", str(state)], "nginx")
    return Stack(sidecars, nginx, sims, live, state)


def stop_stack(stack: Stack) -> None:
    """SIGINT to the sidecar (so a profile is written), SIGQUIT to nginx, SIGTERM to the
    simulators; kill whatever is left after 20 s."""
    for sidecar in stack.sidecars.values():
        sidecar.send_signal(signal.SIGINT)
    stack.nginx.send_signal(signal.SIGQUIT)
    for sim in stack.simulators:
        sim.send_signal(signal.SIGTERM)
    for p in stack.all():
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()


# ---------------------------------------------------------------------------------------------
# the client


@dataclass
class Sample:
    """One request: seconds from the first byte sent to the first and last byte received, and
    how late the send left against the schedule."""

    first: float
    last: float
    lag: float


async def one(
    session: Any, url: str, body: bytes, due: float, out: list[Sample], errors: list[str]
) -> None:
    """Send one request; its timing goes to ``out`` (or its failure to ``errors``)."""
    ctx = SimpleNamespace(sent=None)
    try:
        async with session.post(
            url,
            data=body,
            headers={"Content-Type": "application/json"},
            trace_request_ctx=ctx,
        ) as r:
            chunk = await r.content.readany()
            t_first = time.perf_counter()
            while chunk:
                chunk = await r.content.readany()
            t_last = time.perf_counter()
            status = r.status
    except Exception as exc:  # a failed request is counted, the bench goes on
        errors.append(repr(exc))
        return
    if status != 200:
        errors.append(f"HTTP {status}")
        return
    sent = ctx.sent if ctx.sent is not None else due
    out.append(Sample(t_first - sent, t_last - sent, sent - due))


def tracing() -> Any:
    """A trace config that stamps when each request's head has been written."""
    import aiohttp

    trace = aiohttp.TraceConfig()

    async def headers_sent(_s: object, ctx: SimpleNamespace, _p: object) -> None:
        if ctx.trace_request_ctx is not None:
            ctx.trace_request_ctx.sent = time.perf_counter()

    trace.on_request_headers_sent.append(headers_sent)
    return trace


async def open_loop(
    session: Any, url: str, kind: str, args: argparse.Namespace, first_n: int, rps: float
) -> tuple[list[Sample], list[str]]:
    """``rps`` requests a second for ``seconds``, each sent at its time whatever the answers."""
    n = int(rps * args.seconds)
    out: list[Sample] = []
    errors: list[str] = []
    start = time.perf_counter() + 0.02
    tasks = []
    for i in range(n):
        due = start + i / rps
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        body = request_body(first_n + i, kind, args.max_tokens)
        tasks.append(asyncio.create_task(one(session, url, body, due, out, errors)))
    await asyncio.gather(*tasks)
    return out, errors


async def until_ready(url: str, limit: float = 60.0) -> None:
    """Wait until ``url`` answers 200."""
    import aiohttp

    deadline = time.monotonic() + limit
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with s.get(url) as r:
                    if r.status == 200:
                        return
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{url} did not answer 200 within {limit:g} s")


async def shadow_counts(session: Any, port: int) -> dict[str, float]:
    """The shadow counters of the sidecar whose metrics port is ``port``, now: replays, pairs,
    offered, drops by reason."""
    url = f"http://127.0.0.1:{port}/metrics"
    async with session.get(url, headers={"Accept-Encoding": "identity"}) as r:
        text = await r.text()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("specwatch_shadow_"):
            continue
        name, _, value = line.rpartition(" ")
        base = name.split("{", 1)[0]
        key = base
        if base == "specwatch_shadow_dropped_total" and 'reason="' in name:
            key = base + ":" + name.split('reason="', 1)[1].split('"', 1)[0]
        if base in (
            "specwatch_shadow_replays_total",
            "specwatch_shadow_pairs_total",
            "specwatch_shadow_offered_total",
            "specwatch_shadow_admitted_total",
            "specwatch_shadow_dropped_total",
            "specwatch_shadow_not_sampled_total",
        ):
            out[key] = out.get(key, 0.0) + float(value)
    return out


@dataclass
class Window:
    """What one window of one path and kind measured."""

    path: str
    kind: str
    rps: float
    samples: list[Sample]
    errors: list[str]
    cpu: float  # CPU seconds of the path's proxy (a sidecar's tree; nginx master + workers)
    cpu_by_role: dict[str, float] = field(default_factory=dict)
    sidecar_cpu: float = 0.0  # the specwatch sidecar tree's CPU in this window, whatever the path
    upstream_cpu: float = 0.0  # the live upstream simulator's CPU in this window
    seconds: float = 0.0


def cpu_delta(before: dict[int, float], after: dict[int, float], root: int) -> dict[str, float]:
    """CPU used between two :func:`tree_cpu` readings, by role (processes started in between
    count from zero)."""
    out: dict[str, float] = {}
    for pid, now in after.items():
        role = role_of(pid, root)
        out[role] = out.get(role, 0.0) + now - before.get(pid, 0.0)
    return out


async def measure(
    args: argparse.Namespace, ports: Ports, stack: Stack, shadow: dict[str, dict[str, float]]
) -> list[Window]:
    """Warm every path, then the interleaved rounds; ``shadow[path]`` gets each sidecar's shadow
    counters' increase over the rounds (read :data:`SETTLE_SECONDS` after the warm-up and after
    the last window: the sidecar publishes them every couple of seconds)."""
    import aiohttp

    await until_ready(f"http://127.0.0.1:{ports.standard}/health")
    await until_ready(f"http://127.0.0.1:{ports.live}/health")
    await until_ready(f"http://127.0.0.1:{ports.fly}/health")
    for path in stack.sidecars:
        await until_ready(f"http://127.0.0.1:{ports.sidecar(path)[0]}/readyz")
    paths = paths_of(args)
    roots = {path: p.pid for path, p in stack.sidecars.items()} | {"nginx": stack.nginx.pid}
    upstream = stack.live.pid
    windows: list[Window] = []
    n = 0
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=conn, auto_decompress=False, trace_configs=[tracing()]
    ) as s:
        for path in paths:
            await until_ready(f"http://127.0.0.1:{ports.path_port(path)}/health")
        warm = argparse.Namespace(**{**vars(args), "seconds": args.warmup})
        top = max(args.rps)
        for path in paths:
            url = f"http://127.0.0.1:{ports.path_port(path)}/v1/completions"
            await open_loop(s, url, "json", warm, n, top)
            n += int(top * args.warmup)
        await asyncio.sleep(SETTLE_SECONDS)
        shadow0 = {p: await shadow_counts(s, ports.sidecar(p)[0]) for p in stack.sidecars}
        for r in range(args.rounds):
            order = paths[r % len(paths) :] + paths[: r % len(paths)]
            for rps, kind in ((rps, kind) for rps in args.rps for kind in args.kinds):
                for path in order:
                    url = f"http://127.0.0.1:{ports.path_port(path)}/v1/completions"
                    root = roots.get(path, 0)
                    cpu0, side0 = tree_cpu(root), tree_cpu(roots["specwatch"])
                    up0 = sum(tree_cpu(upstream).values())
                    t0 = time.perf_counter()
                    got, errors = await open_loop(s, url, kind, args, n, rps)
                    seconds = time.perf_counter() - t0
                    cpu1, side1 = tree_cpu(root), tree_cpu(roots["specwatch"])
                    up1 = sum(tree_cpu(upstream).values())
                    n += int(rps * args.seconds)
                    by_role = cpu_delta(cpu0, cpu1, root) if root else {}
                    sidecar = sum(cpu_delta(side0, side1, roots["specwatch"]).values())
                    cpu = sum(by_role.values())
                    windows.append(
                        Window(
                            path, kind, rps, got, errors, cpu, by_role, sidecar, up1 - up0, seconds
                        )
                    )
        await asyncio.sleep(SETTLE_SECONDS)
        for p, before in shadow0.items():
            after = await shadow_counts(s, ports.sidecar(p)[0])
            shadow[p] = {k: v - before.get(k, 0.0) for k, v in after.items()}
    return windows


# ---------------------------------------------------------------------------------------------
# summary


def quantile(xs: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``xs`` (nearest rank; NaN when empty)."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * len(s) + 0.5) - 1))]


def summarise(
    windows: Sequence[Window], args: argparse.Namespace, shadow: dict[str, dict[str, float]]
) -> dict[str, Any]:
    """Per kind and path: requests, errors, CPU µs per request (pooled over the rounds, and per
    round), latency percentiles (ms); per kind the CPU ratios ``specwatch/nginx`` (and with
    ``--before``: ``before/nginx``, ``specwatch/before``), pooled and as the median of the
    per-round ratios; each sidecar's shadow counters a second of its windows (as scheduled:
    ``--seconds`` each, the answers' tail not counted)."""
    out: dict[str, Any] = {"kinds": {}}
    for rps, kind in ((rps, kind) for rps in args.rps for kind in args.kinds):
        per: dict[str, Any] = {}
        for path in paths_of(args):
            ws = [w for w in windows if w.kind == kind and w.path == path and w.rps == rps]
            samples = [x for w in ws for x in w.samples]
            req = len(samples) + sum(len(w.errors) for w in ws)
            first = [1e3 * x.first for x in samples]
            last = [1e3 * x.last for x in samples]
            lag = [1e3 * x.lag for x in samples]
            row: dict[str, Any] = {
                "requests": req,
                "errors": sum(len(w.errors) for w in ws),
                "error_kinds": dict(Counter(e[:60] for w in ws for e in w.errors).most_common(3)),
                "cpu_us_per_request": 1e6 * sum(w.cpu for w in ws) / req
                if req and path != "direct"
                else None,
                "cpu_us_per_request_by_round": [
                    1e6 * w.cpu / max(1, len(w.samples) + len(w.errors)) for w in ws
                ],
                "first_byte_ms": {q: quantile(first, p) for q, p in (("p50", 0.5), ("p99", 0.99))},
                "last_byte_ms": {q: quantile(last, p) for q, p in (("p50", 0.5), ("p99", 0.99))},
                "max_ms": max(last, default=float("nan")),
                "send_lag_p99_ms": quantile(lag, 0.99),
                "sidecar_cpu_per_second": sum(w.sidecar_cpu for w in ws)
                / sum(w.seconds for w in ws),
                "upstream_cpu_us_per_request": 1e6 * sum(w.upstream_cpu for w in ws) / max(1, req),
            }
            if path in SIDECARS:
                roles: dict[str, float] = {}
                for w in ws:
                    for role, c in w.cpu_by_role.items():
                        roles[role] = roles.get(role, 0.0) + c
                row["cpu_us_per_request_by_process"] = {
                    role: 1e6 * c / req for role, c in sorted(roles.items())
                }
            per[path] = row
        ratios: dict[str, Any] = {}
        for top, bottom in (("specwatch", "nginx"), ("before", "nginx"), ("specwatch", "before")):
            if top not in per or bottom not in per:
                continue
            x, y = per[top]["cpu_us_per_request"], per[bottom]["cpu_us_per_request"]
            rounds = [
                a / b
                for a, b in zip(
                    per[top]["cpu_us_per_request_by_round"],
                    per[bottom]["cpu_us_per_request_by_round"],
                    strict=False,
                )
                if b > 0
            ]
            ratios[f"{top}/{bottom}"] = {
                "pooled": x / y if x and y else None,
                "round_median": quantile(rounds, 0.5) if rounds else None,
            }
        added: dict[str, Any] = {}
        if "direct" in per:
            base = per["direct"]
            for path, row in per.items():
                if path != "direct":
                    added[path] = {
                        f"{edge}_{q}": row[f"{edge}_byte_ms"][q] - base[f"{edge}_byte_ms"][q]
                        for edge in ("first", "last")
                        for q in ("p50", "p99")
                    }
        out["kinds"][f"{rps:g}/s {kind}"] = {
            "paths": per,
            "cpu_ratios": ratios,
            "added_ms": added,
        }
    out["shadow_per_second"] = {}
    for path, counts in shadow.items():
        secs = args.seconds * sum(1 for w in windows if w.path == path)  # as scheduled
        out["shadow_per_second"][path] = {
            k.removeprefix("specwatch_shadow_").removesuffix("_total"): v / secs
            for k, v in sorted(counts.items())
            if v
        }
    return out


def print_table(res: dict[str, Any]) -> None:
    """The summary as text."""
    print(res["header"])
    print(
        f"{'rate kind':<12}{'path':<10}{'req':>6}{'err':>5}{'cpu us':>8}{'first p50':>10}"
        f"{'first p99':>10}{'last p50':>9}{'last p99':>9}{'max':>8}{'lag p99':>8}"
        f"{'sidecar/s':>10}{'up us':>7}"
    )
    for kind, k in res["kinds"].items():
        for path, r in k["paths"].items():
            cpu = r["cpu_us_per_request"]
            print(
                f"{kind:<12}{path:<10}{r['requests']:>6}{r['errors']:>5}"
                f"{'-' if cpu is None else f'{cpu:.0f}':>8}"
                f"{r['first_byte_ms']['p50']:>10.2f}{r['first_byte_ms']['p99']:>10.2f}"
                f"{r['last_byte_ms']['p50']:>9.2f}{r['last_byte_ms']['p99']:>9.2f}"
                f"{r['max_ms']:>8.1f}{r['send_lag_p99_ms']:>8.2f}"
                f"{r['sidecar_cpu_per_second']:>10.3f}{r['upstream_cpu_us_per_request']:>7.0f}"
            )
        for path in SIDECARS:
            if path in k["paths"]:
                split = k["paths"][path]["cpu_us_per_request_by_process"]
                text = ", ".join(f"{p} {c:.0f}" for p, c in split.items())
                print(f"  {kind}: {path} CPU by process (us per request): {text}")
        for name, r in k["cpu_ratios"].items():
            pooled, median = r["pooled"], r["round_median"]
            print(
                f"  {kind}: CPU per request {name} = "
                f"{'-' if pooled is None else f'{pooled:.2f}'}x pooled, "
                f"{'-' if median is None else f'{median:.2f}'}x round median"
            )
    print("added against direct (ms): first byte p50 / p99, last byte p50 / p99")
    for kind, k in res["kinds"].items():
        for path, a in k["added_ms"].items():
            print(
                f"  {kind:<12}{path:<10}{a['first_p50']:+7.2f} {a['first_p99']:+7.2f}"
                f"   {a['last_p50']:+7.2f} {a['last_p99']:+7.2f}"
            )
    for kind, k in res["kinds"].items():
        for path, r in k["paths"].items():
            if r["error_kinds"]:
                print(f"  {kind} {path} errors: {r['error_kinds']}")
    for path, rates in res["shadow_per_second"].items():
        text = ", ".join(f"{n} {v:.2f}" for n, v in rates.items())
        print(f"shadow side of {path}, per second of its windows: {text}")


def run_canned(port: int, tokens: int) -> None:
    """A live upstream answering every completion with one fixed JSON body, or ``tokens`` SSE
    events and ``[DONE]`` when the request asks for a stream (``--live canned``)."""
    from aiohttp import web

    plain = json.dumps(
        {
            "id": "cmpl-bench",
            "object": "text_completion",
            "model": MODEL,
            "choices": [{"index": 0, "text": "x" * 64, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 9, "completion_tokens": tokens, "total_tokens": 9 + tokens},
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
        for _ in range(tokens):
            await resp.write(event)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="")

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/health", health)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


def main(argv: Sequence[str] | None = None) -> int:
    raw = sys.argv[1:] if argv is None else list(argv)
    if raw[:1] == ["_canned"]:
        run_canned(int(raw[1]), int(raw[2]))
        return 0
    args = parse_args(raw)
    import aiohttp

    ports = Ports(args.base_port, canned=args.live == "canned")
    state = Path(tempfile.mkdtemp(prefix="swbench-"))
    load0 = os.getloadavg()
    stack = start_stack(args, ports, state)
    try:
        shadow: dict[str, dict[str, float]] = {}
        windows = asyncio.run(measure(args, ports, stack, shadow))
    except BaseException:
        for name in ("specwatch", "before", "standard", "fly", "nginx-error"):
            with contextlib.suppress(OSError):
                tail = (state / f"{name}.log").read_text()[-2000:]
                print(f"--- {name}:\n{tail}", file=sys.stderr)
        raise
    finally:
        stop_stack(stack)
    load1 = os.getloadavg()
    shutil.rmtree(state, ignore_errors=True)
    res = summarise(windows, args, shadow)
    res["load_average"] = {"before": load0, "after": load1}
    res["header"] = (
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, aiohttp {aiohttp.__version__}; "
        f"{' and '.join(f'{r:g}' for r in args.rps)} requests/s, "
        f"{args.rounds} rounds x {args.seconds:g} s per path and kind; sampling "
        f"{args.probability:g}, cap {args.cap:g} replays/s; load average {load0[0]:.2f} before, "
        f"{load1[0]:.2f} after"
    )
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print_table(res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
