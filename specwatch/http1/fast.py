"""The fast paths: the common request and the common answer recognised from their raw bytes,
without the parsers' per-field callbacks, each in one function that drives the client
connection or the exchange through a protocol. Everything else goes through llhttp (the parser
path, :mod:`specwatch.http1.client` and :mod:`specwatch.http1.exchange`); the tests hold both
paths to the same bytes.

- :func:`fast_request`: a read holding exactly one whole request of the common shape
  (origin-form HTTP/1.1 request line, ``Name: value`` fields, at most one ``Content-Length``
  and a body of that length, no field the parser path would drop besides ``Host``,
  ``Connection: keep-alive`` and ``X-Forwarded-For``), rebuilt from its raw bytes into what the
  parser path would send up.
- :func:`fast_answer`: an answer whose first read holds a whole well-formed head with a final
  status, no field to drop and one ``Content-Length`` or ``Transfer-Encoding: chunked``,
  relayed at once (the end of a chunked one is found by llhttp with the single callback of
  :class:`AnswerEnd`).
"""

from __future__ import annotations

import asyncio
import re
from typing import Protocol

import httptools

from specwatch.http1.engine import Engine
from specwatch.http1.framing import CRLF, DIGITS, DROP_REQUEST, AfterEnd

__all__ = [
    "FAST_HEAD_MAX",
    "AnswerEnd",
    "Answering",
    "Fresh",
    "Requesting",
    "Writable",
    "fast_answer",
    "fast_request",
]

_TCHAR = rb"[!#$%&'*+.^_`|~0-9A-Za-z-]"
#: The common answer: an HTTP/1.1 status line with a final status and well-formed fields
#: (linear-time pattern).
_FAST_ANSWER = re.compile(
    rb"HTTP/1\.1 ([2-5][0-9][0-9]) [\t\x20-\x7e\x80-\xff]*\r\n(?:"
    + _TCHAR
    + rb"+:[\t\x20-\x7e\x80-\xff]*\r\n)*\r\n"
)
#: Fields that keep an answer off the fast path (or give its length), with their values.
_ANSWER_FIELDS = re.compile(
    rb"\n(content-length|connection|keep-alive|proxy-connection|proxy-authenticate|"
    rb"proxy-authentication-info|proxy-authorization|te|trailer|transfer-encoding|upgrade):"
    rb"([^\r]*)",
    re.IGNORECASE,
)
#: The common request: an origin-form HTTP/1.1 request line and fields written ``Name: value``
#: with no padding around the value (so the head rebuilt from the raw bytes equals the parser
#: path's byte for byte); a word-by-word value pattern keeps the match linear in the head's
#: length.
_FIELD_VALUE = rb"(?:[\x21-\x7e\x80-\xff]+(?:[ \t]+[\x21-\x7e\x80-\xff]+)*)?"
_FAST_REQUEST = re.compile(
    rb"(GET|POST|PUT|PATCH|DELETE|OPTIONS) (/[\x21-\x7e]*) HTTP/1\.1\r\n((?:"
    + _TCHAR
    + rb"+: "
    + _FIELD_VALUE
    + rb"\r\n)*)\r\n"
)
#: Longest request head the fast path looks at (a longer one takes the parser path).
FAST_HEAD_MAX = 8192
#: Request fields the fast path drops itself (others the parser path drops send it there).
_FAST_DROPPED = re.compile(rb"^(?:host|connection|x-forwarded-for): [^\r]*\r\n", re.I | re.M)


class Fresh(Protocol):
    """A new exchange as the fast request path fills it in
    (:class:`~specwatch.http1.exchange.Exchange`)."""

    shadow: bool
    keep_client: bool
    body_done: bool

    def send_up(self, data: bytes) -> None:
        """Request bytes for the upstream (held until a connection is attached)."""

    def begin(self) -> None:
        """Get an upstream connection (the request goes up now or on connect)."""


class Requesting(Protocol):
    """A client connection as the fast request path drives it
    (:class:`~specwatch.http1.client.Client`)."""

    peer: bytes
    header_timer: asyncio.TimerHandle | None

    @property
    def fwd(self) -> Engine:
        """The engine the connection belongs to."""

    def queued_exchange(self) -> Fresh:
        """A new exchange, last in the connection's queue."""


def fast_request(c: Requesting, data: bytes) -> bool:
    """Forward the read ``data`` of client connection ``c`` without the request parser when it
    is exactly one whole request of the common shape (see the module docstring): the head is
    rebuilt from the raw bytes into what the parser path would send up (``Host`` replaced,
    ``Connection: keep-alive`` dropped, ``X-Forwarded-For`` moved last with the peer appended,
    the other fields in their order), and the exchange, the copy and the counters are what
    the parser path makes of the same bytes. ``False`` (nothing done) sends ``data`` to the
    parser, which handles every other case."""
    end = data.find(b"\r\n\r\n", 0, FAST_HEAD_MAX)
    if end < 0:
        return False
    end += 4
    m = _FAST_REQUEST.match(data, 0, end)
    if m is None:
        return False
    fwd = c.fwd
    length = 0
    seen_length = marked = False
    prior: list[bytes] = []
    category = request_id = None
    for name, value in fwd.fast_fields.findall(data, 0, end):
        n = name.lower()
        if n == b"host":
            continue
        if n == b"content-length":
            digits = DIGITS.fullmatch(value)
            if seen_length or digits is None:
                return False
            seen_length = True
            length = int(value)
        elif n == b"x-forwarded-for":
            prior.append(value)
        elif n == b"connection":
            if value.lower() != b"keep-alive":
                return False
        elif n in DROP_REQUEST:
            return False
        elif n == fwd.marker:
            marked = marked or bool(value)
        elif n == fwd.category_header:
            if category is None:
                category = value.decode("latin-1")
        elif n == fwd.request_id_header and request_id is None:
            request_id = value.decode("latin-1")
    if len(data) - end != length:
        return False
    method, url, fields = m.groups()
    up = fwd.up
    if c.peer:
        prior.append(c.peer)
    xff = b"X-Forwarded-For: " + b", ".join(prior) + CRLF if prior else b""
    head = b"%b %b%b HTTP/1.1\r\nHost: %b\r\n%b%b\r\n" % (
        method,
        up.prefix,
        url,
        up.host_header,
        _FAST_DROPPED.sub(b"", fields),
        xff,
    )
    # what the parser callbacks do at the end of a head and of a message
    if c.header_timer is not None:
        c.header_timer.cancel()
        c.header_timer = None
    fwd.counters.proxy_requests += 1
    ex = c.queued_exchange()
    path = url.split(b"?", 1)[0]
    shadowed_path = method == b"POST" and path in fwd.shadow_paths
    ex.shadow = shadowed_path and not marked
    ex.body_done = True
    body = data[end:]
    ex.send_up(head + body if body else head)
    ex.begin()  # the live request goes up first, then the hand-over hears of it
    if shadowed_path and marked:
        fwd.handover.marked()
    elif ex.shadow and body:
        if len(body) > fwd.max_body:
            fwd.copy_refused("too_large", c.peer, path)
        else:
            fwd.handover.copy(path.decode("latin-1"), body, category, request_id)
    return True


class Answering(Protocol):
    """An exchange as the fast answer path sees it (:class:`~specwatch.http1.exchange.Exchange`)."""

    is_head: bool
    keep_client: bool
    client_http10: bool
    body_done: bool
    resp_done: bool
    head_done: bool
    started: bool
    resp_framing: str
    up_keep: bool
    body_left: int
    r_parser: httptools.HttpResponseParser | None
    resend: list[bytes] | None

    @property
    def client(self) -> Writable:
        """The client connection the answer goes to."""

    def finish(self) -> None:
        """The answer is complete."""


class Writable(Protocol):
    """A client connection as the fast answer path writes to it."""

    transport: asyncio.Transport | None


def fast_answer(ex: Answering, data: bytes) -> bool:
    """Relay the first read ``data`` of ``ex``'s answer at once, for a keep-alive HTTP/1.1
    client whose request is complete, when it holds a whole head of the common shape: a final
    status other than 204/304, none of the fields the parser path would drop, and either
    ``Transfer-Encoding: chunked`` (its end found by llhttp) or one plain ``Content-Length``
    with no more than that many body bytes (the rest counted down by the exchange). ``False``
    (nothing done) sends the answer down the parser path, which handles every other case."""
    if ex.is_head or not ex.keep_client or ex.client_http10 or not ex.body_done:
        return False
    m = _FAST_ANSWER.match(data)
    if m is None:
        return False
    fields = _ANSWER_FIELDS.findall(data, 0, m.end())
    if len(fields) != 1 or m.group(1) in (b"204", b"304"):
        return False
    name, value = fields[0][0].lower(), fields[0][1].strip(b" \t")
    t = ex.client.transport
    if name == b"transfer-encoding" and value.lower() == b"chunked":
        # relayed as it comes; llhttp finds the end, with one callback (not one per chunk).
        # The first read is parsed before it is relayed: malformed framing in it goes to the
        # parser path, which answers a clean 502 as nothing has been sent yet.
        parser = httptools.HttpResponseParser(AnswerEnd(ex))
        keep = True
        try:
            parser.feed_data(data)
        except httptools.HttpParserError:
            if not ex.resp_done:
                return False
            keep = False  # bytes after the end: relayed, then both connections closed
        if t is not None:
            t.write(data)
        ex.r_parser = parser
        ex.resend = None
        ex.head_done = ex.started = True
        ex.resp_framing = "chunked"
        ex.up_keep = keep
        if not keep:
            ex.keep_client = False
        if ex.resp_done:
            ex.finish()
        return True
    digits = DIGITS.fullmatch(value) if name == b"content-length" else None
    if digits is None:
        return False
    left = int(digits.group()) - (len(data) - m.end())
    if left < 0:  # bytes beyond the answer: the parser path decides
        return False
    ex.resend = None
    ex.head_done = ex.started = True
    ex.resp_framing = "length"
    ex.up_keep = True
    if t is not None:
        t.write(data)
    if left:
        ex.body_left = left
    else:
        ex.resp_done = True
        ex.finish()
    return True


class AnswerEnd:
    """The response parser's protocol on the fast path of a chunked answer: only the end."""

    __slots__ = ("ex",)

    def __init__(self, ex: Answering) -> None:
        self.ex = ex

    def on_message_begin(self) -> None:
        if self.ex.resp_done:
            raise AfterEnd

    def on_message_complete(self) -> None:
        self.ex.resp_done = True
