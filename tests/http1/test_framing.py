"""The framing helpers every part of the forwarding engine shares, by hand."""

from __future__ import annotations

import json

import pytest

from specwatch.http1.framing import connection_tokens, head_end, json_error


def test_connection_tokens_reads_every_connection_field() -> None:
    """connection_tokens reads every Connection header field, lower-cased, empty tokens
    skipped."""
    assert connection_tokens([b"close, X-A", b" x-b ,"]) == {b"close", b"x-a", b"x-b"}


@pytest.mark.parametrize(
    ("buf", "end"),
    [
        (b"HTTP/1.1 200 OK\r\nA: b\r\n\r\nbody", 25),
        (b"HTTP/1.1 200 OK\nA: b\n\nbody", 22),
        (b"HTTP/1.1 200 OK\r\nA: b\r\n", -1),
        (b"HTTP/1.1 200 OK\r\n\r\nx\n\ny", 19),
    ],
    ids=["CRLF", "bare LF", "not yet", "first empty line wins"],
)
def test_head_end_finds_the_empty_line(buf: bytes, end: int) -> None:
    """The offset just past the empty line that ends a head: ``"HTTP/1.1 200 OK\\r\\n"`` is 17
    bytes and ``"A: b\\r\\n"`` 6, so the empty line ends at 17 + 6 + 2 = 25; with bare LF
    line ends 16 + 5 + 1 = 22; none yet is -1."""
    assert head_end(buf) == end


def test_json_error_is_a_whole_answer() -> None:
    """A 502 with a JSON body of the message; its length is that of the body, and
    ``Connection: close`` comes only when asked."""
    body = b'{"error": {"message": "upstream connect"}}'
    assert json.loads(body) == {"error": {"message": "upstream connect"}}
    assert json_error(502, "Bad Gateway", "upstream connect", False) == (
        b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: application/json\r\nContent-Length: 42\r\n"
        b"\r\n" + body
    )
    assert json_error(504, "Gateway Timeout", "upstream connect", True).startswith(
        b"HTTP/1.1 504 Gateway Timeout\r\nContent-Type: application/json\r\n"
        b"Content-Length: 42\r\nConnection: close\r\n\r\n"
    )
