"""The proxy against bad input, through real sockets on 127.0.0.1: every request on a copied
path is counted once in the ingest counters (an upload over the copy cap too, when the
upstream answers or fails before its body is read), a bad chunk size, a head over the cap and
ambiguous framing (request smuggling) are answered ``400`` before anything goes up, and the
log lines name the client's address and the path."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from specwatch.core.listen import ListenerStats
from specwatch.core.logs import event_fields
from specwatch.shadow.ingest.offer import IngestCounters
from specwatch.shadow.ingest.proxy import ShadowProxy
from specwatch.shadow.settings import ShadowSettings
from tests.fakes import FakeWallClock

#: The copy cap (8 MiB): larger than what the proxy reads before a refused connect fails the
#: request; the body sent is 1.5 times it.
CAP = 8 << 20


async def _refusing_upstream() -> str:
    """A port nothing listens on (bound, then closed): connecting is refused."""
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    return f"http://127.0.0.1:{port}"


async def _answering_upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers ``200`` to each request after reading its whole body."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


@asynccontextmanager
async def proxy_for(upstream: str) -> AsyncIterator[tuple[int, ShadowProxy]]:
    """A proxy for ``upstream`` on the test's loop with an 8 MiB cap."""
    proxy = ShadowProxy(
        ShadowSettings(proxy_upstream=upstream, proxy_max_body_bytes=CAP),
        lambda r: "admitted",
        counters=IngestCounters(),
        wall_clock=FakeWallClock(0.0),
        listener=ListenerStats("proxy"),
    )
    port = await proxy.start("127.0.0.1", 0)
    try:
        yield port, proxy
    finally:
        await proxy.stop()


async def _send(port: int, raw: bytes) -> bytes:
    """Send ``raw`` on a new connection; returns what the proxy answered before it closed
    (a close with request bytes still unread may reset the connection after the answer)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    got = b""
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), 10):
            got += chunk
    except ConnectionResetError:
        pass
    finally:
        writer.close()
    return got


async def _until(cond: object, within: float = 10.0) -> None:
    assert callable(cond)
    end = time.monotonic() + within
    while not cond():
        assert time.monotonic() < end, "condition not reached"
        await asyncio.sleep(0.02)


def _post(body: bytes) -> bytes:
    return (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
    )


async def test_every_upload_over_the_cap_is_counted_when_the_upstream_fails_first() -> None:
    """Three 12 MiB bodies (cap 8 MiB) to an upstream that refuses connections: each gets
    ``502`` before its body is read (so the copy never grows past the cap), and each is
    counted once, from its declared length, as received and ``too_large`` (3 and 3)."""
    body = b'{"prompt": "' + b"x" * (CAP + CAP // 2) + b'"}'
    async with proxy_for(await _refusing_upstream()) as (port, proxy):
        for _ in range(3):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_post(body))
            status = await asyncio.wait_for(reader.readuntil(b"\r\n"), 10)
            writer.close()
            assert status == b"HTTP/1.1 502 Bad Gateway\r\n"
        await _until(lambda: proxy.counters.proxy_requests == 3)
        await _until(lambda: proxy.counters.received["proxy"] == 3)
    assert dict(proxy.counters.errors) == {("proxy", "too_large"): 3}


async def test_an_upload_cut_by_an_early_answer_is_counted_incomplete(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A chunked body (no declared length) to an upstream that refuses connections: the
    ``502`` comes after the first chunk and the connection is closed, so the copy never
    completes; it is counted once as ``incomplete_body``, and the log line names the client's
    address and the path."""
    caplog.set_level(logging.WARNING, logger="specwatch.shadow.ingest")
    async with proxy_for(await _refusing_upstream()) as (port, proxy):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
            b'\r\n5\r\n{"a":\r\n'
        )
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        await _until(lambda: proxy.counters.received["proxy"] == 1)
    records = caplog.records
    assert answer.startswith(b"HTTP/1.1 502 ")
    assert dict(proxy.counters.errors) == {("proxy", "incomplete_body"): 1}
    fields = [event_fields(r) for r in records if r.getMessage() == "shadow ingest rejected"]
    assert len(fields) == 1
    assert fields[0]["peer"] == "127.0.0.1"
    assert fields[0]["path"] == "/v1/completions"
    assert fields[0]["reason"] == "incomplete_body"


class _CountingUpstream:
    """:func:`_answering_upstream` that counts the connections it accepted."""

    def __init__(self) -> None:
        self.accepted = 0

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        await _answering_upstream(reader, writer)


async def test_a_bad_chunk_size_is_answered_400_and_counted() -> None:
    """A chunked upload whose chunk size is ``zz``, sent with its head in one write: answered
    ``400`` by the parser (not a closed connection), counted as ``bad_request`` on the
    listener; nothing reaches the upstream and no copy is made."""
    up = _CountingUpstream()
    server = await asyncio.start_server(up, "127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        async with proxy_for(base) as (port, proxy):
            answer = await _send(
                port,
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                b"\r\nzz\r\n{}\r\n0\r\n\r\n",
            )
    finally:
        server.close()
    assert answer.startswith(b"HTTP/1.0 400 Bad Request\r\n")
    assert proxy.listener.refused["bad_request"] == 1
    assert up.accepted == 0
    assert dict(proxy.counters.received) == {}


async def test_a_head_over_32_kib_is_answered_400() -> None:
    """A request with a 70,000-byte field (field cap 32 KiB = 32,768 bytes): answered ``400``
    and counted as ``bad_request`` on the listener; nothing reaches the upstream."""
    up = _CountingUpstream()
    server = await asyncio.start_server(up, "127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        async with proxy_for(base) as (port, proxy):
            answer = await _send(
                port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000 + b"\r\n"
            )
    finally:
        server.close()
    assert answer.startswith(b"HTTP/1.0 400 Bad Request\r\n")
    assert proxy.listener.refused["bad_request"] == 1
    assert up.accepted == 0


_HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"


@pytest.mark.parametrize(
    "raw",
    [
        # CL.TE: a front end reading Content-Length and a back end reading chunks disagree
        _HEAD
        + b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET / HTTP/1.1\r\n",
        # two different lengths
        _HEAD
        + b"Content-Length: 2\r\nContent-Length: 30\r\n\r\n{}GET /x HTTP/1.1\r\nHost: x\r\n\r\n",
        # the same length twice
        _HEAD + b"Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}",
        # chunked twice
        _HEAD + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        # whitespace before the colon (read as another field by some parsers)
        _HEAD + b"Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n",
        # a coding besides chunked: re-framed as plain chunked it would reach the upstream as
        # the body itself
        _HEAD + b"Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
    ],
    ids=["cl_te", "two_lengths", "same_length_twice", "chunked_twice", "space_colon", "gzip"],
)
async def test_ambiguous_framing_is_refused_before_anything_goes_up(raw: bytes) -> None:
    """Request-smuggling shapes over a raw socket: each is answered ``400``, its connection
    closed, counted as ``bad_request``; the upstream never sees a connection."""
    up = _CountingUpstream()
    server = await asyncio.start_server(up, "127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        async with proxy_for(base) as (port, proxy):
            answer = await _send(port, raw)
            await _until(lambda: proxy.listener.refused["bad_request"] == 1)
    finally:
        server.close()
    assert answer.split(b"\r\n", 1)[0] in (b"HTTP/1.0 400 Bad Request", b"HTTP/1.1 400 Bad Request")
    assert answer.count(b"HTTP/1.") == 1  # one answer: nothing smuggled behind it
    assert up.accepted == 0
