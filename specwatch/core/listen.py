"""Listeners that cannot be held open or flooded: the limits and counters every specwatch HTTP
listener (main, mirror, proxy) shares; the aiohttp parts that enforce them are in
:mod:`specwatch.core.listen_http` (kept apart so settings load without aiohttp).

- :class:`ListenLimits`: header and body read timeouts (seconds), a connection limit, a JSON
  nesting limit, and the keep-alive idle timeout.
- ``listen_http.GuardedSite``: an :class:`aiohttp.web.TCPSite` whose connections are counted
  and capped (a connection over ``max_connections`` gets ``503`` and is closed) and must send a
  complete request head within ``header_timeout_seconds`` of opening (else they are closed).
- ``listen_http.body_timeout_middleware``: a request whose body stops arriving for
  ``body_timeout_seconds`` is answered ``408`` and its connection closed.
- :func:`json_too_deep`: whether a JSON text nests deeper than a limit, decided by a scan of
  its brackets before any parser recurses (a deep body otherwise raises ``RecursionError``).

Each refusal is counted in :attr:`ListenerStats.refused` by reason (``connection_limit``,
``header_timeout``, ``body_timeout``, ``bad_request``: a request head aiohttp cannot parse) and
logged through :class:`RateLimitedLog`.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from specwatch.core.logs import RateLimitedLog

__all__ = ["REFUSAL_REASONS", "ListenLimits", "ListenerStats", "RefusalReason", "json_too_deep"]

logger = logging.getLogger("specwatch.listen")

#: Why a listener refused a connection or request (``specwatch_listener_refused_total{reason}``,
#: every one exported from 0): a request head aiohttp cannot parse, a request body that
#: stopped arriving, a connection over ``max_connections``, no complete head in time.
RefusalReason = Literal["bad_request", "body_timeout", "connection_limit", "header_timeout"]
#: Every :data:`RefusalReason`, in that order.
REFUSAL_REASONS: tuple[RefusalReason, ...] = get_args(RefusalReason)


@dataclass(frozen=True, slots=True)
class ListenLimits:
    """Limits of one listener. ``header_timeout_seconds``: from accept to the end of the first
    request head; ``body_timeout_seconds``: the longest pause while a request body is read;
    ``max_connections``: open connections at once (more get ``503``); ``json_max_depth``: the
    deepest JSON nesting accepted; ``keepalive_timeout_seconds``: how long an idle keep-alive
    connection is kept."""

    header_timeout_seconds: float = 10.0
    body_timeout_seconds: float = 30.0
    max_connections: int = 1024
    json_max_depth: int = 64
    keepalive_timeout_seconds: float = 15.0


@dataclass(slots=True)
class ListenerStats:
    """Counters of one listener: ``refused[reason]`` and ``open`` connections now."""

    name: str
    refused: Counter[str] = field(default_factory=Counter)
    open: int = 0
    log: RateLimitedLog = field(default_factory=lambda: RateLimitedLog(logger))

    def refuse(self, reason: RefusalReason, **fields: Any) -> None:
        """Count one refusal and log it (rate-limited)."""
        self.refused[reason] += 1
        self.log.warning("connection refused", listener=self.name, reason=reason, **fields)


def json_too_deep(raw: bytes | str, max_depth: int) -> bool:
    """True when the JSON text ``raw`` nests arrays/objects deeper than ``max_depth``
    (brackets inside strings are skipped). Linear; never recurses."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
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
