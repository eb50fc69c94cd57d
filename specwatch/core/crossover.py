"""Where speculation stops paying, with an interval: the crossover of a speculative arm's
per-request decode speed with a reference arm's, over concurrency (pure; numpy).

Input: points ``(running requests, per-request decode speed)`` of each arm (one per scrape or
per request; speeds ≤ 0 are skipped). Each arm's log speed is smoothed over ``log(running)`` by
a local linear regression with a Gaussian kernel (Fan & Gijbels, *Local Polynomial Modelling
and Its Applications*, 1996: no boundary bias to first order, unlike a running mean; the
bandwidth is Silverman's rule clipped to :data:`BANDWIDTH_BOUNDS`), evaluated on
:data:`GRID_POINTS` concurrencies spaced evenly in ``log(running)`` over the range both arms
cover. Fitting log speed makes the slowdown both arms share as the batch grows cancel in the
ratio, so only the curvature of the gain itself biases the estimate. The gain at a concurrency
is ``candidate speed / reference speed − 1``; the crossover is the first concurrency where the
estimated log ratio reaches zero, interpolated linearly in ``log(running)`` between the two grid
points around the sign change (no bands: a true crossover of 20 reads about 20, not "from 16"
or "from 32").

Uncertainty: a Poisson bootstrap over the points (each point weighted by an independent
Poisson(1) count per resample, both arms resampled independently; Hanley & MacGibbon 2006,
Chamandy et al. 2012) gives, at every grid concurrency, a percentile interval of the gain, and
per resample a crossover (``+inf`` when a resample never crosses), whose percentiles are the
interval of the crossover. The verdict is conservative: ``reached`` only when at some observed
concurrency the whole interval of the gain is below zero; when the interval covers zero
everywhere, or stays above it, ``not_reached``. Randomness is the caller's
:class:`numpy.random.Generator` (a fixed seed gives the same answer on every surface).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

#: Where the crossover stands (``specwatch_speculation_limit_state{state}``).
CrossoverStatus = Literal["reached", "not_reached", "no_data"]
#: Every :data:`CrossoverStatus`, in that order.
CROSSOVER_STATUSES: tuple[CrossoverStatus, ...] = get_args(CrossoverStatus)

#: Concurrencies the gain is evaluated at (evenly spaced in log(running)).
GRID_POINTS = 32
#: Bootstrap resamples.
RESAMPLES = 200
#: Coverage of the intervals.
LEVEL = 0.95
#: Points per arm needed before a crossover is estimated.
MIN_POINTS = 8
#: Kernel weight (in points) each arm needs near a grid concurrency for it to be evaluated.
MIN_LOCAL_WEIGHT = 2.0
#: Bounds of the kernel bandwidth in log(running) (0.1: ±10 %; 0.5: ±65 %).
BANDWIDTH_BOUNDS = (0.1, 0.5)


@dataclass(frozen=True, slots=True)
class GainPoint:
    """The gain at one concurrency: ``running`` requests, ``gain`` = candidate / reference
    per-request speed − 1 (a fraction), ``[lower, upper]`` its bootstrap interval."""

    running: float
    gain: float
    lower: float
    upper: float


@dataclass(frozen=True, slots=True)
class Crossover:
    """The crossover estimate.

    ``status``: ``reached`` (the gain's interval is wholly below zero at some concurrency
    seen), ``not_reached``, ``no_data`` (fewer than :data:`MIN_POINTS` points on an arm, or no
    concurrency both arms cover). ``running``: the interpolated concurrency where the gain
    reaches zero (``None`` unless reached); ``lower``/``upper`` its interval (``upper`` ``None``:
    beyond the largest concurrency seen). ``candidate``/``reference`` name the arms;
    ``curve`` the gain over the grid; ``level`` the intervals' coverage; ``text`` the sentence
    every surface shows (:func:`crossover_text`).
    """

    status: CrossoverStatus
    running: float | None
    lower: float | None
    upper: float | None
    candidate: str
    reference: str
    curve: tuple[GainPoint, ...]
    level: float
    text: str


def _bandwidth(x: npt.NDArray[np.float64]) -> float:
    """Silverman's rule in log(running), clipped to :data:`BANDWIDTH_BOUNDS`."""
    import numpy as np

    lo, hi = BANDWIDTH_BOUNDS
    sd = float(np.std(x))
    rule: float = 1.06 * sd * float(len(x)) ** -0.2
    return min(hi, max(lo, rule))


def _local_linear(
    x: npt.NDArray[np.float64],
    y: npt.NDArray[np.float64],
    grid: npt.NDArray[np.float64],
    h: float,
    weights: npt.NDArray[np.float64],
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Local linear fits at ``grid`` for every row of ``weights`` (resamples × points):
    ``(fits, kernel weight)``, each resamples × grid."""
    import numpy as np

    d = x[None, :] - grid[:, None]  # grid × points
    k = np.exp(-0.5 * (d / h) ** 2)
    s0 = weights @ k.T
    s1 = weights @ (k * d).T
    s2 = weights @ (k * d * d).T
    t0 = weights @ (k * y).T
    t1 = weights @ (k * d * y).T
    det = s0 * s2 - s1 * s1
    with np.errstate(divide="ignore", invalid="ignore"):
        linear = (s2 * t0 - s1 * t1) / det
        mean = t0 / s0
    ok = np.abs(det) > 1e-12 * np.maximum(s0 * s2, 1e-300)
    return np.where(ok, linear, mean), s0


def _first_crossing(
    grid: npt.NDArray[np.float64], gains: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """Per row of ``gains`` (rows × grid, log-running ``grid``; the log speed ratio, whose sign
    is the gain's): the running count where it first reaches zero, interpolated linearly in
    log(running); ``+inf`` when it never does; the first grid concurrency when it is already
    ≤ 0 there."""
    import numpy as np

    below = gains <= 0
    has = below.any(axis=1)
    i = np.argmax(below, axis=1)
    prev = np.maximum(i - 1, 0)
    rows = np.arange(gains.shape[0])
    g0, g1 = gains[rows, prev], gains[rows, i]
    x0, x1 = grid[prev], grid[i]
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(i > 0, g0 / (g0 - g1), 0.0)
    at = np.exp(x0 + np.clip(frac, 0.0, 1.0) * (x1 - x0))
    return np.where(has, at, np.inf)


def _clean(points: Sequence[tuple[float, float]]) -> tuple[list[float], list[float]]:
    xs: list[float] = []
    ys: list[float] = []
    for running, speed in points:
        if math.isfinite(running) and running >= 1 and math.isfinite(speed) and speed > 0:
            xs.append(math.log(running))
            ys.append(math.log(speed))
    return xs, ys


def _no_data(candidate: str, reference: str, why: str, level: float) -> Crossover:
    return Crossover(
        "no_data", None, None, None, candidate, reference, (), level, f"not enough data: {why}"
    )


def crossover(
    candidate: Sequence[tuple[float, float]],
    reference: Sequence[tuple[float, float]],
    *,
    rng: np.random.Generator,
    candidate_name: str = "FLy",
    reference_name: str = "the standard arm",
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    min_points: int = MIN_POINTS,
) -> Crossover:
    """Estimate where ``candidate`` stops decoding faster per request than ``reference``
    (points ``(running, per-request speed)``; points with running < 1 or a non-finite value are
    skipped). See the module docstring for the method. Pure but for ``rng``, which it draws
    from."""
    import numpy as np

    cx, cy = _clean(candidate)
    rx, ry = _clean(reference)
    if len(cx) < min_points or len(rx) < min_points:
        why = (
            f"{len(cx)} points for {candidate_name}, {len(rx)} for {reference_name} "
            f"(need {min_points} each)"
        )
        return _no_data(candidate_name, reference_name, why, level)
    xc, yc = np.asarray(cx), np.asarray(cy)
    xr, yr = np.asarray(rx), np.asarray(ry)
    lo, hi = max(xc.min(), xr.min()), min(xc.max(), xr.max())
    if hi < lo:
        why = "the two arms were seen at no common concurrency"
        return _no_data(candidate_name, reference_name, why, level)
    grid = np.linspace(lo, hi, GRID_POINTS) if hi > lo else np.asarray([lo])
    h = _bandwidth(np.concatenate([xc, xr]))

    def fits(
        x: npt.NDArray[np.float64], y: npt.NDArray[np.float64]
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        boot = rng.poisson(1.0, size=(resamples, len(x))).astype(np.float64)
        w = np.vstack([np.ones((1, len(x))), boot])
        f, s0 = _local_linear(x, y, grid, h, w)
        return f[0], f[1:], s0[0]

    c_hat, c_boot, c_w = fits(xc, yc)
    r_hat, r_boot, r_w = fits(xr, yr)
    keep = (c_w >= MIN_LOCAL_WEIGHT) & (r_w >= MIN_LOCAL_WEIGHT)
    if not keep.any():
        why = "the two arms share no concurrency with enough points"
        return _no_data(candidate_name, reference_name, why, level)
    grid, c_hat, r_hat = grid[keep], c_hat[keep], r_hat[keep]
    c_boot, r_boot = c_boot[:, keep], r_boot[:, keep]
    log_ratio, boot_ratio = c_hat - r_hat, c_boot - r_boot
    gain, boot = np.expm1(log_ratio), np.expm1(boot_ratio)
    tail = (1.0 - level) / 2.0
    quantile = np.nanquantile if bool(np.isnan(boot).any()) else np.quantile
    low = quantile(boot, tail, axis=0)
    up = quantile(boot, 1.0 - tail, axis=0)
    curve = tuple(
        GainPoint(float(math.exp(g)), float(v), float(a), float(b))
        for g, v, a, b in zip(grid, gain, low, up, strict=True)
        if math.isfinite(v) and math.isfinite(a) and math.isfinite(b)
    )
    if not curve:
        why = "no concurrency with a finite estimate on both arms"
        return _no_data(candidate_name, reference_name, why, level)
    if not bool((up < 0).any()):
        return _result(
            "not_reached", None, None, None, candidate_name, reference_name, curve, level
        )
    point = float(_first_crossing(grid, log_ratio[None, :])[0])
    if not math.isfinite(point):
        point = float(math.exp(grid[int(np.argmax(up < 0))]))
    crossings = _first_crossing(grid, np.nan_to_num(boot_ratio, nan=np.inf))
    c_lo = float(np.quantile(crossings, tail))
    c_up = float(np.quantile(crossings, 1.0 - tail))
    return _result(
        "reached",
        point,
        min(c_lo, point) if math.isfinite(c_lo) else point,
        max(c_up, point) if math.isfinite(c_up) else None,
        candidate_name,
        reference_name,
        curve,
        level,
    )


def _result(
    status: CrossoverStatus,
    running: float | None,
    lower: float | None,
    upper: float | None,
    candidate: str,
    reference: str,
    curve: tuple[GainPoint, ...],
    level: float,
) -> Crossover:
    draft = Crossover(status, running, lower, upper, candidate, reference, curve, level, "")
    return Crossover(
        status, running, lower, upper, candidate, reference, curve, level, crossover_text(draft)
    )


def _pct(v: float) -> str:
    return f"{100 * v:+.1f} %"


def crossover_text(c: Crossover) -> str:
    """The one sentence for a :class:`Crossover` (the CLI, the view, the report and the JSON
    all show this): the crossover with its interval, or why it is not reached, with the gain
    at the largest concurrency seen."""
    if c.status == "no_data" or not c.curve:
        return c.text
    top = c.curve[-1]
    pct = f"{100 * c.level:g} %"
    seen = (
        f"{c.curve[0].running:.0f}-{top.running:.0f} running"
        if len(c.curve) > 1
        else f"{top.running:.0f} running"
    )
    at_top = (
        f"at {top.running:.0f} running: {_pct(top.gain)}, {pct} interval "
        f"{_pct(top.lower)} to {_pct(top.upper)}"
    )
    if c.status == "not_reached" or c.running is None:
        return (
            f"not reached: {c.candidate}'s per-request decode speed is not shown below "
            f"{c.reference}'s at any concurrency seen ({seen}); {at_top}"
        )
    upper = "beyond the concurrencies seen" if c.upper is None else f"{c.upper:.0f}"
    lower = c.running if c.lower is None else c.lower
    return (
        f"speculation stops paying at about {c.running:.0f} running requests ({pct} interval "
        f"{lower:.0f} to {upper}): {c.candidate} decodes per request no faster than "
        f"{c.reference} from there; {at_top}"
    )
