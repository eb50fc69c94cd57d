"""The proxy's forwarding over real sockets on 127.0.0.1: chunked bodies both ways, each chunk
of a streamed answer relayed as it arrives, upstream keep-alive reuse, answers without a
length, malformed answers, HEAD, pipelining, ``Expect: 100-continue`` and the listener limits.

Upstreams that must send exact bytes are raw asyncio servers; the others are aiohttp apps."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web

from specwatch.core.listen import ListenerStats, ListenLimits
from specwatch.shadow.ingest.offer import IngestCounters
from specwatch.shadow.ingest.proxy import ShadowProxy
from specwatch.shadow.settings import ShadowSettings
from specwatch.shadow.values import ShadowRequest
from tests.fakes import FakeWallClock
from tests.shadow.ingest.test_proxy import running

Raw = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def raw_upstream(handler: Raw) -> AsyncIterator[tuple[str, list[int]]]:
    """A raw TCP upstream on 127.0.0.1; yields its URL and a one-item list counting accepted
    connections."""
    accepted = [0]

    async def on_conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        accepted[0] += 1
        try:
            await handler(r, w)
        finally:
            w.close()

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", accepted
    finally:
        server.close()


@asynccontextmanager
async def proxy_to(
    upstream: str,
    offered: list[ShadowRequest] | None = None,
    listen: ListenLimits | None = None,
    total_timeout: float | None = None,
) -> AsyncIterator[tuple[int, ShadowProxy]]:
    """A proxy on the test's loop in front of ``upstream``; offered copies land in ``offered``."""
    sink = offered if offered is not None else []

    def offer(r: ShadowRequest) -> str:
        sink.append(r)
        return "admitted"

    proxy = ShadowProxy(
        ShadowSettings(proxy_upstream=upstream, proxy_total_timeout_seconds=total_timeout),
        offer,
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


async def read_head(r: asyncio.StreamReader) -> bytes:
    return await r.readuntil(b"\r\n\r\n")


def fields(head: bytes) -> dict[bytes, bytes]:
    """The fields of a message head, names lower-cased (the last value of a repeated name)."""
    lines = head.rstrip(b"\r\n").split(b"\r\n")[1:]
    return {n.strip().lower(): v.strip() for n, v in (line.split(b":", 1) for line in lines)}


async def read_chunked(r: asyncio.StreamReader) -> bytes:
    """A chunked body to its last chunk, unchunked."""
    out = b""
    while size := int((await r.readuntil(b"\r\n")).strip(), 16):
        out += await r.readexactly(size)
        assert await r.readexactly(2) == b"\r\n"
    assert await r.readexactly(2) == b"\r\n"
    return out


async def test_chunked_upload_is_relayed_and_its_copy_offered() -> None:
    """A chunked POST (three chunks of 4, 7 and 6 bytes) reaches the upstream as the same 17
    body bytes, still chunked, and the shadow copy is the whole JSON body."""
    seen: list[tuple[str | None, bytes]] = []

    async def echo(request: web.Request) -> web.Response:
        body = await request.read()
        seen.append((request.headers.get("Transfer-Encoding"), body))
        return web.json_response({"n": len(body)})

    app = web.Application()
    app.router.add_post("/v1/completions", echo)
    offered: list[ShadowRequest] = []
    async with running(app) as base, proxy_to(base, offered) as (port, _):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
            b"Content-Type: application/json\r\n\r\n"
            b'4\r\n{"pr\r\n7\r\nompt": \r\n6\r\n"abc"}\r\n0\r\n\r\n'
        )
        await w.drain()
        head = await read_head(r)
        body = await r.readexactly(9)
        w.close()
    assert head.startswith(b"HTTP/1.1 200 ")
    assert json.loads(body) == {"n": 17}
    assert seen == [("chunked", b'{"prompt": "abc"}')]
    await asyncio.sleep(0)
    assert [o.body for o in offered] == [{"prompt": "abc"}]


async def test_chunked_sse_answer_passes_event_by_event() -> None:
    """The upstream's chunked SSE answer reaches the client as the same events, each in a chunk
    of its own sent before the upstream sends the next (chunk sizes worked out by hand: 13 and
    15 bytes), with the upstream's Content-Type."""
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    chunks = [b"d\r\ndata: first\n\n\r\n", b"F\r\ndata: second!\n\n\r\n", b"0\r\n\r\n"]
    gate = asyncio.Event()

    async def upstream(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_head(r)
        w.write(head + chunks[0])
        await w.drain()
        await gate.wait()
        for c in chunks[1:]:
            w.write(c)
            await w.drain()
        await r.read()

    async with raw_upstream(upstream) as (base, _), proxy_to(base) as (port, _):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
        got_head = await read_head(r)
        first = await r.readexactly(len(chunks[0]))  # before the upstream sent the rest
        gate.set()
        rest = await r.readexactly(len(chunks[1]) + len(chunks[2]))
        w.close()
    assert got_head.startswith(b"HTTP/1.1 200 OK\r\n")
    got = fields(got_head)
    assert got[b"content-type"] == b"text/event-stream"
    assert got[b"transfer-encoding"] == b"chunked"
    assert first == b"d\r\ndata: first\n\n\r\n"
    assert rest == b"f\r\ndata: second!\n\n\r\n0\r\n\r\n"


async def test_upstream_connection_is_reused_across_requests_and_clients() -> None:
    """Five requests, from two client connections one after the other, use one upstream
    connection (the pool's keep-alive)."""
    peers: list[int] = []

    async def who(request: web.Request) -> web.Response:
        assert request.transport is not None
        peers.append(request.transport.get_extra_info("peername")[1])
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/who", who)
    async with running(app) as base, proxy_to(base) as (port, _):
        for n in (3, 2):
            async with aiohttp.ClientSession() as s:
                for _ in range(n):
                    async with s.get(f"http://127.0.0.1:{port}/who") as resp:
                        assert await resp.text() == "ok"
    assert len(peers) == 5
    assert len(set(peers)) == 1


async def test_answer_without_length_is_read_to_close_and_relayed_chunked() -> None:
    """An answer with neither Content-Length nor chunking ends when the upstream closes: the
    client gets all 11 body bytes chunked and keeps its connection, and its next request opens
    a new upstream connection."""

    async def upstream(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_head(r)
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nhello")
        await w.drain()
        await asyncio.sleep(0.05)
        w.write(b" world")
        await w.drain()

    async with raw_upstream(upstream) as (base, accepted), proxy_to(base) as (port, proxy):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(2):
            w.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            head = await read_head(r)
            assert fields(head)[b"transfer-encoding"] == b"chunked"
            assert await read_chunked(r) == b"hello world"
        w.close()
    assert accepted[0] == 2
    assert dict(proxy.counters.proxy_upstream_errors) == {}


async def test_malformed_upstream_answer_is_502_before_start() -> None:
    """An upstream answering garbage instead of a status line gives the client a 502 JSON
    error and counts ``client_error``."""

    async def upstream(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_head(r)
        w.write(b"HTTP/1.1 OK-ish\r\nwhat\r\n\r\n")
        await w.drain()

    async with (
        raw_upstream(upstream) as (base, _),
        proxy_to(base) as (port, proxy),
        aiohttp.ClientSession() as s,
        s.get(f"http://127.0.0.1:{port}/x") as resp,
    ):
        assert resp.status == 502
        assert await resp.json() == {"error": {"message": "upstream client_error"}}
    assert dict(proxy.counters.proxy_upstream_errors) == {"client_error": 1}


async def test_head_answer_has_no_body_and_the_connection_goes_on() -> None:
    """A HEAD answer carrying ``Content-Length: 5`` ends at its head; the same client connection
    then gets a GET answer of 5 bytes."""

    async def upstream(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            try:
                req = await read_head(r)
            except asyncio.IncompleteReadError:
                return
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n")
            if not req.startswith(b"HEAD"):
                w.write(b"12345")
            await w.drain()

    async with raw_upstream(upstream) as (base, _), proxy_to(base) as (port, _):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"HEAD /a HTTP/1.1\r\nHost: x\r\n\r\n")
        first = await read_head(r)
        w.write(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
        second = await read_head(r)
        body = await r.readexactly(5)
        w.close()
    for head in (first, second):
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        assert fields(head)[b"content-length"] == b"5"
    assert body == b"12345"


async def test_pipelined_requests_are_answered_in_order() -> None:
    """Two requests sent in one write are answered in the order sent, though the upstream takes
    longer over the first."""

    async def slow_then_fast(request: web.Request) -> web.Response:
        if request.path == "/slow":
            await asyncio.sleep(0.2)
        return web.Response(text=request.path)

    app = web.Application()
    app.router.add_get("/{p}", slow_then_fast)
    async with running(app) as base, proxy_to(base) as (port, _):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(
            b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\nGET /fast HTTP/1.1\r\nHost: x\r\n"
            b"Connection: close\r\n\r\n"
        )
        raw = await r.read()
        w.close()
    bodies = [part.split(b"\r\n\r\n", 1)[1][:5] for part in raw.split(b"HTTP/1.1 200 OK")[1:]]
    assert bodies == [b"/slow", b"/fast"]


async def test_expect_100_continue_is_answered_by_the_proxy() -> None:
    """``Expect: 100-continue`` gets ``100 Continue`` from the proxy; the body then sent is
    relayed and answered."""

    async def echo(request: web.Request) -> web.Response:
        assert "Expect" not in request.headers
        return web.Response(body=await request.read())

    app = web.Application()
    app.router.add_post("/echo", echo)
    async with running(app) as base, proxy_to(base) as (port, _):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n"
        )
        interim = await read_head(r)
        w.write(b"abc")
        final = await read_head(r)
        body = await r.readexactly(3)
        w.close()
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert final.startswith(b"HTTP/1.1 200 OK")
    assert body == b"abc"


async def test_listener_limits_hold_on_the_proxy_port() -> None:
    """With ``max_connections=3``, ``header_timeout_seconds=0.3`` and
    ``body_timeout_seconds=0.3``: a half-open connection is closed (``header_timeout``), a
    stalled body gets 408 (``body_timeout``); then with three requests being answered (their
    upstream holds them), a fourth connection gets 503 (``connection_limit``): no connection
    waiting on its client is there to be closed for it."""
    release = asyncio.Event()

    async def read_all(request: web.Request) -> web.Response:
        return web.Response(body=await request.read())

    async def hold(request: web.Request) -> web.Response:
        await release.wait()
        return web.Response(text="held\n")

    app = web.Application()
    app.router.add_post("/v1/completions", read_all)
    app.router.add_get("/hold", hold)
    limits = ListenLimits(max_connections=3, header_timeout_seconds=0.3, body_timeout_seconds=0.3)
    async with running(app) as base, proxy_to(base, listen=limits) as (port, proxy):
        r1, w1 = await asyncio.open_connection("127.0.0.1", port)
        w1.write(b"GET / HTTP/1.1\r\nHost")  # never finishes its head
        r2, w2 = await asyncio.open_connection("127.0.0.1", port)
        w2.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{")
        first = await r1.read()
        second = await r2.read()
        held = []
        for _ in range(3):
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
            held.append((r, w))
        await asyncio.sleep(0.1)
        r3, w3 = await asyncio.open_connection("127.0.0.1", port)
        third = await r3.read()
        release.set()
        answers = [await r.readuntil(b"held\n") for r, _ in held]
        for w in (w1, w2, w3, *(w for _, w in held)):
            w.close()
    assert first == b""
    assert third.startswith(b"HTTP/1.1 503 ")
    assert second.startswith(b"HTTP/1.1 408 ")
    assert all(a.startswith(b"HTTP/1.1 200 ") for a in answers)
    assert dict(proxy.listener.refused) == {
        "connection_limit": 1,
        "header_timeout": 1,
        "body_timeout": 1,
    }
    assert proxy.listener.open == 0


async def test_http10_client_gets_a_chunked_answer_unchunked_then_close() -> None:
    """An HTTP/1.0 client cannot read chunked framing: the upstream's chunked answer reaches it
    as the 11 plain body bytes, without ``Transfer-Encoding``, ended by the close."""

    async def upstream(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_head(r)
        w.write(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"
            b"6\r\n world\r\n0\r\n\r\n"
        )
        await w.drain()
        await r.read()

    async with raw_upstream(upstream) as (base, _), proxy_to(base) as (port, _):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"GET / HTTP/1.0\r\n\r\n")
        raw = await r.read()
        w.close()
    head, body = raw.split(b"\r\n\r\n", 1)
    assert body == b"hello world"
    assert head.startswith(b"HTTP/1.0 200 OK\r\n")
    assert b"transfer-encoding" not in head.lower()


async def test_malformed_request_is_400_and_its_credentials_never_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A request head with a broken header line is answered 400 and closed; no log record
    carries its ``Authorization`` token or a traceback."""
    app = web.Application()
    with caplog.at_level("DEBUG"):
        async with running(app) as base, proxy_to(base) as (port, _):
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"GET / HTTP/1.1\r\nAuthorization: Bearer sk-live-123\r\nBad Header\r\n\r\n")
            raw = await r.read()
            w.close()
    assert raw.startswith(b"HTTP/1.0 400 ")
    assert all("sk-live-123" not in str(x.__dict__) for x in caplog.records)
    assert not [x for x in caplog.records if x.exc_info]


async def test_stop_lets_an_answer_in_progress_finish_and_refuses_new_connections() -> None:
    """``stop`` while a gated stream is half sent: new connections are refused, the stream
    still ends cleanly once the upstream finishes it (inside the shutdown grace), then stop
    returns."""
    gate = asyncio.Event()
    first_sent = asyncio.Event()

    async def gated(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: one\n\n")
        first_sent.set()
        await gate.wait()
        await resp.write(b"data: two\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/gated", gated)
    async with running(app) as base:
        proxy = ShadowProxy(
            ShadowSettings(proxy_upstream=base),
            lambda r: "x",
            counters=IngestCounters(),
            wall_clock=FakeWallClock(0.0),
            shutdown_timeout_seconds=30.0,
        )
        port = await proxy.start("127.0.0.1", 0)
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/gated") as r:
            assert await r.content.readuntil(b"\n\n") == b"data: one\n\n"
            stopping = asyncio.create_task(proxy.stop())
            await asyncio.sleep(0.1)
            with pytest.raises(ConnectionRefusedError):
                await asyncio.open_connection("127.0.0.1", port)
            assert not stopping.done()
            gate.set()
            rest = await r.content.read()
        await asyncio.wait_for(stopping, 20)
    assert rest == b"data: two\n\n"
    assert dict(proxy.counters.proxy_upstream_errors) == {}


async def test_an_answer_past_the_total_timeout_is_504_for_each_request_on_a_connection() -> None:
    """With ``total_timeout_seconds`` 0.3, on one keep-alive connection: a quick answer passes,
    then 0.1 s later a request the upstream never answers gets ``504`` about 0.3 s after it
    began (the timer set for the first request's deadline fires first and is set again), and
    the connection is still usable after it."""

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await read_head(r)
            except asyncio.IncompleteReadError:
                return
            if b"/hang" in head.split(b"\r\n", 1)[0]:
                await asyncio.sleep(5)
                return
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    async with raw_upstream(handler) as (base, _), proxy_to(base, total_timeout=0.3) as (port, _):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        loop = asyncio.get_running_loop()
        w.write(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await read_head(r)).startswith(b"HTTP/1.1 200 OK")
        assert await r.readexactly(2) == b"ok"
        await asyncio.sleep(0.1)
        began = loop.time()
        w.write(b"GET /hang HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await asyncio.wait_for(read_head(r), 3)
        waited = loop.time() - began
        assert head.startswith(b"HTTP/1.1 504 Gateway Timeout")
        assert 0.25 <= waited < 1.0
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        assert json.loads(await r.readexactly(length)) == {"error": {"message": "upstream timeout"}}
        w.write(b"GET /c HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await read_head(r)).startswith(b"HTTP/1.1 200 OK")
        w.close()


async def test_idle_keep_alive_connection_is_closed_and_a_busy_one_is_not() -> None:
    """``keepalive_timeout_seconds`` 0.3: a connection sending a request every 0.1 s for 0.8 s
    stays open throughout; once idle it is closed between 0.3 s and 1 s later."""

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            try:
                await read_head(r)
            except asyncio.IncompleteReadError:
                return
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    limits = ListenLimits(keepalive_timeout_seconds=0.3)
    async with raw_upstream(handler) as (base, _), proxy_to(base, listen=limits) as (port, _):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        loop = asyncio.get_running_loop()
        for n in range(8):
            if n:
                await asyncio.sleep(0.1)
            w.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await read_head(r)).startswith(b"HTTP/1.1 200 OK")
            assert await r.readexactly(2) == b"ok"
        idle_from = loop.time()
        assert await asyncio.wait_for(r.read(), 3) == b""
        assert 0.2 <= loop.time() - idle_from < 1.0
        w.close()
