"""fetch_metrics against hostile servers: Content-Encoding lies, gzip bombs, cut gzip streams.

Each server is a real aiohttp server on port 0. The reason labels are the ones counted in
``specwatch_scrape_errors_total{reason}``.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from specwatch.observe.fetch import fetch_metrics

GOOD = 'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 7\n'
CAP = 64 * 1024

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _reply(data: bytes, encoding: str | None) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        headers = {"Content-Type": "text/plain; version=0.0.4"}
        if encoding is not None:
            headers["Content-Encoding"] = encoding
        return web.Response(body=data, headers=headers)

    return handle


def _bomb(size: int) -> bytes:
    co = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return co.compress(b"#" * size) + co.flush()


ROUTES: dict[str, Handler] = {
    "/gzip": _reply(gzip.compress(GOOD.encode()), "gzip"),
    "/x-gzip": _reply(gzip.compress(GOOD.encode()), "x-gzip"),
    "/deflate": _reply(zlib.compress(GOOD.encode()), "deflate"),
    "/gzip-lie": _reply(GOOD.encode(), "gzip"),  # says gzip, sends plain text
    "/brotli": _reply(GOOD.encode(), "br"),
    "/unknown": _reply(GOOD.encode(), "x-custom"),
    "/gzip-cut": _reply(gzip.compress(GOOD.encode())[:-12], "gzip"),  # no gzip trailer
    "/bomb": _reply(_bomb(50 * 1024 * 1024), "gzip"),  # ~50 KB on the wire, 50 MB inflated
    "/just-over": _reply(gzip.compress(b"#" * (CAP + 1)), "gzip"),
    "/at-cap": _reply(gzip.compress(b"#" * (CAP - len(GOOD)) + GOOD.encode()), "gzip"),
}


@pytest.fixture
async def base() -> AsyncIterator[str]:
    app = web.Application()
    for path, handler in ROUTES.items():
        app.router.add_get(path, handler)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        yield str(server.make_url(""))
    finally:
        await server.close()


async def _fetch(base: str, path: str) -> tuple[bool, str | None, str, int]:
    async with aiohttp.ClientSession() as session:
        r = await fetch_metrics(session, base + path, timeout_seconds=5.0, max_body_bytes=CAP)
    return r.ok, r.reason, r.body, len(r.body)


@pytest.mark.parametrize("path", ["/gzip", "/x-gzip", "/deflate"])
async def test_compressed_bodies_are_read(base: str, path: str) -> None:
    """gzip and deflate bodies are inflated and read."""
    ok, reason, text, _ = await _fetch(base, path)
    assert (ok, reason, text) == (True, None, GOOD)


async def test_body_exactly_at_cap_after_inflating_is_read(base: str) -> None:
    """A body exactly at the size cap after inflating is read."""
    ok, reason, text, size = await _fetch(base, "/at-cap")
    assert (ok, reason, size) == (True, None, CAP)
    assert text.endswith(GOOD)


@pytest.mark.parametrize("path", ["/bomb", "/just-over"])
async def test_inflated_size_over_cap_is_too_large(base: str, path: str) -> None:
    """A body over the cap once inflated fails as too_large."""
    ok, reason, text, _ = await _fetch(base, path)
    assert (ok, reason, text) == (False, "too_large", "")


@pytest.mark.parametrize(
    ("path", "detail"),
    [
        ("/gzip-lie", "bad gzip body"),
        ("/brotli", "unsupported Content-Encoding 'br'"),
        ("/unknown", "unsupported Content-Encoding 'x-custom'"),
    ],
)
async def test_wrong_or_unknown_encoding_is_decode_error(base: str, path: str, detail: str) -> None:
    """Before: a plain body labelled gzip was counted as ``truncated``, ``br`` as ``http_error``
    and an unknown encoding was read as if it were plain text."""
    async with aiohttp.ClientSession() as session:
        r = await fetch_metrics(session, base + path, timeout_seconds=5.0, max_body_bytes=CAP)
    assert (r.ok, r.reason, r.status) == (False, "decode", 200)
    assert detail in r.detail


async def test_gzip_stream_without_its_end_is_truncated(base: str) -> None:
    """A gzip stream cut before its end fails as truncated."""
    ok, reason, text, _ = await _fetch(base, "/gzip-cut")
    assert (ok, reason, text) == (False, "truncated", "")
