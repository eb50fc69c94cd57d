"""The aiohttp side of :mod:`specwatch.core.listen`: a site whose connections are capped and
must send their request head in time, and a middleware that times out stalled request bodies.
Refusals are counted in a :class:`~specwatch.core.listen.ListenerStats`.

A request aiohttp cannot parse (a malformed head: aiohttp answers 400 and closes) would
otherwise cost one ERROR line with a traceback each, without a limit; on a guarded site it is
counted as ``bad_request`` and logged through the listener's rate-limited log instead, naming
the parser's error class only (the message can quote header lines).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Middleware

from specwatch.core.listen import ListenerStats, ListenLimits

__all__ = ["GuardedSite", "body_timeout_middleware"]

_HEAD_END = b"\r\n\r\n"


class _Guarded(asyncio.Protocol):
    """Wraps aiohttp's per-connection protocol: counts the connection, enforces the cap and the
    header timeout, makes room near the cap (:meth:`GuardedSite.make_room`), and passes
    everything else through unchanged."""

    def __init__(self, inner: asyncio.Protocol, site: GuardedSite) -> None:
        self._inner = inner
        self._site = site
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._tail = b""
        self._counted = False
        self._admitted = False
        self.peer = ""
        #: the request being handled now (set by the body-timeout middleware), else ``None``
        self.request: web.BaseRequest | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        site = self._site
        stats, limits = site.stats, site.limits
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and peer:
            self.peer = str(peer[0])
        loop = asyncio.get_running_loop()
        near_cap = stats.open >= limits.max_connections - limits.reserve
        if near_cap and site.holds_most(self.peer):
            # near the cap the address holding the most gets no more (cheaply: no request is
            # read), so a crowd at its share cannot churn the others' connections
            stats.refuse("client_share", near_cap=limits.max_connections - limits.reserve)
            _refuse(transport)
            return
        if near_cap:
            site.make_room()
        if not stats.admit(self.peer, limits):
            _refuse(transport)
            return
        self._counted = self._admitted = True
        site.track(self, transport)
        self._timer = loop.call_later(limits.header_timeout_seconds, self._header_timeout)
        self._inner.connection_made(transport)

    def waiting(self) -> bool:
        """Whether this connection waits on its client (an idle keep-alive, a request head or
        body still arriving): one that may be closed to make room; not while its request is
        being answered."""
        request = self.request
        return request is None or (request.body_exists and not request.content.is_eof())

    def progressed(self) -> None:
        """A byte arrived or an answer ended: last in its address's order."""
        if self._counted:
            self._site.touch(self)

    def evict(self) -> None:
        """Close this connection to make room (counted as ``evicted``)."""
        if self._counted and self._transport is not None:
            self._release()
            self._site.stats.refuse("evicted", peer=self.peer)
            self._transport.abort()

    def _release(self) -> None:
        if self._counted:
            self._counted = False
            self._site.stats.release(self.peer)
            if self._transport is not None:
                self._site.untrack(self, self._transport)

    def _header_timeout(self) -> None:
        self._timer = None
        if self._transport is not None and not self._transport.is_closing():
            self._site.stats.refuse(
                "header_timeout", seconds=self._site.limits.header_timeout_seconds
            )
            self._transport.abort()

    def data_received(self, data: bytes) -> None:
        if not self._admitted:
            return
        self.progressed()
        if self._timer is not None:
            seen = self._tail + data
            if _HEAD_END in seen:
                self._timer.cancel()
                self._timer = None
                self._tail = b""
            else:
                self._tail = seen[-3:]
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._admitted else None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._release()
        if self._admitted:
            self._admitted = False
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._admitted:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._admitted:
            self._inner.resume_writing()


def _refuse(transport: asyncio.Transport) -> None:
    transport.write(
        b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    )
    transport.close()


#: The guarded connection of each open transport (what the body-timeout middleware marks).
_CONNECTIONS: dict[asyncio.BaseTransport, _Guarded] = {}


class _BadRequestLog(logging.LoggerAdapter[logging.Logger]):
    """aiohttp's per-connection logger on a guarded site: a request that failed to parse
    (:class:`aiohttp.http_exceptions.HttpProcessingError`) is counted as ``bad_request`` on the
    site's stats and logged rate-limited without a traceback; every other record goes to
    aiohttp's own logger unchanged."""

    def __init__(self, stats: ListenerStats) -> None:
        super().__init__(logging.getLogger("aiohttp.server"), {})
        self._stats = stats

    def exception(self, msg: object, *args: object, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info")
        if isinstance(exc, HttpProcessingError):
            self._stats.refuse("bad_request", status=exc.code, error=type(exc).__name__)
            return
        super().exception(msg, *args, **kwargs)


class GuardedSite(web.TCPSite):
    """A :class:`aiohttp.web.TCPSite` whose connections are capped and must send their request
    head in time (see the module docstring); ``stats`` holds its counters. Use it as
    ``TCPSite``: ``await GuardedSite(runner, host, port, limits=..., stats=...).start()``."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str | None = None,
        port: int | None = None,
        *,
        limits: ListenLimits,
        stats: ListenerStats,
        bound: BoundAddress | None = None,
    ) -> None:
        super().__init__(runner, host, port)
        self.limits = limits
        self.stats = stats
        self.bound = bound
        self._bad_request_log = _BadRequestLog(stats)
        #: the open connections by client address, each in the order of their last progress
        #: (a byte received, an answer ended): the idlest first
        self._by_peer: dict[str, dict[_Guarded, None]] = {}

    def track(self, conn: _Guarded, transport: asyncio.BaseTransport) -> None:
        """An admitted connection opened."""
        self._by_peer.setdefault(conn.peer, {})[conn] = None
        _CONNECTIONS[transport] = conn

    def touch(self, conn: _Guarded) -> None:
        """``conn`` progressed: last in its address's order (constant time)."""
        conns = self._by_peer.get(conn.peer)
        if conns is not None and conns.pop(conn, 0) is None:
            conns[conn] = None

    def untrack(self, conn: _Guarded, transport: asyncio.BaseTransport) -> None:
        """An admitted connection closed (or was closed to make room)."""
        conns = self._by_peer.get(conn.peer)
        if conns is not None:
            conns.pop(conn, None)
            if not conns:
                del self._by_peer[conn.peer]
        _CONNECTIONS.pop(transport, None)

    def holds_most(self, peer: str) -> bool:
        """Whether ``peer`` holds as many open connections as any other address (and some
        other address holds any: one address alone makes room among its own)."""
        held = len(self._by_peer.get(peer, ()))
        others = [len(c) for p, c in self._by_peer.items() if p != peer]
        return held > 0 and bool(others) and held >= max(others)

    def make_room(self) -> bool:
        """Close one connection waiting on its client (see :mod:`specwatch.core.listen`):
        from the address holding the most connections that has one, the one longest without
        progress (an idle keep-alive, a stalled head, the slowest trickle of a body). False
        when every connection is being answered."""
        for peer in sorted(self._by_peer, key=lambda p: len(self._by_peer[p]), reverse=True):
            for conn in self._by_peer[peer]:
                if conn.waiting():
                    conn.evict()
                    return True
        return False

    def protocol(self) -> asyncio.Protocol:
        """The protocol of one accepted connection (the runner's handler, wrapped)."""
        server = self._runner.server
        assert server is not None  # connections are accepted only once start has run
        handler = server()
        handler.logger = self._bad_request_log  # type: ignore[assignment]
        return _Guarded(handler, self)

    async def start(self) -> None:
        """Listen (as :meth:`TCPSite.start`; on the address ``bound``, when given) with every
        connection wrapped."""
        await web.BaseSite.start(self)
        if self.bound is not None and self.bound.server is not None:
            self.bound.site = self
            server = self.bound.server
        else:
            loop = asyncio.get_running_loop()
            server = await loop.create_server(
                self.protocol, self._host, self._port, reuse_address=self._reuse_address
            )
        self._server = server
        await server.start_serving()  # a no-op for the server just created (it serves)


class CannotListen(OSError):
    """The address could not be bound (taken, not this host's, or a port outside 0-65535):
    raised by :meth:`BoundAddress.take` only, so a caller tells it from any later failure."""


class BoundAddress:
    """A listening socket taken before the app's runner is set up (:meth:`take`), accepting
    no connection until the :class:`GuardedSite` given it as ``bound`` starts: a port in use
    then fails before any start-up hook has run."""

    def __init__(self) -> None:
        self.server: asyncio.Server | None = None
        self.site: GuardedSite | None = None

    def __call__(self) -> asyncio.Protocol:
        assert self.site is not None  # serving starts in GuardedSite.start, which sets it
        return self.site.protocol()

    @classmethod
    async def take(cls, host: str | None, port: int) -> BoundAddress:
        """Bind and listen on ``host:port`` without serving. Raises :class:`CannotListen`
        (its ``strerror`` the reason) when the address cannot be bound."""
        bound = cls()
        loop = asyncio.get_running_loop()
        try:
            bound.server = await loop.create_server(bound, host, port, start_serving=False)
        except (OSError, OverflowError) as exc:  # OverflowError: a port outside 0-65535
            reason = getattr(exc, "strerror", None) or str(exc)
            raise CannotListen(getattr(exc, "errno", None), reason) from exc
        return bound

    def close(self) -> None:
        """Give the address back (when no site took it over)."""
        if self.server is not None and self.site is None:
            self.server.close()


def body_timeout_middleware(limits: ListenLimits, stats: ListenerStats) -> Middleware:
    """An aiohttp middleware: while a request's body is still arriving, a pause longer than
    ``limits.body_timeout_seconds``, or a body not whole by its deadline
    (:meth:`ListenLimits.body_deadline`: scaled to its declared length) after the handler
    started, cancels the handler and answers ``408`` (connection closed, counted as
    ``body_timeout``). Requests without a body pass straight through. On a guarded site it
    also marks the connection as answering a request (see :meth:`GuardedSite.make_room`)."""
    idle = limits.body_timeout_seconds

    @web.middleware
    async def guard(
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        transport = request.transport
        conn = _CONNECTIONS.get(transport) if transport is not None else None
        loop = asyncio.get_running_loop()
        if conn is None:
            return await _guarded(request, handler, loop)
        conn.request = request
        try:
            return await _guarded(request, handler, loop)
        finally:
            conn.request = None
            conn.progressed()

    async def _guarded(
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
        loop: asyncio.AbstractEventLoop,
    ) -> web.StreamResponse:
        if not request.body_exists:
            return await handler(request)
        content = request.content
        whole = limits.body_deadline(request.content_length)
        deadline = loop.time() + whole
        task = asyncio.ensure_future(handler(request))
        try:
            last = -1
            while True:
                left = deadline - loop.time()
                done, _ = await asyncio.wait({task}, timeout=max(0.0, min(idle, left)))
                if done:
                    return task.result()
                if content.is_eof():
                    return await task
                got = content.total_bytes
                late = loop.time() >= deadline
                if got == last or late:
                    task.cancel()
                    await asyncio.wait({task})
                    if late:
                        stats.refuse("body_timeout", deadline=whole, bytes_read=got)
                    else:
                        stats.refuse("body_timeout", seconds=idle, bytes_read=got)
                    response = web.Response(status=408, text="request body read timeout\n")
                    response.force_close()
                    return response
                last = got
        finally:
            if not task.done():
                task.cancel()
            elif not task.cancelled():
                task.exception()  # retrieved: a handler failing as its client left is no error

    return guard
