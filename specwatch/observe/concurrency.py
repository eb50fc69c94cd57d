"""Where speculation stops paying: decode speed by the number of running requests (pure).

Speculative decoding pays most at low concurrency; as the batch grows the verifier's extra
tokens compete with other requests for the token budget and the gain shrinks until the
speculative arm is no faster (vLLM's own benchmarks and public serving reports describe the
same curve). Each good scrape of a target adds one point to its :class:`ConcurrencyProfile`:
the running requests at the scrape (``vllm:num_requests_running``, summed over engines), the
generation throughput and the median inter-token latency of the target's shortest window. Points
are kept as sums per running-request band (powers of two: ``1``, ``2-3``, ``4-7``, …,
``512+``, the descriptive per-band table) and, for the estimate, the last :data:`MAX_POINTS`
points themselves (``(running, per-request decode speed)``), so memory is fixed.

:func:`speculation_limit` estimates where FLy's per-request decode speed (generation tokens/s ÷
running requests) falls to a reference arm's, once per reference, each labelled: the
no-speculation baseline target (role ``baseline``, speculation against none) when one is
configured, and the standard arm (FLy against standard speculation). The estimate is
:func:`specwatch.core.crossover.crossover` (per-level comparisons at the concurrencies seen, with
intervals simultaneous over the levels; "not reached" unless the gain's interval is wholly below
zero at some level), recomputed every :data:`REFRESH_POINTS` points, so every view of the same
points shows the same numbers.

Assumptions, stated in the output: both arms serve comparable requests (prompt and output
lengths), a window's throughput is attributed to the running count at its end, and a band
counts only with at least :data:`MIN_POINTS` points on each arm.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Literal, get_args

from specwatch.core.crossover import (
    CROSSOVER_STATUSES,
    REFERENCE_NAMES,
    CrossoverStatus,
    GainPoint,
    crossover,
    limit_sentence,
)

#: Lower bounds of the running-request bands.
BANDS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)

#: Points per arm a band needs before it is compared.
MIN_POINTS = 3

#: Points per target kept for the estimate (the most recent).
MAX_POINTS = 1024

#: The estimate is recomputed when an arm's points reach a multiple of this (between, the last
#: estimate stands).
REFRESH_POINTS = 8

#: What the comparison assumes (printed with the result).
ASSUMPTIONS: tuple[str, ...] = (
    "both arms serve comparable requests (prompt and output lengths)",
    "a window's throughput is attributed to the running requests at its end",
    f"a band is compared only with at least {MIN_POINTS} scrapes on each arm",
    "the arms are compared per concurrency level seen (a quarter of a doubling wide), with "
    "intervals that hold over all levels at once; the crossover is interpolated between the "
    "levels around it",
    "scrapes scatter independently around each level's mean (log-normal noise)",
)


def band_label(lo: int) -> str:
    """``1``, ``2-3``, …, ``512+`` for a lower bound in :data:`BANDS`."""
    i = BANDS.index(lo)
    if i == len(BANDS) - 1:
        return f"{lo}+"
    hi = BANDS[i + 1] - 1
    return str(lo) if hi == lo else f"{lo}-{hi}"


def band_of(running: float) -> int | None:
    """The band lower bound of a running count (``None`` below 1: nothing decodes)."""
    if not math.isfinite(running) or running < 1:
        return None
    return max(b for b in BANDS if b <= running)


@dataclass(frozen=True, slots=True)
class BandSums:
    """Sums over the points of one band: ``points``, per-request decode speed
    (tokens/s/request), throughput (tokens/s), and median ITL (seconds) over ``itl_points``."""

    points: int = 0
    speed_sum: float = 0.0
    throughput_sum: float = 0.0
    itl_points: int = 0
    itl_sum: float = 0.0


@dataclass(frozen=True, slots=True)
class ConcurrencyProfile:
    """Per-band sums of one target (``bands[lower bound]``), the last :data:`MAX_POINTS`
    points ``(running, per-request decode speed)``, ``seen`` the points ever added and
    ``settled`` the points as they were when ``seen`` last reached a multiple of
    :data:`REFRESH_POINTS` (what the estimate reads); immutable, :func:`add_point` returns a
    new one."""

    bands: tuple[tuple[int, BandSums], ...] = ()
    points: tuple[tuple[float, float], ...] = ()
    seen: int = 0
    settled: tuple[tuple[float, float], ...] = ()

    def get(self, lo: int) -> BandSums:
        """The sums of band ``lo`` (zeros when unseen)."""
        return dict(self.bands).get(lo, BandSums())


def add_point(
    profile: ConcurrencyProfile,
    running: float | None,
    tokens_per_second: float | None,
    itl_seconds: float | None,
) -> ConcurrencyProfile:
    """``profile`` plus one scrape's point; unchanged when running < 1 or the throughput is
    unknown or not finite (nothing to relate)."""
    if running is None or tokens_per_second is None or not math.isfinite(tokens_per_second):
        return profile
    lo = band_of(running)
    if lo is None:
        return profile
    old = profile.get(lo)
    itl_ok = itl_seconds is not None and math.isfinite(itl_seconds)
    new = replace(
        old,
        points=old.points + 1,
        speed_sum=old.speed_sum + tokens_per_second / running,
        throughput_sum=old.throughput_sum + tokens_per_second,
        itl_points=old.itl_points + (1 if itl_ok else 0),
        itl_sum=old.itl_sum + (itl_seconds if itl_ok and itl_seconds is not None else 0.0),
    )
    bands = dict(profile.bands)
    bands[lo] = new
    points = (*profile.points[-(MAX_POINTS - 1) :], (float(running), tokens_per_second / running))
    seen = profile.seen + 1
    settled = points if seen % REFRESH_POINTS == 0 else profile.settled
    return ConcurrencyProfile(tuple(sorted(bands.items())), points, seen, settled)


@dataclass(frozen=True, slots=True)
class BandComparison:
    """One band seen on both arms: mean per-request decode speed (tokens/s/request), mean
    throughput (tokens/s) and mean median ITL (seconds, ``None`` when not reported) of each,
    and ``speed_ratio`` = FLy ÷ standard per-request speed."""

    band: str
    running_from: int
    standard_speed: float
    fly_speed: float
    speed_ratio: float
    standard_tokens_per_second: float
    fly_tokens_per_second: float
    standard_itl_seconds: float | None
    fly_itl_seconds: float | None


#: Where the speculation limit stands (:attr:`SpeculationLimit.status`;
#: ``specwatch_speculation_limit_state{state}`` exports each, 1 on the current one).
LimitStatus = CrossoverStatus
#: Every :data:`LimitStatus`, in that order.
LIMIT_STATUSES: tuple[LimitStatus, ...] = CROSSOVER_STATUSES


#: What FLy is compared with (``specwatch_speculation_limit_*{reference}``): ``baseline``, the
#: no-speculation target (speculation against none, the question the limit answers), when one is
#: configured; ``standard``, the standard speculative arm.
LimitReference = Literal["baseline", "standard"]
#: Every :data:`LimitReference`, in that order.
LIMIT_REFERENCES: tuple[LimitReference, ...] = get_args(LimitReference)


@dataclass(frozen=True, slots=True)
class LimitComparison:
    """Where FLy stops decoding faster per request than ``reference``.

    ``status``: ``reached`` (the gain's interval is wholly below zero at some level seen;
    ``running`` the interpolated concurrency where the gain reaches zero, ``running_lower`` /
    ``running_upper`` its interval, ``running_lower`` ``None`` when it may lie at or below the
    lowest level seen), ``not_reached`` (``running`` ``None``), ``no_data`` (too few points).
    ``highest``: the highest concurrency level the arms were compared at (``None`` without
    data); ``curve`` the gain per level with its interval; ``text`` the labelled sentence
    (:func:`specwatch.core.crossover.crossover_text`).
    """

    reference: LimitReference
    status: LimitStatus
    running: float | None
    running_lower: float | None
    running_upper: float | None
    highest: float | None
    curve: tuple[GainPoint, ...]
    text: str


@dataclass(frozen=True, slots=True)
class SpeculationLimit:
    """Where speculation stops paying: ``comparisons`` of FLy against the no-speculation
    baseline (first, when one is configured) and against the standard arm, each labelled;
    ``text`` their sentences in that order (the one text every surface shows); ``bands`` the
    per-band table (FLy against the standard arm); ``assumptions`` what it rests on. The
    properties read the first comparison (the baseline when configured)."""

    comparisons: tuple[LimitComparison, ...]
    text: str
    bands: tuple[BandComparison, ...]
    assumptions: tuple[str, ...] = ASSUMPTIONS

    @property
    def primary(self) -> LimitComparison:
        """The first comparison: against the baseline when configured, else the standard arm."""
        return self.comparisons[0]

    @property
    def status(self) -> LimitStatus:
        """:attr:`primary`'s status."""
        return self.primary.status

    @property
    def running(self) -> float | None:
        """:attr:`primary`'s crossover."""
        return self.primary.running

    @property
    def running_lower(self) -> float | None:
        """:attr:`primary`'s interval, lower end."""
        return self.primary.running_lower

    @property
    def running_upper(self) -> float | None:
        """:attr:`primary`'s interval, upper end."""
        return self.primary.running_upper

    @property
    def reference(self) -> LimitReference:
        """What :attr:`primary` compares FLy with."""
        return self.primary.reference

    @property
    def curve(self) -> tuple[GainPoint, ...]:
        """:attr:`primary`'s gain per level."""
        return self.primary.curve


def _mean(total: float, n: int) -> float | None:
    return total / n if n else None


def band_table(
    standard: ConcurrencyProfile, fly: ConcurrencyProfile, *, min_points: int = MIN_POINTS
) -> tuple[BandComparison, ...]:
    """The bands seen on both arms with ``min_points`` points each, compared. Pure."""
    rows: list[BandComparison] = []
    for lo in BANDS:
        s, f = standard.get(lo), fly.get(lo)
        if s.points < min_points or f.points < min_points:
            continue
        s_speed, f_speed = s.speed_sum / s.points, f.speed_sum / f.points
        if s_speed <= 0:
            continue
        rows.append(
            BandComparison(
                band=band_label(lo),
                running_from=lo,
                standard_speed=s_speed,
                fly_speed=f_speed,
                speed_ratio=f_speed / s_speed,
                standard_tokens_per_second=s.throughput_sum / s.points,
                fly_tokens_per_second=f.throughput_sum / f.points,
                standard_itl_seconds=_mean(s.itl_sum, s.itl_points),
                fly_itl_seconds=_mean(f.itl_sum, f.itl_points),
            )
        )
    return tuple(rows)


@functools.lru_cache(maxsize=16)
def _compare(
    fly: tuple[tuple[float, float], ...],
    ref: tuple[tuple[float, float], ...],
    reference: LimitReference,
) -> LimitComparison:
    import numpy as np

    name = REFERENCE_NAMES[reference]
    c = crossover(fly, ref, rng=np.random.default_rng(0), reference_name=name)
    highest = c.curve[-1].running if c.curve else None
    return LimitComparison(
        reference, c.status, c.running, c.lower, c.upper, highest, c.curve, c.text
    )


def speculation_limit(
    standard: ConcurrencyProfile,
    fly: ConcurrencyProfile,
    *,
    baseline: ConcurrencyProfile | None = None,
    min_points: int = MIN_POINTS,
) -> SpeculationLimit:
    """Where FLy stops paying against ``baseline`` when given (a target without speculation),
    then against ``standard`` (see :class:`SpeculationLimit`); ``bands`` compare FLy with
    ``standard``. Deterministic, cached on the points."""
    pairs: list[tuple[ConcurrencyProfile, LimitReference]] = [(standard, "standard")]
    if baseline is not None:
        pairs.insert(0, (baseline, "baseline"))
    comparisons = tuple(_compare(fly.settled, ref.settled, name) for ref, name in pairs)
    return SpeculationLimit(
        comparisons=comparisons,
        text=limit_sentence({c.reference: c.text for c in comparisons}) or "",
        bands=band_table(standard, fly, min_points=min_points),
    )
