"""Rolling windows as running sums over time buckets (pure: no clock, no I/O; times are passed in).

:class:`WindowedSums` keeps, for a set of named windows (``{name: seconds}``, ``None`` = every
value ever added and not removed, e.g. ``since_start``), one running sum per key (any hashable,
e.g. ``(category, load band)``) of values that can be added and subtracted (``V.__add__``,
``V.__sub__``, e.g. :class:`~specwatch.shadow.tally.HistoryCell`):

* :meth:`WindowedSums.add` puts a value at a time: into its bucket (``floor(time /
  bucket_seconds)``) and into the running sum of every window that holds that bucket; O(1) in
  the number of stored values (O(windows)).
* :meth:`WindowedSums.advance` moves "now" forward: each bucket that has left a window is
  subtracted from that window's sum as a whole, O(keys in the bucket) per bucket leaving, never
  a pass over the history.
* :meth:`WindowedSums.sums` reads a window's sums (a live mapping; copy it to keep it).

**The window edge is bucket-granular.** A finite window of ``s`` seconds at ``now`` holds every
bucket whose end is after ``now - s``: the values with ``time >= floor((now - s) / b) * b``
(``b`` = ``bucket_seconds``), so it reaches back between ``s`` and ``s + b`` seconds; it equals
the per-value rule ``time >= now - s`` exactly when ``now - s`` falls on a bucket boundary (for
example ``now`` a multiple of ``b`` and ``s`` a multiple of ``b``). Buckets older than the
longest finite window are folded away: their values stay only in the unbounded windows. "Now"
never moves back (a clock stepped back keeps the windows where they were until it passes them).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Generic, Protocol, Self, TypeVar


class Additive(Protocol):
    """A value that sums: ``a + b`` and ``a - b`` of the same type."""

    def __add__(self, other: Self, /) -> Self: ...
    def __sub__(self, other: Self, /) -> Self: ...


K = TypeVar("K", bound=Hashable)
V = TypeVar("V", bound=Additive)


def _plus(into: dict[K, V], key: K, value: V) -> None:
    old = into.get(key)
    into[key] = value if old is None else old + value


def _minus(into: dict[K, V], key: K, value: V, zero: V) -> None:
    old = into.get(key)
    left = (zero if old is None else old) - value
    if left == zero:
        into.pop(key, None)
    else:
        into[key] = left


class WindowedSums(Generic[K, V]):
    """Running sums per key over named rolling windows (see module docstring).

    ``windows``: ``{name: seconds}`` (``None``: unbounded); ``zero``: the value that adds
    nothing (a key whose sum returns to ``zero`` is dropped from the sums); ``bucket_seconds``:
    the bucket width (> 0), the granularity of every window's edge; ``now``: the starting time
    (unix seconds). Raises ``ValueError`` for a width <= 0 or a window of <= 0 seconds.
    """

    def __init__(
        self,
        windows: Mapping[str, float | None],
        *,
        zero: V,
        now: float,
        bucket_seconds: float = 10.0,
    ) -> None:
        if not bucket_seconds > 0:
            raise ValueError("bucket_seconds must be > 0")
        for name, secs in windows.items():
            if secs is not None and not secs > 0:
                raise ValueError(f"window {name!r} must be > 0 seconds")
        self.bucket_seconds = float(bucket_seconds)
        self._zero = zero
        self._spans: dict[str, float | None] = dict(windows)
        self._sums: dict[str, dict[K, V]] = {name: {} for name in windows}
        self._buckets: dict[int, dict[K, V]] = {}
        self._order: list[int] = []  # bucket indexes held, ascending
        self._now = -math.inf
        self._first: dict[str, int] = {}  # window -> first bucket index it holds
        finite = [s for s in windows.values() if s is not None]
        self._longest = max(finite) if finite else None
        self._set_firsts(now)

    # -- reading ------------------------------------------------------------------------------

    @property
    def now(self) -> float:
        """The latest time :meth:`advance` (or the constructor) was given."""
        return self._now

    def bucket_of(self, time: float) -> int:
        """The index of the bucket holding ``time``: ``floor(time / bucket_seconds)``."""
        return math.floor(time / self.bucket_seconds)

    def first_bucket(self, window: str) -> int | None:
        """The oldest bucket index ``window`` holds now, ``None`` for an unbounded window.
        Raises ``KeyError`` for an unknown window."""
        if window not in self._spans:
            raise KeyError(window)
        return self._first.get(window)

    def horizon(self) -> float | None:
        """The start time (unix seconds) of the oldest bucket any finite window holds: values
        before it are kept only in the unbounded windows. ``None`` without a finite window."""
        if self._longest is None:
            return None
        return min(self._first.values()) * self.bucket_seconds

    def sums(self, window: str) -> Mapping[K, V]:
        """``{key: sum}`` of ``window`` now (keys with a zero sum are absent). Raises
        ``KeyError`` for an unknown window."""
        return self._sums[window]

    def buckets_held(self) -> int:
        """Buckets stored (those some finite window still holds)."""
        return len(self._order)

    # -- changing -----------------------------------------------------------------------------

    def add(self, time: float, key: K, value: V) -> None:
        """Add ``value`` under ``key`` at ``time`` (unix seconds): into every window holding
        ``time``'s bucket; a time older than every finite window reaches only the unbounded
        ones."""
        self._put(self.bucket_of(time), key, value)

    def add_bucket(self, bucket: int | None, key: K, value: V) -> None:
        """:meth:`add` by bucket index (``None``: older than every finite window), for sums read
        back already grouped by bucket."""
        self._put(bucket, key, value)

    def add_buckets(
        self, items: Iterable[tuple[int | None, K, V]], total: Callable[[Sequence[V]], V]
    ) -> None:
        """:meth:`add_bucket` for each ``(bucket, key, value)`` of ``items``, summing the values
        by ``total`` (the sum of a list of values, e.g. one pass per field) once per key and
        set of windows holding them, instead of one addition per value and window: the
        restart rebuild."""
        floor = min(self._first.values()) if self._first else None
        spans = list(self._spans.items())
        into: dict[tuple[tuple[str, ...], K], list[V]] = {}
        holding: dict[int | None, tuple[str, ...]] = {}  # the windows holding each bucket
        for bucket, key, value in items:
            holders = holding.get(bucket)
            if holders is None:
                holders = holding[bucket] = tuple(
                    name
                    for name, secs in spans
                    if secs is None or (bucket is not None and bucket >= self._first[name])
                )
            into.setdefault((holders, key), []).append(value)
            if bucket is None or floor is None or bucket < floor:
                continue
            held = self._buckets.get(bucket)
            if held is None:
                held = self._buckets[bucket] = {}
                self._order.append(bucket)
            _plus(held, key, value)
        self._order.sort()
        for (holders, key), values in into.items():
            summed = total(values)
            for name in holders:
                _plus(self._sums[name], key, summed)

    def remove_bucket(self, bucket: int | None, key: K, value: V) -> None:
        """Take back ``value`` added under ``key`` in ``bucket`` (``None``: older than every
        finite window), e.g. rows deleted from the store the sums mirror."""
        self._put(bucket, key, value, remove=True)

    def advance(self, now: float) -> bool:
        """Move "now" to ``now`` (ignored when it is not later), subtracting every bucket that
        left a window from its sum; ``True`` when some window's sums changed."""
        if now <= self._now:
            return False
        old = dict(self._first)
        self._set_firsts(now)
        changed = False
        for name, first in self._first.items():
            lo = bisect.bisect_left(self._order, old[name])
            hi = bisect.bisect_left(self._order, first)
            for idx in self._order[lo:hi]:
                for key, value in self._buckets[idx].items():
                    _minus(self._sums[name], key, value, self._zero)
                    changed = True
        if self._first:
            keep_from = bisect.bisect_left(self._order, min(self._first.values()))
            for idx in self._order[:keep_from]:
                del self._buckets[idx]
            del self._order[:keep_from]
        return changed

    # -- internals ----------------------------------------------------------------------------

    def _set_firsts(self, now: float) -> None:
        self._now = now
        for name, secs in self._spans.items():
            if secs is not None:
                first = self.bucket_of(now - secs)
                self._first[name] = max(first, self._first.get(name, first))

    def _put(self, bucket: int | None, key: K, value: V, *, remove: bool = False) -> None:
        for name, secs in self._spans.items():
            if secs is None or (bucket is not None and bucket >= self._first[name]):
                if remove:
                    _minus(self._sums[name], key, value, self._zero)
                else:
                    _plus(self._sums[name], key, value)
        if bucket is None or not self._first or bucket < min(self._first.values()):
            return
        held = self._buckets.get(bucket)
        if held is None:
            held = self._buckets[bucket] = {}
            bisect.insort(self._order, bucket)
        if remove:
            _minus(held, key, value, self._zero)
            if not held:
                del self._buckets[bucket]
                self._order.remove(bucket)
        else:
            _plus(held, key, value)
