"""The proxy's fast paths against its parser paths, over real sockets on 127.0.0.1.

The same request bytes go through two proxies in front of one raw upstream: one with the fast
paths on (the default) and one with ``fast`` off, where every request and answer goes through
llhttp's parsers. What the upstream receives, what the client receives, the copies offered and
the counters must be equal byte for byte, and the fast path must have been taken for the
requests and answers of the common shape (so the comparison is not between two parser runs)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import httptools
import pytest

from specwatch.core.logs import event_fields
from specwatch.http1 import client as hclient
from specwatch.http1 import exchange as hexchange
from specwatch.http1 import framing as forward
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
    early: bool = False  # answer as soon as the head is in, then read the body
    per_request: list[list[bytes]] | None = None  # the n-th request's answer pieces
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
                if self.early:
                    for piece in self.answer:
                        w.write(piece)
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
                pieces = self.answer
                if self.per_request is not None:
                    pieces = self.per_request[len(self.received) - 1]
                for i, piece in enumerate([] if self.early else pieces):
                    if i:
                        await asyncio.sleep(0.02 if self.per_request is None else 0.002)
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
    offered: list[tuple[str, object, str, str | None]]
    counters: tuple[int, int, int, dict[str, int], int]
    connections: int
    fast_requests: int
    fast_answers: int
    refused: dict[str, int] = field(default_factory=dict)


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
    steps: list[tuple[list[bytes], int]] | None = None,
    early: bool = False,
    per_request: list[list[bytes]] | None = None,
    prefix: str = "",
) -> Run:
    """Send ``requests`` one after another, each on a new client connection (the proxy's
    upstream connections are pooled across clients); or, with ``steps``, run each step on one
    client connection: write its pieces (a short pause between them, so each reaches the proxy
    as a read of its own), then read that many answers."""
    taken = {"request": 0, "answer": 0}
    real_request, real_answer = hclient.Client.fast_request, hexchange.fast_answer

    def spy_request(self: hclient.Client, data: bytes) -> bool:
        ok = real_request(self, data)
        taken["request"] += ok
        return ok

    def spy_answer(self: hexchange.Exchange, data: bytes) -> bool:
        ok = real_answer(self, data)
        taken["answer"] += ok
        return ok

    monkeypatch.setattr(hclient.Client, "fast_request", spy_request)
    monkeypatch.setattr(hexchange, "fast_answer", spy_answer)
    offered: list[ShadowRequest] = []

    def offer(req: ShadowRequest) -> str:
        offered.append(req)
        return "admitted"

    up = Upstream(answer, close_after, early, per_request=per_request)
    counters = IngestCounters()
    async with upstream_server(up) as base:
        proxy = ShadowProxy(base + prefix, offer, counters=counters, clock=lambda: 0.0)
        port = await proxy.start("127.0.0.1", 0)
        assert proxy._forwarder is not None
        proxy._forwarder.fast = fast
        refused = proxy._forwarder.stats.refused
        got: list[bytes] = []
        try:
            for raw in requests:
                r, w = await asyncio.open_connection("127.0.0.1", port)
                w.write(raw)
                got.append(await read_answer(r))
                w.close()
            if steps:
                r, w = await asyncio.open_connection("127.0.0.1", port)
                for pieces, answers in steps:
                    for i, piece in enumerate(pieces):
                        if i:
                            await asyncio.sleep(0.005)
                        w.write(piece)
                        await w.drain()
                    for _ in range(answers):
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
        (
            counters.proxy_requests,
            counters.skipped_marked,
            sum(counters.errors.values()),
            dict(counters.proxy_upstream_errors),
            counters.proxy_client_disconnects,
        ),
        up.accepted,
        taken["request"],
        taken["answer"],
        dict(refused),
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
    # odd but valid: both paths forward these as they are
    "length with leading zeros": b"POST /v1/completions HTTP/1.1\r\nHost: h\r\n"
    b"Content-Length: 00%d\r\n\r\n%b" % (len(JSON), JSON),
    "no host": post(),
    "two hosts": post(b"Host: a", b"Host: b"),
    "get with a body": post(b"Host: h", path=b"/v1/models").replace(b"POST", b"GET", 1),
    "empty x-forwarded-for": post(b"Host: h", b"X-Forwarded-For: "),
    "quotes, braces and a fragment in the target": post(
        b"Host: h", path=b'/v1/completions?q="<{|}>"^`\\#frag'
    ),
    "connection keep-alive in capitals, twice": post(
        b"Host: h", b"Connection: KEEP-ALIVE", b"Connection: keep-alive"
    ),
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
    "asterisk target": b"OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n",
    "two spaces after the method": post(b"Host: h").replace(b"POST ", b"POST  ", 1),
    "an empty line before the request": b"\r\n" + post(b"Host: h"),
    "tab after the colon": post(b"Host: h", b"X-A:\tb"),
    "tab at the end of a value": post(b"Host: h", b"X-A: b\t"),
    "head": b"HEAD /v1/models HTTP/1.1\r\nHost: h\r\n\r\n",
}

#: Requests the parser refuses: on both paths a 400 and nothing sent upstream (no smuggling).
REFUSED_REQUESTS = {
    "length and chunked": post(b"Host: h", b"Transfer-Encoding: chunked"),
    # a coding the proxy would drop while re-framing the body (the upstream would read the
    # coded bytes as the body)
    "gzip, chunked": b"POST /v1/completions HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, "
    b"chunked\r\n\r\n%x\r\n%b\r\n0\r\n\r\n" % (len(JSON), JSON),
    "two lengths": post(b"Host: h", b"Content-Length: %d" % len(JSON)),
    "a length list": b"POST /v1/completions HTTP/1.1\r\nHost: h\r\n"
    b"Content-Length: %d, %d\r\n\r\n%b" % (len(JSON), len(JSON), JSON),
    "negative length": b"POST /v1/completions HTTP/1.1\r\nHost: h\r\n"
    b"Content-Length: -%d\r\n\r\n%b" % (len(JSON), JSON),
    "length past 2**64": b"POST /v1/completions HTTP/1.1\r\nHost: h\r\n"
    b"Content-Length: 99999999999999999999\r\n\r\n%b" % JSON,
    "bare LF line ends": post(b"Host: h").replace(b"\r\n", b"\n"),
    "obs-fold continuation": post(b"Host: h", b"X-A: a", b" b"),
    "NUL in a value": post(b"Host: h", b"X-A: a\x00b"),
    "control byte in a value": post(b"Host: h", b"X-A: a\x01b"),
    "DEL in a value": post(b"Host: h", b"X-A: a\x7fb"),
    "bare CR in a value": post(b"Host: h", b"X-A: a\rb"),
    "NUL in a name": post(b"Host: h", b"X-\x00A: b"),
    "space before the colon": post(b"Host: h", b"X-A : b"),
    "space before the colon of the length": post(b"Host: h").replace(
        b"Content-Length:", b"Content-Length :"
    ),
    "empty name": post(b"Host: h", b": v"),
    "lower-case method": post(b"Host: h").replace(b"POST", b"post", 1),
    "lower-case version": post(b"Host: h").replace(b"HTTP/1.1", b"http/1.1", 1),
    "space after the version": post(b"Host: h").replace(b"HTTP/1.1", b"HTTP/1.1 ", 1),
    "non-ASCII in the target": post(b"Host: h", path=b"/v1/\xe9"),
    "DEL in the target": post(b"Host: h", path=b"/v1/\x7f"),
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


@pytest.mark.parametrize("name", list(REFUSED_REQUESTS))
async def test_malformed_requests_are_refused_on_both_paths(
    name: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A request llhttp refuses (framing an upstream could read another way, control bytes,
    odd spellings) never takes the fast path: both paths answer the parser's 400 with the
    connection closed, send the upstream nothing and count ``bad_request`` (one log line each,
    without the request's ``Authorization`` token or a traceback)."""
    raw = REFUSED_REQUESTS[name]
    line_end = raw.index(b"\n") + 1
    eol = raw[line_end - 2 : line_end] if raw[line_end - 2 : line_end] == b"\r\n" else b"\n"
    raw = raw[:line_end] + b"Authorization: Bearer sk-live-123" + eol + raw[line_end:]
    with caplog.at_level("DEBUG"):
        fast = await through([raw], PLAIN, True, monkeypatch)
        slow = await through([raw], PLAIN, False, monkeypatch)
    assert fast.fast_requests == 0
    assert fast.client_got == slow.client_got == [forward.BAD_400]
    assert fast.upstream_got == slow.upstream_got == []
    assert fast.counters == slow.counters == (0, 0, 0, {}, 0)
    assert fast.refused == slow.refused == {"bad_request": 1}
    assert [r.message for r in caplog.records] == ["connection refused"] * 2
    assert all("sk-live-123" not in str(r.__dict__) for r in caplog.records)
    assert not [r for r in caplog.records if r.exc_info]


async def test_a_request_split_at_every_byte_comes_out_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A common request that reaches the proxy in two reads, split at every byte, is never
    taken by the fast path (it needs the whole request in one read) and goes up exactly as the
    whole request does: the bytes the upstream receives for each split equal those of the
    unsplit request, on both paths, and every answer is relayed."""
    raw = COMMON_REQUESTS["forwarded before, category and id"]
    steps = [([raw[:i], raw[i:]], 1) for i in range(1, len(raw))]
    whole = await through([raw], PLAIN, True, monkeypatch)
    assert whole.fast_requests == 1
    fast = await through([], PLAIN, True, monkeypatch, steps=steps)
    slow = await through([], PLAIN, False, monkeypatch, steps=steps)
    assert fast.fast_requests == 0
    assert fast.upstream_got == slow.upstream_got == whole.upstream_got * len(steps)
    assert fast.client_got == slow.client_got == PLAIN * len(steps)
    assert fast.offered == slow.offered == whole.offered * len(steps)
    assert fast.counters == slow.counters == (len(steps), 0, 0, {}, 0)


ONE = COMMON_REQUESTS["plain"]
#: name: (steps on one connection, fast requests taken, requests the upstream receives)
PIPELINES: dict[str, tuple[list[tuple[list[bytes], int]], int, int]] = {
    "two requests in one read": ([([ONE + ONE], 2)], 0, 2),
    "a request and the start of the next in one read": (
        [([ONE + ONE[:30], ONE[30:]], 2)],
        0,
        2,
    ),
    "a request and the head of the next in one read": (
        [([ONE + ONE[:-5], ONE[-5:]], 2)],
        0,
        2,
    ),
    "a body that holds a whole request": (
        [([post(b"Host: h", body=ONE)], 1), ([ONE], 1)],
        2,
        2,
    ),
    "one after the other, then two at once": ([([ONE], 1), ([ONE], 1), ([ONE + ONE], 2)], 2, 4),
}


@pytest.mark.parametrize("name", list(PIPELINES))
async def test_pipelined_requests_come_out_the_same(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pipelined requests on one connection: the fast path takes only a read holding exactly
    one whole request while nothing is queued; the upstream receives each request once, in
    order, and the client its answers in order, the same bytes on both paths."""
    steps, fast_taken, received = PIPELINES[name]
    answers = sum(n for _, n in steps)
    fast = await through([], PLAIN, True, monkeypatch, steps=steps)
    slow = await through([], PLAIN, False, monkeypatch, steps=steps)
    assert fast.fast_requests == fast_taken
    assert len(fast.upstream_got) == received
    assert fast.upstream_got == slow.upstream_got
    assert fast.client_got == slow.client_got == PLAIN * answers
    assert fast.offered == slow.offered
    assert fast.counters == slow.counters


UPGRADE = (
    b"GET /v1/models HTTP/1.1\r\nHost: h\r\nConnection: Upgrade, HTTP2-Settings\r\n"
    b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n"
)
#: what the upstream receives for it: a plain GET (Upgrade is hop-by-hop, not honoured)
UPGRADE_SENT = b"GET /v1/models HTTP/1.1\r\nHost: UPSTREAM\r\nX-Forwarded-For: 127.0.0.1\r\n\r\n"
ONE_SENT = (
    b"POST /v1/completions HTTP/1.1\r\nHost: UPSTREAM\r\nUser-Agent: t/1\r\n"
    b"Content-Type: application/json\r\nContent-Length: 47\r\nX-Forwarded-For: 127.0.0.1"
    b"\r\n\r\n" + JSON
)
#: name: (steps on one connection, what the upstream receives, answers the client receives)
UPGRADES: dict[str, tuple[list[tuple[list[bytes], int]], list[bytes], list[bytes]]] = {
    "then a request in the next read": (
        [([UPGRADE], 1), ([ONE], 1)],
        [UPGRADE_SENT, ONE_SENT],
        PLAIN * 2,
    ),
    "then a request in the same read": (
        [([UPGRADE + ONE], 2)],
        [UPGRADE_SENT, ONE_SENT],
        PLAIN * 2,
    ),
    "with a body": (
        [([post(b"Host: h", b"Connection: Upgrade", b"Upgrade: h2c")], 1)],
        [],
        [forward.BAD_400],
    ),
    "with a chunked body": (
        [
            (
                [
                    b"POST /v1/completions HTTP/1.1\r\nHost: h\r\nConnection: upgrade\r\n"
                    b"Upgrade: websocket\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"
                ],
                1,
            )
        ],
        [],
        [forward.BAD_400],
    ),
}


@pytest.mark.parametrize("name", list(UPGRADES))
async def test_upgrade_requests_go_on_as_plain_ones_or_are_refused(
    name: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``Upgrade`` is hop-by-hop and not honoured: the request goes up as a plain one and the
    connection stays HTTP/1.1, so a request after it (in the same read or the next) is
    answered too. llhttp reads no body after an upgrade request's head, so one with a body is
    refused (400, nothing sent up, logged as ``UpgradeWithBody``) rather than sent up without
    its body (a hang)."""
    steps, sent, answers = UPGRADES[name]
    with caplog.at_level("WARNING"):
        fast = await through([], PLAIN, True, monkeypatch, steps=steps)
        slow = await through([], PLAIN, False, monkeypatch, steps=steps)
    assert fast.upstream_got == slow.upstream_got == sent
    assert fast.client_got == slow.client_got == answers
    assert fast.counters == slow.counters
    refused = {"bad_request": 1} if answers == [forward.BAD_400] else {}
    assert fast.refused == slow.refused == refused
    errors = [event_fields(r).get("error") for r in caplog.records if r.msg == "connection refused"]
    assert errors == (["UpgradeWithBody"] * 2 if refused else [])


async def test_trailer_fields_of_a_chunked_upload_go_nowhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Trailer fields after a chunked request body are dropped (the body goes up re-framed,
    ending ``0``, empty line): they never join the head of the next request on the
    connection, whether that one takes the fast path or the parser path, and a shadow marker
    among them does not keep the next request from being copied."""
    upload = (
        b"POST /v1/completions HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
        + chunk(JSON)
        + b"0\r\nX-Injected: evil\r\nX-Specwatch-Shadow: 1\r\n\r\n"
    )
    upload_sent = (
        b"POST /v1/completions HTTP/1.1\r\nHost: UPSTREAM\r\nTransfer-Encoding: chunked\r\n"
        b"X-Forwarded-For: 127.0.0.1\r\n\r\n" + chunk(JSON) + b"0\r\n\r\n"
    )
    steps = [([upload], 1), ([ONE], 1)]
    fast = await through([], PLAIN, True, monkeypatch, steps=steps)
    slow = await through([], PLAIN, False, monkeypatch, steps=steps)
    assert fast.fast_requests == 1
    assert fast.upstream_got == slow.upstream_got == [upload_sent, ONE_SENT]
    assert fast.client_got == slow.client_got == PLAIN * 2
    copy = ("/v1/completions", "hi", "default", None)
    assert fast.offered == slow.offered == [copy, copy]
    assert fast.counters == slow.counters == (2, 0, 0, {}, 0)


async def test_endless_trailer_fields_are_cut_off(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Trailer fields after a chunked upload are buffered by the parser until they end (and
    grow at a cost that rises with their square): past ``MAX_HEAD_BYTES`` of reads that carry
    no body byte the upload is cut off (the client connection aborted, counted as
    ``bad_request`` and as an incomplete upload), on both paths."""

    async def until_closed(r: asyncio.StreamReader) -> bytes:
        try:
            return await asyncio.wait_for(r.read(), 5)
        except ConnectionResetError:
            return b"<reset>"

    monkeypatch.setattr(sys.modules[__name__], "read_answer", until_closed)
    start = (
        b"POST /v1/completions HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
        + chunk(JSON)
        + b"0\r\nX-Endless: "
    )
    steps = [([start, b"a" * (forward.MAX_HEAD_BYTES + 16384)], 1)]
    fast = await through([], PLAIN, True, monkeypatch, steps=steps)
    slow = await through([], PLAIN, False, monkeypatch, steps=steps)
    assert fast.client_got == slow.client_got
    assert fast.client_got[0] in (b"", b"<reset>")
    assert fast.upstream_got == slow.upstream_got == []
    assert fast.refused == slow.refused == {"bad_request": 1}
    assert fast.counters == slow.counters == (1, 0, 1, {}, 0)


@pytest.mark.parametrize("chunked", [False, True], ids=["length", "chunked"])
async def test_a_large_upload_is_not_mistaken_for_endless_framing(
    chunked: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 1 MiB upload written at once (reads far larger than ``MAX_HEAD_BYTES``, all body)
    goes up whole on both paths: the cap counts only reads without body bytes."""
    body = b"x" * (1 << 20)
    if chunked:
        raw = (
            b"POST /v1/models HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
            + chunk(body[: 1 << 19])
            + chunk(body[1 << 19 :])
            + b"0\r\n\r\n"
        )
    else:
        raw = post(b"Host: h", body=body, path=b"/v1/models")
    fast = await through([], PLAIN, True, monkeypatch, steps=[([raw], 1)])
    slow = await through([], PLAIN, False, monkeypatch, steps=[([raw], 1)])
    assert fast.client_got == slow.client_got == PLAIN
    assert len(fast.upstream_got) == len(slow.upstream_got) == 1
    for got in (fast.upstream_got[0], slow.upstream_got[0]):
        sent = got.split(b"\r\n\r\n", 1)[1]
        assert (dechunk(sent) if chunked else sent) == body
    assert fast.refused == slow.refused == {}


def dechunk(framed: bytes) -> bytes:
    """The data of a chunked body (the proxy re-frames chunks as they arrive)."""
    out = b""
    while True:
        size_line, framed = framed.split(b"\r\n", 1)
        size = int(size_line, 16)
        if size == 0:
            return out
        out, framed = out + framed[:size], framed[size + 2 :]


@pytest.mark.parametrize(
    ("target", "origin"),
    [
        (b"http://h/v1/completions", b"/v1/completions"),
        (b"HTTPS://h:8443/v1/completions?x=1", b"/v1/completions?x=1"),
        (b"http://h", b"/"),
        (b"http://h?x=1", b"/?x=1"),
    ],
)
async def test_an_absolute_form_target_goes_up_in_origin_form(
    target: bytes, origin: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request in absolute form (RFC 9112 §3.2.2: a server must accept it) goes up in
    origin form behind the upstream's prefix, as the same request in origin form would, and
    a shadowed path is copied; the fast path leaves it to the parser."""
    raw = post(b"Host: h", path=target)
    fast = await through([raw], PLAIN, True, monkeypatch)
    slow = await through([raw], PLAIN, False, monkeypatch)
    assert fast.fast_requests == 0
    expected = ONE_SENT.replace(b"/v1/completions", origin, 1)
    expected = expected.replace(b"User-Agent: t/1\r\nContent-Type: application/json\r\n", b"")
    assert fast.upstream_got == slow.upstream_got == [expected]
    copied = [("/v1/completions", "hi", "default", None)] if origin.startswith(b"/v1") else []
    assert fast.offered == slow.offered == copied


@pytest.mark.parametrize(
    "first",
    [
        pytest.param(post(b"Host: h", b"Connection: close"), id="connection close"),
        pytest.param(b"GET /v1/models HTTP/1.0\r\nHost: h\r\n\r\n", id="http/1.0"),
    ],
)
@pytest.mark.parametrize(
    "after", [ONE, b"\r\n", b"garbage\r\n\r\n"], ids=["a request", "CRLF", "garbage"]
)
async def test_bytes_after_a_closing_request_are_ignored(
    first: bytes, after: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bytes in the same read after a request that closes the connection (``Connection:
    close``, HTTP/1.0) are not processed (RFC 9112 §9.6): the request is answered, then the
    connection closed; nothing more goes up and nothing is refused (they cut the answer off
    before)."""

    async def until_closed(r: asyncio.StreamReader) -> bytes:
        return await asyncio.wait_for(r.read(), 5)

    monkeypatch.setattr(sys.modules[__name__], "read_answer", until_closed)
    steps = [([first + after], 1)]
    fast = await through([], PLAIN, True, monkeypatch, steps=steps)
    slow = await through([], PLAIN, False, monkeypatch, steps=steps)
    assert fast.client_got == slow.client_got == [CLOSE_HEAD + ANSWER]
    assert len(fast.upstream_got) == len(slow.upstream_got) == 1
    assert fast.refused == slow.refused == {}
    assert fast.counters == slow.counters == (1, 0, 0, {}, 0)


@pytest.mark.parametrize(
    ("raw", "line", "fast_taken"),
    [
        (ONE, b"POST /base/v1/completions HTTP/1.1", 1),
        (
            post(b"Host: h", path=b"http://h/v1/completions"),
            b"POST /base/v1/completions HTTP/1.1",
            0,
        ),
        (b"OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n", b"OPTIONS * HTTP/1.1", 0),
    ],
    ids=["origin form", "absolute form", "asterisk"],
)
async def test_the_upstream_prefix_on_both_paths(
    raw: bytes, line: bytes, fast_taken: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upstream URL with a base path (``http://host:port/base``): the request target goes
    up behind it, on both paths, except ``*`` (a request about the server, not a path), which
    goes up as it is."""
    fast = await through([raw], PLAIN, True, monkeypatch, prefix="/base")
    slow = await through([raw], PLAIN, False, monkeypatch, prefix="/base")
    assert fast.fast_requests == fast_taken
    assert [u.split(b"\r\n", 1)[0] for u in fast.upstream_got] == [line]
    assert fast.upstream_got == slow.upstream_got
    assert fast.client_got == slow.client_got == PLAIN


def padded(head_length: int) -> bytes:
    """A common request whose head (up to and with its empty line) is ``head_length`` bytes."""
    short = post(b"Host: h", b"X-Pad: ")
    pad = head_length - short.index(b"\r\n\r\n") - 4
    return post(b"Host: h", b"X-Pad: " + b"p" * pad)


@pytest.mark.parametrize(("head_length", "fast_taken"), [(8191, 1), (8192, 1), (8193, 0)])
async def test_heads_near_the_fast_path_limit(
    head_length: int, fast_taken: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fast path looks at heads of up to 8192 bytes; one byte longer goes to the parser.
    Either way the upstream receives the same head: the client's fields in order, with ``Host``
    replaced and ``X-Forwarded-For`` last, and the client the answer."""
    raw = padded(head_length)
    assert raw.index(b"\r\n\r\n") + 4 == head_length
    fast = await through([raw], PLAIN, True, monkeypatch)
    slow = await through([raw], PLAIN, False, monkeypatch)
    assert fast.fast_requests == fast_taken
    pad = raw.split(b"X-Pad: ")[1].split(b"\r\n")[0]
    expected = (
        b"POST /v1/completions HTTP/1.1\r\nHost: UPSTREAM\r\nX-Pad: " + pad + b"\r\n"
        b"Content-Length: 47\r\nX-Forwarded-For: 127.0.0.1\r\n\r\n" + JSON
    )
    assert fast.upstream_got == slow.upstream_got == [expected]
    assert fast.client_got == slow.client_got == PLAIN


@pytest.mark.parametrize(
    "head",
    [
        pytest.param(b"X-Big: " + b"a" * (forward.MAX_HEAD_BYTES + 1), id="one long value"),
        pytest.param(b"X-Many: a\r\n" * (forward.MAX_HEAD_BYTES // 11 + 1), id="many fields"),
    ],
)
async def test_a_head_past_the_cap_is_refused_before_it_ends(
    head: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request head that grows past ``MAX_HEAD_BYTES`` (64 KiB) is refused with the
    parser's 400 while it is still coming (the proxy does not keep buffering it, nor send it
    up), counted as ``bad_request``, on both paths. The client writes it in 8 KiB pieces and
    never ends it."""
    start = b"POST /v1/completions HTTP/1.1\r\nHost: h\r\n" + head
    pieces = [start[i : i + 8192] for i in range(0, len(start), 8192)]
    steps = [(pieces, 1)]
    fast = await through([], PLAIN, True, monkeypatch, steps=steps)
    slow = await through([], PLAIN, False, monkeypatch, steps=steps)
    assert fast.client_got == slow.client_got == [forward.BAD_400]
    assert fast.upstream_got == slow.upstream_got == []
    assert fast.connections == slow.connections == 0
    assert fast.refused == slow.refused == {"bad_request": 1}


async def test_a_head_request_gets_the_head_of_an_answer_with_a_length(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``HEAD``: the answer's ``Content-Length`` announces a body that never comes; neither
    path waits for it or takes the fast answer path: the head is relayed as it is and the
    upstream connection is reused for a second ``HEAD`` on the same client connection."""

    async def head_answer(r: asyncio.StreamReader) -> bytes:
        return await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 5)

    monkeypatch.setattr(sys.modules[__name__], "read_answer", head_answer)
    head = b"HEAD /v1/models HTTP/1.1\r\nHost: h\r\n\r\n"
    steps = [([head], 1), ([head], 1)]
    only_head = [PLAIN[0][:HEAD_END]]
    fast = await through([], only_head, True, monkeypatch, steps=steps)
    slow = await through([], only_head, False, monkeypatch, steps=steps)
    assert fast.fast_requests == fast.fast_answers == 0
    assert fast.client_got == slow.client_got == only_head * 2
    assert (
        fast.upstream_got
        == slow.upstream_got
        == [b"HEAD /v1/models HTTP/1.1\r\nHost: UPSTREAM\r\nX-Forwarded-For: 127.0.0.1\r\n\r\n"] * 2
    )
    assert fast.connections == slow.connections == 1


async def test_an_answer_before_the_request_body_is_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """The upstream answers as soon as the head is in, before the client sent the rest of its
    body: the fast answer path is not taken (the request is not complete); both paths relay
    the answer, close the upstream connection (its request was not finished, so the fake
    upstream records none) and offer no copy of the partial body."""
    raw = COMMON_REQUESTS["plain"]
    cut = raw.index(b"\r\n\r\n") + 4 + 10
    steps = [([raw[:cut]], 1)]
    fast = await through([], PLAIN, True, monkeypatch, steps=steps, early=True)
    slow = await through([], PLAIN, False, monkeypatch, steps=steps, early=True)
    assert fast.fast_requests == fast.fast_answers == 0
    assert fast.client_got == slow.client_got == PLAIN
    assert fast.upstream_got == slow.upstream_got == []
    assert fast.offered == slow.offered == []
    assert fast.counters == slow.counters == (1, 0, 0, {}, 0)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


SSE = [
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
    chunk(b'data: {"a":1}\n\n'),
    chunk(b'data: {"a":2}\n\n') + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n",
]
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
OK_CHUNKED = OK + b"Transfer-Encoding: chunked\r\n\r\n"
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
    "1xx then 200 in one read": (
        [b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + PLAIN[0]],
        False,
        1,
        False,
    ),
    "1xx, then 200 in the next read": (
        [b"HTTP/1.1 100 Continue\r\n\r\n", PLAIN[0]],
        False,
        1,
        False,
    ),
    "chunk extensions and trailer fields": (
        [OK_CHUNKED + b"3;ext=1\r\nabc\r\n0\r\nX-Trailer: 1\r\n\r\n"],
        True,
        1,
        False,
    ),
    "chunked in capitals, padded": (
        [b"HTTP/1.1 200 OK\r\nTransfer-Encoding:  CHUNKED \r\n\r\n3\r\nabc\r\n0\r\n\r\n"],
        True,
        1,
        False,
    ),
    "gzip, chunked": (
        [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"],
        False,
        1,
        False,
    ),
    "length padded, leading zeros": ([OK + b"Content-Length:  002 \r\n\r\nok"], True, 1, False),
    "length 0": ([OK + b"Content-Length: 0\r\n\r\n"], True, 1, False),
    "a body that looks like a last chunk": (
        [OK + b"Content-Length: 5\r\n\r\n0\r\n\r\n"],
        True,
        1,
        False,
    ),
    "a field value naming a length": (
        [OK + b"X-A: Content-Length: 9\r\nContent-Length: 2\r\n\r\nok"],
        True,
        1,
        False,
    ),
    "head over 16 KiB": (
        [OK + b"X-Big: " + b"a" * 20000 + b"\r\nContent-Length: 2\r\n\r\nok"],
        True,
        1,
        False,
    ),
    "204 with a length": (
        [b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n"],
        False,
        1,
        False,
    ),
    "304 with a length": (
        [b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n"],
        False,
        1,
        False,
    ),
    "no reason phrase": ([b"HTTP/1.1 200\r\nContent-Length: 2\r\n\r\nok"], False, 1, False),
    "status 600": ([b"HTTP/1.1 600 X\r\nContent-Length: 2\r\n\r\nok"], False, 1, False),
    "upgrade field": ([OK + b"Upgrade: h2c\r\nContent-Length: 2\r\n\r\nok"], False, 1, False),
    "head split inside its last CRLF CRLF": (
        [OK + b"Content-Length: 2\r\n\r", b"\nok"],
        False,
        1,
        False,
    ),
    # malformed answers: a clean 502 on both paths (STATUS below), the connection not reused
    "chunked and a length": (
        [
            OK_CHUNKED.replace(b"\r\n\r\n", b"\r\nContent-Length: 3\r\n\r\n")
            + b"3\r\nabc\r\n0\r\n\r\n"
        ],
        False,
        2,
        False,
    ),
    "bad chunk size in the first read": ([OK_CHUNKED + b"zz\r\nabc\r\n0\r\n\r\n"], False, 2, False),
    "a length list": ([OK + b"Content-Length: 2, 2\r\n\r\nok"], False, 2, False),
    "length with a sign": ([OK + b"Content-Length: +2\r\n\r\nok"], False, 2, False),
    "length past 2**64": (
        [OK + b"Content-Length: 99999999999999999999\r\n\r\nok"],
        False,
        2,
        False,
    ),
    "bare LF line ends": ([b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok"], False, 2, False),
    "obs-fold continuation": (
        [OK + b"X-A: a\r\n b\r\nContent-Length: 2\r\n\r\nok"],
        False,
        2,
        False,
    ),
    "NUL in a value": ([OK + b"X-A: a\x00b\r\nContent-Length: 2\r\n\r\nok"], False, 2, False),
    "space before the colon": ([OK + b"Content-Length : 2\r\n\r\nok"], False, 2, False),
    "lower-case version": ([b"http/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"], False, 2, False),
}
#: answers each path must turn into this status
STATUS = {
    name: b"502"
    for name in (
        "chunked and a length",
        "bad chunk size in the first read",
        "a length list",
        "length with a sign",
        "length past 2**64",
        "bare LF line ends",
        "obs-fold continuation",
        "NUL in a value",
        "space before the colon",
        "lower-case version",
    )
}


SECOND = b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nSMUGGLED"
ALL_SSE = b"".join(SSE)
CLOSE_HEAD = PLAIN[0][:HEAD_END].replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
#: name: (answer pieces, what the client receives on the fast path and on the parser path
#: before its connection is closed)
STRAY: dict[str, tuple[list[bytes], bytes, bytes]] = {
    "bytes beyond the length, in a later read": (
        [PLAIN[0][: HEAD_END + 5], PLAIN[0][HEAD_END + 5 :] + b"EXTRA"],
        PLAIN[0],
        PLAIN[0],
    ),
    "a second answer after the length": (
        [PLAIN[0] + SECOND],
        CLOSE_HEAD + ANSWER,
        CLOSE_HEAD + ANSWER,
    ),
    "a second answer after the length, in a later read": (
        [PLAIN[0][: HEAD_END + 5], PLAIN[0][HEAD_END + 5 :] + SECOND],
        PLAIN[0],
        PLAIN[0],
    ),
    # a chunked answer's end is found by llhttp, which does not say where: what follows it in
    # the same read is relayed, then the connection is closed (so it is never read as the next
    # answer); the parser path rewrites a head it has not sent yet with "Connection: close"
    "a second answer after the last chunk": (
        [ALL_SSE + SECOND],
        ALL_SSE + SECOND,
        ALL_SSE.replace(b"chunked\r\n", b"chunked\r\nConnection: close\r\n", 1) + SECOND,
    ),
    "a second answer after the last chunk, in a later read": (
        [ALL_SSE[:120], ALL_SSE[120:] + SECOND],
        ALL_SSE + SECOND,
        ALL_SSE + SECOND,
    ),
    "bytes beyond the last chunk, in a later read": (
        [ALL_SSE[:120], ALL_SSE[120:] + b"EXTRA"],
        ALL_SSE + b"EXTRA",
        ALL_SSE + b"EXTRA",
    ),
}


@pytest.mark.parametrize("whole", [PLAIN[0], ALL_SSE], ids=["length", "chunked"])
async def test_an_answer_split_at_every_byte_comes_out_the_same(
    whole: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An answer that reaches the proxy in two reads, split at every byte: the fast path takes
    it exactly when the first read holds the whole head; either way the client receives the
    answer's bytes unchanged and the upstream connection is reused for the next request."""
    head_end = whole.index(b"\r\n\r\n") + 4
    splits = [[whole[:i], whole[i:]] for i in range(1, len(whole))]
    raw = COMMON_REQUESTS["plain"]
    steps = [([raw], 1)] * len(splits)
    fast = await through([], PLAIN, True, monkeypatch, steps=steps, per_request=splits)
    slow = await through([], PLAIN, False, monkeypatch, steps=steps, per_request=splits)
    assert fast.fast_answers == len(whole) - head_end
    assert slow.fast_answers == 0
    assert fast.client_got == slow.client_got == [whole] * len(splits)
    assert fast.connections == slow.connections == 1
    assert fast.counters == slow.counters


@pytest.mark.parametrize("name", list(STRAY))
async def test_bytes_after_an_answer_never_reach_a_kept_client_connection(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upstream that sends more than one answer (stray bytes, or a whole second answer)
    must not desynchronise the client: after such an answer both paths close the client
    connection (the stray bytes can never be read as the answer to its next request) and do
    not reuse the upstream connection; an answer with a length is cut at its length."""

    async def until_closed(r: asyncio.StreamReader) -> bytes:
        return await asyncio.wait_for(r.read(), 5)

    monkeypatch.setattr(sys.modules[__name__], "read_answer", until_closed)
    answer, on_fast, on_parser = STRAY[name]
    raw = COMMON_REQUESTS["plain"]
    fast = await through([raw, raw], answer, True, monkeypatch)
    slow = await through([raw, raw], answer, False, monkeypatch)
    assert fast.client_got == [on_fast, on_fast]
    assert slow.client_got == [on_parser, on_parser]
    assert fast.connections == slow.connections == 2
    assert fast.counters == slow.counters == (2, 0, 0, {}, 0)


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
    if name in STATUS:
        assert [a[:13] for a in fast.client_got] == [b"HTTP/1.1 " + STATUS[name] + b" "] * 2
        assert fast.counters[3] == {"client_error": 2}
    if connections is not None:
        assert fast.connections == slow.connections == connections
