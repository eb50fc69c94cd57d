"""Incremental Server-Sent Events parsing for OpenAI-compatible streams.

Two layers:

* :class:`SSEDecoder` turns network reads (``bytes`` cut anywhere) into events, following the
  WHATWG HTML "server-sent events" event-stream interpretation: lines end in CRLF, LF or CR (a CR at
  the end of one read waits for the next read to see whether an LF follows), a line starting with
  ``:`` is a comment, ``data`` fields of one event are joined with ``\\n``, a blank line dispatches
  the event, a pending event at end of stream is discarded. Lines are split on bytes and decoded
  only when whole, so a UTF-8 character cut between reads is never mangled.
* :class:`CompletionStreamAccumulator` reads the events of a ``/v1/completions`` or
  ``/v1/chat/completions`` stream (OpenAI chunk shape, as vLLM sends it): the text of choice 0
  (``delta.content`` or ``text``), its reasoning text and tool calls, its ``finish_reason``,
  ``usage`` (also from a usage-only chunk with ``choices: []``), the ``[DONE]`` sentinel, in-band
  ``{"error": ...}`` chunks and ``event: error`` events with their code, ``token_ids`` when
  returned, vLLM's per-request ``metrics.speculative_decoding`` when returned, and counts of
  malformed input (invalid JSON, events after ``[DONE]``, events with no data).
  :func:`read_completion_body` gives the same reading of a non-streamed body.

What a reading *means* (complete, truncated, failed and why) is decided in one place,
:mod:`specwatch.shadow.classify`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from specwatch.vllm.request_metrics import (
    SpecDecodeReading,
    read_spec_decode,
    spec_decode_problem,
)
from specwatch.vllm.sglang import read_sglang_spec

DONE_SENTINEL = "[DONE]"


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched event: ``event`` type (default ``"message"``), ``data``, last ``id``."""

    data: str
    event: str = "message"
    id: str | None = None


class SSEDecoder:
    """Incremental event-stream decoder: ``feed(chunk) -> [SSEEvent]``, then ``close()``.

    Counters: ``comment_lines`` (lines starting with ``:``), ``events`` (dispatched),
    ``discarded_at_close`` (1 when a partly received event was pending at end of stream),
    ``decode_errors`` (lines that were not valid UTF-8; decoded with replacement),
    ``no_data_events`` (a blank line ended an event that had an ``event`` field but no ``data``;
    WHATWG drops such an event, so it is only counted).
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pending_cr = False
        self._data: list[str] = []
        self._has_data = False
        self._event_type = ""
        self._last_id: str | None = None
        self.comment_lines = 0
        self.events = 0
        self.discarded_at_close = 0
        self.decode_errors = 0
        self.no_data_events = 0

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Consume one read; return the events completed by it (possibly none)."""
        out: list[SSEEvent] = []
        if not chunk:
            return out
        if self._pending_cr:
            self._pending_cr = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        self._buf += chunk
        buf = self._buf
        start = 0
        n = len(buf)
        lf = buf.find(b"\n")
        cr = buf.find(b"\r")
        while start < n:
            # next line terminator at or after start; each search result is reused until passed
            if 0 <= lf < start:
                lf = buf.find(b"\n", start)
            if 0 <= cr < start:
                cr = buf.find(b"\r", start)
            if lf < 0 and cr < 0:
                break
            if cr < 0 or (0 <= lf < cr):
                end, nxt = lf, lf + 1
            else:
                end = cr
                if cr + 1 < n:
                    nxt = cr + 2 if buf[cr + 1] == 0x0A else cr + 1
                else:
                    nxt = cr + 1
                    self._pending_cr = True
            self._line(bytes(buf[start:end]), out)
            start = nxt
        del buf[:start]
        return out

    def close(self) -> list[SSEEvent]:
        """End of stream: a last unterminated line is processed; a pending event is discarded."""
        out: list[SSEEvent] = []
        if self._buf:
            self._line(bytes(self._buf), out)
            self._buf.clear()
        if self._has_data:
            self.discarded_at_close = 1
        self._data = []
        self._has_data = False
        self._event_type = ""
        return out

    def _line(self, raw: bytes, out: list[SSEEvent]) -> None:
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            self.decode_errors += 1
            line = raw.decode("utf-8", errors="replace")
        if not line:
            if self._has_data:
                data = "\n".join(self._data)
                out.append(
                    SSEEvent(data=data, event=self._event_type or "message", id=self._last_id)
                )
                self.events += 1
            elif self._event_type:
                self.no_data_events += 1
            self._data = []
            self._has_data = False
            self._event_type = ""
            return
        if line[0] == ":":
            self.comment_lines += 1
            return
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
            self._has_data = True
        elif name == "event":
            self._event_type = value
        elif name == "id" and "\x00" not in value:
            self._last_id = value
        # "retry" and unknown fields are ignored (WHATWG).


def extract_mean_acceptance_length(obj: Mapping[str, Any]) -> float | None:
    """Measured per-request τ from a vLLM or SGLang reply or chunk, ``None`` when absent,
    malformed or a placeholder (no verify step); see :mod:`specwatch.vllm.request_metrics` and
    :func:`specwatch.vllm.sglang.read_sglang_spec`."""
    sd = read_spec_decode(obj) or read_sglang_spec(obj)
    return sd.tau if sd is not None else None


def _int_or_none(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def error_code(obj: Mapping[str, Any]) -> int | None:
    """The HTTP-like code of an in-band error object, ``None`` when it has none.

    Reads ``error.code`` (vLLM's ``{"error": {..., "code": 500}}``) or a top-level ``code``
    (``event: error`` with ``{"code": 400, "details": ...}``); an int or a string of digits.
    """
    err = obj.get("error")
    for holder in (err if isinstance(err, Mapping) else {}, obj):
        code = holder.get("code")
        if isinstance(code, str) and code.isdigit():
            return int(code)
        got = _int_or_none(code)
        if got is not None:
            return got
    return None


@dataclass(slots=True)
class _ToolCallParts:
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass(slots=True)
class StreamResult:
    """What a completion reply said: a stream so far (:class:`CompletionStreamAccumulator`) or a
    whole non-streamed body (:func:`read_completion_body`).

    Choice 0 only: ``text`` (``content`` / ``text``), ``reasoning`` (``reasoning_content`` or
    ``reasoning``; ``None`` when none was sent), ``tool_calls`` as ``(name, arguments)`` in index
    order (streamed arguments concatenated; not yet JSON-normalised), ``finish_reason`` as sent.
    ``usage`` tokens, ``token_ids``, per-request τ and ``model`` when sent; ``spec_problem``
    why a reply's speculative-decoding object was refused (its counts are then not read; see
    :func:`specwatch.vllm.request_metrics.spec_decode_problem`). ``error`` is an
    in-band error object and ``error_code`` its code. Stream-only counts: ``done_seen``,
    ``data_events`` (JSON chunks), ``invalid_json_events`` (data neither a JSON object nor
    ``[DONE]``), ``data_after_done`` (events after the ``[DONE]`` sentinel, ignored),
    ``empty_events`` (``data:`` with nothing in it, or an ``event:`` with no data).
    """

    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    done_seen: bool = False
    data_events: int = 0
    invalid_json_events: int = 0
    data_after_done: int = 0
    empty_events: int = 0
    error: Mapping[str, Any] | None = None
    error_code: int | None = None
    token_ids: list[int] | None = None
    mean_acceptance_length: float | None = None
    spec_decode: SpecDecodeReading | None = None
    spec_problem: str | None = None
    model: str | None = None
    reasoning: str | None = None
    tool_calls: list[tuple[str, str]] = field(default_factory=list)
    _parts: list[str] = field(default_factory=list)
    _reasoning_parts: list[str] | None = None
    _tool_parts: dict[int, _ToolCallParts] = field(default_factory=dict)

    def _finish(self) -> StreamResult:
        self.text = "".join(self._parts)
        if self._reasoning_parts is not None:
            self.reasoning = "".join(self._reasoning_parts)
        self.tool_calls = [
            (tc.name, "".join(tc.arguments)) for _, tc in sorted(self._tool_parts.items())
        ]
        return self

    def _output_size(self) -> int:
        """Pieces of generated output received so far (text, reasoning, tool-call parts)."""
        return (
            len(self._parts)
            + len(self._reasoning_parts or ())
            + sum(len(tc.arguments) + bool(tc.name) for tc in self._tool_parts.values())
        )

    def _add_reasoning(self, holder: Mapping[str, Any]) -> None:
        for key in ("reasoning_content", "reasoning"):
            piece = holder.get(key)
            if isinstance(piece, str):
                if self._reasoning_parts is None:
                    self._reasoning_parts = []
                self._reasoning_parts.append(piece)
                return

    def _add_tool_calls(self, holder: Mapping[str, Any]) -> None:
        calls = holder.get("tool_calls")
        if isinstance(calls, list):
            for pos, call in enumerate(calls):
                if not isinstance(call, Mapping):
                    continue
                idx = _int_or_none(call.get("index"))
                slot = self._tool_parts.setdefault(
                    idx if idx is not None else len(self._tool_parts) + pos, _ToolCallParts()
                )
                fn = call.get("function")
                if isinstance(fn, Mapping):
                    self._add_function(slot, fn)
        legacy = holder.get("function_call")
        if isinstance(legacy, Mapping):
            self._add_function(self._tool_parts.setdefault(-1, _ToolCallParts()), legacy)

    @staticmethod
    def _add_function(slot: _ToolCallParts, fn: Mapping[str, Any]) -> None:
        name = fn.get("name")
        if isinstance(name, str) and name:
            slot.name = name
        args = fn.get("arguments")
        if isinstance(args, str):
            slot.arguments.append(args)
        elif isinstance(args, Mapping | list):
            slot.arguments.append(json.dumps(args))

    def _add_usage(self, obj: Mapping[str, Any]) -> None:
        usage = obj.get("usage")
        if isinstance(usage, Mapping):
            self.prompt_tokens = _int_or_none(usage.get("prompt_tokens"))
            self.completion_tokens = _int_or_none(usage.get("completion_tokens"))
            self.total_tokens = _int_or_none(usage.get("total_tokens"))
        problem = spec_decode_problem(obj)
        if problem is not None:
            self.spec_problem = problem
        sd = read_spec_decode(obj) or read_sglang_spec(obj)
        if sd is not None:
            self.spec_decode = sd
            self.mean_acceptance_length = sd.tau
        model = obj.get("model")
        if isinstance(model, str):
            self.model = model

    def _add_token_ids(self, ch: Mapping[str, Any]) -> None:
        ids = ch.get("token_ids")
        if isinstance(ids, list) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in ids
        ):
            self.token_ids = (self.token_ids or []) + ids

    def _set_error(self, obj: Mapping[str, Any]) -> None:
        err = obj.get("error")
        self.error = err if isinstance(err, Mapping) else dict(obj)
        self.error_code = error_code(obj)


def read_completion_body(obj: Mapping[str, Any]) -> StreamResult:
    """The reading of a non-streamed ``/v1/completions`` or ``/v1/chat/completions`` body (pure).

    Choice 0's ``message.content`` (chat) or ``text`` (completions), ``message.reasoning_content``
    / ``message.reasoning``, ``message.tool_calls`` (and the legacy ``function_call``),
    ``finish_reason``, ``usage``, ``token_ids`` and per-request τ; a top-level ``error`` object is
    kept in ``error`` / ``error_code``. A body without a usable choice 0 leaves ``text`` empty and
    ``finish_reason`` ``None`` (:mod:`specwatch.shadow.classify` decides what that means).
    """
    r = StreamResult()
    if isinstance(obj.get("error"), Mapping):
        r._set_error(obj)
        return r._finish()
    choices = obj.get("choices")
    ch = choices[0] if isinstance(choices, list) and choices else None
    if isinstance(ch, Mapping):
        msg = ch.get("message")
        holder: Mapping[str, Any] = msg if isinstance(msg, Mapping) else ch
        piece = holder.get("content") if isinstance(msg, Mapping) else ch.get("text")
        if isinstance(piece, str):
            r._parts.append(piece)
        r._add_reasoning(holder)
        r._add_tool_calls(holder)
        fr = ch.get("finish_reason")
        r.finish_reason = fr if isinstance(fr, str) else None
        r._add_token_ids(ch)
    r._add_usage(obj)
    return r._finish()


class CompletionStreamAccumulator:
    """Feed network reads of an OpenAI-compatible stream; read :attr:`result` at the end.

    ``data_events`` counts JSON chunks (``[DONE]`` is not counted; it sets ``done_seen``);
    ``invalid_json_events`` counts data that was neither JSON objects nor ``[DONE]``;
    ``data_after_done`` counts events after ``[DONE]`` (their content is ignored); an in-band
    error chunk (``{"error": {...}}`` or ``event: error``) is kept in ``error`` with its code in
    ``error_code``. Only choice ``index`` 0 is accumulated: ``delta.content`` / ``text``,
    ``delta.reasoning_content`` / ``delta.reasoning``, ``delta.tool_calls`` (arguments joined per
    tool-call index).
    """

    def __init__(self) -> None:
        self.decoder = SSEDecoder()
        self._r = StreamResult()
        self._empty = 0
        #: Choice-0 chunks that carried generated output (text, reasoning or a tool call).
        self.output_events = 0

    @property
    def result(self) -> StreamResult:
        """The reading so far (joined text, reasoning and tool calls)."""
        self._r.empty_events = self._empty + self.decoder.no_data_events
        return self._r._finish()

    @property
    def comment_lines(self) -> int:
        """Comment (keep-alive) lines seen."""
        return self.decoder.comment_lines

    @property
    def decode_errors(self) -> int:
        """Lines that were not valid UTF-8."""
        return self.decoder.decode_errors

    def feed(self, chunk: bytes) -> None:
        """Consume one network read."""
        self._events(self.decoder.feed(chunk))

    def close(self) -> StreamResult:
        """End of stream; returns :attr:`result`."""
        self._events(self.decoder.close())
        return self.result

    def feed_all(self, chunks: Iterable[bytes]) -> StreamResult:
        """Convenience: feed every chunk, then close."""
        for c in chunks:
            self.feed(c)
        return self.close()

    def _events(self, events: list[SSEEvent]) -> None:
        for ev in events:
            self._event(ev)

    def _event(self, ev: SSEEvent) -> None:
        r = self._r
        data = ev.data.strip()
        if r.done_seen:
            r.data_after_done += 1
            return
        if not data:
            self._empty += 1
            return
        if data == DONE_SENTINEL:
            r.done_seen = True
            return
        try:
            obj = json.loads(data)
        except (ValueError, RecursionError):  # RecursionError: nesting too deep
            r.invalid_json_events += 1
            return
        if not isinstance(obj, dict):
            r.invalid_json_events += 1
            return
        r.data_events += 1
        if ev.event == "error" or isinstance(obj.get("error"), Mapping):
            r._set_error(obj)
            return
        choices = obj.get("choices")
        if isinstance(choices, list):
            for ch in choices:
                if not isinstance(ch, Mapping) or ch.get("index", 0) != 0:
                    continue
                delta = ch.get("delta")
                piece: object = None
                before = r._output_size()
                if isinstance(delta, Mapping):
                    piece = delta.get("content")
                    r._add_reasoning(delta)
                    r._add_tool_calls(delta)
                elif "text" in ch:
                    piece = ch.get("text")
                if isinstance(piece, str) and piece:
                    r._parts.append(piece)
                if r._output_size() > before:
                    self.output_events += 1
                fr = ch.get("finish_reason")
                if isinstance(fr, str):
                    r.finish_reason = fr
                r._add_token_ids(ch)
        r._add_usage(obj)
