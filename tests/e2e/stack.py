"""End-to-end harness: two simulated vLLM servers (standard and FLy) under load, specwatch's app
with the alerting component, and helpers to poll real Alertmanager / Prometheus HTTP APIs.

Everything binds 127.0.0.1 on free ports; every wait polls with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from specwatch.alerts.component import AlertingComponent
from specwatch.alerts.settings import AlertingSettings, DetectSettings
from specwatch.observe.settings import ScrapeSettings, TargetSettings
from specwatch.server.app import build_app
from specwatch.server.wiring import AlertingPlug
from specwatch.settings import Settings
from specwatch.simulate.config import Role, SimConfig
from specwatch.simulate.launcher import SimulatorHandle, start_simulator
from specwatch.simulate.loadgen import LoadConfig, LoadGenerator
from tests.fakes.wait import poll


@dataclass
class Stack:
    """The running pieces of one end-to-end test."""

    standard: SimulatorHandle
    fly: SimulatorHandle
    app: TestServer
    component: AlertingComponent
    session: aiohttp.ClientSession

    @property
    def specwatch_url(self) -> str:
        return f"http://127.0.0.1:{self.app.port}"

    async def fault(self, sim: SimulatorHandle, patch: dict[str, Any] | None) -> None:
        """``POST /admin/faults`` with ``patch``; ``None`` clears every fault (``DELETE``)."""
        url = f"{sim.url}/admin/faults"
        if patch is None:
            async with self.session.delete(url) as resp:
                assert resp.status == 200, await resp.text()
        else:
            async with self.session.post(url, json=patch) as resp:
                assert resp.status == 200, await resp.text()

    async def snapshot(self) -> dict[str, Any]:
        async with self.session.get(f"{self.specwatch_url}/api/v1/snapshot") as resp:
            resp.raise_for_status()
            doc: dict[str, Any] = await resp.json()
            return doc


@contextlib.asynccontextmanager
async def running_stack(
    *,
    alerting: AlertingSettings,
    detect: DetectSettings,
    windows: tuple[str, ...] = ("3s",),
    scrape_interval: float = 0.5,
    fly_config: dict[str, Any] | None = None,
) -> AsyncIterator[Stack]:
    """Standard + FLy simulators (seed 1) under closed-loop load from the load generator
    (4 concurrent requests to each), specwatch scraping both every ``scrape_interval`` s with the
    alerting component. Yields once both targets had a good scrape."""
    std = await start_simulator(SimConfig(role=Role.STANDARD, seed=1), port=0)
    fly = await start_simulator(SimConfig(role=Role.FLY, seed=1, **(fly_config or {})), port=0)
    session = aiohttp.ClientSession()
    load = LoadGenerator(
        [std.url, fly.url],
        LoadConfig(concurrency=8, duration_s=None, fanout=True, max_tokens=48, temperature=1.0),
        session=session,
    )
    load_task = asyncio.create_task(load.run())
    settings = Settings(
        targets=(
            TargetSettings(name="standard", url=std.url),
            TargetSettings(name="fly", url=fly.url),
        ),
        windows=windows,
        scrape=ScrapeSettings(interval_seconds=scrape_interval, timeout_seconds=scrape_interval),
        alerting=alerting,
        detect=detect,
    )
    plug = AlertingPlug(settings)
    component = plug.component
    server = TestServer(build_app(settings, components=[plug]), port=0)
    await server.start_server()
    stack = Stack(std, fly, server, component, session)
    try:

        async def ready() -> bool | None:
            async with session.get(f"{stack.specwatch_url}/readyz") as resp:
                return True if resp.status == 200 else None

        await poll("specwatch ready", ready)
        yield stack
    finally:
        load.stop()
        load_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await load_task
        await server.close()
        await session.close()
        await std.stop()
        await fly.stop()
