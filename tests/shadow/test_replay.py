"""Replay through fake arms (real aiohttp servers on port 0)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from specwatch.core.clock import SYSTEM_MONOTONIC
from specwatch.shadow.classify import classify_pair
from specwatch.shadow.replay import ArmTarget, ReplayArms, Replayer, open_arm_session, prepare_body
from specwatch.shadow.sample import request_hash, seed_from_hash
from specwatch.shadow.values import Arm, ArmResult, ReplayPair, ShadowRequest, Source
from tests.fakes.arm import FakeArm, serve_arm


def _req(body: dict[str, Any], path: str = "/v1/chat/completions") -> ShadowRequest:
    return ShadowRequest(path, body, request_hash(path, body), 0.0, Source.MIRROR)


CHAT = {"model": "live", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def test_prepare_body_by_hand() -> None:
    """prepare_body sets seed, model, stream and the max_tokens cap without touching the input,
    keeping a given seed."""
    body = {"model": "m", "prompt": "p", "max_tokens": 4000, "stream": True, "stream_options": {}}
    out = prepare_body(body, seed=7, max_tokens_cap=256, stream=False, model="std")
    assert out == {"model": "std", "prompt": "p", "max_tokens": 256, "stream": False, "seed": 7}
    assert body["max_tokens"] == 4000  # input untouched
    kept = prepare_body(
        {"seed": 3, "max_completion_tokens": 10}, seed=7, max_tokens_cap=256, stream=True
    )
    assert kept == {
        "seed": 3,
        "max_completion_tokens": 10,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert prepare_body({}, seed=1, max_tokens_cap=5, stream=False)["max_tokens"] == 5
    extra = {"return_token_ids": True, "stream": True}
    got = prepare_body({"prompt": "p"}, seed=1, max_tokens_cap=5, stream=False, extra_body=extra)
    assert got == {
        "prompt": "p",
        "return_token_ids": True,
        "stream": False,
        "seed": 1,
        "max_tokens": 5,
    }


async def _replay(
    std: FakeArm,
    fly: FakeArm,
    req: ShadowRequest,
    noise: FakeArm | None = None,
    *,
    stream_fly: bool = False,
    arm_timeout: float = 30.0,
) -> ReplayPair:
    async with (
        serve_arm(std) as su,
        serve_arm(fly) as fu,
        serve_arm(noise or FakeArm()) as nu,
        aiohttp.ClientSession() as session,
    ):
        r = Replayer(
            session,
            ReplayArms(
                standard=ArmTarget(Arm.STANDARD, su, arm_timeout, token="tok", model="std-model"),
                fly=ArmTarget(Arm.FLY, fu, arm_timeout, stream=stream_fly),
                noise=ArmTarget(Arm.NOISE, nu, arm_timeout) if noise is not None else None,
            ),
            max_tokens_cap=64,
            marker_header="X-Specwatch-Shadow",
            mono_clock=SYSTEM_MONOTONIC,
        )
        return await r.replay(req)


async def test_both_arms_get_the_same_seeded_capped_body() -> None:
    """Both arms get the same seeded, capped, non-streaming body with the marker header and their
    own model and token; the standard arm's vLLM per-request metrics (verify steps accepting 1
    and 2 of 4 drafts) give tau = 1 + 3 / 2 = 2.5."""
    std, fly = FakeArm(text="Paris", spec_steps=[1, 2]), FakeArm(text="Paris.")
    req = _req(CHAT)
    pair = await _replay(std, fly, req)
    seed = seed_from_hash(req.request_hash)
    assert pair.seed == seed
    assert classify_pair(pair) == ("paired", None)
    s_body, f_body = std.seen[0].body, fly.seen[0].body
    assert s_body["seed"] == f_body["seed"] == seed
    assert s_body["stream"] is False
    assert f_body["stream"] is False
    assert s_body["max_tokens"] == f_body["max_tokens"] == 64
    assert s_body["model"] == "std-model"
    assert f_body["model"] == "live"
    assert std.seen[0].headers["X-Specwatch-Shadow"] == "1"
    assert fly.seen[0].headers["X-Specwatch-Shadow"] == "1"
    assert std.seen[0].headers["Authorization"] == "Bearer tok"
    assert "Authorization" not in fly.seen[0].headers
    assert pair.standard.ok
    assert pair.standard.text == "Paris"
    assert pair.standard.mean_acceptance_length == 2.5
    assert pair.fly.mean_acceptance_length is None
    assert pair.fly.text == "Paris."
    assert (pair.fly.prompt_tokens, pair.fly.completion_tokens) == (3, 2)
    assert pair.fly.finish_reason == "stop"
    assert pair.standard.latency_seconds > 0


async def test_existing_seed_is_kept() -> None:
    """A request's own seed is kept and sent to both arms."""
    std, fly = FakeArm(), FakeArm()
    pair = await _replay(std, fly, _req({**CHAT, "seed": 11}))
    assert pair.seed == 11
    assert std.seen[0].body["seed"] == fly.seen[0].body["seed"] == 11


async def test_unsupported_parameter_400_excludes_the_pair() -> None:
    """A 400 naming an unsupported parameter excludes the pair as unsupported_parameter."""
    fly = FakeArm(mode="status", status=400, message="Unsupported parameter: 'logit_bias'")
    pair = await _replay(FakeArm(), fly, _req(CHAT))
    assert pair.fly.error == "unsupported_parameter"
    assert pair.fly.status == 400
    assert classify_pair(pair) == ("excluded", "unsupported_parameter")


async def test_other_400_is_bad_request_exclusion() -> None:
    """Any other 400 excludes the pair as bad_request."""
    std = FakeArm(mode="status", status=400, message="prompt is too long")
    pair = await _replay(std, FakeArm(), _req(CHAT))
    assert classify_pair(pair) == ("excluded", "bad_request")


async def test_one_failed_side_is_unpaired_never_a_mismatch() -> None:
    """One arm failing with a 503 makes the pair unpaired (fly_http_5xx), never a mismatch."""
    fly = FakeArm(mode="status", status=503, message="overloaded")
    pair = await _replay(FakeArm(), fly, _req(CHAT))
    assert pair.standard.ok
    assert not pair.fly.ok
    assert pair.fly.error == "http_503"
    assert classify_pair(pair) == ("unpaired", "fly_http_5xx")


async def test_arm_timeout_is_unpaired() -> None:
    """An arm that times out makes the pair unpaired with reason standard_timeout."""
    std = FakeArm(mode="hang")
    pair = await _replay(std, FakeArm(), _req(CHAT), arm_timeout=0.2)
    assert pair.standard.error == "timeout"
    assert classify_pair(pair) == ("unpaired", "standard_timeout")


async def test_connect_error_and_in_band_error() -> None:
    """A connect error and an in-band error each make the pair unpaired with the arm's reason."""
    async with aiohttp.ClientSession() as session:
        r = Replayer(
            session,
            ReplayArms(
                standard=ArmTarget(Arm.STANDARD, "http://127.0.0.1:1", 5.0),
                fly=ArmTarget(Arm.FLY, "http://127.0.0.1:1", 5.0),
            ),
            max_tokens_cap=8,
            marker_header="X-S",
            mono_clock=SYSTEM_MONOTONIC,
        )
        pair = await r.replay(_req(CHAT))
    assert pair.standard.error == pair.fly.error == "connect"
    assert classify_pair(pair) == ("unpaired", "standard_connect")
    pair2 = await _replay(FakeArm(), FakeArm(mode="in_band_error"), _req(CHAT))
    assert classify_pair(pair2) == ("unpaired", "fly_in_band_error")


async def test_streaming_arm_is_parsed_with_sse() -> None:
    """A streaming arm asks for usage and is read through the SSE accumulator."""
    fly = FakeArm(text="Paris", mode="stream")
    pair = await _replay(FakeArm(text="Paris"), fly, _req(CHAT), stream_fly=True)
    assert fly.seen[0].body["stream"] is True
    assert fly.seen[0].body["stream_options"] == {"include_usage": True}
    assert pair.fly.ok, pair.fly
    assert pair.fly.text == "Paris"
    assert pair.fly.finish_reason == "stop"
    assert (pair.fly.prompt_tokens, pair.fly.completion_tokens) == (3, 2)
    assert classify_pair(pair) == ("paired", None)


async def test_completions_path_and_noise_arm() -> None:
    """The completions path replays to the noise arm with the same seed; a failed noise arm
    leaves the pair paired."""
    body = {"model": "m", "prompt": "2+2="}
    noise = FakeArm(mode="status", status=500)
    pair = await _replay(
        FakeArm(text="4"), FakeArm(text="4"), _req(body, "/v1/completions"), noise=noise
    )
    assert pair.standard.text == pair.fly.text == "4"
    assert pair.noise is not None
    assert pair.noise.error == "http_500"
    assert noise.seen[0].body["seed"] == pair.seed
    assert classify_pair(pair) == ("paired", None)


@pytest.mark.parametrize(
    ("std_err", "fly_err", "expected"),
    [
        (None, None, ("paired", None)),
        ("timeout", None, ("unpaired", "standard_timeout")),
        ("http_404", "timeout", ("unpaired", "standard_http_4xx")),
        ("timeout", "unsupported_parameter", ("excluded", "unsupported_parameter")),
    ],
)
def test_classify_pair(std_err: str | None, fly_err: str | None, expected: object) -> None:
    """classify_pair gives each combination of arm errors its status and reason."""

    def arm(a: Arm, err: str | None) -> ArmResult:
        return ArmResult(a, err is None, 0.1, error=err)

    pair = ReplayPair(_req(CHAT), arm(Arm.STANDARD, std_err), arm(Arm.FLY, fly_err))
    assert classify_pair(pair) == expected


VLLM_SPEC_400 = (
    "The min_p and logit_bias sampling parameters are not yet supported with speculative decoding."
)


async def test_vllm_spec_decode_refusal_is_unsupported_parameter_on_its_arm() -> None:
    """vLLM's own 400 wording for sampling parameters it cannot use with speculative decoding
    ("... are not yet supported ...", ``SamplingParams._validate_spec_decode``) is
    ``unsupported_parameter`` on the arm that sent it, and the pair is excluded for it."""
    fly = FakeArm(mode="status", status=400, message=VLLM_SPEC_400)
    pair = await _replay(FakeArm(), fly, _req({**CHAT, "min_p": 0.1}))
    assert (pair.fly.error, pair.fly.status) == ("unsupported_parameter", 400)
    assert pair.standard.ok
    assert classify_pair(pair) == ("excluded", "unsupported_parameter")


_OK_BODY = json.dumps(
    {
        "choices": [{"index": 0, "text": "4", "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
).encode()


@asynccontextmanager
async def _raw_server(plan: list[str]) -> AsyncIterator[tuple[str, list[str]]]:
    """A bare HTTP/1.1 server on 127.0.0.1 (faults aiohttp's server cannot produce). Connection
    ``i`` follows ``plan[i]`` (the last entry repeats): ``close`` reads the request and closes
    without a byte, ``cut`` sends the status line, headers (Content-Length 100) and 10 bytes then
    closes, ``ok`` answers ``_OK_BODY``. Yields the base URL and the list of plans used."""
    used: list[str] = []

    async def on_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        kind = plan[min(len(used), len(plan) - 1)]
        used.append(kind)
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        await reader.readexactly(length)
        if kind == "ok":
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                + f"Content-Length: {len(_OK_BODY)}\r\n\r\n".encode()
                + _OK_BODY
            )
        elif kind == "cut":
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: 100\r\n\r\n" + b'{"choices"'
            )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", used
    finally:
        server.close()
        await server.wait_closed()


async def _replay_raw(std_plan: list[str]) -> tuple[ReplayPair, list[str], Replayer]:
    async with (
        _raw_server(std_plan) as (su, used),
        serve_arm(FakeArm(text="4")) as fu,
        aiohttp.ClientSession() as session,
    ):
        r = Replayer(
            session,
            ReplayArms(
                standard=ArmTarget(Arm.STANDARD, su, 10.0), fly=ArmTarget(Arm.FLY, fu, 10.0)
            ),
            max_tokens_cap=8,
            marker_header="X-S",
            mono_clock=SYSTEM_MONOTONIC,
        )
        pair = await r.replay(_req({"prompt": "2+2="}, "/v1/completions"))
        return pair, used, r


async def test_close_before_any_byte_is_retried_once_and_counted() -> None:
    """The server closes the first connection without answering (vLLM's keep-alive close racing
    a reused socket): the request is sent once more, answered, and ``retries`` counts it."""
    pair, used, r = await _replay_raw(["close", "ok"])
    assert used == ["close", "ok"]
    assert pair.standard.ok
    assert pair.standard.text == "4"
    assert dict(r.retries) == {"standard": 1}
    assert classify_pair(pair) == ("paired", None)


async def test_second_close_before_any_byte_fails_the_arm() -> None:
    """Two closes in a row: one retry only, then the arm fails as ``disconnected`` (unpaired)."""
    pair, used, r = await _replay_raw(["close"])
    assert used == ["close", "close"]
    assert (pair.standard.ok, pair.standard.error) == (False, "disconnected")
    assert dict(r.retries) == {"standard": 1}
    assert classify_pair(pair) == ("unpaired", "standard_disconnected")


async def test_close_mid_response_fails_the_arm_without_retry() -> None:
    """A close after the status line (10 of 100 body bytes) is ``disconnected_mid_response``:
    never retried (the server did the work), the pair unpaired."""
    pair, used, r = await _replay_raw(["cut", "ok"])
    assert used == ["cut"]
    assert (pair.standard.ok, pair.standard.error) == (False, "disconnected_mid_response")
    assert pair.standard.status == 200
    assert dict(r.retries) == {}
    assert classify_pair(pair) == ("unpaired", "standard_disconnected_mid_response")


async def test_idle_connections_are_dropped_after_the_arms_keepalive() -> None:
    """Each arm's pool keeps an idle connection ``keepalive_seconds``: two replays 0.8 s apart
    reuse the FLy arm's connection (keep-alive 4 s, the default, below vLLM's 5 s) but open a new
    one to the standard arm (keep-alive 0.1 s). Connections are told apart by client port."""
    peers: dict[str, list[int]] = {"std": [], "fly": []}

    def app(name: str) -> web.Application:
        async def handle(request: web.Request) -> web.Response:
            await request.read()
            peers[name].append(request.transport.get_extra_info("peername")[1])  # type: ignore[union-attr]
            return web.Response(body=_OK_BODY, content_type="application/json")

        a = web.Application()
        a.router.add_post("/v1/completions", handle)
        return a

    std_t = ArmTarget(Arm.STANDARD, "", 10.0, keepalive_seconds=0.1)
    fly_t = ArmTarget(Arm.FLY, "", 10.0)
    assert fly_t.keepalive_seconds == 4.0
    async with (
        TestServer(app("std"), host="127.0.0.1") as s1,
        TestServer(app("fly"), host="127.0.0.1") as s2,
    ):
        std_t = replace(std_t, base_url=f"http://127.0.0.1:{s1.port}")
        fly_t = replace(fly_t, base_url=f"http://127.0.0.1:{s2.port}")
        sessions = {a.arm: open_arm_session(a.keepalive_seconds) for a in (std_t, fly_t)}
        try:
            r = Replayer(
                sessions,
                ReplayArms(standard=std_t, fly=fly_t),
                max_tokens_cap=8,
                marker_header="X-S",
                mono_clock=SYSTEM_MONOTONIC,
            )
            req = _req({"prompt": "2+2="}, "/v1/completions")
            first = await r.replay(req)
            await asyncio.sleep(0.8)
            second = await r.replay(req)
        finally:
            for s in sessions.values():
                await s.close()
    assert first.standard.ok
    assert second.fly.ok
    assert peers["fly"][0] == peers["fly"][1]
    assert peers["std"][0] != peers["std"][1]
    assert dict(r.retries) == {}
