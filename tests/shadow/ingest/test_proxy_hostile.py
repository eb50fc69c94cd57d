"""The proxy against hostile clients and stalled servers, through real sockets on 127.0.0.1:
a client that leaves (mid-stream and before the first token) frees the upstream within a
second, a body sent at one byte a second times out, one peer cannot fill
the connection cap, and an upstream that stops sending is cut by the stream idle timeout."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from specwatch.core.listen import ListenerStats, ListenLimits
from specwatch.shadow.ingest.mirror import MirrorListener
from specwatch.shadow.ingest.offer import IngestCounters
from specwatch.shadow.ingest.proxy import ShadowProxy
from specwatch.shadow.settings import ShadowSettings
from tests.fakes import FakeWallClock
from tests.fixture_files import body

CASE = json.loads(body("cases/C26_disconnect_timeline.json"))


@dataclass
class SlowBackend:
    """An OpenAI-like server on a raw socket: after the request it waits ``first_at`` seconds,
    then sends ``chunks`` SSE chunks ``interval`` seconds apart; it records when its client
    (the proxy) closed the connection and how many chunks it had sent by then."""

    first_at: float
    chunks: int
    interval: float
    closed_at: list[float] = field(default_factory=list)
    sent_at_close: list[int] = field(default_factory=list)
    requests: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._serve(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the proxy gave up on a request whose client left (a slow upload)
        finally:
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        await reader.readexactly(length)
        self.requests += 1
        sent = 0
        eof = asyncio.ensure_future(reader.read(1))

        async def stream() -> None:
            nonlocal sent
            await asyncio.sleep(self.first_at)
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )
            for i in range(self.chunks):
                event = b"data: tok%d\n\n" % i
                writer.write(b"%x\r\n%b\r\n" % (len(event), event))
                sent += 1
                await asyncio.sleep(self.interval)
            writer.write(b"0\r\n\r\n")

        task = asyncio.ensure_future(stream())
        await asyncio.wait({eof, task}, return_when=asyncio.FIRST_COMPLETED)
        if eof.done():
            self.closed_at.append(time.monotonic())
            self.sent_at_close.append(sent)
            task.cancel()
        else:
            eof.cancel()


@asynccontextmanager
async def serving(backend: SlowBackend) -> AsyncIterator[str]:
    """``backend`` listening on 127.0.0.1; yields its base URL."""
    server = await asyncio.start_server(backend.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()


@asynccontextmanager
async def proxy_in(
    upstream: str, listen: ListenLimits | None = None
) -> AsyncIterator[tuple[int, ShadowProxy]]:
    """A proxy for ``upstream`` on the test's loop."""
    proxy = ShadowProxy(
        ShadowSettings(proxy_upstream=upstream),
        lambda r: "admitted",
        counters=IngestCounters(),
        wall_clock=FakeWallClock(0.0),
        listen=listen,
        listener=ListenerStats("proxy"),
    )
    port = await proxy.start("127.0.0.1", 0)
    try:
        yield port, proxy
    finally:
        await proxy.stop()


def completion_request(body: bytes = b'{"prompt": "x", "stream": true}') -> bytes:
    """A streaming completion request head and body."""
    return (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
    )


async def _until(cond: object, within: float = 10.0) -> None:
    assert callable(cond)
    end = time.monotonic() + within
    while not cond():
        assert time.monotonic() < end, "condition not reached"
        await asyncio.sleep(0.02)


async def test_client_leaving_before_the_first_token_frees_the_upstream_within_a_second() -> None:
    """The case file's second scenario: the backend's first chunk comes at 8 s, the client
    closes at 1 s; the upstream connection is closed within the case's 1 s bound (not at the
    first failed write, 8 s), no chunk was sent, and it counts as a client disconnect, not an
    upstream error."""
    s2 = CASE["scenarios"]["S2_before_first_token"]
    backend = SlowBackend(first_at=s2["backend_first_chunk_at_s"], chunks=100, interval=0.2)
    async with serving(backend) as base, proxy_in(base) as (port, proxy):
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(completion_request())
        await writer.drain()
        await _until(lambda: backend.requests == 1)
        await asyncio.sleep(s2["client_closes_at_s"])
        left = time.monotonic()
        writer.close()
        await _until(lambda: backend.closed_at, within=s2["backend_first_chunk_at_s"] + 2)
        delay = backend.closed_at[0] - left
        await _until(lambda: proxy.counters.proxy_client_disconnects == 1)
    assert delay < CASE["max_upstream_close_delay_s"]
    assert backend.sent_at_close == [0]
    assert dict(proxy.counters.proxy_upstream_errors) == {}


async def test_client_leaving_mid_stream_frees_the_upstream_within_a_second() -> None:
    """The case file's first scenario: 100 chunks 0.2 s apart, the client reads 10 and closes;
    the upstream is closed within 1 s, having sent at most 15 chunks (not 100)."""
    s1 = CASE["scenarios"]["S1_mid_stream"]
    spec = CASE["backend"]
    backend = SlowBackend(
        first_at=spec["first_chunk_at_s"], chunks=spec["chunks"], interval=spec["chunk_interval_s"]
    )
    async with serving(backend) as base, proxy_in(base) as (port, proxy):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(completion_request())
        await reader.readuntil(b"\r\n\r\n")
        seen = 0
        while seen < s1["client_reads_chunks"]:
            seen += (await reader.read(4096)).count(b"data: ")
        left = time.monotonic()
        writer.close()
        await _until(lambda: backend.closed_at, within=5)
        await _until(lambda: proxy.counters.proxy_client_disconnects == 1)
    assert backend.closed_at[0] - left < CASE["max_upstream_close_delay_s"]
    assert backend.sent_at_close[0] <= 15
    assert dict(proxy.counters.proxy_upstream_errors) == {}


async def trickle(port: int, every: float, stop_after: float) -> tuple[bytes, float]:
    """Send a completion request whose 1,000-byte body comes one byte every ``every`` seconds
    (never pausing as long as a body timeout); returns what the server answered and when,
    counted from the end of the head, or ``b""`` if it still read at ``stop_after``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n{"
    )
    start = time.monotonic()
    answer = asyncio.ensure_future(reader.read(65536))
    try:
        while time.monotonic() - start < stop_after:
            done, _ = await asyncio.wait({answer}, timeout=every)
            if done:
                return answer.result(), time.monotonic() - start
            writer.write(b" ")
        return b"", time.monotonic() - start
    finally:
        answer.cancel()
        writer.close()


TRICKLE_LIMITS = ListenLimits(body_timeout_seconds=1.0, body_deadline_seconds=2.0)


async def test_a_body_sent_a_byte_at_a_time_meets_the_whole_body_deadline() -> None:
    """A body sent one byte every 0.3 s never pauses for the 1 s body timeout; the 2 s
    whole-body deadline answers it ``408`` between 2 s and 3 s, counted as ``body_timeout``,
    and the upstream connection is closed without an answer."""
    backend = SlowBackend(first_at=0.0, chunks=1, interval=0.0)
    async with serving(backend) as base, proxy_in(base, TRICKLE_LIMITS) as (port, proxy):
        got, at = await trickle(port, every=0.3, stop_after=6.0)
    assert got.startswith(b"HTTP/1.1 408 ")
    assert 2.0 <= at < 3.0
    assert proxy.listener.refused["body_timeout"] == 1
    assert backend.requests == 0


async def test_the_mirror_applies_the_whole_body_deadline_too() -> None:
    """The mirror listener (aiohttp) answers the same trickled body ``408`` within the 2 s
    deadline (plus one poll), counted on its own listener."""

    async def accept(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"ok": True})

    mirror = MirrorListener(
        [web.post("/v1/completions", accept)], max_body_bytes=1 << 20, listen=TRICKLE_LIMITS
    )
    port = await mirror.start("127.0.0.1", 0)
    try:
        got, at = await trickle(port, every=0.3, stop_after=6.0)
    finally:
        await mirror.stop()
    assert got.startswith(b"HTTP/1.1 408 ")
    assert 2.0 <= at < 3.0
    assert mirror.listener.refused["body_timeout"] == 1


async def test_one_slow_client_cannot_fill_the_connection_cap() -> None:
    """Eight slowloris uploads from 127.0.0.2 against a cap of 8 with a share of 4: four are
    held, four get ``503`` (``client_share``); three ordinary completions from 127.0.0.1 then
    get their answers, while the slow ones still hold their slots."""
    limits = ListenLimits(max_connections=8, max_connections_per_client=4)
    backend = SlowBackend(first_at=0.0, chunks=2, interval=0.0)
    async with serving(backend) as base, proxy_in(base, limits) as (port, proxy):
        slow = []
        for _ in range(8):
            r, w = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
            w.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{")
            slow.append((r, w))
        await _until(lambda: proxy.listener.refused["client_share"] == 4)
        answers = []
        for _ in range(3):
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(completion_request())
            head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 5)
            answers.append(head.split(b"\r\n", 1)[0])
            w.close()
        held = proxy.listener.by_peer["127.0.0.2"]
        for _, w in slow:
            w.close()
    assert answers == [b"HTTP/1.1 200 OK"] * 3
    assert held == 4
    assert proxy.listener.refused["connection_limit"] == 0


async def test_a_stalled_upstream_is_cut_by_the_stream_idle_timeout() -> None:
    """The upstream sends its head and one chunk, then nothing: with a 1 s stream idle timeout
    the client connection is aborted (a truncated answer) and the upstream connection closed
    between 1 s and 2 s after the last byte, counted as ``stalled``; an upstream silent from
    the start is answered ``504``."""

    async def through(
        backend: SlowBackend, until: bytes, to_close: bool
    ) -> tuple[bytes, bytes, float, Any]:
        async with serving(backend) as base:
            proxy = ShadowProxy(
                ShadowSettings(proxy_upstream=base, proxy_stream_idle_timeout_seconds=1.0),
                lambda r: "admitted",
                counters=IngestCounters(),
                wall_clock=FakeWallClock(0.0),
            )
            port = await proxy.start("127.0.0.1", 0)
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(completion_request())
                got = await asyncio.wait_for(reader.readuntil(until), 5)
                last = time.monotonic()
                rest = await asyncio.wait_for(reader.read(), 5) if to_close else b""
                cut = time.monotonic() - last
                writer.close()
                await _until(lambda: backend.closed_at)
            finally:
                await proxy.stop()
        return got, rest, backend.closed_at[0] - last, (cut, proxy.counters)

    streaming = SlowBackend(first_at=0.0, chunks=1, interval=3600.0)
    got, rest, up_closed, (cut, counters) = await through(
        streaming, b"data: tok0\n\n\r\n", to_close=True
    )
    assert got.startswith(b"HTTP/1.1 200 OK")
    assert rest == b""
    assert 1.0 <= cut < 2.0
    assert up_closed < 2.0
    assert dict(counters.proxy_upstream_errors) == {"stalled": 1}

    silent = SlowBackend(first_at=3600.0, chunks=1, interval=0.0)
    got, _, up_closed, (_, counters) = await through(silent, b"\r\n", to_close=False)
    assert got == b"HTTP/1.1 504 Gateway Timeout\r\n"
    assert up_closed < 2.5
    assert dict(counters.proxy_upstream_errors) == {"stalled": 1}


async def test_a_12_kb_bearer_token_passes_the_mirror_and_the_proxy() -> None:
    """A real JWT can be 12 KB: the mirror listener (aiohttp, whose own field limit is 8,190
    bytes) accepts it, and the proxy passes it on; both answer 200."""
    token = "Bearer " + "a" * 12_000

    async def accept(request: web.Request) -> web.Response:
        return web.json_response({"auth": len(request.headers["Authorization"])})

    mirror = MirrorListener([web.post("/v1/completions", accept)], max_body_bytes=1 << 20)
    port = await mirror.start("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: %b\r\n"
            b"Content-Length: 2\r\n\r\n{}" % token.encode()
        )
        status = (await asyncio.wait_for(reader.readuntil(b"\r\n"), 5)).strip()
        writer.close()
    finally:
        await mirror.stop()
    backend = SlowBackend(first_at=0.0, chunks=1, interval=0.0)
    async with serving(backend) as base, proxy_in(base) as (pport, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", pport)
        writer.write(
            completion_request().replace(
                b"Host: x\r\n", b"Host: x\r\nAuthorization: %b\r\n" % token.encode()
            )
        )
        proxied = (await asyncio.wait_for(reader.readuntil(b"\r\n"), 5)).strip()
        writer.close()
    assert status == b"HTTP/1.1 200 OK"
    assert proxied == b"HTTP/1.1 200 OK"
