"""End to end with a real Alertmanager: simulated standard + FLy servers under load, specwatch's
app with the alerting component (scrape every 0.5 s, a 3 s window, `for` 1 s), faults injected
through the simulators' ``POST /admin/faults``.

- FLy's draft noise x6 → SpecAcceptanceDrop{target=fly, scope=server} listed by Alertmanager with
  specwatch's labels and annotations; every resend keeps one active alert with the first
  startsAt; Alertmanager stopped and started again with empty storage gets the alert back with
  the same startsAt; clearing the fault resolves it.
- ``/metrics`` answering 500 → SpecwatchTargetDown{target=standard}; clearing resolves it.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from specwatch.alerts.alertmanager import DEFAULT_RUNBOOK_BASE_URL
from specwatch.alerts.settings import AlertingSettings, DetectSettings
from specwatch.core.clock import format_rfc3339
from tests.e2e.stack import Stack, running_stack
from tests.fakes.alertmanager import Alertmanager, running_alertmanager
from tests.fakes.wait import poll

pytestmark = pytest.mark.promtool


def _alerting(am: Alertmanager) -> AlertingSettings:
    return AlertingSettings(
        urls=[am.url],
        evaluation_interval=0.5,
        resend_interval=1.0,
        max_attempts=1,
        timeout=2.0,
    )


async def _listed(
    am: Alertmanager, session: aiohttp.ClientSession, alertname: str, target: str
) -> dict[str, Any] | None:
    for alert in await am.alerts(session, alertname):
        if alert["labels"].get("target") == target:
            return alert
    return None


async def _baseline_ready(stack: Stack) -> bool | None:
    """Both targets have at least 6 s of since-start history with drafts flowing.

    The since-start baseline (the detectors' default when no 1h window is configured) then stays
    well above the faulted value for the ~20 s the fault lasts: with α ≈ 0.55 before and ≈ 0.2
    during the fault, the ratio after 20 s of fault is 0.2 / ((6·0.55 + 20·0.2) / 26) ≈ 0.71."""
    doc = await stack.snapshot()
    for target in doc["targets"].values():
        server = target["windows"]["since_start"]["server"] or {}
        if (server.get("interval_seconds") or 0) < 6 or not server.get("drafts_per_second"):
            return None
    return True


@pytest.mark.slow
async def test_acceptance_drop_fires_survives_restart_and_resolves(tmp_path: Path) -> None:
    """An injected acceptance drop reaches a real Alertmanager, survives a sidecar restart and
    resolves."""
    async with (
        aiohttp.ClientSession() as session,
        running_alertmanager(tmp_path, session) as am,
        running_stack(
            alerting=_alerting(am),
            detect=DetectSettings(acceptance_short_window="3s", acceptance_drop_for=1.0),
        ) as stack,
    ):
        await poll("6 s of baseline", lambda: _baseline_ready(stack))
        assert await am.alerts(session, "SpecAcceptanceDrop") == []

        await stack.fault(stack.fly, {"draft_noise_multiplier": 6.0})
        first = await poll(
            "SpecAcceptanceDrop listed",
            lambda: _listed(am, session, "SpecAcceptanceDrop", "fly"),
        )
        assert first["labels"] == {
            "alertname": "SpecAcceptanceDrop",
            "severity": "warning",
            "target": "fly",
            "role": "fly",
            "model_name": "sim-model",
            "scope": "server",
            # FLy's own drafts got worse while standard's held, below standard's level
            "cause": "drafter_change",
        }
        assert first["annotations"]["runbook_url"] == (
            f"{DEFAULT_RUNBOOK_BASE_URL}#specacceptancedrop"
        )
        assert "fly" in first["annotations"]["summary"]
        assert first["status"]["state"] == "active"
        starts = first["startsAt"]
        # the snapshot and the gauge show the same alert
        doc = await stack.snapshot()
        assert any(a["labels"]["target"] == "fly" for a in doc["alerts"])
        async with session.get(f"{stack.specwatch_url}/metrics") as resp:
            text = await resp.text()
        assert 'specwatch_alert_firing{alertname="SpecAcceptanceDrop"' in text
        # the cause the rules copy (specwatch_alert_cause) is the pushed alert's, and delivery
        # to the real Alertmanager is acknowledged (the rules of the same names stand back)
        assert (
            'specwatch_alert_cause{alertname="SpecAcceptanceDrop",cause="drafter_change",'
            'role="fly",target="fly"} 1.0'
        ) in text
        assert "specwatch_alertmanager_delivering 1.0" in text

        # Resends (every 1 s) never flap: one active alert, same startsAt, live lease.
        deadline = time.monotonic() + 3.0
        seen = 0
        while time.monotonic() < deadline:
            listed = await am.alerts(session, "SpecAcceptanceDrop")
            fly = [a for a in listed if a["labels"]["target"] == "fly"]
            assert len(fly) == 1
            assert fly[0]["status"]["state"] == "active"
            assert fly[0]["startsAt"] == starts
            assert fly[0]["endsAt"] > format_rfc3339(time.time())
            seen += 1
            await asyncio.sleep(0.25)
        assert seen >= 8

        # Alertmanager down while firing, back with empty storage: nothing lost.
        await am.stop()
        errors_before = stack.component.state.send_errors["connect"]

        async def failed_send() -> bool | None:
            return True if stack.component.state.send_errors["connect"] > errors_before else None

        await poll("a failed send while Alertmanager is down", failed_send)
        await am.start(session)
        back = await poll(
            "SpecAcceptanceDrop re-listed after the restart",
            lambda: _listed(am, session, "SpecAcceptanceDrop", "fly"),
        )
        assert back["startsAt"] == starts
        assert back["labels"] == first["labels"]

        # Clear the fault: the 3 s window recovers and the alert resolves.
        await stack.fault(stack.fly, None)

        async def resolved() -> bool | None:
            still = await _listed(am, session, "SpecAcceptanceDrop", "fly")
            return True if still is None else None

        await poll("SpecAcceptanceDrop resolved", resolved, within=30)
        assert all(
            a.labels.get("alertname") != "SpecAcceptanceDrop" for a in stack.component.state.firing
        )


async def test_target_down_fires_and_resolves(tmp_path: Path) -> None:
    """A target whose /metrics fails fires SpecwatchTargetDown for it alone, which resolves once
    it recovers."""
    async with (
        aiohttp.ClientSession() as session,
        running_alertmanager(tmp_path, session) as am,
        running_stack(alerting=_alerting(am), detect=DetectSettings(target_down_for=1.0)) as stack,
    ):
        await stack.fault(stack.standard, {"metrics_mode": "error"})
        down = await poll(
            "SpecwatchTargetDown listed",
            lambda: _listed(am, session, "SpecwatchTargetDown", "standard"),
        )
        assert down["labels"] == {
            "alertname": "SpecwatchTargetDown",
            "severity": "warning",
            "target": "standard",
            "role": "standard",
        }
        assert "http_status=" in down["annotations"]["description"]
        assert await _listed(am, session, "SpecwatchTargetDown", "fly") is None
        await stack.fault(stack.standard, None)

        async def resolved() -> bool | None:
            still = await _listed(am, session, "SpecwatchTargetDown", "standard")
            return True if still is None else None

        await poll("SpecwatchTargetDown resolved", resolved)
