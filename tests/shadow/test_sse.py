"""SSE decoding and completion-stream accumulation (C17 hard case and the whole kind)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from specwatch.shadow.sse import (
    CompletionStreamAccumulator,
    SSEDecoder,
    SSEEvent,
    StreamResult,
    extract_mean_acceptance_length,
)
from tests.fakes import REPO

CASES = REPO / "tests" / "fixtures" / "cases"
RAW = (CASES / "C17_sse_stream.raw").read_bytes()
BOUNDS: list[int] = json.loads((CASES / "C17_read_boundaries.json").read_text())["read_ends"]
EXPECTED: dict[str, Any] = json.loads((CASES / "expected.json").read_text())["C17"]


def _pieces(data: bytes, ends: list[int]) -> list[bytes]:
    out, start = [], 0
    for e in ends:
        out.append(data[start:e])
        start = e
    if start < len(data):
        out.append(data[start:])
    return out


def _check_c17(acc: CompletionStreamAccumulator, r: StreamResult) -> None:
    assert r.text == EXPECTED["text"]
    assert r.finish_reason == EXPECTED["finish_reason"]
    usage = EXPECTED["usage"]
    assert (r.prompt_tokens, r.completion_tokens, r.total_tokens) == (
        usage["prompt_tokens"],
        usage["completion_tokens"],
        usage["total_tokens"],
    )
    assert r.done_seen is EXPECTED["done_seen"]
    assert r.data_events == EXPECTED["data_events"]
    assert acc.comment_lines == EXPECTED["comment_lines_ignored"]
    assert r.invalid_json_events == 0
    assert r.error is None
    assert acc.decoder.discarded_at_close == 0


def test_c17_given_read_boundaries() -> None:
    """The recorded stream, fed at its recorded read boundaries, decodes to the expected
    completion."""
    assert BOUNDS[-1] == len(RAW)
    acc = CompletionStreamAccumulator()
    r = acc.feed_all(_pieces(RAW, BOUNDS))
    _check_c17(acc, r)


def test_c17_every_one_byte_read() -> None:
    """The recorded stream fed one byte at a time decodes the same."""
    acc = CompletionStreamAccumulator()
    r = acc.feed_all(RAW[i : i + 1] for i in range(len(RAW)))
    _check_c17(acc, r)


def test_c17_every_two_piece_split() -> None:
    """The recorded stream split in two at every byte decodes the same."""
    for cut in range(len(RAW) + 1):
        acc = CompletionStreamAccumulator()
        r = acc.feed_all([RAW[:cut], RAW[cut:]])
        _check_c17(acc, r)


def test_c17_split_is_inside_utf8_char_and_crlf() -> None:
    """The recorded read boundaries fall inside a UTF-8 character and between CR and LF."""
    # the fixture really exercises the hard spots: a read ends inside "é" and between CR and LF
    e_acute = RAW.index("é".encode())
    assert any(b == e_acute + 1 for b in BOUNDS)
    crlf = RAW.index(b"\r\n")
    assert any(b == crlf + 1 for b in BOUNDS)


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
def test_line_endings_every_split(eol: bytes) -> None:
    """Each line ending, split at every byte, gives the same events with multi-line data and
    sticky id."""
    stream = eol.join([b"event: x", b"data: a", b"data:b", b"id: 7", b"", b"data: c", b"", b""])
    for cut in range(len(stream) + 1):
        dec = SSEDecoder()
        evs = dec.feed(stream[:cut]) + dec.feed(stream[cut:]) + dec.close()
        assert evs == [SSEEvent(data="a\nb", event="x", id="7"), SSEEvent(data="c", id="7")]


def test_pending_event_discarded_at_close_and_bad_utf8_counted() -> None:
    """An unterminated event is discarded at close and bad UTF-8 is replaced and counted."""
    dec = SSEDecoder()
    assert dec.feed(b"data: \xff\xfe\n\ndata: tail") == [SSEEvent(data="\ufffd\ufffd")]
    assert dec.close() == []
    assert dec.discarded_at_close == 1
    assert dec.decode_errors == 1


def test_in_band_error_and_invalid_json() -> None:
    """An in-band error event is kept and an invalid JSON event counted, without [DONE]."""
    chunks = [
        b'data: {"choices":[{"index":0,"text":"ab","finish_reason":null}]}\n\n',
        b"data: not json\n\n",
        b'data: {"error":{"message":"boom","type":"BadRequestError","code":400}}\n\n',
    ]
    acc = CompletionStreamAccumulator()
    r = acc.feed_all(chunks)
    assert r.text == "ab"
    assert r.invalid_json_events == 1
    assert r.error is not None
    assert r.error["message"] == "boom"
    assert r.done_seen is False


def test_completions_text_other_choices_token_ids_and_tau() -> None:
    """The accumulator keeps choice 0's text and token ids, the finish reason and tau from the
    metrics."""
    chunks = [
        b'data: {"choices":[{"index":0,"text":"x","token_ids":[1,2]},'
        b'{"index":1,"text":"IGNORED"}]}\n\n',
        b'data: {"choices":[{"index":0,"text":"y","token_ids":[3],"finish_reason":"length"}],'
        b'"metrics":{"speculative_decoding":{"mean_acceptance_length":2.5,"num_spec_steps":4,'
        b'"num_accepted_draft_tokens":6,"num_draft_tokens":16}}}\n\n',
        b"data: [DONE]\n\n",
    ]
    r = CompletionStreamAccumulator().feed_all(chunks)
    assert r.text == "xy"
    assert r.token_ids == [1, 2, 3]
    assert r.finish_reason == "length"
    assert r.mean_acceptance_length == pytest.approx(1 + 6 / 4)
    assert r.done_seen


def test_extract_mean_acceptance_length() -> None:
    """extract_mean_acceptance_length reads vLLM's per-request counts (tau = 1 + accepted /
    verify steps: 1 + 6 / 4 = 2.5), gives None for vLLM's placeholder (no verify step, reported
    1.0), for missing counts, a reported tau below 1, accepted > drafted, or a malformed object."""

    def sd(**kw: object) -> dict[str, object]:
        return {"metrics": {"speculative_decoding": kw}}

    counts = {"num_spec_steps": 4, "num_accepted_draft_tokens": 6, "num_draft_tokens": 16}
    assert extract_mean_acceptance_length(sd(mean_acceptance_length=2.5, **counts)) == 2.5
    placeholder = {"num_spec_steps": 0, "num_accepted_draft_tokens": 0, "num_draft_tokens": 0}
    assert extract_mean_acceptance_length(sd(mean_acceptance_length=1.0, **placeholder)) is None
    assert extract_mean_acceptance_length(sd(mean_acceptance_length=2.5)) is None
    assert extract_mean_acceptance_length(sd(mean_acceptance_length=0.5, **counts)) is None
    too_many = {**counts, "num_accepted_draft_tokens": 17}
    assert extract_mean_acceptance_length(sd(**too_many)) is None
    assert extract_mean_acceptance_length({"metrics": "x"}) is None
