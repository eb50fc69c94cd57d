"""The one verdict sentence: words, points, the e-value as the decision signal."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from specwatch.shadow.stats.confseq import within_margin_log_e_value
from specwatch.shadow.verdict import (
    Verdict,
    e_value_text,
    more_pairs_needed,
    per_request_speed_ratio,
    verdict_line,
)


def test_the_worked_example_reads_in_points_and_percent() -> None:
    """351 labelled pairs, net loss 0.035 (CI 0.007..0.065), e-value 8.27, α 0.05, margin 0.01,
    4 % discordant. Under the observed effect the loss is the question: Connor one-sided for
    δ = 0.035 at ψ = 0.04 is ceil((1.6449·0.2 + 0.8416·√(0.04 - 0.035²))² / 0.035²) = 200
    pairs, already there, so no "more pairs"; τ 1.13 → +13 %, speed per request 1.09 → +9 %."""
    v = Verdict(
        tau_ratio=1.13,
        throughput_ratio=1.09,
        n=351,
        net_loss=0.035,
        ci_lower=0.007,
        ci_upper=0.065,
        ci_level=0.95,
        e_value=8.27,
        alpha=0.05,
        margin=0.01,
        discordant=0.04,
    )
    assert more_pairs_needed(v) == 0
    assert verdict_line(v) == (
        "FLy: τ +13 %, speed per request +9 %, net loss 3.5 pts (95 % CI, one-look 0.7 to 6.5) "
        "on 351 labelled pairs; e-value 8.3 of 30 needed; net loss not yet shown"
    )


def test_more_pairs_under_the_observed_effect() -> None:
    """Net loss 0.2 pts at 4 % discordance on 351 pairs: "within 1 pt" is the only question
    (no loss to show); the forecast is the first k at which the confidence sequence's e-value
    for "net loss >= 1 pt", on the counts plus k pairs at the observed shares (2.1 % lost,
    1.9 % gained, 96 % agreeing), reaches 1/alpha = 20: found here by a plain scan, 5,793,
    said as "about 5,800"."""
    v = Verdict(n=351, net_loss=0.002, ci_lower=-0.02, ci_upper=0.024, e_value=0.5, discordant=0.04)
    lost, gained = 351 * 0.021, 351 * 0.019
    k = 0
    while within_margin_log_e_value(
        lost + k * 0.021, gained + k * 0.019, 351 - lost - gained + k * 0.96, 0.01
    ) < math.log(20.0):
        k += 1
    assert k == 5793
    assert more_pairs_needed(v) == k
    assert verdict_line(v).endswith("not yet shown within 1 pt: about 5,800 more pairs")


def test_alarm_gain_and_non_inferiority_endings() -> None:
    """The e-value at or above the overall page's bound (1/(α x 2/3) = 30) ends with "net loss
    shown"; a declared "within margin" with "shown within 1 pt over pairs 1-N (confidence
    sequence)"; a negative net loss is a net gain in points."""
    base = Verdict(n=1000, net_loss=0.02, ci_lower=0.01, ci_upper=0.03, e_value=30.0)
    assert verdict_line(base).endswith(
        "e-value 30 of 30 needed; net loss shown (e-value reached the threshold)"
    )
    below = Verdict(n=1000, net_loss=0.02, ci_lower=0.01, ci_upper=0.03, e_value=29.0)
    assert verdict_line(below).endswith("e-value 29 of 30 needed; net loss not yet shown")
    gain = Verdict(
        n=2000, net_loss=-0.004, ci_lower=-0.01, ci_upper=0.002, e_value=0.1, non_inferior=True
    )
    assert verdict_line(gain) == (
        "FLy: net gain 0.4 pts (95 % CI, one-look -0.2 to 1.0) on 2,000 labelled pairs; "
        "e-value 0.1 of 30 needed; shown within 1 pt over pairs 1-2,000 (confidence sequence)"
    )


def test_sign_off_names_its_pairs_and_never_stands_beside_a_contradiction() -> None:
    """The quiet-then-loss file: "within 1 pt" was declared at pair 1,200; later pairs moved the
    interval to 1.2-2.4 pts, above the margin: the sentence says which pairs the sign-off is
    about and that it does not hold for later pairs; once the e-value reaches the page's bound
    the sentence is "net loss shown" and no sign-off stands beside it."""
    later = Verdict(
        n=4500, net_loss=0.018, ci_lower=0.012, ci_upper=0.024, e_value=12.0,
        non_inferior=True, declared_at=1200,
    )  # fmt: skip
    assert verdict_line(later).endswith(
        "shown within 1 pt over pairs 1-1,200 (confidence sequence); the interval now lies "
        "above 1 pt: not signed off for later pairs"
    )
    alarmed = replace(later, e_value=41.0)
    line = verdict_line(alarmed)
    assert line.endswith("net loss shown (e-value reached the threshold)")
    assert "within" not in line


def test_fly_ahead_interval_contains_the_printed_gain() -> None:
    """FLy ahead by 5.3 pts with the loss interval -11.7..0.5 (the case that printed "net gain
    5.3 pts (95 % CI -11.7 to 0.5)"): the gain is printed with the gain's interval, -0.5 to
    11.7, which contains 5.3."""
    v = Verdict(n=300, net_loss=-0.053, ci_lower=-0.117, ci_upper=0.005, e_value=0.01)
    line = verdict_line(v)
    assert "net gain 5.3 pts (95 % CI, one-look -0.5 to 11.7)" in line


def test_too_few_pairs_guard() -> None:
    """One labelled pair (it printed "net loss 100.0 pts ... about 62,000 more pairs") and 29
    pairs give "too few pairs" and no conclusion; 30 pairs give a verdict."""
    one = Verdict(n=1, net_loss=1.0, ci_lower=0.2, ci_upper=1.0, e_value=2.0, discordant=1.0)
    assert verdict_line(one) == "FLy: too few pairs: 1 labelled pair, a verdict needs 30"
    few = Verdict(n=29, net_loss=0.0, ci_lower=-0.1, ci_upper=0.1, e_value=0.5, discordant=0.1)
    assert "too few pairs" in verdict_line(few)
    enough = Verdict(n=30, net_loss=0.0, ci_lower=-0.1, ci_upper=0.1, e_value=0.5, discordant=0.1)
    assert "too few pairs" not in verdict_line(enough)


def test_no_pairs_and_number_formats() -> None:
    """Without labelled pairs the sentence says quality is unknown; e-values keep two digits
    below 10, whole numbers below 1000, exponent form above."""
    assert verdict_line(Verdict(tau_ratio=0.95)) == (
        "FLy: τ -5 %, no labelled pairs yet (quality unknown)"
    )
    assert [e_value_text(x) for x in (0.5, 8.27, 123.4, 45678.0, math.inf)] == [
        "0.5",
        "8.3",
        "123",
        "4.6e+04",
        "inf",
    ]


def test_per_request_speed_ignores_the_share_of_traffic() -> None:
    """Standard: τ 3.0 tokens per step, median step gap 0.060 s (50 tok/s per request); FLy:
    τ 3.6, gap 0.060 s (60 tok/s): 1.2× per request, however many requests each server runs."""
    assert per_request_speed_ratio(3.6, 0.060, 3.0, 0.060) == pytest.approx(1.2, rel=1e-12)
    assert per_request_speed_ratio(3.6, 0.0, 3.0, 0.060) is None
    assert per_request_speed_ratio(None, 0.060, 3.0, 0.060) is None
