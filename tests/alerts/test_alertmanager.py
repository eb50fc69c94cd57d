"""Unit tests for specwatch.alerts.alertmanager against a fake Alertmanager (aiohttp on port 0)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from email.utils import formatdate
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry, generate_latest
from pydantic import ValidationError

from specwatch.alerts.alert import (
    EMPTY_LABEL_VALUE,
    Alert,
    Severity,
    alert_key,
    keep_distinct,
    runbook_url,
    sanitize_label_name,
    sanitize_labels,
)
from specwatch.alerts.alertmanager import (
    ActiveAlerts,
    AlertLoop,
    AlertSender,
    Delivery,
    Outbox,
    build_payload,
    build_ssl_context,
    date_offset,
    delivery_window,
)
from specwatch.alerts.component import held_causes
from specwatch.alerts.settings import AlertingSettings, TLSSettings
from specwatch.alerts.values import AlertCause, AlertingState, PeerState
from specwatch.core.clock import format_rfc3339
from specwatch.export.json import alerts_json
from specwatch.export.prometheus import AlertsCollector
from tests.fakes import WALL_START, FakeWallClock


@dataclass
class FakeAM:
    """Records every POST; answers with the queued statuses, then 200. Its ``Date`` header is
    ``clock() + skew`` when ``clock`` is set (a peer whose clock differs from specwatch's by
    ``skew`` seconds), else empty (no clock to read: the tests' fake clocks are not the real
    time a real ``Date`` would carry)."""

    statuses: list[int] = field(default_factory=list)
    requests: list[tuple[dict[str, str], list[dict[str, Any]]]] = field(default_factory=list)
    clock: Callable[[], float] | None = None
    skew: float = 0.0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append((dict(request.headers), body))
        status = self.statuses.pop(0) if self.statuses else 200
        date = "" if self.clock is None else formatdate(self.clock() + self.skew, usegmt=True)
        return web.Response(status=status, text="fake", headers={"Date": date})


@pytest.fixture
async def fake_am() -> AsyncIterator[tuple[FakeAM, str]]:
    am = FakeAM()
    app = web.Application()
    app.router.add_post("/api/v2/alerts", am.handle)
    server = TestServer(app, port=0)
    await server.start_server()
    try:
        yield am, str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


@asynccontextmanager
async def silent_am() -> AsyncIterator[str]:
    """An Alertmanager on 127.0.0.1 that accepts ``POST /api/v2/alerts`` and never answers while
    the block runs (a black hole); yields its base URL. On exit the held requests get 200."""
    release = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        await release.wait()
        return web.Response(status=200, headers={"Date": ""})

    app = web.Application()
    app.router.add_post("/api/v2/alerts", hang)
    server = TestServer(app, port=0)
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        release.set()
        await server.close()


class Sleeps:
    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


def drop(target: str = "vllm-fly", engine: str = "3") -> Alert:
    return Alert(
        alertname="SpecAcceptanceDrop",
        severity=Severity.WARNING,
        summary="acceptance dropped",
        description=f"engine {engine} of {target}",
        labels={"target": target, "engine": engine},
    )


class TestLabels:
    def test_label_names_are_sanitised(self) -> None:
        """Invalid characters become underscores, a leading digit gets a prefix, a blank name
        becomes ``label``."""
        assert sanitize_label_name("model.name") == "model_name"
        assert sanitize_label_name("0pos") == "_0pos"
        assert sanitize_label_name("ok_1") == "ok_1"
        assert sanitize_label_name("a-b c") == "a_b_c"
        assert sanitize_label_name("  ") == "label"
        assert sanitize_label_name("") == "label"

    def test_empty_values_dropped_and_collisions_kept_under_stable_names(self) -> None:
        """Empty values are dropped; an already-valid name wins a collision and the other label
        is kept under its sanitised name plus 8 hex digits of the SHA-256 of its own name
        (sha256("a.b") starts 2e7336dc, independently computed); a blank name is ``label``."""
        out = sanitize_labels({"": "x", "empty": "", "a.b": "dotted", "a_b": "valid", "z": "1"})
        assert out == {"a_b": "valid", "a_b_2e7336dc": "dotted", "label": "x", "z": "1"}
        assert sanitize_labels({"a.b": "dotted", "a_b": "other"})["a_b_2e7336dc"] == "dotted"

    def test_identity_has_alertname_and_severity(self) -> None:
        """An alert's identity is its labels plus alertname and severity, sanitised."""
        a = Alert("X", Severity.CRITICAL, "s", "d", labels={"model.name": "m", "gone": ""})
        assert a.identity() == {"alertname": "X", "severity": "critical", "model_name": "m"}

    def test_empty_value_kept_only_where_dropping_it_merges(self) -> None:
        """``engine=""`` beside the same alert without ``engine``: both stay, the empty one as
        ``(empty)``; an empty value no other alert of that name differs by is dropped; another
        alert name never counts; applying it twice changes nothing."""

        def a(name: str, **labels: str) -> Alert:
            return Alert(name, Severity.WARNING, "s", "d", labels=labels)

        given = [
            a("X", target="t", engine=""),
            a("X", target="t"),
            a("X", target="u", engine=""),
            a("Y", target="t", engine=""),
        ]
        got = keep_distinct(given)
        assert [dict(g.labels) for g in got] == [
            {"target": "t", "engine": EMPTY_LABEL_VALUE},
            {"target": "t"},
            {"target": "u"},
            {"target": "t"},
        ]
        assert EMPTY_LABEL_VALUE == "(empty)"
        assert len({alert_key(g.identity()) for g in got}) == 4
        assert keep_distinct(got) == got

    def test_runbook_url_anchor(self) -> None:
        """The runbook URL ends in the alert name lower-cased as the anchor."""
        assert runbook_url("https://h/docs/runbook.md", "SpecAcceptanceDrop") == (
            "https://h/docs/runbook.md#specacceptancedrop"
        )


class TestPayload:
    def test_rfc3339(self) -> None:
        """Unix seconds are written as UTC RFC 3339 with milliseconds."""
        assert format_rfc3339(0.25) == "1970-01-01T00:00:00.250Z"
        assert format_rfc3339(1_800_000_000.0) == "2027-01-15T08:00:00.000Z"

    def test_firing_gets_lease_resolved_keeps_end(self) -> None:
        """A firing delivery ends at now+lease; a resolved one 2 s before its resolution time
        (the clock tolerance), never before its start; an offset shifts both times."""
        fire = Delivery({"alertname": "A"}, {"summary": "s", "description": ""}, 100.0, None)
        done = Delivery({"alertname": "B"}, {"summary": "s"}, 50.0, 90.0, "http://sw/")
        body = build_payload([fire, done], now=200.0, lease=240.0)
        assert body[0] == {
            "labels": {"alertname": "A"},
            "annotations": {"summary": "s"},
            "startsAt": format_rfc3339(100.0),
            "endsAt": format_rfc3339(440.0),
        }
        assert body[1]["endsAt"] == format_rfc3339(88.0)
        assert body[1]["generatorURL"] == "http://sw/"
        quick = Delivery({"alertname": "C"}, {}, 89.0, 90.0)
        assert build_payload([quick], now=200.0, lease=240.0)[0]["endsAt"] == format_rfc3339(89.0)
        shifted = build_payload([fire, done], now=200.0, lease=240.0, offset=-360.0)
        assert [(a["startsAt"], a["endsAt"]) for a in shifted] == [
            (format_rfc3339(-260.0), format_rfc3339(80.0)),
            (format_rfc3339(-310.0), format_rfc3339(-272.0)),
        ]


class TestActiveAlerts:
    def test_lifecycle(self) -> None:
        """New → sent; within resend interval → quiet; after it → resent with the same start;
        cleared → a resolve with endsAt = now, quiet until the next resend interval."""
        aa = ActiveAlerts(resend_interval=60.0, external_labels={"cluster": "c1"})
        first = aa.update([drop()], 1000.0)
        assert len(first) == 1
        assert first[0].labels == {
            "alertname": "SpecAcceptanceDrop",
            "severity": "warning",
            "target": "vllm-fly",
            "engine": "3",
            "cluster": "c1",
        }
        assert first[0].annotations["runbook_url"].endswith("runbook.md#specacceptancedrop")
        assert aa.update([drop()], 1030.0) == []
        again = aa.update([drop()], 1060.0)
        assert [d.starts_at for d in again] == [1000.0]
        assert again[0].ends_at is None
        resolved = aa.update([], 1070.0)
        assert [(d.starts_at, d.ends_at) for d in resolved] == [(1000.0, 1070.0)]
        assert aa.update([], 1129.0) == []
        assert aa.firing() == ()

    def test_resolved_alert_is_resent_for_fifteen_minutes(self) -> None:
        """Resolved at 1000 s with a 60 s resend interval and evaluations every 15 s: the
        resolve goes out at 1000 and is re-sent with the same endsAt at 1060, 1120, ..., 1840
        (every 60 s while under 900 s old: 1 + 14 sends), then never again; firing again at
        2000 s is a new alert (startsAt 2000)."""
        aa = ActiveAlerts(resend_interval=60.0)
        aa.update([drop()], 400.0)
        sent: list[tuple[float, float, float | None]] = []
        now = 1000.0
        while now < 2000.0:
            sent += [(now, d.starts_at, d.ends_at) for d in aa.update([], now)]
            now += 15.0
        assert [t for t, _, _ in sent] == [1000.0 + 60.0 * i for i in range(15)]
        assert {(s, e) for _, s, e in sent} == {(400.0, 1000.0)}
        (again,) = aa.update([drop()], 2000.0)
        assert (again.starts_at, again.ends_at) == (2000.0, None)

    def test_from_settings_carries_the_groups_labels_and_urls(self) -> None:
        """``from_settings``: external labels plus namespace and pod on every delivery, the
        runbook anchor under ``runbook_base_url``, the ``generator_url``, and no resend before
        ``resend_interval`` (120 s: quiet at 119 s, resent at 120 s)."""
        settings = AlertingSettings(
            resend_interval=120.0,
            external_labels={"cluster": "c1"},
            namespace="ns",
            pod="p-0",
            runbook_base_url="https://example.org/runbook",
            generator_url="http://sw:9400/",
        )
        aa = ActiveAlerts.from_settings(settings)
        (first,) = aa.update([drop()], 0.0)
        assert {k: first.labels[k] for k in ("cluster", "namespace", "pod")} == {
            "cluster": "c1",
            "namespace": "ns",
            "pod": "p-0",
        }
        assert first.annotations["runbook_url"] == "https://example.org/runbook#specacceptancedrop"
        assert first.generator_url == "http://sw:9400/"
        assert aa.update([drop()], 119.0) == []
        assert len(aa.update([drop()], 120.0)) == 1

    def test_changed_annotation_waits_for_the_resend(self) -> None:
        """Annotations carry live values (the acceptance now): a description that changes at
        every 15 s evaluation posts nothing before the 60 s resend interval, and the resend
        carries the latest one: 2 sends in 75 s, not 6."""
        aa = ActiveAlerts(resend_interval=60.0)
        out: list[Delivery] = []
        for i in range(6):
            live = Alert(
                "SpecAcceptanceDrop",
                Severity.WARNING,
                "acceptance dropped",
                f"alpha is now 0.{40 - i}",
                {"target": "vllm-fly", "engine": "3"},
            )
            out += aa.update([live], 15.0 * i)
        assert [d.annotations["description"] for d in out] == [
            "alpha is now 0.40",
            "alpha is now 0.36",
        ]
        assert [d.starts_at for d in out] == [0.0, 0.0]

    def test_external_labels_do_not_override(self) -> None:
        """An alert's own label wins over an external label of the same name."""
        aa = ActiveAlerts(resend_interval=60.0, external_labels={"target": "ext"})
        (d,) = aa.update([drop(target="mine")], 0.0)
        assert d.labels["target"] == "mine"


class TestOutbox:
    def test_latest_state_wins_and_bounded(self) -> None:
        """Re-adding an alert replaces it in place; overflow drops the oldest and says so."""
        ob = Outbox(2)
        a1 = Delivery({"alertname": "A"}, {}, 0.0, None)
        b = Delivery({"alertname": "B"}, {}, 0.0, None)
        a2 = Delivery({"alertname": "A"}, {}, 0.0, 10.0)
        c = Delivery({"alertname": "C"}, {}, 0.0, None)
        assert ob.add([a1, b, a2]) == 0
        assert ob.peek() == [a2, b]
        assert ob.add([c]) == 1
        assert ob.peek() == [b, c]

    def test_remove_keeps_newer(self) -> None:
        """A delivery replaced while in flight is not removed by the old one's success."""
        ob = Outbox(5)
        old = Delivery({"alertname": "A"}, {}, 0.0, None)
        ob.add([old])
        sent = ob.peek()
        new = Delivery({"alertname": "A"}, {}, 0.0, 7.0)
        ob.add([new])
        ob.remove(sent)
        assert ob.peek() == [new]


class TestSettings:
    def test_lease_and_url_normalising(self) -> None:
        """Lease is factor x max(resend, evaluation); trailing slashes are dropped."""
        s = AlertingSettings(urls=["http://am:9093/"], resend_interval=30, evaluation_interval=45)
        assert s.urls == ["http://am:9093"]
        assert s.lease == 180.0

    @pytest.mark.parametrize(
        "kwargs",
        [
            {"urls": ["am:9093"]},
            {"bearer_token": "t", "basic_username": "u", "basic_password": "p"},
            {"basic_username": "u"},
            {"external_labels": {"bad-name": "x"}},
            {"external_labels": {"ok": ""}},
            {"tls": {"cert_file": "/c.pem"}},
        ],
    )
    def test_rejects_bad_config(self, kwargs: dict[str, Any]) -> None:
        """AlertingSettings rejects each invalid combination of fields."""
        with pytest.raises(ValidationError):
            AlertingSettings(**kwargs)

    def test_ssl_options(self) -> None:
        """insecure → verification off; nothing set → system defaults; bad CA → OSError."""
        s = AlertingSettings(tls=TLSSettings(insecure_skip_verify=True))
        assert build_ssl_context(s.tls) is False
        assert build_ssl_context(AlertingSettings().tls) is True
        with pytest.raises(FileNotFoundError):
            build_ssl_context(
                AlertingSettings(tls=TLSSettings(ca_file=Path("/nonexistent/ca.pem"))).tls
            )


async def _loop(
    url: str, findings: list[Alert], clock: FakeWallClock, sleeps: Sleeps, **kw: Any
) -> tuple[AlertLoop, aiohttp.ClientSession]:
    session = aiohttp.ClientSession()
    settings = AlertingSettings(urls=[url], resend_interval=60, evaluation_interval=15, **kw)
    loop = AlertLoop(settings, session, lambda: findings, wall_clock=clock, sleep=sleeps)
    return loop, session


class TestSender:
    async def test_5xx_retried_with_backoff(self, fake_am: tuple[FakeAM, str]) -> None:
        """Two 503s then 200: three POSTs, sleeps 0.5 s then 1 s, outbox empty, 2 errors."""
        am, url = fake_am
        am.statuses = [503, 503]
        clock, sleeps = FakeWallClock(), Sleeps()
        loop, session = await _loop(url, [drop()], clock, sleeps)
        async with session:
            await loop.tick()
        assert len(am.requests) == 3
        assert sleeps.calls == [0.5, 1.0]
        assert loop.state.outbox_depth == 0
        assert loop.state.send_errors["http_5xx"] == 2

    async def test_backoff_is_capped(self, fake_am: tuple[FakeAM, str]) -> None:
        """Backoff doubles from 0.5 s up to its 8 s cap."""
        am, url = fake_am
        am.statuses = [500] * 7
        clock, sleeps = FakeWallClock(), Sleeps()
        loop, session = await _loop(url, [drop()], clock, sleeps, max_attempts=7)
        async with session:
            await loop.tick()
        assert sleeps.calls == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]
        assert loop.state.outbox_depth == 1  # kept for the next tick

    async def test_429_is_retried(self, fake_am: tuple[FakeAM, str]) -> None:
        """429 (too many requests) means later: retried, delivered on the second attempt."""
        am, url = fake_am
        am.statuses = [429]
        clock, sleeps = FakeWallClock(), Sleeps()
        loop, session = await _loop(url, [drop()], clock, sleeps)
        async with session:
            await loop.tick()
        assert len(am.requests) == 2
        assert sleeps.calls == [0.5]
        assert loop.state.send_errors["http_4xx"] == 1
        assert loop.state.outbox_depth == 0

    async def test_4xx_not_retried(self, fake_am: tuple[FakeAM, str]) -> None:
        """A 400 is counted once and the batch is dropped, not retried."""
        am, url = fake_am
        am.statuses = [400]
        clock, sleeps = FakeWallClock(), Sleeps()
        loop, session = await _loop(url, [drop()], clock, sleeps)
        async with session:
            await loop.tick()
            clock.advance(15)
            await loop.tick()  # within resend interval: nothing new to send
        assert len(am.requests) == 1
        assert sleeps.calls == []
        assert loop.state.send_errors["http_4xx"] == 1
        assert loop.state.outbox_depth == 0

    async def test_outbox_survives_outage(self, fake_am: tuple[FakeAM, str]) -> None:
        """While down, fire and resolve of different alerts queue; on recovery one POST carries
        both with their original startsAt, the firing one with a fresh lease."""
        am, url = fake_am
        am.statuses = [503] * 3
        clock, sleeps = FakeWallClock(1000.0), Sleeps()
        findings = [drop(engine="1"), drop(engine="2")]
        loop, session = await _loop(url, findings, clock, sleeps)
        async with session:
            await loop.tick()
            assert loop.state.outbox_depth == 2
            clock.t = 1015.0
            findings.pop()  # engine 2 clears while Alertmanager is down
            await loop.tick()
        assert len(am.requests) == 4
        last = {a["labels"]["engine"]: a for a in am.requests[-1][1]}
        assert last["1"]["startsAt"] == format_rfc3339(1000.0)
        assert last["1"]["endsAt"] == format_rfc3339(1015.0 + 240.0)
        assert last["2"]["startsAt"] == format_rfc3339(1000.0)
        assert last["2"]["endsAt"] == format_rfc3339(1013.0)
        assert loop.state.outbox_depth == 0

    async def test_connect_error_counted(self) -> None:
        """A refused connection counts as reason=connect and keeps the alert queued."""
        server = TestServer(web.Application(), port=0)
        await server.start_server()
        url = str(server.make_url("")).rstrip("/")
        await server.close()  # nothing listens there any more
        clock, sleeps = FakeWallClock(), Sleeps()
        loop, session = await _loop(url, [drop()], clock, sleeps, max_attempts=2)
        async with session:
            await loop.tick()
        assert loop.state.send_errors["connect"] == 2
        assert loop.state.outbox_depth == 1

    async def test_bearer_header(self, fake_am: tuple[FakeAM, str]) -> None:
        """A configured bearer token is sent as the Authorization header with a JSON body."""
        am, url = fake_am
        clock, sleeps = FakeWallClock(), Sleeps()
        loop, session = await _loop(url, [drop()], clock, sleeps, bearer_token="s3cret")
        async with session:
            await loop.tick()
        headers = am.requests[0][0]
        assert headers["Authorization"] == "Bearer s3cret"
        assert headers["Content-Type"].startswith("application/json")

    async def test_basic_auth_header(self, fake_am: tuple[FakeAM, str]) -> None:
        """A configured user and password are sent as HTTP basic auth."""
        am, url = fake_am
        clock, sleeps = FakeWallClock(), Sleeps()
        loop, session = await _loop(
            url, [drop()], clock, sleeps, basic_username="am", basic_password="pw"
        )
        async with session:
            await loop.tick()
        expected = "Basic " + base64.b64encode(b"am:pw").decode()
        assert am.requests[0][0]["Authorization"] == expected

    async def test_sanitised_labels_on_the_wire(self, fake_am: tuple[FakeAM, str]) -> None:
        """What reaches Alertmanager has only valid, non-empty label names and values."""
        am, url = fake_am
        odd = Alert(
            "SpecQualityDrift",
            Severity.CRITICAL,
            "s",
            "d",
            labels={"category": "math", "model.name": "llama", "9x": "y", "blank": ""},
        )
        clock, sleeps = FakeWallClock(), Sleeps()
        loop, session = await _loop(url, [odd], clock, sleeps)
        async with session:
            await loop.tick()
        (alert,) = am.requests[0][1]
        assert alert["labels"] == {
            "alertname": "SpecQualityDrift",
            "severity": "critical",
            "category": "math",
            "model_name": "llama",
            "_9x": "y",
        }

    async def test_every_url_gets_the_alert(self, fake_am: tuple[FakeAM, str]) -> None:
        """With two Alertmanagers, one down: the up one gets it, the other keeps it queued."""
        am, url = fake_am
        clock, sleeps = FakeWallClock(), Sleeps()
        session = aiohttp.ClientSession()
        settings = AlertingSettings(urls=[url, "http://127.0.0.1:9"], max_attempts=1)
        loop = AlertLoop(settings, session, lambda: [drop()], wall_clock=clock, sleep=sleeps)
        async with session:
            await loop.tick()
        assert len(am.requests) == 1
        assert loop.state.outbox_depth == 1


async def test_on_state_and_alerts_json() -> None:
    """Every published state reaches on_state; alerts_json lists the firing alert once."""
    seen: list[AlertingState] = []
    async with aiohttp.ClientSession() as session:
        loop = AlertLoop(
            AlertingSettings(),
            session,
            lambda: [drop()],
            wall_clock=FakeWallClock(1_800_000_000.0),
            sleep=Sleeps(),
            on_state=seen.append,
        )
        await loop.tick()
    assert seen[-1] is loop.state
    assert alerts_json(seen[-1]) == [
        {
            "labels": {
                "alertname": "SpecAcceptanceDrop",
                "engine": "3",
                "severity": "warning",
                "target": "vllm-fly",
            },
            "startsAt": "2027-01-15T08:00:00.000Z",
            "state": "firing",
        }
    ]


class TestFamilies:
    def test_exposition(self) -> None:
        """AlertsCollector renders firing gauges and, per peer, accepted alerts, error counters
        (every reason from 0), outbox depth, last send, last error time and clock offset."""
        aa = ActiveAlerts(resend_interval=60.0, external_labels={"cluster": "c"})
        aa.update([drop()], 0.0)
        peers = (
            PeerState("http://am-0:9093", 5, {"http_5xx": 2}, 3, False, "http_5xx", 1700.0, -360.5),
            PeerState("http://am-1:9093", 7),
        )
        state = AlertingState(firing=aa.firing(), peers=peers)

        reg = CollectorRegistry()
        reg.register(AlertsCollector(lambda: state))
        text = generate_latest(reg).decode()
        assert (
            'specwatch_alert_firing{alertname="SpecAcceptanceDrop",engine="3",'
            'severity="warning",target="vllm-fly"} 1.0'
        ) in text
        am0, am1 = 'peer="http://am-0:9093"', 'peer="http://am-1:9093"'
        assert f'specwatch_alertmanager_send_errors_total{{{am0},reason="http_5xx"}} 2.0' in text
        assert f'specwatch_alertmanager_send_errors_total{{{am0},reason="connect"}} 0.0' in text
        assert f'specwatch_alertmanager_send_errors_total{{{am1},reason="http_5xx"}} 0.0' in text
        assert f"specwatch_alertmanager_sent_alerts_total{{{am1}}} 7.0" in text
        assert f"specwatch_alertmanager_outbox_depth{{{am0}}} 3.0" in text
        assert f"specwatch_alertmanager_last_send_success{{{am0}}} 0.0" in text
        assert f"specwatch_alertmanager_last_error_timestamp_seconds{{{am0}}} 1700.0" in text
        assert f"specwatch_alertmanager_clock_offset_seconds{{{am0}}} -360.5" in text
        assert f"specwatch_alertmanager_last_send_success{{{am1}}}" not in text
        assert f"specwatch_alertmanager_clock_offset_seconds{{{am1}}}" not in text
        assert (state.send_errors["http_5xx"], state.outbox_depth) == (2, 3)
        assert "cluster" not in text


def test_payload_is_json_serialisable() -> None:
    """The body round-trips through json (no datetime objects leak)."""
    d = Delivery({"alertname": "A"}, {"summary": "s"}, 1.0, None)
    assert json.loads(json.dumps(build_payload([d], 2.0, 4.0)))[0]["labels"] == {"alertname": "A"}


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    """A throwaway certificate for 127.0.0.1 made with the openssl CLI (Debian: openssl)."""
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(
        [
            shutil.which("openssl") or "/usr/bin/openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


class TestTransport:
    async def test_tls_ca_file_and_insecure(self, tmp_path: Path) -> None:
        """Over HTTPS with a self-signed cert: the CA file verifies, insecure skips
        verification, and system defaults refuse the certificate (counted as connect)."""
        cert, key = _self_signed(tmp_path)
        server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ctx.load_cert_chain(str(cert), str(key))
        am = FakeAM()
        app = web.Application()
        app.router.add_post("/api/v2/alerts", am.handle)
        server = TestServer(app, port=0)
        await server.start_server(ssl=server_ctx)
        url = str(server.make_url("")).rstrip("/")
        assert url.startswith("https://")
        try:
            for tls, delivered in [
                (TLSSettings(ca_file=cert), True),
                (TLSSettings(insecure_skip_verify=True), True),
                (TLSSettings(), False),
            ]:
                async with aiohttp.ClientSession() as session:
                    settings = AlertingSettings(urls=[url], tls=tls, max_attempts=1)
                    loop = AlertLoop(
                        settings,
                        session,
                        lambda: [drop()],
                        wall_clock=FakeWallClock(),
                        sleep=Sleeps(),
                    )
                    await loop.tick()
                assert (loop.state.outbox_depth == 0) is delivered
                assert (loop.state.send_errors["connect"] == 0) is delivered
        finally:
            await server.close()
        assert len(am.requests) == 2

    async def test_timeout_counted(self) -> None:
        """An Alertmanager slower than the timeout counts as reason=timeout; the alert stays."""
        async with silent_am() as url, aiohttp.ClientSession() as session:
            settings = AlertingSettings(urls=[url], timeout=0.05, max_attempts=1)
            loop = AlertLoop(
                settings, session, lambda: [drop()], wall_clock=FakeWallClock(), sleep=Sleeps()
            )
            await loop.tick()
        assert loop.state.send_errors["timeout"] == 1
        assert loop.state.outbox_depth == 1


async def test_run_resends_every_interval(fake_am: tuple[FakeAM, str]) -> None:
    """run() ticks, sleeps evaluation_interval, ticks again: with resend = evaluation = 15 s each
    tick re-sends the alert with the same startsAt and a lease renewed by 15 s."""
    am, url = fake_am
    clock = FakeWallClock(1000.0)
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 3:
            raise asyncio.CancelledError
        clock.advance(seconds)

    async with aiohttp.ClientSession() as session:
        settings = AlertingSettings(urls=[url], resend_interval=15, evaluation_interval=15)
        loop = AlertLoop(settings, session, lambda: [drop()], wall_clock=clock, sleep=sleep)
        with pytest.raises(asyncio.CancelledError):
            await loop.run()
    assert slept == [15, 15, 15]
    sent = [body[0] for _, body in am.requests]
    assert [a["startsAt"] for a in sent] == [format_rfc3339(1000.0)] * 3
    assert [a["endsAt"] for a in sent] == [format_rfc3339(1000.0 + 60 + 15 * i) for i in range(3)]


async def test_flush_is_bounded_by_evaluation_interval() -> None:
    """A black-holed Alertmanager (request timeout 30 s, 3 attempts) holds a tick for at most
    evaluation_interval: the flush is cut off, counted as timeout, and the alert stays queued."""
    async with silent_am() as url, aiohttp.ClientSession() as session:
        settings = AlertingSettings(urls=[url], timeout=30, max_attempts=3, evaluation_interval=0.2)
        loop = AlertLoop(
            settings, session, lambda: [drop()], wall_clock=FakeWallClock(), sleep=Sleeps()
        )
        await asyncio.wait_for(loop.tick(), timeout=20)
    assert loop.state.send_errors["timeout"] == 1
    assert loop.state.outbox_depth == 1


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """As a nested group of a pydantic-settings model, the fields parse from SPECWATCH_* env."""
    from pydantic_settings import BaseSettings, SettingsConfigDict

    class Env(BaseSettings):
        model_config = SettingsConfigDict(env_prefix="SPECWATCH_", env_nested_delimiter="__")
        alerting: AlertingSettings = AlertingSettings()

    monkeypatch.setenv("SPECWATCH_ALERTING__URLS", '["https://am-0:9093/", "https://am-1:9093"]')
    monkeypatch.setenv("SPECWATCH_ALERTING__BEARER_TOKEN", "s3cr3t-v4lue")
    monkeypatch.setenv("SPECWATCH_ALERTING__RESEND_INTERVAL", "30")
    monkeypatch.setenv("SPECWATCH_ALERTING__EXTERNAL_LABELS", '{"cluster": "eu-1"}')
    monkeypatch.setenv("SPECWATCH_ALERTING__TLS__INSECURE_SKIP_VERIFY", "true")
    got = Env().alerting
    assert got.urls == ["https://am-0:9093", "https://am-1:9093"]
    assert got.bearer_token is not None
    assert got.bearer_token.get_secret_value() == "s3cr3t-v4lue"
    assert "s3cr3t-v4lue" not in repr(got)
    assert got.lease == 120.0
    assert got.external_labels == {"cluster": "eu-1"}
    assert got.tls.insecure_skip_verify is True


def test_restored_alert_keeps_starts_at_and_is_held_then_resolved() -> None:
    """Restored with startsAt 100, hold until 200, resend 60: sent at once (150) as firing with
    startsAt 100; not again at 170; at 210 the hold is over and, missing from the findings, it
    resolves with endsAt 210 and startsAt 100."""
    active = ActiveAlerts(resend_interval=60.0)
    active.restore([(drop(), 100.0)], hold_until=200.0)
    (first,) = active.update([], 150.0)
    assert (first.starts_at, first.ends_at) == (100.0, None)
    assert active.update([], 170.0) == []
    assert [a.starts_at for a in active.firing()] == [100.0]
    (gone,) = active.update([], 210.0)
    assert (gone.starts_at, gone.ends_at) == (100.0, 210.0)
    assert active.firing() == ()


def test_restored_alert_found_again_is_ordinary() -> None:
    """Found again at 150 (sent, startsAt 100), then missing at 160: resolved at once even
    inside the hold; export gives the finding and its startsAt."""
    active = ActiveAlerts(resend_interval=60.0)
    active.restore([(drop(), 100.0)], hold_until=200.0)
    assert active.export() == [(drop(), 100.0)]
    (sent,) = active.update([drop()], 150.0)
    assert sent.starts_at == 100.0
    (gone,) = active.update([], 160.0)
    assert (gone.starts_at, gone.ends_at) == (100.0, 160.0)


class TestPeers:
    async def test_counters_and_last_error_are_per_peer(self) -> None:
        """Two peers, one answering 503 then 200, one 200: the errors, the accepted alerts and
        the last-error state belong to the peer they happened on."""
        ams = [FakeAM(statuses=[503]), FakeAM()]
        servers = []
        for am in ams:
            app = web.Application()
            app.router.add_post("/api/v2/alerts", am.handle)
            server = TestServer(app, port=0)
            await server.start_server()
            servers.append(server)
        urls = [str(s.make_url("")).rstrip("/") for s in servers]
        clock = FakeWallClock(1000.0)
        try:
            async with aiohttp.ClientSession() as session:
                settings = AlertingSettings(urls=urls, max_attempts=1)
                findings = [drop()]
                loop = AlertLoop(
                    settings, session, lambda: findings, wall_clock=clock, sleep=Sleeps()
                )
                await loop.tick()
                bad, good = loop.state.peers
                assert (bad.peer, bad.errors["http_5xx"], bad.sent_alerts) == (urls[0], 1, 0)
                assert (bad.last_send_ok, bad.last_error, bad.last_error_at) == (
                    False,
                    "http_5xx",
                    1000.0,
                )
                assert (bad.outbox_depth, good.outbox_depth) == (1, 0)
                assert (good.errors["http_5xx"], good.sent_alerts, good.last_send_ok) == (
                    0,
                    1,
                    True,
                )
                clock.advance(15)
                await loop.tick()  # the queued alert reaches the first peer now
                bad, good = loop.state.peers
                assert (bad.sent_alerts, bad.last_send_ok, bad.last_error_at) == (1, True, 1000.0)
                assert good.sent_alerts == 1  # nothing due for it within the resend interval
        finally:
            for server in servers:
                await server.close()


def parse_rfc3339(text: str) -> float:
    """Unix seconds of an RFC 3339 time as the payload writes it (``...Z``)."""
    return datetime.fromisoformat(text).timestamp()


class TestClockOffset:
    @pytest.mark.parametrize("skew", [-360.0, 360.0])
    async def test_peer_six_minutes_off_gets_times_in_its_clock(
        self, fake_am: tuple[FakeAM, str], skew: float, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A peer whose ``Date`` is 6 minutes behind or ahead of specwatch's clock (resend 60 s,
        lease 240 s, shorter than the skew): the first post, built before any answer, is
        posted again at once in the peer's clock; from then on every firing alert ends
        ``now + 240 s`` and every resolve 2 s before its resolution time, both in the peer's clock
        (Alertmanager sees a live lease, then a resolve in its past). Uncompensated, the slow
        case's lease would end 120 s in the peer's past (accepted, never notified) and the
        fast case's resolve 360 s in its future (the alert hangs on). The offset is exported
        and warned about once."""
        am, url = fake_am
        clock = FakeWallClock(1_800_000_000.0)
        am.clock, am.skew = clock, skew
        findings = [drop()]
        async with aiohttp.ClientSession() as session:
            settings = AlertingSettings(urls=[url], resend_interval=60, evaluation_interval=15)
            loop = AlertLoop(settings, session, lambda: findings, wall_clock=clock, sleep=Sleeps())
            with caplog.at_level(logging.WARNING, logger="specwatch.alerts.alertmanager"):
                await loop.tick()
                clock.advance(60)
                await loop.tick()
                findings.clear()
                clock.advance(15)
                await loop.tick()
        assert len(am.requests) == 4
        peer_time = [
            parse_rfc3339(a["endsAt"]) - (t + skew)
            for (_, [a]), t in zip(
                am.requests,
                [1_800_000_000.0, 1_800_000_000.0, 1_800_000_060.0, 1_800_000_075.0],
                strict=True,
            )
        ]
        # the first post is in specwatch's clock, the rest in the peer's: endsAt - peer now
        assert peer_time[0] == pytest.approx(240.0 - skew, abs=1.0)
        assert peer_time[1:] == pytest.approx([240.0, 240.0, -2.0], abs=1.0)
        starts = [parse_rfc3339(a["startsAt"]) for _, [a] in am.requests[1:]]
        assert starts == pytest.approx([1_800_000_000.0 + skew] * 3, abs=1.0)
        (peer,) = loop.state.peers
        assert peer.clock_offset == pytest.approx(skew, abs=1.0)
        warned = [r for r in caplog.records if "clock differs" in r.getMessage()]
        assert len(warned) == 1

    async def test_offset_near_the_tolerance_does_not_flap(
        self, fake_am: tuple[FakeAM, str]
    ) -> None:
        """A peer whose ``Date`` reads 2 s, then 1 s, then 0 s (twice) ahead (read as 2.5, 1.5 and
        0.5 s: whole seconds plus their mean truncation): compensation starts at 2.5 (>= 2 s),
        stays on at 1.5 (not under 1 s), and stops at 0.5. A post is built with the offset of
        the answer before it (the first one's answer causes the only re-post: the offset moved
        by 2 s or more, the later moves are under that)."""
        am, url = fake_am
        clock = FakeWallClock(1_800_000_000.0)
        am.clock = clock
        findings = [drop()]
        async with aiohttp.ClientSession() as session:
            settings = AlertingSettings(urls=[url], resend_interval=15, evaluation_interval=15)
            loop = AlertLoop(settings, session, lambda: findings, wall_clock=clock, sleep=Sleeps())
            applied = []
            for skew in (2.0, 1.0, 0.0, 0.0):
                am.skew = skew
                await loop.tick()
                (peer,) = loop.state.peers
                sent = parse_rfc3339(am.requests[-1][1][0]["startsAt"]) - 1_800_000_000.0
                applied.append((round(peer.clock_offset or 0.0, 1), round(sent, 1)))
                clock.advance(15)
        assert applied == [(2.5, 2.5), (1.5, 2.5), (0.5, 1.5), (0.5, 0.0)]
        assert len(am.requests) == 5  # the first answer showed the offset: one re-post

    def test_date_offset_reads_the_header(self) -> None:
        """``Date: Sun, 06 Dec 2026 20:00:00 GMT`` (1796587200, worked out by hand: 20793 days
        after 1970-01-01 times 86400 plus 20 h) answered to a request made between 1796587559
        and 1796587561 locally: the peer is 360 - 0.5 s behind; no or bad header: None."""
        offset = date_offset("Sun, 06 Dec 2026 20:00:00 GMT", 1796587559.0, 1796587561.0)
        assert offset == pytest.approx(-359.5)
        assert date_offset("", 0.0, 0.0) is None
        assert date_offset("not a date", 0.0, 0.0) is None


class TestDelivering:
    async def test_heartbeat_shows_delivery_while_nothing_fires(
        self, fake_am: tuple[FakeAM, str]
    ) -> None:
        """With nothing firing the loop posts an empty array on its first tick and then once per
        resend interval (60 s here, ticks every 15 s); ``delivering`` holds while the last
        acknowledged post is within 2 x 60 + timeout seconds, and turns false at once when a post
        fails (500, one attempt)."""
        am, url = fake_am
        clock, sleeps = FakeWallClock(), Sleeps()
        loop, session = await _loop(url, [], clock, sleeps, max_attempts=1, timeout=5.0)
        async with session:
            assert not loop.state.delivering  # nothing acknowledged yet
            await loop.tick()
            assert [body for _, body in am.requests] == [[]]
            assert loop.state.delivering
            for _ in range(3):  # 15, 30, 45 s: no second heartbeat within 60 s
                clock.advance(15)
                await loop.tick()
            assert len(am.requests) == 1
            assert loop.state.delivering
            clock.advance(15)  # 60 s: the second heartbeat
            await loop.tick()
            assert [body for _, body in am.requests] == [[], []]
            am.statuses = [500]
            clock.advance(60)
            await loop.tick()
            assert len(am.requests) == 3
            assert not loop.state.delivering  # the last send failed
            assert loop.state.send_errors["http_5xx"] == 1

    async def test_delivery_goes_stale_without_an_answer(self, fake_am: tuple[FakeAM, str]) -> None:
        """An acknowledged heartbeat counts for 2 x max(resend 60, eval 15) + timeout 5 = 125 s:
        a sidecar whose posts stop (its loop stuck, nothing posted) is no longer delivering
        after that, with no failed post needed to say so."""
        am, url = fake_am
        clock = FakeWallClock()
        settings = AlertingSettings(
            urls=[url], resend_interval=60, evaluation_interval=15, timeout=5.0
        )
        assert delivery_window(settings) == 125.0
        async with aiohttp.ClientSession() as session:
            sender = AlertSender(settings, session, wall_clock=clock)
            await sender.flush(clock())
        assert [body for _, body in am.requests] == [[]]
        assert sender.delivering(clock() + 125.0)
        assert not sender.delivering(clock() + 125.5)

    def test_no_urls_never_delivering(self) -> None:
        """Without ``alerting.urls`` nothing is posted and ``delivering`` stays false, so the
        rules named like the sidecar's alerts page."""
        sender = AlertSender(AlertingSettings(), cast(aiohttp.ClientSession, None))
        assert sender.delivering(WALL_START) is False


class TestHeldCauses:
    def test_one_cause_per_alert_and_target(self) -> None:
        """The cause of each held cause-bearing finding, one per (alert, target): two findings
        of one target that agree give their cause, that disagree give ``undetermined``; an
        alert without a cause label or not cause-bearing gives none."""
        keys = [
            alert_key(
                {
                    "alertname": "SpecAcceptanceDrop",
                    "target": "fly",
                    "role": "fly",
                    "scope": "server",
                    "cause": "drafter_context_limit",
                }
            ),
            alert_key(
                {
                    "alertname": "SpecAcceptanceDrop",
                    "target": "fly",
                    "role": "fly",
                    "scope": "engine",
                    "engine": "1",
                    "cause": "drafter_context_limit",
                }
            ),
            alert_key(
                {
                    "alertname": "SpecBudgetStarvation",
                    "target": "std",
                    "role": "standard",
                    "reason": "budget_cap",
                    "cause": "token_budget",
                }
            ),
            alert_key(
                {
                    "alertname": "SpecBudgetStarvation",
                    "target": "std",
                    "role": "standard",
                    "reason": "draft_truncation",
                    "cause": "dynamic_k",
                }
            ),
            alert_key(
                {
                    "alertname": "SpecDecodeInactive",
                    "target": "std",
                    "role": "standard",
                    "cause": "x",
                }
            ),
            alert_key({"alertname": "SpecAcceptanceDecay", "target": "std", "role": "standard"}),
        ]
        assert held_causes(keys) == (
            AlertCause("SpecAcceptanceDrop", "fly", "fly", "drafter_context_limit"),
            AlertCause("SpecBudgetStarvation", "std", "standard", "undetermined"),
        )
