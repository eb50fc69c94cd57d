"""SGLang's replies through the one reply-outcome rule and the pair rule: completion and chat
bodies (finish reasons with ``matched_stop``), streams with their usage chunk, the in-stream
abort, the top-level ``{"object": "error"}`` body (at 200 an in-band error; at 400 a refused
request) and the per-request speculative fields (``sglext.spec_tokens_details``, ``meta_info``).
Fixtures: tests/fixtures/sglang/replies (their provenance lines name SGLang's source)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from specwatch.shadow.classify import body_result, classify, stream_result
from specwatch.shadow.sse import CompletionStreamAccumulator
from specwatch.shadow.values import Arm, ArmResult
from specwatch.vllm.sglang import read_sglang_spec
from tests.fixture_files import FIXTURES

REPLIES = FIXTURES / "sglang" / "replies"


def _reply(name: str) -> tuple[int, str, bytes]:
    """(status, content type, body) of a saved ``.http`` reply (``#`` lines are provenance)."""
    text = (REPLIES / name).read_text(encoding="utf-8")
    lines = [ln for ln in text.split("\n") if not ln.startswith("#")]
    head, body = "\n".join(lines).split("\n\n", 1)
    status_line, *headers = head.split("\n")
    ctype = next(
        h.split(":", 1)[1].strip() for h in headers if h.lower().startswith("content-type")
    )
    return int(status_line.split()[1]), ctype, body.encode("utf-8")


def _arm(name: str, arm: Arm = Arm.FLY) -> ArmResult:
    status, ctype, body = _reply(name)
    if ctype.startswith("text/event-stream"):
        acc = CompletionStreamAccumulator()
        acc.feed(body)
        return stream_result(arm, acc, status=status, latency=0.1, content_type=ctype)
    return body_result(arm, body, status=status, latency=0.1, content_type=ctype)


@pytest.mark.parametrize(
    ("name", "finish", "text"),
    [
        ("sglang-0.5.10-completions-stop-eos.http", "stop", " Paris."),
        ("sglang-0.5.10-completions-stop-string.http", "stop", None),
        ("sglang-0.5.10-completions-length.http", "length", None),
        ("sglang-0.5.10-chat-stop.http", "stop", None),
        ("sglang-0.5.10-completions-stream.sse.http", "length", None),
        ("sglang-0.5.10-chat-stream.sse.http", "stop", None),
    ],
)
def test_answers_are_ok(name: str, finish: str, text: str | None) -> None:
    """Every SGLang answer (EOS token, stop string, length, chat, both streams) is an answer
    with SGLang's finish reason; ``matched_stop`` changes nothing."""
    r = _arm(name)
    assert (r.ok, r.error, r.finish_reason) == (True, None, finish)
    if text is not None:
        assert r.text == text


def test_stream_abort_is_an_in_band_5xx() -> None:
    """A scheduler abort mid-stream (``data: {"error": {... "code": 503}}``, status 200) fails
    the arm as ``in_band_5xx``: the pair is unpaired, never a mismatch."""
    r = _arm("sglang-0.5.10-completions-stream-abort.sse.http")
    assert (r.ok, r.error, r.error_code) == (False, "in_band_5xx", 503)
    ok = _arm("sglang-0.5.10-completions-length.http", Arm.STANDARD)
    assert classify(ok, r) == ("unpaired", "fly_in_band_5xx")


@pytest.mark.parametrize(
    "name", ["sglang-0.5.10-error-context-length.http", "sglang-0.5.10-error-empty-prompt.http"]
)
def test_top_level_error_body(name: str) -> None:
    """SGLang's error body is the ErrorResponse itself (``object: error`` at top level). With
    its 400 the request was refused: excluded as ``bad_request``. The same body at 200 is an
    in-band error by its ``code`` (400: ``in_band_4xx``), never an answer or invalid_body."""
    status, ctype, body = _reply(name)
    assert status == 400
    refused = ArmResult(Arm.FLY, False, 0.1, status=400, error="http_400")
    ok = _arm("sglang-0.5.10-completions-length.http", Arm.STANDARD)
    assert classify(ok, refused) == ("excluded", "bad_request")
    at_200 = body_result(Arm.FLY, body, status=200, latency=0.1, content_type=ctype)
    assert (at_200.ok, at_200.error, at_200.error_code) == (False, "in_band_4xx", 400)


def test_spec_tokens_details_give_per_request_tau() -> None:
    """0.5.23 ``sglext.spec_tokens_details``: 4 correct drafts of 9 proposed over 3 verifies:
    τ = 1 + 4 / 3 (SGLang's own 8 / 3 counts the prefill token too), α = 4 / 9."""
    r = _arm("sglang-0.5.23-chat-spec-details.http")
    assert r.ok
    assert r.spec_decode is not None
    assert (
        r.spec_decode.num_spec_steps,
        r.spec_decode.num_draft_tokens,
        r.spec_decode.num_accepted_draft_tokens,
    ) == (3, 9, 4)
    assert r.mean_acceptance_length == pytest.approx(1 + 4 / 3)
    assert r.spec_decode.alpha == pytest.approx(4 / 9)


def _json_body(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(_reply(name)[2])
    return doc


def test_generate_meta_info_by_version() -> None:
    """/generate ``meta_info``: 0.5.10 names (spec_accept_token_num / spec_draft_token_num: 19 of
    36 over 12 verifies) and 0.5.23 names (spec_num_correct_drafts / proposed: the same 19 of
    36): τ = 1 + 19 / 12, α = 19 / 36 both times."""
    for name in ("sglang-0.5.10-generate-eagle.http", "sglang-0.5.23-generate-eagle3.http"):
        sd = read_sglang_spec(_json_body(name))
        assert sd is not None
        assert (sd.num_spec_steps, sd.num_draft_tokens, sd.num_accepted_draft_tokens) == (
            12,
            36,
            19,
        )
        assert sd.tau == pytest.approx(1 + 19 / 12)
        assert sd.alpha == pytest.approx(19 / 36)


def test_replies_without_spec_fields() -> None:
    """An OpenAI reply before 0.5.19 carries no per-request fields: nothing is read."""
    assert read_sglang_spec(_json_body("sglang-0.5.10-chat-stop.http")) is None
    assert _arm("sglang-0.5.10-chat-stop.http").spec_decode is None
