"""What every connection of one forwarding listener shares (:class:`Engine`): the upstream and
its pool, the copy rules (which requests are handed over, and how they are marked), the
listener limits and counters, and the protocols the engine is driven through: a
:class:`Handover` for the copies and :class:`ForwardCounters` for what it counts."""

from __future__ import annotations

import asyncio
import logging
import re
from collections import Counter
from typing import Protocol

from specwatch.core.listen import ListenerStats, ListenLimits
from specwatch.core.logs import RateLimitedLog, log_event
from specwatch.http1.framing import DROP_REQUEST
from specwatch.http1.pool import Upstream, UpstreamPool

__all__ = ["Connection", "Engine", "ForwardCounters", "Handover"]


class Handover(Protocol):
    """Where copies of requests go (each call returns at once, never raises)."""

    def copy(self, path: str, raw: bytes, category: str | None, request_id: str | None) -> None:
        """A complete request body under the cap on a copied path."""

    def too_large(self) -> None:
        """A copied request body grew past the cap (no copy)."""

    def incomplete(self, shadow: bool) -> None:
        """A client's upload stopped before its end (``shadow``: on a copied path)."""

    def marked(self) -> None:
        """A ``POST`` to a copied path carried the marker (not copied)."""


class ForwardCounters(Protocol):
    """What the engine counts: ``proxy_requests`` (every forwarded request),
    ``proxy_upstream_errors[reason]`` (``connect|timeout|disconnected|client_error``; never a
    client that went away) and ``proxy_client_disconnects`` (clients that went away before the
    whole answer was sent)."""

    proxy_requests: int
    proxy_upstream_errors: Counter[str]
    proxy_client_disconnects: int


class Connection(Protocol):
    """A client connection as the listener sees it when it stops."""

    def stop_when_idle(self) -> None:
        """Close now when idle, else after the answer in progress."""

    def abort(self) -> None:
        """Close at once."""


class Engine:
    """The state one listener's connections share. ``counters`` are updated here and by the
    exchanges; copies and body errors go to ``handover``.

    ``shadow_paths``: request paths (without query) whose ``POST`` is copied unless it carries
    ``marker`` (lower-cased header name, bytes); ``category_header`` and ``request_id_header``
    name the fields passed on with a copy; ``max_body_bytes`` caps the copy. ``log``: where
    upstream failures and client disconnects are logged (never with request bytes)."""

    def __init__(
        self,
        upstream: Upstream,
        handover: Handover,
        *,
        counters: ForwardCounters,
        limits: ListenLimits,
        stats: ListenerStats,
        shadow_paths: frozenset[str],
        marker: bytes,
        category_header: bytes,
        request_id_header: bytes,
        max_body_bytes: int,
        log: logging.Logger | None = None,
    ) -> None:
        self.up = upstream
        self.pool = UpstreamPool(upstream)
        self.handover = handover
        self.counters = counters
        self.limits = limits
        self.stats = stats
        self.log = log if log is not None else logging.getLogger("specwatch.http1")
        self.rejects = RateLimitedLog(self.log)
        self.shadow_paths = frozenset(p.encode() for p in shadow_paths)
        self.marker = marker.lower()
        self.category_header = category_header.lower()
        self.request_id_header = request_id_header.lower()
        self.max_body = max_body_bytes
        #: the fast paths on (off: every request and answer goes through the parsers, as the
        #: tests that hold the two paths to the same bytes run them)
        self.fast = True
        named = sorted(
            {
                *DROP_REQUEST,
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
        self.clients: set[Connection] = set()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.drained: asyncio.Event | None = None

    def client_gone(self, c: Connection) -> None:
        """``c`` closed (the listener's stop waits for the last one)."""
        self.clients.discard(c)
        if self.drained is not None and not self.clients:
            self.drained.set()

    def copy_refused(self, reason: str, peer: bytes, path: bytes) -> None:
        """A request on a copied path gets no copy: ``too_large`` (its body is, or was
        declared, over the cap) or ``incomplete_body`` (it stopped before its end, also when
        the proxy closed the connection after an early answer). Handed over to be counted and
        logged, rate-limited, with the client's address and the path (never the bytes)."""
        if reason == "too_large":
            self.handover.too_large()
        else:
            self.handover.incomplete(True)
        self.rejects.warning(
            "shadow ingest rejected",
            source="proxy",
            reason=reason,
            peer=peer.decode("latin-1"),
            path=path.decode("latin-1"),
        )

    def upstream_error(self, reason: str, started: bool) -> None:
        """Count and log an upstream failure (``started``: the answer had begun)."""
        self.counters.proxy_upstream_errors[reason] += 1
        log_event(
            self.log, logging.WARNING, "proxy upstream failed", reason=reason, prepared=started
        )
