"""ShadowPipeline.drain: what SIGTERM does to the replays, against fake arms over real HTTP on
127.0.0.1 (the process-level timing is tests/e2e/test_shutdown_drain.py).

One worker (``max_in_flight: 1``): a replay in flight, two requests queued behind it. The
queued two are dropped as ``shutdown_queued`` at once; the one in flight finishes when its arm
answers before the drain ends, else it is abandoned as ``shutdown_in_flight``; one log line
gives the counts; nothing is admitted after the drain began.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import aiohttp
import pytest

from specwatch.shadow.ingest.offer import build_shadow_request
from specwatch.shadow.pipeline import ShadowPipeline
from specwatch.shadow.settings import ArmEndpoint, ShadowSettings
from specwatch.shadow.values import ReplayPair, ShadowRequest, Source
from tests.fakes import PairSinkFn
from tests.fakes.arm import FakeArm, serve_arm


def _request(i: int) -> ShadowRequest:
    body = f'{{"prompt":"p{i}"}}'.encode()
    req = build_shadow_request(
        "/v1/completions", body, source=Source.MIRROR, received_at=time.time()
    )
    assert not isinstance(req, str)
    return req


def _drained(caplog: pytest.LogCaptureFixture) -> list[tuple[int, dict[str, Any]]]:
    """(level, fields) of each ``shadow replays drained`` line."""
    return [
        (r.levelno, dict(getattr(r, "specwatch_fields", {})))
        for r in caplog.records
        if r.getMessage() == "shadow replays drained"
    ]


async def _drain_with(
    std: FakeArm, drain_seconds: float, release_after: float | None
) -> tuple[ShadowPipeline, float, str, list[ReplayPair]]:
    """Three requests offered, the first replay in flight against ``std``; drain for
    ``drain_seconds`` (``std`` answers ``release_after`` s in, or never). Returns the
    pipeline, the drain's seconds, what an offer after it got and the delivered pairs."""
    pairs: list[ReplayPair] = []

    async def sink(p: ReplayPair) -> None:
        pairs.append(p)

    async with (
        serve_arm(std) as su,
        serve_arm(FakeArm()) as fu,
        aiohttp.ClientSession() as session,
    ):
        settings = ShadowSettings.model_validate(
            {
                "enabled": True,
                "modes": ("mirror",),
                "sample_probability": 1.0,
                "max_shadow_rps": 1000.0,
                "max_in_flight": 1,
                "noise_kind": "off",
                "mirror_listen_host": "127.0.0.1",
                "mirror_listen_port": 0,
                "standard": ArmEndpoint(url=su, timeout_seconds=30),
                "fly": ArmEndpoint(url=fu, timeout_seconds=30),
            }
        )
        pipe = ShadowPipeline.from_settings(settings, session=session, sink=PairSinkFn(sink))
        for i in range(3):
            assert pipe.offer(_request(i)) == "admitted"
        await pipe.start()
        await asyncio.wait_for(std.arrived.wait(), 10)
        if release_after is not None:
            asyncio.get_running_loop().call_later(release_after, std.release.set)
        started = time.monotonic()
        await pipe.drain(started + drain_seconds)
        took = time.monotonic() - started
        late = pipe.offer(_request(9))
        await pipe.stop()
    return pipe, took, late, pairs


async def test_a_replay_that_outlives_the_drain_is_counted_abandoned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The arm never answers, drain 0.5 s: ``shutdown_in_flight`` 1, ``shutdown_queued`` 2
    (plus 1 for the offer after the drain), no pair, the drain ends at its 0.5 s (not before 0.4 s;
    under 5 s, the slack a loaded 2-core machine may need), one WARNING line with completed 0,
    abandoned_in_flight 1, abandoned_queued 2."""
    caplog.set_level(logging.INFO, logger="specwatch")
    pipe, took, late, pairs = await _drain_with(FakeArm(mode="hang"), 0.5, None)
    dropped = pipe.metrics().dropped
    assert (dropped["shutdown_in_flight"], dropped["shutdown_queued"]) == (1, 3)
    assert late == "shutdown_queued"
    assert pairs == []
    assert 0.4 <= took < 5.0, took
    [(level, fields)] = _drained(caplog)
    assert level == logging.WARNING
    assert (fields["completed"], fields["abandoned_in_flight"], fields["abandoned_queued"]) == (
        0,
        1,
        2,
    )


async def test_a_replay_that_finishes_within_the_drain_is_delivered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The arm answers 0.3 s into a 30 s drain: the pair is delivered, the drain returns then
    (under 15 s: well before its 30 s, with slack for a loaded machine), ``shutdown_in_flight``
    0, one INFO line with completed 1."""
    caplog.set_level(logging.INFO, logger="specwatch")
    pipe, took, _, pairs = await _drain_with(FakeArm(mode="hang"), 30.0, 0.3)
    dropped = pipe.metrics().dropped
    assert (dropped["shutdown_in_flight"], dropped["shutdown_queued"]) == (0, 3)
    assert len(pairs) == 1
    assert took < 15.0, took
    [(level, fields)] = _drained(caplog)
    assert level == logging.INFO
    assert (fields["completed"], fields["abandoned_in_flight"]) == (1, 0)
