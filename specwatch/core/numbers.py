"""Number helpers shared by every layer: the one overflow rule for turning a log e-value into an
e-value."""

from __future__ import annotations

import math

#: Largest ``x`` for which ``math.exp(x)`` is finite in IEEE-754 double precision (exp(709.78) ≈
#: 1.8e308).
EXP_LIMIT = 709.0


def exp_or_inf(log_e: float) -> float:
    """``exp(log_e)``, or ``math.inf`` when ``log_e > 709`` (where ``math.exp`` would raise
    ``OverflowError``).

    The e-value of a betting e-process whose log-wealth passed 709 is reported as ``inf``, never
    clamped to a
    finite value, so an alarm (``e >= 1/alpha``) can never be hidden by the clamp. Never raises."""
    return math.inf if log_e > EXP_LIMIT else math.exp(log_e)


def finite_or_none(x: float | None) -> float | None:
    """``x`` when it is a finite float, else ``None`` (for JSON documents, which have no ``inf`` or
    ``NaN``)."""
    return x if x is not None and math.isfinite(x) else None
