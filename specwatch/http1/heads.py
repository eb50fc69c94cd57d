"""The parser path's heads, rebuilt from llhttp's fields (pure functions).

A request head goes up without hop-by-hop fields (RFC 9110 §7.6.1: ``Connection`` and every
field it lists, ``Keep-Alive``, ``Proxy-Connection``, ``TE``, ``Trailer``, ``Upgrade``), proxy
credentials, ``Host`` (set to the upstream's) and ``Expect``, with ``X-Forwarded-For``
appended and the target in origin form behind the upstream's prefix. An answer head is relayed
verbatim unless a field must go; then it is rebuilt from its fields by :func:`rebuilt_answer`.
"""

from __future__ import annotations

import re

from specwatch.http1.engine import Engine
from specwatch.http1.framing import (
    CRLF,
    DIGITS,
    DROP_REQUEST,
    DROP_RESPONSE,
    OtherTransferCoding,
    UpgradeWithBody,
    connection_tokens,
)

__all__ = [
    "RebuiltRequest",
    "answer_framing",
    "rebuild_request",
    "rebuilt_answer",
    "refuse_framing",
]

#: The scheme and authority of a request target in absolute form (``http://host:port``).
ABSOLUTE_FORM = re.compile(rb"[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*")

Fields = list[tuple[bytes, bytes]]
#: :func:`rebuild_request`'s answer: the head to send up, the path (without query), whether
#: the marker was set, whether the body is chunked, whether ``Expect: 100-continue`` was asked,
#: the category and the request id (first value of each field, or ``None``).
RebuiltRequest = tuple[bytes, bytes, bool, bool, bool, str | None, str | None]


def refuse_framing(lowered: list[bytes], headers: Fields, upgrade: bool) -> None:
    """Raise for a request head the engine refuses (a 400): :class:`UpgradeWithBody` for an
    ``Upgrade`` request with a body (llhttp reads no body after its head: sent up without it,
    the request would wait for one or carry an empty one), :class:`OtherTransferCoding` for a
    coding besides chunked (``gzip, chunked``: re-framed as plain chunked it would reach the
    upstream as the body itself). ``lowered``: the field names of ``headers``, lower-cased."""
    if upgrade and any(
        n == b"transfer-encoding" or (n == b"content-length" and v.strip(b" \t0"))
        for n, (_, v) in zip(lowered, headers, strict=True)
    ):
        raise UpgradeWithBody
    if any(
        n == b"transfer-encoding" and v.strip(b" \t").lower() != b"chunked"
        for n, (_, v) in zip(lowered, headers, strict=True)
    ):
        raise OtherTransferCoding


def rebuild_request(
    fwd: Engine, method: bytes, url: bytes, lowered: list[bytes], headers: Fields, peer: bytes
) -> RebuiltRequest:
    """The head to send up for a parsed request (see the module docstring), with what the
    exchange needs to know of it. ``fwd``'s upstream and copy rules are read, nothing set;
    ``peer``: the client's address, appended to ``X-Forwarded-For`` (empty: none)."""
    absolute = ABSOLUTE_FORM.match(url)
    if absolute is not None:  # sent on in origin form (RFC 9112 §3.2.2)
        url = url[absolute.end() :]
        if not url.startswith(b"/"):
            url = b"/" + url
    path = url.split(b"?", 1)[0]
    drop = DROP_REQUEST
    if b"connection" in lowered:
        drop = drop | connection_tokens(
            v for n, (_, v) in zip(lowered, headers, strict=True) if n == b"connection"
        )
    up = fwd.up
    prefix = up.prefix if url != b"*" else b""  # ``*``: about the server, not a path
    parts = [method, b" ", prefix, url, b" HTTP/1.1\r\nHost: ", up.host_header, CRLF]
    prior: list[bytes] = []
    marked = chunked = expect = False
    category = request_id = None
    for n, (name, value) in zip(lowered, headers, strict=True):
        if n in drop:
            if n == b"x-forwarded-for":
                prior.append(value)
            elif n == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif n == b"expect":
                expect = value.strip().lower() == b"100-continue"
            continue
        if n == fwd.marker:
            marked = marked or bool(value)
        elif n == fwd.category_header:
            if category is None:
                category = value.decode("latin-1")
        elif n == fwd.request_id_header and request_id is None:
            request_id = value.decode("latin-1")
        parts += (name, b": ", value, CRLF)
    if chunked:
        parts.append(b"Transfer-Encoding: chunked\r\n")
    if peer:
        prior.append(peer)
    if prior:
        parts += (b"X-Forwarded-For: ", b", ".join(prior), CRLF)
    parts.append(CRLF)
    return b"".join(parts), path, marked, chunked, expect, category, request_id


def answer_framing(
    headers: Fields, code: int, is_head: bool
) -> tuple[list[bytes], set[bytes], str, int]:
    """How a parsed answer is framed: its field names lower-cased, the names not to relay
    (hop-by-hop, proxy credentials and what ``Connection`` lists; ``Transfer-Encoding`` is
    relayed with the chunks it frames), the framing (``none`` for ``HEAD``, 204 and 304,
    ``chunked``, ``length`` or ``close``: read to the upstream's close) and the length
    (``-1``: none, or not a plain number)."""
    names = [n.lower() for n, _ in headers]
    drop = set(DROP_RESPONSE)
    drop.discard(b"transfer-encoding")
    conn = [v for n, v in zip(names, headers, strict=True) if n == b"connection"]
    if conn:
        drop |= connection_tokens(v[1] for v in conn)
    chunked = False
    has_length = False
    length = -1
    for n, (_, v) in zip(names, headers, strict=True):
        if n == b"transfer-encoding" and b"chunked" in v.lower():
            chunked = True
        elif n == b"content-length":
            has_length = True
            digits = DIGITS.fullmatch(v.strip(b" \t"))
            length = int(digits.group()) if digits is not None else -1
    if is_head or code in (204, 304):
        framing = "none"
    elif chunked:
        framing = "chunked"
    elif has_length:
        framing = "length"
    else:
        framing = "close"
    return names, drop, framing, length


def rebuilt_answer(
    code: int,
    reason: bytes,
    names: list[bytes],
    headers: Fields,
    drop: set[bytes],
    close: bool,
    body: bytes,
) -> bytes:
    """An answer head rebuilt without the fields ``drop`` names (``Connection: close`` added
    when ``close``), followed by ``body``."""
    parts = [b"HTTP/1.1 %d %s\r\n" % (code, reason)]
    for n, (name, value) in zip(names, headers, strict=True):
        if n not in drop:
            parts.append(name + b": " + value + CRLF)
    if close:
        parts.append(b"Connection: close\r\n")
    parts.append(CRLF)
    parts.append(body)
    return b"".join(parts)
