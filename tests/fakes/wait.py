"""The one home of "wait until it is up": poll a coroutine until it answers, or until a TCP port
accepts connections, each with a deadline."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import aiohttp

T = TypeVar("T")


async def poll(
    what: str, fn: Callable[[], Awaitable[T | None]], within: float = 20.0, every: float = 0.2
) -> T:
    """Call ``fn`` until it returns something other than ``None`` (an ``aiohttp.ClientError``
    counts as not yet); fail after ``within`` s."""
    deadline = time.monotonic() + within
    while True:
        with contextlib.suppress(aiohttp.ClientError):
            got = await fn()
            if got is not None:
                return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(every)


async def until_listening(port: int, within: float = 60.0) -> None:
    """Wait until something accepts TCP connections on 127.0.0.1:``port``."""

    async def accepts() -> bool | None:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return None
        writer.close()
        return True

    await poll(f"a listener on 127.0.0.1:{port}", accepts, within=within, every=0.1)
