"""Conformance against a real SGLang server: the assumptions specwatch's SGLang rules make,
checked on the live thing. Needs a running server at ``SGLANG_TEST_URL`` (its base URL, e.g.
``http://127.0.0.1:30000``, started with ``--enable-metrics`` and, for the speculative checks,
``--speculative-algorithm``); skipped with that reason when it is unset, since no SGLang server
can run on the CPU-only CI machines (docs/metrics.md, "SGLang"). Cost: a few requests."""

from __future__ import annotations

import json
import os
from typing import Any

import aiohttp
import pytest

from specwatch.observe.health import model_windows
from specwatch.observe.parse import parse_page
from specwatch.observe.window import page_delta
from specwatch.shadow.classify import body_result
from specwatch.shadow.values import Arm
from specwatch.vllm.sglang import server_info_facts

URL = os.environ.get("SGLANG_TEST_URL", "").rstrip("/")
pytestmark = [
    pytest.mark.real_sglang,
    pytest.mark.skipif(
        not URL,
        reason="no SGLang server: set SGLANG_TEST_URL to one started with --enable-metrics "
        "(SGLang has no CPU build for these CI machines)",
    ),
]


async def _get(session: aiohttp.ClientSession, path: str) -> tuple[int, str, str]:
    async with session.get(URL + path) as r:
        return r.status, r.headers.get("Content-Type", ""), await r.text()


async def _info(session: aiohttp.ClientSession) -> dict[str, Any]:
    for path in ("/server_info", "/get_server_info"):  # /server_info from 0.5.6
        status, _, text = await _get(session, path)
        if status == 200:
            doc: dict[str, Any] = json.loads(text)
            return doc
    raise AssertionError("neither /server_info nor /get_server_info answered 200")


async def _complete(session: aiohttp.ClientSession, body: dict[str, Any]) -> tuple[int, bytes, str]:
    async with session.post(URL + "/v1/completions", json=body) as r:
        return r.status, await r.read(), r.headers.get("Content-Type", "")


async def test_live_server_matches_the_sglang_rules() -> None:
    """The page is read as SGLang's with one engine per DP rank; a reply is an answer by the
    reply-outcome rule; an empty prompt is a 400 with the top-level error body; with
    speculation τ is in [1, N] and α in [0, 1] after traffic, and from 0.5.13 the counter τ
    (Δgeneration tokens / Δverify calls) is what the window shows."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        facts = server_info_facts(await _info(session))
        model = (await _info(session)).get("served_model_name") or "default"
        _, ctype, before_text = await _get(session, "/metrics")
        before = parse_page(before_text, content_type=ctype)
        assert before.engine_kind == "sglang"
        assert before.engines, "no sglang:* series: was the server started with --enable-metrics?"
        status, raw, rtype = await _complete(
            session, {"model": model, "prompt": "The capital of France is", "max_tokens": 32}
        )
        assert status == 200
        reply = body_result(Arm.FLY, raw, status=status, latency=0.0, content_type=rtype)
        assert reply.ok, reply.error
        assert reply.finish_reason in ("stop", "length")
        status, raw, _ = await _complete(session, {"model": model, "prompt": ""})
        assert status == 400
        assert json.loads(raw)["object"] == "error"
        _, ctype, after_text = await _get(session, "/metrics")
        after = parse_page(after_text, content_type=ctype)
    dp = {engine for _, engine in after.engines}
    assert dp <= {str(i) for i in range(64)}
    if facts["speculative_algorithm"] is None:
        return
    server = next(iter(model_windows(page_delta(before, after, None)).values())).server
    n = facts["num_draft_tokens"]
    tau, alpha = server.mean_acceptance_length, server.acceptance_rate
    assert tau is not None
    assert 1 <= tau <= (n if isinstance(n, int) else tau)
    assert alpha is None or 0 <= alpha <= 1
    if server.spec_decode_schema == "sglang_counters":
        assert server.drafts is not None
        assert server.drafts > 0
        assert server.generation_tokens is not None
        assert tau == pytest.approx(server.generation_tokens / server.drafts)
