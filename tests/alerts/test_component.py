"""The alerting component inside specwatch's app without any Alertmanager configured: detectors
still run, ``specwatch_alert_firing`` and ``/api/v1/snapshot``'s ``alerts`` show what fires, and
nothing is sent. Simulators in-process (no Debian tools needed)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specwatch.alerts.component import AlertingComponent, missing_windows
from specwatch.alerts.saved import SavedAlerts, load
from specwatch.alerts.settings import AlertingSettings, DetectSettings
from specwatch.core.logs import event_fields
from specwatch.observe.settings import TargetSettings
from specwatch.server.wiring import AlertingPlug, alerting_components
from specwatch.settings import Settings
from tests.e2e.stack import running_stack
from tests.fakes import FakeWallClock
from tests.fakes.wait import poll


def test_alerting_components_for_run() -> None:
    """``specwatch run`` gets one alerting plug whose detectors use the ``detect`` group."""
    settings = Settings(targets=(TargetSettings(name="fly", url="http://127.0.0.1:1"),))
    (plug,) = alerting_components(settings)
    assert isinstance(plug, AlertingPlug)
    assert plug.component.detector.settings == settings.detect


def test_missing_detector_windows_are_reported(caplog: pytest.LogCaptureFixture) -> None:
    """Default windows (1m 5m 15m) hold every detector window except the 1h baselines, which
    fall back to since_start; a short window of 3s is reported (logged once at start-up)."""
    assert missing_windows(DetectSettings(), ("1m", "5m", "15m")) == {}
    detect = DetectSettings(acceptance_short_window="3s")
    assert missing_windows(detect, ("1m", "5m", "15m")) == {"acceptance_short_window": "3s"}
    target = TargetSettings(name="fly", url="http://127.0.0.1:1")
    with caplog.at_level(logging.WARNING, logger="specwatch.alerts.alertmanager"):
        settings = Settings(targets=(target,), detect=detect)
        AlertingComponent(
            settings.detect, settings.alerting, settings.windows, inputs=lambda: (None, None)
        )
    (record,) = caplog.records
    assert event_fields(record)["missing"] == {"acceptance_short_window": "3s"}


async def test_gauges_and_snapshot_without_alertmanager() -> None:
    """A down target fires SpecwatchTargetDown in the gauge and the snapshot, then resolves."""
    async with running_stack(
        alerting=AlertingSettings(evaluation_interval=0.2),
        detect=DetectSettings(target_down_for=0.0),
    ) as stack:

        async def families() -> dict[str, Any]:
            async with stack.session.get(f"{stack.specwatch_url}/metrics") as resp:
                text = await resp.text()
            return {f.name: f for f in text_string_to_metric_families(text)}

        quiet = await families()
        assert quiet["specwatch_alert_firing"].samples == []
        assert quiet["specwatch_alertmanager_outbox_depth"].samples == []  # no peer configured
        assert (await stack.snapshot())["alerts"] == []

        await stack.fault(stack.fly, {"metrics_mode": "error"})

        async def firing() -> list[dict[str, str]] | None:
            samples = (await families())["specwatch_alert_firing"].samples
            return [dict(s.labels) for s in samples] or None

        labels = await poll("specwatch_alert_firing for the down target", firing)
        assert labels == [
            {
                "alertname": "SpecwatchTargetDown",
                "severity": "warning",
                "target": "fly",
                "role": "fly",
            }
        ]
        doc = await stack.snapshot()
        assert [a["labels"] for a in doc["alerts"]] == labels
        assert doc["alerts"][0]["state"] == "firing"
        assert (await families())["specwatch_alertmanager_send_errors"].samples == []

        await stack.fault(stack.fly, None)

        async def resolved() -> bool | None:
            return True if (await stack.snapshot())["alerts"] == [] else None

        await poll("alert resolved", resolved)
        assert stack.component.state.firing == ()


@pytest.mark.parametrize(
    ("content", "written_at", "reason"),
    [
        ("{broken", None, "corrupt"),
        ('{"version": 1, "written_at": %s, "pending": [], "active": []}', -7200.0, "too_old"),
    ],
)
async def test_bad_saved_state_is_counted_and_ignored(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    content: str,
    written_at: float | None,
    reason: str,
) -> None:
    """A malformed state file, or one written 2 h ago (restore_max_age 1 h), is counted under
    its reason with one log line naming the file; the component starts empty and saves a fresh
    state on its first tick."""
    clock = FakeWallClock()
    path = tmp_path / "alerts.json"
    path.write_text(content % (clock() + written_at) if written_at is not None else content)
    settings = Settings(targets=(TargetSettings(name="fly", url="http://127.0.0.1:1"),))
    component = AlertingComponent(
        settings.detect,
        settings.alerting,
        settings.windows,
        inputs=lambda: (None, None),
        wall_clock=clock,
        sleep=lambda s: asyncio.sleep(3600),
        state_path=path,
    )
    with caplog.at_level(logging.WARNING, logger="specwatch.alerts.alertmanager"):
        async with aiohttp.ClientSession() as session, component.running(session):
            await component.tick()
    assert component.state.state_errors == {
        "read": 0,
        "corrupt": 0,
        "too_old": 0,
        "write": 0,
        reason: 1,
    }
    (record,) = [r for r in caplog.records if "alert state" in r.getMessage()]
    assert event_fields(record)["path"] == str(path)
    assert load(path.read_text()) == SavedAlerts(clock(), {}, ())


@pytest.mark.parametrize(("saved_for", "restored"), [("aaa111bbb222", True), ("other", False)])
async def test_saved_state_is_restored_only_for_the_same_targets(
    tmp_path: Path, saved_for: str, restored: bool
) -> None:
    """A pending ``for`` timer saved 60 s ago under the targets key ``aaa111bbb222`` comes back
    for a component of the same key and is dropped (nothing restored) for another: the file
    written on the first tick carries the component's own key and only what it restored."""
    from specwatch.alerts.saved import dump

    clock = FakeWallClock()
    key = (("alertname", "SpecAcceptanceDrop"), ("severity", "warning"), ("target", "fly"))
    path = tmp_path / "alerts.json"
    path.write_text(dump(SavedAlerts(clock() - 60.0, {key: clock() - 300.0}, targets=saved_for)))
    settings = Settings(targets=(TargetSettings(name="fly", url="http://127.0.0.1:1"),))
    component = AlertingComponent(
        settings.detect,
        settings.alerting,
        settings.windows,
        inputs=lambda: (None, None),
        wall_clock=clock,
        sleep=lambda s: asyncio.sleep(3600),
        state_path=path,
        state_key="aaa111bbb222",
    )
    async with aiohttp.ClientSession() as session, component.running(session):
        await component.tick()
    saved = load(path.read_text())
    assert saved.targets == "aaa111bbb222"
    assert saved.pending == ({key: clock() - 300.0} if restored else {})


def test_state_file_sits_beside_the_ledger_only_with_shadow_on() -> None:
    """Default ``alerting.state_file``: ``<ledger.path>-alerts.json`` with shadow on or a
    ``ledger.path`` given; with shadow off and the default ledger path nothing is written (no
    file in the working directory); the targets key changes with any target's URL."""
    from specwatch.server.wiring import alert_state_path, targets_key

    one = Settings(targets=(TargetSettings(name="fly", url="http://127.0.0.1:1"),))
    assert alert_state_path(one) is None
    on = Settings.model_validate(
        {
            "targets": [{"name": "fly", "url": "http://127.0.0.1:1"}],
            "shadow": {
                "enabled": True,
                "standard": {"url": "http://127.0.0.1:2"},
                "fly": {"target": "fly"},
            },
            "ledger": {"path": "/var/lib/specwatch/ledger.sqlite"},
        }
    )
    assert alert_state_path(on) == Path("/var/lib/specwatch/ledger.sqlite-alerts.json")
    given = Settings.model_validate(
        {"targets": [{"name": "fly", "url": "http://127.0.0.1:1"}], "ledger": {"path": "/s/l.db"}}
    )
    assert alert_state_path(given) == Path("/s/l.db-alerts.json")
    other = Settings(targets=(TargetSettings(name="fly", url="http://127.0.0.1:3"),))
    assert len(targets_key(one)) == 12
    assert targets_key(one) != targets_key(other)
