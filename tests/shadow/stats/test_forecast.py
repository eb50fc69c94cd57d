""" "About N more pairs" (``power.pairs_to_decide``): the forecast of the tests that decide, at
the observed rates, checked at its own boundary and against simulated continuations."""

from __future__ import annotations

import math

import numpy as np

from specwatch.shadow.stats.confseq import within_margin_log_e_value
from specwatch.shadow.stats.eprocess import count_log_e_value, count_log_e_values
from specwatch.shadow.stats.power import pairs_to_decide


def test_loss_forecast_is_the_first_pair_on_the_expected_path() -> None:
    """After 200 pairs at 6 % discordance and a 2-point loss (8 lost, 4 gained) the forecast m
    is the first whole number of further pairs at which the e-value along the expected path
    (each pair adding 0.04 lost and 0.02 gained) reaches the page's 30 (1 / (0.05 x 2/3))."""
    m = pairs_to_decide(0.02, 0.06, 200, margin=0.0)
    assert m is not None
    assert m > 0

    def log_e(k: float) -> float:
        return float(count_log_e_values(8 + 0.04 * k, 4 + 0.02 * k))

    assert log_e(m) >= math.log(30.0) > log_e(m - 1)


def test_forecast_is_about_the_simulated_median() -> None:
    """At (6 %, 2 points) after 200 pairs, 400 simulated continuations at those rates reach 30
    after a median number of further pairs at or below the forecast and within 30 % of it (the
    expected path crosses later than the median path: the mixture rides its luckiest
    components)."""
    m = pairs_to_decide(0.02, 0.06, 200, margin=0.0)
    assert m is not None
    rng = np.random.default_rng(12)
    u = rng.random((400, 6 * m))
    x = np.where(u < 0.04, 1, np.where(u < 0.06, -1, 0))
    lost = 8 + np.cumsum(x == 1, axis=1)
    gained = 4 + np.cumsum(x == -1, axis=1)
    hit = count_log_e_values(lost, gained) >= math.log(30.0)
    assert hit.any(axis=1).all()
    median = float(np.median(hit.argmax(axis=1) + 1))
    assert 0.7 < median / m <= 1.0


def test_within_margin_forecast_and_the_edges() -> None:
    """No loss at 6 % discordance with a 1-point margin: the forecast is the first pair at which
    the confidence sequence's e-value reaches 1/alpha = 20 on the expected path; 0 once either
    test is decided; None without pairs, for NaN, or when nothing can be decided."""
    n = 1000
    m = pairs_to_decide(0.0, 0.06, n, margin=0.01)
    assert m is not None
    assert m > 0

    def log_k(k: float) -> float:
        return float(within_margin_log_e_value(30 + 0.03 * k, 30 + 0.03 * k, 940 + 0.94 * k, 0.01))

    assert log_k(m) >= math.log(20.0) > log_k(m - 1)
    assert count_log_e_value(60, 0) > math.log(30.0)
    assert pairs_to_decide(0.06, 0.06, 1000, margin=0.0) == 0
    assert pairs_to_decide(0.02, 0.06, 0, margin=0.01) is None
    assert pairs_to_decide(math.nan, 0.06, 10, margin=0.01) is None
    assert pairs_to_decide(-0.01, 0.06, 1000, margin=0.0) is None
