"""A fake vLLM ``/metrics`` server (a real aiohttp server on port 0) that plays scripted replies."""

from __future__ import annotations

import asyncio
import gzip
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web
from aiohttp.test_utils import TestServer


@dataclass(frozen=True)
class Reply:
    """One scripted reply: ``kind`` is ``body``, ``hang`` (never answers) or ``cut`` (announces
    more bytes than it sends, then closes)."""

    body: str = ""
    status: int = 200
    content_type: str = "text/plain; version=0.0.4; charset=utf-8"
    kind: str = "body"
    gzip: bool = False


class FakeVllm:
    """Serves ``/metrics`` from a queue of :class:`Reply`; the last reply repeats. With ``page``,
    the n-th scrape (from 1) answers ``page(n)`` instead (counters that advance per scrape)."""

    def __init__(self, token: str | None = None, page: Callable[[int], str] | None = None) -> None:
        self.replies: deque[Reply] = deque()
        self.token = token
        self.page = page
        self.scrapes = 0
        self.auth_seen: list[str | None] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._never = asyncio.Event()
        app = web.Application()
        app.router.add_get("/metrics", self._handle)
        self.server = TestServer(app, host="127.0.0.1")

    @property
    def url(self) -> str:
        return str(self.server.make_url("/metrics"))

    def push(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0)
            return await self._reply(request)
        finally:
            self.in_flight -= 1

    async def _reply(self, request: web.Request) -> web.StreamResponse:
        self.auth_seen.append(request.headers.get("Authorization"))
        if (
            self.token is not None
            and request.headers.get("Authorization") != f"Bearer {self.token}"
        ):
            return web.Response(status=401, text="unauthorized")
        self.scrapes += 1
        if self.page is not None:
            return web.Response(text=self.page(self.scrapes), content_type="text/plain")
        reply = self.replies.popleft() if len(self.replies) > 1 else self.replies[0]
        if reply.kind == "hang":
            await self._never.wait()
        data = reply.body.encode()
        if reply.kind == "cut":
            resp = web.StreamResponse(status=200, headers={"Content-Type": reply.content_type})
            resp.content_length = len(data) + 1000
            await resp.prepare(request)
            await resp.write(data)
            assert request.transport is not None
            request.transport.close()
            return resp
        headers = {"Content-Type": reply.content_type}
        if reply.gzip:
            data = gzip.compress(data)
            headers["Content-Encoding"] = "gzip"
        return web.Response(status=reply.status, body=data, headers=headers)

    async def __aenter__(self) -> FakeVllm:
        await self.server.start_server()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._never.set()
        await self.server.close()
