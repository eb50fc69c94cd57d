"""Sample size for a paired (McNemar) comparison: how many questions detect a given net loss.

Connor's normal approximation (:func:`questions_needed`) and the exact test's power and sample
size (:func:`exact_power`, :func:`exact_questions_needed`) are fixed-n plans; the one "about N
more pairs" (:func:`pairs_to_decide`) is the forecast of the sequential tests that decide."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
from scipy.special import bdtr, bdtrc, gammaln, ndtri  # no scipy.stats import (slow)

from specwatch.core.config import OVERALL
from specwatch.shadow.stats.confseq import within_margin_log_e_value
from specwatch.shadow.stats.eprocess import count_log_e_values
from specwatch.shadow.stats.policy import NO_NET_LOSS, PagePolicy

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


def z_quantile(p: float, decimals: int | None = 4) -> float:
    """Standard normal quantile Φ⁻¹(p), rounded to ``decimals`` like a printed z table.

    With the default 4 decimals, p = 0.975 gives 1.96 and p = 0.8 gives 0.8416, the values
    the seed's ``questions_needed`` uses. ``decimals=None`` keeps full precision.
    """
    if not 0.0 < p < 1.0:
        raise ValueError("p must be in (0, 1)")
    z = float(ndtri(p))
    return z if decimals is None else round(z, decimals)


def questions_needed_z(net_loss: float, discordant: float, z_alpha: float, z_beta: float) -> int:
    """Connor's sample-size formula for McNemar's test, given the two z values.

    Source: Connor R.J. (1987), "Sample size for testing differences in proportions for the
    paired-sample design", Biometrics 43:207-211 (the seed's ``questions_needed``):
    ``n = ceil((z_α sqrt(ψ) + z_β sqrt(ψ - δ²))² / δ²)`` with δ = net loss and ψ = discordant
    rate (share of questions that flip either way; must satisfy δ <= ψ <= 1).
    Raises ValueError outside that range, and when δ is so small that n is not a finite float.
    """
    if not 0.0 < abs(net_loss) <= discordant <= 1.0:
        raise ValueError("need 0 < |net_loss| <= discordant <= 1")
    d2 = net_loss * net_loss
    root = z_alpha * math.sqrt(discordant) + z_beta * math.sqrt(discordant - d2)
    n = root * root / d2 if d2 > 0.0 else math.inf
    if not math.isfinite(n):  # δ² underflows to 0 (|δ| < ~1e-162) or n overflows a float
        raise ValueError(f"net_loss {net_loss!r} is too small: no finite sample size detects it")
    # Guard against a ceil landing one above an exact integer through float noise.
    return math.ceil(n - 1e-9)


def questions_needed(
    net_loss: float,
    discordant: float,
    alpha: float = 0.05,
    power: float = 0.8,
    two_sided: bool = True,
    z_decimals: int | None = 4,
) -> int:
    """Paired questions needed to detect ``net_loss`` at ``discordant`` flip rate.

    Connor (1987), Biometrics 43:207-211, with ``z_α = Φ⁻¹(1 - α/2)`` (two-sided, the seed's
    default) or ``Φ⁻¹(1 - α)`` (one-sided) and ``z_β = Φ⁻¹(power)``, each rounded to
    ``z_decimals`` (4, as in printed tables and the seed: 1.96 and 0.8416). Examples (α = 0.05,
    power 0.8): net loss 0.02 at 6% discordance -> 1,175; 0.01 at 6% -> 4,708; 0.02 at 8% ->
    1,568. With unrounded quantiles (``z_decimals=None``) the middle one is 4,707.
    """
    if not 0.0 < alpha < 1.0 or not 0.0 < power < 1.0:
        raise ValueError("alpha and power must be in (0, 1)")
    z_a = z_quantile(1.0 - alpha / 2.0 if two_sided else 1.0 - alpha, z_decimals)
    z_b = z_quantile(power, z_decimals)
    return questions_needed_z(net_loss, discordant, z_a, z_b)


def pairs_to_decide(
    net_loss: float,
    discordant: float,
    n: int,
    margin: float,
    alpha: float = 0.05,
) -> int | None:
    """ "About N more pairs": the labelled pairs still needed, **at the observed rates**, for
    one of the two sequential tests that decide to decide, the one that needs fewer.

    After ``n`` labelled pairs with observed net loss ``L̂`` and discordance ``ψ̂`` (fractions)
    the counts are ``lost = n (ψ̂ + L̂) / 2``, ``gained = n (ψ̂ - L̂) / 2``. A loss (``L̂ > 0``) is
    shown when the no-net-loss e-value of all pairs reaches its page threshold
    (:class:`~specwatch.shadow.stats.policy.PagePolicy` at ``alpha``: 30 at 5 %); "within
    ``margin``" when the confidence sequence's e-value reaches ``1/alpha``
    (:func:`~specwatch.shadow.stats.confseq.within_margin_log_e_value`, for ``L̂ < margin``).
    Each is followed along the expected path (every further pair adds the observed shares of
    lost, gained and agreeing pairs), where its log is convex in the pairs added, so the first
    pair at which it reaches the threshold is found by bisection. Real paths get there
    somewhat sooner (the mixture rides its luckiest components: the median 10-25 % sooner in
    simulations at the grid's rates), so this is an upper estimate of the median.

    Returns 0 when one is already decided, ``None`` without labelled pairs, for a NaN rate, or
    when neither can be decided at the observed rates (no loss and no margin, or no discordant
    pairs). The one function behind every "about N more pairs"."""
    if n <= 0 or not math.isfinite(net_loss) or not math.isfinite(discordant):
        return None
    disc = min(max(discordant, 0.0), 1.0)
    est = min(max(net_loss, -disc), disc)
    lost, gained = n * (disc + est) / 2.0, n * (disc - est) / 2.0
    agree = max(n - lost - gained, 0.0)
    pl, pg, pa = lost / n, gained / n, agree / n
    needed: list[int] = []
    if est > 0.0:
        level = PagePolicy(alpha=alpha).log_level(OVERALL, NO_NET_LOSS)
        m = _first_pairs(lambda k: float(count_log_e_values(lost + k * pl, gained + k * pg)), level)
        if m is not None:
            needed.append(m)
    if margin > 0.0 and est < margin:
        m = _first_pairs(
            lambda k: float(
                within_margin_log_e_value(lost + k * pl, gained + k * pg, agree + k * pa, margin)
            ),
            -math.log(alpha),
        )
        if m is not None:
            needed.append(m)
    return min(needed) if needed else None


#: The forecast looks no further than this many more pairs.
FORECAST_CAP = 1 << 40


def _first_pairs(log_e: Callable[[float], float], level: float) -> int | None:
    """The least whole ``k >= 0`` with ``log_e(k) >= level`` for a convex ``log_e``, or
    ``None`` when none is found up to :data:`FORECAST_CAP`."""
    if log_e(0.0) >= level:
        return 0
    hi = 1
    while log_e(float(hi)) < level:
        hi *= 2
        if hi > FORECAST_CAP:
            return None
    lo = hi // 2  # log_e(lo) < level (lo = 0 or the previous hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if log_e(float(mid)) >= level:
            hi = mid
        else:
            lo = mid
    return hi


def _reject_bounds(d_max: int, alpha: float, two_sided: bool) -> tuple[IntArray, IntArray]:
    """For D = 0..d_max discordant pairs, the exact McNemar test's rejection region on the lost
    count X ~ Binomial(D, 1/2): reject when ``X >= hi[D]`` or ``X <= lo[D]`` (``lo = -1``: no
    lower region, one-sided). ``lo[D]`` is the largest k with ``P[X <= k] <= a`` (a = alpha/2
    two-sided, alpha one-sided): the p-value ``2 P[X <= min]`` (two-sided) or ``P[X >= lost]``
    (one-sided) of :func:`~specwatch.shadow.stats.paired.mcnemar_exact_p` is ``<= alpha``
    exactly there; ``hi = D - lo`` by symmetry. Vectorised bisection on ``bdtr``."""
    a = alpha / 2.0 if two_sided else alpha
    d = np.arange(d_max + 1, dtype=np.int64)
    lo, hi = np.full(d.size, -1, dtype=np.int64), d.copy()  # answer in [lo, hi]
    while np.any(lo < hi):
        act = lo < hi
        mid = (lo + hi + 1) // 2
        ok = np.zeros(d.size, dtype=bool)
        ok[act] = bdtr(mid[act], d[act], 0.5) <= a
        lo = np.where(act & ok, mid, lo)
        hi = np.where(act & ~ok, mid - 1, hi)
    k_lo = np.where(d == 0, -1, lo)
    return d - k_lo, (k_lo if two_sided else np.full(d.size, -1, dtype=np.int64))


def exact_power(
    n: int, net_loss: float, discordant: float, alpha: float = 0.05, two_sided: bool = True
) -> float:
    """Power of the exact (conditional binomial) McNemar test over ``n`` pairs, unconditional
    on the discordant count: ``D ~ Binomial(n, ψ)``, ``lost | D ~ Binomial(D, p)`` with
    ``p = 1/2 + δ / (2 ψ)``; ``Σ_D P(D) P(reject | D)`` with the rejection region of
    :func:`_reject_bounds` (the test of :func:`~specwatch.shadow.stats.paired.mcnemar_exact_p`
    at level ``alpha``). Exact up to float rounding; e.g. δ = 0.02 at ψ = 0.06 and n = 1,175
    (Connor's n for 80 %) gives 0.776. Raises ``ValueError`` as Connor's formula does."""
    if not 0.0 < abs(net_loss) <= discordant <= 1.0:
        raise ValueError("need 0 < |net_loss| <= discordant <= 1")
    if n < 0:
        raise ValueError("n must be >= 0")
    return float(_power_curve(np.array([n]), net_loss, discordant, alpha, two_sided)[0])


def _power_curve(
    ns: IntArray, net_loss: float, discordant: float, alpha: float, two_sided: bool
) -> FloatArray:
    p = 0.5 + net_loss / (2.0 * discordant)
    k_hi, k_lo = _reject_bounds(int(ns.max()), alpha, two_sided)
    di = np.arange(k_hi.size, dtype=np.int64)
    d = di.astype(np.float64)
    # P(reject | D): P[X >= k_hi] + P[X <= k_lo] for X ~ Binomial(D, p) (integer k and D:
    # scipy's binomial ufuncs take whole numbers)
    upper = np.where(k_hi <= di, bdtrc(np.clip(k_hi - 1, 0, None), di, p), 0.0)
    upper = np.where(k_hi <= 0, 1.0, upper)
    lower = np.where(k_lo >= 0, bdtr(np.maximum(k_lo, 0), di, p), 0.0)
    reject = upper + lower
    out = np.empty(ns.size, dtype=np.float64)
    for i, n in enumerate(ns.tolist()):
        dd = d[: n + 1]
        with np.errstate(divide="ignore"):
            log_pmf = (
                gammaln(n + 1.0)
                - gammaln(dd + 1.0)
                - gammaln(n - dd + 1.0)
                + dd * np.log(discordant)
                + (n - dd) * (np.log1p(-discordant) if discordant < 1.0 else -np.inf)
            )
        if discordant >= 1.0:
            log_pmf = np.where(dd == n, 0.0, -np.inf)
        out[i] = float(np.exp(log_pmf) @ reject[: n + 1])
    return out


def exact_questions_needed(
    net_loss: float,
    discordant: float,
    alpha: float = 0.05,
    power: float = 0.8,
    two_sided: bool = True,
) -> int:
    """The smallest n at which the exact McNemar test reaches ``power`` (:func:`exact_power`),
    searched from half of Connor's n upwards (exact power is a sawtooth in n, so a few n above
    the answer can dip just below ``power`` again). δ = 0.02 at ψ = 0.06, alpha 0.05
    two-sided, power 0.8: Connor says 1,175, the exact test needs about 1,247 (checked in the
    tests against an independent scipy.stats computation). Raises ``ValueError`` as
    :func:`questions_needed`."""
    n0 = questions_needed(net_loss, discordant, alpha, power, two_sided)
    start = max(1, n0 // 2)
    step = max(64, n0 // 4)
    while True:
        ns = np.arange(start, start + step, dtype=np.int64)
        pw = _power_curve(ns, net_loss, discordant, alpha, two_sided)
        hit = np.flatnonzero(pw >= power)
        if hit.size:
            return int(ns[hit[0]])
        start += step
