"""Hostile crowds against ``specwatch run`` as an operator runs it (shadow on, ``modes: [mirror,
proxy]`` in front of a real ``specwatch simulate``): what the logs say under a burst of aborted
uploads, and whether live requests through the proxy are answered while slow clients from
several loopback addresses hold connections."""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.fakes.wait import until_listening
from tests.server.hostile_inputs import probing, quantile
from tests.server.test_hostile_input import LOADED_MACHINE_BOUND_S
from tests.sidecar_process import Process, free_port, run_config, specwatch_process


@contextlib.asynccontextmanager
async def _sidecar(tmp_path: Path, **server: Any) -> AsyncIterator[tuple[Process, int, int]]:
    """A simulator and ``specwatch run`` proxying to it and mirroring: (specwatch, proxy port,
    mirror port). The shadow arms are a closed port (replays fail fast)."""
    sim_dir, run_dir = tmp_path / "sim", tmp_path / "run"
    sim_dir.mkdir()
    run_dir.mkdir()
    sim_port, port, proxy_port, mirror_port = free_port(), free_port(), free_port(), free_port()
    sim_cmd = ["simulate", "--host", "127.0.0.1", "--port", str(sim_port)]
    async with specwatch_process(sim_dir, sim_cmd, port=sim_port, ready_path="/health") as sim:
        cfg = run_config(
            run_dir,
            port,
            server=server,
            shadow={
                "enabled": True,
                "modes": ["mirror", "proxy"],
                "proxy_upstream": sim.url,
                "proxy_listen_host": "127.0.0.1",
                "proxy_listen_port": proxy_port,
                "mirror_listen_host": "127.0.0.1",
                "mirror_listen_port": mirror_port,
                "sample_probability": 1.0,
                "standard": {"url": "http://127.0.0.1:7"},
                "fly": {"url": "http://127.0.0.1:7"},
            },
        )
        async with specwatch_process(run_dir, ["run", "--config", str(cfg)], port=port) as run:
            await until_listening(proxy_port)
            await until_listening(mirror_port)
            yield run, proxy_port, mirror_port


async def _aborted_upload(port: int) -> None:
    """A completion request announcing 1,000 bytes, 10 sent, then the connection closed."""
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n" + b'{"prompt":'
    )
    await writer.drain()
    await asyncio.sleep(0.05)
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


async def test_a_burst_of_aborted_uploads_writes_a_few_lines_per_reason(tmp_path: Path) -> None:
    """1,000 aborted uploads to each of the mirror and the proxy (in waves of 100) write at
    most 10 WARNING/ERROR lines of each kind (event, reason and source) in the minute the
    burst takes, the mirror's ``incomplete_body`` among them; before, every aborted upload
    wrote one line (1,010 lines of one kind)."""
    async with _sidecar(tmp_path) as (run, proxy_port, mirror_port):
        before = len(run.log_text().splitlines())
        for port in (mirror_port, proxy_port):
            for _ in range(10):
                await asyncio.gather(*(_aborted_upload(port) for _ in range(100)))
        await asyncio.sleep(1.0)  # the last handlers see their clients gone
        lines = run.log_text().splitlines()[before:]
    kinds: Counter[tuple[str, str, str]] = Counter()
    for line in lines:
        doc = json.loads(line)
        if doc["level"] in ("warning", "error"):
            kinds[(doc["event"], str(doc.get("reason", "")), str(doc.get("source", "")))] += 1
    assert kinds, "\n".join(lines[-20:])
    assert kinds[("shadow ingest rejected", "incomplete_body", "mirror")] >= 1
    assert max(kinds.values()) <= 10, kinds


#: The crowd: three loopback addresses, each with 400 slow uploads and 400 idle keep-alives
#: (2,400 connections against the default cap of 1,024 and share of 512).
CROWD = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
SLOW_PER_ADDRESS = 400
#: Seconds over which the crowd's first connections arrive.
RAMP_SECONDS = 3.0
#: How long the crowd keeps coming back (each connection reopened a second after it is
#: closed), and how many live requests are sent meanwhile.
ATTACK_SECONDS = 20.0
LIVE_REQUESTS = 30


async def _crowd_member(port: int, address: str, slow: bool, start: float, end: float) -> int:
    """One attacker connection from ``address``, opened at ``start`` and reopened a second
    after each close until ``end`` (monotonic): a slow upload (a head announcing 100,000
    bytes, then one byte every 5 s) or an idle keep-alive (one answered request, then
    nothing). Returns how many times it was opened."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, start - loop.time()))
    opened = 0
    while loop.time() < end:
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, local_addr=(address, 0)
            )
        except OSError:
            await asyncio.sleep(1.0)
            continue
        opened += 1
        try:
            if slow:
                writer.write(
                    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                    b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"
                )
                while loop.time() < end and not writer.is_closing():
                    try:
                        got = await asyncio.wait_for(reader.read(1024), timeout=5.0)
                    except TimeoutError:
                        writer.write(b" ")
                        continue
                    if not got:
                        break
            else:
                writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(reader.read(), timeout=max(0.1, end - loop.time()))
        except OSError:
            pass
        finally:
            writer.close()
        await asyncio.sleep(1.0)
    return opened


async def _live(proxy_port: int, count: int) -> list[int]:
    """``count`` completions through the proxy from 127.0.0.1, one connection each, one after
    another; their statuses (a connection refused or cut: 0)."""
    body = {"model": "sim-model", "prompt": "What is 11 + 7?", "max_tokens": 4}
    statuses = []
    timeout = aiohttp.ClientTimeout(total=30)
    for _ in range(count):
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as s:
            try:
                async with s.post(f"http://127.0.0.1:{proxy_port}/v1/completions", json=body) as r:
                    await r.read()
                    statuses.append(r.status)
            except (aiohttp.ClientError, TimeoutError):
                statuses.append(0)
        await asyncio.sleep(0.3)
    return statuses


@pytest.mark.slow
async def test_a_crowd_from_three_addresses_cannot_take_the_live_path(tmp_path: Path) -> None:
    """1,200 slow uploads and 1,200 idle keep-alives from 127.0.0.2-4 (arriving over 3 s, each
    reopened a second after it is closed, for 20 s) against the proxy's default cap of 1,024:
    every one of 30 live completions through the proxy from 127.0.0.1 meanwhile is answered
    200 (before: 503
    for as long as the crowd held the cap), and the crowd's connections were closed to make
    room (``evicted``). ``/healthz`` (timed from another process) answers 200 throughout, 95 %
    of the time in under 1 s; a single answer may wait longer on a 2-core machine other work
    loads (seen: 1.3-2.0 s at a load average of 9.5, the sidecar using a third of a core, so
    waiting for a CPU; under 0.1 s at the 95th percentile), never 5 s."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (HARD_FILES, HARD_FILES))
    async with _sidecar(tmp_path) as (run, proxy_port, _):
        async with probing(run.url) as healthz:
            now = asyncio.get_running_loop().time()
            end = now + ATTACK_SECONDS
            members = [
                (address, slow)
                for _ in range(SLOW_PER_ADDRESS)
                for address in CROWD
                for slow in (True, False)
            ]
            crowd = [  # arriving over RAMP_SECONDS, 800 new connections a second
                asyncio.create_task(
                    _crowd_member(
                        proxy_port, address, slow, now + RAMP_SECONDS * i / len(members), end
                    )
                )
                for i, (address, slow) in enumerate(members)
            ]
            await asyncio.sleep(RAMP_SECONDS + 2.0)  # the crowd holds the cap
            statuses = await _live(proxy_port, LIVE_REQUESTS)
            opened = sum(await asyncio.gather(*crowd))
        async with aiohttp.ClientSession() as s, s.get(run.url + "/metrics") as r:
            metrics = await r.text()
    assert statuses == [200] * LIVE_REQUESTS, (Counter(statuses), run.log_text()[-2000:])
    assert opened >= 2400
    evicted = 'specwatch_listener_refused_total{listener="proxy",reason="evicted"}'
    assert _counter(metrics, evicted) > 0
    assert len(healthz) >= 20
    shown = " ".join(f"{t:.2f}" for t in healthz)
    assert quantile(tuple(healthz), 0.95) < 1.0, shown
    assert max(healthz) < LOADED_MACHINE_BOUND_S, shown


#: The open files the test process (2,400 crowd sockets) and the sidecar it starts may hold.
HARD_FILES = min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 16384)


def _counter(text: str, series: str) -> float:
    """The value of ``series`` (name and labels as written) in the exposition ``text``."""
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{series} not in /metrics")
