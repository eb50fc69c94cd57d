"""The app's own scrape loop (scrape=True) scrapes every target until readiness, then stops."""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp.test_utils import TestClient, TestServer

from specwatch.observe.settings import TargetSettings
from specwatch.server.app import STORE_KEY, build_app
from specwatch.settings import Settings
from tests.fakes.vllm import FakeVllm, Reply
from tests.fixture_files import body


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
            view = app[STORE_KEY].get().observe
            assert view.targets["standard"].up
            assert view.targets["fly"].up
            assert "1m" in view.pair
        assert std.max_in_flight == 1
        assert fly.max_in_flight == 1


async def test_healthz_fails_when_a_background_task_dies() -> None:
    """A task that dies unexpectedly turns /healthz to 503 (the pod gets restarted)."""
    from specwatch.server.app import LIVENESS_KEY

    settings = Settings(targets=(TargetSettings(name="fly", url="http://127.0.0.1:9"),))
    app = build_app(settings, scrape=False)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        assert (await client.get("/healthz")).status == 200

        async def boom() -> None:
            raise RuntimeError("boom")

        task = asyncio.create_task(boom(), name="component")
        app[LIVENESS_KEY].watch(task)
        with contextlib.suppress(RuntimeError):
            await task
        await asyncio.sleep(0)
        resp = await client.get("/healthz")
        assert resp.status == 503
        assert "RuntimeError: boom" in await resp.text()
