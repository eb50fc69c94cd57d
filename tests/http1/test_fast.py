"""The forwarding engine's two paths, one suite: every case runs on the fast path (as shipped)
and on the parser path (``Forwarder.fast`` off: every request and answer through llhttp), the
way aiohttp runs one suite over its C and Python parsers. Real sockets on 127.0.0.1: a raw
upstream records the bytes it receives; each case asserts those, the bytes the client
receives, the copies handed over and the counters, and where the fast path must (or must
not) have been taken, so a case never compares two parser runs."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import httptools
import pytest

from specwatch.core.listen import ListenerStats, ListenLimits
from specwatch.core.logs import event_fields
from specwatch.core.wire import CATEGORY_HEADER, SHADOW_MARKER_HEADER
from specwatch.http1 import client as client_module
from specwatch.http1 import exchange as exchange_module
from specwatch.http1 import fast as fast_module
from specwatch.http1.forwarder import Forwarder
from specwatch.http1.framing import BAD_400, HEAD_431, MAX_HEAD_BYTES
from specwatch.http1.pool import Upstream

JSON = b'{"model": "m", "prompt": "hi", "max_tokens": 4}'
ANSWER = b'{"id": "cmpl-1", "choices": [{"text": "ok"}]}'
COPIED = frozenset({"/v1/completions", "/v1/chat/completions"})


def post(*fields: bytes, body: bytes = JSON, path: bytes = b"/v1/completions") -> bytes:
    """A POST with ``fields``, then ``Content-Length`` and ``body``."""
    head = b"POST " + path + b" HTTP/1.1\r\n" + b"".join(f + b"\r\n" for f in fields)
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


def sent(
    *fields: bytes,
    body: bytes = JSON,
    line: bytes = b"POST /v1/completions HTTP/1.1",
    xff: bytes = b"127.0.0.1",
) -> bytes:
    """What the upstream receives for a request: its line, ``Host`` set to the upstream's
    (``UPSTREAM`` here), the client's other ``fields`` in their order, ``Content-Length`` of
    ``body``, ``X-Forwarded-For`` last (the proxy's peer appended), then ``body``."""
    kept = b"".join(f + b"\r\n" for f in fields)
    return (
        line
        + b"\r\nHost: UPSTREAM\r\n"
        + kept
        + b"Content-Length: %d\r\nX-Forwarded-For: %b\r\n\r\n" % (len(body), xff)
        + body
    )


def copy(
    body: bytes = JSON,
    path: str = "/v1/completions",
    category: str | None = None,
    request_id: str | None = None,
) -> tuple[object, ...]:
    """A copy handed over, as the recording hand-over keeps it."""
    return ("copy", path, body, category, request_id)


@dataclass
class RawUpstream:
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


Reader = Callable[[asyncio.StreamReader], Awaitable[bytes]]


async def read_answer(r: asyncio.StreamReader) -> bytes:
    """One whole final answer (interim ``1xx`` answers before it included), its end found by
    llhttp (an independent parser) or the close."""
    done = asyncio.Event()

    class End:
        def on_message_complete(self) -> None:
            if parser.get_status_code() >= 200:
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


async def read_to_close(r: asyncio.StreamReader) -> bytes:
    """Everything until the proxy closes the connection (``<reset>``: it was aborted)."""
    try:
        return await asyncio.wait_for(r.read(), 5)
    except ConnectionResetError:
        return b"<reset>"


async def read_head(r: asyncio.StreamReader) -> bytes:
    """An answer's head only (the answer to ``HEAD`` has no body)."""
    return await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 5)


class Recorder:
    """A hand-over that records each call."""

    def __init__(self) -> None:
        self.handed: list[tuple[object, ...]] = []

    def copy(self, path: str, raw: bytes, category: str | None, request_id: str | None) -> None:
        self.handed.append(("copy", path, raw, category, request_id))

    def too_large(self) -> None:
        self.handed.append(("too_large",))

    def incomplete(self, shadow: bool) -> None:
        self.handed.append(("incomplete", shadow))

    def marked(self) -> None:
        self.handed.append(("marked",))


@dataclass
class Counts:
    """The engine's counters."""

    proxy_requests: int = 0
    proxy_upstream_errors: Counter[str] = field(default_factory=Counter)
    proxy_client_disconnects: int = 0


@dataclass
class Run:
    """What one run saw: the upstream's requests (its address replaced by ``UPSTREAM``), the
    client's answers, the hand-overs, ``(requests, upstream errors, client disconnects)``,
    the upstream connections accepted, the fast-path takes and the listener's refusals."""

    upstream_got: list[bytes]
    client_got: list[bytes]
    handed: list[tuple[object, ...]]
    counters: tuple[int, dict[str, int], int]
    connections: int
    fast_requests: int
    fast_answers: int
    refused: dict[str, int]


@asynccontextmanager
async def upstream_server(up: RawUpstream) -> AsyncIterator[str]:
    server = await asyncio.start_server(up.handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


@dataclass(frozen=True)
class Path:
    """One of the engine's two paths: ``fast`` (the fast paths on) or the parser path."""

    fast: bool
    monkeypatch: pytest.MonkeyPatch

    def taken(self, n: int) -> int:
        """Fast-path takes expected where the fast path takes ``n``: none on the parser path."""
        return n if self.fast else 0

    async def through(
        self,
        requests: list[bytes],
        answer: list[bytes],
        *,
        close_after: bool = False,
        steps: list[tuple[list[bytes], int]] | None = None,
        early: bool = False,
        per_request: list[list[bytes]] | None = None,
        prefix: str = "",
        read: Reader = read_answer,
    ) -> Run:
        """Send ``requests`` one after another, each on a new client connection (the upstream
        connections are pooled across clients); or, with ``steps``, run each step on one
        client connection: write its pieces (a short pause between them, so each reaches the
        engine as a read of its own), then ``read`` that many answers."""
        taken = {"request": 0, "answer": 0}
        real_request, real_answer = fast_module.fast_request, fast_module.fast_answer

        def spy_request(c: fast_module.Requesting, data: bytes) -> bool:
            ok = real_request(c, data)
            taken["request"] += ok
            return ok

        def spy_answer(ex: exchange_module.Exchange, data: bytes) -> bool:
            ok = real_answer(ex, data)
            taken["answer"] += ok
            return ok

        # the names the client and the exchange call the fast paths by
        self.monkeypatch.setattr(client_module, "fast_request", spy_request)
        self.monkeypatch.setattr(exchange_module, "fast_answer", spy_answer)
        up = RawUpstream(answer, close_after, early, per_request=per_request)
        handover = Recorder()
        counters = Counts()
        async with upstream_server(up) as base:
            fwd = Forwarder(
                Upstream.parse(base + prefix, 10.0, None),
                handover,
                counters=counters,
                limits=ListenLimits(),
                stats=ListenerStats("proxy"),
                shadow_paths=COPIED,
                marker=SHADOW_MARKER_HEADER.encode(),
                category_header=CATEGORY_HEADER.encode(),
                request_id_header=b"X-Request-Id",
                max_body_bytes=8 << 20,
            )
            fwd.fast = self.fast
            port = await fwd.start("127.0.0.1", 0)
            got: list[bytes] = []
            try:
                for raw in requests:
                    r, w = await asyncio.open_connection("127.0.0.1", port)
                    w.write(raw)
                    got.append(await read(r))
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
                            got.append(await read(r))
                    w.close()
                await asyncio.sleep(0.05)  # let a client's close reach the engine
            finally:
                await fwd.stop(5.0)
        here = base.removeprefix("http://").encode()
        return Run(
            [got.replace(b"Host: " + here, b"Host: UPSTREAM") for got in up.received],
            got,
            handover.handed,
            (
                counters.proxy_requests,
                dict(counters.proxy_upstream_errors),
                counters.proxy_client_disconnects,
            ),
            up.accepted,
            taken["request"],
            taken["answer"],
            dict(fwd.stats.refused),
        )


@pytest.fixture(params=[True, False], ids=["fast path", "parser path"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The case runs once on each path."""
    return Path(bool(request.param), monkeypatch)


def chunk(data: bytes) -> bytes:
    """One chunk of a chunked body."""
    return b"%x\r\n%b\r\n" % (len(data), data)


def dechunk(framed: bytes) -> bytes:
    """The data of a chunked body (the engine re-frames chunks as they arrive)."""
    out = b""
    while True:
        size_line, framed = framed.split(b"\r\n", 1)
        size = int(size_line, 16)
        if size == 0:
            return out
        out, framed = out + framed[:size], framed[size + 2 :]


PLAIN = [
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
    % (len(ANSWER), ANSWER)
]
HEAD_END = PLAIN[0].index(b"\r\n\r\n") + 4
#: the plain answer as relayed to a client connection that is closed after it
CLOSE_HEAD = PLAIN[0][:HEAD_END].replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
#: the engine's own answer to a malformed upstream answer
BAD_GATEWAY = (
    b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: application/json\r\nContent-Length: 47\r\n\r\n"
    b'{"error": {"message": "upstream client_error"}}'
)
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
ONE = post(b"Host: proxy.local", b"User-Agent: t/1", b"Content-Type: application/json")
ONE_SENT = sent(b"User-Agent: t/1", b"Content-Type: application/json")
GET_SENT = b"GET /v1/models HTTP/1.1\r\nHost: UPSTREAM\r\nX-Forwarded-For: 127.0.0.1\r\n\r\n"

#: name: (request, what the upstream receives for it, what is handed over for it)
COMMON_REQUESTS: dict[str, tuple[bytes, bytes, list[tuple[object, ...]]]] = {
    "plain": (ONE, ONE_SENT, [copy()]),
    "mixed-case names, keep-alive": (
        post(b"hOsT: proxy.local", b"CONNECTION: keep-alive", b"accept: */*"),
        sent(b"accept: */*"),
        [copy()],
    ),
    "forwarded before, category and id": (
        post(
            b"Host: h",
            b"X-Forwarded-For: 10.0.0.1, 10.0.0.2",
            b"X-Specwatch-Category: code",
            b"X-Request-Id: req-7",
            b"x-forwarded-for: 10.0.0.3",
        ),
        sent(
            b"X-Specwatch-Category: code",
            b"X-Request-Id: req-7",
            xff=b"10.0.0.1, 10.0.0.2, 10.0.0.3, 127.0.0.1",
        ),
        [copy(category="code", request_id="req-7")],
    ),
    "marked copy": (
        post(b"Host: h", b"X-Specwatch-Shadow: 1"),
        sent(b"X-Specwatch-Shadow: 1"),
        [("marked",)],
    ),
    "spaces and tabs inside values, obs-text": (
        post(b"Host: h", b"X-Note: a b\tc  d", b"X-Latin: caf\xe9"),
        sent(b"X-Note: a b\tc  d", b"X-Latin: caf\xe9"),
        [copy()],
    ),
    "query string, other path": (
        post(b"Host: h", path=b"/v1/chat/completions?x=1&y=%20"),
        sent(line=b"POST /v1/chat/completions?x=1&y=%20 HTTP/1.1"),
        [copy(path="/v1/chat/completions")],
    ),
    # an empty body is not handed over (nothing to replay)
    "empty body": (post(b"Host: h", body=b""), sent(body=b""), []),
    "get": (b"GET /v1/models HTTP/1.1\r\nHost: h\r\n\r\n", GET_SENT, []),
    "empty value": (post(b"Host: h", b"X-Empty: "), sent(b"X-Empty: "), [copy()]),
    # odd but valid: both paths forward these as they are
    "length with leading zeros": (
        b"POST /v1/completions HTTP/1.1\r\nHost: h\r\nContent-Length: 00%d\r\n\r\n%b"
        % (len(JSON), JSON),
        sent().replace(b"Content-Length: 47", b"Content-Length: 0047"),
        [copy()],
    ),
    "no host": (post(), sent(), [copy()]),
    "two hosts": (post(b"Host: a", b"Host: b"), sent(), [copy()]),
    "get with a body": (
        post(b"Host: h", path=b"/v1/models").replace(b"POST", b"GET", 1),
        sent(line=b"GET /v1/models HTTP/1.1"),
        [],
    ),
    "empty x-forwarded-for": (
        post(b"Host: h", b"X-Forwarded-For: "),
        sent(xff=b", 127.0.0.1"),
        [copy()],
    ),
    "quotes, braces and a fragment in the target": (
        post(b"Host: h", path=b'/v1/completions?q="<{|}>"^`\\#frag'),
        sent(line=b'POST /v1/completions?q="<{|}>"^`\\#frag HTTP/1.1'),
        [copy()],
    ),
    "connection keep-alive in capitals, twice": (
        post(b"Host: h", b"Connection: KEEP-ALIVE", b"Connection: keep-alive"),
        sent(),
        [copy()],
    ),
}

#: name: (request, what the upstream receives, the answer the client reads, what is handed over)
PARSER_REQUESTS: dict[str, tuple[bytes, bytes, bytes, list[tuple[object, ...]]]] = {
    "no space after the colon": (post(b"Host:h"), sent(), PLAIN[0], [copy()]),
    "padded value": (post(b"Host: h", b"X-Pad: v  "), sent(b"X-Pad: v  "), PLAIN[0], [copy()]),
    "connection close": (
        post(b"Host: h", b"Connection: close"),
        sent(),
        CLOSE_HEAD + ANSWER,
        [copy()],
    ),
    "connection naming a field": (
        post(b"Host: h", b"Connection: X-Drop", b"X-Drop: 1"),
        sent(),
        PLAIN[0],
        [copy()],
    ),
    "proxy credentials": (
        post(b"Host: h", b"Proxy-Authorization: Basic c2VjcmV0"),
        sent(),
        PLAIN[0],
        [copy()],
    ),
    "keep-alive field": (post(b"Host: h", b"Keep-Alive: timeout=5"), sent(), PLAIN[0], [copy()]),
    # the engine answers the interim 100 itself; it is the first answer the client reads
    "expect": (post(b"Host: h", b"Expect: 100-continue"), sent(), CONTINUE + PLAIN[0], [copy()]),
    "chunked upload": (
        b"POST /v1/completions HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
        + chunk(JSON)
        + b"0\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nHost: UPSTREAM\r\nTransfer-Encoding: chunked\r\n"
        b"X-Forwarded-For: 127.0.0.1\r\n\r\n" + chunk(JSON) + b"0\r\n\r\n",
        PLAIN[0],
        [copy()],
    ),
    "http/1.0": (
        b"POST /v1/completions HTTP/1.0\r\nHost: h\r\nConnection: keep-alive\r\n"
        b"Content-Length: %d\r\n\r\n%b" % (len(JSON), JSON),
        sent(),
        PLAIN[0],
        [copy()],
    ),
    "asterisk target": (
        b"OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n",
        b"OPTIONS * HTTP/1.1\r\nHost: UPSTREAM\r\nX-Forwarded-For: 127.0.0.1\r\n\r\n",
        PLAIN[0],
        [],
    ),
    "two spaces after the method": (
        post(b"Host: h").replace(b"POST ", b"POST  ", 1),
        sent(),
        PLAIN[0],
        [copy()],
    ),
    "an empty line before the request": (b"\r\n" + post(b"Host: h"), sent(), PLAIN[0], [copy()]),
    "tab after the colon": (post(b"Host: h", b"X-A:\tb"), sent(b"X-A: b"), PLAIN[0], [copy()]),
    "tab at the end of a value": (
        post(b"Host: h", b"X-A: b\t"),
        sent(b"X-A: b\t"),
        PLAIN[0],
        [copy()],
    ),
    # the fake upstream sends its body even to HEAD; the read is relayed as it came
    "head": (
        b"HEAD /v1/models HTTP/1.1\r\nHost: h\r\n\r\n",
        b"HEAD /v1/models HTTP/1.1\r\nHost: UPSTREAM\r\nX-Forwarded-For: 127.0.0.1\r\n\r\n",
        PLAIN[0],
        [],
    ),
}

#: Requests the parser refuses: on both paths a 400 and nothing sent upstream (no smuggling).
REFUSED_REQUESTS = {
    "length and chunked": post(b"Host: h", b"Transfer-Encoding: chunked"),
    # a coding the engine would drop while re-framing the body (the upstream would read the
    # coded bytes as the body)
    "gzip, chunked": b"POST /v1/completions HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, "
    b"chunked\r\n\r\n%x\r\n%b\r\n0\r\n\r\n" % (len(JSON), JSON),
    "two lengths": post(b"Host: h", b"Content-Length: %d" % len(JSON)),
    "a length list": b"POST /v1/completions HTTP/1.1\r\nHost: h\r\n"
    b"Content-Length: %d, %d\r\n\r\n%b" % (len(JSON), len(JSON), JSON),
    "content-length with a sign": b"POST /v1/completions HTTP/1.1\r\nHost: h\r\n"
    b"Content-Length: +%d\r\n\r\n%b" % (len(JSON), JSON),
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
async def test_common_requests_go_up_rebuilt(name: str, path: Path) -> None:
    """Each request of the common shape, sent twice on new client connections over one pooled
    upstream connection: the upstream receives it with ``Host`` replaced, the fields the
    parser path drops removed and ``X-Forwarded-For`` last with the peer appended, the other
    fields in their order; the client receives the answer; the copy is handed over (a marked
    one is not). The fast path takes both."""
    raw, upstream, handed = COMMON_REQUESTS[name]
    run = await path.through([raw, raw], PLAIN)
    assert run.fast_requests == path.taken(2)
    assert run.upstream_got == [upstream] * 2
    assert run.client_got == PLAIN * 2
    assert run.handed == handed * 2
    assert run.counters == (2, {}, 0)
    assert run.connections == 1


@pytest.mark.parametrize("name", list(PARSER_REQUESTS))
async def test_other_requests_go_to_the_parser(name: str, path: Path) -> None:
    """A request outside the common shape never takes the fast path; the upstream receives
    it rebuilt (padding and tabs after the colon trimmed, hop-by-hop fields, proxy
    credentials and ``Expect`` dropped, a chunked body re-framed) and the client its answer
    (``Connection: close`` added when the request asked to close)."""
    raw, upstream, answer, handed = PARSER_REQUESTS[name]
    run = await path.through([raw], PLAIN)
    assert run.fast_requests == 0
    assert run.upstream_got == [upstream]
    assert run.client_got == [answer]
    assert run.handed == handed
    assert run.counters == (1, {}, 0)


@pytest.mark.parametrize("name", list(REFUSED_REQUESTS))
async def test_malformed_requests_are_refused(
    name: str, path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A request llhttp refuses (framing an upstream could read another way, control bytes,
    odd spellings) never takes the fast path: the parser's 400 with the connection closed,
    nothing sent upstream, ``bad_request`` counted (one log line, without the request's
    ``Authorization`` token or a traceback)."""
    raw = REFUSED_REQUESTS[name]
    line_end = raw.index(b"\n") + 1
    eol = raw[line_end - 2 : line_end] if raw[line_end - 2 : line_end] == b"\r\n" else b"\n"
    raw = raw[:line_end] + b"Authorization: Bearer sk-live-123" + eol + raw[line_end:]
    with caplog.at_level("DEBUG"):
        run = await path.through([raw], PLAIN)
    assert run.fast_requests == 0
    assert run.client_got == [BAD_400]
    assert run.upstream_got == []
    assert run.handed == []
    assert run.counters == (0, {}, 0)
    assert run.refused == {"bad_request": 1}
    assert [r.message for r in caplog.records] == ["connection refused"]
    assert all("sk-live-123" not in str(r.__dict__) for r in caplog.records)
    assert not [r for r in caplog.records if r.exc_info]


async def test_a_request_split_at_every_byte_goes_up_whole(path: Path) -> None:
    """A common request that reaches the engine in two reads, split at every byte, is never
    taken by the fast path (it needs the whole request in one read) and goes up exactly as
    the whole request does; every answer is relayed and every copy handed over."""
    raw, upstream, handed = COMMON_REQUESTS["forwarded before, category and id"]
    steps = [([raw[:i], raw[i:]], 1) for i in range(1, len(raw))]
    run = await path.through([], PLAIN, steps=steps)
    assert run.fast_requests == 0
    assert run.upstream_got == [upstream] * len(steps)
    assert run.client_got == PLAIN * len(steps)
    assert run.handed == handed * len(steps)
    assert run.counters == (len(steps), {}, 0)


#: name: (steps on one connection, fast requests taken, what the upstream receives, what is
#: handed over)
PIPELINES: dict[
    str, tuple[list[tuple[list[bytes], int]], int, list[bytes], list[tuple[object, ...]]]
] = {
    "two requests in one read": ([([ONE + ONE], 2)], 0, [ONE_SENT] * 2, [copy()] * 2),
    "a request and the start of the next in one read": (
        [([ONE + ONE[:30], ONE[30:]], 2)],
        0,
        [ONE_SENT] * 2,
        [copy()] * 2,
    ),
    "a request and the head of the next in one read": (
        [([ONE + ONE[:-5], ONE[-5:]], 2)],
        0,
        [ONE_SENT] * 2,
        [copy()] * 2,
    ),
    "a body that holds a whole request": (
        [([post(b"Host: h", body=ONE)], 1), ([ONE], 1)],
        2,
        [sent(body=ONE), ONE_SENT],
        [copy(ONE), copy()],
    ),
    "one after the other, then two at once": (
        [([ONE], 1), ([ONE], 1), ([ONE + ONE], 2)],
        2,
        [ONE_SENT] * 4,
        [copy()] * 4,
    ),
}


@pytest.mark.parametrize("name", list(PIPELINES))
async def test_pipelined_requests_are_answered_in_order(name: str, path: Path) -> None:
    """Pipelined requests on one connection: the fast path takes only a read holding exactly
    one whole request while nothing is queued; the upstream receives each request once, in
    order, and the client its answers in order."""
    steps, fast_taken, upstream, handed = PIPELINES[name]
    answers = sum(n for _, n in steps)
    run = await path.through([], PLAIN, steps=steps)
    assert run.fast_requests == path.taken(fast_taken)
    assert run.upstream_got == upstream
    assert run.client_got == PLAIN * answers
    assert run.handed == handed
    assert run.counters == (len(upstream), {}, 0)


UPGRADE = (
    b"GET /v1/models HTTP/1.1\r\nHost: h\r\nConnection: Upgrade, HTTP2-Settings\r\n"
    b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n"
)
#: name: (steps on one connection, what the upstream receives, answers the client receives)
UPGRADES: dict[str, tuple[list[tuple[list[bytes], int]], list[bytes], list[bytes]]] = {
    # the upstream receives a plain GET: Upgrade is hop-by-hop, not honoured
    "then a request in the next read": (
        [([UPGRADE], 1), ([ONE], 1)],
        [GET_SENT, ONE_SENT],
        PLAIN * 2,
    ),
    "then a request in the same read": (
        [([UPGRADE + ONE], 2)],
        [GET_SENT, ONE_SENT],
        PLAIN * 2,
    ),
    "with a body": (
        [([post(b"Host: h", b"Connection: Upgrade", b"Upgrade: h2c")], 1)],
        [],
        [BAD_400],
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
        [BAD_400],
    ),
}


@pytest.mark.parametrize("name", list(UPGRADES))
async def test_upgrade_requests_go_on_as_plain_ones_or_are_refused(
    name: str, path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``Upgrade`` is hop-by-hop and not honoured: the request goes up as a plain one and the
    connection stays HTTP/1.1, so a request after it (in the same read or the next) is
    answered too. llhttp reads no body after an upgrade request's head, so one with a body is
    refused (400, nothing sent up, logged as ``UpgradeWithBody``) rather than sent up without
    its body (a hang)."""
    steps, upstream, answers = UPGRADES[name]
    with caplog.at_level("WARNING"):
        run = await path.through([], PLAIN, steps=steps)
    assert run.upstream_got == upstream
    assert run.client_got == answers
    assert run.counters == (len(upstream), {}, 0)
    refused = {"bad_request": 1} if answers == [BAD_400] else {}
    assert run.refused == refused
    errors = [event_fields(r).get("error") for r in caplog.records if r.msg == "connection refused"]
    assert errors == (["UpgradeWithBody"] if refused else [])


async def test_trailer_fields_of_a_chunked_upload_go_nowhere(path: Path) -> None:
    """Trailer fields after a chunked request body are dropped (the body goes up re-framed,
    ending ``0``, empty line): they never join the head of the next request on the
    connection, whether that one takes the fast path or the parser path, and a marker among
    them does not keep the next request from being copied."""
    upload = (
        b"POST /v1/completions HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
        + chunk(JSON)
        + b"0\r\nX-Injected: evil\r\nX-Specwatch-Shadow: 1\r\n\r\n"
    )
    upload_sent = (
        b"POST /v1/completions HTTP/1.1\r\nHost: UPSTREAM\r\nTransfer-Encoding: chunked\r\n"
        b"X-Forwarded-For: 127.0.0.1\r\n\r\n" + chunk(JSON) + b"0\r\n\r\n"
    )
    run = await path.through([], PLAIN, steps=[([upload], 1), ([ONE], 1)])
    assert run.fast_requests == path.taken(1)
    assert run.upstream_got == [upload_sent, ONE_SENT]
    assert run.client_got == PLAIN * 2
    assert run.handed == [copy(), copy()]
    assert run.counters == (2, {}, 0)


async def test_endless_trailer_fields_are_cut_off(path: Path) -> None:
    """Trailer fields after a chunked upload are buffered by the parser until they end (and
    grow at a cost that rises with their square): past ``MAX_HEAD_BYTES`` of reads that carry
    no body byte the upload is cut off (answered ``431`` while no answer has started, counted
    as ``header_too_large``, handed over as an incomplete upload on a copied path)."""
    start = (
        b"POST /v1/completions HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
        + chunk(JSON)
        + b"0\r\nX-Endless: "
    )
    steps = [([start, b"a" * (MAX_HEAD_BYTES + 16384)], 1)]
    run = await path.through([], PLAIN, steps=steps, read=read_to_close)
    assert run.client_got[0].startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
    assert run.upstream_got == []
    assert run.refused == {"header_too_large": 1}
    assert run.handed == [("incomplete", True)]
    assert run.counters == (1, {}, 0)


@pytest.mark.parametrize("chunked", [False, True], ids=["length", "chunked"])
async def test_a_large_upload_is_not_mistaken_for_endless_framing(
    chunked: bool, path: Path
) -> None:
    """A 1 MiB upload written at once (reads far larger than ``MAX_HEAD_BYTES``, all body)
    goes up whole: the cap counts only reads without body bytes."""
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
    run = await path.through([], PLAIN, steps=[([raw], 1)])
    assert run.client_got == PLAIN
    (got,) = run.upstream_got
    relayed = got.split(b"\r\n\r\n", 1)[1]
    assert (dechunk(relayed) if chunked else relayed) == body
    assert run.refused == {}


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
    target: bytes, origin: bytes, path: Path
) -> None:
    """A request in absolute form (RFC 9112 §3.2.2: a server must accept it) goes up in
    origin form behind the upstream's prefix, as the same request in origin form would, and
    a copied path is handed over; the fast path leaves it to the parser."""
    run = await path.through([post(b"Host: h", path=target)], PLAIN)
    assert run.fast_requests == 0
    assert run.upstream_got == [sent(line=b"POST " + origin + b" HTTP/1.1")]
    assert run.handed == ([copy()] if origin.startswith(b"/v1") else [])


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
    first: bytes, after: bytes, path: Path
) -> None:
    """Bytes in the same read after a request that closes the connection (``Connection:
    close``, HTTP/1.0) are not processed (RFC 9112 §9.6): the request is answered, then the
    connection closed; nothing more goes up and nothing is refused (they cut the answer off
    before)."""
    run = await path.through([], PLAIN, steps=[([first + after], 1)], read=read_to_close)
    assert run.client_got == [CLOSE_HEAD + ANSWER]
    assert len(run.upstream_got) == 1
    assert run.refused == {}
    assert run.counters == (1, {}, 0)


@pytest.mark.parametrize(
    ("raw", "upstream", "fast_taken"),
    [
        (
            ONE,
            sent(
                b"User-Agent: t/1",
                b"Content-Type: application/json",
                line=b"POST /base/v1/completions HTTP/1.1",
            ),
            1,
        ),
        (
            post(b"Host: h", path=b"http://h/v1/completions"),
            sent(line=b"POST /base/v1/completions HTTP/1.1"),
            0,
        ),
        (
            b"OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n",
            b"OPTIONS * HTTP/1.1\r\nHost: UPSTREAM\r\nX-Forwarded-For: 127.0.0.1\r\n\r\n",
            0,
        ),
    ],
    ids=["origin form", "absolute form", "asterisk"],
)
async def test_the_upstream_prefix(
    raw: bytes, upstream: bytes, fast_taken: int, path: Path
) -> None:
    """An upstream URL with a base path (``http://host:port/base``): the request target goes
    up behind it, except ``*`` (a request about the server, not a path), which goes up as it
    is."""
    run = await path.through([raw], PLAIN, prefix="/base")
    assert run.fast_requests == path.taken(fast_taken)
    assert run.upstream_got == [upstream]
    assert run.client_got == PLAIN


def padded(head_length: int) -> bytes:
    """A common request whose head (up to and with its empty line) is ``head_length`` bytes."""
    short = post(b"Host: h", b"X-Pad: ")
    pad = head_length - short.index(b"\r\n\r\n") - 4
    return post(b"Host: h", b"X-Pad: " + b"p" * pad)


@pytest.mark.parametrize(("head_length", "fast_taken"), [(8191, 1), (8192, 1), (8193, 0)])
async def test_heads_near_the_fast_path_limit(
    head_length: int, fast_taken: int, path: Path
) -> None:
    """The fast path looks at heads of up to 8192 bytes; one byte longer goes to the parser.
    Either way the upstream receives the client's fields in order, with ``Host`` replaced and
    ``X-Forwarded-For`` last, and the client the answer."""
    raw = padded(head_length)
    assert raw.index(b"\r\n\r\n") + 4 == head_length
    run = await path.through([raw], PLAIN)
    assert run.fast_requests == path.taken(fast_taken)
    pad = raw.split(b"X-Pad: ")[1].split(b"\r\n")[0]
    assert run.upstream_got == [sent(b"X-Pad: " + pad)]
    assert run.client_got == PLAIN


@pytest.mark.parametrize(
    "head",
    [
        pytest.param(b"X-Big: " + b"a" * (MAX_HEAD_BYTES + 1), id="one long value"),
        pytest.param(b"X-Many: a\r\n" * (MAX_HEAD_BYTES // 11 + 1), id="many fields"),
    ],
)
async def test_a_head_past_the_cap_is_refused_before_it_ends(head: bytes, path: Path) -> None:
    """A request head that grows past ``MAX_HEAD_BYTES`` (64 KiB) is refused with ``431``
    while it is still coming (the engine does not keep buffering it, nor send it up), counted
    as ``header_too_large``. The client writes it in 8 KiB pieces and never ends it."""
    start = b"POST /v1/completions HTTP/1.1\r\nHost: h\r\n" + head
    pieces = [start[i : i + 8192] for i in range(0, len(start), 8192)]
    run = await path.through([], PLAIN, steps=[(pieces, 1)])
    assert run.client_got == [HEAD_431]
    assert run.upstream_got == []
    assert run.connections == 0
    assert run.refused == {"header_too_large": 1}


async def test_a_head_request_gets_the_head_of_an_answer_with_a_length(path: Path) -> None:
    """``HEAD``: the answer's ``Content-Length`` announces a body that never comes; the engine
    neither waits for it nor takes the fast answer path: the head is relayed as it is and the
    upstream connection is reused for a second ``HEAD`` on the same client connection."""
    head = b"HEAD /v1/models HTTP/1.1\r\nHost: h\r\n\r\n"
    only_head = [PLAIN[0][:HEAD_END]]
    run = await path.through([], only_head, steps=[([head], 1), ([head], 1)], read=read_head)
    assert run.fast_requests == run.fast_answers == 0
    assert run.client_got == only_head * 2
    assert (
        run.upstream_got
        == [b"HEAD /v1/models HTTP/1.1\r\nHost: UPSTREAM\r\nX-Forwarded-For: 127.0.0.1\r\n\r\n"] * 2
    )
    assert run.connections == 1


async def test_an_answer_before_the_request_body_is_in(path: Path) -> None:
    """The upstream answers as soon as the head is in, before the client sent the rest of its
    body: the fast answer path is not taken (the request is not complete); the answer is
    relayed, the upstream connection closed (its request was not finished, so the fake
    upstream records none) and no copy of the partial body handed over: it is counted as an
    incomplete upload (the connection is closed after the answer, the body never ends)."""
    cut = ONE.index(b"\r\n\r\n") + 4 + 10
    run = await path.through([], PLAIN, steps=[([ONE[:cut]], 1)], early=True)
    assert run.fast_requests == run.fast_answers == 0
    assert run.client_got == PLAIN
    assert run.upstream_got == []
    assert run.handed == [("incomplete", True)]
    assert run.counters == (1, {}, 0)


SSE = [
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
    chunk(b'data: {"a":1}\n\n'),
    chunk(b'data: {"a":2}\n\n') + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n",
]
ALL_SSE = b"".join(SSE)
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
OK_CHUNKED = OK + b"Transfer-Encoding: chunked\r\n\r\n"
#: name: (answer pieces, what the client receives for it (``None``: the answer's bytes
#: unchanged), fast path taken, upstream connections for two requests, upstream closes after
#: answering)
ANSWERS: dict[str, tuple[list[bytes], bytes | None, bool, int | None, bool]] = {
    "length, one piece": (PLAIN, None, True, 1, False),
    "length, body in three pieces": (
        [
            PLAIN[0][i:j]
            for i, j in ((0, HEAD_END + 5), (HEAD_END + 5, HEAD_END + 20), (HEAD_END + 20, None))
        ],
        None,
        True,
        1,
        False,
    ),
    "length, head split": ([PLAIN[0][:40], PLAIN[0][40:]], None, False, 1, False),
    "chunked SSE in pieces": (SSE, None, True, 1, False),
    "chunked in one piece": ([ALL_SSE], None, True, 1, False),
    "no length: read to close": (
        [b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall"],
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\nall",
        False,
        2,
        True,
    ),
    # hop-by-hop: the upstream's close is not the client's
    "connection close": (
        [b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"],
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        False,
        2,
        True,
    ),
    "keep-alive field": (
        [b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5\r\nContent-Length: 2\r\n\r\nok"],
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        False,
        1,
        False,
    ),
    "204": ([b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n"], None, False, 1, False),
    "http/1.0 answer": (
        [b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok"],
        None,
        False,
        2,
        True,
    ),
    "two lengths": (
        [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok"],
        BAD_GATEWAY,
        False,
        None,
        False,
    ),
    "bytes beyond the length": (
        [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA"],
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
        False,
        2,
        False,
    ),
    "1xx then 200 in one read": (
        [b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + PLAIN[0]],
        PLAIN[0],
        False,
        1,
        False,
    ),
    "1xx, then 200 in the next read": (
        [b"HTTP/1.1 100 Continue\r\n\r\n", PLAIN[0]],
        PLAIN[0],
        False,
        1,
        False,
    ),
    "chunk extensions and trailer fields": (
        [OK_CHUNKED + b"3;ext=1\r\nabc\r\n0\r\nX-Trailer: 1\r\n\r\n"],
        None,
        True,
        1,
        False,
    ),
    "chunked in capitals, padded": (
        [b"HTTP/1.1 200 OK\r\nTransfer-Encoding:  CHUNKED \r\n\r\n3\r\nabc\r\n0\r\n\r\n"],
        None,
        True,
        1,
        False,
    ),
    "gzip, chunked": (
        [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"],
        None,
        False,
        1,
        False,
    ),
    "length padded, leading zeros": (
        [OK + b"Content-Length:  002 \r\n\r\nok"],
        None,
        True,
        1,
        False,
    ),
    "length 0": ([OK + b"Content-Length: 0\r\n\r\n"], None, True, 1, False),
    "a body that looks like a last chunk": (
        [OK + b"Content-Length: 5\r\n\r\n0\r\n\r\n"],
        None,
        True,
        1,
        False,
    ),
    "a field value naming a length": (
        [OK + b"X-A: Content-Length: 9\r\nContent-Length: 2\r\n\r\nok"],
        None,
        True,
        1,
        False,
    ),
    "head over 16 KiB": (
        [OK + b"X-Big: " + b"a" * 20000 + b"\r\nContent-Length: 2\r\n\r\nok"],
        None,
        True,
        1,
        False,
    ),
    "204 with a length": (
        [b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n"],
        None,
        False,
        1,
        False,
    ),
    "304 with a length": (
        [b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n"],
        None,
        False,
        1,
        False,
    ),
    "no reason phrase": ([b"HTTP/1.1 200\r\nContent-Length: 2\r\n\r\nok"], None, False, 1, False),
    "status 600": ([b"HTTP/1.1 600 X\r\nContent-Length: 2\r\n\r\nok"], None, False, 1, False),
    "upgrade field": (
        [OK + b"Upgrade: h2c\r\nContent-Length: 2\r\n\r\nok"],
        OK + b"Content-Length: 2\r\n\r\nok",
        False,
        1,
        False,
    ),
    "head split inside its last CRLF CRLF": (
        [OK + b"Content-Length: 2\r\n\r", b"\nok"],
        None,
        False,
        1,
        False,
    ),
    # malformed answers: a clean 502, the connection not reused
    "chunked and a length": (
        [
            OK_CHUNKED.replace(b"\r\n\r\n", b"\r\nContent-Length: 3\r\n\r\n")
            + b"3\r\nabc\r\n0\r\n\r\n"
        ],
        BAD_GATEWAY,
        False,
        2,
        False,
    ),
    "bad chunk size in the first read": (
        [OK_CHUNKED + b"zz\r\nabc\r\n0\r\n\r\n"],
        BAD_GATEWAY,
        False,
        2,
        False,
    ),
    "a length list": ([OK + b"Content-Length: 2, 2\r\n\r\nok"], BAD_GATEWAY, False, 2, False),
    "length with a sign": ([OK + b"Content-Length: +2\r\n\r\nok"], BAD_GATEWAY, False, 2, False),
    "length past 2**64": (
        [OK + b"Content-Length: 99999999999999999999\r\n\r\nok"],
        BAD_GATEWAY,
        False,
        2,
        False,
    ),
    "bare LF line ends": (
        [b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok"],
        BAD_GATEWAY,
        False,
        2,
        False,
    ),
    "obs-fold continuation": (
        [OK + b"X-A: a\r\n b\r\nContent-Length: 2\r\n\r\nok"],
        BAD_GATEWAY,
        False,
        2,
        False,
    ),
    "NUL in a value": (
        [OK + b"X-A: a\x00b\r\nContent-Length: 2\r\n\r\nok"],
        BAD_GATEWAY,
        False,
        2,
        False,
    ),
    "space before the colon": (
        [OK + b"Content-Length : 2\r\n\r\nok"],
        BAD_GATEWAY,
        False,
        2,
        False,
    ),
    "lower-case version": (
        [b"http/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"],
        BAD_GATEWAY,
        False,
        2,
        False,
    ),
}


@pytest.mark.parametrize("name", list(ANSWERS))
async def test_answers_reach_the_client(name: str, path: Path) -> None:
    """Each answer, relayed for two requests, takes the fast path exactly when it has the
    common shape, and reaches the client as its bytes unchanged, or without the fields a
    proxy drops (``Connection: close`` added where the client connection closes after it),
    or as the engine's 502 for a malformed one; the upstream connections are reused or not
    as the answer allows."""
    answer, relayed, takes_fast_path, connections, close_after = ANSWERS[name]
    run = await path.through([ONE, ONE], answer, close_after=close_after)
    assert run.fast_answers == path.taken(2 if takes_fast_path else 0)
    assert run.client_got == [b"".join(answer) if relayed is None else relayed] * 2
    assert run.upstream_got == [ONE_SENT] * 2
    assert run.counters == (2, {"client_error": 2} if relayed == BAD_GATEWAY else {}, 0)
    if connections is not None:
        assert run.connections == connections


@pytest.mark.parametrize("whole", [PLAIN[0], ALL_SSE], ids=["length", "chunked"])
async def test_an_answer_split_at_every_byte_comes_out_whole(whole: bytes, path: Path) -> None:
    """An answer that reaches the engine in two reads, split at every byte: the fast path
    takes it exactly when the first read holds the whole head; either way the client receives
    the answer's bytes unchanged and the upstream connection is reused for the next request."""
    head_end = whole.index(b"\r\n\r\n") + 4
    splits = [[whole[:i], whole[i:]] for i in range(1, len(whole))]
    steps = [([ONE], 1)] * len(splits)
    run = await path.through([], PLAIN, steps=steps, per_request=splits)
    assert run.fast_answers == path.taken(len(whole) - head_end)
    assert run.client_got == [whole] * len(splits)
    assert run.connections == 1
    assert run.counters == (len(splits), {}, 0)


SECOND = b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nSMUGGLED"
#: the chunked answer as the parser path rewrites a head it has not sent yet
CLOSE_SSE = ALL_SSE.replace(b"chunked\r\n", b"chunked\r\nConnection: close\r\n", 1)
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
    # answer); the fast path has relayed the head before it sees the extra bytes, the parser
    # path rewrites a head it has not sent yet with "Connection: close"
    "bytes beyond the last chunk": ([ALL_SSE + b"EXTRA"], ALL_SSE + b"EXTRA", CLOSE_SSE + b"EXTRA"),
    "a second answer after the last chunk": (
        [ALL_SSE + SECOND],
        ALL_SSE + SECOND,
        CLOSE_SSE + SECOND,
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


@pytest.mark.parametrize("name", list(STRAY))
async def test_bytes_after_an_answer_never_reach_a_kept_client_connection(
    name: str, path: Path
) -> None:
    """An upstream that sends more than one answer (stray bytes, or a whole second answer)
    must not desynchronise the client: after such an answer the client connection is closed
    (the stray bytes can never be read as the answer to its next request) and the upstream
    connection is not reused; an answer with a length is cut at its length."""
    answer, on_fast, on_parser = STRAY[name]
    run = await path.through([ONE, ONE], answer, read=read_to_close)
    assert run.client_got == [on_fast if path.fast else on_parser] * 2
    assert run.connections == 2
    assert run.counters == (2, {}, 0)
