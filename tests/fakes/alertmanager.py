"""The one Alertmanager starter: a real ``prometheus-alertmanager`` (Debian's) on 127.0.0.1 and a
free port, restartable on the same port."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from tests.fakes import free_port
from tests.fakes.wait import poll

AM_BIN = shutil.which("prometheus-alertmanager") or "/usr/bin/prometheus-alertmanager"

#: Route everything to a receiver that sends nothing, grouped by alert name.
NULL_ROUTE = 'route:\n  receiver: "null"\n  group_by: ["alertname"]\nreceivers:\n  - name: "null"\n'


class Alertmanager:
    """A real Alertmanager with ``config`` (YAML text; default :data:`NULL_ROUTE`), its files and
    log under ``tmp``. By default each ``start`` gets fresh storage, so after a restart it only
    knows what clients (re)send; with ``keep_storage`` every start reuses one storage directory
    (silences, notification log and alerts persisted there survive a restart)."""

    def __init__(self, tmp: Path, *, config: str = NULL_ROUTE, keep_storage: bool = False) -> None:
        self.tmp = tmp
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
