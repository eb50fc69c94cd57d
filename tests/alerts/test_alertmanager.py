"""Unit tests for specwatch.alerts.alertmanager against a fake Alertmanager (aiohttp on port 0)."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    Delivery,
    Outbox,
    build_payload,
    build_ssl_context,
)
from specwatch.alerts.settings import AlertingSettings, TLSSettings
from specwatch.alerts.values import AlertingState
from specwatch.core.clock import format_rfc3339
from specwatch.export.json import alerts_json
from specwatch.export.prometheus import AlertsCollector
from tests.fakes import FakeWallClock


@dataclass
class FakeAM:
    """Records every POST; answers with the queued statuses, then 200."""

    statuses: list[int] = field(default_factory=list)
    requests: list[tuple[dict[str, str], list[dict[str, Any]]]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append((dict(request.headers), body))
        status = self.statuses.pop(0) if self.statuses else 200
        return web.Response(status=status, text="fake")


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
        return web.Response(status=200)

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
        """A firing delivery ends at now+lease; a resolved one at its resolution time."""
        fire = Delivery({"alertname": "A"}, {"summary": "s", "description": ""}, 100.0, None)
        done = Delivery({"alertname": "B"}, {"summary": "s"}, 50.0, 90.0, "http://sw/")
        body = build_payload([fire, done], now=200.0, lease=240.0)
        assert body[0] == {
            "labels": {"alertname": "A"},
            "annotations": {"summary": "s"},
            "startsAt": format_rfc3339(100.0),
            "endsAt": format_rfc3339(440.0),
        }
        assert body[1]["endsAt"] == format_rfc3339(90.0)
        assert body[1]["generatorURL"] == "http://sw/"


class TestActiveAlerts:
    def test_lifecycle(self) -> None:
        """New → sent; within resend interval → quiet; after it → resent with the same start;
        cleared → one resolve with endsAt = now, then nothing."""
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
        assert aa.update([], 1200.0) == []
        assert aa.firing() == ()

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

    def test_changed_annotation_resends_now(self) -> None:
        """A new description is sent at once, without waiting for the resend interval."""
        aa = ActiveAlerts(resend_interval=60.0)
        aa.update([drop()], 0.0)
        newer = Alert(
            "SpecAcceptanceDrop",
            Severity.WARNING,
            "acceptance dropped",
            "worse",
            {
                "target": "vllm-fly",
                "engine": "3",
            },
        )
        out = aa.update([newer], 5.0)
        assert [d.annotations["description"] for d in out] == ["worse"]
        assert out[0].starts_at == 0.0

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
        assert last["2"]["endsAt"] == format_rfc3339(1015.0)
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
        """AlertsCollector renders firing gauges, error counters and outbox depth."""
        aa = ActiveAlerts(resend_interval=60.0, external_labels={"cluster": "c"})
        aa.update([drop()], 0.0)
        state = AlertingState(
            firing=aa.firing(), send_errors={"http_5xx": 2, "timeout": 0}, outbox_depth=3
        )

        reg = CollectorRegistry()
        reg.register(AlertsCollector(lambda: state))
        text = generate_latest(reg).decode()
        assert (
            'specwatch_alert_firing{alertname="SpecAcceptanceDrop",engine="3",'
            'severity="warning",target="vllm-fly"} 1.0'
        ) in text
        assert 'specwatch_alertmanager_send_errors_total{reason="http_5xx"} 2.0' in text
        assert 'specwatch_alertmanager_send_errors_total{reason="connect"} 0.0' in text
        assert "specwatch_alertmanager_outbox_depth 3.0" in text
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
