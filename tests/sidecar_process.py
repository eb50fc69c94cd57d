"""``specwatch run`` / ``specwatch simulate`` as real processes on free loopback ports, for tests
that drive specwatch as an operator does (a config file, signals, raw sockets)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from tests.fakes import REPO, free_port


@dataclass
class Process:
    """A running specwatch process: ``url`` (its base URL), ``port``, ``log`` (stderr file)."""

    proc: asyncio.subprocess.Process
    url: str
    port: int
    log: Path

    def log_text(self) -> str:
        """Everything the process wrote to stderr and stdout so far."""
        return self.log.read_text(encoding="utf-8", errors="replace")

    async def stop(self, sig: int) -> tuple[int, float]:
        """Send ``sig``; return (exit code, seconds from the signal to the exit)."""
        started = time.monotonic()
        self.proc.send_signal(sig)
        code = await asyncio.wait_for(self.proc.wait(), timeout=60)
        return code, time.monotonic() - started


async def run_specwatch(*args: str) -> tuple[int, str, str]:
    """``python -m specwatch ARGS...`` as a child process, to its exit: (exit code, stdout,
    stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "specwatch",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def run_config(tmp: Path, port: int, **groups: Any) -> Path:
    """A config file for ``specwatch run`` listening on ``port`` with one unreachable target
    and the given groups (``server={...}``, ``shadow={...}`` ...) merged in."""
    doc: dict[str, Any] = {
        "targets": [{"name": "fly", "url": "http://127.0.0.1:9/metrics"}],
        "server": {"host": "127.0.0.1", "port": port},
        "ledger": {"path": str(tmp / "ledger.sqlite")},
        "log": {"level": "INFO", "format": "json"},
    }
    for key, value in groups.items():
        if isinstance(value, dict) and isinstance(doc.get(key), dict):
            doc[key] = {**doc[key], **value}
        else:
            doc[key] = value
    path = tmp / "specwatch.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


@contextlib.asynccontextmanager
async def specwatch_process(
    tmp: Path, args: list[str], *, port: int, ready_path: str = "/healthz"
) -> AsyncIterator[Process]:
    """``python -m specwatch <args>`` with its output in ``tmp/specwatch.log``; yields once
    ``ready_path`` answers on ``port``; killed on exit if still running."""
    log = tmp / "specwatch.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "specwatch",
            *args,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            cwd=str(REPO),
        )
    url = f"http://127.0.0.1:{port}"
    p = Process(proc, url, port, log)
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(600):
                if proc.returncode is not None:
                    raise AssertionError(f"specwatch exited early:\n{p.log_text()[-3000:]}")
                try:
                    async with session.get(url + ready_path) as r:
                        if r.status < 500:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
            else:
                raise AssertionError(f"specwatch never answered:\n{p.log_text()[-3000:]}")
        yield p
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


__all__ = ["Process", "free_port", "run_config", "specwatch_process"]
