"""Paired flip statistics for the standard (lossless) arm versus the FLy (lossy) arm.

Pure functions over counts. Notation (one 2x2 table per category and window, N pairs):

=================  ===================  ===================
                   FLy correct          FLy wrong
=================  ===================  ===================
standard correct   ``both_correct``     ``lost``  (b)
standard wrong     ``gained`` (c)       ``both_wrong``
=================  ===================  ===================

``net = gained - lost`` (as in the seed's ``paired_gate``); the *net loss* is
``(lost - gained) / N`` = accuracy(standard) - accuracy(FLy), a fraction in [-1, 1];
the *discordant rate* is ``(lost + gained) / N``.

McNemar's test lives here in both forms: exact (:func:`mcnemar_exact_p`, binomial on the discordant
pairs) and the normal approximation (:func:`mcnemar_z`, what the PromQL rule computes), next to the
pooled :func:`two_proportion_z` the flip-rate detector uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from scipy.special import ndtr, ndtri

try:  # the binomial ufuncs scipy.stats.binom evaluates, without importing scipy.stats
    from scipy.special._ufuncs import _binom_cdf, _binom_sf
except ImportError:  # a scipy that moved these private names: the public distribution instead

    def _binom_cdf(k: float, n: int, p: float) -> float:
        from scipy.stats import binom

        return float(binom.cdf(k, n, p))

    def _binom_sf(k: float, n: int, p: float) -> float:
        from scipy.stats import binom

        return float(binom.sf(k, n, p))


# The normal and binomial functions come from scipy.special, not scipy.stats: the same ufuncs
# ``scipy.stats.norm.cdf/ppf`` and ``scipy.stats.binom.cdf/sf`` evaluate inside the support
# (``ndtr``, ``ndtri``, ``_binom_cdf``, ``_binom_sf``), so the values are identical bit for bit
# (tested against scipy.stats), without the ~1 s import of scipy.stats; the two binomial ones
# are private names, so a scipy without them falls back to ``scipy.stats.binom``. ``brentq`` is
# imported where the interval is solved: scipy.optimize costs ~0.6 s to import, and a caller
# (the report) can load it in a thread while it waits on SQLite.


def _binom_half_cdf(k: int, n: int) -> float:
    """``P[X <= k]`` for ``X ~ Binomial(n, 1/2)``, ``n >= 1`` (``scipy.stats.binom.cdf``)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return float(_binom_cdf(float(k), n, 0.5))


def _binom_half_sf(k: int, n: int) -> float:
    """``P[X > k]`` for ``X ~ Binomial(n, 1/2)``, ``n >= 1`` (``scipy.stats.binom.sf``)."""
    if k < 0:
        return 1.0
    if k >= n:
        return 0.0
    return float(_binom_sf(float(k), n, 0.5))


Alternative = Literal["two-sided", "loss"]


@dataclass(frozen=True, slots=True)
class PairedCounts:
    """One paired 2x2 table (counts of pairs, all >= 0)."""

    both_correct: int
    lost: int
    gained: int
    both_wrong: int

    def __post_init__(self) -> None:
        for name in ("both_correct", "lost", "gained", "both_wrong"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")

    @property
    def n(self) -> int:
        """Number of pairs N."""
        return self.both_correct + self.lost + self.gained + self.both_wrong

    @property
    def discordant(self) -> int:
        """Discordant pairs ``lost + gained``."""
        return self.lost + self.gained

    @property
    def net(self) -> int:
        """``gained - lost`` (negative when FLy loses more than it gains)."""
        return self.gained - self.lost


def net_loss_ratio(c: PairedCounts) -> float:
    """Paired accuracy difference ``(lost - gained) / N`` = acc(standard) - acc(FLy).

    NaN when N = 0. Positive means FLy is worse.
    """
    return (c.lost - c.gained) / c.n if c.n else math.nan


def discordant_ratio(c: PairedCounts) -> float:
    """Share of pairs whose correctness flipped in either direction, ``(lost + gained) / N``.

    NaN when N = 0. This is ψ in Connor (1987)'s sample-size formula.
    """
    return c.discordant / c.n if c.n else math.nan


def mcnemar_exact_p(lost: int, gained: int, alternative: Alternative = "two-sided") -> float:
    """Exact (conditional, binomial) McNemar p-value on the discordant pairs.

    Source: McNemar (1947); exact form as in Fagerland, Lydersen & Laake (2013), "The McNemar
    test for binary matched-pairs data", BMC Med Res Methodol 13:91. Given n = lost + gained
    discordant pairs, ``lost ~ Binomial(n, 1/2)`` under H0 (no net change).

    * ``"two-sided"``: ``min(1, 2 * P[X <= min(lost, gained)])`` (the seed's ``paired_gate``).
    * ``"loss"``: one-sided, H1 = FLy loses more than it gains: ``P[X >= lost]``.

    Returns 1.0 when there are no discordant pairs. Raises ValueError on negative counts.
    """
    if lost < 0 or gained < 0:
        raise ValueError("lost and gained must be >= 0")
    n = lost + gained
    if n == 0:
        return 1.0
    if alternative == "two-sided":
        return min(1.0, 2.0 * _binom_half_cdf(min(lost, gained), n))
    if alternative == "loss":
        return _binom_half_sf(lost - 1, n)
    raise ValueError(f"unknown alternative {alternative!r}")


def mcnemar_z(lost: float, gained: float) -> float | None:
    """McNemar's normal approximation ``(lost − gained) / sqrt(lost + gained)``.

    ``lost`` = pairs standard got right and FLy wrong (b), ``gained`` the reverse (c); positive
    means FLy loses more than it gains. ``None`` with no discordant pairs. ``z²`` is McNemar's
    chi-square without continuity correction (McNemar 1947). Raises ``ValueError`` on a
    negative count.
    """
    if lost < 0 or gained < 0:
        raise ValueError("counts must be >= 0")
    n = lost + gained
    if n == 0:
        return None
    return (lost - gained) / math.sqrt(n)


def two_proportion_z(x1: float, n1: float, x2: float, n2: float) -> float | None:
    """Pooled two-proportion z of ``x1/n1`` against ``x2/n2``.

    ``z = (p1 − p2) / sqrt(p (1 − p) (1/n1 + 1/n2))`` with ``p = (x1 + x2) / (n1 + n2)``;
    ``None`` when a sample is empty or the pooled proportion is 0 or 1 (no variance).
    """
    if n1 <= 0 or n2 <= 0:
        return None
    p = (x1 + x2) / (n1 + n2)
    var = p * (1 - p) * (1 / n1 + 1 / n2)
    if var <= 0:
        return None
    return (x1 / n1 - x2 / n2) / math.sqrt(var)


def _tango_restricted_q(b: int, c: int, n: int, delta: float) -> float:
    """Restricted MLE of the (standard wrong, FLy correct) cell probability given Δ (Tango 1998)."""
    a_coef = 2.0 * n
    b_coef = -b - c + (2.0 * n - b + c) * delta
    c_coef = -c * delta * (1.0 - delta)
    disc = max(b_coef * b_coef - 4.0 * a_coef * c_coef, 0.0)
    return (math.sqrt(disc) - b_coef) / (2.0 * a_coef)


def tango_score_statistic(lost: int, gained: int, n: int, delta: float) -> float:
    """Tango's score statistic for H0: acc(standard) - acc(FLy) = Δ on paired binary data.

    Source: Tango T. (1998), "Equivalence test and confidence interval for the difference in
    proportions for the paired-sample design", Stat Med 17:891-908 (eq. 3, restricted MLE eq. 4);
    erratum Stat Med 18:3511 (1999). ``T = (b - c - NΔ) / sqrt(N (2 q̂ + Δ(1 - Δ)))`` with
    b = lost, c = gained, q̂ the restricted MLE of the ``gained`` cell probability. Approximately
    N(0, 1) under H0; decreasing in Δ. ``delta`` must lie in (-1, 1).
    """
    if not -1.0 < delta < 1.0:
        raise ValueError("delta must be in (-1, 1)")
    if n <= 0 or lost < 0 or gained < 0 or lost + gained > n:
        raise ValueError("need 0 <= lost + gained <= n and n > 0")
    q = _tango_restricted_q(lost, gained, n, delta)
    var = n * (2.0 * q + delta * (1.0 - delta))
    num = lost - gained - n * delta
    if var <= 0.0:
        return 0.0 if num == 0 else math.copysign(math.inf, num)
    return num / math.sqrt(var)


@dataclass(frozen=True, slots=True)
class Interval:
    """A confidence interval for the net loss ratio (fractions, lower <= upper)."""

    lower: float
    upper: float
    level: float
    method: str


def net_loss_ci(c: PairedCounts, level: float = 0.95) -> Interval:
    """Two-sided confidence interval for the net loss ``acc(standard) - acc(FLy)``.

    Tango (1998) score interval (Stat Med 17:891-908): the set of Δ whose score statistic
    :func:`tango_score_statistic` satisfies ``|T(Δ)| <= z_{1-(1-level)/2}``, found by root
    finding. Better coverage than Wald for small counts and zero cells (Newcombe 1998,
    Stat Med 17:2635-2650). NaN bounds when N = 0.
    """
    if not 0.0 < level < 1.0:
        raise ValueError("level must be in (0, 1)")
    n = c.n
    if n == 0:
        return Interval(math.nan, math.nan, level, "tango_score")
    from scipy.optimize import brentq

    z = float(ndtri(1.0 - (1.0 - level) / 2.0))
    lo_end, hi_end = -1.0 + 1e-12, 1.0 - 1e-12

    def f(d: float, target: float) -> float:
        return tango_score_statistic(c.lost, c.gained, n, d) - target

    # T is decreasing in Δ: the lower bound solves T = +z, the upper T = -z.
    lower = -1.0 if f(lo_end, z) <= 0.0 else float(brentq(f, lo_end, hi_end, args=(z,)))
    upper = 1.0 if f(hi_end, -z) >= 0.0 else float(brentq(f, lo_end, hi_end, args=(-z,)))
    return Interval(lower, upper, level, "tango_score")


@dataclass(frozen=True, slots=True)
class NonInferiority:
    """Result of the paired non-inferiority test (FLy loses at most ``margin``)."""

    margin: float
    alpha: float
    statistic: float
    p_value: float
    upper_bound: float
    passed: bool


def non_inferiority_test(c: PairedCounts, margin: float, alpha: float = 0.05) -> NonInferiority:
    """One-sided paired non-inferiority test of FLy against the standard arm.

    H0: acc(standard) - acc(FLy) >= margin (FLy loses at least ``margin``) versus
    H1: net loss < margin. Tango (1998) score test (Stat Med 17:891-908, the paired
    non-inferiority use in Liu, Hsueh, Hsieh & Chen (2002), Stat Med 21:231-245):
    ``p = Φ(T(margin))``; ``upper_bound`` is the matching one-sided (1 - alpha) upper confidence
    bound, so ``passed`` (p < alpha) holds exactly when ``upper_bound < margin``.
    ``margin`` is a fraction in [0, 1) (0.01 = one accuracy point). N = 0 never passes.
    """
    if not 0.0 <= margin < 1.0:
        raise ValueError("margin must be in [0, 1)")
    if not 0.0 < alpha < 0.5:
        raise ValueError("alpha must be in (0, 0.5)")
    if c.n == 0:
        return NonInferiority(margin, alpha, math.nan, 1.0, math.nan, False)
    t = tango_score_statistic(c.lost, c.gained, c.n, margin)
    p = float(ndtr(t))
    upper = net_loss_ci(c, level=1.0 - 2.0 * alpha).upper
    return NonInferiority(margin, alpha, t, p, upper, p < alpha)


@dataclass(frozen=True, slots=True)
class FlipCounts:
    """Answer flips (disagreement with the standard arm) of FLy and of the noise arm, paired.

    Counted over pairs where the noise arm also ran: ``fly_only`` = FLy disagreed and noise
    agreed, ``noise_only`` the reverse, ``both`` and ``neither``.
    """

    fly_only: int
    noise_only: int
    both: int
    neither: int

    @property
    def n(self) -> int:
        """Pairs with a noise arm."""
        return self.fly_only + self.noise_only + self.both + self.neither


@dataclass(frozen=True, slots=True)
class ExcessFlip:
    """FLy's flip rate above the noise floor, with a one-sided exact test."""

    fly_flip_ratio: float
    noise_flip_ratio: float
    excess_flip_ratio: float
    p_value: float


def excess_flip(f: FlipCounts) -> ExcessFlip:
    """Excess flip rate of FLy over the noise arm (second lossless replay), on the same requests.

    ``excess = (fly_only - noise_only) / n`` = flip(FLy) - flip(noise). The p-value is the
    one-sided exact McNemar test (McNemar 1947, binomial form) of H1: FLy flips more often than
    the noise arm, on the pairs where exactly one of them flipped. The noise-arm idea is Diffy's
    primary/secondary comparison (opendiffy/diffy README). NaN ratios when n = 0.
    """
    n = f.n
    if n == 0:
        return ExcessFlip(math.nan, math.nan, math.nan, 1.0)
    fly = (f.fly_only + f.both) / n
    noise = (f.noise_only + f.both) / n
    return ExcessFlip(fly, noise, fly - noise, mcnemar_exact_p(f.fly_only, f.noise_only, "loss"))
