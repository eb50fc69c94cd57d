"""Mirror ingest and the whole pipeline (ingest -> sample -> replay -> sink) with fake arms."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from specwatch.shadow.classify import classify_pair
from specwatch.shadow.ingest.offer import build_shadow_request
from specwatch.shadow.pipeline import (
    PAUSE_POLL_SECONDS,
    Runtime,
    ShadowPipeline,
    ingest_from_settings,
    replayer_from_settings,
)
from specwatch.shadow.sample import ArmLoad, Sampler
from specwatch.shadow.settings import ArmEndpoint, ShadowSettings
from specwatch.shadow.values import ReplayPair, ShadowRequest, Source
from tests.fakes import FakeClocks, PairSinkFn
from tests.fakes.arm import FakeArm, serve_arm

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _settings(su: str, fu: str, **kw: object) -> ShadowSettings:
    base: dict[str, object] = {
        "enabled": True,
        "modes": ("mirror",),
        "sample_probability": 1.0,
        "max_shadow_rps": 1000.0,
        "max_in_flight": 2,
        "queue_size": 8,
        "standard": ArmEndpoint(url=su, timeout_seconds=30),
        "fly": ArmEndpoint(url=fu, timeout_seconds=30),
        "mirror_max_body_bytes": 2048,
        "mirror_listen_host": "127.0.0.1",
        "mirror_listen_port": 0,
    }
    base.update(kw)
    return ShadowSettings.model_validate(base)


@asynccontextmanager
async def sidecar(
    settings: ShadowSettings, **kw: object
) -> AsyncIterator[tuple[str, ShadowPipeline, list[ReplayPair], aiohttp.ClientSession, str]]:
    """The sidecar's main app with the pipeline mounted, served on port 0; yields the mirror
    listener's URL (its own port), the pipeline, the delivered pairs, a client session and the
    main app's URL."""
    pairs: list[ReplayPair] = []

    async def sink(p: ReplayPair) -> None:
        pairs.append(p)

    async with aiohttp.ClientSession() as replay_session:
        pipe = ShadowPipeline.from_settings(
            settings,
            session=replay_session,
            sink=PairSinkFn(sink),
            **kw,  # type: ignore[arg-type]
        )
        app = web.Application()

        async def healthz(request: web.Request) -> web.Response:
            return web.Response(text="ok")

        app.router.add_get("/healthz", healthz)
        pipe.mount(app)
        server = TestServer(app, host="127.0.0.1", port=0)
        await server.start_server()
        try:
            async with aiohttp.ClientSession() as client:
                mirror = f"http://127.0.0.1:{pipe.mirror_port}"
                yield mirror, pipe, pairs, client, f"http://127.0.0.1:{server.port}"
        finally:
            await server.close()


async def _until(cond: object, limit: float = 20.0) -> None:
    async def wait() -> None:
        while not cond():  # type: ignore[operator]  # noqa: ASYNC110 (polls plain counters)
            await asyncio.sleep(0.01)

    await asyncio.wait_for(wait(), timeout=limit)


async def test_mirror_answers_at_once_while_arms_hang_then_pair_arrives() -> None:
    """The mirror route answers 202 at once while both arms hang; the pair arrives once they
    answer."""
    std, fly = FakeArm(mode="hang", text="A"), FakeArm(mode="hang", text="A")
    async with (
        serve_arm(std) as su,
        serve_arm(fly) as fu,
        sidecar(_settings(su, fu)) as (url, pipe, pairs, client, _),
    ):
        headers = {"Host": "llm-shadow:8000"}
        async with client.post(url + "/v1/chat/completions", json=CHAT, headers=headers) as r:
            assert r.status == 202
            assert await r.json() == {"shadow": "admitted"}
        # the answer came back although both arms are still hanging
        await asyncio.wait_for(std.arrived.wait(), timeout=20)
        assert pairs == []
        assert pipe.in_flight == 1
        std.release.set()
        fly.release.set()
        await _until(lambda: len(pairs) == 1)
        m = pipe.metrics()
    pair = pairs[0]
    assert pair.request.source is Source.MIRROR
    assert pair.request.body == CHAT
    assert classify_pair(pair) == ("paired", None)
    assert pair.standard.text == pair.fly.text == "A"
    assert m.received == {"mirror": 1}
    assert m.in_flight == 0


async def test_a_replay_that_raises_is_counted_and_its_worker_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One worker; the first replay raises an error nobody expected (a bug): that request is
    dropped as ``replay_error`` with one ERROR line naming it, and the same worker replays the
    next two requests."""
    std, fly = FakeArm(text="A"), FakeArm(text="A")
    async with (
        serve_arm(std) as su,
        serve_arm(fly) as fu,
        sidecar(_settings(su, fu, max_in_flight=1)) as (url, pipe, pairs, client, _),
    ):
        real = pipe.replayer.replay
        calls = {"n": 0}

        async def first_raises(req: ShadowRequest, *, running: float | None = None) -> ReplayPair:
            calls["n"] += 1
            if calls["n"] == 1:
                raise RecursionError("maximum recursion depth exceeded")
            return await real(req, running=running)

        pipe.replayer.replay = first_raises  # type: ignore[method-assign]
        for i in range(3):
            body = {"model": "m", "prompt": f"p{i}", "max_tokens": 4}
            async with client.post(url + "/v1/completions", json=body) as r:
                assert r.status == 202
            await _until(lambda i=i: calls["n"] == i + 1 and pipe.in_flight == 0)
        await _until(lambda: len(pairs) == 2)
        m = pipe.metrics()
    assert m.dropped["replay_error"] == 1
    assert [p.request.body["prompt"] for p in pairs] == ["p1", "p2"]
    failed = [r for r in caplog.records if r.getMessage().startswith("shadow replay failed")]
    assert len(failed) == 1
    # the traceback goes with the line: as exc_info, or as text once secrets were masked in it
    rec = failed[0]
    shown = logging.Formatter().formatException(rec.exc_info) if rec.exc_info else ""
    text = rec.exc_text or shown
    assert "RecursionError: maximum recursion depth exceeded" in text


async def test_each_modes_received_count_starts_at_zero() -> None:
    """Before any copy arrives, each enabled mode's received count is there at 0 (a series
    that first appears with copies already counted loses them from Prometheus' increase(),
    which doctor's mirror check reads); a mode not enabled has none."""
    std, fly = FakeArm(text="A"), FakeArm(text="A")
    async with (
        serve_arm(std) as su,
        serve_arm(fly) as fu,
        sidecar(_settings(su, fu)) as (_, pipe, _, _, _),
    ):
        assert pipe.metrics().received == {"mirror": 0}


async def test_mirror_bad_inputs_are_counted() -> None:
    """Bad mirror inputs get 400, 413, 421 or 208 and are counted; other routes still work."""
    async with (
        serve_arm(FakeArm()) as su,
        serve_arm(FakeArm()) as fu,
        sidecar(_settings(su, fu, mirror_require_shadow_host=True)) as (url, pipe, _, client, main),
    ):
        sh = {"Host": "svc-shadow"}
        async with client.post(url + "/v1/completions", data=b"{oops", headers=sh) as r:
            assert r.status == 400
            assert await r.json() == {"shadow": "invalid_json"}
        async with client.post(url + "/v1/completions", data=b"[1]", headers=sh) as r:
            assert r.status == 400
        big = json.dumps({"prompt": "x" * 5000}).encode()
        async with client.post(url + "/v1/completions", data=big, headers=sh) as r:
            assert r.status == 413
        async with client.post(url + "/v1/completions", json=CHAT, headers={"Host": "svc"}) as r:
            assert r.status == 421
        marked = {**sh, "X-Specwatch-Shadow": "1"}
        async with client.post(url + "/v1/completions", json=CHAT, headers=marked) as r:
            assert r.status == 208
        async with client.get(main + "/healthz") as r:
            assert await r.text() == "ok"  # the main app serves its own routes
        async with client.post(main + "/v1/completions", json=CHAT, headers=sh) as r:
            assert r.status == 404  # and never the mirror's
        m = pipe.metrics()
    assert m.ingest_errors == {
        ("mirror", "invalid_json"): 1,
        ("mirror", "not_object"): 1,
        ("mirror", "too_large"): 1,
        ("mirror", "not_shadow_host"): 1,
    }
    assert pipe.ingest_counters.skipped_marked == 1
    assert m.admitted == 0


async def test_unpaired_and_excluded_are_delivered_unjudged() -> None:
    """An unsupported-parameter refusal (excluded) and a FLy 503 (unpaired) are both delivered;
    the pipeline counts their arm errors, and the status is the sink's to give (compare)."""
    fly = FakeArm(mode="status", status=400, message="extra inputs are not permitted")
    async with (
        serve_arm(FakeArm()) as su,
        serve_arm(fly) as fu,
        sidecar(_settings(su, fu)) as (url, pipe, pairs, client, _),
    ):
        async with client.post(url + "/v1/chat/completions", json=CHAT) as r:
            assert r.status == 202
        await _until(lambda: len(pairs) == 1)
        fly.message, fly.status = "overloaded", 503
        async with client.post(url + "/v1/chat/completions", json={**CHAT, "n": 1}) as r:
            assert r.status == 202
        await _until(lambda: len(pairs) == 2)
        m = pipe.metrics()
    assert [classify_pair(p) for p in pairs] == [
        ("excluded", "unsupported_parameter"),
        ("unpaired", "fly_http_5xx"),
    ]
    assert m.arm_errors == {("fly", "unsupported_parameter"): 1, ("fly", "http_503"): 1}


async def test_worker_waits_while_paused_then_replays() -> None:
    """A worker waits, polling, while the arms are loaded, then replays."""
    clocks = FakeClocks(wall=0.0, mono=0.0)
    loads = {"standard": ArmLoad(0, 0, 8, 0.0), "fly": ArmLoad(0, 0, 8, 0.0)}
    sleeps: list[float] = []
    std = FakeArm()
    pairs: list[ReplayPair] = []

    async def sink(p: ReplayPair) -> None:
        pairs.append(p)

    async def fake_sleep(d: float) -> None:
        sleeps.append(d)
        if len(sleeps) == 3:  # load drains after three polls
            loads["fly"] = ArmLoad(1, 0, 8, clocks.mono.t)
        await asyncio.sleep(0)

    async with (
        serve_arm(std) as su,
        serve_arm(FakeArm()) as fu,
        aiohttp.ClientSession() as session,
    ):
        settings = _settings(su, fu, max_in_flight=1)
        pipe = ShadowPipeline.from_settings(
            settings,
            session=session,
            sink=PairSinkFn(sink),
            load_state=lambda: loads,
            runtime=Runtime(wall_clock=clocks.wall, mono_clock=clocks.mono, sleep=fake_sleep),
        )
        assert pipe.offer(_request()) == "admitted"
        loads["fly"] = ArmLoad(8, 3, 8, clocks.mono.t)  # load rises while the request is queued
        await pipe.start()
        await _until(lambda: len(pairs) == 1)
        m = pipe.metrics()
        await pipe.stop()
    assert sleeps == [PAUSE_POLL_SECONDS] * 3
    assert m.pauses_total == {"waiting": 1, "running_near_max": 1, "load_stale": 0}
    assert m.paused == {"waiting": 0, "running_near_max": 0, "load_stale": 0}
    assert len(std.seen) == 1


def _request() -> ShadowRequest:
    req = build_shadow_request(
        "/v1/completions", b'{"prompt":"p"}', source=Source.MIRROR, received_at=0.0
    )
    assert not isinstance(req, str)
    return req


async def test_expired_requests_are_dropped() -> None:
    """A request older than the maximum queue age is dropped as expired, never replayed."""
    clocks = FakeClocks(wall=0.0, mono=0.0)
    loads = {"standard": ArmLoad(0, 5, 8, 0.0)}

    async def fake_sleep(d: float) -> None:
        clocks.advance(d)
        loads["standard"] = ArmLoad(0, 5, 8, clocks.mono.t)  # stays busy, fresh readings
        await asyncio.sleep(0)

    async with serve_arm(FakeArm()) as su, serve_arm(FakeArm()) as fu:
        settings = _settings(su, fu, max_queue_age_seconds=10.0)
        async with sidecar(
            settings,
            load_state=lambda: loads,
            runtime=Runtime(wall_clock=clocks.wall, mono_clock=clocks.mono, sleep=fake_sleep),
        ) as (_, pipe, pairs, _c, _m):
            loads["standard"] = ArmLoad(0, 0, 8, 0.0)
            assert pipe.offer(_request()) == "admitted"
            loads["standard"] = ArmLoad(0, 5, 8, 0.0)
            await _until(lambda: pipe.metrics().dropped["expired"] == 1)
    assert pairs == []


async def test_canary_mode_replays_builtin_set(tmp_path: object) -> None:
    """Canary mode replays each built-in item once, past the sampling probability; the items
    are counted as offered by the canary, never as received (no ``source="canary"`` series held
    at 0 while canary pairs flow)."""
    async with serve_arm(FakeArm(text="42")) as su, serve_arm(FakeArm(text="42")) as fu:
        settings = _settings(
            su,
            fu,
            modes=("canary",),
            canary_builtin=True,
            canary_rate_per_second=1000.0,
            canary_loop=False,
            sample_probability=0.0,  # canary items are forced past the probability step
        )
        async with sidecar(settings) as (_, pipe, pairs, _c, _m):
            await _until(lambda: len(pairs) == 5)
            m = pipe.metrics()
    assert {p.request.item_id for p in pairs} == {
        "builtin-add",
        "builtin-mul",
        "builtin-capital",
        "builtin-json",
        "builtin-copy",
    }
    assert all(p.request.source is Source.CANARY and p.request.gold for p in pairs)
    assert m.canary_offered == 5
    assert m.not_sampled == 0
    assert m.received == {}


def test_settings_validation() -> None:
    """ShadowSettings rejects missing arms, proxy without upstream and non-HTTP URLs, and strips
    a trailing slash."""
    with pytest.raises(ValueError, match="needs both"):
        ShadowSettings(enabled=True)
    with pytest.raises(ValueError, match="proxy_upstream"):
        _settings("http://a", "http://b", modes=("proxy",))
    with pytest.raises(ValueError, match="http"):
        ArmEndpoint(url="ftp://x")
    s = _settings("http://a/", "http://b", noise_kind="standard")
    assert s.noise_endpoint() == s.standard
    assert s.standard is not None
    assert s.standard.url == "http://a"


async def test_mirror_upload_cut_mid_body_is_counted_without_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A mirrored copy announcing 1500 bytes that stops after 40 and closes is one
    ``incomplete_body`` rejection: counted (received + ingest error), one WARNING line naming
    the reason, no record with a traceback, nothing offered."""
    async with (
        serve_arm(FakeArm()) as su,
        serve_arm(FakeArm()) as fu,
        sidecar(_settings(su, fu)) as (url, pipe, _, _c, _m),
    ):
        port = int(url.rsplit(":", 1)[1])
        with caplog.at_level("DEBUG"):
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                b"POST /v1/completions HTTP/1.1\r\nHost: x-shadow\r\nContent-Length: 1500\r\n"
                b"X-Request-Id: cut-1\r\n\r\n" + b'{"prompt": "' + b"y" * 28
            )
            await writer.drain()
            writer.close()
            await writer.wait_closed()
            await _until(lambda: pipe.metrics().ingest_errors != {})
        m = pipe.metrics()
    assert m.ingest_errors == {("mirror", "incomplete_body"): 1}
    assert m.received == {"mirror": 1}
    assert m.offered == 0
    lines = [r for r in caplog.records if r.getMessage() == "shadow ingest rejected"]
    assert len(lines) == 1
    assert not [r for r in caplog.records if r.exc_info]


async def test_mirror_body_that_is_not_the_gzip_it_claims_is_a_400_without_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A mirrored copy sent with ``Content-Encoding: gzip`` whose body is not gzip is one
    ``bad_encoding`` rejection: ``400 {"shadow": "bad_encoding"}``, counted (received + ingest
    error), one WARNING line, no record with a traceback, nothing offered. Before: aiohttp's
    decoder error escaped the handler: ``500`` and two ERROR records with tracebacks."""
    async with (
        serve_arm(FakeArm()) as su,
        serve_arm(FakeArm()) as fu,
        sidecar(_settings(su, fu)) as (url, pipe, _, _c, _m),
        aiohttp.ClientSession() as session,
    ):
        with caplog.at_level("DEBUG"):
            async with session.post(
                url + "/v1/completions",
                data=b"this is not gzip" * 8,
                headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
            ) as resp:
                status, body = resp.status, await resp.json()
        m = pipe.metrics()
    assert (status, body) == (400, {"shadow": "bad_encoding"})
    assert m.ingest_errors == {("mirror", "bad_encoding"): 1}
    assert m.received == {"mirror": 1}
    assert m.offered == 0
    lines = [r for r in caplog.records if r.getMessage() == "shadow ingest rejected"]
    assert len(lines) == 1
    assert not [r for r in caplog.records if r.exc_info]


class TestFromSettings:
    """``ShadowPipeline.from_settings`` copies the ``shadow`` group into the parts;
    ``__init__`` takes those parts as they are."""

    async def test_from_settings_builds_each_part_from_the_group(self) -> None:
        """Sample probability 0.25, queue 3 and 5 categories reach the sampler, the mirror body
        cap reaches the mirror handler, and the mirror listener exists only when the pipeline
        serves the mirror itself."""
        settings = _settings(
            "http://127.0.0.1:9", "http://127.0.0.1:9", sample_probability=0.25, queue_size=3
        )
        settings = settings.model_copy(update={"max_categories": 5})
        async with aiohttp.ClientSession() as session:

            async def sink(p: ReplayPair) -> None:
                raise AssertionError("no pair expected")

            pipe = ShadowPipeline.from_settings(settings, session=session, sink=PairSinkFn(sink))
            alone = ShadowPipeline.from_settings(
                settings, session=session, sink=PairSinkFn(sink), serve_mirror=False
            )
        assert pipe.sampler.probability == 0.25
        assert pipe.sampler.queue.maxsize == 3
        assert pipe.sampler.categories.limit == 5
        assert pipe.mirror_listener is not None
        assert alone.mirror_listener is None
        assert (pipe.proxy, pipe.canary, pipe.canary_load) == (None, None, None)
        assert pipe.mirror is not alone.mirror  # each pipeline has its own handler and counters
        assert pipe.ingest_counters is not alone.ingest_counters

    async def test_init_uses_the_parts_it_is_given(self) -> None:
        """A hand-built sampler that samples nothing wins over the group's probability 1.0: the
        offered request is ``not_sampled`` and counted by that sampler."""
        settings = _settings("http://127.0.0.1:9", "http://127.0.0.1:9")
        clocks = FakeClocks()
        sampler = Sampler(probability=0.0, mono_clock=clocks.mono, queue_size=1, max_rps=10.0)
        async with aiohttp.ClientSession() as session:

            async def sink(p: ReplayPair) -> None:
                raise AssertionError("no pair expected")

            pipe = ShadowPipeline(
                settings,
                sampler=sampler,
                replayer=replayer_from_settings(settings, session, mono_clock=clocks.mono),
                ingest=ingest_from_settings(
                    settings,
                    sampler,
                    wall_clock=clocks.wall,
                    sleep=asyncio.sleep,
                    serve_mirror=False,
                ),
                sink=PairSinkFn(sink),
            )
        assert pipe.offer(_request()) == "not_sampled"
        assert (sampler.offered, sampler.not_sampled) == (1, 1)
        assert pipe.metrics().not_sampled == 1

    async def test_missing_fly_arm_is_refused(self) -> None:
        """Without a FLy arm there is nothing to compare: ``from_settings`` raises."""
        settings = _settings("http://127.0.0.1:9", "http://127.0.0.1:9").model_copy(
            update={"fly": None}
        )

        async def sink(p: ReplayPair) -> None:
            raise AssertionError("no pair expected")

        async with aiohttp.ClientSession() as session:
            with pytest.raises(ValueError, match=r"shadow\.standard and shadow\.fly"):
                ShadowPipeline.from_settings(settings, session=session, sink=PairSinkFn(sink))
