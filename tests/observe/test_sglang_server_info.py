"""``specwatch run`` reads an SGLang server's ``/server_info`` when its page does not show N.

SGLang before 0.5.13 exports no ``sglang:spec_num_draft_tokens``; without K in the target's
settings α = (τ − 1) / (N − 1) needs N from the server arguments. The scraper asks the server's
``/server_info`` (beside ``/metrics``; ``/get_server_info`` before 0.5.6) once, over real HTTP
on 127.0.0.1, and uses its ``speculative_num_draft_tokens`` as if configured.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from specwatch.observe.fetch import server_info_urls
from specwatch.observe.loop import Scraper
from specwatch.observe.settings import ScrapeSettings, TargetSettings
from tests.cli.test_sglang_cli import ngram_page
from tests.fakes import FakeMonotonicClock, FakeWallClock

#: What SGLang 0.5.4 answers on /get_server_info for the NGRAM TP=2 page's server (its
#: launch flags: --speculative-num-draft-tokens 12), the fields specwatch reads.
INFO = {
    "version": "0.5.4",
    "speculative_algorithm": "NGRAM",
    "speculative_num_draft_tokens": 12,
    "max_running_requests": 48,
}


@dataclass
class FakeSglang:
    """/metrics: the 0.5.4 NGRAM page, 1000 more generated tokens at τ 2.5 per scrape;
    ``info_path``: where it answers its server arguments (``None``: nowhere, 404)."""

    info_path: str | None
    scrapes: int = 0
    asked: list[str] = field(default_factory=list)

    async def metrics(self, _request: web.Request) -> web.Response:
        body = ngram_page(1000.0 * self.scrapes, 2.5)
        self.scrapes += 1
        return web.Response(text=body, content_type="text/plain")

    async def info(self, request: web.Request) -> web.Response:
        self.asked.append(request.path)
        if request.path != self.info_path:
            raise web.HTTPNotFound()
        return web.json_response(INFO)


@pytest.fixture(params=["/get_server_info", None])
async def server(request: pytest.FixtureRequest) -> AsyncIterator[tuple[FakeSglang, str]]:
    fake = FakeSglang(request.param)
    app = web.Application()
    app.router.add_get("/metrics", fake.metrics)
    app.router.add_get("/server_info", fake.info)
    app.router.add_get("/get_server_info", fake.info)
    async with TestServer(app, host="127.0.0.1") as ts:
        yield fake, str(ts.make_url("/metrics"))


def test_server_info_urls_sit_beside_metrics() -> None:
    """Same scheme, host and path prefix, no query; the current path first."""
    assert server_info_urls("http://h:30000/metrics?x=1") == [
        "http://h:30000/server_info",
        "http://h:30000/get_server_info",
    ]
    assert server_info_urls("https://gw/sglang/metrics")[0] == "https://gw/sglang/server_info"


async def test_n_from_server_info_once(
    server: tuple[FakeSglang, str], caplog: pytest.LogCaptureFixture
) -> None:
    """Three scrapes of a 0.5.4 page with no K configured: with the older /get_server_info
    answering N = 12, it is asked once (after /server_info's 404), K = 11 and
    max_running_requests 48 are used as configured, and α = (2.5 − 1) / 11; with no such
    endpoint, both paths are asked once, one WARNING line, and K stays unknown."""
    fake, url = server
    caplog.set_level(logging.INFO, logger="specwatch")
    target = TargetSettings(name="standard", url=url, engine="sglang")
    scraper = Scraper(
        [target],
        ScrapeSettings(),
        {"1m": 60.0},
        wall_clock=FakeWallClock(),
        on_update=lambda: None,
        mono_clock=FakeMonotonicClock(),
    )
    async with aiohttp.ClientSession() as session:
        scraper.use_session(session)
        for _ in range(3):
            assert await scraper.scrape_once(target)
    snap = scraper.trackers["standard"].snapshot()
    events = [r.getMessage() for r in caplog.records if "server_info" in r.getMessage()]
    assert fake.asked == ["/server_info", "/get_server_info"]
    if fake.info_path is None:
        assert snap.capacity.num_speculative_tokens is None
        assert events == ["sglang server_info without draft tokens"]
        return
    assert events == ["sglang server_info read"]
    assert (snap.capacity.num_speculative_tokens, snap.capacity.num_speculative_tokens_source) == (
        11,
        "configured",
    )
    assert snap.capacity.max_num_seqs == 48
    server_health = snap.windows["1m"][next(iter(snap.windows["1m"]))].server
    assert server_health.mean_acceptance_length == pytest.approx(2.5)
    assert server_health.acceptance_rate == pytest.approx(1.5 / 11)
