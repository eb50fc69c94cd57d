"""vLLM 0.33's frontend admission limits in the simulator: ``--max-num-queued-reqs`` and
``--max-num-queued-tokens``, the 503 refusal and ``vllm:admission_rejections_total``.

Requests are held in WAITING with the ``stall_admission`` fault, so the number of unfinished
requests and the prompt tokens still in prefill are exact when the next request arrives.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specwatch.cli.simulate import add_parser, config_from_args
from specwatch.simulate.config import SimConfig, StepTimeModel
from specwatch.simulate.launcher import SimulatorHandle, start_simulator
from tests.fakes.wait import poll

pytestmark = pytest.mark.timeout(30)

FAST = StepTimeModel(base_s=0.001, token_s=1e-6, seq_s=1e-6)
BUSY = (
    "The engine is currently busy and cannot accept new requests. "
    "Please try again later or on a different instance."
)
BACKLOG = (
    "The engine has reached its prefill token backlog limit. "
    "Please try again later or on a different instance."
)


async def _sim(**kw: Any) -> SimulatorHandle:
    cfg = SimConfig(served_model_name="sim-q", time_scale=0.0, step_time=FAST, **kw)
    return await start_simulator(cfg)


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def _post(session: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    async with session.post(url, json=body) as r:
        return r.status, await r.json()


async def _stall(session: aiohttp.ClientSession, sim: SimulatorHandle, on: bool) -> None:
    async with session.post(sim.url + "/admin/faults", json={"stall_admission": on}) as r:
        assert r.status == 200


async def _rejections(session: aiohttp.ClientSession, sim: SimulatorHandle) -> dict[Any, Any]:
    """``{(sample name, reason): value}`` plus the label sets of the family."""
    async with session.get(sim.url + "/metrics") as r:
        text = await r.text()
    out: dict[Any, Any] = {"labels": set()}
    for fam in text_string_to_metric_families(text):
        if fam.name in ("vllm:admission_rejections", "vllm:admission_rejections_created"):
            for s in fam.samples:
                out[(s.name, s.labels["reason"])] = s.value
                out["labels"].add(tuple(sorted(s.labels)))
    return out


def _body(words: int, **kw: Any) -> dict[str, Any]:
    """A completion whose prompt is BOS + ``words`` tokens in the synthetic tokenizer."""
    return {"model": "sim-q", "prompt": " ".join(["w"] * words), "max_tokens": 8, **kw}


async def _wait_unfinished(sim: SimulatorHandle, n: int) -> None:
    async def queued() -> bool | None:
        return True if sum(c.load() for c in sim.server.cores) >= n else None

    await poll(f"{n} unfinished requests", queued, within=10, every=0.005)


async def test_counter_exported_at_zero_like_vllm(session: aiohttp.ClientSession) -> None:
    """The admission rejection counter is exported at 0 for both reasons, labelled like vLLM's."""
    sim = await _sim()
    try:
        got = await _rejections(session, sim)
    finally:
        await sim.stop()
    # labels model_name and reason only (no engine), both reasons created at 0, with _created
    assert got["labels"] == {("model_name", "reason")}
    for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):
        assert got[("vllm:admission_rejections_total", reason)] == 0
        assert got[("vllm:admission_rejections_created", reason)] > 0


async def test_max_num_queued_reqs_refuses_with_503_and_counts(
    session: aiohttp.ClientSession,
) -> None:
    """Past max_num_queued_reqs the simulator answers 503 like vLLM, counts it and never queues
    the request."""
    sim = await _sim(max_num_queued_reqs=3, data_parallel_size=2)
    url = sim.url + "/v1/completions"
    try:
        await _stall(session, sim, True)
        held = [asyncio.create_task(_post(session, url, _body(4))) for _ in range(3)]
        await _wait_unfinished(sim, 3)  # 3 unfinished across both engines: 3 + 1 > 3
        status, body = await _post(session, url, _body(4))
        assert status == 503
        assert body == {
            "error": {"message": BUSY, "type": "Service Unavailable", "param": None, "code": 503}
        }
        chat = {"model": "sim-q", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        status, body = await _post(session, sim.url + "/v1/chat/completions", chat)
        assert status == 503  # refused before the event stream starts
        got = await _rejections(session, sim)
        assert got[("vllm:admission_rejections_total", "max_num_queued_reqs")] == 2
        assert got[("vllm:admission_rejections_total", "max_num_queued_tokens")] == 0
        assert sum(c.load() for c in sim.server.cores) == 3  # refused requests never queued
        await _stall(session, sim, False)
        assert [s for s, _ in await asyncio.gather(*held)] == [200, 200, 200]
        status, _ = await _post(session, url, _body(4))
        assert status == 200  # room again once the held requests finished
        got = await _rejections(session, sim)
        assert got[("vllm:admission_rejections_total", "max_num_queued_reqs")] == 2
    finally:
        await sim.stop()


async def test_max_num_queued_tokens_counts_prompts_in_prefill(
    session: aiohttp.ClientSession,
) -> None:
    """max_num_queued_tokens counts the prompt tokens of waiting requests and refuses past the
    limit."""
    # limit 10 prompt tokens: 5 waiting (4 words + BOS) < 10 admits; 5 + 5 = 10 >= 10 refuses
    sim = await _sim(max_num_queued_tokens=10)
    url = sim.url + "/v1/completions"
    try:
        await _stall(session, sim, True)
        first = asyncio.create_task(_post(session, url, _body(4)))
        await _wait_unfinished(sim, 1)
        second = asyncio.create_task(_post(session, url, _body(4)))
        await _wait_unfinished(sim, 2)
        status, body = await _post(session, url, _body(1))
        assert status == 503
        assert body["error"]["message"] == BACKLOG
        assert body["error"]["code"] == 503
        got = await _rejections(session, sim)
        assert got[("vllm:admission_rejections_total", "max_num_queued_tokens")] == 1
        assert got[("vllm:admission_rejections_total", "max_num_queued_reqs")] == 0
        await _stall(session, sim, False)
        assert [(await t)[0] for t in (first, second)] == [200, 200]
    finally:
        await sim.stop()


async def test_request_limit_is_checked_first_and_restart_resets(
    session: aiohttp.ClientSession,
) -> None:
    """With both limits reached the request limit is named; a restart resets the counters."""
    sim = await _sim(max_num_queued_reqs=1, max_num_queued_tokens=1)
    url = sim.url + "/v1/completions"
    try:
        await _stall(session, sim, True)
        held = asyncio.create_task(_post(session, url, _body(4)))
        await _wait_unfinished(sim, 1)
        assert sim.server.admission_rejection() == "max_num_queued_reqs"  # both limits reached
        status, _ = await _post(session, url, _body(4))
        assert status == 503
        async with session.post(sim.url + "/admin/restart") as r:
            assert r.status == 200
        got = await _rejections(session, sim)
        assert got[("vllm:admission_rejections_total", "max_num_queued_reqs")] == 0
        assert got[("vllm:admission_rejections_total", "max_num_queued_tokens")] == 0
        await _stall(session, sim, False)
        assert (await held)[0] == 200
    finally:
        await sim.stop()


def test_flags_default_unlimited_and_validate() -> None:
    """The queue limits default to unlimited, are read from flags and reject negatives."""
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    default = config_from_args(parser.parse_args(["simulate"]))
    assert default.max_num_queued_reqs is None
    assert default.max_num_queued_tokens is None
    args = ["simulate", "--max-num-queued-reqs", "64", "--max-num-queued-tokens", "8192"]
    cfg = config_from_args(parser.parse_args(args))
    assert (cfg.max_num_queued_reqs, cfg.max_num_queued_tokens) == (64, 8192)
    with pytest.raises(ValueError, match="--max-num-queued-reqs"):
        SimConfig(max_num_queued_reqs=-1).validate()
    with pytest.raises(ValueError, match="--max-num-queued-tokens"):
        SimConfig(max_num_queued_tokens=-1).validate()
