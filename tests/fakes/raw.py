"""The one raw-socket client: bytes written as they are (no client library to tidy a request
head), everything the server sends back until it closes."""

from __future__ import annotations

import asyncio

#: How long :func:`raw_exchange` waits for the server to close (then ``TimeoutError``).
READ_LIMIT_S = 30.0


async def raw_exchange(port: int, data: bytes) -> bytes:
    """Write ``data`` on a new connection to 127.0.0.1:``port`` and read until the server closes
    it (:data:`READ_LIMIT_S` at most)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout=READ_LIMIT_S)
    finally:
        writer.close()
        await writer.wait_closed()
