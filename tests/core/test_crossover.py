"""The crossover with an interval: noise-free shapes whose answer is worked out by hand (a step,
a dip that pays again, arms at different running counts within a level), the one-level interval
against scipy's Welch interval, coverage on the issue's constructed series, and the guards."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from scipy.stats import ttest_ind

from specwatch.core.crossover import crossover

Points = list[tuple[float, float]]


def _base(r: float) -> float:
    """The reference arm's per-request speed at ``r`` running (tokens/s)."""
    return 100.0 / (1.0 + r / 40.0)


def _exact(
    levels: list[float], ratio: Callable[[float], float], k: int = 3
) -> tuple[Points, Points]:
    """Noise-free arms: ``k`` scrapes per level, the candidate at ``ratio(r)`` × the reference."""
    cand = [(r, _base(r) * ratio(r)) for r in levels for _ in range(k)]
    ref = [(r, _base(r)) for r in levels for _ in range(k)]
    return cand, ref


def _noisy(
    rng: np.random.Generator, ratio: Callable[[float], float], noise: float, per_level: int = 4
) -> tuple[Points, Points]:
    """The issue's series: 16 levels spaced evenly in log from 1 to 128, ``per_level`` scrapes
    per level and arm, each speed × exp(noise · z)."""
    rs = np.repeat(np.geomspace(1.0, 128.0, 16), per_level)
    z = rng.standard_normal((2, rs.size))
    pairs = list(zip(rs.tolist(), z[0].tolist(), z[1].tolist(), strict=True))
    cand = [(r, _base(r) * ratio(r) * math.exp(noise * a)) for r, a, _ in pairs]
    ref = [(r, _base(r) * math.exp(noise * b)) for r, _, b in pairs]
    return cand, ref


def test_noiseless_step_reads_between_the_levels_around_it() -> None:
    """Ratio 1.2 below 10 running, 0.9 from 10, at levels 1, 2, …, 32 without noise: paying is
    shown up to 8, not paying from 16, so the interval is 8 to 16; the estimate interpolates
    the log ratio ln 1.2 → ln 0.9 in log(running): 8 · 2^(ln 1.2 / ln(1.2/0.9)) = 12.41."""
    cand, ref = _exact([1, 2, 4, 8, 16, 32], lambda r: 1.2 if r < 10 else 0.9)
    c = crossover(cand, ref, rng=np.random.default_rng(0))
    assert c.status == "reached"
    assert c.lower == pytest.approx(8.0)
    assert c.upper == pytest.approx(16.0)
    assert c.running == pytest.approx(8 * 2 ** (math.log(1.2) / math.log(1.2 / 0.9)), rel=1e-9)
    assert c.pays_again is None
    assert [round(g.gain, 9) for g in c.curve] == [0.2, 0.2, 0.2, 0.2, -0.1, -0.1]
    assert c.text == (
        "FLy vs standard speculation: stops paying from about 12 running requests (95 % "
        "interval 8-16); per-request decode speed at 32 running: -10.0 % (95 % interval "
        "-10.0 % to -10.0 %)"
    )


def test_a_dip_gives_the_first_crossing_and_says_it_pays_again() -> None:
    """Ratio 1.2 at 1-4 running, 0.8 at 8 and 16, 1.2 again at 32 and 64 (not monotone): the
    first crossing, between 4 and 8 at 4 · 2^(ln 1.2 / ln 1.5) = 5.46, interval 4 to 8, and the
    sentence names 32 where it is shown paying again."""
    cand, ref = _exact([1, 2, 4, 8, 16, 32, 64], lambda r: 0.8 if 8 <= r <= 16 else 1.2)
    c = crossover(cand, ref, rng=np.random.default_rng(0))
    assert c.status == "reached"
    assert c.running == pytest.approx(4 * 2 ** (math.log(1.2) / math.log(1.5)), rel=1e-9)
    assert [c.lower, c.upper, c.pays_again] == pytest.approx([4.0, 8.0, 32.0])
    assert "shown paying again at 32 running" in c.text


def test_not_paying_from_the_lowest_level_has_no_lower_end() -> None:
    """Ratio exactly 1 at 1 running (neither shown paying nor not) and 0.9 from 2: the crossing
    may be at or below 1, so the interval has no lower end ("at most 2") and the estimate is
    the lowest level."""
    cand, ref = _exact([1, 2, 4], lambda r: 1.0 if r < 2 else 0.9)
    c = crossover(cand, ref, rng=np.random.default_rng(0))
    assert c.status == "reached"
    assert c.lower is None
    assert [c.running, c.upper] == pytest.approx([1.0, 2.0])
    assert "stops paying from about 1 running request (95 % interval: at most 2)" in c.text


def test_arms_at_different_running_counts_within_a_level_are_compared_at_one() -> None:
    """Within the level 4.76-5.66 the candidate runs at 4.8 and 5.0, the reference at 5.2 and
    5.6; both speeds fall as running^-0.5 (noise-free), the candidate at 1.3× below 6 and 0.8×
    from 6 (level 8). Comparing raw means would mix the slowdown into the gain; moved along the
    shared within-level slope (−0.5, exact here) the gains are exactly +30 % and −20 %."""

    def speed(r: float) -> float:
        return 100 / math.sqrt(r)

    cand = [(r, 1.3 * speed(r)) for r in (4.8, 5.0) * 4] + [
        (r, 0.8 * speed(r)) for r in (8.0, 9.0) * 4
    ]
    ref = [(r, speed(r)) for r in (5.2, 5.6) * 4] + [(r, speed(r)) for r in (8.5, 9.5) * 4]
    c = crossover(cand, ref, rng=np.random.default_rng(0))
    assert [g.gain for g in c.curve] == [
        pytest.approx(0.3, abs=1e-9),
        pytest.approx(-0.2, abs=1e-9),
    ]
    naive = (
        sum(math.log(1.3 * speed(r)) for r in (4.8, 5.0)) / 2
        - sum(math.log(speed(r)) for r in (5.2, 5.6)) / 2
    )
    assert math.expm1(naive) > 0.33  # what the raw means would have said


def test_one_level_interval_is_welchs() -> None:
    """With one level (m = 1) the interval of the log ratio is Welch's two-sample interval of
    the mean log speeds, as scipy computes it."""
    rng = np.random.default_rng(5)
    a = 4.0 + 0.1 * rng.standard_normal(8)
    b = 3.8 + 0.2 * rng.standard_normal(11)
    cand = [(3.0, math.exp(v)) for v in a]
    ref = [(3.0, math.exp(v)) for v in b]
    c = crossover(cand, ref, rng=np.random.default_rng(0))
    ci = ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    (g,) = c.curve
    assert math.log1p(g.lower) == pytest.approx(ci.low, rel=1e-9)
    assert math.log1p(g.upper) == pytest.approx(ci.high, rel=1e-9)
    assert math.log1p(g.gain) == pytest.approx(float(a.mean() - b.mean()), rel=1e-9)


@pytest.mark.parametrize(("slope_at", "truth"), [(1.3, 30.0), (1.2, 20.0)])
def test_linear_ratio_at_five_percent_noise_is_covered(slope_at: float, truth: float) -> None:
    """The issue's series (ratio a − 0.01 r, crossing at 100 (a − 1)), 5 % noise, 4 scrapes a
    level, 30 series: the interval contains the truth in at least 27 (it did in 3 and 15 of 30
    with the smoothed bootstrap), and the median estimate is within 10 % of it."""
    covered, estimates = 0, []
    for seed in range(30):
        cand, ref = _noisy(np.random.default_rng(seed), lambda r: slope_at - 0.01 * r, 0.05)
        c = crossover(cand, ref, rng=np.random.default_rng(seed))
        assert c.status == "reached"
        assert c.running is not None
        assert c.upper is not None
        covered += (c.lower or 0.0) <= truth <= c.upper
        estimates.append(c.running)
    assert covered >= 27
    assert abs(float(np.median(estimates)) / truth - 1) <= 0.10


def test_flat_gain_of_ten_percent_is_not_reached() -> None:
    """A true gain of +10 % at every level, 15 % noise, 4 scrapes a level: "not reached" in at
    least 19 of 20 series (the simultaneous intervals wrongly show a level not paying with
    probability at most 2.5 %)."""
    not_reached = 0
    for seed in range(20):
        cand, ref = _noisy(np.random.default_rng(100 + seed), lambda r: 1.1, 0.15)
        c = crossover(cand, ref, rng=np.random.default_rng(seed))
        not_reached += c.status == "not_reached"
        if c.status == "not_reached":
            top = c.curve[-1]
            assert c.text.startswith(
                "FLy vs standard speculation: not reached within the observed range (highest "
                f"concurrency seen: 128); per-request decode speed at 128 running: "
                f"{100 * top.gain:+.1f} %"
            )
    assert not_reached >= 19


def test_noise_that_grows_at_low_concurrency_does_not_fake_a_crossing() -> None:
    """A true gain of +10 % everywhere, noise 10 % · √(16/r) (40 % at 1 running, 3.5 % at 128:
    a per-request speed averaged over few requests scatters more), 4 scrapes a level: "not
    reached" in at least 19 of 20 series. One variance pooled over the levels would make the
    noisy low levels' intervals too narrow (it said "reached" at 1 running in 14 of 100 in
    the bench)."""
    not_reached = 0
    for seed in range(20):
        rng = np.random.default_rng(300 + seed)
        rs = np.repeat(np.geomspace(1.0, 128.0, 16), 4).tolist()
        cand = [(r, 110 * math.exp(0.1 * math.sqrt(16 / r) * rng.standard_normal())) for r in rs]
        ref = [(r, 100 * math.exp(0.1 * math.sqrt(16 / r) * rng.standard_normal())) for r in rs]
        c = crossover(cand, ref, rng=np.random.default_rng(seed))
        not_reached += c.status == "not_reached"
    assert not_reached >= 19


def test_deterministic_and_guards() -> None:
    """The answer does not depend on ``rng``; fewer than 8 points on an arm, arms seen at no
    common concurrency, or no repeated scrape within a level on an arm give no data with the
    reason."""
    cand, ref = _noisy(np.random.default_rng(7), lambda r: 1.3 - 0.01 * r, 0.1)
    assert crossover(cand, ref, rng=np.random.default_rng(3)) == crossover(
        cand, ref, rng=np.random.default_rng(4)
    )
    few = crossover(cand[:7], ref, rng=np.random.default_rng(0))
    assert few.status == "no_data"
    assert few.text == (
        "FLy vs standard speculation: not enough data: 7 points for FLy, 64 for standard "
        "speculation (need 8 each)"
    )
    apart = crossover([(1.0, 10.0)] * 8, [(50.0, 5.0)] * 8, rng=np.random.default_rng(0))
    assert apart.status == "no_data"
    assert "no common concurrency" in apart.text
    single = [(float(2**i), 10.0) for i in range(8)]
    lonely = crossover(single, single, rng=np.random.default_rng(0))
    assert lonely.status == "no_data"
    assert "repeated points" in lonely.text
