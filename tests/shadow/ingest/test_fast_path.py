"""The proxy's fast paths against its parser paths, over real sockets on 127.0.0.1.

The same request bytes go through two proxies in front of one raw upstream: one with the fast
paths on (the default) and one with ``fast`` off, where every request and answer goes through
llhttp's parsers. What the upstream receives, what the client receives, the copies offered and
the counters must be equal byte for byte, and the fast path must have been taken for the
requests and answers of the common shape (so the comparison is not between two parser runs)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import httptools
import pytest

from specwatch.shadow.ingest import forward
from specwatch.shadow.ingest.offer import IngestCounters
from specwatch.shadow.ingest.proxy import ShadowProxy
from specwatch.shadow.values import ShadowRequest

JSON = b'{"model": "m", "prompt": "hi", "max_tokens": 4}'
ANSWER = b'{"id": "cmpl-1", "choices": [{"text": "ok"}]}'


def post(*fields: bytes, body: bytes = JSON, path: bytes = b"/v1/completions") -> bytes:
    head = b"POST " + path + b" HTTP/1.1\r\n" + b"".join(f + b"\r\n" for f in fields)
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


@dataclass
class Upstream:
    """A raw upstream: records each request's bytes as received and answers with ``answer``
    (a list of pieces written with a short pause between them)."""

    answer: list[bytes]
    close_after: bool = False
    received: list[bytes] = field(default_factory=list)
    accepted: int = 0

    async def handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            while True:
                try:
                    head = await r.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                body = b""
                low = head.lower()
                if b"\ncontent-length:" in low:
                    n = int(low.split(b"\ncontent-length:")[1].split(b"\r\n")[0])
                    body = await r.readexactly(n)
                elif b"\ntransfer-encoding: chunked" in low:
                    while True:
                        size_line = await r.readuntil(b"\r\n")
                        size = int(size_line.strip(), 16)
                        chunk = await r.readexactly(size + 2)
                        body += size_line + chunk
                        if size == 0:
                            break
                self.received.append(head + body)
                for i, piece in enumerate(self.answer):
                    if i:
                        await asyncio.sleep(0.02)
                    w.write(piece)
                    await w.drain()
                if self.close_after:
                    return
        finally:
            w.close()


async def read_answer(r: asyncio.StreamReader) -> bytes:
    """One whole answer, its end found by llhttp (an independent parser) or the close."""
    done = asyncio.Event()

    class End:
        def on_message_complete(self) -> None:
            done.set()

    parser = httptools.HttpResponseParser(End())
    got = b""
    while not done.is_set():
        data = await asyncio.wait_for(r.read(65536), 5)
        if not data:
            break
        got += data
        try:
            parser.feed_data(data)
        except httptools.HttpParserError:
            if not done.is_set():
                raise
    return got


@dataclass
class Run:
    upstream_got: list[bytes]
    client_got: list[bytes]
    offered: list[tuple[str, bytes, str, str | None]]
    counters: tuple[int, int, int]
    connections: int
    fast_requests: int
    fast_answers: int


@asynccontextmanager
async def upstream_server(up: Upstream) -> AsyncIterator[str]:
    server = await asyncio.start_server(up.handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


async def through(
    requests: list[bytes],
    answer: list[bytes],
    fast: bool,
    monkeypatch: pytest.MonkeyPatch,
    close_after: bool = False,
) -> Run:
    """Send ``requests`` one after another, each on a new client connection (the proxy's
    upstream connections are pooled across clients)."""
    taken = {"request": 0, "answer": 0}
    real_request, real_answer = forward._Client.fast_request, forward._Exchange.fast_answer

    def spy_request(self: forward._Client, data: bytes) -> bool:
        ok = real_request(self, data)
        taken["request"] += ok
        return ok

    def spy_answer(self: forward._Exchange, data: bytes) -> bool:
        ok = real_answer(self, data)
        taken["answer"] += ok
        return ok

    monkeypatch.setattr(forward._Client, "fast_request", spy_request)
    monkeypatch.setattr(forward._Exchange, "fast_answer", spy_answer)
    offered: list[ShadowRequest] = []

    def offer(req: ShadowRequest) -> str:
        offered.append(req)
        return "admitted"

    up = Upstream(answer, close_after)
    counters = IngestCounters()
    async with upstream_server(up) as base:
        proxy = ShadowProxy(base, offer, counters=counters, clock=lambda: 0.0)
        port = await proxy.start("127.0.0.1", 0)
        assert proxy._forwarder is not None
        proxy._forwarder.fast = fast
        got: list[bytes] = []
        try:
            for raw in requests:
                r, w = await asyncio.open_connection("127.0.0.1", port)
                w.write(raw)
                got.append(await read_answer(r))
                w.close()
            await asyncio.sleep(0.05)  # let the copies reach the offer
        finally:
            await proxy.stop()
    here = base.removeprefix("http://").encode()
    return Run(
        [got.replace(b"Host: " + here, b"Host: UPSTREAM") for got in up.received],
        got,
        [(o.path, o.body["prompt"], o.category, o.request_id) for o in offered],
        (counters.proxy_requests, counters.skipped_marked, sum(counters.errors.values())),
        up.accepted,
        taken["request"],
        taken["answer"],
    )


PLAIN = [
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
    % (len(ANSWER), ANSWER)
]

COMMON_REQUESTS = {
    "plain": post(b"Host: proxy.local", b"User-Agent: t/1", b"Content-Type: application/json"),
    "mixed-case names, keep-alive": post(
        b"hOsT: proxy.local", b"CONNECTION: keep-alive", b"accept: */*"
    ),
    "forwarded before, category and id": post(
        b"Host: h",
        b"X-Forwarded-For: 10.0.0.1, 10.0.0.2",
        b"X-Specwatch-Category: code",
        b"X-Request-Id: req-7",
        b"x-forwarded-for: 10.0.0.3",
    ),
    "marked copy": post(b"Host: h", b"X-Specwatch-Shadow: 1"),
    "spaces and tabs inside values, obs-text": post(
        b"Host: h", b"X-Note: a b\tc  d", b"X-Latin: caf\xe9"
    ),
    "query string, other path": post(b"Host: h", path=b"/v1/chat/completions?x=1&y=%20"),
    "empty body": post(b"Host: h", body=b""),
    "get": b"GET /v1/models HTTP/1.1\r\nHost: h\r\n\r\n",
    "empty value": post(b"Host: h", b"X-Empty: "),
}

PARSER_REQUESTS = {
    "no space after the colon": post(b"Host:h"),
    "padded value": post(b"Host: h", b"X-Pad: v  "),
    "connection close": post(b"Host: h", b"Connection: close"),
    "connection naming a field": post(b"Host: h", b"Connection: X-Drop", b"X-Drop: 1"),
    "proxy credentials": post(b"Host: h", b"Proxy-Authorization: Basic c2VjcmV0"),
    "keep-alive field": post(b"Host: h", b"Keep-Alive: timeout=5"),
    "expect": post(b"Host: h", b"Expect: 100-continue"),
    "chunked upload": b"POST /v1/completions HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked"
    b"\r\n\r\n%x\r\n%b\r\n0\r\n\r\n" % (len(JSON), JSON),
    "http/1.0": b"POST /v1/completions HTTP/1.0\r\nHost: h\r\nConnection: keep-alive\r\n"
    b"Content-Length: %d\r\n\r\n%b" % (len(JSON), JSON),
    "content-length with a sign": b"POST /v1/completions HTTP/1.1\r\nHost: h\r\n"
    b"Content-Length: +%d\r\n\r\n%b" % (len(JSON), JSON),
}


@pytest.mark.parametrize("name", list(COMMON_REQUESTS))
async def test_common_requests_take_the_fast_path_with_the_parser_paths_bytes(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each request of the common shape, sent twice, takes the fast path both times, and the
    upstream, the client, the copies and the counters see exactly what the parser path gives."""
    raw = COMMON_REQUESTS[name]
    fast = await through([raw, raw], PLAIN, True, monkeypatch)
    slow = await through([raw, raw], PLAIN, False, monkeypatch)
    assert fast.fast_requests == 2
    assert slow.fast_requests == 0
    assert fast.upstream_got == slow.upstream_got
    assert fast.client_got == slow.client_got == [PLAIN[0], PLAIN[0]]
    assert fast.offered == slow.offered
    assert fast.counters == slow.counters
    assert fast.connections == slow.connections == 1


def test_a_rebuilt_head_worked_out_by_hand() -> None:
    """The hand-written expectation behind the byte comparison: the fast path's head for the
    "forwarded before" request (Host replaced, X-Forwarded-For moved last with the peer added,
    the other fields in their order)."""
    raw = COMMON_REQUESTS["forwarded before, category and id"]
    expected = (
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        b"X-Specwatch-Category: code\r\nX-Request-Id: req-7\r\nContent-Length: 47\r\n"
        b"X-Forwarded-For: 10.0.0.1, 10.0.0.2, 10.0.0.3, 127.0.0.1\r\n\r\n" + JSON
    )

    async def run() -> None:
        up = Upstream(PLAIN)
        async with upstream_server(up) as base:
            proxy = ShadowProxy(
                base, lambda r: "admitted", counters=IngestCounters(), clock=lambda: 0.0
            )
            port = await proxy.start("127.0.0.1", 0)
            try:
                r, w = await asyncio.open_connection("127.0.0.1", port)
                w.write(raw)
                await read_answer(r)
                w.close()
            finally:
                await proxy.stop()
        up_port = base.rsplit(":", 1)[1]
        assert up.received == [expected.replace(b"{port}", up_port.encode())]

    asyncio.run(run())


@pytest.mark.parametrize("name", list(PARSER_REQUESTS))
async def test_other_requests_go_to_the_parser_and_come_out_the_same(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request outside the common shape never takes the fast path, and the result is the
    parser path's, byte for byte."""
    raw = PARSER_REQUESTS[name]
    fast = await through([raw], PLAIN, True, monkeypatch)
    slow = await through([raw], PLAIN, False, monkeypatch)
    assert fast.fast_requests == 0
    assert fast.upstream_got == slow.upstream_got
    assert fast.client_got == slow.client_got
    assert fast.offered == slow.offered
    assert fast.counters == slow.counters


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


SSE = [
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
    chunk(b'data: {"a":1}\n\n'),
    chunk(b'data: {"a":2}\n\n') + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n",
]
HEAD_END = PLAIN[0].index(b"\r\n\r\n") + 4
#: name: (answer pieces, fast path taken, upstream connections for two requests, upstream
#: closes after answering)
ANSWERS: dict[str, tuple[list[bytes], bool, int | None, bool]] = {
    "length, one piece": (PLAIN, True, 1, False),
    "length, body in three pieces": (
        [
            PLAIN[0][i:j]
            for i, j in ((0, HEAD_END + 5), (HEAD_END + 5, HEAD_END + 20), (HEAD_END + 20, None))
        ],
        True,
        1,
        False,
    ),
    "length, head split": ([PLAIN[0][:40], PLAIN[0][40:]], False, 1, False),
    "chunked SSE in pieces": (SSE, True, 1, False),
    "chunked in one piece": ([b"".join(SSE)], True, 1, False),
    "no length: read to close": (
        [b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall"],
        False,
        2,
        True,
    ),
    "connection close": (
        [b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"],
        False,
        2,
        True,
    ),
    "keep-alive field": (
        [b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5\r\nContent-Length: 2\r\n\r\nok"],
        False,
        1,
        False,
    ),
    "204": ([b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n"], False, 1, False),
    "http/1.0 answer": ([b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok"], False, 2, True),
    "two lengths": (
        [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok"],
        False,
        None,
        False,
    ),
    "bytes beyond the length": (
        [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA"],
        False,
        2,
        False,
    ),
    "bytes beyond the last chunk": ([b"".join(SSE) + b"EXTRA"], True, 2, False),
}


@pytest.mark.parametrize("name", list(ANSWERS))
async def test_answers_come_out_the_same_on_both_paths(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each answer, relayed for two requests, takes the fast path exactly when it has the
    common shape, and reaches the client as on the parser path (with the upstream connections
    reused or not alike)."""
    answer, takes_fast_path, connections, close_after = ANSWERS[name]
    raw = COMMON_REQUESTS["plain"]
    fast = await through([raw, raw], answer, True, monkeypatch, close_after)
    slow = await through([raw, raw], answer, False, monkeypatch, close_after)
    assert fast.fast_answers == (2 if takes_fast_path else 0)
    assert slow.fast_answers == 0
    if name == "bytes beyond the last chunk":
        # the fast path relays the head before the extra bytes arrive, so it cannot add the
        # parser path's "Connection: close"; both close the client connection after the answer
        assert [a.count(b"Connection: close\r\n") for a in slow.client_got] == [1, 1]
        slow.client_got = [a.replace(b"Connection: close\r\n", b"") for a in slow.client_got]
    assert fast.client_got == slow.client_got
    assert fast.upstream_got == slow.upstream_got
    assert fast.counters == slow.counters
    if connections is not None:
        assert fast.connections == slow.connections == connections
