"""Listeners that cannot be held open or flooded: the limits and counters every specwatch HTTP
listener (main, mirror, proxy) shares; the aiohttp parts that enforce them are in
:mod:`specwatch.core.listen_http` (kept apart so settings load without aiohttp).

- :class:`ListenLimits`: header and body read timeouts (seconds), a whole-body deadline, a
  connection limit and each client's share of it, a JSON nesting limit, and the keep-alive
  idle timeout.
- ``listen_http.GuardedSite``: an :class:`aiohttp.web.TCPSite` whose connections are counted
  and capped (a connection over ``max_connections`` gets ``503`` and is closed) and must send a
  complete request head within ``header_timeout_seconds`` of opening (else they are closed).
- ``listen_http.body_timeout_middleware``: a request whose body stops arriving for
  ``body_timeout_seconds``, or is not whole ``body_deadline_seconds`` after its head (a body
  sent a byte a second never pauses long), is answered ``408`` and its connection closed.
- one client address may hold at most ``max_connections_per_client`` of the connections (more
  get ``503``, counted as ``client_share``), so one slow peer cannot fill the cap for the rest.
- :func:`json_too_deep`: whether a JSON text nests deeper than a limit, decided by a scan of
  its brackets before any parser recurses (a deep body otherwise raises ``RecursionError``).
- :func:`json_too_many_keys`: whether a JSON text has more object members than a limit,
  counted before parsing (a 2 MB body of 200k keys holds the event loop for seconds while it
  is parsed and hashed; the parser holds the interpreter, so a thread would not help).

Each refusal is counted in :attr:`ListenerStats.refused` by reason (``connection_limit``,
``header_timeout``, ``body_timeout``, ``bad_request``: a request head aiohttp cannot parse) and
logged through :class:`RateLimitedLog`.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from specwatch.core.logs import RateLimitedLog

__all__ = [
    "MAX_FIELD_BYTES",
    "REFUSAL_REASONS",
    "ListenLimits",
    "ListenerStats",
    "RefusalReason",
    "json_too_deep",
    "json_too_many_keys",
]

logger = logging.getLogger("specwatch.listen")

#: The longest request line and header field the listeners (main, mirror, proxy) accept:
#: aiohttp's own 8,190 bytes refuse a real 12 KB JWT bearer token with ``400``.
MAX_FIELD_BYTES = 32 << 10

#: Why a listener refused a connection or request (``specwatch_listener_refused_total{reason}``,
#: every one exported from 0): a request head aiohttp cannot parse, a request body that
#: stopped arriving or was not whole by its deadline, a client over its share of the
#: connections, a connection over ``max_connections``, no complete head in time.
RefusalReason = Literal[
    "bad_request",
    "body_timeout",
    "client_share",
    "connection_limit",
    "header_timeout",
]
#: Every :data:`RefusalReason`, in that order.
REFUSAL_REASONS: tuple[RefusalReason, ...] = get_args(RefusalReason)


@dataclass(frozen=True, slots=True)
class ListenLimits:
    """Limits of one listener. ``header_timeout_seconds``: from accept to the end of the first
    request head; ``body_timeout_seconds``: the longest pause while a request body is read;
    ``body_deadline_seconds``: the longest a whole request body may take after its head;
    ``max_connections``: open connections at once (more get ``503``);
    ``max_connections_per_client``: open connections of one client address at once (more get
    ``503``); ``json_max_depth``: the deepest JSON nesting accepted; ``json_max_keys``: the
    most object members a JSON body may have (all objects together);
    ``keepalive_timeout_seconds``: how long an idle keep-alive connection is kept."""

    header_timeout_seconds: float = 10.0
    body_timeout_seconds: float = 30.0
    body_deadline_seconds: float = 120.0
    max_connections: int = 1024
    max_connections_per_client: int = 512
    json_max_depth: int = 64
    json_max_keys: int = 10_000
    keepalive_timeout_seconds: float = 15.0


@dataclass(slots=True)
class ListenerStats:
    """Counters of one listener: ``refused[reason]`` and ``open`` connections now."""

    name: str
    refused: Counter[str] = field(default_factory=Counter)
    open: int = 0
    log: RateLimitedLog = field(default_factory=lambda: RateLimitedLog(logger))
    #: open connections by client address
    by_peer: Counter[str] = field(default_factory=Counter)

    def admit(self, peer: str, limits: ListenLimits) -> bool:
        """Count a new connection from ``peer`` (an address; ``""``: unknown) when it is within
        the cap and the peer's share; else count and log the refusal and return ``False``."""
        if self.open >= limits.max_connections:
            self.refuse("connection_limit", max_connections=limits.max_connections)
            return False
        if peer and self.by_peer[peer] >= limits.max_connections_per_client:
            self.refuse(
                "client_share", max_connections_per_client=limits.max_connections_per_client
            )
            return False
        self.open += 1
        if peer:
            self.by_peer[peer] += 1
        return True

    def release(self, peer: str) -> None:
        """A connection :meth:`admit` counted closed."""
        self.open -= 1
        if peer:
            left = self.by_peer[peer] - 1
            if left > 0:
                self.by_peer[peer] = left
            else:
                del self.by_peer[peer]

    def refuse(self, reason: RefusalReason, **fields: Any) -> None:
        """Count one refusal and log it (rate-limited)."""
        self.refused[reason] += 1
        self.log.warning("connection refused", listener=self.name, reason=reason, **fields)


def json_too_deep(raw: bytes | str, max_depth: int) -> bool:
    """True when the JSON text ``raw`` nests arrays/objects deeper than ``max_depth``
    (brackets inside strings are skipped). Linear; never recurses."""
    if isinstance(raw, bytes):
        if raw.count(b"[") + raw.count(b"{") <= max_depth:  # the common body: no decode at all
            return False
        text = raw.decode("utf-8", "replace")
    else:
        text = raw
    if text.count("[") + text.count("{") <= max_depth:
        return False
    depth = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > max_depth:
                return True
        elif ch in "]}":
            depth -= 1
    return False


#: A JSON string (quotes, escapes) or a colon: what :func:`json_too_many_keys` walks.
_STRING_OR_COLON = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|:', re.S)


def json_too_many_keys(raw: bytes, max_keys: int) -> bool:
    """True when the JSON text ``raw`` has more than ``max_keys`` object members (its colons
    outside strings). A body with at most that many colons at all is decided by one count;
    otherwise its strings and colons are walked by a regular expression until the count
    passes ``max_keys`` (a body of 200k keys is decided in its first twentieth)."""
    if raw.count(b":") <= max_keys:
        return False
    seen = 0
    for m in _STRING_OR_COLON.finditer(raw):
        if m.end() - m.start() == 1 and raw[m.start()] == 0x3A:
            seen += 1
            if seen > max_keys:
                return True
    return False
