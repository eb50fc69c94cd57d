"""An independent, plain-Python reading of the no-net-loss e-process's formulas (loops and the
``math`` module, no numpy), for the tests to check the shipped vectorised code against.

From the module docstring: before pair t the discordance estimate is
``d = (discordant before + 3) / (pairs before + 50)``; component j's target loss ``L_j(d)`` is
linear in (log d, log L) between the knots and constant outside them; on a discordant pair it
bets ``q = min(max(1/2 + L_j(d) / (2 d), 1/2), 0.98)`` and multiplies its wealth by ``2 q``
(lost) or ``2 (1 - q)`` (gained); E is the weighted mean of the wealths. The detector, per
component, at a discordant pair: ``R <- (R + min(gap, 50)) f`` with ``gap`` the pairs since the
previous discordant pair (inclusive); M is the weighted mean of the R's."""

from __future__ import annotations

import math
from collections.abc import Iterable

from specwatch.shadow.stats.eprocess import COMPONENTS, KNOT_DISCORDANCE


def target_loss(knots: tuple[float, ...], d: float) -> float:
    """``L(d)`` through the knots ``(KNOT_DISCORDANCE[i], knots[i])`` on log-log axes."""
    xs = KNOT_DISCORDANCE
    if d <= xs[0]:
        return knots[0]
    if d >= xs[-1]:
        return knots[-1]
    for i in range(len(xs) - 1):
        if xs[i] <= d <= xs[i + 1]:
            f = (math.log(d) - math.log(xs[i])) / (math.log(xs[i + 1]) - math.log(xs[i]))
            return math.exp(math.log(knots[i]) + f * (math.log(knots[i + 1]) - math.log(knots[i])))
    raise AssertionError("unreachable")


def bet(knots: tuple[float, ...], d: float) -> float:
    """The component's bet that a discordant pair is a loss, at discordance estimate ``d``."""
    return min(max(0.5 + target_loss(knots, d) / (2.0 * d), 0.5), 0.98)


def reference(outcomes: Iterable[int]) -> tuple[list[float], list[float]]:
    """``(E after each pair, M after each pair)`` by the formulas, pair by pair."""
    total = sum(w for w, _ in COMPONENTS)
    weights = [w / total for w, _ in COMPONENTS]
    wealth = [1.0] * len(COMPONENTS)
    sr = [0.0] * len(COMPONENTS)
    discordant = last = 0
    e_path: list[float] = []
    m_path: list[float] = []
    for pairs, x in enumerate(outcomes):
        if x != 0:
            d = (discordant + 3.0) / (pairs + 50.0)
            gap = min(pairs + 1 - last, 50)
            for j, (_, knots) in enumerate(COMPONENTS):
                q = bet(knots, d)
                f = 2.0 * q if x == 1 else 2.0 * (1.0 - q)
                wealth[j] *= f
                sr[j] = (sr[j] + gap) * f
            discordant += 1
            last = pairs + 1
        e_path.append(math.fsum(w * v for w, v in zip(weights, wealth, strict=True)))
        m_path.append(math.fsum(w * v for w, v in zip(weights, sr, strict=True)))
    return e_path, m_path


def count_form(lost: int, gained: int) -> float:
    """The count form (windows, categories): every component's bet held at the 6 % prior,
    ``Σ_j w_j (2 q_j)^lost (2 (1 - q_j))^gained``."""
    total = sum(w for w, _ in COMPONENTS)
    return math.fsum(
        w / total * (2 * bet(k, 0.06)) ** lost * (2 * (1 - bet(k, 0.06))) ** gained
        for w, k in COMPONENTS
    )
