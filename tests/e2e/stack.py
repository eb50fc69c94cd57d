"""End-to-end harness: two simulated vLLM servers (standard and FLy) under load, specwatch's app
with the alerting component, and helpers to poll real Alertmanager / Prometheus HTTP APIs.

Everything binds 127.0.0.1 on free ports; every wait polls with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import yaml
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
from tests.fakes import free_port

AM_BIN = shutil.which("prometheus-alertmanager") or "/usr/bin/prometheus-alertmanager"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"

T = TypeVar("T")


async def poll(
    what: str, fn: Callable[[], Awaitable[T | None]], within: float = 20.0, every: float = 0.2
) -> T:
    """Call ``fn`` until it returns something other than ``None``; fail after ``within`` s."""
    deadline = time.monotonic() + within
    while True:
        with contextlib.suppress(aiohttp.ClientError):
            got = await fn()
            if got is not None:
                return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(every)


class Alertmanager:
    """A real Alertmanager on 127.0.0.1:<free port>, restartable on the same port. By default each
    ``start`` gets fresh storage, so after a restart it only knows what clients (re)send; with
    ``keep_storage`` every start reuses one storage directory (silences, notification log and
    alerts persisted there survive a restart)."""

    def __init__(self, tmp: Path, *, keep_storage: bool = False) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = tmp / "alertmanager.yml"
        self.config.write_text(
            'route:\n  receiver: "null"\n  group_by: ["alertname"]\nreceivers:\n  - name: "null"\n'
        )
        self.log = tmp / "alertmanager.log"
        self.keep_storage = keep_storage
        self.runs = 0
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self, session: aiohttp.ClientSession) -> None:
        """Start the process and wait (15 s at most) until ``/-/ready`` answers 200."""
        self.runs += 1
        storage = self.tmp / ("am-data" if self.keep_storage else f"am-data-{self.runs}")
        storage.mkdir(exist_ok=self.keep_storage)
        with self.log.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                AM_BIN,
                f"--config.file={self.config}",
                f"--storage.path={storage}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--cluster.listen-address=",
                "--log.level=warn",
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
            )

        async def ready() -> bool | None:
            assert self.proc is not None
            assert self.proc.returncode is None, (
                f"alertmanager exited: {self.log.read_text()[-2000:]}"
            )
            async with session.get(f"{self.url}/-/ready") as resp:
                return True if resp.status == 200 else None

        await poll("alertmanager ready", ready, within=15, every=0.05)

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s; a no-op when it is not running."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), timeout=10)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        self.proc = None

    async def alerts(
        self, session: aiohttp.ClientSession, alertname: str | None = None
    ) -> list[dict[str, Any]]:
        """Alerts Alertmanager lists now (active ones; resolved alerts are not listed), only
        those named ``alertname`` when given."""
        params = {} if alertname is None else {"filter": f'alertname="{alertname}"'}
        async with session.get(f"{self.url}/api/v2/alerts", params=params) as resp:
            resp.raise_for_status()
            body: list[dict[str, Any]] = await resp.json()
            return body


@contextlib.asynccontextmanager
async def running_alertmanager(
    tmp: Path, session: aiohttp.ClientSession, *, keep_storage: bool = False
) -> AsyncIterator[Alertmanager]:
    """An :class:`Alertmanager` (files under ``tmp``) started and ready; stopped on exit, whatever
    state a test left it in."""
    am = Alertmanager(tmp, keep_storage=keep_storage)
    await am.start(session)
    try:
        yield am
    finally:
        await am.stop()


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


@contextlib.asynccontextmanager
async def run_prometheus(
    tmp: Path, config: dict[str, Any], session: aiohttp.ClientSession
) -> AsyncIterator[str]:
    """A real Prometheus (Debian binary) on a free loopback port with ``config`` (a
    prometheus.yml as a dict) and its TSDB under ``tmp``; yields its base URL once ``/-/ready``
    answers, and terminates it (then kills it after 20 s) on exit."""
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    log_path = tmp / "prometheus.log"
    with log_path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            PROMETHEUS,
            f"--config.file={path}",
            f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:

        async def ready() -> bool | None:
            assert proc.returncode is None, log_path.read_text()[-2000:]
            async with session.get(f"{url}/-/ready") as resp:
                return True if resp.status == 200 else None

        await poll("prometheus ready", ready, within=30)
        yield url
    finally:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), timeout=20)
        except TimeoutError:
            proc.kill()
            await proc.wait()
