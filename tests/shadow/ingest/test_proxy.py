"""Streaming reverse proxy: byte-for-byte relay, hop-by-hop headers, disconnects, fail-open."""

from __future__ import annotations

import asyncio
import gzip
import json
import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from specwatch.shadow.ingest.offer import IngestCounters
from specwatch.shadow.ingest.proxy import ShadowProxy
from specwatch.shadow.pipeline import ShadowPipeline
from specwatch.shadow.settings import ArmEndpoint, ShadowSettings
from specwatch.shadow.values import ReplayPair, ShadowRequest
from tests.fakes import FakeWallClock, PairSinkFn
from tests.fakes.arm import FakeArm, serve_arm


def long_sse_stream(n_events: int, seed: int) -> list[bytes]:
    """A long OpenAI-style SSE body cut into random-sized writes (UTF-8, CRLF, comments)."""
    rng = random.Random(seed)
    parts = []
    for i in range(n_events):
        piece = rng.choice(["tok", " café", "—", "日本", "\\n", '"q"', "🙂"])
        chunk = {"id": "x", "choices": [{"index": 0, "delta": {"content": f"{piece}{i}"}}]}
        eol = "\r\n" if i % 7 == 0 else "\n"
        parts.append(f"data: {json.dumps(chunk, ensure_ascii=False)}{eol}{eol}")
        if i % 50 == 0:
            parts.append(": keep-alive\n\n")
    parts.append('data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}\n\n')
    parts.append("data: [DONE]\n\n")
    raw = "".join(parts).encode()
    writes, pos = [], 0
    while pos < len(raw):
        n = rng.randint(1, 700)
        writes.append(raw[pos : pos + n])
        pos += n
    return writes


class Upstream:
    """The live server behind the proxy."""

    def __init__(self) -> None:
        self.sse_writes = long_sse_stream(3000, seed=5)
        self.seen_headers: list[dict[str, str]] = []
        self.first_chunk_sent = asyncio.Event()
        self.continue_stream = asyncio.Event()
        self.saw_disconnect = asyncio.Event()
        self.json_body = json.dumps({"choices": [{"index": 0, "text": "live answer"}]}).encode()

    async def completions(self, request: web.Request) -> web.StreamResponse:
        self.seen_headers.append(dict(request.headers))
        body = await request.json()
        if body.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for w in self.sse_writes:
                await resp.write(w)
            await resp.write_eof()
            return resp
        return web.Response(body=self.json_body, content_type="application/json")

    async def gated(self, request: web.Request) -> web.StreamResponse:
        """Sends one chunk, then waits for the test before sending the rest."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: first\n\n")
        self.first_chunk_sent.set()
        await self.continue_stream.wait()
        await resp.write(b"data: second\n\n")
        await resp.write_eof()
        return resp

    async def endless(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            while True:
                await resp.write(b"data: tick\n\n")
                await asyncio.sleep(0.01)
        except (ConnectionResetError, asyncio.CancelledError):
            self.saw_disconnect.set()
            raise

    async def headers(self, request: web.Request) -> web.StreamResponse:
        self.seen_headers.append(dict(request.headers))
        resp = web.Response(text="h")
        resp.headers["Connection"] = "X-Up-Hop"
        resp.headers["X-Up-Hop"] = "secret"
        resp.headers["Keep-Alive"] = "timeout=5"
        resp.headers["X-Up-End"] = "kept"
        return resp

    async def gzipped(self, request: web.Request) -> web.StreamResponse:
        data = gzip.compress(b'{"a": 1}' * 100, mtime=0)
        return web.Response(
            body=data, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"}
        )

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.completions)
        app.router.add_get("/gated", self.gated)
        app.router.add_get("/endless", self.endless)
        app.router.add_get("/headers", self.headers)
        app.router.add_get("/gz", self.gzipped)
        return app


@asynccontextmanager
async def running(app: web.Application) -> AsyncIterator[str]:
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        await server.close()


@asynccontextmanager
async def proxy_for(upstream: str, offer: Any) -> AsyncIterator[tuple[str, ShadowProxy]]:
    proxy = ShadowProxy(
        ShadowSettings(proxy_upstream=upstream),
        offer,
        counters=IngestCounters(),
        wall_clock=FakeWallClock(0.0),
    )
    port = await proxy.start("127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{port}", proxy
    finally:
        await proxy.stop()


def _session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(auto_decompress=False)


async def test_long_sse_stream_passes_byte_for_byte_and_copy_is_offered() -> None:
    """A long SSE stream passes through the proxy byte for byte and one copy of the request is
    offered."""
    up = Upstream()
    offered: list[ShadowRequest] = []

    def offer(r: ShadowRequest) -> str:
        offered.append(r)
        return "admitted"

    body = {"model": "m", "prompt": "x", "stream": True}
    async with running(up.app()) as base, proxy_for(base, offer) as (purl, proxy), _session() as s:
        rid = {"X-Request-Id": "live-7f3a"}
        async with s.post(purl + "/v1/completions?x=1", json=body, headers=rid) as r:
            got = await r.read()
            assert r.status == 200
            assert r.headers["Content-Type"] == "text/event-stream"
        async with s.post(base + "/v1/completions", json=body) as r:
            direct = await r.read()
    expected = b"".join(up.sse_writes)
    assert len(expected) > 200_000
    assert got == expected == direct
    assert len(offered) == 1
    assert offered[0].body == body
    assert offered[0].path == "/v1/completions"
    assert offered[0].request_id == "live-7f3a"
    assert [h.get("X-Request-ID") for h in up.seen_headers] == ["live-7f3a", None]
    assert proxy.counters.outcomes[("proxy", "admitted")] == 1


async def test_stream_is_relayed_before_upstream_finishes() -> None:
    """The proxy relays the first chunk before the upstream sends the rest."""
    up = Upstream()
    async with (
        running(up.app()) as base,
        proxy_for(base, lambda r: "x") as (purl, _),
        _session() as s,
        s.get(purl + "/gated") as r,
    ):
        first = await r.content.readuntil(b"\n\n")
        # the upstream has not sent the rest yet: the proxy did not buffer the first chunk
        assert first == b"data: first\n\n"
        assert not up.continue_stream.is_set()
        up.continue_stream.set()
        assert await r.content.read() == b"data: second\n\n"


async def test_gzip_body_and_content_length_pass_unchanged() -> None:
    """A gzip body and its Content-Length pass through unchanged."""
    up = Upstream()
    async with (
        running(up.app()) as base,
        proxy_for(base, lambda r: "x") as (purl, _),
        _session() as s,
        s.get(purl + "/gz") as r,
    ):
        got, enc, cl = await r.read(), r.headers["Content-Encoding"], r.content_length
    assert enc == "gzip"
    assert got == gzip.compress(b'{"a": 1}' * 100, mtime=0)
    assert cl == len(got)


async def test_hop_by_hop_headers_removed_both_ways() -> None:
    """Hop-by-hop headers, including those named in Connection, are dropped in both directions."""
    up = Upstream()
    async with (
        running(up.app()) as base,
        proxy_for(base, lambda r: "x") as (purl, _),
        _session() as s,
    ):
        hdrs = {
            "Connection": "keep-alive, X-Client-Hop",
            "X-Client-Hop": "secret",
            "Keep-Alive": "timeout=9",
            "TE": "trailers",
            "Proxy-Connection": "keep-alive",
            "X-End": "kept",
        }
        async with s.get(purl + "/headers", headers=hdrs) as r:
            assert await r.text() == "h"
            got = r.headers
            assert got["X-Up-End"] == "kept"
            assert "X-Up-Hop" not in got
            assert "Keep-Alive" not in got
    seen = up.seen_headers[0]
    assert seen["X-End"] == "kept"
    for h in ("X-Client-Hop", "Keep-Alive", "TE", "Proxy-Connection"):
        assert h not in seen
    assert seen["X-Forwarded-For"] == "127.0.0.1"


async def test_client_disconnect_is_propagated_upstream() -> None:
    """A client dropping mid-stream closes the upstream connection and is counted."""
    up = Upstream()
    async with running(up.app()) as base, proxy_for(base, lambda r: "x") as (purl, proxy):
        async with _session() as s:
            r = await s.get(purl + "/endless")
            assert await r.content.readuntil(b"\n\n") == b"data: tick\n\n"
            r.close()  # drop the client connection mid-stream
        await asyncio.wait_for(up.saw_disconnect.wait(), timeout=20)
    assert proxy.counters.proxy_client_disconnects >= 1


async def test_upstream_down_answers_502_json() -> None:
    """An unreachable upstream answers 502 with a JSON error and counts a connect error."""
    async with (
        proxy_for("http://127.0.0.1:1", lambda r: "x") as (purl, proxy),
        _session() as s,
        s.get(purl + "/v1/models") as r,
    ):
        assert r.status == 502
        assert "upstream connect" in (await r.json())["error"]["message"]
    assert proxy.counters.proxy_upstream_errors["connect"] == 1


async def test_failing_offer_never_touches_the_live_response() -> None:
    """An offer that raises leaves live responses unchanged and is counted as an offer error."""
    up = Upstream()

    def broken(r: ShadowRequest) -> str:
        raise RuntimeError("shadow side exploded")

    async with running(up.app()) as base, proxy_for(base, broken) as (purl, proxy), _session() as s:
        for stream in (False, True):
            async with s.post(
                purl + "/v1/completions", json={"prompt": "p", "stream": stream}
            ) as r:
                got = await r.read()
            assert got == (b"".join(up.sse_writes) if stream else up.json_body)
        async with s.post(purl + "/v1/completions", data=b"{not json") as r:
            assert r.status == 500  # the upstream's own answer to bad JSON, relayed
    await asyncio.sleep(0)
    assert proxy.counters.errors[("proxy", "offer_error")] == 2
    assert proxy.counters.errors[("proxy", "invalid_json")] == 1


async def test_hanging_then_killed_shadow_side_changes_nothing_on_live_path() -> None:
    """Hanging shadow arms, then a stopped shadow side, change nothing on the live proxy path."""
    up = Upstream()
    std, fly = FakeArm(mode="hang"), FakeArm(mode="hang")
    pairs: list[ReplayPair] = []

    async def sink(p: ReplayPair) -> None:
        pairs.append(p)

    async with running(up.app()) as base, serve_arm(std) as su, serve_arm(fly) as fu:
        settings = ShadowSettings(
            enabled=True,
            modes=("proxy",),
            sample_probability=1.0,
            max_shadow_rps=1000,
            max_in_flight=2,
            queue_size=4,
            standard=ArmEndpoint(url=su, timeout_seconds=60),
            fly=ArmEndpoint(url=fu, timeout_seconds=60),
            proxy_listen_host="127.0.0.1",
            proxy_listen_port=0,
            proxy_upstream=base,
        )
        async with aiohttp.ClientSession() as replay_session:
            pipe = ShadowPipeline.from_settings(
                settings, session=replay_session, sink=PairSinkFn(sink)
            )
            await pipe.start()
            assert pipe.proxy is not None
            assert pipe.proxy.port is not None
            purl = f"http://127.0.0.1:{pipe.proxy.port}"
            expected_sse = b"".join(up.sse_writes)
            async with _session() as s:

                async def live(i: int) -> bytes:
                    body = {"prompt": f"q{i}", "stream": i % 2 == 1}
                    async with s.post(purl + "/v1/completions", json=body) as r:
                        assert r.status == 200
                        return await r.read()

                first = await asyncio.gather(*(live(i) for i in range(12)))
                # shadow arms are still hanging on the first requests, the queue is full
                await asyncio.wait_for(std.arrived.wait(), timeout=20)
                assert not std.release.is_set()
                assert pipe.in_flight == 2
                # now kill the shadow side mid-run: arm servers gone, workers cancelled
                for t in pipe._tasks:
                    t.cancel()
                second = await asyncio.gather(*(live(i) for i in range(12, 24)))
            await _until_true(lambda: pipe.metrics().proxy_requests == 24)
            m = pipe.metrics()
            await pipe.stop()
    for i, got in enumerate(first + second):
        assert got == (expected_sse if i % 2 == 1 else up.json_body)
    assert pairs == []
    assert m.proxy_requests == 24
    assert m.dropped["queue_full"] > 0


async def test_copy_keeps_its_category_and_the_answer_passes_byte_for_byte() -> None:
    """The copy of a streamed request carries its category header and its parsed body; the
    whole streamed answer is byte for byte the upstream's."""
    up = Upstream()
    offered: list[tuple[str | None, Any]] = []

    def offer(r: ShadowRequest) -> str:
        offered.append((r.category, r.body))
        return "admitted"

    async with running(up.app()) as base, proxy_for(base, offer) as (url, proxy):
        async with (
            _session() as s,
            s.post(
                f"{url}/v1/completions",
                json={"stream": True},
                headers={"X-Specwatch-Category": "code"},
            ) as r,
        ):
            got = await r.read()
        await _until_true(lambda: len(offered) == 1)
    assert got == b"".join(up.sse_writes)
    assert offered == [("code", {"stream": True})]
    assert proxy.counters.proxy_requests == 1
    assert proxy.counters.outcomes[("proxy", "admitted")] == 1


async def _until_true(cond: Callable[[], bool]) -> None:
    async def wait() -> None:
        while not cond():  # noqa: ASYNC110 (polls a plain list)
            await asyncio.sleep(0.01)

    await asyncio.wait_for(wait(), timeout=20)


async def test_upstream_dying_mid_stream_truncates_the_client_response() -> None:
    """An upstream dying mid-stream ends the client's stream with an error and counts a
    disconnect."""

    async def dying(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: partial\n\n")
        assert request.transport is not None
        request.transport.abort()  # upstream crashes mid-stream
        return resp

    app = web.Application()
    app.router.add_get("/dying", dying)
    async with (
        running(app) as base,
        proxy_for(base, lambda r: "x") as (purl, proxy),
        _session() as s,
        s.get(purl + "/dying") as r,
    ):
        assert r.status == 200
        assert await r.content.readuntil(b"\n\n") == b"data: partial\n\n"
        with pytest.raises(aiohttp.ClientPayloadError):
            await r.content.read()  # never a clean end of a short stream
    assert proxy.counters.proxy_upstream_errors["disconnected"] == 1


async def test_proxy_credentials_never_pass_either_way() -> None:
    """``Proxy-Authorization`` sent by the client and ``Proxy-Authenticate`` sent by the upstream
    are credentials for the proxy hop: neither reaches the other side; ``Authorization`` (for
    the upstream) does."""
    up = Upstream()

    async def creds(request: web.Request) -> web.StreamResponse:
        up.seen_headers.append(dict(request.headers))
        resp = web.Response(text="c")
        resp.headers["Proxy-Authenticate"] = 'Basic realm="upstream-proxy"'
        resp.headers["X-Up-End"] = "kept"
        return resp

    app = up.app()
    app.router.add_get("/creds", creds)
    async with running(app) as base, proxy_for(base, lambda r: "x") as (purl, _), _session() as s:
        hdrs = {"Proxy-Authorization": "Basic c2VjcmV0", "Authorization": "Bearer live"}
        async with s.get(purl + "/creds", headers=hdrs) as r:
            assert await r.text() == "c"
            assert "Proxy-Authenticate" not in r.headers
            assert r.headers["X-Up-End"] == "kept"
    seen = up.seen_headers[0]
    assert "Proxy-Authorization" not in seen
    assert seen["Authorization"] == "Bearer live"


async def test_client_leaving_mid_stream_is_not_an_upstream_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A client that reads one event and drops the connection is one client disconnect: no
    upstream error is counted, nothing is logged as ``proxy upstream failed`` and no record
    carries a traceback."""
    up = Upstream()
    with caplog.at_level("DEBUG"):
        async with running(up.app()) as base, proxy_for(base, lambda r: "x") as (purl, proxy):
            async with _session() as s:
                r = await s.get(purl + "/endless")
                assert await r.content.readuntil(b"\n\n") == b"data: tick\n\n"
                r.close()
            await asyncio.wait_for(up.saw_disconnect.wait(), timeout=20)
            await asyncio.sleep(0.2)  # let the proxy's handler finish
    assert proxy.counters.proxy_client_disconnects == 1
    assert dict(proxy.counters.proxy_upstream_errors) == {}
    assert not [x for x in caplog.records if x.getMessage() == "proxy upstream failed"]
    assert not [x for x in caplog.records if x.exc_info]


async def test_upload_cut_mid_body_is_counted_without_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A client announcing 5000 body bytes that sends 100 and closes: the copy is counted as
    ``incomplete_body`` (source ``proxy``), no upstream error, no record with a traceback."""
    up = Upstream()
    with caplog.at_level("DEBUG"):
        async with running(up.app()) as base, proxy_for(base, lambda r: "x") as (purl, proxy):
            port = int(purl.rsplit(":", 1)[1])
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 5000\r\n\r\n" + b'{"prompt": "' + b"x" * 88
            )
            await writer.drain()
            writer.close()
            await writer.wait_closed()
            for _ in range(200):
                if proxy.counters.errors:
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)
    assert dict(proxy.counters.errors) == {("proxy", "incomplete_body"): 1}
    assert dict(proxy.counters.proxy_upstream_errors) == {}
    assert not [x for x in caplog.records if x.exc_info]
