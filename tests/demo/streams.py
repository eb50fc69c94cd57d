"""Test helper: a text stream the in-process demo writes to, awaited by tests."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Callable


class WatchedOutput(io.StringIO):
    """A text stream that wakes a waiter on every write."""

    def __init__(self) -> None:
        super().__init__()
        self.written = asyncio.Event()

    def write(self, text: str) -> int:
        self.written.set()
        return super().write(text)

    async def until(self, done: Callable[[str], bool]) -> str:
        """Wait until ``done(all text so far)`` holds; returns the text."""
        while not done(self.getvalue()):
            self.written.clear()
            await self.written.wait()
        return self.getvalue()
