"""Credentials in a target URL (user info, query tokens) and bearer tokens never reach the
scrape logs, ``/api/v1/snapshot`` or ``/metrics``; user info plus a bearer token does not kill
the scrape loop.

Before: ``/api/v1/snapshot`` showed ``http://bob:PASSWORD@host/metrics?token=...`` verbatim, and
a target with both user info and ``bearer_token`` made aiohttp raise ``ValueError`` inside the
scrape task, which died ("background task died"), so no target was scraped again.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from pydantic import SecretStr

from specwatch.core.logs import event_fields, redact_url
from specwatch.observe.settings import ScrapeSettings, TargetSettings
from specwatch.server.app import SCRAPER_KEY, build_app
from specwatch.settings import Settings
from tests.fakes import FakeWallClock
from tests.fakes.vllm import FakeVllm, Reply

GOOD = 'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 7\n'
SECRETS = ("PWLEAK42", "QLEAK42", "TOKLEAK42")


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "http://bob:pw@h:1/metrics?token=t&x=",
            "http://bob:**********@h:1/metrics?token=**********&x=**********",
        ),
        ("https://:pw@h/", "https://:**********@h/"),
        ("http://bob@h/m", "http://bob@h/m"),
        ("http://a:b:c@d@h/x", "http://a:**********@h/x"),
        ("http://h:8000/metrics", "http://h:8000/metrics"),
        ("http://[::1]:80/m", "http://[::1]:80/m"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    """redact_url masks the password and query values of a URL."""
    assert redact_url(url) == shown


def _specwatch_logs(caplog: pytest.LogCaptureFixture) -> str:
    """specwatch's own log lines with their fields (the fake server's access log is not ours)."""
    return "\n".join(
        f"{r.getMessage()} {event_fields(r)}"
        for r in caplog.records
        if r.name.startswith("specwatch")
    )


@pytest.fixture
async def fake() -> AsyncIterator[FakeVllm]:
    async with FakeVllm() as f:
        f.push(Reply(GOOD))
        yield f


async def _app(settings: Settings) -> AsyncIterator[tuple[web.Application, TestClient[Any, Any]]]:
    app = build_app(settings, wall_clock=FakeWallClock(), scrape=False)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        yield app, client


async def test_url_credentials_are_not_shown(
    fake: FakeVllm, caplog: pytest.LogCaptureFixture
) -> None:
    """URL credentials are sent to the target but never appear in the snapshot, /metrics or logs."""
    url = fake.url.replace("http://", "http://bob:PWLEAK42@") + "?token=QLEAK42"
    settings = Settings(
        targets=(TargetSettings(name="fly", url=url),),
        scrape=ScrapeSettings(timeout_seconds=2.0),
    )
    caplog.set_level(logging.DEBUG, logger="specwatch")
    async for app, client in _app(settings):
        target = app[SCRAPER_KEY].trackers["fly"].target
        assert await app[SCRAPER_KEY].scrape_once(target)
        assert str(fake.auth_seen[-1]).startswith("Basic ")
        snap = await (await client.get("/api/v1/snapshot")).text()
        metrics = await (await client.get("/metrics")).text()
        assert "bob:**********@" in snap
        for secret in SECRETS:
            assert secret not in snap
            assert secret not in metrics
            assert secret not in _specwatch_logs(caplog)


def test_user_info_and_bearer_token_are_refused_at_start(fake: FakeVllm) -> None:
    """Two Authorization sources on one target are a settings error naming the target, and
    the error text carries neither secret."""
    url = fake.url.replace("http://", "http://bob:PWLEAK42@")
    with pytest.raises(ValueError, match="bearer_token") as info:
        TargetSettings(name="fly", url=url, bearer_token=SecretStr("TOKLEAK42"))
    assert "TOKLEAK42" not in str(info.value)
