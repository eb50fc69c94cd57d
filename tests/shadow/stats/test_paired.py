"""Paired statistics checked against scipy and independent computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import minimize_scalar
from scipy.stats import binomtest, norm

from specwatch.shadow.stats.paired import (
    FlipCounts,
    PairedCounts,
    discordant_ratio,
    excess_flip,
    mcnemar_exact_p,
    net_loss_ci,
    net_loss_ratio,
    non_inferiority_test,
    tango_score_statistic,
)
from specwatch.shadow.stats.power import questions_needed, questions_needed_z, z_quantile


def test_seed_example_428_items_25_lost_2_gained() -> None:
    """The seed example (428 items, 25 lost, 2 gained) gives the hand-computed McNemar p-values
    and ratios."""
    # 2 * P[X <= 2], X ~ Bin(27, 1/2) = 2 * (1 + 27 + 351) / 2**27
    assert mcnemar_exact_p(25, 2) == pytest.approx(2 * 379 / 2**27, rel=1e-12)
    assert mcnemar_exact_p(25, 2) == pytest.approx(5.6e-6, rel=0.01)
    assert mcnemar_exact_p(25, 2, "loss") == pytest.approx(379 / 2**27, rel=1e-12)
    c = PairedCounts(both_correct=354, lost=25, gained=2, both_wrong=47)
    assert c.n == 428
    assert c.net == -23
    assert net_loss_ratio(c) == pytest.approx(23 / 428)
    assert discordant_ratio(c) == pytest.approx(27 / 428)


@pytest.mark.parametrize(
    ("lost", "gained"), [(0, 1), (1, 0), (3, 3), (7, 2), (2, 7), (10, 0), (13, 4), (40, 31)]
)
def test_mcnemar_matches_scipy_binomtest(lost: int, gained: int) -> None:
    """The exact McNemar p-values equal scipy's two-sided and one-sided binomial tests."""
    n = lost + gained
    two = binomtest(lost, n, 0.5, alternative="two-sided").pvalue
    one = binomtest(lost, n, 0.5, alternative="greater").pvalue
    assert mcnemar_exact_p(lost, gained) == pytest.approx(two, rel=1e-9)
    assert mcnemar_exact_p(lost, gained, "loss") == pytest.approx(one, rel=1e-9)


def test_mcnemar_no_discordant_and_bad_input() -> None:
    """No discordant pairs give p = 1; a negative count raises."""
    assert mcnemar_exact_p(0, 0) == 1.0
    with pytest.raises(ValueError, match=">= 0"):
        mcnemar_exact_p(-1, 2)


def _independent_tango(lost: int, gained: int, n: int, delta: float) -> float:
    """Score statistic with the restricted MLE found by numeric maximisation (not closed form)."""
    rest = n - lost - gained
    lo, hi = max(0.0, -delta) + 1e-12, (1.0 - delta) / 2.0 - 1e-12

    def negll(q: float) -> float:
        return -(
            lost * math.log(q + delta) + gained * math.log(q) + rest * math.log(1 - 2 * q - delta)
        )

    q = float(minimize_scalar(negll, bounds=(lo, hi), method="bounded", options={"xatol": 1e-12}).x)
    return (lost - gained - n * delta) / math.sqrt(n * (2 * q + delta - delta * delta))


@pytest.mark.parametrize(
    ("lost", "gained", "n", "delta"),
    [(25, 2, 428, 0.01), (25, 2, 428, 0.05), (5, 9, 100, -0.02), (3, 3, 50, 0.1), (8, 1, 30, 0.2)],
)
def test_tango_statistic_matches_numeric_restricted_mle(
    lost: int, gained: int, n: int, delta: float
) -> None:
    """The Tango score statistic equals one computed with a numeric restricted MLE."""
    got = tango_score_statistic(lost, gained, n, delta)
    assert got == pytest.approx(_independent_tango(lost, gained, n, delta), rel=1e-5, abs=1e-6)


def test_tango_ci_bounds_invert_the_score_test() -> None:
    """The Tango CI bounds are where the score statistic equals +-z."""
    c = PairedCounts(354, 25, 2, 47)
    ci = net_loss_ci(c, 0.95)
    z = norm.ppf(0.975)
    assert ci.lower < net_loss_ratio(c) < ci.upper
    assert _independent_tango(25, 2, 428, ci.lower) == pytest.approx(z, abs=1e-4)
    assert _independent_tango(25, 2, 428, ci.upper) == pytest.approx(-z, abs=1e-4)


def test_tango_ci_symmetric_and_edges() -> None:
    """The Tango CI is symmetric for equal lost and gained, capped at 1, and NaN with no pairs."""
    sym = net_loss_ci(PairedCounts(50, 5, 5, 40))
    assert sym.lower == pytest.approx(-sym.upper, abs=1e-9)
    assert net_loss_ci(PairedCounts(0, 10, 0, 0)).upper == 1.0
    empty = net_loss_ci(PairedCounts(0, 0, 0, 0))
    assert math.isnan(empty.lower)
    assert math.isnan(empty.upper)


def test_tango_ci_coverage_by_simulation() -> None:
    """The 95% Tango CI covers the true net loss about 95% of the time in simulation."""
    # Cell probabilities: lost 0.04, gained 0.02 -> true net loss 0.02; n = 300, 400 draws.
    rng = np.random.default_rng(7)
    probs = [0.80, 0.04, 0.02, 0.14]
    draws = rng.multinomial(300, probs, size=400)
    covered = sum(
        net_loss_ci(PairedCounts(int(a), int(b), int(c), int(d))).lower
        <= 0.02
        <= net_loss_ci(PairedCounts(int(a), int(b), int(c), int(d))).upper
        for a, b, c, d in draws
    )
    # Nominal 95%: 400 draws give sd ~ 1.1 points; allow a wide band.
    assert 0.91 <= covered / 400 <= 0.99


def test_non_inferiority_consistent_with_upper_bound() -> None:
    """Non-inferiority passes exactly when the one-sided upper bound is below the margin."""
    clear_loss = non_inferiority_test(PairedCounts(354, 25, 2, 47), margin=0.01)
    assert not clear_loss.passed
    assert clear_loss.upper_bound > 0.01
    # 2,000 pairs, 30 lost 30 gained: net 0, upper bound well below a 2-point margin.
    fine = non_inferiority_test(PairedCounts(1700, 30, 30, 240), margin=0.02, alpha=0.05)
    assert fine.passed
    assert fine.upper_bound < 0.02
    assert fine.p_value == pytest.approx(norm.cdf(tango_score_statistic(30, 30, 2000, 0.02)))
    # Same counts, tight margin: the one-sided 95% upper bound exceeds 0.003.
    tight = non_inferiority_test(PairedCounts(1700, 30, 30, 240), margin=0.003)
    assert not tight.passed
    assert tight.upper_bound > 0.003
    assert not non_inferiority_test(PairedCounts(0, 0, 0, 0), margin=0.01).passed


def test_excess_flip() -> None:
    """excess_flip gives both flip ratios, their difference and the one-sided binomial p-value."""
    f = FlipCounts(fly_only=30, noise_only=10, both=5, neither=955)
    r = excess_flip(f)
    assert r.fly_flip_ratio == pytest.approx(35 / 1000)
    assert r.noise_flip_ratio == pytest.approx(15 / 1000)
    assert r.excess_flip_ratio == pytest.approx(0.02)
    assert r.p_value == pytest.approx(binomtest(30, 40, 0.5, alternative="greater").pvalue)
    assert math.isnan(excess_flip(FlipCounts(0, 0, 0, 0)).excess_flip_ratio)


def test_power_reproduces_the_seed_numbers() -> None:
    """questions_needed reproduces the seed's sample sizes with its rounded z values."""
    assert questions_needed(0.02, 0.06) == 1175
    assert questions_needed(0.01, 0.06) == 4708
    assert questions_needed(0.02, 0.08) == 1568
    # The seed's own z values give the same; unrounded quantiles move 4,708 to 4,707.
    assert questions_needed_z(0.01, 0.06, 1.96, 0.8416) == 4708
    assert questions_needed(0.01, 0.06, z_decimals=None) == 4707
    assert z_quantile(0.975) == 1.96
    assert z_quantile(0.8) == 0.8416


def test_power_by_hand_and_errors() -> None:
    """questions_needed equals Connor's formula by hand, is smaller one-sided, and rejects
    discordant < net loss."""
    # δ = 0.1, ψ = 0.2, z = 1.96 / 0.8416: (1.96*sqrt(.2) + .8416*sqrt(.19))^2 / .01
    by_hand = (1.96 * math.sqrt(0.2) + 0.8416 * math.sqrt(0.19)) ** 2 / 0.01
    assert questions_needed(0.1, 0.2) == math.ceil(by_hand)
    assert questions_needed(0.02, 0.06, two_sided=False) < 1175
    with pytest.raises(ValueError, match="discordant"):
        questions_needed(0.1, 0.05)


#: scipy.special's ufuncs against scipy.stats' distributions: the same C code today, but reached
#: through other wrappers, so agreement is asked to 1e-12 relative (a few ulps), not bit for bit.
SCIPY_REL = 1e-12


def test_exact_tails_and_normal_equal_scipy_stats() -> None:
    """The McNemar tails, the Tango interval's z and the power z come from scipy.special (the
    report does not import scipy.stats); they equal what scipy.stats.binom/norm return, within
    SCIPY_REL, over every (lost, gained) with up to 120 discordant pairs and a few large ones."""
    from scipy.stats import binom

    cases = [(lo, ga) for n in range(1, 121) for lo in range(n + 1) for ga in [n - lo]]
    cases += [(5_000, 4_900), (70_000, 69_000), (0, 90_000), (90_000, 0)]
    for lost, gained in cases:
        n = lost + gained
        two = float(min(1.0, 2.0 * binom.cdf(min(lost, gained), n, 0.5)))
        assert mcnemar_exact_p(lost, gained, "two-sided") == pytest.approx(two, rel=SCIPY_REL)
        loss = float(binom.sf(lost - 1, n, 0.5))
        assert mcnemar_exact_p(lost, gained, "loss") == pytest.approx(loss, rel=SCIPY_REL)
    for p in (0.5, 0.8, 0.9, 0.95, 0.975, 0.995, 1e-9):
        want = float(norm.ppf(p))
        assert z_quantile(p, decimals=None) == pytest.approx(want, rel=SCIPY_REL, abs=1e-300)
    for c in (PairedCounts(900, 60, 40, 0), PairedCounts(10, 0, 30, 0), PairedCounts(50, 45, 5, 0)):
        t = tango_score_statistic(c.lost, c.gained, c.n, 0.01)
        want = float(norm.cdf(t))
        assert non_inferiority_test(c, margin=0.01).p_value == pytest.approx(want, rel=SCIPY_REL)
