"""Start simulator servers: in the current event loop, or as ``python -m specwatch simulate``.

In-process: ``handle = await start_simulator(config)`` binds ``host:port`` (port 0 = a free
port), starts the engine loops and returns a :class:`SimulatorHandle` (``url``, ``port``,
``server``); ``await handle.stop()`` cancels everything. Subprocess:
``proc = await spawn_simulator(["--role", "fly"])`` runs the CLI with ``--port 0``, reads the
``listening on`` line for the bound URL, waits for ``/health`` and returns a
:class:`SimulatorProcess`; ``await proc.stop()`` sends SIGTERM, then SIGKILL after a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web

from specwatch.simulate.config import SimConfig
from specwatch.simulate.server import SimServer

LISTEN_RE = re.compile(r"listening on (http://\S+)")
#: The directory holding the ``specwatch`` package (put on the child's PYTHONPATH).
_ROOT = str(Path(__file__).resolve().parents[2])


@dataclass
class SimulatorHandle:
    """A simulator served inside this process's event loop."""

    server: SimServer
    runner: web.AppRunner
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def stop(self) -> None:
        """Stop serving and cancel the engine loops."""
        await self.runner.cleanup()


async def start_simulator(
    config: SimConfig, *, host: str = "127.0.0.1", port: int = 0
) -> SimulatorHandle:
    """Serve ``config`` on ``host:port`` (0 = free port) in the running loop."""
    return await serve(SimServer(config), host=host, port=port)


async def serve(
    server: SimServer, *, host: str, port: int, shutdown_timeout: float = 10.0
) -> SimulatorHandle:
    """Serve ``server`` on ``host:port`` (0 = free port) in the running loop; the handle has the
    port actually bound (``specwatch simulate`` and the in-process simulators both start here).
    ``shutdown_timeout``: seconds :meth:`SimulatorHandle.stop` lets open requests finish before
    closing them (aiohttp's own default is 60 s)."""
    runner = web.AppRunner(
        server.app,
        access_log=None,
        handle_signals=False,
        shutdown_timeout=shutdown_timeout,
        keepalive_timeout=15.0,
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = port
    for addr in runner.addresses:
        if isinstance(addr, tuple) and len(addr) >= 2:
            bound = int(addr[1])
            break
    return SimulatorHandle(server, runner, host, bound)


@dataclass
class SimulatorProcess:
    """A simulator running as a child process."""

    process: asyncio.subprocess.Process
    url: str
    drain_task: asyncio.Task[None] | None = None

    async def stop(self, grace_s: float = 10.0) -> int:
        """SIGTERM, wait up to ``grace_s`` seconds, then SIGKILL; returns the exit code."""
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), grace_s)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.process.kill()
                await self.process.wait()
        if self.drain_task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self.drain_task
        rc = self.process.returncode
        return -1 if rc is None else rc


async def spawn_simulator(
    args: Sequence[str],
    *,
    host: str = "127.0.0.1",
    startup_timeout: float = 30.0,
    env: Mapping[str, str] | None = None,
) -> SimulatorProcess:
    """Run ``python -m specwatch simulate --host HOST --port 0 *args`` and wait until healthy.

    Raises ``RuntimeError`` when the process exits or is not healthy within ``startup_timeout``.
    """
    full_env = dict(os.environ if env is None else env)
    full_env["PYTHONPATH"] = _ROOT + (
        os.pathsep + full_env["PYTHONPATH"] if full_env.get("PYTHONPATH") else ""
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "specwatch", "simulate", "--host", host, "--port", "0", *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env=full_env,
    )  # fmt: skip
    handle = SimulatorProcess(proc, "")
    try:
        async with asyncio.timeout(startup_timeout):
            assert proc.stdout is not None
            while True:
                line = await proc.stdout.readline()
                if not line:
                    raise RuntimeError(f"simulator exited early (rc={await proc.wait()})")
                m = LISTEN_RE.search(line.decode(errors="replace"))
                if m:
                    handle.url = m.group(1)
                    break
            async with aiohttp.ClientSession() as session:
                while True:
                    try:
                        async with session.get(handle.url + "/health") as r:
                            if r.status == 200:
                                break
                    except aiohttp.ClientError:
                        pass
                    await asyncio.sleep(0.05)
    except (TimeoutError, RuntimeError):
        await handle.stop(grace_s=2.0)
        raise RuntimeError("simulator did not become healthy") from None
    # keep draining stdout so the child never blocks on a full pipe
    handle.drain_task = asyncio.get_running_loop().create_task(_drain(proc))
    return handle


async def _drain(proc: asyncio.subprocess.Process) -> None:
    if proc.stdout is None:
        return
    while await proc.stdout.readline():
        pass
