"""Alert delivery to Alertmanager as it is deployed: three real ``prometheus-alertmanager``
processes as a cluster gossiping on loopback ports (``--cluster.listen-address``/
``--cluster.peer``), each a peer in ``alerting.urls``, one of them down for a while; and one
Alertmanager whose clock is 6 minutes off specwatch's, either way. A webhook receiver run by
the test gets the notifications.

The shape of a two-minute outage at the defaults (resend 60 s, lease 240 s: the outage spans two
resend intervals and half a lease) is kept at a shorter scale: resend 3 s, evaluation 0.5 s,
lease 12 s, the peer down for 6 s. Meanwhile the firing alert's description carries a live value
that changes at every evaluation (as the detectors' texts do).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
from pathlib import Path
from typing import Any, ClassVar, Literal

import aiohttp
import pytest

from specwatch.__main__ import main
from specwatch.alerts.alert import Alert, Severity
from specwatch.alerts.alertmanager import AlertLoop
from specwatch.alerts.settings import AlertingSettings
from tests.fakes.alertmanager import (
    Alertmanager,
    Webhook,
    hook_route,
    running_alertmanager,
    running_cluster,
)
from tests.fakes.wait import poll

pytestmark = pytest.mark.promtool

RESEND = 3.0
EVALUATION = 0.5
DOWN = 2 * RESEND


class Findings:
    """What the detectors find at each evaluation: the named alerts, each with a description
    carrying a value that changes every call (a live acceptance rate, say)."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.calls = 0

    def __call__(self) -> list[Alert]:
        self.calls += 1
        return [
            Alert(name, Severity.WARNING, f"{name} fired", f"live value {self.calls}", {})
            for name in self.names
        ]


async def members(session: aiohttp.ClientSession, am: Alertmanager) -> int:
    async with session.get(f"{am.url}/api/v2/status") as resp:
        body: dict[str, Any] = await resp.json()
        return len(body["cluster"].get("peers") or [])


async def received(session: aiohttp.ClientSession, am: Alertmanager, status: str) -> float:
    """``alertmanager_alerts_received_total{status}`` of ``am`` (alerts posted to it)."""
    async with session.get(f"{am.url}/metrics") as resp:
        text = await resp.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("alertmanager_alerts_received_total{") and f'status="{status}"' in line
    )


def names(alerts: list[dict[str, Any]]) -> set[str]:
    return {a["labels"]["alertname"] for a in alerts if a["status"]["state"] == "active"}


@pytest.mark.slow  # about 30 s: three Alertmanagers, a 6 s outage, several resend intervals
async def test_three_peers_one_down(tmp_path: Path) -> None:
    """Alert A fires, the second peer goes down for two resend intervals, A resolves and B
    fires during the outage, the peer comes back with empty storage. Then:

    - the counters and last-error state are the down peer's alone (connect errors, a failed
      last send during the outage, a good one after it); the other two have no error;
    - every peer lists B active and not A, the returning one included (its outbox kept B and
      A's resolve);
    - the receiver was notified of A firing, A resolved and B firing, never of B resolved;
    - each peer received a firing alert once per resend interval, not at every evaluation,
      though the description changed at every one; the resolve of A was re-sent (each peer
      received it more than once).
    """
    hook = Webhook()
    findings = Findings()
    async with (
        aiohttp.ClientSession() as session,
        hook.running(),
        running_cluster(tmp_path, session, config=hook_route(hook)) as ams,
    ):
        for am in ams:
            await poll("three cluster members", functools.partial(_three, session, am), within=30)
        settings = AlertingSettings(
            urls=[am.url for am in ams],
            resend_interval=RESEND,
            evaluation_interval=EVALUATION,
            timeout=1.0,
            max_attempts=1,
        )
        loop = AlertLoop(settings, session, findings)
        findings.names = ["ClusterA"]
        task = asyncio.create_task(loop.run())
        started = time.monotonic()
        try:
            await poll("A notified", lambda: _notified(hook, "ClusterA", "firing"))
            down = ams[1]
            await down.stop()
            down_at = time.time()
            findings.names = ["ClusterB"]
            await asyncio.sleep(DOWN)
            during = loop.state.peers[1]
            assert during.last_send_ok is False
            assert during.last_error == "connect"
            assert (during.last_error_at or 0.0) >= down_at
            await down.start(session)
            await poll("B on the returning peer", lambda: _only_b(session, down), within=30)
            await poll("A resolved notified", lambda: _notified(hook, "ClusterA", "resolved"))
            await poll("B notified", lambda: _notified(hook, "ClusterB", "firing"))
            await asyncio.sleep(2 * RESEND)  # more resends of B and of A's resolve
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        elapsed = time.monotonic() - started
        for am in ams:
            assert names(await am.alerts(session)) == {"ClusterB"}
        evaluations = findings.calls
        first = await received(session, ams[0], "firing")
        resolved_first = await received(session, ams[0], "resolved")
    peers = loop.state.peers
    assert [p.peer for p in peers] == [am.url for am in ams]
    assert peers[1].errors["connect"] >= 1
    assert peers[1].last_send_ok is True
    for p in (peers[0], peers[2]):
        assert sum(p.errors.values()) == 0
        assert (p.last_send_ok, p.last_error, p.last_error_at) == (True, "", None)
        assert abs(p.clock_offset if p.clock_offset is not None else 99.0) < 2.0
    assert set(hook.statuses_of("ClusterB")) == {"firing"}
    assert set(hook.statuses_of("ClusterA")) == {"firing", "resolved"}
    # One firing post per alert per resend interval (plus the first of each and a margin of
    # two for the edges), where one per evaluation would be about `evaluations`.
    bound = elapsed / RESEND + 2 + 2
    assert first <= bound < evaluations / 2
    assert resolved_first >= 2


async def _three(session: aiohttp.ClientSession, am: Alertmanager) -> bool | None:
    return True if await members(session, am) == 3 else None


async def _notified(hook: Webhook, name: str, status: str) -> bool | None:
    return True if status in hook.statuses_of(name) else None


async def _only_b(session: aiohttp.ClientSession, am: Alertmanager) -> bool | None:
    return True if names(await am.alerts(session)) == {"ClusterB"} else None


class SkewedClock:
    """A wall clock ``skew`` seconds off the real time (a node whose NTP failed)."""

    kind: ClassVar[Literal["wall"]] = "wall"

    def __init__(self, skew: float) -> None:
        self.skew = skew

    def __call__(self) -> float:
        return time.time() + self.skew


@pytest.mark.parametrize("skew", [-360.0, 360.0], ids=["specwatch_slow", "specwatch_fast"])
async def test_clock_six_minutes_off_still_notifies_and_resolves(
    tmp_path: Path, skew: float
) -> None:
    """specwatch's clock 6 minutes behind or ahead of a real Alertmanager's, the default 60 s
    resend (lease 240 s, shorter than the skew): the receiver is notified of the alert firing,
    then of it resolved, each within 20 s; the measured offset is the skew's opposite (the
    peer's clock minus specwatch's) within 2 s. Sent in specwatch's own clock, the slow case's
    alert would arrive already ended (never notified) and the fast case's resolve would end
    6 minutes in Alertmanager's future (not notified within 20 s)."""
    hook = Webhook()
    findings = Findings()
    async with (
        aiohttp.ClientSession() as session,
        hook.running(),
        running_alertmanager(tmp_path, session, config=hook_route(hook)) as am,
    ):
        settings = AlertingSettings(urls=[am.url], evaluation_interval=EVALUATION, timeout=1.0)
        loop = AlertLoop(settings, session, findings, wall_clock=SkewedClock(skew))
        findings.names = ["Skewed"]
        task = asyncio.create_task(loop.run())
        try:
            await poll("firing notified", lambda: _notified(hook, "Skewed", "firing"))
            findings.names = []
            await poll("resolved notified", lambda: _notified(hook, "Skewed", "resolved"))
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    (peer,) = loop.state.peers
    assert peer.clock_offset == pytest.approx(-skew, abs=2.0)


async def test_doctor_flags_one_url_in_front_of_a_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``specwatch doctor --config`` against a real three-peer cluster: one URL listed (what a
    Service in front of the replicas amounts to) is a warning naming the 3 peers; all three
    listed is OK for each."""
    async with aiohttp.ClientSession() as session, running_cluster(tmp_path, session) as ams:
        for am in ams:
            await poll("three cluster members", functools.partial(_three, session, am), within=30)
        rows: list[list[dict[str, str]]] = []
        for urls in ([ams[0].url], [am.url for am in ams]):
            cfg = tmp_path / "config.yaml"
            cfg.write_text(json.dumps({"alerting": {"urls": urls}}))
            await asyncio.to_thread(main, ["doctor", "--config", str(cfg), "--format", "json"])
            out = json.loads(capsys.readouterr().out)
            rows.append([r for r in out if r["check"] == "alertmanager"])
    [one] = rows[0]
    assert one["status"] == "warn"
    assert (
        f"{ams[0].url} is one of a cluster of 3 Alertmanagers but alerting.urls lists 1"
        in (one["message"])
    )
    assert [r["status"] for r in rows[1]] == ["ok"] * 3
