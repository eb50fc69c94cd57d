"""Anytime-valid upper confidence sequence for the net loss, and the "within margin" declaration.

Per labelled pair ``x = +1`` (FLy lost a point), ``-1`` (gained one), ``0`` (agree); the net loss
is ``L = E[x]`` (a fraction: 0.01 = one point). Against H0: ``L >= m`` a bet of fraction c on
``m - x`` multiplies the wealth by ``1 + c (m - x) / (1 - m)``: ``1 - c`` when lost,
``1 + c m / (1 - m)`` on agreement, ``1 + c (1 + m) / (1 - m)`` when gained; positive for c < 1
and of expectation ``1 + c (m - L) / (1 - m) <= 1`` under H0, so each fixed-c wealth is a test
supermartingale and so is their fixed-weight mixture ``K_t(m)`` over :data:`BET_FRACTIONS`
(testing by betting: Waudby-Smith & Ramdas 2024, "Estimating means of bounded random variables by
betting", JRSSB 86:1-27, sections 4-5). ``K_t(m)`` depends only on the counts and increases in m.

* The upper confidence sequence at level ``1 - alpha``: ``U_t = min {m : K_t(m) >= 1/alpha}``
  covers L at every t at once with probability >= 1 - alpha (Ville 1939), so its running
  minimum does too.
* "Within margin M" is declared at the first t with ``K_t(M) >= 1/alpha`` (``U_t <= M``) and is
  never withdrawn: the declaration is a stopping rule on an anytime-valid test, wrong with
  probability <= alpha however long the view keeps refreshing. :class:`MarginDeclaration` keeps
  that first pair; :func:`declaration_path` finds it on a whole sequence.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from specwatch.shadow.stats.sequential import alarm, first_alarm

FloatArray = npt.NDArray[np.float64]

#: Bet fractions c of the mixture (log-spaced 0.004..0.9, equal weights).
BET_FRACTIONS: FloatArray = np.exp(np.linspace(math.log(0.004), math.log(0.9), 24))


def within_margin_log_e_value(
    lost: npt.ArrayLike, gained: npt.ArrayLike, agree: npt.ArrayLike, margin: float
) -> FloatArray:
    """``ln K(m)`` at ``m = margin``: the e-value against H0 "the net loss is at least
    ``margin``" (evidence that FLy is within it), from the counts; arrays broadcast. ``margin``
    in (-1, 1). Raises ``ValueError`` otherwise or on a negative count."""
    if not -1.0 < margin < 1.0:
        raise ValueError("margin must be in (-1, 1)")
    lo, ga, ag = (np.asarray(v, dtype=np.float64) for v in (lost, gained, agree))
    if np.any(lo < 0) or np.any(ga < 0) or np.any(ag < 0):
        raise ValueError("counts must be >= 0")
    c = BET_FRACTIONS
    a = np.log1p(-c)
    z = np.log1p(c * margin / (1.0 - margin))
    b = np.log1p(c * (1.0 + margin) / (1.0 - margin))
    t = (
        math.log(1.0 / c.size)
        + np.multiply.outer(lo, a)
        + np.multiply.outer(ag, z)
        + np.multiply.outer(ga, b)
    )
    mx = t.max(axis=-1)
    out: FloatArray = mx + np.log(np.exp(t - mx[..., None]).sum(axis=-1))
    return out


def net_loss_upper_sequence(lost: int, gained: int, agree: int, alpha: float) -> float:
    """``U_t``: the anytime-valid upper bound on the net loss at level ``1 - alpha`` (a
    fraction; 1.0 when nothing below 1 is excluded, e.g. without pairs), by bisection to 1e-6."""

    def excluded(m: float) -> bool:
        return alarm(float(within_margin_log_e_value(lost, gained, agree, m)), alpha)

    lo, hi = -1.0 + 1e-9, 1.0 - 1e-9
    if not excluded(hi):
        return 1.0
    if excluded(lo):
        return -1.0
    while hi - lo > 1e-6:
        mid = 0.5 * (lo + hi)
        if excluded(mid):
            hi = mid
        else:
            lo = mid
    return hi


@dataclass(frozen=True, slots=True)
class MarginDeclaration:
    """Running counts of the labelled pairs and the first pair (1-based) at which "within
    ``margin``" was declared (``None`` while not). Immutable; :meth:`update` returns a new one."""

    margin: float
    alpha: float
    lost: int = 0
    gained: int = 0
    agree: int = 0
    declared_at: int | None = None

    @property
    def n(self) -> int:
        """Labelled pairs seen."""
        return self.lost + self.gained + self.agree

    def update(self, d: int) -> MarginDeclaration:
        """Add one pair (``d``: +1 lost, -1 gained, 0 agree); declares once, never withdraws."""
        if d not in (-1, 0, 1):
            raise ValueError("d must be -1, 0 or 1")
        nxt = replace(
            self,
            lost=self.lost + (d == 1),
            gained=self.gained + (d == -1),
            agree=self.agree + (d == 0),
        )
        if nxt.declared_at is None and self.margin > 0.0:
            log_k = float(within_margin_log_e_value(nxt.lost, nxt.gained, nxt.agree, self.margin))
            if alarm(log_k, self.alpha):
                nxt = replace(nxt, declared_at=nxt.n)
        return nxt


def declaration_path(d: npt.ArrayLike, margin: float, alpha: float) -> int | None:
    """The 1-based pair of ``d`` (+1 / -1 / 0 per labelled pair) at which "within ``margin``"
    is first declared, ``None`` if never; vectorised (cumulative counts), equal to folding
    :meth:`MarginDeclaration.update`. ``margin`` 0 never declares (FLy must be shown better)."""
    x = np.asarray(d, dtype=np.int64).reshape(-1)
    if x.size == 0 or margin <= 0.0:
        return None
    lost, gained = np.cumsum(x == 1), np.cumsum(x == -1)
    agree = np.arange(1, x.size + 1) - lost - gained
    # In chunks (each value is computed alone, so the same numbers) that stop at the first
    # declaration: a long sequence never holds its (pairs x bets) table at once.
    for start in range(0, x.size, _CHUNK):
        end = start + _CHUNK
        log_k = within_margin_log_e_value(
            lost[start:end], gained[start:end], agree[start:end], margin
        )
        hit = first_alarm(log_k, alpha)
        if hit is not None:
            return start + hit
    return None


#: Pairs per chunk of :func:`declaration_path` (a chunk's table of bets fits in a cache).
_CHUNK = 8192


def run_declaration(d: Iterable[int], start: MarginDeclaration) -> MarginDeclaration:
    """``start`` after the pairs ``d`` (the fold the live component and its restart use)."""
    x = np.fromiter((int(v) for v in d), dtype=np.int64)
    if x.size == 0:
        return start
    lost = start.lost + int(np.count_nonzero(x == 1))
    gained = start.gained + int(np.count_nonzero(x == -1))
    agree = start.agree + int(np.count_nonzero(x == 0))
    declared = start.declared_at
    if declared is None and start.margin > 0.0:
        cl = start.lost + np.cumsum(x == 1)
        cg = start.gained + np.cumsum(x == -1)
        ca = start.agree + np.cumsum(x == 0)
        first = first_alarm(within_margin_log_e_value(cl, cg, ca, start.margin), start.alpha)
        declared = None if first is None else start.n + first
    return replace(start, lost=lost, gained=gained, agree=agree, declared_at=declared)
