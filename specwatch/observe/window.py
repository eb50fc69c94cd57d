"""Counter increases with restart handling, and rolling windows over good scrapes (pure).

Every good page is folded into *accumulated* counters per (model_name, engine): the increase
between two pages is ``current − previous``, except after a reset of the engine, where it is the
post-reset value (never negative). An engine is reset when any of its counters (spec-decode
counters, per-position counters, token/step counters, histogram buckets) falls, or when the page's
``process_start_time_seconds`` changed, or its spec-decode schema switched between vLLM V0
(emitted tokens, no drafts counter) and V1 (drafts counter); a switch also starts the engine's
history again, so no window or baseline mixes the two schemas. A window's
:class:`~specwatch.observe.values.Delta` is the difference of accumulated values between the
latest page and the newest page at or before ``latest − window`` (the oldest kept page while
history is shorter than the window; pages older than twice the window are never used).
``since_start`` uses the first good page. A counter absent from either end gives ``None`` (no
value), never 0.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from specwatch.core.config import SINCE_START
from specwatch.observe.values import (
    COUNTER_KEYS,
    Delta,
    EngineKey,
    EngineReading,
    Histogram,
    PageReading,
)


@dataclass(slots=True)
class _Acc:
    """Accumulated (reset-adjusted) values of one engine at one page."""

    counters: dict[str, float] = field(default_factory=dict)
    per_position: dict[int, float] = field(default_factory=dict)
    buckets: dict[str, dict[float, float]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Point:
    t: float
    acc: Mapping[EngineKey, _Acc]
    raw: Mapping[EngineKey, EngineReading]


def _schema(r: EngineReading) -> str | None:
    """vLLM's spec-decode schema of one engine's page: ``"v1"`` (drafts counter), ``"v0"``
    (emitted-tokens counter, no drafts counter) or ``None`` (no spec-decode counters)."""
    if "drafts" in r.counters:
        return "v1"
    if "emitted_tokens" in r.counters:
        return "v0"
    return None


def _fell(prev: EngineReading, cur: EngineReading) -> bool:
    """True when any monotonic value of ``cur`` is below the same value in ``prev``."""
    for key, value in cur.counters.items():
        old = prev.counters.get(key)
        if old is not None and value < old:
            return True
    for pos, value in cur.per_position.items():
        old = prev.per_position.get(pos)
        if old is not None and value < old:
            return True
    for key, hist in cur.histograms.items():
        old_h = prev.histograms.get(key)
        if old_h is None:
            continue
        old_b = dict(old_h.buckets)
        for le, value in hist.buckets:
            o = old_b.get(le)
            if o is not None and value < o:
                return True
    return False


#: Pages per engine remembered to recognise counters that alternate (several servers, one URL).
ALTERNATION_HISTORY = 8


def _continues(old: EngineReading, cur: EngineReading) -> bool:
    """True when every counter ``cur`` shares with ``old`` is >= it (at least one shared)."""
    shared = 0
    for key, value in cur.counters.items():
        before = old.counters.get(key)
        if before is None:
            continue
        if value < before:
            return False
        shared += 1
    return shared > 0


def _inc(prev: float | None, cur: float, reset: bool) -> float:
    if reset or prev is None:
        return cur if reset else 0.0
    return cur - prev


class RollingWindows:
    """Reset-aware accumulation and window deltas for one target.

    ``windows`` maps a window name to its length in seconds (``since_start`` is always added).
    Not thread-safe; call from one task.
    """

    def __init__(self, windows: Mapping[str, float]) -> None:
        self._lengths = dict(windows)
        self._keep = max(self._lengths.values(), default=0.0)
        self._points: deque[_Point] = deque()
        self._first: _Point | None = None
        self._first_seen: dict[EngineKey, tuple[float, _Acc]] = {}
        self._last_raw: dict[EngineKey, EngineReading] = {}
        self._acc: dict[EngineKey, _Acc] = {}
        self._last_seen: dict[EngineKey, float] = {}
        self._process_start: float | None = None
        self._schema: dict[EngineKey, str] = {}
        self._schema_since: dict[EngineKey, float] = {}
        self._history: dict[EngineKey, deque[EngineReading]] = {}
        self._starts: deque[float] = deque(maxlen=ALTERNATION_HISTORY)

    @property
    def tracked(self) -> frozenset[EngineKey]:
        """The (model_name, engine) pairs whose state is kept (seen and not pruned)."""
        return frozenset(self._last_seen)

    def prune(self, now: float, stale_seconds: float) -> list[EngineKey]:
        """Drop all state of engines not seen on a good page since ``now - stale_seconds``;
        return them. A pruned engine that comes back starts afresh (its ``since_start`` too)."""
        cutoff = now - stale_seconds
        gone = [key for key, t in self._last_seen.items() if t < cutoff]
        for key in gone:
            for table in (self._last_seen, self._acc, self._last_raw, self._first_seen):
                table.pop(key, None)
            self._history.pop(key, None)
            self._schema.pop(key, None)
            self._schema_since.pop(key, None)
        return gone

    def alternating(self, page: PageReading) -> bool:
        """True when ``page`` reads as a second server behind the same URL, then remember it.

        Several servers behind one URL (a load balancer, a cache) give pages whose counters
        fall and rise in turn. A page is *alternating* when, for some engine, it continues a
        series seen on an older page but not on the latest one: its counters fell below the
        latest page's, yet none is below those of one of the earlier pages (at most
        :data:`ALTERNATION_HISTORY`), with at least one counter in common; or its
        ``process_start_time_seconds`` differs from the latest page's and equals an earlier one.
        A true restart starts near zero (below every earlier page) with a new start time, so
        it is never alternating. Every page (alternating or not) enters the history."""
        start = page.process_start_time_seconds
        found = False
        if start is not None and self._starts:
            older = list(self._starts)[:-1]
            found = start != self._starts[-1] and start in older
        for key, cur in page.engines.items():
            hist = self._history.get(key)
            if not found and hist and len(hist) >= 2 and _fell(hist[-1], cur):
                found = any(_continues(old, cur) for old in list(hist)[:-1])
            if hist is None:
                hist = self._history[key] = deque(maxlen=ALTERNATION_HISTORY)
            hist.append(cur)
        if start is not None:
            self._starts.append(start)
        return found

    @property
    def window_names(self) -> tuple[str, ...]:
        """Configured window names followed by ``since_start``."""
        return (*self._lengths, SINCE_START)

    def add(self, t: float, page: PageReading) -> list[EngineKey]:
        """Fold one good page taken at ``t``; return the engines detected as reset."""
        restarted = (
            page.process_start_time_seconds is not None
            and self._process_start is not None
            and page.process_start_time_seconds != self._process_start
        )
        if page.process_start_time_seconds is not None:
            self._process_start = page.process_start_time_seconds
        resets: list[EngineKey] = []
        acc_now: dict[EngineKey, _Acc] = {}
        for key, cur in page.engines.items():
            prev = self._last_raw.get(key)
            schema = _schema(cur)
            switched = schema is not None and self._schema.get(key, schema) != schema
            if schema is not None:
                self._schema[key] = schema
            reset = prev is not None and (restarted or switched or _fell(prev, cur))
            if reset:
                resets.append(key)
            acc = self._acc.setdefault(key, _Acc())
            new = _Acc()
            for name, value in cur.counters.items():
                old = prev.counters.get(name) if prev is not None else None
                base = acc.counters.get(name, 0.0)
                new.counters[name] = base + _inc(old, value, reset)
            for pos, value in cur.per_position.items():
                old = prev.per_position.get(pos) if prev is not None else None
                base = acc.per_position.get(pos, 0.0)
                new.per_position[pos] = base + _inc(old, value, reset)
            for hname, hist in cur.histograms.items():
                old_h = prev.histograms.get(hname) if prev is not None else None
                base_b = acc.buckets.get(hname, {})
                bounds = [le for le, _ in hist.buckets]
                if (
                    not reset
                    and old_h is not None
                    and [le for le, _ in old_h.buckets] == bounds
                    and list(base_b) == bounds
                ):
                    # the same bounds as the page before: base + (now - before), bucket by bucket
                    new.buckets[hname] = dict(
                        zip(
                            bounds,
                            [
                                b + (v - o)
                                for b, (_, v), (_, o) in zip(
                                    base_b.values(), hist.buckets, old_h.buckets, strict=True
                                )
                            ],
                            strict=True,
                        )
                    )
                    continue
                old_b = dict(old_h.buckets) if old_h is not None else {}
                new.buckets[hname] = {
                    le: base_b.get(le, 0.0) + _inc(old_b.get(le), value, reset)
                    for le, value in hist.buckets
                }
            # keep accumulated values of series absent now, so they continue when they return
            merged = _Acc(
                {**acc.counters, **new.counters},
                {**acc.per_position, **new.per_position},
                {**acc.buckets, **new.buckets},
            )
            self._acc[key] = merged
            merged_raw = EngineReading(
                counters={**(prev.counters if prev else {}), **cur.counters},
                per_position={**(prev.per_position if prev else {}), **cur.per_position},
                gauges=cur.gauges,
                waiting_by_reason=cur.waiting_by_reason,
                histograms={**(prev.histograms if prev else {}), **cur.histograms},
            )
            self._last_raw[key] = merged_raw
            acc_now[key] = new
            self._last_seen[key] = t
            if key not in self._first_seen or switched:
                # a V0 <-> V1 schema switch starts the engine's history again: no window or
                # baseline mixes the two schemas
                self._first_seen[key] = (t, new)
            if switched:
                self._schema_since[key] = t
        point = _Point(t, acc_now, dict(page.engines))
        if self._first is None:
            self._first = point
        self._points.append(point)
        while len(self._points) >= 2 and self._points[1].t <= t - self._keep:
            self._points.popleft()
        return resets

    @property
    def latest_time(self) -> float | None:
        """Time of the latest good page, ``None`` before the first."""
        return self._points[-1].t if self._points else None

    def deltas(self, window: str) -> dict[EngineKey, Delta]:
        """Per-engine deltas over ``window`` ending at the latest good page.

        Engines absent from the latest page are not reported. With fewer than two pages every
        counter is ``None`` (gauges of the latest page are still given).
        """
        if not self._points:
            return {}
        latest = self._points[-1]
        base = self._baseline(window, latest)
        out: dict[EngineKey, Delta] = {}
        for key, cur in latest.acc.items():
            raw = latest.raw[key]
            old: _Acc | None = None
            base_t = 0.0
            if window == SINCE_START:
                # since the engine was first seen (an engine that starts later has its own start)
                seen = self._first_seen.get(key)
                if seen is not None and seen[0] < latest.t:
                    base_t, old = seen
            elif base is not None:
                old, base_t = base.acc.get(key), base.t
                since = self._schema_since.get(key)
                if since is not None and base_t < since:
                    # the window starts before a schema switch: shorten it to the switch
                    seen = self._first_seen.get(key)
                    old, base_t = (seen[1], seen[0]) if seen and seen[0] < latest.t else (None, 0)
            k = max(raw.per_position) + 1 if raw.per_position else None
            if old is None:
                out[key] = Delta(
                    interval_seconds=None,
                    counters=dict.fromkeys(COUNTER_KEYS),
                    per_position={},
                    histograms={},
                    gauges=raw.gauges,
                    waiting_by_reason=raw.waiting_by_reason,
                    num_speculative_tokens=k,
                )
                continue
            counters: dict[str, float | None] = {}
            for name in COUNTER_KEYS:
                a, b = cur.counters.get(name), old.counters.get(name)
                counters[name] = a - b if a is not None and b is not None else None
            per_pos = {
                pos: value - old.per_position[pos]
                for pos, value in cur.per_position.items()
                if pos in old.per_position
            }
            hists: dict[str, Histogram] = {}
            for hname, buckets in cur.buckets.items():
                ob = old.buckets.get(hname)
                if ob is None:
                    continue
                # bucket dicts are built in ascending ``le`` order (parse sorts them)
                if list(ob) == list(buckets):  # the same bounds in the same order
                    pairs = tuple(
                        zip(
                            buckets,
                            [v - o for v, o in zip(buckets.values(), ob.values(), strict=True)],
                            strict=True,
                        )
                    )
                else:
                    pairs = tuple((le, v - ob[le]) for le, v in buckets.items() if le in ob)
                if not pairs or pairs[-1][0] != math.inf:
                    continue
                hists[hname] = Histogram(pairs)
            out[key] = Delta(
                interval_seconds=latest.t - base_t,
                counters=counters,
                per_position=per_pos,
                histograms=hists,
                gauges=raw.gauges,
                waiting_by_reason=raw.waiting_by_reason,
                num_speculative_tokens=k,
            )
        return out

    def _baseline(self, window: str, latest: _Point) -> _Point | None:
        """The page the window starts from: the newest at or before ``latest − length``; while
        history is shorter than the window, the oldest page. A page older than
        ``latest − 2·length`` (a long gap in good scrapes) is not used: the oldest page inside
        the window is, or none, so a "1m" value never silently spans an hour."""
        if window == SINCE_START:
            first = self._first
            return first if first is not None and first is not latest else None
        length = self._lengths[window]
        cutoff = latest.t - length
        chosen: _Point | None = None
        for point in self._points:
            if point is latest:
                break
            if point.t <= cutoff:
                chosen = point
                continue
            if chosen is None or chosen.t < latest.t - 2 * length:
                chosen = point  # history shorter than the window, or a gap: oldest inside
            break
        if chosen is not None and chosen.t < latest.t - 2 * length:
            return None
        return chosen


def page_delta(
    before: PageReading | None, after: PageReading, interval_seconds: float | None
) -> dict[EngineKey, Delta]:
    """Deltas between two pages (``before=None``: since server start, i.e. the raw totals).

    Used by ``specwatch analyze``; same reset rule as :class:`RollingWindows`.
    """
    windows = RollingWindows({})
    if before is None:
        before = PageReading(
            engines={
                key: EngineReading(
                    counters=dict.fromkeys(eng.counters, 0.0),
                    per_position=dict.fromkeys(eng.per_position, 0.0),
                    gauges={},
                    waiting_by_reason={},
                    histograms={
                        h: Histogram(tuple((le, 0.0) for le, _ in hist.buckets))
                        for h, hist in eng.histograms.items()
                    },
                )
                for key, eng in after.engines.items()
            },
            process_start_time_seconds=after.process_start_time_seconds,
        )
    windows.add(0.0, before)
    windows.add(interval_seconds if interval_seconds is not None else 1.0, after)
    deltas = windows.deltas(SINCE_START)
    if interval_seconds is None:
        return {
            key: Delta(
                interval_seconds=None,
                counters=d.counters,
                per_position=d.per_position,
                histograms=d.histograms,
                gauges=d.gauges,
                waiting_by_reason=d.waiting_by_reason,
                num_speculative_tokens=d.num_speculative_tokens,
            )
            for key, d in deltas.items()
        }
    return deltas
