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
  (``delta.content`` or ``text``), its ``finish_reason``, ``usage`` (also from a usage-only chunk
  with ``choices: []``), the ``[DONE]`` sentinel, in-band ``{"error": ...}`` chunks, ``token_ids``
  when returned, and vLLM's per-request ``metrics.speculative_decoding`` when returned.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from specwatch.vllm.request_metrics import SpecDecodeReading, read_spec_decode

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
    ``decode_errors`` (lines that were not valid UTF-8; decoded with replacement).
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
    """Measured per-request τ from a vLLM reply or chunk, ``None`` when absent, malformed or
    vLLM's placeholder (no verify step); see :mod:`specwatch.vllm.request_metrics`."""
    sd = read_spec_decode(obj)
    return sd.tau if sd is not None else None


def _int_or_none(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


@dataclass(slots=True)
class StreamResult:
    """What a completion stream said so far."""

    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    done_seen: bool = False
    data_events: int = 0
    invalid_json_events: int = 0
    error: Mapping[str, Any] | None = None
    token_ids: list[int] | None = None
    mean_acceptance_length: float | None = None
    spec_decode: SpecDecodeReading | None = None
    model: str | None = None
    _parts: list[str] = field(default_factory=list)


class CompletionStreamAccumulator:
    """Feed network reads of an OpenAI-compatible stream; read :attr:`result` at the end.

    ``data_events`` counts JSON chunks (``[DONE]`` is not counted; it sets ``done_seen``);
    ``invalid_json_events`` counts data that was neither JSON objects nor ``[DONE]``; an in-band
    error chunk (``{"error": {...}}``) is kept in ``error``. Only choice ``index`` 0 is accumulated.
    """

    def __init__(self) -> None:
        self.decoder = SSEDecoder()
        self._r = StreamResult()

    @property
    def result(self) -> StreamResult:
        self._r.text = "".join(self._r._parts)
        return self._r

    @property
    def comment_lines(self) -> int:
        return self.decoder.comment_lines

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
        if data == DONE_SENTINEL:
            r.done_seen = True
            return
        try:
            obj = json.loads(data)
        except ValueError:
            r.invalid_json_events += 1
            return
        if not isinstance(obj, dict):
            r.invalid_json_events += 1
            return
        r.data_events += 1
        err = obj.get("error")
        if ev.event == "error" or isinstance(err, Mapping):
            r.error = err if isinstance(err, Mapping) else {"message": str(obj)}
            return
        model = obj.get("model")
        if isinstance(model, str):
            r.model = model
        choices = obj.get("choices")
        if isinstance(choices, list):
            for ch in choices:
                if not isinstance(ch, Mapping) or ch.get("index", 0) != 0:
                    continue
                delta = ch.get("delta")
                piece: object = None
                if isinstance(delta, Mapping):
                    piece = delta.get("content")
                elif "text" in ch:
                    piece = ch.get("text")
                if isinstance(piece, str) and piece:
                    r._parts.append(piece)
                fr = ch.get("finish_reason")
                if isinstance(fr, str):
                    r.finish_reason = fr
                ids = ch.get("token_ids")
                if isinstance(ids, list) and all(isinstance(t, int) for t in ids):
                    r.token_ids = (r.token_ids or []) + ids
        usage = obj.get("usage")
        if isinstance(usage, Mapping):
            r.prompt_tokens = _int_or_none(usage.get("prompt_tokens"))
            r.completion_tokens = _int_or_none(usage.get("completion_tokens"))
            r.total_tokens = _int_or_none(usage.get("total_tokens"))
        sd = read_spec_decode(obj)
        if sd is not None:
            r.spec_decode = sd
            r.mean_acceptance_length = sd.tau
