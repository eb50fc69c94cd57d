"""Proxy ingest: a fail-open streaming reverse proxy in front of the live upstream.

:class:`ShadowProxy` is an aiohttp app on its own port. Response bodies (including SSE) are relayed
chunk by chunk as they arrive, byte for byte (no decompression), hop-by-hop headers are removed in
both
directions (RFC 9110 §7.6.1: ``Connection`` and every field it lists, ``Keep-Alive``,
``Proxy-Connection``, ``TE``, ``Transfer-Encoding``, ``Upgrade``), and a client disconnect closes
the
upstream connection (the server cancels the handler). The proxy can run on its own thread and event
loop (:meth:`ShadowProxy.start_in_thread`) so nothing on the sidecar's loop can delay it. The shadow
copy is handed to the shadow loop with ``call_soon``/``call_soon_threadsafe`` after the body is
read;
any error there is counted and never reaches the live response (fail-open). Requests already
carrying
the shadow marker header are never re-ingested (no replay loops).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib
import logging
import multiprocessing
import pickle
import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from specwatch.core.listen import ListenerStats, ListenLimits
from specwatch.core.listen_http import GuardedSite, body_timeout_middleware
from specwatch.core.logs import log_event
from specwatch.core.wire import CATEGORY_HEADER, SHADOW_MARKER_HEADER
from specwatch.shadow.ingest.offer import (
    REQUEST_ID_HEADER,
    SHADOW_PATHS,
    IngestCounters,
    Offer,
    Offerer,
)
from specwatch.shadow.values import ShadowRequest, Source

log = logging.getLogger("specwatch.shadow.ingest")

#: Answers of known length up to this many bytes (not event streams) are read whole and sent
#: with their headers in one write; larger or unknown-length ones are relayed chunk by chunk.
WHOLE_BODY_BYTES = 64 << 10


def _is_event_stream(headers: CIMultiDictProxy[str]) -> bool:
    return headers.get("Content-Type", "").lower().startswith("text/event-stream")


#: How often the proxy process sends its ``proxy_*`` counters to the main process (seconds).
COUNTER_SYNC_SECONDS = 0.5
#: Copies queued towards a busy main process beyond this many bytes are dropped (counted as
#: ``proxy_offer_lost``): the proxy process never waits on the shadow side.
CHANNEL_MAX_BUFFER = 64 << 20
#: What the proxy process may ask the main process to run (the hand-over methods only).
_REMOTE_CALLS = frozenset(
    {"_offer_copy", "_count_error", "_count_too_large", "_set_proxy_counters"}
)
_FRAME = struct.Struct("!I")


async def _read_frame(reader: asyncio.StreamReader) -> tuple[str, tuple[Any, ...]] | None:
    """One ``(name, args)`` frame from our own proxy process; ``None`` at end of stream."""
    try:
        size = _FRAME.unpack(await reader.readexactly(_FRAME.size))[0]
        name, args = pickle.loads(await reader.readexactly(size))
    except asyncio.IncompleteReadError:
        return None
    return str(name), tuple(args)


class _Channel:
    """The proxy process's end of the hand-over socket: frames written without waiting."""

    def __init__(self, writer: asyncio.StreamWriter, counters: IngestCounters) -> None:
        self._writer = writer
        self._counters = counters

    def send(self, name: str, args: tuple[Any, ...]) -> None:
        """Queue one call for the main process; dropped and counted when it cannot keep up or
        is gone (never blocks, never raises)."""
        w = self._writer
        if w.is_closing() or w.transport.get_write_buffer_size() > CHANNEL_MAX_BUFFER:
            self._counters.proxy_offer_lost += 1
            return
        body = pickle.dumps((name, args), protocol=pickle.HIGHEST_PROTOCOL)
        w.write(_FRAME.pack(len(body)) + body)

    def sync(self) -> None:
        c = self._counters
        self.send(
            "_set_proxy_counters",
            (
                c.proxy_requests,
                c.proxy_client_disconnects,
                c.proxy_offer_lost,
                dict(c.proxy_upstream_errors),
            ),
        )


def _no_offer(_: ShadowRequest) -> str:  # the proxy process never offers: the main process does
    return "not_offered"


def _proxy_process_main(sock: socket.socket, options: dict[str, Any], host: str, port: int) -> None:
    """Entry point of the proxy process (``multiprocessing`` spawn): serve until the main
    process closes its end of ``sock`` (or dies), then stop."""
    loop = new_proxy_loop(bool(options["use_uvloop"]))
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(_proxy_process(sock, options, host, port))
    finally:
        loop.close()


async def _proxy_process(
    sock: socket.socket, options: dict[str, Any], host: str, port: int
) -> None:
    reader, writer = await asyncio.open_unix_connection(sock=sock)
    proxy = ShadowProxy(offer=_no_offer, counters=IngestCounters(), clock=time.time, **options)
    channel = _Channel(writer, proxy.counters)
    proxy._channel = channel
    try:
        bound = await proxy._serve(host, port)
    except OSError as exc:
        channel.send("_failed", (str(exc),))
        await writer.drain()
        writer.close()
        return
    channel.send("_bound", (bound,))

    async def sync() -> None:
        while True:
            await asyncio.sleep(COUNTER_SYNC_SECONDS)
            channel.sync()

    syncing = asyncio.create_task(sync())
    await reader.read()  # EOF: the main process is stopping us, or it died
    syncing.cancel()
    if proxy._runner is not None:
        await proxy._runner.cleanup()
    channel.sync()
    with contextlib.suppress(ConnectionError):
        await writer.drain()
    writer.close()


@dataclass
class _ProxyProcess:
    process: multiprocessing.process.BaseProcess
    writer: asyncio.StreamWriter
    receiving: asyncio.Task[None]


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


def hop_by_hop_names(headers: Mapping[str, str] | CIMultiDictProxy[str]) -> set[str]:
    """Lower-cased names to drop: the fixed hop-by-hop set plus every token listed in Connection."""
    names = set(HOP_BY_HOP)
    getall = getattr(headers, "getall", None)
    values: list[str] = (
        list(getall("Connection", [])) if getall is not None else [headers.get("Connection", "")]
    )
    for v in values:
        for tok in v.split(","):
            tok = tok.strip().lower()
            if tok:
                names.add(tok)
    return names


def end_to_end_headers(headers: CIMultiDictProxy[str], *, drop: frozenset[str]) -> CIMultiDict[str]:
    """Copy of ``headers`` without hop-by-hop fields and without the lower-cased names in
    ``drop``."""
    skip = hop_by_hop_names(headers) | drop
    out: CIMultiDict[str] = CIMultiDict()
    for k, v in headers.items():
        if k.lower() not in skip:
            out.add(k, v)
    return out


def new_proxy_loop(use_uvloop: bool) -> asyncio.AbstractEventLoop:
    """A fresh event loop for the proxy thread: uvloop's when asked and installed (the ``proxy``
    extra), else asyncio's default loop."""
    if use_uvloop:
        try:
            uvloop = importlib.import_module("uvloop")
        except ImportError:
            log.info("uvloop not installed; proxy uses the asyncio event loop")
        else:
            loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
            return loop
    return asyncio.new_event_loop()


class ShadowProxy:
    """Streaming, fail-open reverse proxy in front of ``upstream`` (``http://host:port``).

    ``app()`` builds the aiohttp application; run it with :meth:`start` (own port, handler
    cancellation on client disconnect) or any ``AppRunner(app, handler_cancellation=True)``.
    The client session is created on app startup (``auto_decompress=False``, unlimited pool,
    ``connect_timeout_seconds``; ``total_timeout_seconds`` ``None`` = no total limit, streams may be
    long) and closed on cleanup. Upstream failures before the response starts answer ``502``
    (connect) or ``504`` (timeout) with a small JSON body; after it starts, the client connection
    is closed so the client sees a truncated response, never a clean but short one.
    """

    def __init__(
        self,
        upstream: str,
        offer: Offer,
        *,
        counters: IngestCounters,
        clock: Callable[[], float],
        salt: str = "",
        max_body_bytes: int = 8 << 20,
        marker_header: str = SHADOW_MARKER_HEADER,
        connect_timeout_seconds: float = 10.0,
        total_timeout_seconds: float | None = None,
        use_uvloop: bool = True,
        listen: ListenLimits | None = None,
        listener: ListenerStats | None = None,
        shutdown_timeout_seconds: float = 5.0,
    ) -> None:
        self._use_uvloop = use_uvloop
        self._listen = listen if listen is not None else ListenLimits()
        self.listener = listener if listener is not None else ListenerStats("proxy")
        self._shutdown_timeout = shutdown_timeout_seconds
        self.upstream = URL(upstream.rstrip("/"))
        self._base = upstream.rstrip("/")
        self._offerer = Offerer(offer, counters, clock, salt)
        self.counters = counters
        self._max = max_body_bytes
        self._marker = marker_header
        self._timeout = aiohttp.ClientTimeout(
            total=total_timeout_seconds, sock_connect=connect_timeout_seconds
        )
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._offer_loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._thread_loop: asyncio.AbstractEventLoop | None = None
        self._channel: _Channel | None = None  # set in the proxy process only
        self._child: _ProxyProcess | None = None  # set in the main process in process mode
        self._lost_here = 0
        self.port: int | None = None

    def app(self) -> web.Application:
        app = web.Application(
            client_max_size=self._max,
            middlewares=[body_timeout_middleware(self._listen, self.listener)],
        )
        app.router.add_route("*", "/{tail:.*}", self.handle)
        app.cleanup_ctx.append(self._session_ctx)
        return app

    async def _session_ctx(self, app: web.Application) -> Any:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
            auto_decompress=False,
            timeout=self._timeout,
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept", "Content-Type"),
        )
        yield
        await self._session.close()
        self._session = None

    async def start(self, host: str, port: int) -> int:
        """Serve on ``host:port`` (0 = any free port) on the running loop; returns the port."""
        self._offer_loop = asyncio.get_running_loop()
        return await self._serve(host, port)

    async def _serve(self, host: str, port: int) -> int:
        self._runner = web.AppRunner(
            self.app(),
            handler_cancellation=True,
            access_log=None,
            shutdown_timeout=self._shutdown_timeout,
            keepalive_timeout=self._listen.keepalive_timeout_seconds,
        )
        await self._runner.setup()
        site = GuardedSite(self._runner, host, port, limits=self._listen, stats=self.listener)
        await site.start()
        addrs = self._runner.addresses
        self.port = int(addrs[0][1]) if addrs else port
        return self.port

    async def start_in_thread(self, host: str, port: int) -> int:
        """Serve on ``host:port`` from a dedicated thread with its own event loop.

        The live path then never waits on the caller's loop (the shadow chain, scrapes, statistics):
        only the parsed-out shadow copy crosses over, with ``call_soon_threadsafe``, and ingest
        counters other than ``proxy_*`` are updated on the caller's loop. Returns the bound port.
        """
        self._offer_loop = asyncio.get_running_loop()
        started: concurrent.futures.Future[int] = concurrent.futures.Future()
        loop = new_proxy_loop(self._use_uvloop)
        self._thread_loop = loop

        def run() -> None:
            asyncio.set_event_loop(loop)

            async def boot() -> None:
                try:
                    started.set_result(await self._serve(host, port))
                except OSError as exc:
                    started.set_exception(exc)

            loop.run_until_complete(boot())
            if started.exception() is None:
                loop.run_forever()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

        self._thread = threading.Thread(target=run, name="specwatch-shadow-proxy", daemon=True)
        self._thread.start()
        return await asyncio.wrap_future(started)

    async def start_in_process(self, host: str, port: int) -> int:
        """Serve on ``host:port`` from a separate process (``multiprocessing`` spawn), so the
        live path shares neither the event loop nor the GIL with the shadow side.

        The proxy process relays live traffic by itself; each shadow copy (and each ``too_large``
        / ``incomplete_body`` count) is sent to this process over a local socket pair and handed
        to the offerer here, and its ``proxy_*`` counters are sent every
        :data:`COUNTER_SYNC_SECONDS`. It never waits for this process: copies beyond
        :data:`CHANNEL_MAX_BUFFER` queued bytes are dropped and counted (fail-open). Its life is
        tied to this process: it stops when :meth:`stop` closes the socket or when this process
        dies (the socket's end of stream). Returns the bound port; raises ``OSError`` when the
        port cannot be bound."""
        self._offer_loop = asyncio.get_running_loop()
        options: dict[str, Any] = {
            "upstream": self._base,
            "max_body_bytes": self._max,
            "marker_header": self._marker,
            "connect_timeout_seconds": self._timeout.sock_connect,
            "total_timeout_seconds": self._timeout.total,
            "use_uvloop": self._use_uvloop,
        }
        here, there = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ctx = multiprocessing.get_context("spawn")
        process = ctx.Process(
            target=_proxy_process_main,
            args=(there, options, host, port),
            name="specwatch-shadow-proxy",
            daemon=True,
        )
        try:
            await asyncio.to_thread(process.start)
        finally:
            there.close()
        reader, writer = await asyncio.open_unix_connection(sock=here)
        first = await _read_frame(reader)
        if first is None or first[0] != "_bound":
            writer.close()
            await asyncio.to_thread(process.join, 10)
            reason = first[1][0] if first is not None else "proxy process exited"
            raise OSError(f"shadow proxy cannot listen on {host}:{port}: {reason}")
        self.port = int(first[1][0])
        receiving = asyncio.create_task(self._receive(reader), name="specwatch-proxy-channel")
        self._child = _ProxyProcess(process, writer, receiving)
        return self.port

    async def _receive(self, reader: asyncio.StreamReader) -> None:
        """Run the proxy process's hand-overs here until its end of stream."""
        while (frame := await _read_frame(reader)) is not None:
            name, args = frame
            if name in _REMOTE_CALLS:
                getattr(self, name)(*args)
        if self._child is not None and not self._child.writer.is_closing():
            log_event(log, logging.ERROR, "shadow proxy process exited")

    async def stop(self) -> None:
        """Stop serving (any mode); waits for in-progress cleanup."""
        child = self._child
        if child is not None:
            self._child = None
            with contextlib.suppress(OSError):
                child.writer.write_eof()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(child.receiving), 10)
            child.writer.close()
            await asyncio.to_thread(child.process.join, 10)
            if child.process.is_alive():
                child.process.kill()
                await asyncio.to_thread(child.process.join)
            return
        thread, loop = self._thread, self._thread_loop
        if thread is not None and loop is not None:
            if self._runner is not None:
                fut = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), loop)
                await asyncio.wrap_future(fut)
                self._runner = None
            loop.call_soon_threadsafe(loop.stop)
            await asyncio.to_thread(thread.join)
            self._thread = self._thread_loop = None
            return
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _schedule(self, fn: Callable[..., object], *args: object) -> None:
        """Run ``fn(*args)`` soon on the offer loop (in the proxy process: send it to the main
        process); never blocks or raises into the live path."""
        if self._channel is not None:
            self._channel.send(getattr(fn, "__name__", ""), args)
            return
        target = self._offer_loop
        try:
            if target is None or target is asyncio.get_running_loop():
                asyncio.get_running_loop().call_soon(fn, *args)
            else:
                target.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the offer loop is closed: the shadow side is gone, live goes on
            self.counters.proxy_offer_lost += 1

    def _incomplete_body(self, shadow: bool) -> None:
        """The client's upload stopped before its end: nothing is sent upstream; counted (for a
        shadowed path) as ``incomplete_body`` on the shadow loop, logged once, no traceback."""
        log_event(log, logging.WARNING, "proxy client body incomplete")
        if shadow:
            self._schedule(self._count_error, "incomplete_body")

    def _count_error(self, reason: str) -> None:
        self.counters.received[Source.PROXY.value] += 1
        self.counters.errors[(Source.PROXY.value, reason)] += 1

    def _count_too_large(self) -> None:
        self.counters.received[Source.PROXY.value] += 1
        self.counters.errors[(Source.PROXY.value, "too_large")] += 1

    def _offer_copy(
        self, path: str, raw: bytes, category: str | None, request_id: str | None
    ) -> None:
        self._offerer.offer_raw(Source.PROXY, path, raw, category, request_id)

    def _set_proxy_counters(
        self, requests: int, disconnects: int, offer_lost: int, upstream_errors: dict[str, int]
    ) -> None:
        """The proxy process's ``proxy_*`` counters (its own totals, sent every
        :data:`COUNTER_SYNC_SECONDS` and at stop)."""
        c = self.counters
        c.proxy_requests = requests
        c.proxy_client_disconnects = disconnects
        c.proxy_offer_lost = offer_lost + self._lost_here
        c.proxy_upstream_errors.clear()
        c.proxy_upstream_errors.update(upstream_errors)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        c = self.counters
        c.proxy_requests += 1
        session = self._session
        if session is None:
            return web.json_response({"error": "proxy not started"}, status=503)
        headers = end_to_end_headers(
            request.headers, drop=PROXY_CREDENTIALS | {"host", "content-length"}
        )
        peer = request.remote
        if peer:
            prior = request.headers.get("X-Forwarded-For")
            headers["X-Forwarded-For"] = f"{prior}, {peer}" if prior else peer
        shadow = (
            request.method == "POST"
            and request.path in SHADOW_PATHS
            and not request.headers.get(self._marker)
        )
        if request.method == "POST" and request.path in SHADOW_PATHS and not shadow:
            c.skipped_marked += 1
        data: Any
        cut = [False]
        cl = request.content_length
        if not request.body_exists:
            data = None
        elif cl is not None and cl <= self._max:
            try:
                data = await request.read()
            except asyncio.CancelledError:
                self._incomplete_body(shadow)
                raise
            except (aiohttp.ClientPayloadError, ConnectionError):
                self._incomplete_body(shadow)
                return web.Response(status=400)
            headers["Content-Length"] = str(len(data))
            if shadow:
                self._schedule(
                    self._offer_copy,
                    request.path,
                    data,
                    request.headers.get(CATEGORY_HEADER),
                    request.headers.get(REQUEST_ID_HEADER),
                )
        else:
            # unknown or large length: stream the body through; the shadow copy is kept only
            # while it stays under the cap.
            if cl is not None:
                headers["Content-Length"] = str(cl)
            data = self._tee(request, shadow, cut)
        url = URL(self._base + request.raw_path, encoded=True)
        prepared = False
        try:
            async with session.request(
                request.method,
                url,
                headers=headers,
                data=data,
                allow_redirects=False,
                compress=None,
            ) as up:
                out_headers = end_to_end_headers(up.headers, drop=PROXY_CREDENTIALS)
                small = up.content_length is not None and up.content_length <= WHOLE_BODY_BYTES
                if small and request.method != "HEAD" and not _is_event_stream(up.headers):
                    # a small answer of known length (a JSON completion): read it whole and send
                    # status, headers and body in one write (one send() instead of two)
                    body = await up.read()
                    out_headers.popall("Content-Length", None)
                    return web.Response(
                        status=up.status, reason=up.reason, body=body, headers=out_headers
                    )
                resp = web.StreamResponse(status=up.status, reason=up.reason)
                for k, v in out_headers.items():
                    resp.headers.add(k, v)
                if up.content_length is not None and request.method != "HEAD":
                    resp.content_length = up.content_length
                await resp.prepare(request)
                prepared = True
                try:
                    async for chunk in up.content.iter_any():
                        if not await self._relay(resp, chunk, up):
                            return resp
                    await self._relay(resp, None, up)
                except asyncio.CancelledError:
                    self._client_gone(up)
                    raise
                return resp
        except TimeoutError:
            return self._fail("timeout", 504, prepared, cut[0])
        except aiohttp.ClientConnectorError:
            return self._fail("connect", 502, prepared, cut[0])
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError):
            return self._fail("disconnected", 502, prepared, cut[0])
        except aiohttp.ClientError:
            return self._fail("client_error", 502, prepared, cut[0])

    async def _relay(
        self, resp: web.StreamResponse, chunk: bytes | None, up: aiohttp.ClientResponse
    ) -> bool:
        """Write ``chunk`` (``None``: end of body) to the client; ``False`` when the client went
        away. Then the upstream connection is closed (not released) so the upstream sees the
        disconnect and stops generating; it is counted as a client disconnect, never as an
        upstream error, and logged once without a traceback (a cancelled handler, the server's
        answer to a disconnect, is counted the same way by the caller)."""
        try:
            if chunk is None:
                await resp.write_eof()
            else:
                await resp.write(chunk)
        except ConnectionError:
            self._client_gone(up)
            return False
        return True

    def _client_gone(self, up: aiohttp.ClientResponse) -> None:
        self.counters.proxy_client_disconnects += 1
        up.close()
        log_event(log, logging.INFO, "proxy client disconnected")

    def _fail(
        self, reason: str, status: int, prepared: bool, client_cut: bool = False
    ) -> web.StreamResponse:
        if client_cut:  # the client's upload stopped: counted by _tee, not an upstream error
            return web.Response(status=400)
        self.counters.proxy_upstream_errors[reason] += 1
        log_event(log, logging.WARNING, "proxy upstream failed", reason=reason, prepared=prepared)
        if prepared:
            # the status line is sent: abort the connection so the client sees a truncated body
            raise ConnectionResetError(f"upstream {reason} mid-response")
        return web.json_response({"error": {"message": f"upstream {reason}"}}, status=status)

    async def _tee(self, request: web.Request, shadow: bool, cut: list[bool]) -> Any:
        """Stream the client's body upstream, keeping the shadow copy under the cap; a body cut
        by the client sets ``cut[0]`` (the handler then answers without blaming the upstream)."""
        copy: bytearray | None = bytearray() if shadow else None
        try:
            async for chunk in request.content.iter_any():
                if copy is not None:
                    copy += chunk
                    if len(copy) > self._max:
                        copy = None
                        self._schedule(self._count_too_large)
                yield chunk
        except (aiohttp.ClientPayloadError, ConnectionError):
            cut[0] = True
            self._incomplete_body(shadow)
            raise
        if copy is not None:
            self._schedule(
                self._offer_copy,
                request.path,
                bytes(copy),
                request.headers.get(CATEGORY_HEADER),
                request.headers.get(REQUEST_ID_HEADER),
            )
