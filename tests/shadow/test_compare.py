"""compare(): divergence, similarity, extraction, correctness, agreement, pair status."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from specwatch.core.clock import SYSTEM_MONOTONIC
from specwatch.shadow.checkers import answers_equal, json_path_get, make_checker
from specwatch.shadow.compare import (
    CompareConfig,
    PairOutcome,
    compare,
    first_divergence,
    similarity,
)
from specwatch.shadow.ledger.rows import LedgerRow
from specwatch.shadow.live import OutcomeCounters
from specwatch.shadow.replay import ArmTarget, ReplayArms, Replayer
from specwatch.shadow.sample import request_hash
from specwatch.shadow.values import Arm, ArmResult, ReplayPair, ShadowRequest, Source, ToolCall
from tests.fakes.arm import FakeArm, RawReply, serve_arm


def _req(
    gold: str | None = None, checker: str | None = None, category: str = "gsm8k"
) -> ShadowRequest:
    return ShadowRequest(
        path="/v1/completions",
        body={"prompt": "q"},
        request_hash="abc123",
        received_at=1000.0,
        source=Source.CANARY if gold is not None else Source.MIRROR,
        category=category,
        item_id="q1" if gold is not None else None,
        gold=gold,
        checker=checker,
    )


def _labels(out: PairOutcome) -> set[tuple[str, str, str]]:
    """The ``(category, arm, outcome)`` pair counters one outcome increments (each by 1)."""
    counters = OutcomeCounters()
    counters.add(LedgerRow.from_outcome(out))
    assert set(counters.pairs.values()) <= {1}
    return set(counters.pairs)


def _arm(arm: Arm, text: str = "", ok: bool = True, **kw: Any) -> ArmResult:
    return ArmResult(arm=arm, ok=ok, latency_seconds=kw.pop("latency", 0.5), text=text, **kw)


def test_first_divergence_and_similarity_by_hand() -> None:
    """first_divergence and the indel similarity give hand-computed values."""
    assert first_divergence("The answer is 42", "The answer is 43") == 15
    assert first_divergence("abc", "abcdef") == 3
    assert first_divergence("same", "same") is None
    assert first_divergence((1, 2, 3, 4), (1, 2, 9)) == 2
    # Indel: "kitten" -> "sitting" needs 5 insert/delete ops over 13 chars -> 1 - 5/13.
    assert similarity("kitten", "sitting") == pytest.approx(1 - 5 / 13)
    assert similarity("", "") == 1.0


def test_labelled_lost_with_regex_checker() -> None:
    """A gold item answered right by the standard and wrong by FLy is paired and lost, with its
    token facts."""
    pair = ReplayPair(
        request=_req(gold="1,200", checker=r"regex:####\s*([-\d,.]+)"),
        standard=_arm(
            Arm.STANDARD,
            "so 1200 total\n#### 1200",
            token_ids=(5, 6, 7, 8),
            completion_tokens=4,
            mean_acceptance_length=2.5,
            latency=0.8,
        ),
        fly=_arm(
            Arm.FLY,
            "so 1300 total\n#### 1300",
            token_ids=(5, 6, 9, 8),
            completion_tokens=4,
            mean_acceptance_length=3.1,
            latency=0.6,
        ),
        seed=7,
    )
    out = compare(pair)
    assert out.status == "paired"
    assert out.labelled
    assert out.standard.correct is True
    assert out.fly.correct is False
    assert out.fly.answer == "1300"
    assert _labels(out) == {("gsm8k", "fly", "lost"), ("gsm8k", "fly", "disagree")}
    assert out.fly.first_divergence_char == 4
    assert out.fly.first_divergence_token == 2
    assert out.fly.exact_match is False
    assert out.fly.mean_acceptance_length == 3.1
    assert out.standard.latency_seconds == 0.8
    assert out.seed == 7
    assert out.time == 1000.0


def test_unlabelled_agreement_and_noise_arm() -> None:
    """Without gold, FLy agrees after whitespace normalisation and the noise arm agrees only
    under a looser threshold."""
    pair = ReplayPair(
        request=_req(),
        standard=_arm(Arm.STANDARD, "Paris is the capital."),
        fly=_arm(Arm.FLY, "Paris is the capital. "),
        noise=_arm(Arm.NOISE, "Paris is the capital city."),
    )
    out = compare(pair)
    # whitespace-normalised agreement for FLy; no correctness label without a gold answer
    assert _labels(out) == {("gsm8k", "fly", "agree"), ("gsm8k", "noise", "disagree")}
    assert out.fly.exact_match is False
    loose = compare(pair, CompareConfig(similarity_threshold=0.8))
    assert ("gsm8k", "noise", "agree") in _labels(loose)


def test_status_rules() -> None:
    """Arm errors map to excluded or unpaired with the shared reason vocabulary."""
    unsupported = ReplayPair(
        request=_req(),
        standard=_arm(Arm.STANDARD, "x"),
        fly=_arm(Arm.FLY, ok=False, status=400, error="unsupported_parameter"),
    )
    assert (compare(unsupported).status, compare(unsupported).reason) == (
        "excluded",
        "unsupported_parameter",
    )
    for fly in (
        _arm(Arm.FLY, ok=False, status=400, error="bad_request"),
        _arm(Arm.FLY, ok=False, status=422, error="bad_request"),
        _arm(Arm.FLY, ok=False, status=400),
    ):
        refused = ReplayPair(request=_req(), standard=_arm(Arm.STANDARD, "x"), fly=fly)
        assert (compare(refused).status, compare(refused).reason) == ("excluded", "bad_request")
    timeout = ReplayPair(
        request=_req(gold="4", checker="math"),
        standard=_arm(Arm.STANDARD, "4"),
        fly=_arm(Arm.FLY, ok=False, error="timeout"),
    )
    out = compare(timeout)
    assert (out.status, out.reason) == ("unpaired", "fly_timeout")
    assert _labels(out) == set()
    noise_failed = ReplayPair(
        request=_req(),
        standard=_arm(Arm.STANDARD, "a"),
        fly=_arm(Arm.FLY, "a"),
        noise=_arm(Arm.NOISE, ok=False, error="connect"),
    )
    out = compare(noise_failed)
    assert out.status == "paired"
    assert _labels(out) == {("gsm8k", "fly", "agree")}
    bad = ReplayPair(
        request=_req(gold="1", checker="regex:(["),
        standard=_arm(Arm.STANDARD, "1"),
        fly=_arm(Arm.FLY, "1"),
    )
    assert (compare(bad).status, compare(bad).reason) == ("excluded", "bad_checker")
    assert _labels(compare(bad)) == set()


def test_json_path_checker() -> None:
    """The json: checker follows a JSON path into the answer, also inside a code fence."""
    doc = {"answer": {"items": [{"v": 3}, {"v": "x"}]}}
    assert json_path_get(doc, "$.answer.items[1].v") == "x"
    assert json_path_get(doc, "answer.items.0.v") == 3
    with pytest.raises(LookupError):
        json_path_get(doc, "$.answer.missing")
    chk = make_checker("json:$.result")
    assert chk.extract('Sure! ```json\n{"result": [1, 2]}\n```') == "[1, 2]"
    assert chk.equal_to_gold("[1,2]", '{"result": [1, 2]}')
    assert not chk.equal_to_gold("[1,3]", '{"result": [1, 2]}')
    assert chk.extract("no json here") is None


def test_math_checker_equivalences() -> None:
    """The math checker treats equivalent fractions, decimals and boxed answers as equal."""
    chk = make_checker("math")
    assert chk.equal_to_gold("\\frac{1}{2}", "so the answer is $\\boxed{\\frac{1}{2}}$")
    assert chk.equal_to_gold("0.5", "The answer is \\boxed{1/2}")
    assert not chk.equal_to_gold("\\frac{1}{3}", "The answer is \\boxed{0.5}")
    assert chk.equal_texts("We get \\boxed{2}.", "Hence \\boxed{2}")


def test_answers_equal_numbers() -> None:
    """answers_equal compares numbers across commas, currency, decimals and fractions."""
    assert answers_equal("1,000", "1000.0")
    assert answers_equal("$12", "12")
    assert answers_equal("3/4", "0.75")
    assert not answers_equal("12", "13")
    assert not answers_equal(None, "1")


def test_math_checker_numeric_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without math_verify the math checker falls back to comparing the last number."""
    import specwatch.shadow.checkers as checkers_mod

    monkeypatch.setattr(checkers_mod, "_math_verify_equal", lambda: None)
    chk = make_checker("math")
    assert chk.equal_to_gold("1/2", "so x = \\boxed{0.5}")
    assert chk.equal_to_gold("72", "She sold 48 + 24 = 72 clips.")
    assert not chk.equal_to_gold("72", "She sold 70 clips.")


# -- what the answer is: content, tool calls, reasoning (through real HTTP on 127.0.0.1) -------


def _chat_reply(message: dict[str, Any], finish: str = "stop") -> RawReply:
    body = {
        "object": "chat.completion",
        "choices": [
            {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 7, "total_tokens": 16},
    }
    return RawReply(200, "application/json", json.dumps(body).encode())


def _sse(chunks: list[dict[str, Any]]) -> RawReply:
    data = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    return RawReply(200, "text/event-stream; charset=utf-8", data + b"data: [DONE]\n\n")


def _tool(name: str, arguments: str, call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


async def _pair(
    std: RawReply, fly: RawReply, *, stream_fly: bool = False, checker: str | None = None
) -> PairOutcome:
    body = {"model": "m", "messages": [{"role": "user", "content": "q"}]}
    path = "/v1/chat/completions"
    req = ShadowRequest(path, body, request_hash(path, body), 0.0, Source.MIRROR, checker=checker)
    a, b = FakeArm(mode="script", replies={"q": std}), FakeArm(mode="script", replies={"q": fly})
    async with serve_arm(a) as su, serve_arm(b) as fu, aiohttp.ClientSession() as session:
        r = Replayer(
            session,
            ReplayArms(
                standard=ArmTarget(Arm.STANDARD, su, 30.0),
                fly=ArmTarget(Arm.FLY, fu, 30.0, stream=stream_fly),
            ),
            max_tokens_cap=64,
            marker_header="X-Specwatch-Shadow",
            mono_clock=SYSTEM_MONOTONIC,
        )
        return compare(await r.replay(req))


WEATHER_PARIS = _tool("get_weather", '{"city": "Paris", "unit": "c"}', "call_1")


async def test_tool_calls_are_compared_not_always_agreeing() -> None:
    """Tool-call replies (``content: null``) agree only when function names and JSON-normalised
    arguments agree: key order and spacing differ but the call is the same → agree; another city
    → disagree (it used to read both contents as "" and agree)."""
    std = _chat_reply({"content": None, "tool_calls": [WEATHER_PARIS]}, "tool_calls")
    same = _chat_reply(
        {"content": None, "tool_calls": [_tool("get_weather", '{"unit":"c","city":"Paris"}', "x")]},
        "tool_calls",
    )
    other = _chat_reply(
        {
            "content": None,
            "tool_calls": [_tool("get_weather", '{"city": "Lyon", "unit": "c"}', "y")],
        },
        "tool_calls",
    )
    agree = await _pair(std, same)
    assert (agree.status, agree.fly.agrees, agree.fly.tool_calls_agree) == ("paired", True, True)
    assert agree.fly.tool_calls == (ToolCall("get_weather", '{"city":"Paris","unit":"c"}'),)
    assert agree.fly.content_agrees is True
    assert agree.fly.reasoning_agrees is None
    differ = await _pair(std, other)
    assert (differ.fly.agrees, differ.fly.tool_calls_agree, differ.fly.exact_match) == (
        False,
        False,
        False,
    )
    assert differ.fly.content_agrees is True  # both contents empty: only the tool call differs


async def test_streamed_tool_call_arguments_are_joined_per_index() -> None:
    """A streamed tool call (name in the first delta, arguments cut across three deltas) reads
    the same as the non-streamed call: agree."""
    std = _chat_reply({"content": None, "tool_calls": [WEATHER_PARIS]}, "tool_calls")

    def delta(d: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"choices": [{"index": 0, "delta": d, "finish_reason": finish}]}

    first = {
        "index": 0,
        "id": "c9",
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    chunks = [
        delta({"role": "assistant", "tool_calls": [first]}),
        delta({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
        delta({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris", "un'}}]}),
        delta({"tool_calls": [{"index": 0, "function": {"arguments": 'it": "c"}'}}]}),
        delta({}, "tool_calls"),
    ]
    out = await _pair(std, _sse(chunks), stream_fly=True)
    assert out.fly.tool_calls == (ToolCall("get_weather", '{"city":"Paris","unit":"c"}'),)
    assert (out.status, out.fly.agrees, out.fly.exact_match) == ("paired", True, True)


async def test_empty_reasoning_model_content_does_not_agree_for_free() -> None:
    """A reasoning model cut at the token cap answers ``content: ""`` (or null) with only
    ``reasoning_content`` on both arms: the reasoning texts are compared (different → disagree,
    same → agree), the pair is truncated and never graded."""
    std = _chat_reply(
        {"content": "", "reasoning_content": "Let me add 17 and 25: that is 42"}, "length"
    )
    fly = _chat_reply(
        {"content": None, "reasoning_content": "Let me add 17 and 25: that is 41"}, "length"
    )
    twin = _chat_reply({"content": None, "reasoning": "Let me add 17 and 25: that is 42"}, "length")
    out = await _pair(std, fly, checker="math")
    assert (out.status, out.fly.agrees, out.fly.reasoning_agrees) == ("paired", False, False)
    assert out.fly.first_divergence_char == len("Let me add 17 and 25: that is 4")
    assert (out.standard.truncated, out.fly.truncated, out.fly.correct) == (True, True, None)
    same = await _pair(std, twin, checker="math")
    assert (same.fly.agrees, same.fly.reasoning_agrees, same.fly.exact_match) == (True, True, True)


async def test_reasoning_counts_without_a_checker_but_not_with_one() -> None:
    """Same content, different reasoning: live traffic (no checker, exact comparison) disagrees;
    with a checker (the final answer is graded) it agrees, and ``reasoning_agrees`` is False."""
    std = _chat_reply({"content": "42", "reasoning_content": "17 + 25 = 42"})
    fly = _chat_reply({"content": "42", "reasoning_content": "25 + 17 = 42"})
    live = await _pair(std, fly)
    assert (live.fly.content_agrees, live.fly.reasoning_agrees, live.fly.agrees) == (
        True,
        False,
        False,
    )
    graded = await _pair(std, fly, checker="math")
    assert (graded.fly.content_agrees, graded.fly.reasoning_agrees, graded.fly.agrees) == (
        True,
        False,
        True,
    )


async def test_completions_text_is_the_content() -> None:
    """``/v1/completions`` replies: ``choices[0].text`` is the content, no tool calls, no
    reasoning."""
    body = {"choices": [{"index": 0, "text": " Paris", "finish_reason": "stop"}]}
    reply = RawReply(200, "application/json", json.dumps(body).encode())
    out = await _pair(reply, reply)
    assert (out.fly.text, out.fly.tool_calls, out.fly.reasoning, out.fly.agrees) == (
        " Paris",
        (),
        None,
        True,
    )
