"""The decision table's verdicts, gains and category bound, on tallies worked out by hand."""

from __future__ import annotations

from typing import Any

import pytest

from specwatch.shadow.decision import (
    NO_ACCEPTANCE,
    OTHER,
    ReplyCounts,
    bound_categories,
    decision_row,
    decision_table,
)
from specwatch.shadow.summary import Levels
from specwatch.shadow.tally import ArmTotals, PairTally
from tests.shadow.stats.eprocess_reference import count_form

KW: dict[str, Any] = {"levels": Levels(alpha=0.05, margin=0.01, detect_net_loss=0.02)}

#: 20 pairs, FLy twice the standard arm's tokens per second: 200 tokens in 10 s vs 200 in 5 s.
FAST = ArmTotals(
    speed_pairs=20, standard_tokens=200, fly_tokens=200, standard_seconds=10.0, fly_seconds=5.0
)
#: The same tokens, FLy slower: 200 tokens in 10 s vs 200 in 12.5 s.
SLOW = ArmTotals(
    speed_pairs=20, standard_tokens=200, fly_tokens=200, standard_seconds=10.0, fly_seconds=12.5
)


def _labelled(both_correct: int, lost: int, gained: int) -> PairTally:
    n = both_correct + lost + gained
    return PairTally(both_correct=both_correct, lost=lost, gained=gained, agree=n)


def test_costs_quality_when_the_e_value_crosses() -> None:
    """30 lost, 0 gained of 100: the mixture e-value is far above 20, whatever the speed."""
    row = decision_row("math", _labelled(70, 30, 0), FAST, **KW)
    assert row.verdict == "costs_quality"
    assert row.verdict_text == "FLy costs quality here"
    assert row.e_value >= 20
    assert row.net_loss_ratio == 0.3
    assert row.pairs_more is None


def test_pays_when_non_inferior_and_faster() -> None:
    """5,000 labelled pairs without a flip: net loss 0 with an upper bound below 1 point, and
    FLy at 40 tokens/s against 20 (gain 1.0)."""
    row = decision_row("chat", _labelled(5000, 0, 0), FAST, **KW)
    assert row.throughput_gain_ratio == 1.0
    assert row.ci_upper < 0.01
    assert row.verdict == "pays"
    assert row.verdict_text == "FLy pays here"


def test_not_faster_when_non_inferior_but_slower() -> None:
    """Non-inferior as above but FLy at 16 tokens/s against 20: gain -0.2, not faster."""
    row = decision_row("chat", _labelled(5000, 0, 0), SLOW, **KW)
    assert row.throughput_gain_ratio == pytest.approx(-0.2)
    assert row.verdict == "not_faster"
    assert row.verdict_text == "FLy is not faster here"


def test_not_decided_gives_the_pairs_still_needed() -> None:
    """12 lost, 8 gained of 300: observed loss L = 4/300 is above the 1-point margin, so the
    loss is the question to decide; the forecast is the first k at which the no-net-loss
    e-value of the counts plus k pairs at the observed shares (4 % lost, 2.67 % gained) reaches
    the overall page bound 30, found here by a plain scan over the plain-Python reading of the
    e-value: 3,649."""
    k = 0
    while count_form(12 + k * 12 / 300, 8 + k * 8 / 300) < 30.0:
        k += 1
    assert k == 3649
    row = decision_row("code", _labelled(280, 12, 8), FAST, **KW)
    assert row.verdict == "not_decided"
    assert row.pairs_more == k
    assert row.verdict_text == f"not decided: about {k} more pairs"


def test_too_few_pairs_is_not_a_verdict() -> None:
    """Below 30 labelled pairs the row says "too few pairs", however the counts look."""
    row = decision_row("code", _labelled(8, 1, 1), FAST, **KW)
    assert row.verdict == "not_decided"
    assert row.verdict_text == "not decided: too few pairs (10 labelled, need 30)"


def test_speed_needs_five_pairs_and_tau_needs_replies() -> None:
    """Below 5 speed pairs the gain is None with a reason; τ gain is the difference of the
    summed τ: standard 1 + 10/10 = 2.0, FLy 1 + 25/10 = 3.5."""
    totals = ArmTotals(
        tau_pairs=4,
        standard_steps=10,
        standard_accepted=10,
        fly_steps=10,
        fly_accepted=25,
        speed_pairs=4,
        standard_tokens=40,
        fly_tokens=40,
        standard_seconds=1.0,
        fly_seconds=1.0,
    )
    row = decision_row("x", _labelled(10, 0, 0), totals, **KW)
    assert row.tau_gain == 1.5
    assert row.throughput_gain_ratio is None
    assert row.throughput_gain_reason == "4 pairs with tokens and latency (need 5)"
    none = decision_row("x", _labelled(10, 0, 0), ArmTotals(), **KW)
    assert none.tau_gain is None
    assert none.tau_gain_reason is not None


def test_categories_beyond_the_bound_are_pooled_as_other() -> None:
    """With 2 categories kept, the two busiest keep their names; the rest pool into `other`,
    whose counts are the sums; the overall row counts everything. Given the live bound's kept
    set, exactly those keep their names."""
    tallies = {
        "a": PairTally(agree=50),
        "b": PairTally(agree=30),
        "c": PairTally(agree=10),
        "d": PairTally(agree=5, disagree=5),
    }
    assert bound_categories(tallies, 2) == {"a": "a", "b": "b", "c": OTHER, "d": OTHER}
    rows = decision_table(tallies, {}, max_categories=2, **KW)
    assert [r.category for r in rows] == ["a", "b", OTHER, "_all"]
    assert [r.pairs for r in rows] == [50, 30, 20, 100]
    assert rows[2].fly_flip_ratio == 0.25
    # the live bound's kept set wins over volume
    assert bound_categories(tallies, 2, kept={"c"}) == {
        "a": OTHER,
        "b": OTHER,
        "c": "c",
        "d": OTHER,
    }
    with pytest.raises(ValueError, match="max_categories"):
        bound_categories(tallies, -1)


def test_acceptance_and_tau_gain_from_reply_counts() -> None:
    """Reply counts: standard 20 of 40 drafts accepted over 10 verify steps (α 0.5, τ 3.0),
    FLy 30 of 40 (α 0.75, τ 4.0): acceptance gain 0.25 and, with no per-pair τ in the
    ledger, τ gain 1.0. Category b (10 of 40 on both arms) pools into `other` with c, which
    has no replies; the overall row sums every category: α 30/80 vs 40/80."""
    replies = {
        ("standard", "a"): ReplyCounts(10, 40, 20),
        ("fly", "a"): ReplyCounts(10, 40, 30),
        ("standard", "b"): ReplyCounts(10, 40, 10),
        ("fly", "b"): ReplyCounts(10, 40, 10),
    }
    tallies = {"a": PairTally(agree=9), "b": PairTally(agree=5), "c": PairTally(agree=1)}
    rows = decision_table(tallies, {}, max_categories=1, replies=replies, **KW)
    by = {r.category: r for r in rows}
    assert by["a"].acceptance_gain == pytest.approx(0.25)
    assert by["a"].tau_gain == pytest.approx(1.0)
    assert by["a"].acceptance_gain_reason is None
    assert by[OTHER].acceptance_gain == pytest.approx(0.0)
    assert by["_all"].acceptance_gain == pytest.approx(40 / 80 - 30 / 80)
    none = decision_table({"c": PairTally(agree=1)}, {}, replies=replies, **KW)[0]
    assert none.acceptance_gain is None
    assert none.acceptance_gain_reason == NO_ACCEPTANCE
