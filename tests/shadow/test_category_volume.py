"""Category slots kept by volume (:class:`~specwatch.shadow.sample.CategoryBound` with a clock):
a newcomer takes the weakest kept slot only by the takeover rule, a flood of one-off categories
takes none and costs bounded memory. Values worked by hand from the decayed counts
``sum(exp((t_i - t_0) / window))``."""

from __future__ import annotations

import math

import pytest

from specwatch.shadow.sample import OTHER_CATEGORY, CategoryBound, Takeover
from tests.fakes import FakeMonotonicClock

RULE = Takeover(window_seconds=100.0, ratio=1.5, sustain_seconds=10.0, min_requests=3.0)


def test_a_newcomer_takes_the_weakest_slot_after_the_sustain_time() -> None:
    """Limit 2: ``a`` and ``b`` fill the slots with one request each at t=0. Five ``c`` requests
    at t=0 read as ``other``: the third reaches 3 (the ``min_requests`` floor; 1.5 x 1 for the
    weakest), so ``c`` beats the weakest from t=0; at t=10 (the sustain time) its sixth request
    takes the slot of ``a`` (the weakest by name among equals), which reads as ``other`` from
    then on. 6 requests folded, 1 slot changed hands."""
    clock = FakeMonotonicClock(0.0)
    bound = CategoryBound(2, mono_clock=clock, takeover=RULE, candidates=4)
    assert [bound("a"), bound("b")] == ["a", "b"]
    assert [bound("c") for _ in range(5)] == [OTHER_CATEGORY] * 5
    clock.advance(9.9)
    assert bound("c") == OTHER_CATEGORY
    clock.advance(0.1)
    assert bound("c") == "c"
    assert bound.kept == {"b", "c"}
    assert bound("a") == OTHER_CATEGORY
    assert bound.map("a") == OTHER_CATEGORY
    assert bound.map("c") == "c"
    assert (bound.overflowed, bound.demoted) == (7, 1)
    # c's decayed count at t=10: 7 requests, 5 at t=0 and 2 at t=9.9 and t=10
    assert bound.volume("c") == pytest.approx(
        (5 + math.exp(9.9 / 100) + math.exp(10 / 100)) * math.exp(-10 / 100)
    )


def test_beating_the_weakest_must_hold_at_every_request_of_the_sustain_time() -> None:
    """``c`` beats the weakest at t=0 (3 requests), then ``b`` grows to 10 at t=5, so ``c``'s
    next request (4 < 1.5 x 10) stops its run; at t=20 it has beaten nothing for 10 s and stays
    ``other``."""
    clock = FakeMonotonicClock(0.0)
    bound = CategoryBound(2, mono_clock=clock, takeover=RULE, candidates=4)
    bound("a")
    bound("b")
    for _ in range(3):
        bound("c")
    clock.advance(5.0)
    for _ in range(20):
        bound("a")
        bound("b")
    assert bound("c") == OTHER_CATEGORY
    clock.advance(15.0)
    assert bound("c") == OTHER_CATEGORY
    assert bound.kept == {"a", "b"}
    assert bound.demoted == 0


def test_a_flood_of_one_off_categories_takes_no_slot_and_a_real_one_still_gets_in() -> None:
    """``a`` and ``b`` keep 20 requests each at t=0; 10,000 one-off categories, one every 10 ms
    up to t=100, take no slot and leave at most 2 + 4 + 1 tracked entries. Then ``z`` at 10
    requests/s from t=100: it needs a sure count of 1.5 x 20 in t=0 units, 30 / e = 11.04
    requests at t~100, so from its 12th request (t=101.1) it beats ``a``; 10 s later (t=111.1)
    it holds ``a``'s slot."""
    clock = FakeMonotonicClock(0.0)
    bound = CategoryBound(2, mono_clock=clock, takeover=RULE, candidates=4)
    for _ in range(20):
        bound("a")
        bound("b")
    for i in range(10_000):
        assert bound(f"flood-{i}") == OTHER_CATEGORY
        clock.advance(0.01)
    assert bound.kept == {"a", "b"}
    assert len(bound._volume) <= 7
    taken_at = None
    for _ in range(200):
        if bound("z") == "z":
            taken_at = clock()
            break
        clock.advance(0.1)
    assert taken_at is not None
    assert 111.0 <= taken_at <= 111.2, taken_at
    assert bound.kept == {"b", "z"}
    assert len(bound._volume) <= 7


def test_without_a_clock_slots_are_first_come() -> None:
    """No clock: the first two categories keep their slots whatever the volume of a third."""
    bound = CategoryBound(2)
    bound("a")
    bound("b")
    assert [bound("c") for _ in range(1000)] == [OTHER_CATEGORY] * 1000
    assert bound.kept == {"a", "b"}
