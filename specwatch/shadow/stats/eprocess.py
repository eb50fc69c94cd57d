"""The no-net-loss e-process: a mixture over the lost share of the discordant pairs.

Per labelled pair the outcome is ``x = +1`` (FLy lost a point: standard right, FLy wrong),
``-1`` (FLy gained one) or ``0`` (both agree). H0, "no net loss": given the past,
``P(x = +1) <= P(x = -1)``, whatever the discordance ``d = P(+1) + P(-1)`` is and however it
changes over time.

The design conditions on discordance. Given the past and given that pair t is discordant, the
share of losses is ``θ_t = P(+1) / (P(+1) + P(-1))``, and H0 says ``θ_t <= 1/2``. Component j
bets a fixed share ``θ_j > 1/2`` (:data:`COMPONENTS`): on a discordant pair its wealth is
multiplied by ``2 θ_j`` on a loss and ``2 (1 - θ_j)`` on a gain, and by 1 on an agreeing pair.
Given the past the expected multiplier is ``1 + (2 θ_j - 1)(P(+1) - P(-1)) <= 1`` under H0, so
each component, and the fixed-weight mixture

    ``E = Σ_j w_j (2 θ_j)^lost (2 (1 - θ_j))^gained``,

is a test supermartingale for every (even time-varying) discordance, and Ville's inequality
(Ville 1939) gives ``P(sup_t E_t >= 1/a) <= a`` under continuous monitoring (Ramdas, Grünwald,
Vovk & Shafer 2023, "Game-theoretic statistics and safe anytime-valid inference", Statist. Sci.
38:576-601). It is Robbins' mixture likelihood ratio (Robbins 1970, Ann. Math. Statist.
41:1397-1409) for the sign of the discordant pairs with a discrete prior on ``[1/2, 1)``.

Why this design. ``E`` is a function of the counts ``(lost, gained)`` alone:

* agreeing pairs never move it, so a quiet stretch (any number of agreeing pairs) leaves the
  bets where they were and a loss that starts afterwards is found exactly as fast as from a
  fresh start. (The design it replaces bet from a plug-in estimate of the discordance; after a
  long agreeing stretch the estimate collapsed, every bet sat near its cap and each early gain
  cost 92-96 % of the wealth.)
* it does not depend on the order of the pairs: the sidecar, a restart from the ledger, the
  report, ``paired-test`` and the per-category values all compute the same number from the same
  counts (:func:`count_log_e_values` is the one function).

A loss of L points at discordance d is a lost share ``θ = 1/2 + L / (2 d)``: 2 points is
``θ = 0.667`` at 6 % and ``0.533`` at 30 %. No single bet is right for both, so the prior
spreads over the shares of the bench grid (discordance 2-30 %, loss 1-5 points) with most of
its weight near the operating point (6 %, 2 points); the weights were chosen on that grid
(``bench/mixture_weights.py``; the page on the grid: ``bench/page_grid.py``, results and
costs in ``docs/benchmarks.md``).

The change detector (:mod:`specwatch.shadow.stats.detector`) is built from the same
components' factors: a Shiryaev-Roberts e-detector on the pair clock (Shin, Ramdas & Rinaldo
2024, "E-detectors: a nonparametric framework for sequential change detection", New England J.
Statist. Data Sci.). It is what forgets: after a long run of harmless *discordant* pairs the
since-start ``E`` is small and a late loss has to climb back, the detector restarts its
evidence at every pair.

Everything here is pure: values in, values out. :class:`NetLossState` is the small frozen state
(the counts, the detector's per-component logs); :func:`net_loss_path` folds a whole outcome
sequence with numpy and :meth:`NetLossState.update` is the same code on one pair, so folding in
any chunking gives the same counts and so the same e-value.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from specwatch.core.numbers import exp_or_inf
from specwatch.shadow.stats.detector import GAP_CAP, sr_log_path

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

#: ``(lost share θ_j bet on a discordant pair, weight w_j)`` per component (weights sum to 1).
COMPONENTS: tuple[tuple[float, float], ...] = (
    (0.515, 0.1168),
    (0.525, 0.0310),
    (0.535, 0.1166),
    (0.550, 0.1168),
    (0.600, 0.0564),
    (0.625, 0.0195),
    (0.665, 0.3708),
    (0.920, 0.1384),
    (0.980, 0.0337),
)

#: Discordant pairs folded per numpy pass (bounds the memory of a long replay).
CHUNK = 1 << 16

THETAS: FloatArray = np.array([t for t, _ in COMPONENTS], dtype=np.float64)
_W = np.array([w for _, w in COMPONENTS], dtype=np.float64)
LOG_WEIGHTS: FloatArray = np.log(_W / _W.sum())
#: ``ln 2 θ_j`` (a loss) and ``ln 2 (1 - θ_j)`` (a gain) per component.
LOG_UP: FloatArray = np.log(2.0 * THETAS)
LOG_DOWN: FloatArray = np.log(2.0 - 2.0 * THETAS)
J = len(COMPONENTS)
for _a in (THETAS, LOG_WEIGHTS, LOG_UP, LOG_DOWN):
    _a.flags.writeable = False


def _mix_rows(log_values: FloatArray) -> FloatArray:
    """``ln Σ_j w_j e^{v_j}`` over the last axis of an array of finite logs."""
    a = log_values + LOG_WEIGHTS
    m = a.max(axis=-1)
    out: FloatArray = m + np.log(np.exp(a - m[..., None]).sum(axis=-1))
    return out


def count_log_e_values(lost: npt.ArrayLike, gained: npt.ArrayLike) -> FloatArray:
    """``ln E`` of the counts: ``ln Σ_j w_j (2 θ_j)^lost (2 (1 - θ_j))^gained``; arrays
    broadcast; ``E(0, 0) = 1`` exactly. The one function behind every no-net-loss e-value (since
    start, per category, on every surface). Raises ``ValueError`` on negative counts."""
    lo = np.asarray(lost, dtype=np.float64)
    ga = np.asarray(gained, dtype=np.float64)
    if np.any(lo < 0) or np.any(ga < 0):
        raise ValueError("lost and gained must be >= 0")
    t = lo[..., None] * LOG_UP + ga[..., None] * LOG_DOWN
    out: FloatArray = np.where(lo + ga > 0, _mix_rows(t), 0.0)
    return out


def count_log_e_value(lost: int, gained: int) -> float:
    """Scalar form of :func:`count_log_e_values`."""
    return float(count_log_e_values(lost, gained))


@dataclass(frozen=True, slots=True)
class NetLossState:
    """The e-process and its change detector after some pairs (immutable).

    ``lost`` / ``gained`` / ``pairs``: the counts so far; ``log_sr``: ``ln R_j`` of the
    Shiryaev-Roberts detector per component (``-inf`` before the first discordant pair);
    ``last_discordant``: the 1-based pair index of the last discordant pair (0: none yet).
    """

    lost: int = 0
    gained: int = 0
    pairs: int = 0
    log_sr: tuple[float, ...] = (-math.inf,) * J
    last_discordant: int = 0

    @property
    def discordant(self) -> int:
        """Discordant pairs so far (``lost + gained``)."""
        return self.lost + self.gained

    @property
    def log_e_value(self) -> float:
        """``ln E`` (:func:`count_log_e_value` of the counts; exactly 0 before any discordant
        pair)."""
        return count_log_e_value(self.lost, self.gained)

    @property
    def e_value(self) -> float:
        """``E`` itself (``inf`` on overflow)."""
        return exp_or_inf(self.log_e_value)

    @property
    def log_detector(self) -> float:
        """``ln M``, the change detector (``-inf`` before the first discordant pair)."""
        log_r = np.asarray(self.log_sr, dtype=np.float64)
        if not np.isfinite(log_r).any():
            return -math.inf
        return float(_mix_rows(log_r))

    def update(self, x: int) -> NetLossState:
        """The state after one more pair ``x`` (+1 lost, -1 gained, 0 agree): the code of
        :func:`net_loss_path` on one pair (an agreeing pair only advances the pair count)."""
        if x == 0:
            return NetLossState(
                self.lost, self.gained, self.pairs + 1, self.log_sr, self.last_discordant
            )
        return net_loss_path(np.array([x], dtype=np.int64), self).last

    def reset_detector(self) -> NetLossState:
        """The detector restarted (after an acknowledged change); the e-process is kept."""
        return NetLossState(self.lost, self.gained, self.pairs, (-math.inf,) * J, self.pairs)


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


def _chunked_log_e(lost: IntArray, gained: IntArray) -> FloatArray:
    """:func:`count_log_e_values` in passes of :data:`CHUNK` (a long ledger never holds its
    (pairs x components) table at once); each value is computed alone, so the same numbers."""
    out = np.empty(lost.size, dtype=np.float64)
    for a in range(0, lost.size, CHUNK):
        out[a : a + CHUNK] = count_log_e_values(lost[a : a + CHUNK], gained[a : a + CHUNK])
    return out


def _forward_fill(x: IntArray, at_discordant: FloatArray, before: float) -> FloatArray:
    """Values after every pair from the values at the discordant pairs: after pair t, those of
    the last discordant pair <= t (``before`` ahead of the first one)."""
    seen = np.cumsum(x != 0) - 1
    if not at_discordant.size:
        return np.full(x.size, before)
    out: FloatArray = at_discordant[np.maximum(seen, 0)]
    out[seen < 0] = before
    return out


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
    up = x[disc_idx] == 1
    lost_at = state.lost + np.cumsum(up)
    gained_at = state.gained + np.cumsum(~up)
    log_e_at = _chunked_log_e(lost_at, gained_at)
    log_m_at = np.empty(k_total, dtype=np.float64)
    lr = np.asarray(state.log_sr, dtype=np.float64)
    last = state.last_discordant
    for a in range(0, k_total, CHUNK):
        idx = disc_idx[a : a + CHUNK]
        pair_no = state.pairs + idx + 1  # 1-based pair index of each discordant pair
        lf = np.where(up[a : a + idx.size, None], LOG_UP, LOG_DOWN)
        prev = np.concatenate(([last], pair_no[:-1]))
        gaps = np.minimum(pair_no - prev, GAP_CAP).astype(np.float64)
        sr = sr_log_path(lf, gaps, lr)
        log_m_at[a : a + idx.size] = _mix_rows(sr)
        lr, last = sr[-1], int(pair_no[-1])
    log_e = _forward_fill(x, log_e_at, state.log_e_value)
    log_m = _forward_fill(x, log_m_at, state.log_detector)
    end = NetLossState(
        int(lost_at[-1]) if k_total else state.lost,
        int(gained_at[-1]) if k_total else state.gained,
        state.pairs + n,
        tuple(float(v) for v in lr),
        last,
    )
    return NetLossPath(log_e, log_m, end)


def run_net_loss(
    outcomes: npt.ArrayLike | Iterable[int], start: NetLossState | None = None
) -> NetLossState:
    """The state after every pair of ``outcomes`` (see :func:`net_loss_path`)."""
    return net_loss_path(outcomes, start).last


def net_loss_log_e_values(outcomes: npt.ArrayLike | Iterable[int]) -> FloatArray:
    """``ln E`` after each pair of an ordered outcome sequence, from a fresh start (the
    cumulative counts through :func:`count_log_e_values`)."""
    x = check_outcomes(outcomes)
    up = x[x != 0] == 1
    return _forward_fill(x, _chunked_log_e(np.cumsum(up), np.cumsum(~up)), 0.0)


#: The same path (kept for the callers that read a category's values by this name).
count_log_e_path = net_loss_log_e_values
