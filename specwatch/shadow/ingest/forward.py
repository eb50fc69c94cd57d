"""The shadow proxy's HTTP/1.1 forwarding engine: asyncio ``Protocol``s, ``httptools`` (llhttp)
parsing both ways, a pooled keep-alive upstream, responses relayed as bytes.

:class:`Forwarder` listens on one port. Per client connection (:class:`_Client`) each request
head is parsed, rebuilt without hop-by-hop fields (RFC 9110 §7.6.1: ``Connection`` and every
field it lists, ``Keep-Alive``, ``Proxy-Connection``, ``TE``, ``Trailer``, ``Upgrade``), proxy
credentials, ``Host`` (set to the upstream's) and ``Expect`` (``100 Continue`` is answered here),
with ``X-Forwarded-For`` appended (``Upgrade`` is not honoured: the request goes up as a plain
one; one with a body is refused with ``400``, as llhttp reads no body after its head), and
written with the body to an idle keep-alive upstream connection (:class:`_Upstream`, a new one
when none is idle). A chunked request body is re-framed chunk by chunk as it arrives (trailer
fields dropped); a body of known length is passed on as it arrives.

The upstream's answer is relayed **as bytes**: its head verbatim unless a field must go (then
rebuilt from the parsed fields), then every body byte (chunked framing and SSE events included)
written to the client as it arrives. Bytes after the answer's end (a misbehaving upstream) are
cut at the length of an answer that has one; after a chunked one they are relayed with the read
that holds its end; either way neither connection is reused, so they are never read as the
client's next answer. The response parser only finds where the answer ends, so the
upstream connection can be reused; an answer with neither length nor chunking ends when the
upstream closes, and the client connection is closed after it.

Fast paths (the common case, no parser callbacks): a read holding exactly one whole request of
the common shape (origin-form HTTP/1.1 request line, ``Name: value`` fields, at most one
``Content-Length`` and a body of that length, no field the parser path would drop besides
``Host``, ``Connection: keep-alive`` and ``X-Forwarded-For``) is forwarded from the raw bytes by
:meth:`_Client.fast_request`; an answer whose first read holds a whole well-formed head with a
final status, no field to drop and one ``Content-Length`` or ``Transfer-Encoding: chunked`` is
relayed at once by :meth:`_Exchange.fast_answer` (a chunked one's end is found by llhttp with a
single callback). Everything else goes through llhttp's parsers as described above; a test
holds both paths to the same bytes. Live writes come before any bookkeeping: the request goes
up before its shadow copy is handed over and before its answer deadline is set.

Fail-open: before the answer starts, an unreachable upstream is ``502`` (``connect``), a timeout
``504`` (``timeout``), a connection closed early ``502`` (``disconnected``), a malformed answer
``502`` (``client_error``), each a small JSON body; after it starts, the client connection is
aborted so the client sees a truncated answer, never a clean short one. A client that goes away
closes the upstream connection (counted in ``proxy_client_disconnects``). Listener limits
(:class:`~specwatch.core.listen.ListenLimits`): connection cap (``503``), request head within
``header_timeout_seconds``, body pauses up to ``body_timeout_seconds`` (``408``), idle keep-alive
``keepalive_timeout_seconds``; refusals counted in :class:`~specwatch.core.listen.ListenerStats`.
Pipelined requests are answered in order (one at a time; reading pauses while one waits). Nothing
from a request head is ever logged (it may carry credentials).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import ssl
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, cast
from urllib.parse import urlsplit

import httptools

from specwatch.core.listen import ListenerStats, ListenLimits
from specwatch.core.logs import log_event
from specwatch.shadow.ingest.offer import IngestCounters

__all__ = [
    "HOP_BY_HOP",
    "MAX_HEAD_BYTES",
    "PROXY_CREDENTIALS",
    "Forwarder",
    "Handover",
    "Upstream",
]

log = logging.getLogger("specwatch.shadow.ingest")

#: RFC 9110 §7.6.1 connection-specific fields, plus the legacy ``Proxy-Connection``.
HOP_BY_HOP: frozenset[str] = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "transfer-encoding",
        "upgrade",
        "trailer",
    }
)
#: Credentials meant for a proxy, never for the next hop (RFC 9110 §11.7): dropped both ways.
PROXY_CREDENTIALS: frozenset[str] = frozenset(
    {"proxy-authorization", "proxy-authenticate", "proxy-authentication-info"}
)
#: An idle upstream connection is not reused after this many seconds (uvicorn, vLLM's server,
#: closes idle keep-alive connections after 5 s; reusing one it is closing fails the request).
POOL_IDLE_SECONDS = 4.0
#: Idle upstream connections kept at most (more are closed when released).
POOL_MAX_IDLE = 256
#: Longest request head accepted (request line and fields); a longer one is refused with ``400``
#: (``bad_request``) while it is still coming, so a client cannot make the proxy buffer more.
MAX_HEAD_BYTES = 64 << 10
#: Request bytes kept to resend on a fresh connection when a reused one turns out closed before
#: any answer byte; a request larger than this is not resent (answered ``502``).
RESEND_MAX_BYTES = 64 << 10

_B_DROP_REQUEST = frozenset(
    n.encode() for n in (HOP_BY_HOP | PROXY_CREDENTIALS | {"host", "expect", "x-forwarded-for"})
)
_B_DROP_RESPONSE = frozenset(n.encode() for n in (HOP_BY_HOP | PROXY_CREDENTIALS))
_CRLF = b"\r\n"
#: The common answer relayed without the response parser (see :meth:`_Exchange.fast_answer`):
#: an HTTP/1.1 status line with a final status and well-formed fields (linear-time pattern).
_TCHAR = rb"[!#$%&'*+.^_`|~0-9A-Za-z-]"
_FAST_ANSWER = re.compile(
    rb"HTTP/1\.1 ([2-5][0-9][0-9]) [\t\x20-\x7e\x80-\xff]*\r\n(?:"
    + _TCHAR
    + rb"+:[\t\x20-\x7e\x80-\xff]*\r\n)*\r\n"
)
#: Fields that keep an answer off the fast path (or give its length), with their values.
_ANSWER_FIELDS = re.compile(
    rb"\n(content-length|connection|keep-alive|proxy-connection|proxy-authenticate|"
    rb"proxy-authentication-info|proxy-authorization|te|trailer|transfer-encoding|upgrade):"
    rb"([^\r]*)",
    re.IGNORECASE,
)
_DIGITS = re.compile(rb"[0-9]{1,18}")
#: The common request forwarded without the request parser (see :meth:`_Client.fast_request`):
#: an origin-form HTTP/1.1 request line and fields written ``Name: value`` with no padding
#: around the value (so the head rebuilt from the raw bytes equals the parser path's byte for
#: byte); a word-by-word value pattern keeps the match linear in the head's length.
_FIELD_VALUE = rb"(?:[\x21-\x7e\x80-\xff]+(?:[ \t]+[\x21-\x7e\x80-\xff]+)*)?"
_FAST_REQUEST = re.compile(
    rb"(GET|POST|PUT|PATCH|DELETE|OPTIONS) (/[\x21-\x7e]*) HTTP/1\.1\r\n((?:"
    + _TCHAR
    + rb"+: "
    + _FIELD_VALUE
    + rb"\r\n)*)\r\n"
)
#: The scheme and authority of a request target in absolute form (``http://host:port``).
_ABSOLUTE_FORM = re.compile(rb"[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*")
#: Longest request head the fast path looks at (a longer one takes the parser path).
_FAST_HEAD_MAX = 8192
#: Request fields the fast path drops itself (others the parser path drops send it there).
_FAST_DROPPED = re.compile(rb"^(?:host|connection|x-forwarded-for): [^\r]*\r\n", re.I | re.M)
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_LIMIT_503 = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
_BAD_400 = b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
_TIMEOUT_408 = (
    b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Type: text/plain\r\n"
    b"Content-Length: 26\r\n\r\nrequest body read timeout\n"
)


class _HeadTooLarge(Exception):
    """A request head, or a body's framing and trailer fields with no body bytes, grew past
    :data:`MAX_HEAD_BYTES` (a 400, or the connection aborted once a request is under way)."""


class _OtherTransferCoding(Exception):
    """A request's ``Transfer-Encoding`` names a coding besides ``chunked`` (a 400)."""


class _UpgradeWithBody(Exception):
    """An ``Upgrade`` request with a body (raised in a parser callback: a 400)."""


class Handover(Protocol):
    """What the engine hands to the shadow side (each call returns at once, never raises)."""

    def copy(self, path: str, raw: bytes, category: str | None, request_id: str | None) -> None:
        """A complete request body under the cap on a shadowed path."""

    def too_large(self) -> None:
        """A shadowed request body grew past the cap (no copy)."""

    def incomplete(self, shadow: bool) -> None:
        """A client's upload stopped before its end (``shadow``: on a shadowed path)."""

    def marked(self) -> None:
        """A ``POST`` to a shadowed path carried the shadow marker (not copied)."""


@dataclass(frozen=True, slots=True)
class Upstream:
    """Where and how to forward: ``host``/``port``/``tls`` of the live server, ``prefix`` its
    base path (bytes, no trailing ``/``), ``host_header`` the ``Host`` value sent,
    ``connect_timeout`` and ``total_timeout`` seconds (``None``: no total limit)."""

    host: str
    port: int
    tls: bool
    prefix: bytes
    host_header: bytes
    connect_timeout: float
    total_timeout: float | None

    @classmethod
    def parse(cls, url: str, connect_timeout: float, total_timeout: float | None) -> Upstream:
        """From ``http[s]://host[:port][/prefix]``; raises ``ValueError`` on another scheme."""
        u = urlsplit(url.rstrip("/"))
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError("upstream must be an http:// or https:// URL")
        tls = u.scheme == "https"
        port = u.port or (443 if tls else 80)
        netloc = u.netloc.rsplit("@", 1)[-1]
        return cls(
            u.hostname,
            port,
            tls,
            u.path.encode(),
            netloc.encode("idna"),
            connect_timeout,
            total_timeout,
        )


def connection_tokens(values: Iterable[bytes]) -> set[bytes]:
    """Lower-cased field names listed in ``Connection`` values (``close`` and ``keep-alive``
    included)."""
    out: set[bytes] = set()
    for v in values:
        for tok in v.split(b","):
            tok = tok.strip().lower()
            if tok:
                out.add(tok)
    return out


def _json_error(status: int, reason: str, message: str, close: bool) -> bytes:
    body = json.dumps({"error": {"message": message}}).encode()
    conn = b"Connection: close\r\n" if close else b""
    return (
        b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n"
        % (status, reason.encode(), len(body), conn)
    ) + body


def _head_end(buf: bytes | bytearray) -> int:
    """Offset just past the empty line that ends a message head in ``buf`` (``-1``: none yet).
    Bare LF line ends count, as llhttp accepts them."""
    i = buf.find(b"\n\r\n")
    j = buf.find(b"\n\n")
    if i < 0:
        return j + 2 if j >= 0 else -1
    if j < 0 or i < j:
        return i + 3
    return j + 2


class Forwarder:
    """The listening engine (see the module docstring). ``counters.proxy_*`` are updated here;
    copies and body errors go to ``handover``.

    ``shadow_paths``: request paths (without query) whose ``POST`` is copied unless it carries
    ``marker`` (lower-cased header name, bytes); ``max_body_bytes`` caps the copy. Call
    :meth:`start` then :meth:`stop` on one event loop."""

    def __init__(
        self,
        upstream: Upstream,
        handover: Handover,
        *,
        counters: IngestCounters,
        limits: ListenLimits,
        stats: ListenerStats,
        shadow_paths: frozenset[str],
        marker: bytes,
        category_header: bytes,
        request_id_header: bytes,
        max_body_bytes: int,
    ) -> None:
        self.up = upstream
        self.handover = handover
        self.counters = counters
        self.limits = limits
        self.stats = stats
        self.shadow_paths = frozenset(p.encode() for p in shadow_paths)
        self.marker = marker.lower()
        self.category_header = category_header.lower()
        self.request_id_header = request_id_header.lower()
        self.max_body = max_body_bytes
        #: the fast paths on (off: every request and answer goes through the parsers, as a test
        #: that holds the two paths to the same bytes does)
        self.fast = True
        named = sorted(
            {
                *_B_DROP_REQUEST,
                b"content-length",
                self.marker,
                self.category_header,
                self.request_id_header,
            }
        )
        #: the request fields the fast path looks at, with their values
        self.fast_fields = re.compile(
            rb"\n(" + b"|".join(re.escape(n) for n in named) + rb"): ([^\r]*)", re.I
        )
        self.clients: set[_Client] = set()
        self.idle: list[_Upstream] = []
        self._server: asyncio.AbstractServer | None = None
        self._ssl: ssl.SSLContext | None = ssl.create_default_context() if upstream.tls else None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._drained: asyncio.Event | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: any free port); returns the bound port. Raises
        ``OSError`` when it cannot bind."""
        loop = self.loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Client(self), host, port, reuse_address=True, backlog=1024
        )
        sock = self._server.sockets[0]
        return int(sock.getsockname()[1])

    async def stop(self, grace_seconds: float) -> None:
        """Stop accepting, close idle client connections, let requests in progress finish for
        up to ``grace_seconds``, then abort what is left and close the upstream pool."""
        if self._server is not None:
            self._server.close()
        for c in list(self.clients):
            c.stop_when_idle()
        if self.clients:
            self._drained = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drained.wait(), grace_seconds)
        for c in list(self.clients):
            c.abort()
        for u in self.idle:
            u.close()
        self.idle.clear()
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            self._server = None

    def client_gone(self, c: _Client) -> None:
        self.clients.discard(c)
        if self._drained is not None and not self.clients:
            self._drained.set()

    # -- the upstream pool ----------------------------------------------------------------------

    def take_idle(self) -> _Upstream | None:
        """The most recently released live upstream connection, or ``None``."""
        assert self.loop is not None
        now = self.loop.time()
        while self.idle:
            u = self.idle.pop()
            if u.closed or now - u.idle_since > POOL_IDLE_SECONDS:
                u.close()
                continue
            return u
        return None

    def release(self, u: _Upstream) -> None:
        """Return ``u`` to the pool (closed instead when the pool is full)."""
        assert self.loop is not None
        if u.closed or len(self.idle) >= POOL_MAX_IDLE or self._server is None:
            u.close()
            return
        u.exchange = None
        u.unpause()
        if u.transport is not None:
            u.transport.resume_reading()  # a slow client may have paused it
        u.idle_since = self.loop.time()
        self.idle.append(u)

    async def connect(self) -> _Upstream:
        """A new upstream connection; raises ``OSError`` or ``TimeoutError``."""
        loop = asyncio.get_running_loop()
        up = self.up
        _, proto = await asyncio.wait_for(
            loop.create_connection(
                lambda: _Upstream(self),
                up.host,
                up.port,
                ssl=self._ssl,
                server_hostname=up.host if self._ssl is not None else None,
            ),
            up.connect_timeout,
        )
        return proto

    def upstream_error(self, reason: str, started: bool) -> None:
        self.counters.proxy_upstream_errors[reason] += 1
        log_event(log, logging.WARNING, "proxy upstream failed", reason=reason, prepared=started)


class _Upstream(asyncio.Protocol):
    """One keep-alive connection to the upstream; feeds what it reads to its exchange."""

    def __init__(self, fwd: Forwarder) -> None:
        self.fwd = fwd
        self.transport: asyncio.Transport | None = None
        self.exchange: _Exchange | None = None
        self.closed = False
        self.idle_since = 0.0
        self.paused_client: _Client | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        ex = self.exchange
        if ex is None:  # nothing asked: an idle connection must not talk
            self.close()
            return
        ex.response_data(data)

    def eof_received(self) -> bool | None:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.unpause()
        ex = self.exchange
        self.exchange = None
        if ex is not None:
            ex.upstream_lost()

    def pause_writing(self) -> None:
        ex = self.exchange
        if ex is not None and self.paused_client is None:
            self.paused_client = ex.client
            ex.client.pause_reading()

    def resume_writing(self) -> None:
        self.unpause()

    def unpause(self) -> None:
        """Let the client this connection paused (its upload outran the upstream) read on."""
        c, self.paused_client = self.paused_client, None
        if c is not None:
            c.resume_reading()

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class _AfterEnd(Exception):
    """An answer began after the one asked for (raised in a parser callback: the parser stops
    with an error, handled as bytes after the end)."""


class _AnswerEnd:
    """The response parser's protocol on the fast path of a chunked answer: only the end."""

    __slots__ = ("ex",)

    def __init__(self, ex: _Exchange) -> None:
        self.ex = ex

    def on_message_begin(self) -> None:
        if self.ex.resp_done:
            raise _AfterEnd

    def on_message_complete(self) -> None:
        self.ex.resp_done = True


class _Exchange:
    """One request and its answer; the response parser's protocol. Fields an exchange may
    never change keep their class default (fewer stores on the live path)."""

    up: _Upstream | None = None
    up_head: bytes = b""
    path: bytes = b""
    shadow: bool = False
    copy: bytearray | None = None
    cap_hit: bool = False
    category: str | None = None
    request_id: str | None = None
    chunked_req: bool = False
    body_done: bool = False
    is_head: bool = False
    keep_client: bool = True
    client_http10: bool = False
    expect_continue: bool = False
    started: bool = False
    head_done: bool = False
    resp_done: bool = False
    resp_framing: str = ""
    dechunk: bool = False
    ended: bool = False
    up_keep: bool = False
    reused: bool = False
    resend_size: int = 0
    r_parser: httptools.HttpResponseParser | None = None
    r_reason: bytes = b""
    r_interim: bool = False
    deadline = 0.0  # loop time by which the answer must be complete (0: none)
    connect_task: asyncio.Task[None] | None = None
    fast_left: int = 0

    def __init__(self, client: _Client) -> None:
        self.client = client
        self.fwd = client.fwd
        self.pending: list[bytes] | None = []
        self.early: list[bytes] = []
        self.resend: list[bytes] | None = []
        self.rbuf = bytearray()
        self.r_headers: list[tuple[bytes, bytes]] = []

    # -- request side ---------------------------------------------------------------------------

    def send_up(self, data: bytes) -> None:
        if self.resend is not None:
            self.resend.append(data)
            self.resend_size += len(data)
            if self.resend_size > RESEND_MAX_BYTES:
                self.resend = None
        if self.pending is not None:
            self.pending.append(data)
        elif self.up is not None:
            self.up.write(data)

    def body(self, data: bytes) -> None:
        if self.chunked_req:
            self.send_up(b"%x\r\n%b\r\n" % (len(data), data))
        else:
            self.send_up(data)
        copy = self.copy
        if copy is not None:
            copy += data
            if len(copy) > self.fwd.max_body:
                self.copy = None
                self.fwd.handover.too_large()

    def request_complete(self) -> None:
        self.body_done = True
        if self.chunked_req:
            self.send_up(b"0\r\n\r\n")
        if self.copy:  # an empty body is not offered (nothing to replay)
            self.fwd.handover.copy(
                self.path.decode("latin-1"), bytes(self.copy), self.category, self.request_id
            )
            self.copy = None
        if self.resp_done:
            self.finish()

    def begin(self) -> None:
        """This exchange is first in its client's queue: get an upstream connection."""
        fwd = self.fwd
        c = self.client
        if self.expect_continue and c.transport is not None:
            c.transport.write(_CONTINUE)
        up = fwd.take_idle()
        if up is not None:
            self.reused = True
            self.attach(up)  # the request goes up here, before the timer is set
        else:
            self.connect_task = asyncio.ensure_future(self._connect())
        total = fwd.up.total_timeout
        if total is not None and not self.ended:
            assert fwd.loop is not None
            self.deadline = fwd.loop.time() + total
            c.arm_deadline(self.deadline)

    async def _connect(self) -> None:
        try:
            up = await self.fwd.connect()
        except TimeoutError:
            self.connect_task = None
            self.fail("timeout", 504)
            return
        except OSError:
            self.connect_task = None
            self.fail("connect", 502)
            return
        self.connect_task = None
        if self.resp_done or self.client.gone:
            self.fwd.release(up)
            return
        self.reused = False
        self.attach(up)

    def attach(self, up: _Upstream) -> None:
        self.up = up
        up.exchange = self
        self.r_parser = None  # made on the first answer bytes the fast path does not take
        pending, self.pending = self.pending, None
        if pending:
            up.write(b"".join(pending) if len(pending) > 1 else pending[0])

    # -- response side: the parser's callbacks ---------------------------------------------------

    def on_message_begin(self) -> None:
        if self.resp_done:  # a second answer after this one: bytes after the end
            raise _AfterEnd

    def on_status(self, status: bytes) -> None:
        if not self.r_interim:
            self.r_reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.r_interim:
            self.r_headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self.r_interim:  # what follows a 1xx is parsed again by a fresh parser
            return
        assert self.r_parser is not None
        code = self.r_parser.get_status_code()
        if 100 <= code < 200:
            self.r_interim = True
            return
        self.head_done = True
        # read now: llhttp resets its flags once the message is complete
        self.up_keep = self.r_parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        if not self.client_http10:
            return
        if not self.started:
            self.early.append(body)
        elif self.dechunk and self.client.transport is not None:
            self.client.transport.write(body)

    def on_message_complete(self) -> None:
        if self.r_interim:
            return
        self.resp_done = True

    # -- response side: bytes from the upstream --------------------------------------------------

    def response_data(self, data: bytes) -> None:
        if self.resp_done:  # more after the end: this connection is not reused
            if self.up is not None:
                self.up.close()
            return
        if self.fast_left:
            self.fast_body(data)
            return
        parser = self.r_parser
        if parser is None:
            if not self.rbuf and self.fwd.fast and self.fast_answer(data):
                return
            parser = self.r_parser = httptools.HttpResponseParser(self)
        self.resend = None
        if self.head_done:
            if not self.dechunk:
                t = self.client.transport
                if t is not None:
                    t.write(data)
            if self.resp_framing in ("length", "chunked") and not self.feed(parser, data):
                return
            if self.resp_done:
                self.finish()
            return
        self.rbuf += data
        if not self.feed(parser, data):
            return
        if self.r_interim:  # a 1xx answer: dropped, the real one follows
            end = _head_end(self.rbuf)
            rest = bytes(self.rbuf[end:]) if end >= 0 else b""
            self.rbuf = bytearray()
            self.r_headers = []
            self.r_reason = b""
            self.r_interim = False
            self.resp_done = False
            self.r_parser = httptools.HttpResponseParser(self)
            if rest:
                self.response_data(rest)
            return
        if self.head_done:
            self.send_head()

    def feed(self, parser: httptools.HttpResponseParser, data: bytes) -> bool:
        """Feed answer bytes to the response parser; ``False`` when they are malformed before
        the answer's end (the exchange has failed: ``502``, or a cut connection once started).
        Bytes after a whole answer are relayed with their read, then neither connection is
        reused, so they can never be read as the client's next answer."""
        try:
            parser.feed_data(data)
        except httptools.HttpParserError:
            if not self.resp_done:
                self.fail("client_error", 502)
                return False
            self.up_keep = self.keep_client = False
        return True

    def fast_answer(self, data: bytes) -> bool:
        """Relay the first bytes of the answer at once, without the response parser's field
        callbacks, when they hold a whole well-formed head that needs no change (a final status
        other than 204/304, none of the fields :data:`_B_DROP_RESPONSE` names, and either one
        ``Content-Length`` with no more than that many body bytes, counted here, or
        ``Transfer-Encoding: chunked``, whose end llhttp finds), for a keep-alive HTTP/1.1
        client whose request is complete. ``False`` (nothing done) sends the answer down the
        parser path, which handles every other case."""
        if self.is_head or not self.keep_client or self.client_http10 or not self.body_done:
            return False
        m = _FAST_ANSWER.match(data)
        if m is None:
            return False
        fields = _ANSWER_FIELDS.findall(data, 0, m.end())
        if len(fields) != 1 or m.group(1) in (b"204", b"304"):
            return False
        name, value = fields[0][0].lower(), fields[0][1].strip(b" \t")
        t = self.client.transport
        if name == b"transfer-encoding" and value.lower() == b"chunked":
            # relayed as it comes; llhttp finds the end, with one callback (not one per chunk).
            # The first read is parsed before it is relayed: malformed framing in it goes to
            # the parser path, which answers a clean 502 as nothing has been sent yet.
            parser = httptools.HttpResponseParser(_AnswerEnd(self))
            keep = True
            try:
                parser.feed_data(data)
            except httptools.HttpParserError:
                if not self.resp_done:
                    return False
                keep = False  # bytes after the end: relayed, then both connections closed
            if t is not None:
                t.write(data)
            self.r_parser = parser
            self.resend = None
            self.head_done = self.started = True
            self.resp_framing = "chunked"
            self.up_keep = keep
            if not keep:
                self.keep_client = False
            if self.resp_done:
                self.finish()
            return True
        digits = _DIGITS.fullmatch(value) if name == b"content-length" else None
        if digits is None:
            return False
        left = int(digits.group()) - (len(data) - m.end())
        if left < 0:  # bytes beyond the answer: the parser path decides
            return False
        self.resend = None
        self.head_done = self.started = True
        self.resp_framing = "length"
        self.up_keep = True
        if t is not None:
            t.write(data)
        if left:
            self.fast_left = left
        else:
            self.resp_done = True
            self.finish()
        return True

    def fast_body(self, data: bytes) -> None:
        """More body of an answer with a length: relayed up to its length; bytes beyond it are
        dropped and neither connection is reused (the upstream is out of step)."""
        left = self.fast_left
        t = self.client.transport
        if len(data) > left:
            data = data[:left]
            self.up_keep = self.keep_client = False
        left -= len(data)
        self.fast_left = left
        if t is not None:
            t.write(data)
        if not left:
            self.resp_done = True
            self.finish()

    def send_head(self) -> None:
        parser = self.r_parser
        assert parser is not None
        code = parser.get_status_code()
        end = _head_end(self.rbuf)
        if end < 0:
            self.fail("client_error", 502)
            return
        names = [n.lower() for n, _ in self.r_headers]
        drop = set(_B_DROP_RESPONSE)
        drop.discard(b"transfer-encoding")
        conn = [v for n, v in zip(names, self.r_headers, strict=True) if n == b"connection"]
        if conn:
            drop |= connection_tokens(v[1] for v in conn)
        chunked = False
        has_length = False
        length = -1
        for n, (_, v) in zip(names, self.r_headers, strict=True):
            if n == b"transfer-encoding" and b"chunked" in v.lower():
                chunked = True
            elif n == b"content-length":
                has_length = True
                digits = _DIGITS.fullmatch(v.strip(b" \t"))
                length = int(digits.group()) if digits is not None else -1
        if self.is_head or code in (204, 304):
            framing = "none"
        elif chunked:
            framing = "chunked"
        elif has_length:
            framing = "length"
        else:
            framing = "close"
        self.resp_framing = framing
        if framing == "close":
            self.keep_client = False
        if framing == "chunked" and self.client_http10:
            self.dechunk = True
            self.keep_client = False
            drop.add(b"transfer-encoding")
        raw = self.rbuf
        self.rbuf = bytearray()
        if framing == "length" and length >= 0:
            # an answer with a length is relayed up to its length, the rest counted as it comes
            # (as on the fast path): bytes beyond it never reach the client
            if len(raw) - end >= length:
                del raw[end + length :]
            else:
                self.fast_left = length - (len(raw) - end)
        rewrite = not self.keep_client or any(n in drop for n in names)
        self.started = True
        t = self.client.transport
        if t is None:
            return
        if not rewrite:  # the upstream's own head and first body bytes, verbatim
            t.write(bytes(raw))
        else:
            parts = [b"HTTP/1.1 %d %s\r\n" % (code, self.r_reason)]
            for n, (name, value) in zip(names, self.r_headers, strict=True):
                if n not in drop:
                    parts.append(name + b": " + value + _CRLF)
            if not self.keep_client:
                parts.append(b"Connection: close\r\n")
            parts.append(_CRLF)
            parts.append(b"".join(self.early) if self.dechunk else bytes(raw[end:]))
            t.write(b"".join(parts))
        if framing == "none":
            self.resp_done = True
        if self.resp_done:
            self.finish()

    # -- ends ------------------------------------------------------------------------------------

    def timed_out(self) -> None:
        if not self.resp_done:
            self.fail("timeout", 504)

    def finish(self) -> None:
        """The answer is complete: release or close the upstream connection, then let the
        client go on (or close it)."""
        if self.ended:
            return
        self.ended = True
        if not self.body_done:
            # the upstream answered before the whole request arrived: the client connection
            # is out of step now; close it after the answer
            self.keep_client = False
        up = self.up
        self.up = None
        if up is not None:
            reusable = self.body_done and self.resp_framing != "close" and self.up_keep
            if reusable:
                self.fwd.release(up)
            else:
                up.exchange = None
                up.close()
        self._cancel_connect()
        self.client.exchange_done(self)

    def _cancel_connect(self) -> None:
        self.r_parser = None  # the parser and this exchange refer to each other
        if self.connect_task is not None:
            self.connect_task.cancel()
            self.connect_task = None

    def upstream_lost(self) -> None:
        """The upstream connection closed under this exchange."""
        up = self.up
        self.up = None
        if self.resp_done:
            return
        if self.head_done and self.resp_framing == "close":
            self.resp_done = True
            self.finish()
            return
        if (
            not self.started
            and self.reused
            and self.resend is not None
            and not self.rbuf
            and up is not None
        ):
            # a pooled connection the upstream had closed: send again on a fresh one
            self.pending = list(self.resend)
            self.reused = False
            self.r_headers = []
            self.r_reason = b""
            self.connect_task = asyncio.ensure_future(self._connect())
            return
        self.fail("disconnected", 502)

    def fail(self, reason: str, status: int) -> None:
        """The upstream failed: a JSON ``status`` answer before the response started, else the
        client connection is aborted (a truncated answer)."""
        if self.resp_done or self.ended:
            return
        self.resp_done = self.ended = True
        self._cancel_connect()
        up = self.up
        self.up = None
        if up is not None:
            up.exchange = None
            up.close()
        c = self.client
        if c.gone:
            return
        self.fwd.upstream_error(reason, self.started)
        if self.started:
            c.abort()
            return
        self.started = True
        if not self.body_done:
            self.keep_client = False
        phrase = "Gateway Timeout" if status == 504 else "Bad Gateway"
        if c.transport is not None:
            c.transport.write(
                _json_error(status, phrase, f"upstream {reason}", not self.keep_client)
            )
        self.client.exchange_done(self)

    def client_lost(self) -> None:
        """The client connection closed while this exchange was first in its queue."""
        self._cancel_connect()
        up = self.up
        self.up = None
        if up is not None:
            up.exchange = None
            up.close()
        if not self.body_done:
            self.client.fwd.handover.incomplete(self.shadow)
            log_event(log, logging.WARNING, "proxy client body incomplete")
            return
        if not self.resp_done:
            self.fwd.counters.proxy_client_disconnects += 1
            log_event(log, logging.INFO, "proxy client disconnected")


class _Client(asyncio.Protocol):
    """One client connection: parses requests (the request parser's protocol) and runs their
    exchanges one at a time, in order."""

    def __init__(self, fwd: Forwarder) -> None:
        self.fwd = fwd
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.queue: deque[_Exchange] = deque()
        self.req: _Exchange | None = None
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.in_head = False
        self.gone = False
        self.counted = False
        self.stopping = False
        self.half_closed = False
        self.paused = 0
        self.peer = b""
        self.header_timer: asyncio.TimerHandle | None = None
        self.idle_timer: asyncio.TimerHandle | None = None
        self.idle_since = 0.0
        self.deadline_timer: asyncio.TimerHandle | None = None
        self.body_timer: asyncio.TimerHandle | None = None
        self.last_data = 0.0
        self.to_begin: _Exchange | None = None
        self.between = True  # the request parser is between messages
        #: bytes read while the current request head is not complete, or since the last body
        #: bytes of a request (trailer fields, chunk framing)
        self.head_seen = 0
        self.got_body = False  # the request parser gave body bytes since the last read

    # -- connection -----------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        fwd = self.fwd
        stats, limits = fwd.stats, fwd.limits
        if stats.open >= limits.max_connections:
            stats.refuse("connection_limit", max_connections=limits.max_connections)
            self.gone = True
            self.transport.write(_LIMIT_503)
            self.transport.close()
            return
        stats.open += 1
        self.counted = True
        fwd.clients.add(self)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and peer:
            self.peer = str(peer[0]).encode()
        assert fwd.loop is not None
        self.header_timer = fwd.loop.call_later(limits.header_timeout_seconds, self._header_timeout)

    def data_received(self, data: bytes) -> None:
        if self.gone:
            return
        if (
            self.between
            and not self.queue
            and not self.stopping
            and self.fwd.fast
            and self.fast_request(data)
        ):
            return
        try:
            self._feed(data)
        except httptools.HttpParserError as exc:
            last = self.queue[-1] if self.queue else None
            if not (self.between and last is not None and not last.keep_client):
                self.to_begin = None
                self._bad_request(exc)
                return
            # bytes after a request that closes the connection: not processed (RFC 9112
            # §9.6); it is answered, then the connection closed
        ex = self.to_begin
        if ex is not None:  # begun after the whole read: head and body go up in one write
            self.to_begin = None
            if not self.gone:
                ex.begin()
        if self.gone:
            return
        loop = self.fwd.loop
        assert loop is not None
        if self.in_head:
            self.head_seen += len(data)
            if self.head_seen > MAX_HEAD_BYTES:
                self._bad_request(_HeadTooLarge())
                return
            if self.header_timer is None:
                self.header_timer = loop.call_later(
                    self.fwd.limits.header_timeout_seconds, self._header_timeout
                )
        elif self.req is not None:
            # reads with no body byte (a chunked body's trailer fields, which the parser buffers,
            # or endless chunk extensions) count against the same cap as a head
            if self.got_body:
                self.got_body = False
                self.head_seen = 0
            else:
                self.head_seen += len(data)
                if self.head_seen > MAX_HEAD_BYTES:
                    self._bad_request(_HeadTooLarge())
                    return
            self.last_data = loop.time()
            if self.body_timer is None:
                self.body_timer = loop.call_later(
                    self.fwd.limits.body_timeout_seconds, self._body_check
                )

    def _feed(self, data: bytes) -> None:
        """Feed ``data`` to the request parser. ``Upgrade`` is hop-by-hop and not honoured
        (the request goes up as a plain one): llhttp stops after an upgrade request's head and
        goes on with the next feed, so the rest of this read is fed again. Raises
        ``httptools.HttpParserError`` on a malformed request."""
        while data:
            try:
                self.parser.feed_data(data)
                return
            except httptools.HttpParserUpgrade as exc:
                used = int(exc.args[0]) if exc.args else 0
                if used <= 0 or self.gone:
                    return
                data = data[used:]

    def eof_received(self) -> bool | None:
        if self.req is None and self.queue:
            # the client half-closed after whole requests: answer them, then close
            self.half_closed = True
            return True
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.gone = True
        for t in (self.header_timer, self.idle_timer, self.body_timer, self.deadline_timer):
            if t is not None:
                t.cancel()
        self.header_timer = self.idle_timer = self.body_timer = self.deadline_timer = None
        if self.counted:
            self.counted = False
            self.fwd.stats.open -= 1
        if self.queue:
            self.queue[0].client_lost()
            for ex in list(self.queue)[1:]:
                ex._cancel_connect()
            self.queue.clear()
        self.req = None
        self.fwd.client_gone(self)

    def pause_writing(self) -> None:
        if self.queue:
            up = self.queue[0].up
            if up is not None and up.transport is not None:
                up.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.queue:
            up = self.queue[0].up
            if up is not None and up.transport is not None:
                up.transport.resume_reading()

    def pause_reading(self) -> None:
        self.paused += 1
        if self.paused == 1 and self.transport is not None and not self.gone:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.paused > 0:
            self.paused -= 1
            if self.paused == 0 and self.transport is not None and not self.gone:
                self.transport.resume_reading()

    def stop_when_idle(self) -> None:
        """The listener is stopping: close now when idle, else after the answer in progress."""
        self.stopping = True
        if not self.queue and self.req is None and self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # -- limits ---------------------------------------------------------------------------------

    def _header_timeout(self) -> None:
        self.header_timer = None
        if self.gone or self.transport is None:
            return
        self.fwd.stats.refuse("header_timeout", seconds=self.fwd.limits.header_timeout_seconds)
        self.transport.abort()

    def _body_check(self) -> None:
        self.body_timer = None
        ex = self.req
        if ex is None or self.gone or self.transport is None:
            return
        loop = self.fwd.loop
        assert loop is not None
        idle = self.fwd.limits.body_timeout_seconds
        waited = loop.time() - self.last_data
        if waited < idle:
            self.body_timer = loop.call_later(idle - waited, self._body_check)
            return
        self.fwd.stats.refuse("body_timeout", seconds=idle)
        if self.queue and self.queue[0] is ex and not ex.started:
            ex.started = True
            ex.resp_done = True
            ex._cancel_connect()
            up, ex.up = ex.up, None
            if up is not None:
                up.exchange = None
                up.close()
            self.queue.clear()
            self.req = None
            self.gone = True
            self.transport.write(_TIMEOUT_408)
            self.transport.close()
            return
        self.transport.abort()

    def _bad_request(self, exc: Exception) -> None:
        # counted and logged (rate-limited), never with the request bytes: a head may carry
        # credentials; a refusal raised in a parser callback is named by its own class
        cause = exc.__context__ if isinstance(exc, httptools.HttpParserCallbackError) else None
        error = type(cause if cause is not None else exc).__name__.lstrip("_")
        self.fwd.stats.refuse("bad_request", status=400, error=error)
        if self.transport is None:
            return
        if not self.queue:
            self.gone = True
            self.transport.write(_BAD_400)
            self.transport.close()
        else:
            self.transport.abort()

    # -- the fast path ---------------------------------------------------------------------------

    def fast_request(self, data: bytes) -> bool:
        """Forward ``data`` without the request parser when it is exactly one whole request of
        the common shape: :data:`_FAST_REQUEST`, no field but ``Host``, ``Connection:
        keep-alive`` and ``X-Forwarded-For`` among those the parser path drops, at most one
        ``Content-Length`` and a body of exactly that length. The head, the copy and the
        counters are what the parser path makes of the same bytes (a test sends the same
        requests both ways); ``False`` (nothing done) sends ``data`` to the parser, which
        handles every other case."""
        end = data.find(b"\r\n\r\n", 0, _FAST_HEAD_MAX)
        if end < 0:
            return False
        end += 4
        m = _FAST_REQUEST.match(data, 0, end)
        if m is None:
            return False
        fwd = self.fwd
        length = 0
        seen_length = marked = False
        prior: list[bytes] = []
        category = request_id = None
        for name, value in fwd.fast_fields.findall(data, 0, end):
            n = name.lower()
            if n == b"host":
                continue
            if n == b"content-length":
                digits = _DIGITS.fullmatch(value)
                if seen_length or digits is None:
                    return False
                seen_length = True
                length = int(value)
            elif n == b"x-forwarded-for":
                prior.append(value)
            elif n == b"connection":
                if value.lower() != b"keep-alive":
                    return False
            elif n in _B_DROP_REQUEST:
                return False
            elif n == fwd.marker:
                marked = marked or bool(value)
            elif n == fwd.category_header:
                if category is None:
                    category = value.decode("latin-1")
            elif n == fwd.request_id_header and request_id is None:
                request_id = value.decode("latin-1")
        if len(data) - end != length:
            return False
        method, url, fields = m.groups()
        up = fwd.up
        if self.peer:
            prior.append(self.peer)
        xff = b"X-Forwarded-For: " + b", ".join(prior) + _CRLF if prior else b""
        head = b"%b %b%b HTTP/1.1\r\nHost: %b\r\n%b%b\r\n" % (
            method,
            up.prefix,
            url,
            up.host_header,
            _FAST_DROPPED.sub(b"", fields),
            xff,
        )
        # what on_headers_complete and on_message_complete do
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None
        fwd.counters.proxy_requests += 1
        ex = _Exchange(self)
        path = url.split(b"?", 1)[0]
        shadowed_path = method == b"POST" and path in fwd.shadow_paths
        ex.shadow = shadowed_path and not marked
        ex.path = path
        ex.category = category
        ex.request_id = request_id
        ex.keep_client = not self.half_closed
        ex.body_done = True
        body = data[end:]
        ex.send_up(head + body if body else head)
        self.queue.append(ex)
        ex.begin()  # the live request goes up first, then the shadow side hears of it
        if shadowed_path and marked:
            fwd.handover.marked()
        elif ex.shadow and body:
            if len(body) > fwd.max_body:
                fwd.handover.too_large()
            else:
                fwd.handover.copy(path.decode("latin-1"), body, category, request_id)
        return True

    # -- the request parser's callbacks ----------------------------------------------------------

    def on_message_begin(self) -> None:
        self.between = False
        self.in_head = True
        self.req = _Exchange(self)

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.in_head:  # not a chunked body's trailer fields: those are dropped
            self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.in_head = False
        self.head_seen = 0
        self.got_body = False
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None
        ex = self.req
        assert ex is not None
        fwd = self.fwd
        parser = self.parser
        headers, self.headers = self.headers, []
        lowered = [n.lower() for n, _ in headers]
        if parser.should_upgrade() and any(
            n == b"transfer-encoding" or (n == b"content-length" and v.strip(b" \t0"))
            for n, (_, v) in zip(lowered, headers, strict=True)
        ):
            # llhttp reads no body after an upgrade request's head: refused (400), as sent up
            # without its body it would wait for one (or carry an empty one)
            raise _UpgradeWithBody
        if any(
            n == b"transfer-encoding" and v.strip(b" \t").lower() != b"chunked"
            for n, (_, v) in zip(lowered, headers, strict=True)
        ):
            # a coding besides chunked (``gzip, chunked``): re-framed as plain chunked it would
            # reach the upstream as the body itself; refused (400)
            raise _OtherTransferCoding
        fwd.counters.proxy_requests += 1
        method = parser.get_method()
        url, self.url = self.url, b""
        absolute = _ABSOLUTE_FORM.match(url)
        if absolute is not None:  # sent on in origin form (RFC 9112 §3.2.2)
            url = url[absolute.end() :]
            if not url.startswith(b"/"):
                url = b"/" + url
        path = url.split(b"?", 1)[0]
        http10 = parser.get_http_version() == "1.0"
        drop = _B_DROP_REQUEST
        if b"connection" in lowered:
            drop = drop | connection_tokens(
                v for n, (_, v) in zip(lowered, headers, strict=True) if n == b"connection"
            )
        up = fwd.up
        prefix = up.prefix if url != b"*" else b""  # ``*``: about the server, not a path
        parts = [method, b" ", prefix, url, b" HTTP/1.1\r\nHost: ", up.host_header, _CRLF]
        prior: list[bytes] = []
        marked = chunked = expect = False
        for n, (name, value) in zip(lowered, headers, strict=True):
            if n in drop:
                if n == b"x-forwarded-for":
                    prior.append(value)
                elif n == b"transfer-encoding":
                    chunked = b"chunked" in value.lower()
                elif n == b"expect":
                    expect = value.strip().lower() == b"100-continue"
                continue
            if n == fwd.marker:
                marked = marked or bool(value)
            elif n == fwd.category_header:
                if ex.category is None:
                    ex.category = value.decode("latin-1")
            elif n == fwd.request_id_header and ex.request_id is None:
                ex.request_id = value.decode("latin-1")
            parts += (name, b": ", value, _CRLF)
        if chunked:
            parts.append(b"Transfer-Encoding: chunked\r\n")
        if self.peer:
            prior.append(self.peer)
        if prior:
            parts += (b"X-Forwarded-For: ", b", ".join(prior), _CRLF)
        parts.append(_CRLF)
        shadowed_path = method == b"POST" and path in fwd.shadow_paths
        ex.shadow = shadowed_path and not marked
        if shadowed_path and marked:
            fwd.handover.marked()
        if ex.shadow:
            ex.copy = bytearray()
        ex.path = path
        ex.chunked_req = chunked
        ex.is_head = method == b"HEAD"
        ex.keep_client = parser.should_keep_alive() and not self.half_closed
        ex.client_http10 = http10
        ex.expect_continue = expect and not http10
        ex.send_up(b"".join(parts))
        self.queue.append(ex)
        if len(self.queue) == 1:
            self.to_begin = ex
        else:
            self.pause_reading()  # pipelined: read on when the one before is answered

    def on_body(self, body: bytes) -> None:
        self.got_body = True
        ex = self.req
        if ex is not None:
            ex.body(body)

    def on_message_complete(self) -> None:
        self.between = True
        ex, self.req = self.req, None
        if self.body_timer is not None:
            self.body_timer.cancel()
            self.body_timer = None
        if ex is not None:
            ex.request_complete()

    # -- exchanges ------------------------------------------------------------------------------

    def exchange_done(self, ex: _Exchange) -> None:
        """``ex`` is answered: start the next queued one, or wait idle, or close."""
        if self.queue and self.queue[0] is ex:
            self.queue.popleft()
            if self.queue:
                self.resume_reading()
        if self.gone or self.transport is None:
            return
        if not ex.keep_client or ((self.stopping or self.half_closed) and not self.queue):
            self.gone = True
            self.transport.close()
            return
        if self.queue:
            self.queue[0].begin()
        elif self.req is None:
            loop = self.fwd.loop
            assert loop is not None
            self.idle_since = loop.time()
            if self.idle_timer is None:
                self.idle_timer = loop.call_later(
                    self.fwd.limits.keepalive_timeout_seconds, self._idle_close
                )

    def arm_deadline(self, when: float) -> None:
        """An exchange began with an answer deadline (loop time ``when``): one timer per
        connection checks the first exchange's deadline, set again only when it fires."""
        if self.deadline_timer is None:
            loop = self.fwd.loop
            assert loop is not None
            self.deadline_timer = loop.call_at(when, self._deadline_check)

    def _deadline_check(self) -> None:
        self.deadline_timer = None
        if self.gone or not self.queue:
            return
        ex = self.queue[0]
        if not ex.deadline:
            return
        loop = self.fwd.loop
        assert loop is not None
        if loop.time() >= ex.deadline:
            ex.timed_out()
        elif self.deadline_timer is None:
            self.deadline_timer = loop.call_at(ex.deadline, self._deadline_check)

    def _idle_close(self) -> None:
        """Close a connection idle for ``keepalive_timeout_seconds``. The timer is not moved
        on each request: when it fires early it is set again for the time left, and when a
        request is in progress the end of that exchange sets it again."""
        self.idle_timer = None
        if self.queue or self.req is not None or self.transport is None or self.gone:
            return
        loop = self.fwd.loop
        assert loop is not None
        left = self.idle_since + self.fwd.limits.keepalive_timeout_seconds - loop.time()
        if left > 0:
            self.idle_timer = loop.call_later(left, self._idle_close)
            return
        self.transport.close()
