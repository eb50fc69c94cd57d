"""specwatch's app with one target ``fly`` on a :class:`~tests.fakes.vllm.FakeVllm`, scraping
driven by hand on a fake wall clock (the ``sidecar`` fixture of ``tests/observe/conftest.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from specwatch.observe.settings import ScrapeSettings, TargetSettings
from specwatch.server.app import SCRAPER_KEY, build_app
from specwatch.settings import Settings
from tests.fakes import FakeWallClock
from tests.fakes.vllm import FakeVllm, Reply

Sidecar = tuple[web.Application, TestClient[Any, Any], FakeVllm, FakeWallClock]


@asynccontextmanager
async def scraped_sidecar() -> AsyncIterator[Sidecar]:
    """The app (no scrape loop: :func:`scrape_all` scrapes), a client of it on 127.0.0.1, the
    fake vLLM it scrapes and the wall clock it reads."""
    clock = FakeWallClock()
    async with FakeVllm() as fake:
        settings = Settings(
            targets=(TargetSettings(name="fly", url=fake.url),),
            scrape=ScrapeSettings(timeout_seconds=2.0),
        )
        app = build_app(settings, wall_clock=clock, scrape=False)
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            yield app, client, fake, clock


async def scrape_all(sc: Sidecar, bodies: list[str]) -> None:
    """Serve each body once, scraping every 30 s of the fake clock; every scrape succeeds."""
    app, _, fake, clock = sc
    target = app[SCRAPER_KEY].trackers["fly"].target
    fake.push(*(Reply(b) for b in bodies))
    for i in range(len(bodies)):
        if i:
            clock.advance(30)
        assert await app[SCRAPER_KEY].scrape_once(target)
