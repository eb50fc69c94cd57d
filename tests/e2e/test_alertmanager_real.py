"""specwatch.alerts.alertmanager against a real Alertmanager.

Debian's prometheus-alertmanager on loopback.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from specwatch.alerts.alert import Alert, Severity
from specwatch.alerts.alertmanager import AlertLoop
from specwatch.alerts.settings import AlertingSettings
from specwatch.core.clock import SYSTEM_WALL, format_rfc3339
from tests.fakes import FakeWallClock
from tests.fakes.alertmanager import Alertmanager, running_alertmanager

pytestmark = pytest.mark.promtool

AMTOOL = shutil.which("amtool") or "/usr/bin/amtool"


@pytest.fixture
async def am(tmp_path: Path) -> AsyncIterator[tuple[Alertmanager, aiohttp.ClientSession]]:
    async with (
        aiohttp.ClientSession() as session,
        running_alertmanager(tmp_path, session, keep_storage=True) as manager,
    ):
        yield manager, session


async def _no_sleep(_: float) -> None:
    return None


def _finding(engine: str) -> Alert:
    return Alert(
        alertname="SpecAcceptanceDrop",
        severity=Severity.WARNING,
        summary="Speculative acceptance dropped on vllm-fly",
        description=f"engine {engine}: acceptance rate α 0.31 against a 0.62 baseline",
        labels={
            "target": "vllm-fly",
            "role": "fly",
            "engine": engine,
            "model.name": 'meta/Llama 3 "8B"',
        },
    )


def _by_engine(alerts: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {a["labels"]["engine"]: a for a in alerts}


async def test_alert_listed_then_resolved(am: tuple[Alertmanager, aiohttp.ClientSession]) -> None:
    """A sent alert is listed with its labels and annotations, and gone once cleared."""
    manager, session = am
    findings = [_finding("3")]
    settings = AlertingSettings(
        urls=[manager.url],
        external_labels={"cluster": "test"},
        runbook_base_url="https://example.test/runbook.md",
        generator_url="http://specwatch.example:9464/api/v1/snapshot",
    )
    loop = AlertLoop(settings, session, lambda: findings, wall_clock=SYSTEM_WALL, sleep=_no_sleep)
    await loop.tick()
    (listed,) = await manager.alerts(session)
    assert listed["labels"] == {
        "alertname": "SpecAcceptanceDrop",
        "severity": "warning",
        "target": "vllm-fly",
        "role": "fly",
        "engine": "3",
        "model_name": 'meta/Llama 3 "8B"',
        "cluster": "test",
    }
    assert listed["annotations"] == {
        "summary": "Speculative acceptance dropped on vllm-fly",
        "description": "engine 3: acceptance rate α 0.31 against a 0.62 baseline",
        "runbook_url": "https://example.test/runbook.md#specacceptancedrop",
    }
    assert listed["status"]["state"] == "active"
    assert listed["generatorURL"] == "http://specwatch.example:9464/api/v1/snapshot"
    findings.clear()
    await loop.tick()
    assert await manager.alerts(session) == []
    assert loop.state.firing == ()
    assert sum(loop.state.send_errors.values()) == 0


async def test_restart_loses_nothing(
    am: tuple[Alertmanager, aiohttp.ClientSession],
) -> None:
    """Alertmanager stopped while engine 1 fires; engine 2 fires during the outage; after the
    restart the outbox delivers engine 2 at once and the next resend brings engine 1 back
    with its original startsAt. (The fake clock runs 30 s ahead of Alertmanager's by then, so
    the startsAt it lists are in its own clock: ours plus the measured offset, within 1 s.)"""
    manager, session = am
    clock = FakeWallClock(time.time())
    findings = [_finding("1")]
    settings = AlertingSettings(
        urls=[manager.url], resend_interval=30, evaluation_interval=15, max_attempts=2
    )
    loop = AlertLoop(settings, session, lambda: findings, wall_clock=clock, sleep=_no_sleep)
    start_1 = clock.t
    await loop.tick()
    assert list(_by_engine(await manager.alerts(session))) == ["1"]

    await manager.stop()
    clock.advance(15)
    findings.append(_finding("2"))
    start_2 = clock.t
    await loop.tick()
    assert loop.state.outbox_depth == 1
    assert loop.state.send_errors["connect"] == 2

    await manager.start(session)
    clock.advance(15)  # resend interval for engine 1 reached: both go out
    await loop.tick()
    assert loop.state.outbox_depth == 0
    listed = _by_engine(await manager.alerts(session))
    assert sorted(listed) == ["1", "2"]
    offset = loop.state.peers[0].clock_offset
    assert offset is not None
    assert offset == pytest.approx(-30.0, abs=2.0)
    listed_at = {e: datetime.fromisoformat(a["startsAt"]).timestamp() for e, a in listed.items()}
    assert listed_at == pytest.approx({"1": start_1 + offset, "2": start_2 + offset}, abs=1.0)
    assert all(a["status"]["state"] == "active" for a in listed.values())


async def test_outbox_delivers_before_resend(
    am: tuple[Alertmanager, aiohttp.ClientSession],
) -> None:
    """An alert raised while Alertmanager is down arrives on the first tick after it is back,
    without waiting for the resend interval."""
    manager, session = am
    clock = FakeWallClock(time.time())
    findings: list[Alert] = []
    settings = AlertingSettings(urls=[manager.url], resend_interval=300, max_attempts=1)
    loop = AlertLoop(settings, session, lambda: findings, wall_clock=clock, sleep=_no_sleep)
    await manager.stop()
    findings.append(_finding("5"))
    await loop.tick()
    await manager.start(session)
    clock.advance(1)
    await loop.tick()
    assert list(_by_engine(await manager.alerts(session))) == ["5"]


async def test_resends_never_flap(am: tuple[Alertmanager, aiohttp.ClientSession]) -> None:
    """Twelve resends: Alertmanager keeps one active alert with the first startsAt, and every
    payload carried that same startsAt and an endsAt in the future."""
    manager, session = am
    findings = [_finding("0")]
    settings = AlertingSettings(urls=[manager.url], resend_interval=0.001, evaluation_interval=60)
    starts: set[str] = set()
    ends: list[str] = []
    loop = AlertLoop(settings, session, lambda: findings, wall_clock=SYSTEM_WALL, sleep=_no_sleep)
    for _ in range(12):
        await loop.tick()
        (listed,) = await manager.alerts(session)
        assert listed["status"]["state"] == "active"
        starts.add(listed["startsAt"])
        ends.append(listed["endsAt"])
        assert listed["endsAt"] > format_rfc3339(time.time())
    assert starts == {format_rfc3339(loop.state.firing[0].starts_at)}
    assert ends == sorted(ends)
    assert len(set(ends)) > 1  # the lease really was renewed by the resends
    assert sum(loop.state.send_errors.values()) == 0


async def test_two_fly_pairs_in_one_cluster_never_merge(
    am: tuple[Alertmanager, aiohttp.ClientSession],
) -> None:
    """Two sidecars (namespaces team-a and team-b, as the downward API sets them) raise the same
    quality finding for FLy targets of the same name: Alertmanager lists two alerts, each with
    its namespace, pod, target, role and model, its own generatorURL and the configured runbook
    base."""
    manager, session = am
    finding = Alert(
        alertname="SpecQualityDrift",
        severity=Severity.CRITICAL,
        summary="Evidence that FLy loses more answers than standard (category _all)",
        description="e-value 35 over 1/alpha 20",
        labels={"check": "e_value", "category": "_all", "target": "fly", "role": "fly"},
    )
    loops: list[AlertLoop] = []
    for ns in ("team-a", "team-b"):
        settings = AlertingSettings(
            urls=[manager.url],
            namespace=ns,
            pod=f"vllm-pair-{ns}-0",
            runbook_base_url="https://wiki.example/specwatch-runbook",
            generator_url=f"http://10.0.0.{len(loops) + 1}:9477/api/v1/snapshot",
        )
        loops.append(
            AlertLoop(settings, session, lambda: [finding], wall_clock=SYSTEM_WALL, sleep=_no_sleep)
        )
    for loop in loops:
        await loop.tick()
    listed = sorted(await manager.alerts(session), key=lambda a: a["labels"]["namespace"])
    assert [(a["labels"]["namespace"], a["labels"]["pod"]) for a in listed] == [
        ("team-a", "vllm-pair-team-a-0"),
        ("team-b", "vllm-pair-team-b-0"),
    ]
    assert [a["generatorURL"] for a in listed] == [
        "http://10.0.0.1:9477/api/v1/snapshot",
        "http://10.0.0.2:9477/api/v1/snapshot",
    ]
    for a in listed:
        assert a["labels"]["target"] == "fly"
        assert a["labels"]["role"] == "fly"
        assert a["annotations"]["runbook_url"] == (
            "https://wiki.example/specwatch-runbook#specqualitydrift"
        )


async def test_five_distinct_alerts_stay_five_label_sets(
    am: tuple[Alertmanager, aiohttp.ClientSession],
) -> None:
    """Five alerts of one name that differ only by an empty engine, a missing engine, and a
    label name that had to be sanitised (``model.name`` beside a valid ``model_name``) reach a
    real Alertmanager as five label sets, read back both through its API and through amtool;
    the empty engine is ``(empty)`` and the sanitised name that meets ``model_name`` is
    ``model_name_`` plus 8 hex digits of sha256("model.name") (5f08222e)."""
    manager, session = am

    def drop(**labels: str) -> Alert:
        return Alert(
            alertname="SpecAcceptanceDrop",
            severity=Severity.WARNING,
            summary="Speculative-decoding acceptance dropped on vllm-fly.",
            description="acceptance 0.31 against 0.62",
            labels={"target": "vllm-fly", **labels},
        )

    findings = [
        drop(engine="0"),
        drop(engine=""),
        drop(),
        drop(**{"model.name": "a"}),
        drop(**{"model_name": "a", "model.name": "b"}),
    ]
    loop = AlertLoop(
        AlertingSettings(urls=[manager.url]),
        session,
        lambda: findings,
        wall_clock=SYSTEM_WALL,
        sleep=_no_sleep,
    )
    await loop.tick()
    base = {"alertname": "SpecAcceptanceDrop", "severity": "warning", "target": "vllm-fly"}
    expected = sorted(
        [
            {**base, "engine": "0"},
            {**base, "engine": "(empty)"},
            base,
            {**base, "model_name": "a"},
            {**base, "model_name": "a", "model_name_5f08222e": "b"},
        ],
        key=lambda labels: sorted(labels.items()),
    )
    listed = [a["labels"] for a in await manager.alerts(session)]
    assert sorted(listed, key=lambda labels: sorted(labels.items())) == expected
    proc = await asyncio.create_subprocess_exec(
        AMTOOL,
        f"--alertmanager.url={manager.url}",
        "alert",
        "query",
        "-o",
        "json",
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0
    queried = [a["labels"] for a in json.loads(out)]
    assert sorted(queried, key=lambda labels: sorted(labels.items())) == expected
