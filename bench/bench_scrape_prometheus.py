"""CPU per scrape of ``specwatch run`` against real Prometheus scraping the same pages.

One aiohttp server on 127.0.0.1 serves two targets (``standard`` and ``fly``) of one page shape;
the real CLI (``python -m specwatch run --config ...``) and ``/usr/bin/prometheus`` (its own
config: one job per target, same interval and timeout) scrape them at the same time, so load on
the shared machine hits both alike. Shapes, each built from the real vLLM CPU capture
(``tests/fixtures/vllm-metrics/real-cpu-draft-model.txt``, every vLLM family per engine, the
capture's other series once):

- ``dense``: 29 data-parallel engines of one model (about 1 MB), as a big vLLM-DP server;
- ``engines``: 64 engines (the default ``max_engines_per_target``; about 2.2 MB);
- ``models``: 8 models of 4 engines each (about 1.1 MB);
- ``padded``: 8 engines plus API-server ``http_*`` series of 320 handlers (about 1 MB, most of
  it series specwatch does not read).

Every tick of the interval the server moves to a new page whose counters grew (pre-rendered
before the phase, so serving costs no parse or render), the same page for both scrapers; it
gzips when asked (as prometheus_client's exposition does). A phase per shape: both processes
start, warm up for ``--warmup`` seconds, then the CPU of each process tree (utime + stime of
``/proc/<pid>/stat`` and of its live descendants) is read at the start and end of a
``--window`` second window, and the server counts the requests each made in it (by User-Agent).
CPU per scrape = CPU in the window / scrapes in the window. Prometheus's CPU includes its own
TSDB ingestion (head appends, WAL writes) and its idle work; specwatch's includes its idle work
(HTTP server, statistics ticks): the whole process either way. Scheduled scrapes in the window =
targets x window / interval; a missed tick is a gap between two requests of a target over 1.5
intervals (counted, with the largest gap, per process). ``--burn N`` runs N busy-looping
processes meanwhile (a loaded machine). Phases run shapes in turn, ``--rounds`` times.

Run from the repository root: ``python bench/bench_scrape_prometheus.py [--rounds 2]
[--shapes dense,engines,models,padded] [--window 60] [--burn 0] [--specwatch-root DIR]``
(``--specwatch-root``: the specwatch of another checkout, for a before / after on the same
pages).
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import itertools
import json
import multiprocessing
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "tests/fixtures/vllm-metrics/real-cpu-draft-model.txt"
PROMETHEUS = "/usr/bin/prometheus"
TICKS = os.sysconf("SC_CLK_TCK")
TARGETS = ("standard", "fly")
#: Sample name endings whose values grow between scrapes (counters, histogram parts).
_GROWING = ("_total", "_count", "_sum", "_bucket")


@dataclass(frozen=True)
class Template:
    """A page as fixed text parts and the values between them: ``parts[i]`` precedes
    ``values[i]``; ``grows[i]``: how much ``values[i]`` grows per tick (0: fixed)."""

    parts: list[str]
    values: list[float]
    grows: list[float]
    tail: str

    def render(self, tick: int) -> str:
        """The page at ``tick``: each growing value grown by ``grow * steps(tick)``, where the
        steps per tick vary (1 to 1.75), so no two windows of a busy server read alike."""
        steps = tick + (tick * tick % 7) / 8
        out: list[str] = []
        for part, value, grow in zip(self.parts, self.values, self.grows, strict=True):
            out.append(part)
            out.append(repr(value + grow * steps))
        out.append(self.tail)
        return "".join(out)


def _blocks() -> list[tuple[list[str], list[str]]]:
    """The real capture as its family blocks, in page order: (comment lines, sample lines)."""
    blocks: list[tuple[list[str], list[str]]] = []
    for line in REAL.read_text().splitlines():
        if line.startswith(("# source", "# captured")) or not line:
            continue
        if line.startswith("#"):
            if not blocks or blocks[-1][1]:
                blocks.append(([], []))
            blocks[-1][0].append(line)
        else:
            if not blocks:
                blocks.append(([], []))
            blocks[-1][1].append(line)
    return blocks


def build_template(engines: int, models: int = 1, handlers: int = 0) -> Template:
    """A page in the real capture's family blocks and order: every vLLM family's samples per
    (model, engine), the capture's other families once, and after them ``handlers`` API-server
    handlers of two more ``http_*`` families (histogram and counter, in blocks of their own)."""
    lines: list[tuple[str, float, float]] = []  # (text before the value, value, growth)
    text: list[str] = []

    def comment(line: str) -> None:
        text.append(line)

    def sample(head: str, value: float, grow: float) -> None:
        lead = "\n" if lines else ""
        lines.append((lead + "".join(t + "\n" for t in text) + head + " ", value, grow))
        text.clear()

    def grows(head: str) -> bool:
        name = head.split("{")[0]
        return not name.endswith("_created") and name.endswith(_GROWING)

    blocks = _blocks()
    other = [b for b in blocks if not any(" vllm:" in c for c in b[0])]
    vllm = [b for b in blocks if any(" vllm:" in c for c in b[0])]
    for comments, samples in other:
        for c in comments:
            comment(c)
        for row in samples:
            head, value = row.rsplit(" ", 1)
            sample(head, float(value), 1.0 if grows(head) else 0.0)
    if handlers:
        comment("# HELP http_route_request_duration_seconds Latency of each route.")
        comment("# TYPE http_route_request_duration_seconds histogram")
        for h in range(handlers):
            for le in ("0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1.0", "2.5", "5.0", "+Inf"):
                for method in ("GET", "POST"):
                    head = (
                        f'http_route_request_duration_seconds_bucket{{handler="/v1/route{h}",'
                        f'le="{le}",method="{method}"}}'
                    )
                    sample(head, h * 10.0, 1.0)
        comment("# HELP http_route_requests_total Requests of each route.")
        comment("# TYPE http_route_requests_total counter")
        for h in range(handlers):
            for code in ("2xx", "4xx", "5xx"):
                head = (
                    f'http_route_requests_total{{handler="/v1/route{h}",method="POST",'
                    f'status="{code}"}}'
                )
                sample(head, 5.0, 1.0)
    for comments, samples in vllm:
        for c in comments:
            comment(c)
        for model in range(models):
            for engine in range(engines):
                for row in samples:
                    head, value = row.rsplit(" ", 1)
                    head = head.replace('engine="0"', f'engine="{engine}"')
                    if models > 1:
                        head = head.replace('model_name="tiny"', f'model_name="model-{model}"')
                    sample(head, float(value), float(engine + 1) if grows(head) else 0.0)
    tail = "\n" + "".join(t + "\n" for t in text)
    return Template(
        parts=[p for p, _, _ in lines],
        values=[v for _, v, _ in lines],
        grows=[g for _, _, g in lines],
        tail=tail,
    )


SHAPES: dict[str, Callable[[], Template]] = {
    "dense": lambda: build_template(engines=29),
    "engines": lambda: build_template(engines=64),
    "models": lambda: build_template(engines=4, models=8),
    "padded": lambda: build_template(engines=8, handlers=320),
}


@dataclass
class Pages:
    """The pre-rendered pages of one phase (plain and gzipped per tick) and the requests."""

    plain: list[bytes] = field(default_factory=list)
    packed: list[bytes] = field(default_factory=list)
    start: float = 0.0
    interval: float = 5.0
    hits: list[tuple[str, str, float]] = field(default_factory=list)  # (who, target, time)

    def tick(self, now: float) -> int:
        """The page index at ``now``."""
        return min(max(int((now - self.start) / self.interval), 0), len(self.plain) - 1)


async def serve(pages: Pages, port: int) -> web.AppRunner:
    """Start the page server on 127.0.0.1:``port``."""

    async def page(request: web.Request) -> web.Response:
        now = time.monotonic()
        who = (
            "prometheus"
            if request.headers.get("User-Agent", "").startswith("Prometheus")
            else "specwatch"
        )
        pages.hits.append((who, request.match_info["target"], now))
        i = pages.tick(now)
        headers = {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            headers["Content-Encoding"] = "gzip"
            return web.Response(body=pages.packed[i], headers=headers)
        return web.Response(body=pages.plain[i], headers=headers)

    app = web.Application()
    app.router.add_get("/{target}/metrics", page)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and its live descendants, plus reaped children."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat[stat.rfind(")") + 2 :].split()[1])
    tree = {pid}
    grew = True
    while grew:
        grew = False
        for child, parent in parents.items():
            if parent in tree and child not in tree:
                tree.add(child)
                grew = True
    total = 0
    for p in tree:
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return total / TICKS


def burn() -> None:
    """Busy-loop forever (a loaded machine)."""
    x = 0
    while True:
        x += 1


def write_configs(workdir: Path, shape: str, args: argparse.Namespace) -> tuple[Path, Path]:
    """specwatch's and Prometheus's config files for one phase."""
    base = f"http://127.0.0.1:{args.page_port}"
    sw = workdir / "specwatch.yaml"
    sw.write_text(
        json.dumps(
            {
                "server": {"host": "127.0.0.1", "port": args.specwatch_port},
                "scrape": {"interval_seconds": args.interval, "timeout_seconds": args.timeout},
                "targets": [{"name": t, "url": f"{base}/{t}/metrics"} for t in TARGETS],
                "log": {"level": "WARNING"},
            }
        )
    )
    jobs = [
        {
            "job_name": t,
            "metrics_path": f"/{t}/metrics",
            "static_configs": [{"targets": [f"127.0.0.1:{args.page_port}"]}],
        }
        for t in TARGETS
    ]
    prom = workdir / "prometheus.yml"
    prom.write_text(
        json.dumps(
            {
                "global": {
                    "scrape_interval": f"{args.interval:g}s",
                    "scrape_timeout": f"{args.timeout:g}s",
                },
                "scrape_configs": jobs,
            }
        )
    )
    return sw, prom


def gaps(times: list[float], interval: float) -> tuple[int, float]:
    """Missed ticks (each gap over 1.5 intervals counts as round(gap / interval) - 1) and the
    largest gap between consecutive requests."""
    missed = 0
    largest = 0.0
    for a, b in itertools.pairwise(times):
        largest = max(largest, b - a)
        if b - a > 1.5 * interval:
            missed += round((b - a) / interval) - 1
    return missed, largest


async def phase(shape: str, template: Template, args: argparse.Namespace) -> dict[str, Any]:
    """One phase: both processes scrape ``shape``; returns the figures of each."""
    ticks = int((args.warmup + args.window + 30) / args.interval) + 2
    pages = Pages(interval=args.interval)
    for i in range(ticks):
        body = template.render(i).encode()
        pages.plain.append(body)
        pages.packed.append(gzip.compress(body, compresslevel=6))
    runner = await serve(pages, args.page_port)
    workdir = Path(tempfile.mkdtemp(prefix="bench-scrape-prom-"))
    sw_cfg, prom_cfg = write_configs(workdir, shape, args)
    env = {**os.environ, "PYTHONPATH": str(args.specwatch_root)}
    pages.start = time.monotonic()
    procs = {
        "specwatch": subprocess.Popen(  # noqa: ASYNC220
            [sys.executable, "-m", "specwatch", "run", "--config", str(sw_cfg)],
            cwd=args.specwatch_root,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(workdir / "specwatch.log", "w"),  # noqa: SIM115, ASYNC230
        ),
        "prometheus": subprocess.Popen(  # noqa: ASYNC220
            [
                PROMETHEUS,
                f"--config.file={prom_cfg}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{args.prometheus_port}",
                "--log.level=warn",
            ],
            cwd=workdir,
            stdout=subprocess.DEVNULL,
            stderr=open(workdir / "prometheus.log", "w"),  # noqa: SIM115, ASYNC230
        ),
    }
    try:
        await asyncio.sleep(args.warmup)
        for name, p in procs.items():
            if p.poll() is not None:
                log = (workdir / f"{name}.log").read_text()[-2000:]
                raise RuntimeError(f"{name} exited early: {log}")
        t0 = time.monotonic()
        cpu0 = {name: tree_cpu(p.pid) for name, p in procs.items()}
        load0 = os.getloadavg()[0]
        await asyncio.sleep(args.window)
        cpu1 = {name: tree_cpu(p.pid) for name, p in procs.items()}
        t1 = time.monotonic()
        load1 = os.getloadavg()[0]
    finally:
        for p in procs.values():
            p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        await runner.cleanup()
        shutil.rmtree(workdir, ignore_errors=True)
    result: dict[str, Any] = {
        "shape": shape,
        "bytes": len(pages.plain[0]),
        "window": t1 - t0,
        "load": (load0, load1),
    }
    scheduled = len(TARGETS) * (t1 - t0) / args.interval
    for name in procs:
        made = [h for h in pages.hits if h[0] == name and t0 <= h[2] < t1]
        missed = 0
        largest = 0.0
        for target in TARGETS:
            times = [
                h[2]
                for h in pages.hits
                if h[0] == name
                and h[1] == target
                and h[2] >= t0 - args.interval
                and h[2] < t1 + args.interval
            ]
            m, g = gaps(times, args.interval)
            missed += m
            largest = max(largest, g)
        cpu = cpu1[name] - cpu0[name]
        result[name] = {
            "cpu": cpu,
            "scrapes": len(made),
            "scheduled": scheduled,
            "missed": missed,
            "largest_gap": largest,
            "per_scrape_ms": cpu / len(made) * 1e3 if made else float("nan"),
            "core_share": cpu / (t1 - t0) * 100,
        }
    return result


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every phase, shapes in turn, ``args.rounds`` times."""
    shapes = args.shapes.split(",")
    templates = {s: SHAPES[s]() for s in shapes}
    results = []
    for r in range(args.rounds):
        for s in shapes:
            got = await phase(s, templates[s], args)
            sw = got["specwatch"]
            pr = got["prometheus"]
            print(
                f"round {r + 1} {s:>8} {got['bytes'] / 1e6:5.2f} MB  load {got['load'][0]:.1f}-"
                f"{got['load'][1]:.1f}  specwatch {sw['per_scrape_ms']:6.2f} ms/scrape "
                f"({sw['scrapes']}/{sw['scheduled']:.0f} scrapes, missed {sw['missed']}, "
                f"gap {sw['largest_gap']:.2f} s, {sw['core_share']:.2f} % core)  prometheus "
                f"{pr['per_scrape_ms']:6.2f} ms/scrape ({pr['scrapes']}/{pr['scheduled']:.0f}, "
                f"missed {pr['missed']}, gap {pr['largest_gap']:.2f} s, "
                f"{pr['core_share']:.2f} % core)  ratio "
                f"{sw['per_scrape_ms'] / pr['per_scrape_ms']:.2f}x",
                flush=True,
            )
            results.append(got)
    return results


def main() -> None:
    """Run the phases and print one line per phase and the median ratio per shape."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--shapes", default="dense,engines,models,padded")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--timeout", type=float, default=4.0)
    ap.add_argument("--warmup", type=float, default=12.0, help="seconds before the window")
    ap.add_argument("--window", type=float, default=60.0, help="seconds measured")
    ap.add_argument("--burn", type=int, default=0, help="busy-looping processes meanwhile")
    ap.add_argument("--page-port", type=int, default=19480)
    ap.add_argument("--specwatch-port", type=int, default=19477)
    ap.add_argument("--prometheus-port", type=int, default=19490)
    ap.add_argument("--json", type=Path, help="write every phase's figures here")
    ap.add_argument(
        "--specwatch-root",
        type=Path,
        default=ROOT,
        help="run the specwatch of this checkout (e.g. a worktree of an older commit)",
    )
    args = ap.parse_args()
    print(f"load average at start: {os.getloadavg()}", flush=True)
    burners = [multiprocessing.Process(target=burn, daemon=True) for _ in range(args.burn)]
    for b in burners:
        b.start()
    try:
        results = asyncio.run(main_async(args))
    finally:
        for b in burners:
            b.terminate()
    for s in args.shapes.split(","):
        ratios = [
            r["specwatch"]["per_scrape_ms"] / r["prometheus"]["per_scrape_ms"]
            for r in results
            if r["shape"] == s
        ]
        print(
            f"{s:>8}: specwatch / prometheus CPU per scrape, median "
            f"{statistics.median(ratios):.2f}x "
            f"(rounds: {', '.join(f'{x:.2f}' for x in ratios)})"
        )
    print(f"load average at end: {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
