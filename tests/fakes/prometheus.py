"""The one Prometheus starter: a real ``prometheus`` (Debian's) on 127.0.0.1 and a free port."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from tests.fakes import free_port
from tests.fakes.wait import poll

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


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
