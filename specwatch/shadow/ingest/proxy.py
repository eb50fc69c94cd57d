"""Proxy ingest: a fail-open streaming reverse proxy in front of the live upstream.

:class:`ShadowProxy` listens on its own port with the HTTP/1.1 forwarding engine of
:mod:`specwatch.http1` (asyncio protocols, llhttp parsing, pooled keep-alive
upstream connections, answers relayed as bytes: SSE and chunked bodies pass as they arrive,
nothing is decompressed or re-encoded). Hop-by-hop fields are removed both ways (RFC 9110
§7.6.1) and a client disconnect closes the upstream connection. Where it runs: in a child process
of its own (:meth:`ShadowProxy.start_in_process`, the default of ``shadow.proxy_own_process``: no
shared loop or GIL with the shadow side), on its own thread and event loop
(:meth:`ShadowProxy.start_in_thread`) or on the caller's loop (:meth:`ShadowProxy.start`). The
shadow copy of a ``POST`` to a shadowed path is handed to the shadow loop
(``call_soon``/``call_soon_threadsafe``, or over a socket pair from the child process) after its
body is read; any error there is counted and never reaches the live response (fail-open).
Requests already carrying the shadow marker header are never re-ingested (no replay loops).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import importlib
import logging
import multiprocessing
import pickle
import signal
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specwatch.core.clock import SYSTEM_WALL, WallClock
from specwatch.core.listen import ListenerStats, ListenLimits
from specwatch.core.logs import log_event
from specwatch.core.wire import CATEGORY_HEADER, SHADOW_MARKER_HEADER
from specwatch.http1.forwarder import Forwarder
from specwatch.http1.pool import Upstream
from specwatch.shadow.ingest.offer import (
    REQUEST_ID_HEADER,
    SHADOW_PATHS,
    IngestCounters,
    Offer,
    Offerer,
)
from specwatch.shadow.values import ShadowRequest, Source

log = logging.getLogger("specwatch.shadow.ingest")

#: How often the proxy process sends its ``proxy_*`` counters to the main process (seconds).
COUNTER_SYNC_SECONDS = 0.5
#: The proxy process sends the hand-overs of this many seconds in one write (a copy reaches the
#: shadow side at most this late; one send per batch instead of one per live request).
HANDOVER_BATCH_SECONDS = 0.2
#: Copies queued towards a busy main process beyond this many bytes are dropped (counted as
#: ``proxy_offer_lost``): the proxy process never waits on the shadow side.
CHANNEL_MAX_BUFFER = 64 << 20
#: What the proxy process may ask the main process to run (the hand-over methods only).
_REMOTE_CALLS = frozenset(
    {
        "_offer_copy",
        "_count_error",
        "_count_too_large",
        "_count_marked",
        "_set_proxy_counters",
    }
)
_FRAME = struct.Struct("!I")
_GRACE = struct.Struct("!d")
#: How long a proxy process that was told to stop may take past its grace (hand-overs sent,
#: counters synced, the process gone) before it is killed.
CHILD_EXIT_SECONDS = 0.5


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

    def send(self, name: str, args: tuple[Any, ...], calls: int = 1) -> None:
        """Queue one call (``calls``: the calls a ``_batch`` frame carries) for the main
        process; dropped and counted when it cannot keep up or is gone (never blocks, never
        raises)."""
        w = self._writer
        if w.is_closing() or w.transport.get_write_buffer_size() > CHANNEL_MAX_BUFFER:
            self._counters.proxy_offer_lost += calls
            return
        body = pickle.dumps((name, args), protocol=pickle.HIGHEST_PROTOCOL)
        w.write(_FRAME.pack(len(body)) + body)

    def sync(self, listener: ListenerStats) -> None:
        c = self._counters
        self.send(
            "_set_proxy_counters",
            (
                c.proxy_requests,
                c.proxy_client_disconnects,
                c.proxy_offer_lost,
                dict(c.proxy_upstream_errors),
                dict(listener.refused),
                listener.open,
            ),
        )


def _no_offer(_: ShadowRequest) -> str:  # the proxy process never offers: the main process does
    return "not_offered"


def _proxy_process_main(sock: socket.socket, options: dict[str, Any], host: str, port: int) -> None:
    """Entry point of the proxy process (``multiprocessing`` spawn): serve until the main
    process closes its end of ``sock`` (or dies), then stop. SIGTERM and SIGINT are the main
    process's to handle (a signal to the whole process group must not cut live streams
    before the main process drains them)."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
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
    proxy = ShadowProxy(
        offer=_no_offer, counters=IngestCounters(), wall_clock=SYSTEM_WALL, **options
    )
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
    # what start-up made lives as long as the process: out of the collector's way, so its
    # full collections do not walk it during live traffic
    gc.freeze()

    async def sync() -> None:
        while True:
            await asyncio.sleep(COUNTER_SYNC_SECONDS)
            channel.sync(proxy.listener)

    syncing = asyncio.create_task(sync())
    # EOF: the main process is stopping us (after the seconds its open exchanges may still
    # run, as a double), or it died (nothing sent: our own shutdown timeout)
    sent = await reader.read()
    grace = _GRACE.unpack(sent[-_GRACE.size :])[0] if len(sent) >= _GRACE.size else None
    syncing.cancel()
    if proxy._forwarder is not None:
        await proxy._forwarder.stop(proxy._shutdown_timeout if grace is None else grace)
    proxy._flush()  # the hand-overs of the last batch
    channel.sync(proxy.listener)
    with contextlib.suppress(ConnectionError):
        await writer.drain()
    writer.close()


@dataclass
class _ProxyProcess:
    process: multiprocessing.process.BaseProcess
    writer: asyncio.StreamWriter
    receiving: asyncio.Task[None]


class ProxyProcessExited(RuntimeError):
    """The proxy process ended while this process still served: the live port is gone."""


__all__ = ["ProxyProcessExited", "ShadowProxy"]


def new_proxy_loop(use_uvloop: bool) -> asyncio.AbstractEventLoop:
    """A fresh event loop for the proxy thread or process: uvloop's when asked and installed (a
    dependency except on Windows), else asyncio's default loop."""
    if use_uvloop:
        try:
            uvloop = importlib.import_module("uvloop")
        except ImportError:
            log.info("uvloop not installed; proxy uses the asyncio event loop")
        else:
            loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
            return loop
    return asyncio.new_event_loop()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _run_all(calls: list[tuple[Callable[..., object], tuple[object, ...]]]) -> None:
    """Run queued hand-overs on the shadow loop, in order."""
    for fn, args in calls:
        fn(*args)


class _ToShadow:
    """The engine's hand-over (:class:`~specwatch.http1.engine.Handover`) to the
    shadow side through :meth:`ShadowProxy._schedule`."""

    def __init__(self, proxy: ShadowProxy) -> None:
        self._p = proxy

    def copy(self, path: str, raw: bytes, category: str | None, request_id: str | None) -> None:
        p = self._p
        p._schedule(p._offer_copy, path, raw, category, request_id)

    def too_large(self) -> None:
        self._p._schedule(self._p._count_too_large)

    def incomplete(self, shadow: bool) -> None:
        if shadow:
            self._p._schedule(self._p._count_error, "incomplete_body")

    def marked(self) -> None:
        self._p._schedule(self._p._count_marked)


class ShadowProxy:
    """Streaming, fail-open reverse proxy in front of ``upstream`` (``http[s]://host:port``,
    optionally with a base path).

    Run it with :meth:`start` (the caller's loop), :meth:`start_in_thread` or
    :meth:`start_in_process`, then :meth:`stop`. ``connect_timeout_seconds`` bounds a new upstream
    connection; ``total_timeout_seconds`` (``None``: no limit, streams may be long) bounds a whole
    exchange; ``stream_idle_timeout_seconds`` (60 s; ``None``: none) bounds how long the upstream
    may send nothing while an answer is owed (then both sides are closed, counted as
    ``stalled``). Upstream failures before the response starts answer ``502`` (connect,
    disconnected, malformed answer) or ``504`` (timeout, stalled) with a small JSON body; after
    it starts, the client connection is aborted so the client sees a truncated response, never
    a clean but short one.
    ``listen`` limits the listener (connections, header/body read timeouts, keep-alive idle);
    ``listener`` counts its refusals and open connections. Raises ``ValueError`` for an upstream
    that is not an http(s) URL.
    """

    def __init__(
        self,
        upstream: str,
        offer: Offer,
        *,
        counters: IngestCounters,
        wall_clock: WallClock,
        salt: str = "",
        max_body_bytes: int = 8 << 20,
        marker_header: str = SHADOW_MARKER_HEADER,
        connect_timeout_seconds: float = 10.0,
        total_timeout_seconds: float | None = None,
        stream_idle_timeout_seconds: float | None = 60.0,
        use_uvloop: bool = True,
        listen: ListenLimits | None = None,
        listener: ListenerStats | None = None,
        shutdown_timeout_seconds: float = 5.0,
    ) -> None:
        self._use_uvloop = use_uvloop
        self._listen = listen if listen is not None else ListenLimits()
        self.listener = listener if listener is not None else ListenerStats("proxy")
        self._shutdown_timeout = shutdown_timeout_seconds
        self._base = upstream.rstrip("/")
        self._upstream = Upstream.parse(
            self._base, connect_timeout_seconds, total_timeout_seconds, stream_idle_timeout_seconds
        )
        self._offerer = Offerer(offer, counters, wall_clock, salt)
        self.counters = counters
        self._max = max_body_bytes
        self._marker = marker_header
        self._forwarder: Forwarder | None = None
        self._offer_loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._thread_loop: asyncio.AbstractEventLoop | None = None
        self._channel: _Channel | None = None  # set in the proxy process only
        self._child: _ProxyProcess | None = None  # set in the main process in process mode
        self._lost_here = 0
        self._outbox: list[tuple[Callable[..., object], tuple[object, ...]]] = []
        self.port: int | None = None

    async def start(self, host: str, port: int) -> int:
        """Serve on ``host:port`` (0 = any free port) on the running loop; returns the port."""
        self._offer_loop = asyncio.get_running_loop()
        return await self._serve(host, port)

    async def _serve(self, host: str, port: int) -> int:
        fwd = Forwarder(
            self._upstream,
            _ToShadow(self),
            counters=self.counters,
            limits=self._listen,
            stats=self.listener,
            shadow_paths=SHADOW_PATHS,
            marker=self._marker.encode(),
            category_header=CATEGORY_HEADER.encode(),
            request_id_header=REQUEST_ID_HEADER.encode(),
            max_body_bytes=self._max,
            log=log,
        )
        self.port = await fwd.start(host, port)
        self._forwarder = fwd
        return self.port

    async def start_in_thread(self, host: str, port: int) -> int:
        """Serve on ``host:port`` from a dedicated thread with its own event loop.

        The live path then never waits on the caller's loop (the shadow chain, scrapes, statistics)
        but shares the GIL with it: only the parsed-out shadow copy crosses over, with
        ``call_soon_threadsafe``, and ingest counters other than ``proxy_*`` are updated on the
        caller's loop. Returns the bound port.
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
            "connect_timeout_seconds": self._upstream.connect_timeout,
            "total_timeout_seconds": self._upstream.total_timeout,
            "stream_idle_timeout_seconds": self._upstream.idle_timeout,
            "use_uvloop": self._use_uvloop,
            "listen": self._listen,
            "shutdown_timeout_seconds": self._shutdown_timeout,
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
            calls = args if name == "_batch" else ((name, args),)
            for call, call_args in calls:
                if call in _REMOTE_CALLS:
                    getattr(self, call)(*call_args)
        if self._child is not None and not self._child.writer.is_closing():
            log_event(log, logging.ERROR, "shadow proxy process exited")
            raise ProxyProcessExited("shadow proxy process exited; its port no longer answers")

    @property
    def channel(self) -> asyncio.Task[None] | None:
        """The task that reads the proxy process's hand-overs (process mode, while serving;
        else ``None``). It fails with :class:`ProxyProcessExited` when the proxy process dies
        before :meth:`stop`, so a watcher can mark specwatch unhealthy."""
        return self._child.receiving if self._child is not None else None

    async def stop(self, grace_seconds: float | None = None) -> None:
        """Stop serving (any mode; once: later calls do nothing): stop accepting, let answers
        in progress finish for up to ``grace_seconds`` (``None``: the shutdown timeout), then
        cut what is left. The proxy process is told the grace, gets
        :data:`CHILD_EXIT_SECONDS` more to end and is killed if it has not."""
        grace = self._shutdown_timeout if grace_seconds is None else grace_seconds
        child = self._child
        if child is not None:
            self._child = None
            with contextlib.suppress(OSError):
                child.writer.write(_GRACE.pack(grace))
                child.writer.write_eof()
            with contextlib.suppress(TimeoutError, ProxyProcessExited):
                await asyncio.wait_for(asyncio.shield(child.receiving), grace + CHILD_EXIT_SECONDS)
            child.writer.close()
            await asyncio.to_thread(child.process.join, CHILD_EXIT_SECONDS)
            if child.process.is_alive():
                child.process.kill()
                await asyncio.to_thread(child.process.join)
            return
        fwd, self._forwarder = self._forwarder, None
        thread, loop = self._thread, self._thread_loop
        if thread is not None and loop is not None:
            if fwd is not None:
                done = asyncio.run_coroutine_threadsafe(fwd.stop(grace), loop)
                await asyncio.wrap_future(done)
            loop.call_soon_threadsafe(loop.stop)
            await asyncio.to_thread(thread.join)
            self._thread = self._thread_loop = None
            return
        if fwd is not None:
            await fwd.stop(grace)

    def _schedule(self, fn: Callable[..., object], *args: object) -> None:
        """Run ``fn(*args)`` soon on the offer loop (in the proxy process: send it to the main
        process); never blocks or raises into the live path. From another thread the hand-over
        is queued and sent once the live callbacks of this loop iteration have run, so its
        system call never comes before the live request's write; from the proxy process the
        hand-overs of :data:`HANDOVER_BATCH_SECONDS` go in one frame."""
        target = self._offer_loop
        if self._channel is None and (target is None or target is _running_loop()):
            asyncio.get_running_loop().call_soon(fn, *args)
            return
        self._outbox.append((fn, args))
        if len(self._outbox) == 1:
            loop = asyncio.get_running_loop()
            if self._channel is not None:
                loop.call_later(HANDOVER_BATCH_SECONDS, self._flush)
            else:
                loop.call_soon(self._flush)

    def _flush(self) -> None:
        out, self._outbox = self._outbox, []
        if not out:
            return
        channel = self._channel
        if channel is not None:
            batch = tuple((getattr(fn, "__name__", ""), args) for fn, args in out)
            channel.send("_batch", batch, len(batch))
            return
        target = self._offer_loop
        assert target is not None
        try:
            target.call_soon_threadsafe(_run_all, out)
        except RuntimeError:  # the offer loop is closed: the shadow side is gone, live goes on
            self.counters.proxy_offer_lost += len(out)

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

    def _count_marked(self) -> None:
        self.counters.skipped_marked += 1

    def _set_proxy_counters(
        self,
        requests: int,
        disconnects: int,
        offer_lost: int,
        upstream_errors: dict[str, int],
        refused: dict[str, int],
        open_connections: int,
    ) -> None:
        """The proxy process's ``proxy_*`` counters and listener counts (its own totals, sent
        every :data:`COUNTER_SYNC_SECONDS` and at stop)."""
        c = self.counters
        c.proxy_requests = requests
        c.proxy_client_disconnects = disconnects
        c.proxy_offer_lost = offer_lost + self._lost_here
        c.proxy_upstream_errors.clear()
        c.proxy_upstream_errors.update(upstream_errors)
        self.listener.refused.clear()
        self.listener.refused.update(refused)
        self.listener.open = open_connections
