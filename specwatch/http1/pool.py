"""Keep-alive connections to the upstream: :class:`Upstream` (where to forward),
:class:`UpstreamConnection` (one connection, feeding what it reads to the exchange it serves)
and :class:`UpstreamPool` (idle connections, most recently released first, and the connect of
new ones)."""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from typing import Protocol, cast
from urllib.parse import urlsplit

__all__ = [
    "POOL_IDLE_SECONDS",
    "POOL_MAX_IDLE",
    "Answering",
    "Pausable",
    "Upstream",
    "UpstreamConnection",
    "UpstreamPool",
]

#: An idle upstream connection is not reused after this many seconds (uvicorn, vLLM's server,
#: closes idle keep-alive connections after 5 s; reusing one it is closing fails the request).
POOL_IDLE_SECONDS = 4.0
#: Idle upstream connections kept at most (more are closed when released).
POOL_MAX_IDLE = 256


@dataclass(frozen=True, slots=True)
class Upstream:
    """Where and how to forward: ``host``/``port``/``tls`` of the live server, ``prefix`` its
    base path (bytes, no trailing ``/``), ``host_header`` the ``Host`` value sent,
    ``connect_timeout`` and ``total_timeout`` seconds (``None``: no total limit);
    ``idle_timeout``: the longest the upstream may send nothing while an answer is owed (the
    stream idle timeout; ``None``: none)."""

    host: str
    port: int
    tls: bool
    prefix: bytes
    host_header: bytes
    connect_timeout: float
    total_timeout: float | None
    idle_timeout: float | None = None

    @classmethod
    def parse(
        cls,
        url: str,
        connect_timeout: float,
        total_timeout: float | None,
        idle_timeout: float | None = None,
    ) -> Upstream:
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
            idle_timeout,
        )


class Pausable(Protocol):
    """A client connection whose reading an upstream connection may pause."""

    def pause_reading(self) -> None:
        """Stop reading (counted: each call needs its :meth:`resume_reading`)."""

    def resume_reading(self) -> None:
        """Undo one :meth:`pause_reading`."""


class Answering(Protocol):
    """The exchange an upstream connection reads for."""

    @property
    def client(self) -> Pausable:
        """The client connection the answer goes to."""

    def response_data(self, data: bytes) -> None:
        """Answer bytes as they arrive."""

    def upstream_lost(self) -> None:
        """The connection closed under the exchange."""


class UpstreamConnection(asyncio.Protocol):
    """One keep-alive connection to the upstream; feeds what it reads to its exchange."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.exchange: Answering | None = None
        self.closed = False
        self.idle_since = 0.0
        self.paused_client: Pausable | None = None
        #: reads so far (the stream idle check compares it between its ticks)
        self.reads = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        ex = self.exchange
        if ex is None:  # nothing asked: an idle connection must not talk
            self.close()
            return
        self.reads += 1
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


class UpstreamPool:
    """The idle keep-alive connections to ``upstream`` and the connect of new ones. ``loop``
    (the engine's event loop) and ``open`` (connections are kept: the listener serves) are set
    by the listener when it starts and stops."""

    def __init__(self, upstream: Upstream) -> None:
        self.up = upstream
        self.idle: list[UpstreamConnection] = []
        self.loop: asyncio.AbstractEventLoop | None = None
        self.open = False
        self._ssl: ssl.SSLContext | None = ssl.create_default_context() if upstream.tls else None

    def take(self) -> UpstreamConnection | None:
        """The most recently released live connection, or ``None``."""
        assert self.loop is not None
        now = self.loop.time()
        while self.idle:
            u = self.idle.pop()
            if u.closed or now - u.idle_since > POOL_IDLE_SECONDS:
                u.close()
                continue
            return u
        return None

    def release(self, u: UpstreamConnection) -> None:
        """Return ``u`` to the pool (closed instead when the pool is full or not open)."""
        assert self.loop is not None
        if u.closed or len(self.idle) >= POOL_MAX_IDLE or not self.open:
            u.close()
            return
        u.exchange = None
        u.unpause()
        if u.transport is not None:
            u.transport.resume_reading()  # a slow client may have paused it
        u.idle_since = self.loop.time()
        self.idle.append(u)

    async def connect(self) -> UpstreamConnection:
        """A new connection; raises ``OSError`` or ``TimeoutError``."""
        loop = asyncio.get_running_loop()
        up = self.up
        _, proto = await asyncio.wait_for(
            loop.create_connection(
                UpstreamConnection,
                up.host,
                up.port,
                ssl=self._ssl,
                server_hostname=up.host if self._ssl is not None else None,
            ),
            up.connect_timeout,
        )
        return proto

    def close(self) -> None:
        """Close every idle connection."""
        for u in self.idle:
            u.close()
        self.idle.clear()
