"""fetch_metrics against a target that answers with a redirect (a real aiohttp server on port
0)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from specwatch.observe.fetch import fetch_metrics

SECRET = "s3cr3t-query-token"


async def _redirect(request: web.Request) -> web.StreamResponse:
    raise web.HTTPFound(f"http://other.example:9000/metrics/?token={SECRET}")


@pytest.fixture
async def base() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_get("/redirect", _redirect)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        yield str(server.make_url(""))
    finally:
        await server.close()


async def test_a_redirect_names_where_it_points_with_the_query_hidden(base: str) -> None:
    """A 302 is a failed scrape (``http_status``, redirects are not followed) whose detail names
    the Location, so the user can put that URL in the config; its query value is hidden.
    Before: the detail was only "HTTP 302"."""
    async with aiohttp.ClientSession() as session:
        r = await fetch_metrics(
            session, base + "/redirect", timeout_seconds=5.0, max_body_bytes=1024
        )
    assert (r.ok, r.reason, r.status) == (False, "http_status", 302)
    assert r.detail == (
        "HTTP 302 redirect to http://other.example:9000/metrics/?token=********** "
        "(redirects are not followed: give that URL)"
    )
    assert SECRET not in r.detail
