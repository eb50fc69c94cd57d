"""The one Alertmanager starter: a real ``prometheus-alertmanager`` (Debian's) on 127.0.0.1 and a
free port, restartable on the same port."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from tests.fakes import free_port
from tests.fakes.wait import poll

AM_BIN = shutil.which("prometheus-alertmanager") or "/usr/bin/prometheus-alertmanager"

#: Route everything to a receiver that sends nothing, grouped by alert name.
NULL_ROUTE = 'route:\n  receiver: "null"\n  group_by: ["alertname"]\nreceivers:\n  - name: "null"\n'


class Alertmanager:
    """A real Alertmanager with ``config`` (YAML text; default :data:`NULL_ROUTE`), its files and
    log under ``tmp``. By default each ``start`` gets fresh storage, so after a restart it only
    knows what clients (re)send; with ``keep_storage`` every start reuses one storage directory
    (silences, notification log and alerts persisted there survive a restart). With
    ``cluster_port`` it is a cluster member gossiping on 127.0.0.1:``cluster_port`` and joining
    the members at ``cluster_peers`` (their cluster ports), with short gossip, settle and peer
    timings (``--cluster.peer-timeout`` 1 s); without, HA mode is off."""

    def __init__(
        self,
        tmp: Path,
        *,
        config: str = NULL_ROUTE,
        keep_storage: bool = False,
        cluster_port: int | None = None,
        cluster_peers: Sequence[int] = (),
    ) -> None:
        self.tmp = tmp
        self.cluster_port = cluster_port
        self.cluster_peers = tuple(cluster_peers)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = tmp / "alertmanager.yml"
        self.config.write_text(config)
        self.log = tmp / "alertmanager.log"
        self.keep_storage = keep_storage
        self.runs = 0
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self, session: aiohttp.ClientSession) -> None:
        """Start the process and wait (15 s at most) until ``/-/ready`` answers 200."""
        self.runs += 1
        storage = self.tmp / ("am-data" if self.keep_storage else f"am-data-{self.runs}")
        storage.mkdir(exist_ok=self.keep_storage)
        if self.cluster_port is None:
            cluster = ["--cluster.listen-address="]
        else:
            cluster = [
                f"--cluster.listen-address=127.0.0.1:{self.cluster_port}",
                f"--cluster.advertise-address=127.0.0.1:{self.cluster_port}",
                *(f"--cluster.peer=127.0.0.1:{p}" for p in self.cluster_peers),
                "--cluster.peer-timeout=1s",
                "--cluster.settle-timeout=2s",
                "--cluster.pushpull-interval=2s",
                "--cluster.reconnect-interval=1s",
            ]
        with self.log.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                AM_BIN,
                f"--config.file={self.config}",
                f"--storage.path={storage}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                *cluster,
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
    tmp: Path,
    session: aiohttp.ClientSession,
    *,
    config: str = NULL_ROUTE,
    keep_storage: bool = False,
) -> AsyncIterator[Alertmanager]:
    """An :class:`Alertmanager` (files under ``tmp``) started and ready; stopped on exit, whatever
    state a test left it in."""
    am = Alertmanager(tmp, config=config, keep_storage=keep_storage)
    await am.start(session)
    try:
        yield am
    finally:
        await am.stop()


@contextlib.asynccontextmanager
async def running_cluster(
    tmp: Path, session: aiohttp.ClientSession, *, config: str = NULL_ROUTE
) -> AsyncIterator[list[Alertmanager]]:
    """Three clustered Alertmanagers, started and ready, each knowing the other two; stopped
    on exit."""
    ports = [free_port() for _ in range(3)]
    ams = []
    for i, port in enumerate(ports):
        (tmp / f"am{i}").mkdir()
        others = [p for p in ports if p != port]
        ams.append(
            Alertmanager(tmp / f"am{i}", config=config, cluster_port=port, cluster_peers=others)
        )
    try:
        await asyncio.gather(*(am.start(session) for am in ams))
        yield ams
    finally:
        for am in ams:
            await am.stop()


class Webhook:
    """An aiohttp receiver on 127.0.0.1 that keeps every notification Alertmanager posts."""

    def __init__(self) -> None:
        self.notifications: list[dict[str, Any]] = []
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/hook"

    async def _hook(self, request: web.Request) -> web.Response:
        self.notifications.append(await request.json())
        return web.Response(text="ok")

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        app = web.Application()
        app.router.add_post("/hook", self._hook)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        try:
            yield
        finally:
            await runner.cleanup()

    def statuses_of(self, alertname: str) -> list[str]:
        """The status (``firing``, ``resolved``) of every notification of ``alertname``."""
        return [
            str(n["status"])
            for n in self.notifications
            if n.get("commonLabels", {}).get("alertname") == alertname
        ]

    def statuses(self) -> list[tuple[str, str]]:
        """``(notification status, startsAt of its first alert)`` for every notification."""
        return [(n["status"], n["alerts"][0]["startsAt"]) for n in self.notifications]


def hook_route(hook: Webhook) -> str:
    """Alertmanager's configuration routing everything to ``hook`` (resolved notifications on)."""
    return (
        "route:\n"
        '  receiver: hook\n  group_by: ["alertname"]\n'
        "  group_wait: 500ms\n  group_interval: 1s\n  repeat_interval: 1h\n"
        "receivers:\n"
        f"  - name: hook\n    webhook_configs:\n      - url: {hook.url}\n"
        "        send_resolved: true\n"
    )
