"""Where speculation stops paying: decode speed by the number of running requests (pure).

Speculative decoding pays most at low concurrency; as the batch grows the verifier's extra
tokens compete with other requests for the token budget and the gain shrinks until the
speculative arm is no faster (vLLM's own benchmarks and public serving reports describe the
same curve). Each good scrape of a target adds one point to its :class:`ConcurrencyProfile`:
the running requests at the scrape (``vllm:num_requests_running``, summed over engines), the
generation throughput and the median inter-token latency of the target's shortest window. Points
are kept as sums per running-request band (powers of two: ``1``, ``2-3``, ``4-7``, …,
``512+``), so memory is fixed. :func:`speculation_limit` compares FLy's per-request decode speed
(generation tokens/s ÷ running requests) with the standard arm's band by band and reports the
lowest band from which FLy is no faster, or that it is not reached.

Assumptions, stated in the output: both arms serve comparable requests (prompt and output
lengths), a window's throughput is attributed to the running count at its end, and a band
counts only with at least :data:`MIN_POINTS` points on each arm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal, get_args

#: Lower bounds of the running-request bands.
BANDS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)

#: Points per arm a band needs before it is compared.
MIN_POINTS = 3

#: What the comparison assumes (printed with the result).
ASSUMPTIONS: tuple[str, ...] = (
    "both arms serve comparable requests (prompt and output lengths)",
    "a window's throughput is attributed to the running requests at its end",
    f"a band is compared only with at least {MIN_POINTS} scrapes on each arm",
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
    """Per-band sums of one target (``bands[lower bound]``); immutable, :func:`add_point`
    returns a new one."""

    bands: tuple[tuple[int, BandSums], ...] = ()

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
    return ConcurrencyProfile(tuple(sorted(bands.items())))


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
LimitStatus = Literal["reached", "not_reached", "no_data"]
#: Every :data:`LimitStatus`, in that order.
LIMIT_STATUSES: tuple[LimitStatus, ...] = get_args(LimitStatus)


@dataclass(frozen=True, slots=True)
class SpeculationLimit:
    """Where FLy stops being faster than the standard arm.

    ``status``: ``reached`` (``running`` = the lower bound of the first band where FLy's
    per-request speed is ≤ the standard arm's), ``not_reached`` (FLy faster in every band
    compared; ``running`` is ``None``), ``no_data`` (no band with enough points on both).
    ``text`` says it in words; ``bands`` the comparisons; ``assumptions`` what it rests on.
    """

    status: LimitStatus
    running: int | None
    text: str
    bands: tuple[BandComparison, ...]
    assumptions: tuple[str, ...] = ASSUMPTIONS


def _mean(total: float, n: int) -> float | None:
    return total / n if n else None


def speculation_limit(
    standard: ConcurrencyProfile, fly: ConcurrencyProfile, *, min_points: int = MIN_POINTS
) -> SpeculationLimit:
    """Compare the two profiles band by band (see :class:`SpeculationLimit`). Pure."""
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
    if not rows:
        return SpeculationLimit(
            "no_data",
            None,
            "not enough data: no running-request band seen on both arms "
            f"({min_points} scrapes each)",
            (),
        )
    slower = next((r for r in rows if r.speed_ratio <= 1.0), None)
    if slower is None:
        top = rows[-1]
        return SpeculationLimit(
            "not_reached",
            None,
            f"not reached: FLy decodes faster per request in every band seen (up to "
            f"{top.band} running, {top.speed_ratio:.2f}× there)",
            tuple(rows),
        )
    return SpeculationLimit(
        "reached",
        slower.running_from,
        f"speculation stops paying from {slower.running_from} running requests: FLy decodes "
        f"{slower.speed_ratio:.2f}× the standard arm's per-request speed in band {slower.band}",
        tuple(rows),
    )
