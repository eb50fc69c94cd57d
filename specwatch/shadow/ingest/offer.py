"""What mirror and proxy ingest share: the shadowed paths, the request builder, the counters and the
offer step (build → offer → count, never raises).

Both turn a live OpenAI-compatible request into a :class:`ShadowRequest` and hand it to an
:class:`Offer` (:meth:`Sampler.offer <specwatch.shadow.sample.Sampler.offer>`, which only does
a ``put_nowait``), so ingest never waits on replay.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

from specwatch.core.clock import WallClock
from specwatch.core.listen import ListenLimits, json_too_deep, json_too_many_keys
from specwatch.core.logs import RateLimitedLog, log_event
from specwatch.shadow.sample import request_hash
from specwatch.shadow.values import ShadowRequest, Source

log = logging.getLogger("specwatch.shadow.ingest")

SHADOW_PATHS: frozenset[str] = frozenset({"/v1/completions", "/v1/chat/completions"})
_CATEGORY_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


class Offer(Protocol):
    """The hop from ingest to sampling: :meth:`Sampler.offer
    <specwatch.shadow.sample.Sampler.offer>` (a ``put_nowait`` into the replay queue, never
    waits), which answers ``"admitted"`` or the reason it was not."""

    def __call__(self, request: ShadowRequest, /) -> str: ...


#: Deepest JSON nesting of a shadowed body (a chat request nests a handful of levels).
JSON_MAX_DEPTH = ListenLimits().json_max_depth
JSON_MAX_KEYS = ListenLimits().json_max_keys

#: The header carrying a live request's id (Envoy, nginx, vLLM's own ``X-Request-Id``).
REQUEST_ID_HEADER = "X-Request-Id"
_REQUEST_ID_RE = re.compile(r"^[\x21-\x7e]{1,200}$")


def clean_request_id(value: str | None) -> str | None:
    """``value`` when it is 1-200 printable ASCII characters without spaces, else ``None``."""
    return value if value is not None and _REQUEST_ID_RE.match(value) else None


@dataclass(slots=True)
class IngestCounters:
    """Ingest counters: ``received[source]`` (requests considered for shadowing),
    ``errors[(source, reason)]`` (reason: ``too_large|incomplete_body|invalid_json|not_object|
    unsupported_path|not_shadow_host|offer_error``), ``outcomes[(source, result)]`` (what
    ``offer`` answered),
    ``proxy_requests`` (all proxied requests), ``proxy_upstream_errors[reason]``
    (``connect|timeout|disconnected|client_error``; never a client that went away),
    ``proxy_client_disconnects`` (clients that went away before the whole answer was sent),
    ``proxy_offer_lost`` (copies not handed over because the shadow loop was gone),
    ``skipped_marked`` (requests carrying the shadow marker, not re-ingested). In thread mode the
    ``proxy_*`` fields are written by the proxy thread only, the others by the shadow loop only."""

    received: Counter[str] = field(default_factory=Counter)
    errors: Counter[tuple[str, str]] = field(default_factory=Counter)
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    proxy_requests: int = 0
    proxy_upstream_errors: Counter[str] = field(default_factory=Counter)
    proxy_client_disconnects: int = 0
    proxy_offer_lost: int = 0
    skipped_marked: int = 0


def build_shadow_request(
    path: str,
    raw: bytes,
    *,
    source: Source,
    received_at: float,
    salt: str = "",
    category: str | None = None,
    request_id: str | None = None,
) -> ShadowRequest | str:
    """Parse one request body into a :class:`ShadowRequest`, or return an error reason
    (``unsupported_path|invalid_json|too_deep|too_many_keys|not_object``; ``too_deep``: JSON
    nested deeper than :data:`JSON_MAX_DEPTH`, ``too_many_keys``: more than :data:`JSON_MAX_KEYS`
    object members,
    both refused before parsing); ``request_id`` is kept when :func:`clean_request_id` accepts
    it. Pure."""
    if path not in SHADOW_PATHS:
        return "unsupported_path"
    if json_too_deep(raw, JSON_MAX_DEPTH):
        return "too_deep"
    if json_too_many_keys(raw, JSON_MAX_KEYS):
        return "too_many_keys"
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return "invalid_json"
    except RecursionError:
        return "too_deep"
    if not isinstance(body, dict):
        return "not_object"
    try:
        digest = request_hash(path, body, salt)
    except (TypeError, ValueError):
        return "invalid_json"
    cat = category if category is not None and _CATEGORY_RE.match(category) else "default"
    return ShadowRequest(
        path=path,
        body=body,
        request_hash=digest,
        received_at=received_at,
        source=source,
        category=cat,
        request_id=clean_request_id(request_id),
    )


class Offerer:
    """Shared by mirror and proxy: build, offer, count; never raises."""

    def __init__(
        self,
        offer: Offer,
        counters: IngestCounters,
        wall_clock: WallClock,
        salt: str,
    ) -> None:
        self._offer = offer
        self.counters = counters
        self._wall_clock = wall_clock
        self._salt = salt
        self._rejects = RateLimitedLog(log)

    def offer_raw(
        self,
        source: Source,
        path: str,
        raw: bytes,
        category: str | None,
        request_id: str | None = None,
    ) -> str:
        """Build the request from ``raw``, offer it, count the outcome; returns the outcome or
        the rejection reason (also logged once)."""
        c = self.counters
        c.received[source.value] += 1
        built = build_shadow_request(
            path,
            raw,
            source=source,
            received_at=self._wall_clock(),
            salt=self._salt,
            category=category,
            request_id=request_id,
        )
        if isinstance(built, str):
            c.errors[(source.value, built)] += 1
            self._rejects.warning(
                "shadow ingest rejected",
                source=source.value,
                reason=built,
                request_id=clean_request_id(request_id),
            )
            return built
        try:
            result = self._offer(built)
        except (RuntimeError, ValueError, TypeError, asyncio.QueueFull) as exc:
            c.errors[(source.value, "offer_error")] += 1
            log_event(
                log, logging.WARNING, "shadow offer failed", source=source.value, error=repr(exc)
            )
            return "offer_error"
        c.outcomes[(source.value, result)] += 1
        return result
