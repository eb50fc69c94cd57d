"""``server.port: 0`` lets the system pick a free port: ``specwatch run`` must then say which
one it got, or nobody can reach the sidecar it started."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

import aiohttp

from tests.fakes import REPO
from tests.sidecar_process import run_config


async def test_port_zero_logs_the_bound_port(tmp_path: Path) -> None:
    """With port 0 the log has a ``listening`` line whose URL is the bound port (not ``:0``),
    and ``/healthz`` answers 200 there."""
    cfg = run_config(tmp_path, 0)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "specwatch",
        "run",
        "--config",
        str(cfg),
        stderr=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL,
        cwd=str(REPO),
    )
    assert proc.stderr is not None
    try:
        url = None
        for _ in range(200):  # the start-up logs a few dozen lines at most
            line = await asyncio.wait_for(proc.stderr.readline(), 20)
            assert line, "specwatch ended without a listening line"
            event = json.loads(line)
            if event.get("event") == "listening":
                url = str(event["url"])
                break
        assert url is not None
        assert url.startswith("http://127.0.0.1:")
        assert not url.startswith("http://127.0.0.1:0/")
        healthz = url.removesuffix("/metrics") + "/healthz"
        async with aiohttp.ClientSession() as session, session.get(healthz) as r:
            assert r.status == 200
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
