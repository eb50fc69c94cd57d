"""Bucketed rolling windows (pure): sums worked out by hand on 10-second buckets.

Windows: ``30s`` (30 seconds) and ``all`` (unbounded). At ``now = 100`` the ``30s`` window's
first bucket is ``floor((100 - 30) / 10) = 7``, i.e. it holds times ``>= 70``.
"""

from __future__ import annotations

import pytest

from specwatch.shadow.windows import WindowedSums


def _sums(now: float = 100.0) -> WindowedSums[str, int]:
    return WindowedSums({"30s": 30.0, "all": None}, zero=0, now=now, bucket_seconds=10.0)


def test_add_reaches_the_windows_holding_its_bucket() -> None:
    """A value at 95 (bucket 9) is in both windows; one at 65 (bucket 6 < 7) only in ``all``;
    one at 70 (bucket 7, the first held) in both."""
    w = _sums()
    w.add(95.0, "a", 1)
    w.add(65.0, "a", 2)
    w.add(70.0, "b", 5)
    assert w.sums("30s") == {"a": 1, "b": 5}
    assert w.sums("all") == {"a": 3, "b": 5}
    assert w.first_bucket("30s") == 7
    assert w.first_bucket("all") is None
    assert w.horizon() == 70.0
    assert w.buckets_held() == 2  # buckets 7 and 9; bucket 6 was folded into ``all`` only


def test_advance_subtracts_whole_buckets_as_they_leave() -> None:
    """``a`` +1 at 95 (bucket 9), ``b`` +5 at 71 (bucket 7). At 105 the first bucket is
    floor(75/10) = 7: nothing leaves (71 < 75 is still counted: the edge is bucket-granular);
    at 110 it is 8: bucket 7 leaves (``b`` drops to 0 and disappears); at 130 it is 10: bucket 9
    leaves; ``all`` keeps everything."""
    w = _sums()
    w.add(95.0, "a", 1)
    w.add(71.0, "b", 5)
    assert w.advance(105.0) is False
    assert w.sums("30s") == {"a": 1, "b": 5}
    assert w.advance(110.0) is True
    assert w.sums("30s") == {"a": 1}
    assert w.buckets_held() == 1
    assert w.advance(129.9) is False  # first bucket floor(99.9/10) = 9: still held
    assert w.advance(130.0) is True
    assert w.sums("30s") == {}
    assert w.sums("all") == {"a": 1, "b": 5}
    assert w.buckets_held() == 0


def test_edge_matches_the_per_value_rule_on_bucket_boundaries() -> None:
    """With ``now - 30`` on a boundary (now = 100: 70) the window is exactly ``time >= 70``:
    69.999 is out, 70.0 is in."""
    w = _sums()
    w.add(69.999, "x", 1)
    w.add(70.0, "x", 10)
    assert w.sums("30s") == {"x": 10}
    assert w.sums("all") == {"x": 11}


def test_late_values_and_a_jump_over_many_buckets() -> None:
    """A value arriving late into an older held bucket (bucket 8 after bucket 9 exists) counts
    where its time says; a jump of an hour expires both buckets in one call."""
    w = _sums()
    w.add(99.0, "a", 1)
    w.add(81.0, "a", 2)
    assert w.sums("30s") == {"a": 3}
    assert w.advance(115.0) is False  # first bucket 8
    assert w.advance(120.0) is True  # first bucket 9: the late value at 81 leaves
    assert w.sums("30s") == {"a": 1}
    assert w.advance(3700.0) is True
    assert w.sums("30s") == {}
    assert w.sums("all") == {"a": 3}


def test_remove_bucket_takes_back_what_was_added() -> None:
    """Removing 2 of ``a``'s 3 in bucket 9 leaves 1 in both windows; removing from the pooled
    old bucket (``None``) changes only ``all``."""
    w = _sums()
    w.add(95.0, "a", 3)
    w.add_bucket(None, "a", 4)
    w.remove_bucket(9, "a", 2)
    assert w.sums("30s") == {"a": 1}
    assert w.sums("all") == {"a": 5}
    w.remove_bucket(None, "a", 4)
    assert w.sums("all") == {"a": 1}
    w.remove_bucket(9, "a", 1)
    assert w.sums("30s") == {}
    assert w.buckets_held() == 0


def test_time_never_moves_back() -> None:
    """A clock stepped back changes nothing (the values that left stay out)."""
    w = _sums()
    w.add(75.0, "a", 1)
    assert w.advance(120.0) is True
    assert w.advance(100.0) is False
    assert w.now == 120.0
    assert w.first_bucket("30s") == 9
    assert w.sums("30s") == {}


def test_bad_settings_raise() -> None:
    """A bucket width or a window of 0 seconds is refused; an unknown window is a KeyError."""
    with pytest.raises(ValueError, match="bucket_seconds"):
        WindowedSums({"a": 30.0}, zero=0, now=0.0, bucket_seconds=0.0)
    with pytest.raises(ValueError, match="window 'a'"):
        WindowedSums({"a": 0.0}, zero=0, now=0.0)
    with pytest.raises(KeyError):
        _sums().first_bucket("nope")
