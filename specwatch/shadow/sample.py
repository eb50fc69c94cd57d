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
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
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
    "replay_error",
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


#: The pauses specwatch chooses to protect live traffic (``load_stale`` is a missing reading).
CHOSEN_PAUSES: frozenset[str] = frozenset({"waiting", "running_near_max"})


def pause_explanation(
    loads: Mapping[str, ArmLoad],
    now: float,
    *,
    on_waiting: bool,
    running_fraction: float,
    max_age_seconds: float,
) -> str:
    """Why replays pause now, in words, naming each arm and its numbers (``""``: not paused).
    Pure; the same rules as :func:`pause_reasons`, e.g. ``"paused: standard has 12 requests
    waiting"``."""
    parts: list[str] = []
    for arm, load in sorted(loads.items()):
        if load.observed_at is None:
            parts.append(f"{arm}'s load was never read")
            continue
        if now - load.observed_at > max_age_seconds:
            age = now - load.observed_at
            parts.append(f"{arm}'s last load reading is {age:.0f} s old")
            continue
        if on_waiting and load.waiting is not None and load.waiting > 0:
            n = int(load.waiting)
            parts.append(f"{arm} has {n} request{'s' if n != 1 else ''} waiting")
        if (
            load.running is not None
            and load.max_num_seqs is not None
            and load.max_num_seqs > 0
            and load.running >= running_fraction * load.max_num_seqs
        ):
            parts.append(
                f"{arm} runs {int(load.running)} of {load.max_num_seqs} sequences "
                f"(pauses at {running_fraction:.0%})"
            )
    return "paused: " + "; ".join(parts) if parts else ""


#: The category every request outside the bounded set is counted under.
OTHER_CATEGORY = "other"


@dataclass(frozen=True, slots=True)
class Takeover:
    """When a category outside the kept set takes the slot of the weakest kept one (the
    hysteresis of :class:`CategoryBound`): volumes are request counts decayed with time
    constant ``window_seconds`` (about the requests of the last window); the newcomer's
    volume, counted low, must be at least ``ratio`` times the weakest kept category's and at
    least ``min_requests``, at each of its requests for ``sustain_seconds`` in a row."""

    window_seconds: float = 600.0
    ratio: float = 1.5
    sustain_seconds: float = 120.0
    min_requests: float = 10.0

    def __post_init__(self) -> None:
        if self.window_seconds <= 0 or self.ratio < 1 or self.sustain_seconds < 0:
            raise ValueError("window_seconds > 0, ratio >= 1 and sustain_seconds >= 0 required")


#: Decayed volumes are kept as ``count * exp((t - origin) / window)``; past this exponent the
#: origin moves to now and every volume is rescaled (no float overflow, ever).
_RESCALE_EXPONENT = 50.0


class CategoryBound:
    """At most ``limit`` distinct request categories, kept by volume; any other reads as ``other``.

    The category comes from traffic (``X-Specwatch-Category``, copied by Envoy/Istio from end
    users), so its values are unbounded; every per-category series (sampler buckets, ledger
    rows, ``specwatch_shadow_*{category}``) goes through this bound first. ``known``: the
    categories kept at start, in priority order (the ledger's categories by volume); the first
    ``limit`` of them are kept, later new categories are admitted while there is room.
    ``other`` itself is always allowed and takes no slot. ``overflowed`` counts requests whose
    category was folded into ``other``; ``kept`` is the admitted set (size <= ``limit``).

    Slots are not first come for ever: each call counts one request of its category (decayed
    volumes, :class:`Takeover`), and a category outside the set whose volume beats the weakest
    kept one's by the takeover rule takes that slot; the weakest is folded into ``other``
    from then on (``demoted`` counts these changes). Categories outside the set are counted in
    a bounded table of ``candidates`` entries (the Space-Saving heavy-hitter scheme: a new
    category replaces the smallest entry and inherits its count as its possible
    over-count, so only the count it surely has competes), so a flood of one-off categories
    costs bounded memory and cannot take a slot from real traffic. Without ``mono_clock``
    slots never change hands (first come, as at start).
    """

    def __init__(
        self,
        limit: int,
        known: Iterable[str] = (),
        *,
        mono_clock: MonotonicClock | None = None,
        takeover: Takeover | None = None,
        candidates: int | None = None,
    ) -> None:
        if limit < 0:
            raise ValueError("limit must be >= 0")
        self.limit = limit
        self.kept: set[str] = set()
        self.overflowed = 0
        self.demoted = 0
        self._mono_clock = mono_clock
        self._rule = takeover if takeover is not None else Takeover()
        self._room = candidates if candidates is not None else max(16, 2 * limit)
        self._origin: float | None = None
        #: Decayed volume (scaled at ``_origin``) of kept categories and candidates.
        self._volume: dict[str, float] = {}
        #: Candidates only: the possible over-count inherited from the entry they replaced.
        self._error: dict[str, float] = {}
        #: Candidates beating the weakest kept category since this time (monotonic seconds).
        self._beating: dict[str, float] = {}
        self.seed(known)

    def seed(self, known: Iterable[str]) -> None:
        """Keep the categories of ``known`` in order while there is room (no overflow counted)."""
        for cat in known:
            if len(self.kept) >= self.limit:
                break
            if cat != OTHER_CATEGORY:
                self.kept.add(cat)

    def map(self, category: str) -> str:
        """``category`` when kept (or ``other``), else ``other``; counts nothing (for rows
        and tallies already stored)."""
        return category if category == OTHER_CATEGORY or category in self.kept else OTHER_CATEGORY

    def __call__(self, category: str) -> str:
        """One request of ``category``: the category when kept (or room is left to keep it, or
        it takes the weakest slot now), else ``other`` (counted)."""
        if category == OTHER_CATEGORY:
            return category
        weight = self._weight()
        if category in self.kept:
            self._add(category, weight)
            return category
        if len(self.kept) < self.limit:
            self.kept.add(category)
            self._add(category, weight)
            return category
        if weight is not None and self.limit > 0 and self._takes_slot(category, weight):
            return category
        self.overflowed += 1
        return OTHER_CATEGORY

    def volume(self, category: str) -> float:
        """The decayed request count of ``category`` now (0 when not tracked; an over-count
        for a candidate that replaced another entry)."""
        got = self._volume.get(category)
        if got is None or self._mono_clock is None or self._origin is None:
            return 0.0 if got is None else got
        return got * math.exp((self._origin - self._mono_clock()) / self._rule.window_seconds)

    # -- internals ------------------------------------------------------------------------

    def _weight(self) -> float | None:
        """The scaled weight of one request now (``None`` without a clock)."""
        if self._mono_clock is None:
            return None
        now = self._mono_clock()
        if self._origin is None:
            self._origin = now
        x = (now - self._origin) / self._rule.window_seconds
        if x > _RESCALE_EXPONENT:
            shrink = math.exp(-x)
            self._volume = {c: v * shrink for c, v in self._volume.items()}
            self._error = {c: v * shrink for c, v in self._error.items()}
            self._origin, x = now, 0.0
        return math.exp(x)

    def _add(self, category: str, weight: float | None) -> None:
        if weight is not None:
            self._volume[category] = self._volume.get(category, 0.0) + weight

    def _takes_slot(self, category: str, weight: float) -> bool:
        """Count ``category`` as a candidate; swap it in for the weakest kept category when
        the takeover rule has held for its sustain time (True)."""
        if category not in self._volume:
            if len(self._error) >= self._room:
                smallest = min(self._error, key=lambda c: self._volume[c])
                floor = self._volume.pop(smallest)
                del self._error[smallest]
                self._beating.pop(smallest, None)
            else:
                floor = 0.0
            self._volume[category] = floor
            self._error[category] = floor
        self._volume[category] += weight
        weakest = min(self.kept, key=lambda c: (self._volume.get(c, 0.0), c))
        sure = self._volume[category] - self._error[category]
        rule = self._rule
        need = max(rule.ratio * self._volume.get(weakest, 0.0), rule.min_requests * weight)
        if sure < need:
            self._beating.pop(category, None)
            return False
        assert self._mono_clock is not None
        now = self._mono_clock()
        since = self._beating.setdefault(category, now)
        if now - since < rule.sustain_seconds:
            return False
        del self._beating[category], self._error[category]
        self.kept.discard(weakest)
        self.kept.add(category)
        self.demoted += 1
        self._error[weakest] = 0.0  # a candidate again, with what it surely had
        self._volume.setdefault(weakest, 0.0)
        return True


@dataclass(frozen=True, slots=True)
class CategoryQuota:
    """Per-category admission rates: ``per_second[category]`` requests per second, categories
    not named get ``default_per_second`` (``None``: no quota), each with a burst of ``burst``."""

    per_second: Mapping[str, float] = field(default_factory=dict)
    default_per_second: float | None = None
    burst: float = 5.0


@dataclass(frozen=True, slots=True)
class LoadPause:
    """The load-aware pause: ``load_state`` read per arm (``None``: never pauses), paused while
    requests wait (``on_waiting``) or running ones pass ``running_fraction`` of the server's
    batch; a reading older than ``max_age_seconds`` pauses too (see :func:`pause_reasons`)."""

    load_state: LoadState | None = None
    on_waiting: bool = True
    running_fraction: float = 0.8
    max_age_seconds: float = 30.0
    #: Canary requests admitted per second during a pause specwatch chose
    #: (:data:`CHOSEN_PAUSES`), so the quality verdict still moves; 0: none.
    trickle_per_second: float = 0.0


#: No per-category quota; never pauses for load.
NO_QUOTA = CategoryQuota()
NO_PAUSE = LoadPause()


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
        quota: CategoryQuota = NO_QUOTA,
        pause: LoadPause = NO_PAUSE,
        categories: CategoryBound | None = None,
    ) -> None:
        if not 0.0 <= probability <= 1.0:
            raise ValueError("probability must be in [0, 1]")
        self.probability = probability
        self.salt = salt
        self._mono_clock = mono_clock
        self.queue: asyncio.Queue[ShadowRequest] = asyncio.Queue(maxsize=queue_size)
        self._rps = TokenBucket(max_rps, max(1.0, max_rps), mono_clock)
        self._quota_rates = dict(quota.per_second)
        self._default_quota = quota.default_per_second
        self._quota_burst = quota.burst
        self._buckets: dict[str, TokenBucket | None] = {}
        self.categories = categories if categories is not None else CategoryBound(20)
        self._load_state = pause.load_state
        self._on_waiting = pause.on_waiting
        self._running_fraction = pause.running_fraction
        self._max_age = pause.max_age_seconds
        self._trickle = (
            TokenBucket(pause.trickle_per_second, 1.0, mono_clock)
            if pause.trickle_per_second > 0
            else None
        )
        #: Canary requests admitted through a chosen pause (the trickle).
        self.trickled = 0
        self._through: set[int] = set()  # id() of queued requests admitted by the trickle
        #: Why replays pause now, in words (:func:`pause_explanation`); ``""`` while not.
        self.pause_text = ""
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
            self.pause_text = ""
        else:
            loads, now = self._load_state(), self._mono_clock()
            reasons = pause_reasons(
                loads,
                now,
                on_waiting=self._on_waiting,
                running_fraction=self._running_fraction,
                max_age_seconds=self._max_age,
            )
            self.pause_text = (
                pause_explanation(
                    loads,
                    now,
                    on_waiting=self._on_waiting,
                    running_fraction=self._running_fraction,
                    max_age_seconds=self._max_age,
                )
                if reasons
                else ""
            )
        for r in reasons - self.paused:
            self.pauses[r] += 1
        self.paused = reasons
        return reasons

    def _bucket(self, category: str) -> TokenBucket | None:
        if category not in self._buckets:
            if len(self._buckets) > self.categories.limit:  # slots changed hands: drop the old
                keep = self.categories.kept
                for gone in [c for c in self._buckets if c not in keep and c != OTHER_CATEGORY]:
                    del self._buckets[gone]
            rate = self._quota_rates.get(category, self._default_quota)
            self._buckets[category] = (
                None if rate is None else TokenBucket(rate, self._quota_burst, self._mono_clock)
            )
        return self._buckets[category]

    def offer(self, req: ShadowRequest, *, force: bool = False, trickle: bool = False) -> str:
        """Try to admit ``req``; returns ``"admitted"`` or the reason it was not.

        ``force`` skips the probability step (canary items are all meant to be replayed) but not
        quotas, pauses, rate limit or the queue bound. ``trickle`` (canary items) lets the
        request through a pause specwatch chose (:data:`CHOSEN_PAUSES`, never a stale load
        reading) at most ``trickle_per_second`` times a second (:attr:`trickled`).
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
        paused = self.current_pause()
        if paused and not (
            trickle
            and self._trickle is not None
            and paused <= CHOSEN_PAUSES
            and self._trickle.take()
        ):
            return self._drop("paused")
        if not self._rps.take():
            return self._drop("rate_limit")
        try:
            self.queue.put_nowait(req)
        except asyncio.QueueFull:
            return self._drop("queue_full")
        if paused:
            self.trickled += 1
            self._through.add(id(req))
        self.admitted += 1
        return "admitted"

    def passes_pause(self, req: ShadowRequest) -> bool:
        """``req`` (taken from :attr:`queue`) was admitted by the trickle: the replay worker
        runs it without waiting for the pause to end. Asked once per request."""
        if id(req) in self._through:
            self._through.discard(id(req))
            return True
        return False

    def _drop(self, reason: str) -> str:
        self.dropped[reason] += 1
        return reason

    def count_drop(self, reason: str) -> None:
        """Count a drop decided downstream (e.g. ``expired`` in the queue)."""
        self.dropped[reason] += 1
