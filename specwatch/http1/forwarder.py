"""An HTTP/1.1 forwarding listener: asyncio ``Protocol``s, ``httptools`` (llhttp) parsing both
ways, a pooled keep-alive upstream, answers relayed as bytes.

:class:`Forwarder` listens on one port. Per client connection (:class:`~.client.Client`) each
request is rebuilt for the next hop (:mod:`~specwatch.http1.heads`) and written with its body
to an idle keep-alive upstream connection (:class:`~.pool.UpstreamPool`, a new one when none
is idle); one request and its answer are an :class:`~.exchange.Exchange`, whose answer is
relayed as bytes. The common request and answer take the fast paths of :mod:`~.fast`, which
give the same bytes as the parser path. A ``POST`` to a copied path is handed over
(:class:`~.engine.Handover`) once its body is in, after the request has gone up.

Module by module, bottom to top: ``framing`` (field sets, canned answers, helpers), ``pool``
(upstream connections), ``engine`` (what the connections share), ``heads`` (the parser path's
head rebuilds), ``fast`` (the fast paths), ``exchange`` (one request and its answer),
``client`` (one client connection), ``forwarder`` (the listener).
"""

from __future__ import annotations

import asyncio
import contextlib

from specwatch.http1.client import Client
from specwatch.http1.engine import Engine

__all__ = ["Forwarder"]


class Forwarder(Engine):
    """The listening engine (see the module docstring and :class:`~.engine.Engine` for the
    arguments). Call :meth:`start` then :meth:`stop` on one event loop."""

    _server: asyncio.AbstractServer | None = None

    def protocol(self) -> Client:
        """A new client connection of this listener."""
        return Client(self)

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: any free port); returns the bound port. Raises
        ``OSError`` when it cannot bind."""
        loop = self.loop = self.pool.loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self.protocol, host, port, reuse_address=True, backlog=1024
        )
        self.pool.open = True
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
            self.drained = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.drained.wait(), grace_seconds)
        for c in list(self.clients):
            c.abort()
        self.pool.close()
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            self._server = None
            self.pool.open = False
