"""What mirror and proxy ingest share: the shadowed paths, the request builder, the counters and the
offer step (build → offer → count, never raises).

Both turn a live OpenAI-compatible request (its path, whole body and :class:`CopyHeaders`) into
a :class:`ShadowRequest` through :meth:`Offerer.offer_copy` and hand it to an :class:`Offer`
(:meth:`Sampler.offer <specwatch.shadow.sample.Sampler.offer>`, which only does a
``put_nowait``), so ingest never waits on replay; a copy not made is :meth:`Offerer.reject`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from specwatch.core.clock import WallClock
from specwatch.core.listen import ListenLimits, json_too_deep, json_too_many_keys
from specwatch.core.logs import RateLimitedLog, log_event
from specwatch.core.wire import CATEGORY_HEADER
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


#: The attempt number the openai SDKs send with every request (openai-python since 1.44 and
#: openai-node since 4.64, both Stainless-generated: ``0`` on the first attempt, ``1``, ``2``, ...
#: on their own retries after a 408, 409, 429, 5xx or a timeout). Read by ingest only; the
#: replayer builds each arm's headers itself, so it never reaches an arm.
RETRY_COUNT_HEADER = "X-Stainless-Retry-Count"

#: How long after an attempt a retry of it can come (seconds): the SDKs' default request
#: timeout (600 s in openai-python and openai-node) plus their longest back-off (8 s), rounded up.
CLIENT_RETRY_WINDOW_SECONDS = 610.0

#: Request hashes remembered for retry recognition (the oldest are forgotten first).
CLIENT_RETRY_MEMORY = 65_536


def retry_attempt(value: str | None) -> int:
    """The attempt number of :data:`RETRY_COUNT_HEADER` (``0`` when absent or not a small
    non-negative integer: such a request is taken as a first attempt)."""
    if value is None:
        return 0
    v = value.strip()
    return int(v) if v.isdigit() and len(v) <= 3 else 0


class RetryMemory:
    """When each request body (its hash) was last seen, for at most :data:`CLIENT_RETRY_MEMORY`
    bodies and :data:`CLIENT_RETRY_WINDOW_SECONDS`.

    :meth:`is_retry` says whether a request is an SDK's retry of one already taken in: its
    attempt number is 1 or more and the same body came within the window before (a later
    attempt extends the window). A first attempt (no header, or ``0``) is always a new request,
    however often the same body came before. Pure bookkeeping: the caller passes the time."""

    def __init__(
        self,
        window_seconds: float = CLIENT_RETRY_WINDOW_SECONDS,
        capacity: int = CLIENT_RETRY_MEMORY,
    ) -> None:
        self._window = window_seconds
        self._capacity = capacity
        self._seen: OrderedDict[str, float] = OrderedDict()

    def is_retry(self, request_hash: str, attempt: int, now: float) -> bool:
        """Record ``request_hash`` at ``now``; True when ``attempt`` >= 1 and it was seen
        within the window."""
        last = self._seen.pop(request_hash, None)
        self._seen[request_hash] = now
        while len(self._seen) > self._capacity:
            self._seen.popitem(last=False)
        return attempt >= 1 and last is not None and 0 <= now - last <= self._window


def clean_request_id(value: str | None) -> str | None:
    """``value`` when it is 1-200 printable ASCII characters without spaces, else ``None``."""
    return value if value is not None and _REQUEST_ID_RE.match(value) else None


@dataclass(frozen=True, slots=True)
class CopyHeaders:
    """What the offered copy takes from the live request's headers: its category
    (:data:`~specwatch.core.wire.CATEGORY_HEADER`), id (:data:`REQUEST_ID_HEADER`) and SDK
    attempt number (:data:`RETRY_COUNT_HEADER`), each as sent (``None`` when absent)."""

    category: str | None = None
    request_id: str | None = None
    retry_count: str | None = None

    @classmethod
    def of(cls, headers: Mapping[str, str]) -> CopyHeaders:
        """The three headers of a live request."""
        return cls(
            headers.get(CATEGORY_HEADER),
            headers.get(REQUEST_ID_HEADER),
            headers.get(RETRY_COUNT_HEADER),
        )


@dataclass(slots=True)
class IngestCounters:
    """Ingest counters: ``received[source]`` (requests considered for shadowing),
    ``errors[(source, reason)]`` (reason: ``too_large|incomplete_body|invalid_json|not_object|
    unsupported_path|not_shadow_host|offer_error``), ``outcomes[(source, result)]`` (what
    ``offer`` answered),
    ``proxy_requests`` (all proxied requests), ``proxy_upstream_errors[reason]``
    (``connect|timeout|disconnected|client_error``; never a client that went away),
    ``proxy_client_disconnects`` (clients that went away before the whole answer was sent),
    ``skipped_marked`` (requests carrying the shadow marker, not re-ingested). A client SDK's
    retry of a request already taken in is counted in ``errors[(source, "client_retry")]``
    and not offered (one logical request, one pair)."""

    received: Counter[str] = field(default_factory=Counter)
    errors: Counter[tuple[str, str]] = field(default_factory=Counter)
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    proxy_requests: int = 0
    proxy_upstream_errors: Counter[str] = field(default_factory=Counter)
    proxy_client_disconnects: int = 0
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
        self._retries = RetryMemory()

    def offer_copy(self, source: Source, path: str, raw: bytes, headers: CopyHeaders) -> str:
        """Build the copy of a live request (``raw``: its whole body), offer it, count the
        outcome; returns the outcome or the rejection reason (also logged, rate-limited). An
        SDK retry (``headers.retry_count``) of a body taken in within the window is
        ``client_retry`` (counted, never offered, not logged: retries are normal traffic)."""
        c = self.counters
        built = build_shadow_request(
            path,
            raw,
            source=source,
            received_at=self._wall_clock(),
            salt=self._salt,
            category=headers.category,
            request_id=headers.request_id,
        )
        if isinstance(built, str):
            self.reject(source, built, request_id=clean_request_id(headers.request_id))
            return built
        c.received[source.value] += 1
        attempt = retry_attempt(headers.retry_count)
        if self._retries.is_retry(built.request_hash, attempt, built.received_at):
            c.errors[(source.value, "client_retry")] += 1
            return "client_retry"
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

    def reject(self, source: Source, reason: str, **fields: Any) -> None:
        """A copy not made (``too_large``, ``incomplete_body``, ...): counted as received and
        rejected for ``reason``, one rate-limited WARNING line with ``fields``."""
        self.counters.received[source.value] += 1
        self.counters.errors[(source.value, reason)] += 1
        self._rejects.warning(
            "shadow ingest rejected", source=source.value, reason=reason, **fields
        )
