"""``specwatch run``'s listeners cannot be held open or flooded: a real process, raw sockets.

Limits set in the config file: request head within 1 s, body pauses of at most 1 s, 6 open
connections, JSON nested at most 64 deep.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.sidecar_process import Process, free_port, run_config, specwatch_process

SERVER = {
    "header_timeout_seconds": 1.0,
    "body_timeout_seconds": 1.0,
    "max_connections": 6,
}
SHADOW = {
    "enabled": True,
    "standard": {"url": "http://127.0.0.1:9"},
    "fly": {"url": "http://127.0.0.1:9"},
    "sample_probability": 0.0,
}


MIRROR_PORT: dict[str, int] = {}


@pytest.fixture
async def sidecar(tmp_path: Path) -> AsyncIterator[Process]:
    port, mirror = free_port(), free_port()
    MIRROR_PORT["port"] = mirror
    shadow = {**SHADOW, "mirror_listen_host": "127.0.0.1", "mirror_listen_port": mirror}
    cfg = run_config(tmp_path, port, server=SERVER, shadow=shadow)
    async with specwatch_process(tmp_path, ["run", "--config", str(cfg)], port=port) as p:
        yield p
        await p.stop(signal.SIGTERM)


def _mirror() -> str:
    return f"http://127.0.0.1:{MIRROR_PORT['port']}"


async def _metric(url: str, name: str, **labels: str) -> float | None:
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        text = await r.text()
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None


async def _refused(url: str, listener: str, reason: str) -> float | None:
    """``specwatch_listener_refused_total{listener, reason}`` on ``url``'s ``/metrics``."""
    return await _metric(url, "specwatch_listener_refused_total", listener=listener, reason=reason)


async def _closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection (at most 30 s)."""
    return await asyncio.wait_for(reader.read(), timeout=30)


async def test_half_open_connection_is_closed_and_counted(sidecar: Process) -> None:
    """A connection that sends half a request head is closed by the server after the header
    timeout (it sends nothing back); ``/metrics`` keeps answering meanwhile and counts one
    ``header_timeout`` on the ``main`` listener."""
    reader, writer = await asyncio.open_connection("127.0.0.1", sidecar.port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    await writer.drain()
    assert await _metric(sidecar.url, "specwatch_listener_open_connections", listener="main")
    assert await _closed(reader) == b""
    writer.close()
    assert await _refused(sidecar.url, "main", "header_timeout") == 1


async def test_drip_fed_body_gets_408(sidecar: Process) -> None:
    """A mirror request that announces 1,000 body bytes, sends 10 and stops: answered 408,
    connection closed, counted as ``body_timeout`` on the ``mirror`` listener."""
    reader, writer = await asyncio.open_connection("127.0.0.1", MIRROR_PORT["port"])
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n" + b'{"prompt":'
    )
    await writer.drain()
    answer = await _closed(reader)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert await _refused(sidecar.url, "mirror", "body_timeout") == 1


async def test_idle_connections_make_room_for_a_request(sidecar: Process) -> None:
    """With the cap at 6 (its live reserve 1) and 6 connections open sending nothing, a 7th
    that asks for ``/metrics`` is answered 200 at once: the two idlest were closed to make
    room (``evicted`` 2, no ``connection_limit``; before, the 7th got 503 until the header
    timeout closed the idle ones); the other four are closed by the header timeout."""
    held = [await asyncio.open_connection("127.0.0.1", sidecar.port) for _ in range(6)]
    reader, writer = await asyncio.open_connection("127.0.0.1", sidecar.port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    answer = await _closed(reader)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    for r, w in held:
        assert await _closed(r) == b""
        w.close()
    assert await _refused(sidecar.url, "main", "evicted") == 2
    assert await _refused(sidecar.url, "main", "connection_limit") == 0


async def test_deep_json_is_a_clear_400_without_traceback(sidecar: Process) -> None:
    """A 200 KB body of 100,000 nested arrays (under the 1 MiB mirror cap) is answered 400
    ``too_deep``; 64 levels are accepted (202); no traceback reaches the log."""
    deep = "[" * 100_000 + "]" * 100_000
    ok = {"prompt": json.loads("[" * 62 + "1" + "]" * 62)}  # object + 63 arrays = 64 levels
    async with aiohttp.ClientSession() as s:
        async with s.post(
            _mirror() + "/v1/completions",
            data=deep,
            headers={"Content-Type": "application/json"},
        ) as r:
            assert r.status == 400
            assert await r.json() == {"shadow": "too_deep"}
        async with s.post(_mirror() + "/v1/completions", json=ok) as r:
            assert r.status == 202
    assert "Traceback" not in sidecar.log_text()


async def test_bad_requests_log_at_most_ten_lines_a_minute(sidecar: Process) -> None:
    """50 bad mirror bodies in a burst: all 50 answered 400 and counted, at most 10
    ``shadow ingest rejected`` log lines for the reason ``invalid_json``."""
    async with aiohttp.ClientSession() as s:
        for _ in range(50):
            async with s.post(
                _mirror() + "/v1/completions",
                data=b"{not json",
                headers={"Content-Type": "application/json"},
            ) as r:
                assert r.status == 400
    lines = [ln for ln in sidecar.log_text().splitlines() if "shadow ingest rejected" in ln]
    assert len(lines) == 10
    counted = None
    for _ in range(300):  # the shadow families refresh every paired.refresh_seconds (2 s)
        counted = await _metric(
            sidecar.url,
            "specwatch_shadow_ingest_errors_total",
            source="mirror",
            reason="invalid_json",
        )
        if counted == 50:
            break
        await asyncio.sleep(0.1)
    assert counted == 50


async def test_malformed_request_heads_are_counted_not_traced(sidecar: Process) -> None:
    """30 request heads with an invalid header line on the main listener and 30 on the mirror:
    each answered 400 by the parser; counted as ``bad_request`` per listener (30 and 30), at most
    10 ``connection refused`` lines per listener (the rate limit), no traceback, and the
    ``Authorization`` value sent with them is in no log line."""
    head = (
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cr3t-head\r\nBad Line\r\n\r\n"
    )
    for port in (sidecar.port, MIRROR_PORT["port"]):
        for _ in range(30):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(head)
            await writer.drain()
            assert (await _closed(reader)).startswith(b"HTTP/1.0 400 Bad Request")
            writer.close()
    for listener in ("main", "mirror"):
        assert (
            await _metric(
                sidecar.url,
                "specwatch_listener_refused_total",
                listener=listener,
                reason="bad_request",
            )
            == 30
        )
    log = sidecar.log_text()
    assert "Traceback" not in log
    assert "s3cr3t-head" not in log
    refused = [
        json.loads(ln)
        for ln in log.splitlines()
        if '"connection refused"' in ln and '"bad_request"' in ln
    ]
    assert sorted(r["listener"] for r in refused) == ["main"] * 10 + ["mirror"] * 10
    assert {(r["status"], r["error"]) for r in refused} == {(400, "BadHttpMessage")}
