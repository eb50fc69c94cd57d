"""The scrape loop keeps a fixed schedule: a slow scrape delays no later tick, overrun ticks are
skipped and counted (``specwatch_scrape_missed_ticks_total``)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from specwatch.core.store import Store
from specwatch.export.prometheus import SpecwatchCollector
from specwatch.export.snapshot import Snapshot
from specwatch.observe.loop import Scraper, next_tick
from specwatch.observe.settings import ScrapeSettings, TargetSettings
from tests.fakes import FakeClocks
from tests.fixture_files import body

GOOD = body("vllm-metrics/real-cpu-ngram.txt")


@pytest.mark.parametrize(
    ("tick", "now", "expected"),
    [
        (0.0, 3.0, (0, 5.0)),  # on time: the next tick
        (0.0, 5.0, (0, 5.0)),  # exactly at the next tick: still to be made
        (0.0, 5.5, (1, 10.0)),  # 5 passed
        (0.0, 12.0, (2, 15.0)),  # 5 and 10 passed
        (10.0, 22.0, (2, 25.0)),  # a 12 s scrape from 10: 15 and 20 passed
        (100.0, 110.0, (1, 110.0)),  # 105 passed, 110 is now
    ],
)
def test_next_tick_hand_worked(tick: float, now: float, expected: tuple[int, float]) -> None:
    """Ticks 5 s apart: the next tick not yet past and the ticks skipped, worked by hand."""
    assert next_tick(tick, 5.0, now) == expected


def test_next_tick_never_in_the_past() -> None:
    """Over many float steps the next tick is never before now and the grid never slides."""
    for i in range(1, 2000):
        now = i * 0.37 + 1e-9 * (i % 7)
        missed, ahead = next_tick(0.0, 0.1, now)
        assert ahead >= now
        assert ahead - 0.1 < now + 1e-9
        assert missed == round(ahead / 0.1) - 1


async def test_slow_target_keeps_later_ticks_on_time() -> None:
    """A real HTTP target answers its 4th scrape (the 15 s tick) 12 s late, at 27 s on the fake
    clock: the ticks at 20 and 25 s, which that scrape overran, are skipped and counted (2,
    exported as specwatch_scrape_missed_ticks_total); the later scrapes are at 30, 35, 40 s, on
    the original grid (not 27, 32, 37: the delay is not carried); no scrape failed."""
    clocks = FakeClocks()
    start = clocks.mono()
    seen: list[float] = []
    done = asyncio.Event()

    async def page(request: web.Request) -> web.Response:
        seen.append(clocks.mono() - start)
        if len(seen) == 4:
            clocks.advance(12.0)  # this answer takes 12 s
        if len(seen) == 7:
            done.set()
        return web.Response(text=GOOD, content_type="text/plain")

    async def sleep(seconds: float) -> None:
        clocks.advance(seconds)
        await asyncio.sleep(0)

    app = web.Application()
    app.router.add_get("/metrics", page)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    target = TargetSettings(name="fly", url=f"http://127.0.0.1:{server.port}/metrics")
    scraper = Scraper(
        [target],
        ScrapeSettings(interval_seconds=5.0, timeout_seconds=30.0),
        {"1m": 60.0},
        wall_clock=clocks.wall,
        mono_clock=clocks.mono,
        on_update=lambda: None,
        sleep=sleep,
    )
    try:
        async with aiohttp.ClientSession() as session:
            scraper.use_session(session)
            task = asyncio.create_task(scraper.run_target(target))
            await asyncio.wait_for(done.wait(), timeout=30)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    finally:
        await server.close()
    assert seen == [0.0, 5.0, 10.0, 15.0, 30.0, 35.0, 40.0]
    snap = scraper.trackers["fly"].snapshot()
    assert snap.missed_ticks == 2
    assert snap.scrapes_total >= 6
    assert snap.scrape_errors.get("timeout", 0) == 0
    reg = CollectorRegistry(auto_describe=True)
    store = Store(Snapshot(observe=scraper.view(clocks.wall())))
    reg.register(SpecwatchCollector(store.get))
    exposed = {
        (s.name, s.labels.get("target")): s.value
        for fam in text_string_to_metric_families(generate_latest(reg).decode())
        for s in fam.samples
    }
    assert exposed["specwatch_scrape_missed_ticks_total", "fly"] == 2.0
