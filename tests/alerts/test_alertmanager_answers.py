"""The alert loop against Alertmanagers that answer badly (an absurd ``Date``, an error body that is
not UTF-8 or is huge, a redirect, a refused connection): each is counted under its reason, the
loop's task keeps running and a later good answer is delivered."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from email.utils import formatdate
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from specwatch.alerts.alert import Alert, Severity
from specwatch.alerts.alertmanager import ERROR_BODY_MAX_BYTES, AlertLoop
from specwatch.alerts.settings import AlertingSettings
from specwatch.alerts.values import AlertingState
from specwatch.core.logs import event_fields
from tests.fakes import FakeWallClock, free_port

START = 1_800_000_000.0

Answer = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class ScriptedAM:
    """Answers each ``POST /api/v2/alerts`` with the next of ``answers``, then 200; an answer with
    no ``Date`` of its own gets one from ``clock`` (specwatch's own time). Records every body."""

    clock: FakeWallClock
    answers: list[Answer] = field(default_factory=list)
    bodies: list[list[dict[str, Any]]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(await request.json())
        date = formatdate(self.clock(), usegmt=True)
        if not self.answers:
            return web.Response(status=200, headers={"Date": date})
        resp = await self.answers.pop(0)(request)
        if not resp.prepared:  # the server's own Date is the real time, not the fake clock's
            resp.headers.setdefault("Date", date)
        return resp


@asynccontextmanager
async def serve(am: ScriptedAM) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/api/v2/alerts", am.handle)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


def fixed(status: int, body: bytes = b"", **headers: str) -> Answer:
    async def answer(request: web.Request) -> web.StreamResponse:
        return web.Response(status=status, body=body, headers=headers)

    return answer


def drop() -> Alert:
    return Alert(
        alertname="SpecAcceptanceDrop",
        severity=Severity.WARNING,
        summary="acceptance dropped",
        description="engine 3",
        labels={"target": "vllm-fly"},
    )


async def run_ticks(
    settings: AlertingSettings, clock: FakeWallClock, ticks: int
) -> list[AlertingState]:
    """Run the loop's task (as the alerting component does) for ``ticks`` ticks, each sleep
    advancing the fake clock by ``evaluation_interval``; return the state published after each
    tick. Fails with what ended the task if it ends on its own."""
    reached = asyncio.Event()
    states: list[AlertingState] = []

    async def sleep(seconds: float) -> None:
        if seconds != settings.evaluation_interval:
            return  # a retry's backoff: no wall time needed
        states.append(loop.state)
        if len(states) == ticks:
            reached.set()
            await asyncio.Event().wait()
        clock.advance(seconds)

    async with aiohttp.ClientSession() as session:
        loop = AlertLoop(settings, session, lambda: [drop()], wall_clock=clock, sleep=sleep)
        task = asyncio.create_task(loop.run(), name="specwatch-alerting")
        waiter = asyncio.create_task(reached.wait())
        await asyncio.wait({task, waiter}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        alive = not task.done()
        task.cancel()
        waiter.cancel()
        if not alive:
            task.result()  # raises what ended the task
        with pytest.raises(asyncio.CancelledError):
            await task
    assert reached.is_set()
    return states


def settings_for(url: str, **kw: Any) -> AlertingSettings:
    return AlertingSettings(urls=[url], resend_interval=15, evaluation_interval=15, **kw)


def no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []


def logged(caplog: pytest.LogCaptureFixture, reason: str) -> list[dict[str, Any]]:
    """The structured fields of the lines logged with ``reason``."""
    out = []
    for r in caplog.records:
        fields = event_fields(r)
        if fields.get("reason") == reason:
            out.append(fields)
    return out


@pytest.mark.parametrize(
    "date", ["Fri, 31 Dec 9999 23:59:59 GMT", "Thu, 01 Jan 0001 00:00:00 +0000", "Mon, 99 Foo 9"]
)
async def test_absurd_date_is_not_used_and_the_loop_goes_on(
    date: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A 200 whose ``Date`` is years off (or unreadable) is counted once as ``bad_date``, logged
    with the URL, and its offset is not applied: every post carries times in specwatch's clock,
    the task keeps ticking, the next answers (a good ``Date``) are delivered and ``delivering``
    stays 1."""
    clock = FakeWallClock(START)
    am = ScriptedAM(clock, [fixed(200, Date=date)])
    with caplog.at_level(logging.WARNING, logger="specwatch.alerts.alertmanager"):
        async with serve(am) as url:
            states = await run_ticks(settings_for(url), clock, 3)
    assert [s.delivering for s in states] == [True, True, True]
    assert [s.peers[0].errors["bad_date"] for s in states] == [1, 1, 1]
    assert states[0].peers[0].clock_offset is None  # the bad answer left no offset
    assert states[-1].peers[0].clock_offset == pytest.approx(0.5, abs=1.0)
    assert len(am.bodies) == 3  # no re-post for a "moved" clock
    for [alert] in am.bodies:
        starts = datetime.fromisoformat(alert["startsAt"]).timestamp()
        assert starts == pytest.approx(START, abs=1.0)
    (line,) = logged(caplog, "bad_date")
    assert line["url"] == url
    no_traceback(caplog)


async def test_error_body_not_utf8_is_a_5xx(caplog: pytest.LogCaptureFixture) -> None:
    """A 500 whose body (``charset=utf-8``) is not UTF-8 is counted as ``http_5xx`` and logged
    with the bytes replaced; ``delivering`` drops to 0, the task goes on and the next tick's 200
    brings it back to 1."""
    clock = FakeWallClock(START)
    bad = b"\xff\xfe\xfa\xff\xfe\xfa"
    am = ScriptedAM(clock, [fixed(500, bad, **{"Content-Type": "text/plain; charset=utf-8"})])
    with caplog.at_level(logging.WARNING, logger="specwatch.alerts.alertmanager"):
        async with serve(am) as url:
            states = await run_ticks(settings_for(url, max_attempts=1), clock, 2)
    assert [s.delivering for s in states] == [False, True]
    assert [s.send_errors["http_5xx"] for s in states] == [1, 1]
    assert sum(states[-1].send_errors.values()) == 1
    assert len(am.bodies) == 2
    assert states[-1].outbox_depth == 0
    (line,) = logged(caplog, "http_5xx")
    assert (line["url"], line["status"], line["body"]) == (
        f"{url}/api/v2/alerts",
        500,
        "\ufffd" * 6,
    )
    no_traceback(caplog)


async def test_huge_error_body_is_not_read_whole() -> None:
    """A 500 announcing 200,000,000 bytes of body, sent 64 KiB at a time with a pause between
    (over 30 s for all of it): the client reads at most ERROR_BODY_MAX_BYTES of it and hangs
    up, so the send ends as ``http_5xx`` within its 10 s timeout (read whole it would run into
    the timeout) and the fake's writes fail long before the end of the body."""
    clock = FakeWallClock(START)
    written: list[int] = []
    chunk = b"x" * 65536
    total = 200_000_000

    async def huge(request: web.Request) -> web.StreamResponse:
        date = formatdate(clock(), usegmt=True)
        resp = web.StreamResponse(status=500, headers={"Content-Length": str(total), "Date": date})
        await resp.prepare(request)
        sent = 0
        try:
            while sent < total:
                await resp.write(chunk)
                sent += len(chunk)
                await asyncio.sleep(0.01)
        except ConnectionError:
            return resp  # the client hung up (what this test wants)
        finally:
            written.append(sent)  # also when the server cancels the handler on the hang-up
        return resp

    am = ScriptedAM(clock, [huge])
    async with serve(am) as url:
        states = await run_ticks(settings_for(url, max_attempts=1, timeout=10.0), clock, 2)
        for _ in range(500):  # the handler sees the hang-up at its next write
            if written:
                break
            await asyncio.sleep(0.01)
    assert [s.send_errors["http_5xx"] for s in states] == [1, 1]
    assert states[-1].send_errors["timeout"] == 0
    assert [s.delivering for s in states] == [False, True]
    assert ERROR_BODY_MAX_BYTES == 1024
    (sent,) = written
    assert sent < total // 10


async def test_redirect_is_not_followed() -> None:
    """A 302 to another address is counted as ``http_3xx`` (not followed: nothing is counted as
    ``connect`` for the address it points at) and the batch is not retried; the next tick's
    200 is delivered."""
    clock = FakeWallClock(START)
    elsewhere = f"http://127.0.0.1:{free_port()}/x"
    am = ScriptedAM(clock, [fixed(302, Location=elsewhere)])
    async with serve(am) as url:
        states = await run_ticks(settings_for(url), clock, 2)
    assert [s.send_errors["http_3xx"] for s in states] == [1, 1]
    assert sum(states[-1].send_errors.values()) == 1
    assert [s.delivering for s in states] == [False, True]
    assert len(am.bodies) == 2


async def test_refused_connection_counts_one_reason() -> None:
    """Nothing listens: each attempt is refused (``connect``); the flush, cut off by the
    evaluation interval (1 s) during the backoff of real time, is not counted as ``timeout``
    on top."""
    settings = AlertingSettings(
        urls=[f"http://127.0.0.1:{free_port()}"], evaluation_interval=1.0, max_attempts=3
    )
    async with aiohttp.ClientSession() as session:
        loop = AlertLoop(settings, session, lambda: [drop()], wall_clock=FakeWallClock(START))
        await asyncio.wait_for(loop.tick(), timeout=30)
    errors = loop.state.send_errors
    assert errors["connect"] >= 1
    assert errors["timeout"] == 0
    (peer,) = loop.state.peers
    assert (peer.last_error, peer.last_send_ok, peer.outbox_depth) == ("connect", False, 1)
