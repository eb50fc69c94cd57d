"""Proxy ingest: a fail-open streaming reverse proxy in front of the live upstream, for users
without a service mesh (with one, the mesh mirrors requests to ``modes: [mirror]``).

:class:`ShadowProxy` is an :mod:`aiohttp.web` server on its own port and one
:class:`aiohttp.ClientSession` to the upstream, on the sidecar's event loop. Bodies pass as
bytes both ways: an answer is relayed chunk by chunk as it arrives (SSE events are not held
back), nothing is decompressed or re-encoded (``auto_decompress=False``; ``Content-Encoding``
and ``Content-Length`` pass unchanged). Hop-by-hop fields (RFC 9110 §7.6.1: ``Connection``
and every field it names, ``Keep-Alive``, ``Proxy-Connection``, ``TE``, ``Trailer``,
``Transfer-Encoding``, ``Upgrade``) and proxy credentials are dropped both ways; the client's
address is appended to ``X-Forwarded-For``.

The listener is a :class:`~specwatch.core.listen_http.GuardedSite` (connection cap, each
client's share of it, request head timeout) with the body-timeout middleware (a stalled or
trickled upload is answered ``408``); aiohttp's parser (llhttp) refuses ambiguous framing
(``Content-Length`` with ``Transfer-Encoding``, two ``Content-Length`` fields) with ``400``
before any byte goes up. A client that leaves cancels its handler (``handler_cancellation``),
which closes the upstream connection at once, before or after the first byte of the answer.

The shadow copy of a ``POST`` to a shadowed path is handed to the offerer with
``loop.call_soon`` once its body is whole: the live request never waits on the shadow side,
and any failure there is counted, never seen by the live client (fail-open). Requests
already carrying the shadow marker header are never re-ingested (no replay loops).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from specwatch.core.clock import WallClock
from specwatch.core.listen import MAX_FIELD_BYTES, ListenerStats, ListenLimits
from specwatch.core.listen_http import GuardedSite, body_timeout_middleware
from specwatch.core.logs import RateLimitedLog
from specwatch.shadow.ingest.offer import (
    SHADOW_PATHS,
    CopyHeaders,
    IngestCounters,
    Offer,
    Offerer,
)
from specwatch.shadow.settings import ShadowSettings
from specwatch.shadow.values import Source

__all__ = ["HOP_BY_HOP", "ShadowProxy", "forwarded_fields"]

log = logging.getLogger("specwatch.shadow.ingest")

#: RFC 9110 §7.6.1 connection-specific fields (plus the legacy ``Proxy-Connection``) and the
#: credentials meant for a proxy (RFC 9110 §11.7): never passed on, either way.
HOP_BY_HOP: frozenset[str] = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "proxy-authorization",
        "proxy-authenticate",
        "proxy-authentication-info",
    }
)
#: Request fields not sent up as they came: ``Host`` is the upstream's (set by the client
#: session), ``Expect`` is answered here, ``X-Forwarded-For`` is appended to.
_DROP_REQUEST = HOP_BY_HOP | {"host", "expect", "x-forwarded-for"}
#: How long an upload the answer did not wait for is still read (and dropped) before its
#: connection is closed, so the client reads the answer rather than a reset.
LINGER_SECONDS = 0.5
#: What the runner's own shutdown may take once :meth:`ShadowProxy.stop` has ended every
#: exchange (only idle connections are left to close).
CLOSE_SECONDS = 0.05
#: Fields the client session would add on its own; the proxy sends the client's only.
_NO_AUTO_HEADERS = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")


def forwarded_fields(fields: CIMultiDictProxy[str], drop: frozenset[str]) -> CIMultiDict[str]:
    """``fields`` in order, without those named in ``drop`` (lower-case) or listed in their
    ``Connection`` field."""
    named = {
        token.strip().lower()
        for value in fields.getall("Connection", ())
        for token in value.split(",")
    }
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in fields.items():
        low = name.lower()
        if low not in drop and low not in named:
            out.add(name, value)
    return out


class ShadowProxy:
    """Streaming, fail-open reverse proxy in front of ``settings.proxy_upstream``
    (``http[s]://host:port``, optionally with a base path), set by the ``shadow`` group's
    ``proxy_*`` fields, ``marker_header`` and ``sample_salt``. Run it with :meth:`start`, then
    :meth:`stop`. The connect timeout bounds a new upstream connection; the total timeout
    (``None``: no limit, streams may be long) a whole exchange; the stream idle timeout
    (``None``: none) how long an exchange may make no progress (the upstream sends nothing, or
    the client reads nothing) while an answer is owed: then both sides are closed, counted as
    ``stalled``. Upstream failures before the answer starts answer ``502`` (``connect``,
    ``disconnected``, ``client_error``: a malformed answer) or ``504`` (``timeout``,
    ``stalled``) with a small JSON body; after it starts the client connection is aborted, so
    the client sees a truncated answer, never a clean short one. ``listen`` limits the
    listener; ``listener`` counts its refusals and open connections. Raises ``ValueError`` for
    an upstream that is not an http(s) URL."""

    def __init__(
        self,
        settings: ShadowSettings,
        offer: Offer,
        *,
        counters: IngestCounters,
        wall_clock: WallClock,
        listen: ListenLimits | None = None,
        listener: ListenerStats | None = None,
        shutdown_timeout_seconds: float = 5.0,
    ) -> None:
        upstream = settings.proxy_upstream or ""
        base = URL(upstream.rstrip("/"))
        if base.scheme not in ("http", "https") or not base.host:
            raise ValueError(f"proxy upstream must be an http(s) URL: {upstream!r}")
        self._base = str(base)
        self._offerer = Offerer(offer, counters, wall_clock, settings.sample_salt)
        self.counters = counters
        self._max = settings.proxy_max_body_bytes
        self._marker = settings.marker_header
        self._connect_timeout = settings.proxy_connect_timeout_seconds
        self._total_timeout = settings.proxy_total_timeout_seconds
        self._idle = settings.proxy_stream_idle_timeout_seconds
        self._listen = listen if listen is not None else ListenLimits()
        #: Counters of this listener (``proxy``): refused connections and requests.
        self.listener = listener if listener is not None else ListenerStats("proxy")
        self._shutdown_timeout = shutdown_timeout_seconds
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._errors = RateLimitedLog(log)
        #: the tasks running an exchange now (what :meth:`stop` waits for, then cuts)
        self._exchanges: set[asyncio.Task[Any]] = set()
        self._cutting = False
        self.port: int | None = None

    async def start(self, host: str, port: int) -> int:
        """Serve on ``host:port`` (0 = any free port) on the running loop; returns the port.
        Raises ``OSError`` when the address cannot be bound."""
        app = web.Application(
            client_max_size=0,  # bodies stream through; only the copy is capped
            middlewares=[body_timeout_middleware(self._listen, self.listener)],
        )
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=False),
            timeout=aiohttp.ClientTimeout(total=self._total_timeout, connect=self._connect_timeout),
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=_NO_AUTO_HEADERS,
        )
        self._runner = web.AppRunner(
            app,
            access_log=None,
            handler_cancellation=True,  # a client that leaves cancels its exchange
            lingering_time=LINGER_SECONDS,
            shutdown_timeout=CLOSE_SECONDS,  # at stop no exchange is left (stop cut them)
            keepalive_timeout=self._listen.keepalive_timeout_seconds,
            max_line_size=MAX_FIELD_BYTES,
            max_field_size=MAX_FIELD_BYTES,
        )
        await self._runner.setup()
        try:
            await GuardedSite(
                self._runner, host, port, limits=self._listen, stats=self.listener
            ).start()
        except OSError:
            await self.stop()
            raise
        addrs = self._runner.addresses
        self.port = int(addrs[0][1]) if addrs else port
        return self.port

    async def stop(self, grace_seconds: float | None = None) -> None:
        """Stop accepting, let exchanges in progress finish for up to ``grace_seconds``
        (``None``: the shutdown timeout), then cut what is left (their clients see a cut
        answer) and close idle connections and the upstream connections. Returns within the
        grace and a few milliseconds. Later calls do nothing."""
        runner, self._runner = self._runner, None
        if runner is not None:
            grace = self._shutdown_timeout if grace_seconds is None else max(0.0, grace_seconds)
            for site in list(runner.sites):
                await site.stop()
            if self._exchanges:
                await asyncio.wait(set(self._exchanges), timeout=grace)
            left = set(self._exchanges)
            self._cutting = True
            for task in left:
                task.cancel()
            if left:
                await asyncio.wait(left)
            await runner.cleanup()  # no exchange left: closes the idle connections at once
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        task = asyncio.current_task()
        assert task is not None  # aiohttp runs each handler in a task
        self._exchanges.add(task)
        try:
            return await self._proxy(request)
        finally:
            self._exchanges.discard(task)

    async def _proxy(self, request: web.Request) -> web.StreamResponse:
        self.counters.proxy_requests += 1
        if any(
            v.strip().lower() != "chunked" for v in request.headers.getall("Transfer-Encoding", ())
        ):
            # a coding besides chunked: sent up as plain chunked, its coded bytes would reach
            # the upstream as the body itself
            self.listener.refuse("bad_request", error="transfer_coding")
            refused = web.Response(status=400, text="unsupported transfer coding\n")
            refused.force_close()
            return refused
        session = self._session
        assert session is not None  # handlers run only between start and stop
        headers = forwarded_fields(request.headers, _DROP_REQUEST)
        peer = request.remote
        if peer:
            prior = request.headers.getall("X-Forwarded-For", ())
            headers["X-Forwarded-For"] = ", ".join([*prior, peer])
        copy = request.method == "POST" and request.path in SHADOW_PATHS
        if copy and self._marker in request.headers:
            self.counters.skipped_marked += 1
            copy = False
        if copy and (request.content_length or 0) > self._max:
            self._count_copy_error(request, "too_large")  # decided from the declared length
            copy = False
        length = request.content_length
        if (
            length is not None
            and length <= self._max
            and not request.headers.get("Transfer-Encoding")
        ):
            # a body of known length under the cap (every JSON completion request): read whole,
            # then sent up in one write; its copy needs no tee
            try:
                raw = await request.read()
            except (asyncio.CancelledError, OSError, aiohttp.ClientError):
                if copy:  # the client left or stalled before its body was whole
                    self._count_copy_error(request, "incomplete_body")
                raise
            if copy:
                self._offer_soon(request, raw)
            return await self._exchange(request, session, headers, raw if raw else None)
        tee = _Tee(self._max) if copy else None
        body = self._body(request, tee) if request.body_exists else None
        try:
            return await self._exchange(request, session, headers, body)
        finally:
            if tee is not None and tee.pending:
                self._count_copy_error(request, "incomplete_body")

    async def _exchange(
        self,
        request: web.Request,
        session: aiohttp.ClientSession,
        headers: CIMultiDict[str],
        body: AsyncIterator[bytes] | bytes | None,
    ) -> web.StreamResponse:
        """Send the request up and relay the answer (see the class docstring for failures)."""
        loop = asyncio.get_running_loop()
        idle = asyncio.timeout(None)
        out: web.StreamResponse | None = None
        try:
            async with idle:
                self._push(idle, loop)
                async with session.request(
                    request.method,
                    URL(self._base + request.raw_path, encoded=True),
                    headers=headers,
                    data=body,
                    allow_redirects=False,
                ) as up:
                    out = web.StreamResponse(
                        status=up.status,
                        reason=up.reason,
                        headers=forwarded_fields(up.headers, HOP_BY_HOP),
                    )
                    await out.prepare(request)
                    self._push(idle, loop)
                    async for chunk in up.content.iter_any():
                        await out.write(chunk)
                        self._push(idle, loop)
                    await out.write_eof()
                    return out
        except asyncio.CancelledError:
            if not self._cutting:  # the client left (else: stop cut the exchange)
                self.counters.proxy_client_disconnects += 1
            raise
        except ConnectionResetError:
            if out is None:  # the upstream reset the connection before answering
                self.counters.proxy_upstream_errors["disconnected"] += 1
                return _failed("disconnected", 502)
            self.counters.proxy_client_disconnects += 1  # the client left mid-answer
            return out
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            reason, status = _upstream_failure(exc, idle.expired())
            self._count_upstream(reason, exc)
            if out is None:
                return _failed(reason, status)
            if request.transport is not None:
                request.transport.abort()  # a truncated answer, never a clean short one
            return out

    def _push(self, idle: asyncio.Timeout, loop: asyncio.AbstractEventLoop) -> None:
        """Move the no-progress deadline ``idle`` to a stream idle timeout from now."""
        if self._idle is not None:
            idle.reschedule(loop.time() + self._idle)

    async def _body(self, request: web.Request, tee: _Tee | None) -> AsyncIterator[bytes]:
        """The request body as it arrives, sent up chunk by chunk; with ``tee``, the chunks
        are also kept (up to the cap) and the whole body is handed to the offerer once the
        upload ends, on a later turn of the loop (the live exchange never waits for it)."""
        async for chunk in request.content.iter_any():
            if tee is not None and not tee.keep(chunk):
                self._count_copy_error(request, "too_large")
                tee = None
            yield chunk
        if tee is not None:
            tee.pending = False
            self._offer_soon(request, b"".join(tee.chunks))

    def _offer_soon(self, request: web.Request, raw: bytes) -> None:
        """Hand the copy of ``request`` (its whole body ``raw``) to the offerer on a later turn
        of the loop: the live exchange goes on first."""
        asyncio.get_running_loop().call_soon(
            self._offerer.offer_copy,
            Source.PROXY,
            request.path,
            raw,
            CopyHeaders.of(request.headers),
        )

    def _count_copy_error(self, request: web.Request, reason: str) -> None:
        """A copy not made: counted as received and rejected, logged (rate-limited)."""
        self._offerer.reject(Source.PROXY, reason, peer=request.remote or "", path=request.path)

    def _count_upstream(self, reason: str, exc: BaseException) -> None:
        self.counters.proxy_upstream_errors[reason] += 1
        self._errors.warning(
            "shadow proxy upstream failed", reason=reason, error=type(exc).__name__
        )


class _Tee:
    """The kept chunks of one request body being copied (at most ``cap`` bytes);
    ``pending`` until the copy is handed over or given up."""

    __slots__ = ("cap", "chunks", "pending", "size")

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.chunks: list[bytes] = []
        self.size = 0
        self.pending = True

    def keep(self, chunk: bytes) -> bool:
        """Keep ``chunk``; ``False`` (and no longer pending) once the body is past the cap."""
        self.size += len(chunk)
        if self.size > self.cap:
            self.pending = False
            self.chunks.clear()
            return False
        self.chunks.append(chunk)
        return True


def _failed(reason: str, status: int) -> web.Response:
    """The answer to a request whose upstream failed before its answer started."""
    return web.json_response({"error": {"message": "upstream " + reason}}, status=status)


def _upstream_failure(exc: BaseException, stalled: bool) -> tuple[str, int]:
    """The reason (``proxy_upstream_errors`` key) and the status answered before the answer
    started, for an upstream failure ``exc``; ``stalled``: the no-progress deadline passed."""
    if stalled:
        return "stalled", 504
    if isinstance(exc, TimeoutError):
        return "timeout", 504
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "connect", 502
    if isinstance(exc, aiohttp.ClientResponseError):
        return "client_error", 502
    return "disconnected", 502
