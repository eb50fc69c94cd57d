"""Alert state on disk: the JSON round trip, what ``load`` refuses, the atomic write."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specwatch.alerts.alert import Alert, Severity, alert_key
from specwatch.alerts.saved import SavedAlerts, dump, load, read_text, write_atomic

DOWN = Alert(
    "SpecwatchTargetDown",
    Severity.CRITICAL,
    "target standard is down",
    "scrapes fail",
    {"target": "standard"},
)


def test_round_trip_keeps_timers_alerts_and_start_times(tmp_path: Path) -> None:
    """What is written is read back field for field: since 1000.5, startsAt 1020.25."""
    key = alert_key(DOWN.identity())
    saved = SavedAlerts(1030.0, {key: 1000.5}, ((DOWN, 1020.25),))
    path = tmp_path / "alerts.json"
    write_atomic(path, dump(saved))
    assert not (tmp_path / "alerts.json.tmp").exists()
    text = read_text(path)
    assert text is not None
    back = load(text)
    assert back == saved
    assert json.loads(text)["pending"] == [
        {
            "labels": {
                "alertname": "SpecwatchTargetDown",
                "severity": "critical",
                "target": "standard",
            },
            "since": 1000.5,
        }
    ]
    assert read_text(tmp_path / "missing.json") is None


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{not json", "Expecting"),
        ('{"version": 2, "written_at": 1, "pending": [], "active": []}', "version 1"),
        ('{"version": 1, "written_at": 1, "pending": {}, "active": []}', "must be lists"),
        (
            '{"version": 1, "written_at": 1, "active": [],'
            ' "pending": [{"labels": {"a": "b"}, "since": "soon"}]}',
            "since must be a finite number",
        ),
        ('{"version": 1, "written_at": NaN, "pending": [], "active": []}', "written_at"),
        (
            '{"version": 1, "written_at": 1, "pending": [], "active": [{"alertname": "X",'
            ' "severity": "loud", "summary": "", "description": "", "labels": {},'
            ' "runbook_url": "", "starts_at": 1}]}',
            "loud",
        ),
        ("[" * 100_000 + "]" * 100_000, "nested too deep"),
    ],
)
def test_load_refuses_malformed_state(text: str, says: str) -> None:
    """Each malformed file is a ValueError naming what is wrong."""
    with pytest.raises(ValueError, match=says):
        load(text)
