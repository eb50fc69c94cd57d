"""``for`` timers across a restart: :meth:`ForTracker.export` / :meth:`ForTracker.restore`."""

from __future__ import annotations

from specwatch.alerts.alert import Alert, Severity, alert_key
from specwatch.alerts.pending import ForTracker

DOWN = Alert("SpecwatchTargetDown", Severity.CRITICAL, "down", "", {"target": "standard"})
KEY = alert_key(DOWN.identity())


def test_restored_timer_keeps_its_start() -> None:
    """Held since 100 with for=10: after a restart at 105 it fires at 110, not at 115."""
    before = ForTracker(lambda a: 10.0)
    assert before.update([DOWN], 100.0) == []
    saved = before.export()
    assert saved == {KEY: 100.0}
    after = ForTracker(lambda a: 10.0)
    after.restore(saved, hold_until=200.0)
    assert after.update([DOWN], 105.0) == []
    assert after.update([DOWN], 110.0) == [DOWN]


def test_restored_timer_held_until_the_grace_ends() -> None:
    """Missing from updates before hold_until (200), the timer stays; after it, a miss drops it
    and the next candidate starts over (fires only 10 s later)."""
    t = ForTracker(lambda a: 10.0)
    t.restore({KEY: 100.0}, hold_until=200.0)
    assert t.update([], 150.0) == []
    assert t.export() == {KEY: 100.0}
    assert t.update([DOWN], 160.0) == [DOWN]  # seen again: an ordinary timer from now on
    assert t.update([], 170.0) == []
    assert t.export() == {}  # an ordinary miss drops it even inside the grace

    t2 = ForTracker(lambda a: 10.0)
    t2.restore({KEY: 100.0}, hold_until=200.0)
    assert t2.update([], 210.0) == []
    assert t2.export() == {}
    assert t2.update([DOWN], 211.0) == []
    assert t2.update([DOWN], 221.0) == [DOWN]
