"""Hostile inputs against a running sidecar, with ``/healthz`` timed meanwhile: a target page of
100,000 model names and six mirrored bodies of 200,000 keys (2.3+ MB each). Shared by the test
(:mod:`tests.server.test_hostile_input`) and ``bench/bench_hostile.py``."""

from __future__ import annotations

import asyncio
import io
import json
import math
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from specwatch.settings import Settings
from tests.e2e.shadow_harness import Sidecar, sidecar, until
from tests.fakes.vllm import FakeVllm
from tests.fixture_files import body as fixture

#: Model names on the hostile target page.
MODELS = 100_000
#: Keys of one hostile mirrored body.
KEYS = 200_000


def many_models_page(models: int = MODELS) -> str:
    """A real vLLM page followed by one ``vllm:num_requests_running`` series per model name."""
    lines = [f'vllm:num_requests_running{{model_name="m{i:06d}"}} 1' for i in range(models)]
    return fixture("vllm-metrics/real-cpu-ngram.txt") + "\n".join(lines) + "\n"


def many_keys_body(keys: int = KEYS) -> bytes:
    """A completion request with ``keys`` extra top-level keys (2.3 MB at 200,000)."""
    body: dict[str, object] = {"model": "m", "prompt": "hi"}
    body.update({f"k{i:06d}": i for i in range(keys)})
    return json.dumps(body).encode()


def settings_for(target_url: str, ledger: Path) -> Settings:
    """One target (scraped every 30 s: the first scrape is the one timed) and the mirror."""
    return Settings.model_validate(
        {
            "targets": [{"name": "standard", "url": target_url}],
            "scrape": {"interval_seconds": 30.0, "timeout_seconds": 20.0},
            "shadow": {
                "enabled": True,
                "modes": ["mirror"],
                "standard": {"url": "http://127.0.0.1:9"},
                "fly": {"url": "http://127.0.0.1:9"},
                "mirror_listen_host": "127.0.0.1",
                "mirror_listen_port": 0,
            },
            "ledger": {"path": str(ledger)},
        }
    )


@dataclass(frozen=True)
class Timed:
    """``/healthz`` answer times (seconds) while the hostile input was handled, and what the
    input got (the page's scrape state, the mirror's statuses)."""

    page_latencies: tuple[float, ...]
    body_latencies: tuple[float, ...]
    target_up: float
    mirror_statuses: tuple[int, ...]


def quantile(values: tuple[float, ...], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank)."""
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))
    return ordered[rank]


#: The prober: its own process (the sidecar's event loop blocked must not block the clock
#: that times it), ``GET /healthz`` every 20 ms until its standard input closes, then the
#: answer times as a JSON list on standard output (a status other than 200 is a time of 99).
_PROBER = """
import http.client, json, sys, threading, time
host, port = sys.argv[1], int(sys.argv[2])
out, stop = [], threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
while not stop.is_set():
    t = time.perf_counter()
    conn = http.client.HTTPConnection(host, port, timeout=60)
    conn.request("GET", "/healthz")
    r = conn.getresponse()
    r.read()
    conn.close()
    out.append(time.perf_counter() - t if r.status == 200 else 99.0)
    time.sleep(0.02)
print(json.dumps(out))
"""


@asynccontextmanager
async def probing(sc: Sidecar) -> AsyncIterator[list[float]]:
    """Time ``/healthz`` from another process for the ``with`` block; the list is filled with
    the answer times (seconds) when the block ends."""
    port = sc.url.rsplit(":", 1)[1]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _PROBER,
        "127.0.0.1",
        port,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    times: list[float] = []
    try:
        await asyncio.sleep(0.3)  # the prober is up
        yield times
    finally:
        out, _ = await proc.communicate(b"")
        times.extend(json.loads(out))


async def run(tmp: Path, *, models: int = MODELS, keys: int = KEYS, bodies: int = 6) -> Timed:
    """Start a sidecar on the hostile page, time ``/healthz`` through its first scrape, then
    through ``bodies`` hostile mirrored bodies sent one after another."""
    page = many_models_page(models)
    async with (
        FakeVllm(page=lambda _: page) as target,
        sidecar(settings_for(target.url, tmp / "ledger.sqlite")) as sc,
    ):
        key = ("specwatch_target_up", frozenset({("target", "standard"), ("role", "standard")}))
        up = -1.0
        async with probing(sc) as page_times:
            end = time.monotonic() + 60
            while up != 1.0 and time.monotonic() < end:
                up = (await sc.metrics()).get(key, -1.0)
                await asyncio.sleep(0.2)
        await until(lambda: sc.component.mirror_port is not None, 20)
        raw = many_keys_body(keys)
        statuses = []
        async with probing(sc) as body_times, aiohttp.ClientSession() as client:
            for _ in range(bodies):
                async with client.post(
                    sc.mirror_url + "/v1/completions",
                    data=io.BytesIO(raw),
                    headers={"Content-Type": "application/json"},
                ) as r:
                    statuses.append(r.status)
                    await r.read()
            await asyncio.sleep(0.2)
    return Timed(tuple(page_times), tuple(body_times), up, tuple(statuses))
