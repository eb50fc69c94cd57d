"""The client side of the forwarding engine (:class:`Client`): one client connection, the
request parser's protocol, and its exchanges run one at a time, in order.

Each request head is parsed and rebuilt (:mod:`specwatch.http1.heads`: hop-by-hop fields,
proxy credentials, ``Host`` and ``Expect`` dropped, ``X-Forwarded-For`` appended; ``100
Continue`` is answered here; ``Upgrade`` is not honoured: the request goes up as a plain one,
and one with a body is refused with ``400``, as llhttp reads no body after its head), then
written with the body to an upstream connection. A chunked request body is re-framed chunk by
chunk as it arrives (trailer fields dropped); a body of known length is passed on as it
arrives. A read holding exactly one whole request of the common shape skips the parser
(:func:`specwatch.http1.fast.fast_request`). Live writes come before any bookkeeping: the
request goes up before its copy is handed over and before its answer deadline is set.

Listener limits (:class:`~specwatch.core.listen.ListenLimits`): connection cap (``503``),
request head within ``header_timeout_seconds`` and at most
:data:`~specwatch.http1.framing.MAX_HEAD_BYTES`, body pauses up to ``body_timeout_seconds`` and
a whole body within ``body_deadline_seconds`` of its first bytes (``408``), a client address's
share of the connections ``max_connections_per_client`` (``503``), idle keep-alive
``keepalive_timeout_seconds``; refusals counted in
:class:`~specwatch.core.listen.ListenerStats`. A client that goes away closes the upstream
connection at once, also when it only closed its sending side before the first answer byte
(counted in ``proxy_client_disconnects``). Pipelined requests are answered in order
(one at a time; reading pauses while one waits). Nothing from a request head is ever logged
(it may carry credentials).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import cast

import httptools

from specwatch.http1.engine import Engine
from specwatch.http1.exchange import Exchange
from specwatch.http1.fast import fast_request
from specwatch.http1.framing import (
    BAD_400,
    DIGITS,
    HEAD_431,
    LIMIT_503,
    MAX_HEAD_BYTES,
    TIMEOUT_408,
    HeadTooLarge,
)
from specwatch.http1.heads import rebuild_request, refuse_framing

__all__ = ["Client"]


def _declared_length(lowered: list[bytes], headers: list[tuple[bytes, bytes]]) -> int:
    """The request's ``Content-Length`` (``-1``: none, or not a plain number)."""
    for name, (_, value) in zip(lowered, headers, strict=True):
        if name == b"content-length":
            v = value.strip()
            return int(v) if DIGITS.fullmatch(v) else -1
    return -1


class Client(asyncio.Protocol):
    """One client connection: parses requests (the request parser's protocol) and runs their
    exchanges one at a time, in order."""

    def __init__(self, fwd: Engine) -> None:
        self.fwd = fwd
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.queue: deque[Exchange] = deque()
        self.req: Exchange | None = None
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.in_head = False
        self.gone = False
        self.counted = False
        self.stopping = False
        self.paused = 0
        self.peer = b""
        self.header_timer: asyncio.TimerHandle | None = None
        self.idle_timer: asyncio.TimerHandle | None = None
        self.idle_since = 0.0
        self.deadline_timer: asyncio.TimerHandle | None = None
        self.stall_timer: asyncio.TimerHandle | None = None
        self.writing_paused = False
        self.body_timer: asyncio.TimerHandle | None = None
        self.last_data = 0.0
        self.body_deadline = 0.0  # loop time by which the request body must be whole
        self.to_begin: Exchange | None = None
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
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and peer:
            self.peer = str(peer[0]).encode()
        if not stats.admit(self.peer.decode(), limits):
            self.gone = True
            self.transport.write(LIMIT_503)
            self.transport.close()
            return
        self.counted = True
        fwd.clients.add(self)
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
            and fast_request(self, data)
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
                self._bad_request(HeadTooLarge())
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
                    self._bad_request(HeadTooLarge())
                    return
            self.last_data = loop.time()
            if not self.body_deadline:
                self.body_deadline = self.last_data + self.fwd.limits.body_deadline_seconds
            if self.body_timer is None:
                limits = self.fwd.limits
                self.body_timer = loop.call_later(
                    min(limits.body_timeout_seconds, limits.body_deadline_seconds),
                    self._body_check,
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
        # The client closed its side. A socket cannot tell a half-close from a client that went
        # away, and a vLLM request runs (queued, prefilling, holding a GPU slot) until its
        # connection closes; so, as a production proxy does by default, an end of input while
        # an answer is owed is a client that left: the transport closes and connection_lost
        # closes the upstream now, not at the first failed write (which may be seconds away,
        # before the first token). Between requests it is the end of the connection.
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.gone = True
        for t in (
            self.header_timer,
            self.idle_timer,
            self.body_timer,
            self.deadline_timer,
            self.stall_timer,
        ):
            if t is not None:
                t.cancel()
        self.header_timer = self.idle_timer = self.body_timer = self.deadline_timer = None
        self.stall_timer = None
        if self.counted:
            self.counted = False
            self.fwd.stats.release(self.peer.decode())
        if self.queue:
            self.queue[0].client_lost()
            for ex in list(self.queue)[1:]:
                ex.cancel_connect()
            self.queue.clear()
        self.req = None
        self.fwd.client_gone(self)

    def pause_writing(self) -> None:
        self.writing_paused = True
        if self.queue:
            up = self.queue[0].up
            if up is not None and up.transport is not None:
                up.transport.pause_reading()

    def resume_writing(self) -> None:
        self.writing_paused = False
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
        limits = self.fwd.limits
        idle = limits.body_timeout_seconds
        now = loop.time()
        waited = now - self.last_data
        late = bool(self.body_deadline) and now >= self.body_deadline
        if waited < idle and not late:
            wait = idle - waited
            if self.body_deadline:
                wait = min(wait, self.body_deadline - now)
            self.body_timer = loop.call_later(wait, self._body_check)
            return
        if late:
            self.fwd.stats.refuse("body_timeout", deadline=limits.body_deadline_seconds)
        else:
            self.fwd.stats.refuse("body_timeout", seconds=idle)
        if self.queue and self.queue[0] is ex and not ex.started:
            ex.started = True
            ex.resp_done = True
            ex.cancel_connect()
            up, ex.up = ex.up, None
            if up is not None:
                up.exchange = None
                up.close()
            self.queue.clear()
            self.req = None
            self.gone = True
            self.transport.write(TIMEOUT_408)
            self.transport.close()
            return
        self.transport.abort()

    def _bad_request(self, exc: Exception) -> None:
        # counted and logged (rate-limited), never with the request bytes: a head may carry
        # credentials; a refusal raised in a parser callback is named by its own class. A head
        # (or a body's framing without body bytes) past the cap is ``431``, anything else the
        # parser refuses ``400``; both are answered while no answer has started (a bad chunk
        # size included: the request that went up is cut), else the connection is aborted
        cause = exc.__context__ if isinstance(exc, httptools.HttpParserCallbackError) else None
        error = type(cause if cause is not None else exc).__name__
        too_large = isinstance(exc, HeadTooLarge)
        in_body = self.req is not None and not self.in_head
        path = self.req.path.decode("latin-1") if self.req is not None else ""
        fields = {"peer": self.peer.decode(), "path": path}
        if too_large:
            self.fwd.stats.refuse("header_too_large", status=431, limit=MAX_HEAD_BYTES, **fields)
        else:
            part = "body" if in_body else "head"
            self.fwd.stats.refuse("bad_request", status=400, error=error, part=part, **fields)
        if self.transport is None:
            return
        answer = HEAD_431 if too_large else BAD_400
        if not self.queue:
            self.gone = True
            self.transport.write(answer)
            self.transport.close()
            return
        ex = self.queue[0]
        if len(self.queue) == 1 and ex is self.req and not ex.started:
            ex.started = ex.resp_done = ex.ended = True
            ex.drop_copy()
            ex.cancel_connect()
            up, ex.up = ex.up, None
            if up is not None:
                up.exchange = None
                up.close()
            self.queue.clear()
            self.req = None
            self.gone = True
            self.transport.write(answer)
            self.transport.close()
            return
        self.transport.abort()

    # -- the fast path -------------------------------------------------------------------------

    def queued_exchange(self) -> Exchange:
        """A new exchange, last in the queue (for the fast request path)."""
        ex = Exchange(self)
        self.queue.append(ex)
        return ex

    # -- the request parser's callbacks ----------------------------------------------------------

    def on_message_begin(self) -> None:
        self.between = False
        self.in_head = True
        self.req = Exchange(self)

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
        refuse_framing(lowered, headers, parser.should_upgrade())
        fwd.counters.proxy_requests += 1
        method = parser.get_method()
        url, self.url = self.url, b""
        http10 = parser.get_http_version() == "1.0"
        head, path, marked, chunked, expect, category, request_id = rebuild_request(
            fwd, method, url, lowered, headers, self.peer
        )
        ex.category = category
        ex.request_id = request_id
        shadowed_path = method == b"POST" and path in fwd.shadow_paths
        ex.shadow = shadowed_path and not marked
        if shadowed_path and marked:
            fwd.handover.marked()
        ex.path = path
        if ex.shadow:
            declared = _declared_length(lowered, headers)
            if declared > fwd.max_body:  # counted now: the body may never be read to its end
                fwd.copy_refused("too_large", self.peer, path)
            else:
                ex.copy = bytearray()
        ex.chunked_req = chunked
        ex.is_head = method == b"HEAD"
        ex.keep_client = parser.should_keep_alive()
        ex.client_http10 = http10
        ex.expect_continue = expect and not http10
        ex.send_up(head)
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
        self.body_deadline = 0.0
        ex, self.req = self.req, None
        if self.body_timer is not None:
            self.body_timer.cancel()
            self.body_timer = None
        if ex is not None:
            ex.request_complete()

    # -- exchanges ------------------------------------------------------------------------------

    def exchange_done(self, ex: Exchange) -> None:
        """``ex`` is answered: start the next queued one, or wait idle, or close."""
        if self.queue and self.queue[0] is ex:
            self.queue.popleft()
            if self.queue:
                self.resume_reading()
        if self.gone or self.transport is None:
            return
        if not ex.keep_client or (self.stopping and not self.queue):
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

    def arm_stall_check(self) -> None:
        """An exchange began and the upstream has a stream idle timeout: one timer per
        connection ticks every half timeout for the first exchange in the queue."""
        if self.stall_timer is None:
            loop = self.fwd.loop
            idle = self.fwd.up.idle_timeout
            assert loop is not None
            assert idle is not None
            self.stall_timer = loop.call_later(idle / 2, self._stall_check)

    def _stall_check(self) -> None:
        self.stall_timer = None
        if self.gone or not self.queue:
            return
        ex = self.queue[0]
        if self.writing_paused:  # the client is slow, not the upstream: not quiet
            ex.quiet_ticks = 0
            going = True
        else:
            going = ex.stall_tick()
        if going and not self.gone:
            self.arm_stall_check()

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
