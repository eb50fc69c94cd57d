"""Shadow sampler: reproducible hash sampling, per-category quotas, load-aware pause, bounded queue.

Admission order for each offered request (first failing step decides, each counted by reason):

1. ``not_sampled``: hash fraction of the request >= p (reproducible: the same canonical request is
   always in or always out for a given p and salt);
1a. ``ledger_unusable``: the ledger cannot store rows (:attr:`Sampler.hold`), so a pair would
   spend GPU time for nothing (queued requests are dropped the same way before replay);
2. ``category_quota``: the category's token bucket is empty;
3. ``paused``: any arm is loaded (``num_requests_waiting > 0``, or ``running >= frac *
   max_num_seqs``, or its load reading is older than the allowed age);
4. ``rate_limit``: the global shadow requests/s token bucket is empty;
5. ``queue_full``: the bounded queue is full (``put_nowait``; never waits).

On shutdown (:attr:`Sampler.closed`) every offer is dropped as ``shutdown_queued``, as are the
requests still queued; a replay still in flight when the shutdown budget ends is counted as
``shutdown_in_flight`` (see :meth:`ShadowPipeline.drain
<specwatch.shadow.pipeline.ShadowPipeline.drain>`).

The clock is injected (a :class:`~specwatch.core.clock.MonotonicClock`) so buckets and staleness
are testable.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from specwatch.core.clock import MonotonicClock
from specwatch.shadow.values import ShadowRequest

#: Body fields left out of the canonical form: transport and caller identity, not content.
VOLATILE_FIELDS: frozenset[str] = frozenset({"stream", "stream_options", "user", "request_id"})

DROP_REASONS: tuple[str, ...] = (
    "category_quota",
    "paused",
    "rate_limit",
    "queue_full",
    "expired",
    "ledger_unusable",
    "shutdown_queued",
    "shutdown_in_flight",
)
PAUSE_REASONS: tuple[str, ...] = ("waiting", "running_near_max", "load_stale")


#: The canonical encoder (what ``json.dumps`` with these options builds on every call, made once:
#: the same bytes, without an encoder per request on the proxy's hand-over path).
_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def canonical_request_bytes(path: str, body: Mapping[str, Any]) -> bytes:
    """Canonical JSON of ``{"path", "body"}`` (sorted keys, no spaces, UTF-8), volatile fields
    removed.

    Raises ``TypeError``/``ValueError`` for bodies that are not JSON-serialisable.
    """
    clean = {k: v for k, v in body.items() if k not in VOLATILE_FIELDS}
    return _CANONICAL.encode({"path": path, "body": clean}).encode("utf-8")


def request_hash(path: str, body: Mapping[str, Any], salt: str = "") -> str:
    """SHA-256 hex digest of ``salt`` + the canonical request (64 hex characters)."""
    h = hashlib.sha256()
    h.update(salt.encode("utf-8"))
    h.update(b"\x00")
    h.update(canonical_request_bytes(path, body))
    return h.hexdigest()


def hash_fraction(hex_digest: str) -> float:
    """The first 64 bits of a hex digest as a fraction in [0, 1) (uniform for SHA-256)."""
    return int(hex_digest[:16], 16) / 2.0**64


def seed_from_hash(hex_digest: str) -> int:
    """A replay seed in [0, 2**31 - 1) from bits 64..95 of the digest (independent of sampling
    bits)."""
    return int(hex_digest[16:24], 16) % (2**31 - 1)


class TokenBucket:
    """Token bucket: ``rate`` tokens/s, at most ``burst`` tokens, starts full; ``take()`` ->
    bool."""

    def __init__(self, rate: float, burst: float, mono_clock: MonotonicClock) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("token bucket needs rate > 0 and burst >= 1")
        self._rate = rate
        self._burst = burst
        self._mono_clock = mono_clock
        self._tokens = burst
        self._last = mono_clock()

    def take(self) -> bool:
        now = self._mono_clock()
        elapsed = max(0.0, now - self._last)
        self._last = now
        self._tokens = min(self._burst, self._tokens + elapsed * self._rate)
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


@dataclass(frozen=True, slots=True)
class ArmLoad:
    """Scheduler load of one arm's server, as the observe chain last saw it.

    ``running``/``waiting`` are ``vllm:num_requests_running``/``waiting`` (summed over engines);
    ``max_num_seqs`` is ``None`` when unknown (then only ``waiting`` can pause); ``observed_at``
    is the clock time of the reading (same clock as the sampler), ``None`` when never read.
    """

    running: float | None
    waiting: float | None
    max_num_seqs: int | None
    observed_at: float | None


LoadState = Callable[[], Mapping[str, ArmLoad]]


def pause_reasons(
    loads: Mapping[str, ArmLoad],
    now: float,
    *,
    on_waiting: bool,
    running_fraction: float,
    max_age_seconds: float,
) -> frozenset[str]:
    """Why shadow work must pause now (empty set: go). Pure.

    ``load_stale`` when a reading is missing or older than ``max_age_seconds``;
    ``waiting`` when ``waiting > 0`` and ``on_waiting``; ``running_near_max`` when
    ``running >= running_fraction * max_num_seqs``.
    """
    out: set[str] = set()
    for load in loads.values():
        if load.observed_at is None or now - load.observed_at > max_age_seconds:
            out.add("load_stale")
            continue
        if on_waiting and load.waiting is not None and load.waiting > 0:
            out.add("waiting")
        if (
            load.running is not None
            and load.max_num_seqs is not None
            and load.max_num_seqs > 0
            and load.running >= running_fraction * load.max_num_seqs
        ):
            out.add("running_near_max")
    return frozenset(out)


#: The category every request outside the bounded set is counted under.
OTHER_CATEGORY = "other"


class CategoryBound:
    """At most ``limit`` distinct request categories; any other category reads as ``other``.

    The category comes from traffic (``X-Specwatch-Category``, copied by Envoy/Istio from end
    users), so its values are unbounded; every per-category series (sampler buckets, ledger
    rows, ``specwatch_shadow_*{category}``) goes through this bound first. ``known``: the
    categories kept at start, in priority order (the ledger's categories by volume); the first
    ``limit`` of them are kept, later new categories are admitted first come while there is room.
    ``other`` itself is always allowed and takes no slot. ``overflowed`` counts requests whose
    category was folded into ``other``; ``kept`` is the admitted set (size <= ``limit``).
    """

    def __init__(self, limit: int, known: Iterable[str] = ()) -> None:
        if limit < 0:
            raise ValueError("limit must be >= 0")
        self.limit = limit
        self.kept: set[str] = set()
        self.overflowed = 0
        self.seed(known)

    def seed(self, known: Iterable[str]) -> None:
        """Keep the categories of ``known`` in order while there is room (no overflow counted)."""
        for cat in known:
            if len(self.kept) >= self.limit:
                break
            if cat != OTHER_CATEGORY:
                self.kept.add(cat)

    def __call__(self, category: str) -> str:
        """``category`` when kept (or room is left to keep it), else ``other`` (counted)."""
        if category == OTHER_CATEGORY or category in self.kept:
            return category
        if len(self.kept) < self.limit:
            self.kept.add(category)
            return category
        self.overflowed += 1
        return OTHER_CATEGORY


class Sampler:
    """Admits offered requests into a bounded ``asyncio.Queue`` (see module docstring for order).

    Counters (read them for export): ``offered``, ``not_sampled``, ``admitted``,
    ``dropped[reason]`` (``DROP_REASONS``), ``pauses[reason]`` (transitions into a paused state),
    ``paused`` (current pause reasons). ``queue`` is the queue the replay workers read.
    """

    def __init__(
        self,
        *,
        probability: float,
        mono_clock: MonotonicClock,
        queue_size: int,
        max_rps: float,
        salt: str = "",
        category_quota_per_second: Mapping[str, float] | None = None,
        default_category_quota_per_second: float | None = None,
        category_quota_burst: float = 5.0,
        load_state: LoadState | None = None,
        pause_on_waiting: bool = True,
        pause_running_fraction: float = 0.8,
        load_state_max_age_seconds: float = 30.0,
        categories: CategoryBound | None = None,
    ) -> None:
        if not 0.0 <= probability <= 1.0:
            raise ValueError("probability must be in [0, 1]")
        self.probability = probability
        self.salt = salt
        self._mono_clock = mono_clock
        self.queue: asyncio.Queue[ShadowRequest] = asyncio.Queue(maxsize=queue_size)
        self._rps = TokenBucket(max_rps, max(1.0, max_rps), mono_clock)
        self._quota_rates = dict(category_quota_per_second or {})
        self._default_quota = default_category_quota_per_second
        self._quota_burst = category_quota_burst
        self._buckets: dict[str, TokenBucket | None] = {}
        self.categories = categories if categories is not None else CategoryBound(20)
        self._load_state = load_state
        self._on_waiting = pause_on_waiting
        self._running_fraction = pause_running_fraction
        self._max_age = load_state_max_age_seconds
        self.offered = 0
        self.not_sampled = 0
        self.admitted = 0
        self.dropped: Counter[str] = Counter({r: 0 for r in DROP_REASONS})
        self.pauses: Counter[str] = Counter({r: 0 for r in PAUSE_REASONS})
        self.paused: frozenset[str] = frozenset()
        #: Why nothing may be replayed now (``None``: go): the shadow component sets it to a
        #: callable naming the ledger's state while its rows cannot be stored.
        self.hold: Callable[[], str | None] | None = None
        #: The process is shutting down: nothing more is admitted.
        self.closed = False

    def held(self) -> bool:
        """Nothing may be replayed now (see :attr:`hold`)."""
        return self.hold is not None and self.hold() is not None

    def is_sampled(self, req: ShadowRequest) -> bool:
        """Hash decision only (pure in the request hash and p)."""
        return hash_fraction(req.request_hash) < self.probability

    def current_pause(self) -> frozenset[str]:
        """Re-read the load state; update ``paused`` and the pause-transition counters."""
        if self._load_state is None:
            reasons: frozenset[str] = frozenset()
        else:
            reasons = pause_reasons(
                self._load_state(),
                self._mono_clock(),
                on_waiting=self._on_waiting,
                running_fraction=self._running_fraction,
                max_age_seconds=self._max_age,
            )
        for r in reasons - self.paused:
            self.pauses[r] += 1
        self.paused = reasons
        return reasons

    def _bucket(self, category: str) -> TokenBucket | None:
        if category not in self._buckets:
            rate = self._quota_rates.get(category, self._default_quota)
            self._buckets[category] = (
                None if rate is None else TokenBucket(rate, self._quota_burst, self._mono_clock)
            )
        return self._buckets[category]

    def offer(self, req: ShadowRequest, *, force: bool = False) -> str:
        """Try to admit ``req``; returns ``"admitted"`` or the reason it was not.

        ``force`` skips the probability step (canary items are all meant to be replayed) but not
        quotas, pauses, rate limit or the queue bound.
        """
        self.offered += 1
        bounded = self.categories(req.category)
        if bounded != req.category:
            req = replace(req, category=bounded)
        if not force and not self.is_sampled(req):
            self.not_sampled += 1
            return "not_sampled"
        if self.closed:
            return self._drop("shutdown_queued")
        if self.held():
            return self._drop("ledger_unusable")
        bucket = self._bucket(req.category)
        if bucket is not None and not bucket.take():
            return self._drop("category_quota")
        if self.current_pause():
            return self._drop("paused")
        if not self._rps.take():
            return self._drop("rate_limit")
        try:
            self.queue.put_nowait(req)
        except asyncio.QueueFull:
            return self._drop("queue_full")
        self.admitted += 1
        return "admitted"

    def _drop(self, reason: str) -> str:
        self.dropped[reason] += 1
        return reason

    def count_drop(self, reason: str) -> None:
        """Count a drop decided downstream (e.g. ``expired`` in the queue)."""
        self.dropped[reason] += 1
