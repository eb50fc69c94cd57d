"""Change detection for a net loss that starts late: a Shiryaev-Roberts e-detector (pure).

The since-start e-value (:func:`~specwatch.shadow.stats.sequential.net_loss_log_e_value`)
never forgets: after 10,000 harmless pairs its log is far below 0 and a loss that starts then
has to climb back first. The detector restarts its evidence at every pair instead: with the
likelihood ratio ``f_j(x) = 2 q_j`` (lost) or ``2 (1 - q_j)`` (gained) of component j on a
discordant pair, the Shiryaev-Roberts statistic ``R_{j,k} = f_j(x_k) (R_{j,k-1} + 1)``,
``R_{j,0} = 0``, is the sum over every possible change point of the e-process started there;
the detector is the fixed-weight mixture ``M_k = Σ_j w_j R_{j,k}`` over the components of
:func:`detector_components`, and it alarms at ``M_k >= threshold``.

Why the false-alarm rate is bounded. Under no net loss each started e-process is a test
supermartingale (expected multiplier ``1 + (2 q_j - 1)(a - b) <= 1``), so ``M_k - k`` is a
supermartingale and ``E[M_k] <= k``; by optional stopping the mean run length to a false alarm
is at least ``threshold`` discordant pairs (e-detectors: Shin, Ramdas & Rinaldo 2024,
"E-detectors: a nonparametric framework for sequential change detection", New England J.
Statist. Data Sci. 2:229-260, Theorem 2.4; Shiryaev-Roberts: Roberts 1966, Pollak 1985).
Concordant pairs do not advance it (every component's ratio is 1 there), so in pairs the run
length is longer still. The threshold is ``1 / alpha`` of the detector's own level.

Depends on the order of the discordant pairs only (not on where the concordant ones fall), so
the sidecar folds it pair by pair and rebuilds it from the ledger in time order.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from specwatch.shadow.stats.sequential import alarm, net_loss_mixture_grid

FloatArray = npt.NDArray[np.float64]

#: Spread of the broad part of the detector's components: q - 1/2 log-uniform on this range
#: (a net loss L at discordance d is q = 1/2 + L / (2 d), so 0.01..0.49 covers 1 point at 50 %
#: discordance up to losses that flip nearly every discordant pair).
BROAD_RANGE: tuple[float, float] = (0.01, 0.49)
_BROAD_POINTS = 12

#: Share of the weight on the focused grid (the since-start design); the rest is broad.
FOCUSED_SHARE = 0.3

#: Broad weights ∝ (q - 1/2)^BROAD_TILT: a little more weight on the small q - 1/2 of high
#: discordance (chosen on the grid of ``bench/robust_grid.py`` among 0.3-0.6 focused shares
#: and tilts 0 / -0.3: the best share of runs alarming at 20-30 % discordance).
BROAD_TILT = -0.3

#: Default mean run length to a false alarm, in discordant pairs (the detector's threshold;
#: the default of ``PairedSettings.change_arl``).
DEFAULT_ARL = 100_000.0


@functools.lru_cache(maxsize=16)
def detector_components(detect_net_loss: float = 0.02) -> tuple[FloatArray, FloatArray]:
    """``(q_j, w_j)`` of the detector's mixture (weights sum to 1): the focused grid of
    :func:`~specwatch.shadow.stats.sequential.net_loss_mixture_grid` at ``detect_net_loss``
    with weight :data:`FOCUSED_SHARE`, and a log-spaced grid of 12 points over
    :data:`BROAD_RANGE` (weights ∝ (q - 1/2)^:data:`BROAD_TILT`) for the discordance the
    focused grid does not expect. Remembered per ``detect_net_loss`` (read-only arrays)."""
    fq, fw = net_loss_mixture_grid(detect_net_loss)
    lo, hi = BROAD_RANGE
    x = np.exp(np.linspace(math.log(lo), math.log(hi), _BROAD_POINTS))
    bq = 0.5 + x
    bw = x**BROAD_TILT
    bw *= (1.0 - FOCUSED_SHARE) / bw.sum()
    q = np.concatenate([fq, bq]).astype(np.float64)
    w = np.concatenate([fw * FOCUSED_SHARE, bw]).astype(np.float64)
    q.flags.writeable = False  # remembered: shared by every caller
    w.flags.writeable = False
    return q, w


@dataclass(frozen=True, slots=True)
class ChangeDetector:
    """The detector's state after some discordant pairs (immutable; :meth:`update` returns a
    new one). ``log_r``: ``ln R_j`` per component (``-inf`` before the first discordant pair);
    ``discordant``: the pairs it has seen; ``threshold``: the alarm level (mean run length to a
    false alarm >= ``threshold`` discordant pairs)."""

    log_r: tuple[float, ...]
    detect_net_loss: float = 0.02
    threshold: float = DEFAULT_ARL
    discordant: int = 0

    @classmethod
    def fresh(cls, detect_net_loss: float = 0.02, threshold: float = DEFAULT_ARL) -> ChangeDetector:
        """A detector before any pair. Raises ``ValueError`` for ``threshold <= 1``."""
        if not threshold > 1.0:
            raise ValueError("threshold must be > 1")
        q, _ = detector_components(detect_net_loss)
        return cls((-math.inf,) * q.size, detect_net_loss, threshold, 0)

    @property
    def log_value(self) -> float:
        """``ln M`` (``-inf`` before the first discordant pair)."""
        _, w = detector_components(self.detect_net_loss)
        r = np.asarray(self.log_r, dtype=np.float64)
        with np.errstate(divide="ignore"):
            return float(np.logaddexp.reduce(np.log(w) + r))

    @property
    def alarmed(self) -> bool:
        """``M >= threshold``."""
        return alarm(self.log_value, 1.0 / self.threshold)

    def update(self, d: int) -> ChangeDetector:
        """Add one pair: ``d = 1`` lost, ``-1`` gained, ``0`` concordant (no change)."""
        if d not in (-1, 0, 1):
            raise ValueError("d must be -1, 0 or 1")
        if d == 0:
            return self
        path = detector_log_path(np.array([d]), self)
        return ChangeDetector(
            tuple(float(x) for x in path[1]),
            self.detect_net_loss,
            self.threshold,
            self.discordant + 1,
        )


def detector_log_path(d: npt.ArrayLike, start: ChangeDetector) -> tuple[FloatArray, FloatArray]:
    """``ln M`` after each pair of ``d`` (shape ``(n,)``; it stays put on concordant pairs and is
    ``-inf`` before the first discordant one) and ``ln R_j`` after the last (shape ``(J,)``),
    from the state ``start``. The recursion ``ln R_k = ln f(x_k) + log1p-exp(ln R_{k-1})`` in
    float64, one step per discordant pair, vectorised over the components."""
    x = np.asarray(d, dtype=np.int64).reshape(-1)
    if not np.all((x == -1) | (x == 0) | (x == 1)):
        raise ValueError("d must be -1, 0 or 1")
    q, w = detector_components(start.detect_net_loss)
    lw = np.log(w)
    up, down = np.log(2.0 * q), np.log(2.0 * (1.0 - q))
    r = np.asarray(start.log_r, dtype=np.float64).copy()
    moved = np.flatnonzero(x)  # the path stays put on concordant pairs: step on the others
    after = np.empty(moved.size + 1, dtype=np.float64)
    with np.errstate(divide="ignore"):
        after[0] = float(np.logaddexp.reduce(lw + r))
        for k, xi in enumerate(x[moved].tolist(), start=1):
            r = (up if xi == 1 else down) + np.logaddexp(r, 0.0)
            after[k] = float(np.logaddexp.reduce(lw + r))
    # pair i holds the value after the discordant pairs up to and including it
    out: FloatArray = after[np.searchsorted(moved, np.arange(x.size), side="right")]
    return out, r


def run_detector(d: Iterable[int], start: ChangeDetector) -> ChangeDetector:
    """The detector after every pair of ``d`` (+1 lost, -1 gained, 0 concordant), from
    ``start``; the one driver the live component, its restart and :func:`first_alarms` use."""
    arr = np.fromiter((int(v) for v in d), dtype=np.int64)
    if arr.size == 0:
        return start
    _, r = detector_log_path(arr, start)
    return ChangeDetector(
        tuple(float(v) for v in r),
        start.detect_net_loss,
        start.threshold,
        start.discordant + int(np.count_nonzero(arr)),
    )
