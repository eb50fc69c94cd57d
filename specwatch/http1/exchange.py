"""One request and its answer (:class:`Exchange`): the request goes up as it arrives, the
answer comes back **as bytes**.

The upstream's answer head is relayed verbatim unless a field must go (then rebuilt from the
parsed fields, :mod:`specwatch.http1.heads`), then every body byte (chunked framing and SSE
events included) is written to the client as it arrives. Bytes after the answer's end (a
misbehaving upstream) are cut at the length of an answer that has one; after a chunked one
they are relayed with the read that holds its end; either way neither connection is reused,
so they are never read as the client's next answer. The response parser only finds where the
answer ends, so the upstream connection can be reused; an answer with neither length nor
chunking ends when the upstream closes, and the client connection is closed after it. The
common answer skips the parser's field callbacks (:mod:`specwatch.http1.fast`).

Fail-open: before the answer starts, an unreachable upstream is ``502`` (``connect``), a
timeout ``504`` (``timeout``; no byte for the stream idle timeout: ``stalled``), a connection
closed early ``502`` (``disconnected``), a
malformed answer ``502`` (``client_error``), each a small JSON body; after it starts, the
client connection is aborted so the client sees a truncated answer, never a clean short one.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

import httptools

from specwatch.core.logs import log_event
from specwatch.http1.engine import Engine
from specwatch.http1.fast import fast_answer
from specwatch.http1.framing import CONTINUE, AfterEnd, head_end, json_error
from specwatch.http1.heads import answer_framing, rebuilt_answer
from specwatch.http1.pool import UpstreamConnection

__all__ = ["RESEND_MAX_BYTES", "ClientSide", "Exchange"]

#: Request bytes kept to resend on a fresh connection when a reused one turns out closed before
#: any answer byte; a request larger than this is not resent (answered ``502``).
RESEND_MAX_BYTES = 64 << 10


class ClientSide(Protocol):
    """What an exchange needs of its client connection (:class:`~specwatch.http1.client.Client`)."""

    transport: asyncio.Transport | None
    gone: bool
    peer: bytes

    @property
    def fwd(self) -> Engine:
        """The engine the connection belongs to."""

    def pause_reading(self) -> None:
        """Stop reading (counted)."""

    def resume_reading(self) -> None:
        """Undo one :meth:`pause_reading`."""

    def arm_deadline(self, when: float) -> None:
        """An exchange began with an answer deadline (loop time ``when``)."""

    def arm_stall_check(self) -> None:
        """An exchange began and the upstream has a stream idle timeout."""

    def exchange_done(self, ex: Exchange) -> None:
        """``ex`` is answered: go on with the next one, wait idle, or close."""

    def abort(self) -> None:
        """Close the connection at once."""


class Exchange:
    """One request and its answer; the response parser's protocol. Fields an exchange may
    never change keep their class default (fewer stores on the live path)."""

    up: UpstreamConnection | None = None
    path: bytes = b""
    shadow: bool = False
    copy: bytearray | None = None
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
    stall_reads = -1  # the upstream's read count at the last stream idle tick
    quiet_ticks = 0  # stream idle ticks in a row without an upstream read
    connect_task: asyncio.Task[None] | None = None
    body_left: int = 0  # body bytes still to come of an answer with a length

    def __init__(self, client: ClientSide) -> None:
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
                self.fwd.copy_refused("too_large", self.client.peer, self.path)

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
            c.transport.write(CONTINUE)
        up = fwd.pool.take()
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
        if fwd.up.idle_timeout is not None and not self.ended:
            c.arm_stall_check()

    async def _connect(self) -> None:
        try:
            up = await self.fwd.pool.connect()
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
            self.fwd.pool.release(up)
            return
        self.reused = False
        self.attach(up)

    def attach(self, up: UpstreamConnection) -> None:
        self.up = up
        up.exchange = self
        self.r_parser = None  # made on the first answer bytes the fast path does not take
        pending, self.pending = self.pending, None
        if pending:
            up.write(b"".join(pending) if len(pending) > 1 else pending[0])

    # -- response side: the parser's callbacks ---------------------------------------------------

    def on_message_begin(self) -> None:
        if self.resp_done:  # a second answer after this one: bytes after the end
            raise AfterEnd

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
        if self.body_left:
            self.length_body(data)
            return
        parser = self.r_parser
        if parser is None:
            if not self.rbuf and self.fwd.fast and fast_answer(self, data):
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
            end = head_end(self.rbuf)
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

    def length_body(self, data: bytes) -> None:
        """More body of an answer with a length (on either path): relayed up to its length;
        bytes beyond it are dropped and neither connection is reused (the upstream is out of
        step)."""
        left = self.body_left
        t = self.client.transport
        if len(data) > left:
            data = data[:left]
            self.up_keep = self.keep_client = False
        left -= len(data)
        self.body_left = left
        if t is not None:
            t.write(data)
        if not left:
            self.resp_done = True
            self.finish()

    def send_head(self) -> None:
        parser = self.r_parser
        assert parser is not None
        code = parser.get_status_code()
        end = head_end(self.rbuf)
        if end < 0:
            self.fail("client_error", 502)
            return
        names, drop, framing, length = answer_framing(self.r_headers, code, self.is_head)
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
                self.body_left = length - (len(raw) - end)
        rewrite = not self.keep_client or any(n in drop for n in names)
        self.started = True
        t = self.client.transport
        if t is None:
            return
        if not rewrite:  # the upstream's own head and first body bytes, verbatim
            t.write(bytes(raw))
        else:
            body = b"".join(self.early) if self.dechunk else bytes(raw[end:])
            t.write(
                rebuilt_answer(
                    code, self.r_reason, names, self.r_headers, drop, not self.keep_client, body
                )
            )
        if framing == "none":
            self.resp_done = True
        if self.resp_done:
            self.finish()

    # -- ends ------------------------------------------------------------------------------------

    def timed_out(self) -> None:
        if not self.resp_done:
            self.fail("timeout", 504)

    def stall_tick(self) -> bool:
        """One tick of the stream idle check (every half idle timeout): ``True`` while the
        check goes on; after two ticks in a row with no byte from the upstream (a whole idle
        timeout, at most one and a half), the exchange fails as ``stalled`` (``504`` before
        the answer started, else the client connection is aborted) and ``False`` is returned.
        A connect in progress has its own timeout and is not counted as quiet."""
        if self.resp_done or self.ended:
            return False
        up = self.up
        if up is None:
            return True
        if up.reads != self.stall_reads:
            self.stall_reads = up.reads
            self.quiet_ticks = 0
            return True
        self.quiet_ticks += 1
        if self.quiet_ticks < 2:
            return True
        self.fail("stalled", 504)
        return False

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
            self.drop_copy()
        up = self.up
        self.up = None
        if up is not None:
            reusable = self.body_done and self.resp_framing != "close" and self.up_keep
            if reusable:
                self.fwd.pool.release(up)
            else:
                up.exchange = None
                up.close()
        self.cancel_connect()
        self.client.exchange_done(self)

    def cancel_connect(self) -> None:
        """Drop the parser and stop a connect in progress."""
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
        self.cancel_connect()
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
            self.drop_copy()
        phrase = "Gateway Timeout" if status == 504 else "Bad Gateway"
        if c.transport is not None:
            c.transport.write(
                json_error(status, phrase, f"upstream {reason}", not self.keep_client)
            )
        self.client.exchange_done(self)

    def drop_copy(self) -> None:
        """The request body will not be read to its end (the client left, or the connection is
        closed after an answer that came first): a copy in progress is counted
        ``incomplete_body``, so every request on a copied path is counted once."""
        if self.copy is not None:
            self.copy = None
            self.fwd.copy_refused("incomplete_body", self.client.peer, self.path)

    def client_lost(self) -> None:
        """The client connection closed while this exchange was first in its queue."""
        self.cancel_connect()
        up = self.up
        self.up = None
        if up is not None:
            up.exchange = None
            up.close()
        fwd = self.fwd
        if not self.body_done:
            self.drop_copy()
            log_event(
                fwd.log,
                logging.WARNING,
                "proxy client body incomplete",
                peer=self.client.peer.decode("latin-1"),
                path=self.path.decode("latin-1"),
            )
            return
        if not self.resp_done:
            fwd.counters.proxy_client_disconnects += 1
            log_event(fwd.log, logging.INFO, "proxy client disconnected")
