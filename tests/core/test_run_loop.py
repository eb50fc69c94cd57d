"""The app's own scrape loop (scrape=True) scrapes every target until readiness, then stops."""

from __future__ import annotations

import asyncio

from aiohttp.test_utils import TestClient, TestServer

from specwatch.app import STORE_KEY, build_app
from specwatch.settings import Settings, TargetSettings
from tests.core.conftest import body
from tests.core.fakes import FakeVllm, Reply


async def test_loop_scrapes_both_targets() -> None:
    """Two targets on a 50 ms interval become ready; scrapes never overlap per target."""
    async with FakeVllm() as std, FakeVllm() as fly:
        page = body("vllm-metrics/real-cpu-ngram.txt")
        std.push(Reply(page))
        fly.push(Reply(page))
        settings = Settings(
            targets=(
                TargetSettings(name="standard", url=std.url, scrape_interval_seconds=0.05),
                TargetSettings(name="fly", url=fly.url, scrape_interval_seconds=0.05),
            )
        )
        app = build_app(settings)
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            for _ in range(200):
                if (await client.get("/readyz")).status == 200:
                    break
                await asyncio.sleep(0.02)
            assert (await client.get("/readyz")).status == 200
            snap = app[STORE_KEY].get()
            assert snap.targets["standard"].up
            assert snap.targets["fly"].up
            assert "1m" in snap.pair
        assert std.max_in_flight == 1
        assert fly.max_in_flight == 1
