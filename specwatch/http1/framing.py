"""HTTP/1.1 framing shared by every part of the forwarding engine: the fields a proxy never
passes on (RFC 9110 §7.6.1 connection-specific fields and proxy credentials), the request head
limit, the answers the engine writes itself, the refusals raised in parser callbacks, and small
pure helpers over raw heads."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

__all__ = [
    "BAD_400",
    "CONTINUE",
    "CRLF",
    "DIGITS",
    "DROP_REQUEST",
    "DROP_RESPONSE",
    "HEAD_431",
    "HOP_BY_HOP",
    "LIMIT_503",
    "MAX_HEAD_BYTES",
    "PROXY_CREDENTIALS",
    "TIMEOUT_408",
    "AfterEnd",
    "HeadTooLarge",
    "OtherTransferCoding",
    "UpgradeWithBody",
    "connection_tokens",
    "head_end",
    "json_error",
]

#: RFC 9110 §7.6.1 connection-specific fields, plus the legacy ``Proxy-Connection``.
HOP_BY_HOP: frozenset[str] = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "transfer-encoding",
        "upgrade",
        "trailer",
    }
)
#: Credentials meant for a proxy, never for the next hop (RFC 9110 §11.7): dropped both ways.
PROXY_CREDENTIALS: frozenset[str] = frozenset(
    {"proxy-authorization", "proxy-authenticate", "proxy-authentication-info"}
)
#: Longest request head accepted (request line and fields); a longer one is refused with ``431``
#: (``header_too_large``) while it is still coming, so a client cannot make the proxy buffer more.
MAX_HEAD_BYTES = 64 << 10

#: Request fields (lower-cased bytes) never sent up as they came: ``Host`` is set to the
#: upstream's, ``Expect: 100-continue`` is answered here, ``X-Forwarded-For`` is appended to.
DROP_REQUEST = frozenset(
    n.encode() for n in (HOP_BY_HOP | PROXY_CREDENTIALS | {"host", "expect", "x-forwarded-for"})
)
#: Answer fields (lower-cased bytes) never relayed to the client as they came.
DROP_RESPONSE = frozenset(n.encode() for n in (HOP_BY_HOP | PROXY_CREDENTIALS))
CRLF = b"\r\n"
#: A ``Content-Length`` value both paths accept (up to 18 digits: no overflow, no sign).
DIGITS = re.compile(rb"[0-9]{1,18}")

#: The interim answer to ``Expect: 100-continue``.
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
#: The connection cap is reached.
LIMIT_503 = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
#: A request the parser refuses (a malformed head, a bad chunk size).
BAD_400 = b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
#: A request head (or a body's framing without body bytes) past :data:`MAX_HEAD_BYTES`.
HEAD_431 = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\n"
    b"Content-Length: 0\r\n\r\n"
)
#: A request body that stopped arriving.
TIMEOUT_408 = (
    b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Type: text/plain\r\n"
    b"Content-Length: 26\r\n\r\nrequest body read timeout\n"
)


class HeadTooLarge(Exception):
    """A request head, or a body's framing and trailer fields with no body bytes, grew past
    :data:`MAX_HEAD_BYTES` (a 400, or the connection aborted once a request is under way)."""


class OtherTransferCoding(Exception):
    """A request's ``Transfer-Encoding`` names a coding besides ``chunked`` (a 400)."""


class UpgradeWithBody(Exception):
    """An ``Upgrade`` request with a body (raised in a parser callback: a 400)."""


class AfterEnd(Exception):
    """An answer began after the one asked for (raised in a parser callback: the parser stops
    with an error, handled as bytes after the end)."""


def connection_tokens(values: Iterable[bytes]) -> set[bytes]:
    """Lower-cased field names listed in ``Connection`` values (``close`` and ``keep-alive``
    included)."""
    out: set[bytes] = set()
    for v in values:
        for tok in v.split(b","):
            tok = tok.strip().lower()
            if tok:
                out.add(tok)
    return out


def json_error(status: int, reason: str, message: str, close: bool) -> bytes:
    """A whole ``status`` answer with a small JSON body ``{"error": {"message": message}}``
    (``Connection: close`` when ``close``)."""
    body = json.dumps({"error": {"message": message}}).encode()
    conn = b"Connection: close\r\n" if close else b""
    return (
        b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n"
        % (status, reason.encode(), len(body), conn)
    ) + body


def head_end(buf: bytes | bytearray) -> int:
    """Offset just past the empty line that ends a message head in ``buf`` (``-1``: none yet).
    Bare LF line ends count, as llhttp accepts them."""
    i = buf.find(b"\n\r\n")
    j = buf.find(b"\n\n")
    if i < 0:
        return j + 2 if j >= 0 else -1
    if j < 0 or i < j:
        return i + 3
    return j + 2
