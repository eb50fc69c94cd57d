"""Change detection for a net loss that starts late: a Shiryaev-Roberts e-detector (pure).

The since-start e-value (:mod:`specwatch.shadow.stats.eprocess`) never forgets: after 10,000
harmless pairs its log is far below 0, and a loss that starts then has to climb back first. The
detector restarts its evidence at every pair instead (e-detectors: Shin, Ramdas & Rinaldo 2024,
"E-detectors: a nonparametric framework for sequential change detection", New England J.
Statist. Data Sci.; Shiryaev-Roberts: Roberts 1966, Pollak 1985).

It is built from the e-process's own per-pair factors ``f_j`` (``2 θ_j`` on a loss, ``2 (1 -
θ_j)`` on a gain, 1 on agreement, with the components' lost shares ``θ_j``). The Shiryaev-Roberts
statistic on the **pair clock** is the sum, over every pair ``s <= n``, of the e-process
started at ``s``. Starts inside a run of agreeing pairs all give the same process, so at the
k-th discordant pair, per component, ``R_j <- (R_j + G_k) f_j`` with ``G_k`` the pairs since the
previous discordant pair (inclusive), and the detector is ``M = Σ_j w_j R_j``.

Why the false-alarm rate is bounded. Under no net loss every started e-process is a test
supermartingale, so ``M_n - n`` is a supermartingale and the mean run length to ``M >= A`` is at
least ``A`` pairs (the alarm level ``paired.change_arl``). Two changes only
make the statistic smaller, so the bound holds: ``G_k`` is capped at :data:`GAP_CAP`, and the
alarm is checked at discordant pairs only (a long run of agreeing pairs alone never alarms).

Its false alarms come at a rate (one per ``A`` pairs at most, on average), not once in a
lifetime as an e-value's do, so the alerting policy (:mod:`specwatch.shadow.stats.policy`)
makes it the warning ``SpecQualityChange``, outside the critical page's budget, and states its
mean interval between false alarms in days.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from specwatch.shadow.stats.sequential import alarm

FloatArray = npt.NDArray[np.float64]

#: New starts credited at one discordant pair at most (pair clock; see the module docstring).
GAP_CAP = 50


def sr_log_path(log_factors: FloatArray, gaps: FloatArray, log_r0: FloatArray) -> FloatArray:
    """``ln R_j`` after each of K discordant pairs, shape ``(K, J)``, from ``ln R_j`` before them
    (``log_r0``, shape ``(J,)``, ``-inf`` for a fresh detector).

    ``log_factors[k, j]`` is ``ln f_j`` at the k-th discordant pair and ``gaps[k]`` its capped
    ``G_k``. The recursion ``R_k = (R_{k-1} + G_k) f_k`` is solved in closed form,
    ``ln R_k = C_k + ln(R_0 + Σ_{i<=k} G_i e^{-C_{i-1}})`` with ``C_k = Σ_{i<=k} ln f_i``,
    vectorised over k and j (exactly the recursion for K = 1)."""
    c = np.cumsum(log_factors, axis=0)
    c_prev = c - log_factors
    starts = np.log(gaps)[:, None] - c_prev
    acc = np.logaddexp.accumulate(starts, axis=0)
    with np.errstate(invalid="ignore"):
        out: FloatArray = c + np.logaddexp(log_r0[None, :], acc)
    return out


def detector_alarm(log_value: float, threshold: float) -> bool:
    """``M >= threshold`` for ``ln M``; raises ``ValueError`` for ``threshold <= 1``."""
    if not threshold > 1.0:
        raise ValueError("threshold must be > 1")
    return alarm(log_value, 1.0 / threshold)
