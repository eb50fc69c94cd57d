"""Where speculation stops paying, with an interval: the first concurrency at which a
speculative arm's per-request decode speed falls to a reference arm's (pure; numpy, scipy).

Input: points ``(running requests, per-request decode speed)`` of each arm (one per scrape or
per request; points with running < 1 or a speed that is not finite and positive are skipped).

Method: per-level comparisons at the concurrencies actually observed, with intervals that hold
simultaneously over the levels; no curve is fitted across levels, so no shape is assumed and
there is no smoothing bias to outrun the interval (a kernel smoother's bias does not shrink
with the noise, its bootstrap interval does, so the cleaner the data the worse it covered).

1. Levels. The points are grouped by ``running`` into levels :data:`LEVELS_PER_OCTAVE` to a
   doubling (running counts 1, 2, 3, 4 fall in levels of their own); a level is compared when
   both arms have points in it. Its concurrency is the mean of the two arms' mean
   ``log(running)`` there.
2. Per level, the difference ``d`` of the arms' mean log speeds: the log of the speed ratio,
   whose sign is the gain's (the slowdown both arms share as the batch grows cancels). When
   the arms' running counts differ within a level, both are moved to the level's concurrency
   along one within-level slope of log speed on log running, pooled over levels and arms (an
   analysis of covariance; it is zero when every level is a single running count).
3. Scatter: each arm's residual variance of log speed within each level, shrunk toward one
   common variance as far as the levels' variances agree (empirical Bayes, Smyth 2004: with
   one size of noise everywhere this is the pooled variance of a one-way layout, with noise
   that changes with concurrency each level keeps nearly its own; see :func:`_moderated`);
   the standard error of ``d`` combines the two arms' (and the slope's), with
   Welch–Satterthwaite degrees of freedom.
4. Simultaneous intervals: ``d ± t·se``, ``t`` Student's quantile for a two-sided coverage of
   ``level^{1/m}`` at each of the ``m`` levels, so that all ``m`` intervals hold together with
   probability at least ``level`` (Šidák 1967, *JASA* 62: 626-633, which covers studentised
   means sharing a variance estimate; a hair tighter than Bonferroni's ``1 − (1 − level)/m``;
   Hochberg & Tamhane, *Multiple Comparison Procedures*, 1987, ch. 2).
5. Verdict. A level is *shown not paying* when its whole interval is below zero and *shown
   paying* when it is wholly above. ``reached`` when some level is shown not paying; the upper
   end of the crossover's interval is the first such level (when all intervals hold, the true
   ratio there is below 1, so the first crossing is at or below it). The lower end is the last
   level of the unbroken run of levels, from the lowest, shown paying (``None`` when the
   lowest is not: the crossing may lie at or below the lowest concurrency seen). The estimate
   is where the log ratio first reaches zero between those two ends, interpolated linearly in
   ``log(running)`` between the two levels around it (a crossing at 30 between levels 26 and
   36 reads about 30, not "from 36"), read from the non-increasing sequence closest to ``d``
   over those levels (pool-adjacent-violators, weighted by ``1/se²``) so that one noisy level
   does not pull it early; the levels outside the two ends are not used, and the interval
   does not depend on it. Above the first level shown not paying, a level shown paying again
   is named in the sentence (a ratio that is not monotone).

The interval holds for any shape of the two speed curves, monotone or not, at the observed
levels; between two neighbouring levels nothing is seen, so it assumes the ratio does not dip
below 1 and back between two levels both shown paying, and a step between two levels is
located only to that gap (the estimate then reads a point inside it). The noise is taken as
log-normal and independent between points. No randomness is drawn:
``rng`` is accepted so that every caller passes the same arguments as before.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

#: Where the crossover stands (``specwatch_speculation_limit_state{state}``).
CrossoverStatus = Literal["reached", "not_reached", "no_data"]
#: Every :data:`CrossoverStatus`, in that order.
CROSSOVER_STATUSES: tuple[CrossoverStatus, ...] = get_args(CrossoverStatus)

#: Coverage of the intervals (simultaneous over the levels).
LEVEL = 0.95
#: Points per arm needed before a crossover is estimated.
MIN_POINTS = 8
#: Levels per doubling of the running count (4: levels 19 % wide; 1, 2, 3, 4 apart).
LEVELS_PER_OCTAVE = 4

#: The speculative arm the crossover is estimated for, as the sentence names it.
CANDIDATE_NAME = "FLy"
#: How the sentence names each reference arm the candidate is compared with ("FLy vs no
#: speculation: …"): ``baseline``, the no-speculation target; ``standard``, the standard arm.
REFERENCE_NAMES: dict[str, str] = {
    "baseline": "no speculation",
    "standard": "standard speculation",
}


@dataclass(frozen=True, slots=True)
class GainPoint:
    """The gain at one compared level: ``running`` requests (the level's concurrency),
    ``gain`` = candidate / reference per-request speed − 1 (a fraction), ``[lower, upper]`` its
    interval, simultaneous with every other level's."""

    running: float
    gain: float
    lower: float
    upper: float


@dataclass(frozen=True, slots=True)
class Crossover:
    """The crossover estimate.

    ``status``: ``reached`` (the gain's interval is wholly below zero at some level seen),
    ``not_reached``, ``no_data`` (fewer than :data:`MIN_POINTS` points on an arm, no level both
    arms were seen at, or no repeated points to measure the scatter). ``running``: the
    interpolated concurrency where the gain first reaches zero (``None`` unless reached);
    ``lower``/``upper`` its interval: ``upper`` the first level shown not paying, ``lower`` the
    last level shown paying below it (``None``: at or below the lowest level seen).
    ``candidate``/``reference`` name the arms; ``curve`` the gain per level; ``level`` the
    intervals' coverage; ``text`` the sentence every surface shows (:func:`crossover_text`);
    ``pays_again`` the first level above ``upper`` shown paying again (``None``: none).
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
    pays_again: float | None = None


def level_of(running: float) -> int:
    """The level index of a running count ≥ 1 (``floor(LEVELS_PER_OCTAVE · log2 running)``,
    nudged so that exact powers of two open their level)."""
    return math.floor(LEVELS_PER_OCTAVE * math.log2(running) + 1e-9)


@dataclass(slots=True)
class _Arm:
    """Per level: the log-running and log-speed values of one arm."""

    xs: dict[int, list[float]]
    ys: dict[int, list[float]]
    count: int


def _group(points: Sequence[tuple[float, float]]) -> _Arm:
    xs: dict[int, list[float]] = defaultdict(list)
    ys: dict[int, list[float]] = defaultdict(list)
    n = 0
    for running, speed in points:
        if math.isfinite(running) and running >= 1 and math.isfinite(speed) and speed > 0:
            k = level_of(running)
            xs[k].append(math.log(running))
            ys[k].append(math.log(speed))
            n += 1
    return _Arm(dict(xs), dict(ys), n)


def _no_data(candidate: str, reference: str, why: str, level: float) -> Crossover:
    text = f"{candidate} vs {reference}: not enough data: {why}"
    return Crossover("no_data", None, None, None, candidate, reference, (), level, text)


def crossover(
    candidate: Sequence[tuple[float, float]],
    reference: Sequence[tuple[float, float]],
    *,
    rng: np.random.Generator,
    candidate_name: str = CANDIDATE_NAME,
    reference_name: str = REFERENCE_NAMES["standard"],
    level: float = LEVEL,
    min_points: int = MIN_POINTS,
) -> Crossover:
    """Estimate where ``candidate`` first stops decoding faster per request than
    ``reference`` (points ``(running, per-request speed)``). See the module docstring for the
    method. Pure; ``rng`` is not drawn from (the intervals are closed-form)."""
    import numpy as np
    from scipy.special import stdtrit  # Student's t quantile; scipy.stats is slow to import

    del rng
    ca, ra = _group(candidate), _group(reference)
    if ca.count < min_points or ra.count < min_points:
        why = (
            f"{ca.count} points for {candidate_name}, {ra.count} for {reference_name} "
            f"(need {min_points} each)"
        )
        return _no_data(candidate_name, reference_name, why, level)
    shared = sorted(set(ca.xs) & set(ra.xs))
    if not shared:
        why = "the two arms were seen at no common concurrency"
        return _no_data(candidate_name, reference_name, why, level)

    # within-level sums of each arm, per level (the slope pools them over levels and arms)
    def sums(arm: _Arm) -> dict[int, tuple[float, float, float, int]]:
        out: dict[int, tuple[float, float, float, int]] = {}
        for k, xl in arm.xs.items():
            x, y = np.asarray(xl), np.asarray(arm.ys[k])
            dx, dy = x - x.mean(), y - y.mean()
            out[k] = (float(dx @ dx), float(dx @ dy), float(dy @ dy), len(xl) - 1)
        return out

    c_sums, r_sums = sums(ca), sums(ra)
    sxx = sum(v[0] for v in (*c_sums.values(), *r_sums.values()))
    sxy = sum(v[1] for v in (*c_sums.values(), *r_sums.values()))
    fitted = sxx > 1e-12
    slope = sxy / sxx if fitted else 0.0

    def scatter(per: dict[int, tuple[float, float, float, int]]) -> dict[int, tuple[float, float]]:
        ss = {
            k: max(0.0, yy - 2 * slope * xy + slope * slope * xx)
            for k, (xx, xy, yy, _) in per.items()
        }
        return _moderated(ss, {k: v[3] for k, v in per.items()})

    c_df = sum(v[3] for v in c_sums.values())
    r_df = sum(v[3] for v in r_sums.values())
    if min(c_df, r_df) - (1 if fitted else 0) < 1:
        why = "no concurrency level with repeated points on each arm to measure the scatter"
        return _no_data(candidate_name, reference_name, why, level)
    c_var, r_var = scatter(c_sums), scatter(r_sums)
    if fitted:  # the slope's variance, from each arm's pooled scatter
        pooled = [
            sum(max(0.0, yy - 2 * slope * xy + slope * slope * xx) for xx, xy, yy, _ in p.values())
            / max(df, 1)
            for p, df in ((c_sums, c_df - 1), (r_sums, r_df - 1))
        ]
        c_xx = sum(v[0] for v in c_sums.values())
        slope_var = (pooled[0] * c_xx + pooled[1] * (sxx - c_xx)) / (sxx * sxx)
    else:
        slope_var = 0.0

    m = len(shared)
    tail = 1.0 - level ** (1.0 / m)  # Šidák: two-sided, per level
    at = np.empty(m)
    d = np.empty(m)
    half = np.empty(m)
    for i, k in enumerate(shared):
        nc, nr = len(ca.xs[k]), len(ra.xs[k])
        xc, xr = sum(ca.xs[k]) / nc, sum(ra.xs[k]) / nr
        gap = xc - xr
        at[i] = 0.5 * (xc + xr)
        d[i] = sum(ca.ys[k]) / nc - sum(ra.ys[k]) / nr - slope * gap
        (vc, dfc), (vr, dfr) = c_var[k], r_var[k]
        a, b = vc / nc, vr / nr
        var = a + b + gap * gap * slope_var
        if var <= 0.0:
            half[i] = 0.0
            continue
        dof = (a + b) ** 2 / (a * a / dfc + b * b / dfr) if a + b > 0 else math.inf
        half[i] = float(stdtrit(dof, 1.0 - tail / 2.0)) * math.sqrt(var)
    low, up = d - half, d + half
    curve = tuple(
        GainPoint(math.exp(x), math.expm1(v), math.expm1(lo), math.expm1(hi))
        for x, v, lo, hi in zip(at, d, low, up, strict=True)
    )
    not_paying = np.flatnonzero(up < 0)
    if not_paying.size == 0:
        return _result(
            Crossover(
                "not_reached",
                None,
                None,
                None,
                candidate_name,
                reference_name,
                curve,
                level,
                "",
                None,
            )
        )
    first = int(not_paying[0])
    paying = low[:first] > 0
    run = first if bool(paying.all()) else int(np.argmin(paying))  # levels 0..run-1 pay
    start = max(run - 1, 0)
    fit = _decreasing(d[start : first + 1], half[start : first + 1])
    point = math.exp(at[start])  # fit[0] <= 0: at or below the lowest level seen
    for j in range(len(fit) - 1):
        if fit[j] > 0 >= fit[j + 1]:
            i = start + j
            frac = fit[j] / (fit[j] - fit[j + 1])
            point = math.exp(at[i] + frac * (at[i + 1] - at[i]))
            break
    again = np.flatnonzero(low[first + 1 :] > 0)
    return _result(
        Crossover(
            "reached",
            point,
            math.exp(at[run - 1]) if run > 0 else None,
            math.exp(at[first]),
            candidate_name,
            reference_name,
            curve,
            level,
            "",
            math.exp(at[first + 1 + int(again[0])]) if again.size else None,
        )
    )


def _trigamma_inverse(x: float) -> float:
    """``y`` with ψ′(y) = ``x`` (Newton's method on 1/ψ′, Smyth 2004, appendix)."""
    from scipy.special import polygamma

    if x > 1e7:
        return 1.0 / math.sqrt(x)
    if x < 1e-6:
        return 1.0 / x
    y = 0.5 + 1.0 / x
    for _ in range(50):
        tri = float(polygamma(1, y))
        step = tri * (1.0 - tri / x) / float(polygamma(2, y))
        y += step
        if -step / y < 1e-8:
            break
    return y


def _moderated(ss: dict[int, float], dfs: dict[int, int]) -> dict[int, tuple[float, float]]:
    """Per level of one arm, its variance of log speed and the degrees of freedom behind it,
    from the residual sums of squares ``ss`` on ``dfs`` degrees of freedom per level: each
    level's own variance shrunk toward a common one as far as the levels' variances agree
    (Smyth 2004, "Linear models and empirical Bayes methods for assessing differential
    expression in microarray experiments", *Stat. Appl. Genet. Mol. Biol.* 3(1), §6.2: the
    prior's degrees of freedom ``d0`` and scale ``s0²`` fitted to the log variances by
    moments). One scatter everywhere gives ``d0`` = ∞, the pooled variance; a scatter that
    changes with concurrency gives a small ``d0``, each level nearly on its own. The degrees
    of freedom are capped at the arm's total (the prior is fitted from the same points)."""
    from scipy.special import digamma, polygamma

    total = sum(dfs.values())
    pooled = sum(ss.values()) / total
    own = {k: ss[k] / dfs[k] for k in ss if dfs[k] > 0}
    if len(own) < 3 or pooled <= 0.0:
        return {k: (pooled, float(total)) for k in ss}
    floor = 1e-6 * pooled  # a level whose points all agree: not log(0)
    e = {
        k: math.log(max(v, floor)) - float(digamma(dfs[k] / 2)) + math.log(dfs[k] / 2)
        for k, v in own.items()
    }
    mean = sum(e.values()) / len(e)
    g = len(e)
    spread = sum((v - mean) ** 2 for v in e.values()) / (g - 1)
    rhs = spread - sum(float(polygamma(1, dfs[k] / 2)) for k in e) / g
    if rhs <= 0:
        return {k: (pooled, float(total)) for k in ss}
    d0 = 2.0 * _trigamma_inverse(rhs)
    s0 = math.exp(mean + float(digamma(d0 / 2)) - math.log(d0 / 2))
    return {k: ((d0 * s0 + ss[k]) / (d0 + dfs[k]), min(d0 + dfs[k], float(total))) for k in ss}


def _decreasing(d: npt.NDArray[np.float64], half: npt.NDArray[np.float64]) -> list[float]:
    """The non-increasing sequence closest to ``d`` in squared error weighted by
    ``1 / half²`` (equal weights where every ``half`` is zero): pool adjacent violators
    (Barlow, Bartholomew, Bremner & Brunk, *Statistical Inference under Order Restrictions*,
    1972)."""
    import numpy as np

    positive = half[half > 0]
    floor = float(positive.min()) if positive.size else 1.0
    weights = 1.0 / np.maximum(half, floor) ** 2
    blocks: list[list[float]] = []  # [weighted mean, weight, length]
    for v, w in zip(d.tolist(), weights.tolist(), strict=True):
        blocks.append([v, w, 1.0])
        while len(blocks) > 1 and blocks[-2][0] < blocks[-1][0]:
            v2, w2, n2 = blocks.pop()
            v1, w1, n1 = blocks[-1]
            blocks[-1] = [(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, n1 + n2]
    return [b[0] for b in blocks for _ in range(int(b[2]))]


def _result(draft: Crossover) -> Crossover:
    """``draft`` (its ``text`` empty) with the sentence that says it."""
    return dataclasses.replace(draft, text=crossover_text(draft))


def _pct(v: float) -> str:
    return f"{100 * v:+.1f} %"


def crossover_label(c: Crossover) -> str:
    """What is compared: ``"FLy vs no speculation"``, ``"FLy vs standard speculation"``."""
    return f"{c.candidate} vs {c.reference}"


def limit_headline(
    label: str,
    status: CrossoverStatus,
    running: float | None,
    lower: float | None,
    upper: float | None,
    highest: float | None,
    level: float = LEVEL,
) -> str:
    """The first part of :func:`crossover_text`, from the numbers alone (what ``/metrics``
    carries): ``"<label>: stops paying from about N running requests (95 % interval a-b)"``,
    ``"<label>: not reached within the observed range (highest concurrency seen: N)"`` or
    ``"<label>: not enough data"``."""
    if status == "no_data" or highest is None:
        return f"{label}: not enough data"
    if status == "not_reached" or running is None or upper is None:
        return (
            f"{label}: not reached within the observed range (highest concurrency seen: "
            f"{highest:.0f})"
        )
    pct = f"{100 * level:g} %"
    interval = (
        f"{pct} interval: at most {upper:.0f}"
        if lower is None
        else f"{pct} interval {lower:.0f}-{upper:.0f}"
    )
    plural = "" if round(running) == 1 else "s"
    return f"{label}: stops paying from about {running:.0f} running request{plural} ({interval})"


def limit_sentence(texts: Mapping[str, str]) -> str | None:
    """The speculation-limit sentence every surface shows: each comparison's text (keyed by
    reference, :data:`REFERENCE_NAMES`: the no-speculation baseline first, then the standard
    arm) joined by ``". "``; ``None`` without any. The sidecar passes :func:`crossover_text`
    of each comparison, a reader of ``/metrics`` (which carries no gain) :func:`limit_headline`."""
    parts = [texts[reference] for reference in REFERENCE_NAMES if reference in texts]
    return ". ".join(parts) if parts else None


def crossover_text(c: Crossover) -> str:
    """The one sentence for a :class:`Crossover`, labelled with what is compared (the CLI,
    the view, the report and the JSON all show this): :func:`limit_headline` (where it stops
    paying with the interval, or "not reached within the observed range" naming the highest
    concurrency seen), then the gain at that concurrency with its interval."""
    if c.status == "no_data" or not c.curve:
        return c.text  # the reason, labelled when it was made
    top = c.curve[-1]
    pct = f"{100 * c.level:g} %"
    head = limit_headline(
        crossover_label(c), c.status, c.running, c.lower, c.upper, top.running, c.level
    )
    again = "" if c.pays_again is None else f"; shown paying again at {c.pays_again:.0f} running"
    return (
        f"{head}; per-request decode speed at {top.running:.0f} running: {_pct(top.gain)} "
        f"({pct} interval {_pct(top.lower)} to {_pct(top.upper)}){again}"
    )
