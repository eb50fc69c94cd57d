"""The runbook's "From evidence to page" table gives every alert's true ``for`` and delay."""

from __future__ import annotations

import re

from specwatch.alerts.alert import Alert, Severity
from specwatch.alerts.pending import for_seconds
from specwatch.alerts.settings import AlertingSettings, DetectSettings
from tests.fakes import REPO

ROW = re.compile(r"^\| `(\w+)` \| `detect\.(\w+)` \| ([\d,]+) s \| ([\d,]+) s \|$", re.M)


def test_every_alert_has_its_for_and_time_to_page_in_the_runbook() -> None:
    """Each row's ``for`` is the detector's (``for_seconds`` of that alert name, default
    settings) and the time to page is that plus one 15 s evaluation interval; every alert
    the detectors give a ``for`` is in the table (SpecQualityDrift included)."""
    text = (REPO / "docs/runbook.md").read_text(encoding="utf-8")
    rows = ROW.findall(text)
    detect, interval = DetectSettings(), AlertingSettings().evaluation_interval
    get = for_seconds(detect)
    for name, setting, for_s, page_s in rows:
        alert = Alert(name, Severity.WARNING, "", "", {})
        assert get(alert) == getattr(detect, setting) == float(for_s.replace(",", "")), name
        assert float(page_s.replace(",", "")) == get(alert) + interval, name
    names = {r[0] for r in rows}
    fors = {f for f in DetectSettings.model_fields if f.endswith("_for")}
    assert {r[1] for r in rows} == fors
    assert "SpecQualityDrift" in names
    assert "SpecLosslessFlips" in names
