"""An independent, plain-Python reading of the no-net-loss e-process's formulas (loops and the
``math`` module, no numpy), for the tests to check the shipped vectorised code against.

From the module docstring: component j bets the lost share ``θ_j`` on every discordant pair,
its wealth is ``(2 θ_j)^lost (2 (1 - θ_j))^gained`` and E is the weighted mean of the wealths.
The detector, per component, at a discordant pair: ``R <- (R + min(gap, 50)) f`` with ``f``
the component's factor (``2 θ_j`` lost, ``2 (1 - θ_j)`` gained) and ``gap`` the pairs since the
previous discordant pair (inclusive); M is the weighted mean of the R's."""

from __future__ import annotations

import math
from collections.abc import Iterable

from specwatch.shadow.stats.eprocess import COMPONENTS


def _weights() -> list[tuple[float, float]]:
    total = sum(w for _, w in COMPONENTS)
    return [(theta, w / total) for theta, w in COMPONENTS]


def count_form(lost: float, gained: float) -> float:
    """``E(lost, gained) = Σ_j w_j (2 θ_j)^lost (2 (1 - θ_j))^gained``."""
    return math.fsum(
        w * (2 * theta) ** lost * (2 * (1 - theta)) ** gained for theta, w in _weights()
    )


def reference(outcomes: Iterable[int]) -> tuple[list[float], list[float]]:
    """``(E after each pair, M after each pair)`` by the formulas, pair by pair."""
    comps = _weights()
    sr = [0.0] * len(comps)
    lost = gained = last = 0
    e_path: list[float] = []
    m_path: list[float] = []
    for pairs, x in enumerate(outcomes):
        if x != 0:
            gap = min(pairs + 1 - last, 50)
            for j, (theta, _) in enumerate(comps):
                f = 2.0 * theta if x == 1 else 2.0 * (1.0 - theta)
                sr[j] = (sr[j] + gap) * f
            lost += x == 1
            gained += x == -1
            last = pairs + 1
        e_path.append(count_form(lost, gained))
        m_path.append(math.fsum(w * r for (_, w), r in zip(comps, sr, strict=True)))
    return e_path, m_path
