"""Anytime-valid sequential tests for paired flips (e-processes).

An e-process ``E_t`` is a non-negative supermartingale with ``E_0 = 1`` under the null, so by
Ville's inequality (Ville 1939) ``P(sup_t E_t >= 1/alpha) <= alpha``: the alarm rule
"``E_t >= 1/alpha``" keeps its false-alarm rate at or below ``alpha`` however often it is
checked, which repeated fixed-n McNemar tests do not (Johari et al. 2017, "Peeking at A/B
tests"; Ramdas, Grünwald, Vovk & Shafer 2023, "Game-theoretic statistics and safe anytime-valid
inference", Statist. Sci. 38:576-601).

The no-net-loss e-process every surface reports lives in :mod:`specwatch.shadow.stats.eprocess`
(with the alarm rule of this module). Here:

* :func:`beta_binomial_log_e_value` — on the discordant pairs only. Each discordant pair is
  ``lost`` with probability θ; H0: θ <= p0 (p0 = 1/2: FLy does not lose more than it gains).
  The e-process is Robbins' mixture likelihood ratio with a Beta(a, b) prior truncated to
  [p0, 1]; it depends only on the counts (lost, gained), so it is rebuilt exactly from the
  ledger after a restart. Used for the lossless check and shown by ``paired-test`` for
  comparison.
* :class:`BettingEProcess` — on every pair's ``d = lost - gained`` in {-1, 0, +1}; H0: E[d] <= M,
  i.e. the net loss is at most the margin M on *marginal* accuracy. Testing by betting with the
  aGRAPA bet (Waudby-Smith & Ramdas 2024, "Estimating means of bounded random variables by
  betting", JRSSB 86:1-27). Order-dependent: replay the ledger in time order to rebuild it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.special import betaincc, betaln

from specwatch.core.numbers import exp_or_inf

FloatArray = npt.NDArray[np.float64]


def beta_binomial_log_e_values(
    lost: npt.ArrayLike,
    gained: npt.ArrayLike,
    p0: float = 0.5,
    prior_a: float = 1.0,
    prior_b: float = 1.0,
) -> FloatArray:
    """Vectorised natural log of the truncated beta-binomial mixture e-value.

    Source: Robbins (1970) mixture martingale, "Statistical methods related to the law of the
    iterated logarithm", Ann. Math. Statist. 41:1397-1409; one-sided composite null via a prior
    truncated to the alternative (Ramdas et al. 2023, Statist. Sci. 38:576-601, section 5).

    ``E = ∫_{p0}^{1} θ^L (1-θ)^G π(θ) dθ / (p0^L (1-p0)^G)`` with π = Beta(a, b) restricted to
    [p0, 1], in closed form ``log E = lnB(L+a, G+b) + ln Q(L+a, G+b; p0) - lnB(a, b)
    - ln Q(a, b; p0) - L ln p0 - G ln(1-p0)``
    where Q is the regularised upper incomplete beta function. Each component likelihood ratio
    with θ1 >= p0 is a supermartingale for every θ <= p0, so the mixture is an e-process for
    H0: θ <= p0. Arrays broadcast; ``-inf`` where the e-value underflows to 0.
    """
    if not 0.0 < p0 < 1.0:
        raise ValueError("p0 must be in (0, 1)")
    if prior_a <= 0.0 or prior_b <= 0.0:
        raise ValueError("prior_a and prior_b must be > 0")
    lo = np.asarray(lost, dtype=np.float64)
    ga = np.asarray(gained, dtype=np.float64)
    if np.any(lo < 0) or np.any(ga < 0):
        raise ValueError("lost and gained must be >= 0")
    with np.errstate(divide="ignore"):
        tail = np.log(betaincc(lo + prior_a, ga + prior_b, p0))
    norm_const = float(betaln(prior_a, prior_b)) + math.log(float(betaincc(prior_a, prior_b, p0)))
    out: FloatArray = (
        betaln(lo + prior_a, ga + prior_b)
        + tail
        - norm_const
        - lo * math.log(p0)
        - ga * math.log1p(-p0)
    )
    return out


def beta_binomial_log_e_value(
    lost: int, gained: int, p0: float = 0.5, prior_a: float = 1.0, prior_b: float = 1.0
) -> float:
    """Scalar form of :func:`beta_binomial_log_e_values` (natural log of the e-value)."""
    return float(beta_binomial_log_e_values(lost, gained, p0, prior_a, prior_b))


def beta_binomial_e_value(
    lost: int, gained: int, p0: float = 0.5, prior_a: float = 1.0, prior_b: float = 1.0
) -> float:
    """The beta-binomial mixture e-value itself (``inf`` on overflow); see the log form."""
    log_e = beta_binomial_log_e_value(lost, gained, p0, prior_a, prior_b)
    return exp_or_inf(log_e)


def _log_threshold(alpha: float) -> float:
    if not 0.0 < alpha < 1.0:
        raise ValueError("alpha must be in (0, 1)")
    return -math.log(alpha)


def alarm(log_e_value: float, alpha: float) -> bool:
    """Ville alarm rule: reject H0 when ``E >= 1/alpha`` (given ``log E``): the one home of the
    comparison; :func:`e_value_alarm` and :func:`first_alarm` are the same rule for an e-value
    that is not on the log scale and for a whole path. Raises ``ValueError`` unless
    0 < ``alpha`` < 1."""
    return log_e_value >= _log_threshold(alpha)


def e_value_alarm(e_value: float, alpha: float) -> bool:
    """:func:`alarm` for the e-value itself (not its log): ``E >= 1/alpha``; ``+inf`` (an
    overflowed e-value) alarms, NaN never does. Raises ``ValueError`` unless 0 < ``alpha`` < 1."""
    if not 0.0 < alpha < 1.0:
        raise ValueError("alpha must be in (0, 1)")
    return e_value >= 1.0 / alpha


def first_alarm(log_e_path: npt.ArrayLike, alpha: float) -> int | None:
    """1-based index of the first point of a log e-value path at which :func:`alarm` holds,
    ``None`` if it never does. Raises ``ValueError`` unless 0 < ``alpha`` < 1."""
    hit = np.flatnonzero(np.asarray(log_e_path, dtype=np.float64) >= _log_threshold(alpha))
    return int(hit[0]) + 1 if hit.size else None


@dataclass(frozen=True, slots=True)
class BettingEProcess:
    """Testing-by-betting e-process for H0: E[d] <= margin with d = lost - gained per pair.

    Immutable: :meth:`update` returns a new state. ``log_wealth`` is ln E_t; ``max_log_wealth``
    its running maximum (the alarm may be taken at any time the process crossed 1/alpha).
    Bets are aGRAPA (Waudby-Smith & Ramdas 2024, JRSSB 86:1-27, section B.3):
    ``λ_t = clip((μ̂ - M) / (σ̂² + (μ̂ - M)²), 0, c / (1 + M))`` from the pairs before t, so
    ``1 + λ_t (d_t - M) > 0`` for every d_t in {-1, 0, 1} and, when E[d_t | past] <= M,
    E[1 + λ_t(d_t - M) | past] <= 1.
    """

    margin: float = 0.0
    cap: float = 0.5
    n: int = 0
    sum_d: float = 0.0
    sum_d2: float = 0.0
    log_wealth: float = 0.0
    max_log_wealth: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.margin < 1.0:
            raise ValueError("margin must be in [0, 1)")
        if not 0.0 < self.cap < 1.0:
            raise ValueError("cap must be in (0, 1)")

    def bet(self) -> float:
        """The predictable bet λ for the next pair (>= 0)."""
        # Prior pseudo-observation at the null boundary keeps early bets small.
        mean = (self.sum_d + self.margin) / (self.n + 1)
        var = (self.sum_d2 + self.margin**2) / (self.n + 1) - mean * mean
        edge = mean - self.margin
        raw = edge / (max(var, 0.0) + edge * edge) if edge > 0.0 else 0.0
        return min(max(raw, 0.0), self.cap / (1.0 + self.margin))

    def update(self, d: int) -> BettingEProcess:
        """Add one pair with ``d = 1`` (lost), ``-1`` (gained) or ``0`` (concordant)."""
        if d not in (-1, 0, 1):
            raise ValueError("d must be -1, 0 or 1")
        lam = self.bet()
        log_w = self.log_wealth + math.log1p(lam * (d - self.margin))
        return replace(
            self,
            n=self.n + 1,
            sum_d=self.sum_d + d,
            sum_d2=self.sum_d2 + d * d,
            log_wealth=log_w,
            max_log_wealth=max(self.max_log_wealth, log_w),
        )

    @property
    def e_value(self) -> float:
        """Current wealth E_t (``inf`` on overflow)."""
        return exp_or_inf(self.log_wealth)


def betting_log_wealth(
    outcomes: Iterable[tuple[bool, bool]] | npt.NDArray[Any],
    margin: float,
    start: BettingEProcess | None = None,
) -> tuple[FloatArray, BettingEProcess]:
    """The margin e-process over labelled pairs, as arrays: the driver behind :func:`betting_path`
    and :func:`run_betting`.

    ``outcomes``: ``(standard_correct, fly_correct)`` pairs in order, or an array of
    ``d = standard_correct - fly_correct`` in {-1, 0, 1} (shape ``(n,)``). Returns ``ln E_t``
    after each pair (shape ``(n,)``, float64) and the state after the last one (``start``, default
    a fresh process at ``margin``, when there are none). The aGRAPA bet before pair t depends only
    on the sums of the pairs before it, so the bets are computed from prefix sums and the wealth is
    a running sum of ``log1p(λ_t (d_t - M))``, the same operations in the same order as
    :meth:`BettingEProcess.update` applied pair by pair (numpy's log1p may differ from libm's by one
    ulp per term, so the two agree within a tolerance a test states). O(n) vectorised. Raises
    ``ValueError`` on a ``d`` outside {-1, 0, 1} and as :class:`BettingEProcess` for a bad margin.
    """
    state = start if start is not None else BettingEProcess(margin=margin)
    if isinstance(outcomes, np.ndarray):
        d = outcomes.astype(np.float64)
    else:
        pairs = list(outcomes)
        d = np.fromiter((int(s) - int(f) for s, f in pairs), dtype=np.float64, count=len(pairs))
    d = d.reshape(-1)
    if not np.all((d == -1.0) | (d == 0.0) | (d == 1.0)):
        raise ValueError("d must be -1, 0 or 1")
    n = d.size
    if n == 0:
        return np.zeros(0), state
    m = state.margin
    # Sums over the pairs before each one (exact: integers well below 2**53).
    sum_d = state.sum_d + np.concatenate(([0.0], np.cumsum(d)[:-1]))
    sum_d2 = state.sum_d2 + np.concatenate(([0.0], np.cumsum(d * d)[:-1]))
    count = state.n + np.arange(n, dtype=np.float64) + 1.0
    mean = (sum_d + m) / count
    var = (sum_d2 + m**2) / count - mean * mean
    edge = mean - m
    with np.errstate(divide="ignore", invalid="ignore"):
        raw = np.where(edge > 0.0, edge / (np.maximum(var, 0.0) + edge * edge), 0.0)
    lam = np.minimum(np.maximum(raw, 0.0), state.cap / (1.0 + m))
    terms = np.log1p(lam * (d - m))
    log_w: FloatArray = np.cumsum(np.concatenate(([state.log_wealth], terms)))[1:]
    last = BettingEProcess(
        margin=m,
        cap=state.cap,
        n=state.n + n,
        sum_d=state.sum_d + float(np.sum(d)),
        sum_d2=state.sum_d2 + float(np.sum(d * d)),
        log_wealth=float(log_w[-1]),
        max_log_wealth=max(state.max_log_wealth, float(np.max(log_w))),
    )
    return log_w, last


def betting_path(
    outcomes: Iterable[tuple[bool, bool]], margin: float, start: BettingEProcess | None = None
) -> Iterator[BettingEProcess]:
    """The margin e-process after each labelled pair ``(standard_correct, fly_correct)``, in order.

    ``d = standard_correct - fly_correct`` (+1 lost, −1 gained, 0 concordant) drives
    :meth:`BettingEProcess.update`; ``start`` (default: a fresh process at ``margin``) is the state
    before the first pair. Lazy; raises what ``BettingEProcess`` raises for a bad margin."""
    state = start if start is not None else BettingEProcess(margin=margin)
    for standard_correct, fly_correct in outcomes:
        state = state.update(int(standard_correct) - int(fly_correct))
        yield state


def run_betting(
    outcomes: Iterable[tuple[bool, bool]], margin: float, start: BettingEProcess | None = None
) -> BettingEProcess:
    """The margin e-process after every labelled pair of ``outcomes`` (see :func:`betting_path`);
    the one driver used by the live component's restart, the report and ``summary``. Pure.
    Computed by :func:`betting_log_wealth` (vectorised, equal to :func:`betting_path`)."""
    return betting_log_wealth(list(outcomes), margin, start)[1]
