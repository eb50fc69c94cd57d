"""The no-net-loss e-process: one statistic, robust to the discordance and to the size of the loss.

Per labelled pair the outcome is ``x = +1`` (FLy lost a point: standard right, FLy wrong),
``-1`` (FLy gained one) or ``0`` (both agree). H0, "no net loss": given the past,
``P(x = +1) <= P(x = -1)``, whatever the discordance ``d = P(+1) + P(-1)`` is and however it
changes over time.

The design: a fixed mixture of 21 betting components over net losses in points (Waudby-Smith &
Ramdas 2024, "Estimating means of bounded random variables by betting", JRSSB 86:1-27: testing
by betting with predictable plug-ins and mixtures over bets). Component ``j`` targets a net loss
``L_j(d)`` that depends on the discordance (piecewise linear in ``(log d, log L)`` through the
knots :data:`KNOT_DISCORDANCE`, constant outside them). Before pair ``t`` the discordance is
estimated from the pairs before it only (predictable),
``d̂_t = (discordant before + 3) / (pairs before + 50)`` (a 6 % prior worth 50 pairs), and on a
discordant pair the component bets ``q_jt = clip(1/2 + L_j(d̂_t) / (2 d̂_t), 1/2, 0.98)`` that
the pair is a loss: its wealth is multiplied by ``2 q`` on a loss, ``2 (1 - q)`` on a gain and
1 on agreement. Given the past the expected multiplier is ``1 + (2q - 1)(P(+1) - P(-1)) <= 1``
under H0 (``q >= 1/2``), so each component, and the fixed-weight mixture
``E_t = Σ_j w_j W_jt``, is a test supermartingale for every (even time-varying) discordance:
Ville's inequality (Ville 1939) gives ``P(sup_t E_t >= 1/alpha) <= alpha`` under continuous
monitoring (Ramdas, Grünwald, Vovk & Shafer 2023, Statist. Sci. 38:576-601).

Why predictable bets and not a count-only mixture: a likelihood ratio that is a function of the
counts ``(lost, gained)`` alone and valid for every null discordance reduces to a fixed bet ``q``
on the discordant pairs, and a fixed ``q`` cannot be right both at 6 % and at 30 % discordance
(a 2-point loss is ``q = 0.67`` at 6 % and ``q = 0.53`` at 30 %). The price is that ``E_t``
depends on the order of the pairs: the sidecar folds it pair by pair as replays finish and
rebuilds it after a restart by replaying the ledger in that (write) order; the report reads the
ledger in the same order, ``paired-test`` the file's order; the fleet view combines the
sidecars' exported values.

The same per-pair factors drive the change detector (:mod:`specwatch.shadow.stats.detector`):
a Shiryaev-Roberts e-detector on the pair clock (Shin, Ramdas & Rinaldo 2024, "E-detectors: a
nonparametric framework for sequential change detection", New England J. Statist. Data Sci.).

The components (weights and knots) were chosen on the bench grid of ``bench/robust_grid.py``
(discordance 2-30 %, loss 1-5 points; results and the trade-offs in ``docs/benchmarks.md``).

Everything here is pure: values in, values out. :class:`NetLossState` is the small frozen state
(21 log-wealths, 21 detector logs, the pair and discordant counts); :func:`net_loss_path` folds a
whole outcome sequence with numpy (one pass over the discordant pairs), and
:meth:`NetLossState.update` is the same code on one pair, so folding in any chunking gives the
same e-value bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.special import logsumexp

from specwatch.core.numbers import exp_or_inf
from specwatch.shadow.stats.detector import GAP_CAP, sr_log_path

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

#: Discordance (fraction) at the knots of every component's target loss ``L_j(d)``.
KNOT_DISCORDANCE: tuple[float, ...] = (0.02, 0.06, 0.08, 0.10, 0.20, 0.30)

#: ``(weight, target net loss at each knot of KNOT_DISCORDANCE)`` per component, losses as
#: fractions (0.02 = 2 points). Between 6 % and 8 % every target is flat, so the bets at the
#: operating point (6 %, 2 points) do not move with the noise in the discordance estimate.
COMPONENTS: tuple[tuple[float, tuple[float, ...]], ...] = (
    (0.0158, (0.00179, 0.00976, 0.00976, 0.00662, 0.00982, 0.01000)),
    (0.0802, (0.01000, 0.01000, 0.01000, 0.01000, 0.01000, 0.01000)),
    (0.0405, (0.01000, 0.01000, 0.01000, 0.01000, 0.01000, 0.01473)),
    (0.0345, (0.01000, 0.01000, 0.01000, 0.01000, 0.01000, 0.01987)),
    (0.0131, (0.01000, 0.01316, 0.01316, 0.01000, 0.01000, 0.02000)),
    (0.1869, (0.01000, 0.02000, 0.02000, 0.01000, 0.01000, 0.02000)),
    (0.1111, (0.01000, 0.02000, 0.02000, 0.01000, 0.01325, 0.02000)),
    (0.0845, (0.02000, 0.02000, 0.02000, 0.01000, 0.01325, 0.02000)),
    (0.0157, (0.02000, 0.02000, 0.02000, 0.01000, 0.01325, 0.05000)),
    (0.0309, (0.02000, 0.02000, 0.02000, 0.01205, 0.01325, 0.05000)),
    (0.0103, (0.02000, 0.02000, 0.02000, 0.02000, 0.01787, 0.05000)),
    (0.0113, (0.02000, 0.02000, 0.02000, 0.02000, 0.02000, 0.05000)),
    (0.0320, (0.02000, 0.02395, 0.02395, 0.02000, 0.02000, 0.05000)),
    (0.0119, (0.02000, 0.02395, 0.02395, 0.02000, 0.03252, 0.05000)),
    (0.0214, (0.02000, 0.02395, 0.02395, 0.02194, 0.03252, 0.05000)),
    (0.0406, (0.02000, 0.02395, 0.02395, 0.02959, 0.05000, 0.05000)),
    (0.0428, (0.02000, 0.02395, 0.02395, 0.05000, 0.05000, 0.05000)),
    (0.1801, (0.02000, 0.05000, 0.05000, 0.05000, 0.05000, 0.05000)),
    (0.0125, (0.02000, 0.05000, 0.05000, 0.05000, 0.07984, 0.06581)),
    (0.0131, (0.02000, 0.05000, 0.05000, 0.09800, 0.10770, 0.06581)),
    (0.0108, (0.02000, 0.05880, 0.05880, 0.09800, 0.10770, 0.06581)),
)

#: The discordance estimate's prior: ``PRIOR_DISCORDANT`` discordant pairs in ``PRIOR_PAIRS``.
PRIOR_DISCORDANT = 3.0
PRIOR_PAIRS = 50.0
#: Largest bet on "this discordant pair is a loss" (keeps a gain from costing more than 96 %).
MAX_BET = 0.98
#: Discordant pairs folded per numpy pass (bounds the memory of a long replay).
CHUNK = 1 << 16

_W = np.array([w for w, _ in COMPONENTS], dtype=np.float64)
LOG_WEIGHTS: FloatArray = np.log(_W / _W.sum())
_LOG_KNOT_D = np.log(np.array(KNOT_DISCORDANCE, dtype=np.float64))
_LOG_KNOT_L = np.log(np.array([k for _, k in COMPONENTS], dtype=np.float64).T)  # (knots, J)
J = len(COMPONENTS)
LOG_WEIGHTS.flags.writeable = False


def discordance_estimate(
    pairs_before: npt.ArrayLike, discordant_before: npt.ArrayLike
) -> FloatArray:
    """The predictable plug-in ``(discordant before + 3) / (pairs before + 50)``."""
    return (np.asarray(discordant_before, dtype=np.float64) + PRIOR_DISCORDANT) / (
        np.asarray(pairs_before, dtype=np.float64) + PRIOR_PAIRS
    )


def target_losses(d: npt.ArrayLike) -> FloatArray:
    """``L_j(d)`` for every component, shape ``d.shape + (J,)``: linear in (log d, log L)
    between the knots, constant outside them."""
    ld = np.clip(np.log(np.asarray(d, dtype=np.float64)), _LOG_KNOT_D[0], _LOG_KNOT_D[-1])
    seg = np.clip(np.searchsorted(_LOG_KNOT_D, ld, side="right") - 1, 0, _LOG_KNOT_D.size - 2)
    frac = (ld - _LOG_KNOT_D[seg]) / (_LOG_KNOT_D[seg + 1] - _LOG_KNOT_D[seg])
    lo, hi = _LOG_KNOT_L[seg], _LOG_KNOT_L[seg + 1]
    out: FloatArray = np.exp(lo + frac[..., None] * (hi - lo))
    return out


def bets(d: npt.ArrayLike) -> FloatArray:
    """Each component's bet ``q_j = clip(1/2 + L_j(d) / (2 d), 1/2, MAX_BET)`` at the
    discordance estimate ``d``, shape ``d.shape + (J,)``."""
    dd = np.asarray(d, dtype=np.float64)
    out: FloatArray = np.clip(0.5 + target_losses(dd) / (2.0 * dd[..., None]), 0.5, MAX_BET)
    return out


@dataclass(frozen=True, slots=True)
class NetLossState:
    """The e-process and its change detector after some pairs (immutable).

    ``log_wealth``: ``ln W_j`` per component since the start; ``log_sr``: ``ln R_j`` of the
    Shiryaev-Roberts detector per component (``-inf`` before the first discordant pair);
    ``pairs`` / ``discordant``: the pairs folded so far and how many were discordant;
    ``last_discordant``: the 1-based pair index of the last discordant pair (0: none yet).
    """

    log_wealth: tuple[float, ...] = (0.0,) * J
    log_sr: tuple[float, ...] = (-math.inf,) * J
    pairs: int = 0
    discordant: int = 0
    last_discordant: int = 0

    @property
    def log_e_value(self) -> float:
        """``ln E``: the mixture of the components' wealth (exactly 0 before any discordant
        pair: every wealth is 1)."""
        if self.discordant == 0:
            return 0.0
        return float(_mix_rows(np.asarray(self.log_wealth, dtype=np.float64)[None, :])[0])

    @property
    def e_value(self) -> float:
        """``E`` itself (``inf`` on overflow)."""
        return exp_or_inf(self.log_e_value)

    @property
    def log_detector(self) -> float:
        """``ln M``, the change detector (``-inf`` before the first discordant pair)."""
        return _mix_sr(np.asarray(self.log_sr, dtype=np.float64))

    def update(self, x: int) -> NetLossState:
        """The state after one more pair ``x`` (+1 lost, -1 gained, 0 agree): the code of
        :func:`net_loss_path` on one pair (an agreeing pair only advances the pair count)."""
        if x == 0:
            return NetLossState(
                self.log_wealth, self.log_sr, self.pairs + 1, self.discordant, self.last_discordant
            )
        return net_loss_path(np.array([x], dtype=np.int64), self).last

    def reset_detector(self) -> NetLossState:
        """The detector restarted (after an acknowledged change); the e-process is kept."""
        return NetLossState(
            self.log_wealth, (-math.inf,) * J, self.pairs, self.discordant, self.pairs
        )


def _mix_sr(log_r: FloatArray) -> float:
    if not np.isfinite(log_r).any():
        return -math.inf
    return float(_mix_rows(log_r[None, :])[0])


def _mix_rows(log_values: FloatArray) -> FloatArray:
    """``ln Σ_j w_j e^{v_j}`` per row of a ``(K, J)`` array of finite logs."""
    a = log_values + LOG_WEIGHTS
    m = a.max(axis=1)
    a -= m[:, None]
    np.exp(a, out=a)
    out: FloatArray = m + np.log(a.sum(axis=1))
    return out


@dataclass(frozen=True, slots=True)
class NetLossPath:
    """:func:`net_loss_path`'s result: ``log_e`` and ``log_detector`` after every pair
    (shape ``(n,)``; both stay put on agreeing pairs) and the state after the last one."""

    log_e: FloatArray
    log_detector: FloatArray
    last: NetLossState


def check_outcomes(outcomes: npt.ArrayLike | Iterable[int]) -> IntArray:
    """``outcomes`` as an int64 array of shape ``(n,)``; ``ValueError`` outside {-1, 0, 1}."""
    if isinstance(outcomes, np.ndarray):
        x = outcomes.astype(np.int64).reshape(-1)
    else:
        x = np.fromiter((int(v) for v in outcomes), dtype=np.int64)  # type: ignore[arg-type,union-attr]
    if not np.all((x == -1) | (x == 0) | (x == 1)):
        raise ValueError("outcomes must be -1, 0 or 1")
    return x


def net_loss_path(
    outcomes: npt.ArrayLike | Iterable[int], start: NetLossState | None = None
) -> NetLossPath:
    """Fold the outcomes (+1 lost, -1 gained, 0 agree, oldest first) into the e-process and the
    detector from ``start`` (default: before any pair). O(n + K J) numpy for K discordant pairs,
    in passes of :data:`CHUNK` discordant pairs. Raises ``ValueError`` outside {-1, 0, 1}."""
    x = check_outcomes(outcomes)
    state = start if start is not None else NetLossState()
    n = x.size
    disc_idx = np.flatnonzero(x)
    k_total = disc_idx.size
    log_e_at = np.empty(k_total, dtype=np.float64)
    log_m_at = np.empty(k_total, dtype=np.float64)
    lw = np.asarray(state.log_wealth, dtype=np.float64)
    lr = np.asarray(state.log_sr, dtype=np.float64)
    last = state.last_discordant
    for a in range(0, k_total, CHUNK):
        idx = disc_idx[a : a + CHUNK]
        k = np.arange(a, a + idx.size, dtype=np.float64)
        pair_no = state.pairs + idx + 1  # 1-based pair index of each discordant pair
        q = bets(discordance_estimate(pair_no - 1, state.discordant + k))
        lf = np.where((x[idx] == 1)[:, None], np.log(2.0 * q), np.log(2.0 - 2.0 * q))
        wealth = np.cumsum(np.vstack([lw[None, :], lf]), axis=0)[1:]
        log_e_at[a : a + idx.size] = _mix_rows(wealth)
        prev = np.concatenate(([last], pair_no[:-1]))
        gaps = np.minimum(pair_no - prev, GAP_CAP).astype(np.float64)
        sr = sr_log_path(lf, gaps, lr)
        log_m_at[a : a + idx.size] = _mix_rows(sr)
        lw, lr, last = wealth[-1], sr[-1], int(pair_no[-1])
    # Forward-fill: after pair t the values are those of the last discordant pair <= t.
    seen = np.cumsum(x != 0) - 1
    log_e = log_e_at[np.maximum(seen, 0)] if k_total else np.zeros(n)
    log_m = log_m_at[np.maximum(seen, 0)] if k_total else np.zeros(n)
    if n and seen[0] < 0:  # agreeing pairs before the first discordant one: the start's values
        before = seen < 0
        log_e[before] = state.log_e_value
        log_m[before] = state.log_detector
    end = NetLossState(
        tuple(float(v) for v in lw),
        tuple(float(v) for v in lr),
        state.pairs + n,
        state.discordant + k_total,
        last,
    )
    return NetLossPath(log_e, log_m, end)


def run_net_loss(
    outcomes: npt.ArrayLike | Iterable[int], start: NetLossState | None = None
) -> NetLossState:
    """The state after every pair of ``outcomes`` (see :func:`net_loss_path`)."""
    return net_loss_path(outcomes, start).last


def net_loss_log_e_values(outcomes: npt.ArrayLike | Iterable[int]) -> FloatArray:
    """``ln E`` after each pair of an ordered outcome sequence, from a fresh start."""
    return net_loss_path(outcomes).log_e


def count_log_e_values(lost: npt.ArrayLike, gained: npt.ArrayLike) -> FloatArray:
    """``ln E`` for counts without an order (rolling windows, categories); arrays broadcast.

    The same components with the discordance estimate held at its prior (6 %): fixed bets
    ``q_j``, so ``E = Σ_j w_j (2 q_j)^lost (2 (1 - q_j))^gained`` is a mixture of likelihood
    ratios, a valid e-value whatever the order of the pairs (and, along any order, an
    e-process). The since-start value of all pairs is the ordered e-process
    (:func:`net_loss_path`), not this. Raises ``ValueError`` on negative counts."""
    lo = np.asarray(lost, dtype=np.float64)
    ga = np.asarray(gained, dtype=np.float64)
    if np.any(lo < 0) or np.any(ga < 0):
        raise ValueError("lost and gained must be >= 0")
    q = bets(np.float64(PRIOR_DISCORDANT / PRIOR_PAIRS))
    t = LOG_WEIGHTS + lo[..., None] * np.log(2.0 * q) + ga[..., None] * np.log(2.0 - 2.0 * q)
    out: FloatArray = np.where(lo + ga > 0, logsumexp(t, axis=-1), 0.0)  # E(0, 0) = 1 exactly
    return out


def count_log_e_value(lost: int, gained: int) -> float:
    """Scalar form of :func:`count_log_e_values`."""
    return float(count_log_e_values(lost, gained))


def count_log_e_path(outcomes: npt.ArrayLike | Iterable[int]) -> FloatArray:
    """:func:`count_log_e_values` after each pair of an outcome sequence (the count form a
    category's alarm uses, pair by pair)."""
    x = check_outcomes(outcomes)
    return count_log_e_values(np.cumsum(x == 1), np.cumsum(x == -1))
