"""Fetch one vLLM ``/metrics`` page: the only I/O of the observe chain.

:func:`fetch_metrics` does one HTTP GET with a timeout, gzip/deflate (inflated here, so the
streamed body cap bounds the inflated size), an optional bearer token, and returns a
:class:`ScrapeResult`; it never raises for expected failures.
"""

from __future__ import annotations

import asyncio
import json
import zlib
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from specwatch.core.clock import SYSTEM_MONOTONIC, MonotonicClock
from specwatch.core.logs import redact_url
from specwatch.observe.values import ScrapeErrorReason

__all__ = ["ScrapeResult", "fetch_metrics"]

_CHUNK = 64 * 1024

#: Content-Encoding values read (decompressed here, never by aiohttp, so that the cap bounds
#: the decompressed size while it is produced: a small gzip bomb cannot take memory).
_ENCODINGS: dict[str, int] = {
    "identity": 0,
    "": 0,
    "gzip": 16 + zlib.MAX_WBITS,
    "x-gzip": 16 + zlib.MAX_WBITS,
    "deflate": zlib.MAX_WBITS,
}


class _CutStream(Exception):
    """A compressed body that ends before its compressed stream does."""


class _Inflater:
    """Collects a body, decompressing it chunk by chunk with at most ``cap + 1`` bytes out.

    ``feed`` returns False as soon as the (decompressed) body is over ``cap`` bytes; ``finish``
    returns None when it is, and raises :class:`_CutStream` when a compressed stream did not
    end; ``zlib.error`` propagates.
    """

    def __init__(self, encoding: str, cap: int) -> None:
        wbits = _ENCODINGS[encoding]
        self._z = zlib.decompressobj(wbits) if wbits else None
        self._cap = cap
        self._size = 0
        self._parts: list[bytes] = []

    def _add(self, data: bytes) -> bool:
        self._size += len(data)
        if self._size > self._cap:
            return False
        self._parts.append(data)
        return True

    def feed(self, chunk: bytes) -> bool:
        if self._z is None:
            return self._add(chunk)
        data = chunk
        while data:
            out = self._z.decompress(data, self._cap - self._size + 1)
            if not self._add(out):
                return False
            data = self._z.unconsumed_tail
        return True

    def finish(self) -> bytes | None:
        """The whole body, or None when it is over the cap."""
        if self._z is not None:
            if not self._add(self._z.flush()):
                return None
            if not self._z.eof:
                raise _CutStream
        return b"".join(self._parts)


@dataclass(frozen=True, slots=True)
class ScrapeResult:
    """Outcome of one GET: ``body`` and ``content_type`` when ``ok``; else ``reason`` (one of
    :data:`~specwatch.observe.values.SCRAPE_ERROR_REASONS`: ``timeout|connect|http_status|
    too_large|truncated|decode|http_error``) and ``detail``.
    ``duration_seconds`` is how long the request took (on the monotonic clock)."""

    ok: bool
    duration_seconds: float
    body: str = ""
    content_type: str = "text/plain"
    reason: ScrapeErrorReason | None = None
    detail: str = ""
    status: int | None = None


async def fetch_metrics(
    session: aiohttp.ClientSession,
    url: str,
    *,
    timeout_seconds: float,
    max_body_bytes: int,
    bearer_token: str | None = None,
    mono_clock: MonotonicClock = SYSTEM_MONOTONIC,
) -> ScrapeResult:
    """GET ``url`` and read at most ``max_body_bytes`` (decompressed) of it.

    Stops reading and returns ``too_large`` as soon as the cap is passed (or when
    ``Content-Length`` already says so). Never raises for network or HTTP failures.
    """
    headers = {"Accept": "text/plain;version=0.0.4;q=0.9,*/*;q=0.1", "Accept-Encoding": "gzip"}
    if bearer_token:
        headers["Authorization"] = f"Bearer {bearer_token}"
    start = mono_clock()

    def fail(reason: ScrapeErrorReason, detail: str, status: int | None = None) -> ScrapeResult:
        return ScrapeResult(
            False, mono_clock() - start, reason=reason, detail=detail, status=status
        )

    try:
        async with asyncio.timeout(timeout_seconds):
            async with session.get(
                url, headers=headers, allow_redirects=False, auto_decompress=False
            ) as resp:
                if resp.status != 200:
                    detail = f"HTTP {resp.status}"
                    location = resp.headers.get("Location")
                    if 300 <= resp.status < 400 and location:
                        detail += (
                            f" redirect to {redact_url(location)[:200]} "
                            "(redirects are not followed: give that URL)"
                        )
                    return fail("http_status", detail, resp.status)
                encoding = resp.headers.get("Content-Encoding", "identity").strip().lower()
                if encoding not in _ENCODINGS:
                    return fail("decode", f"unsupported Content-Encoding {encoding!r}", 200)
                if (
                    resp.content_length is not None
                    and resp.content_length > max_body_bytes
                    and encoding == "identity"
                ):
                    return fail("too_large", f"Content-Length {resp.content_length}", 200)
                inflater = _Inflater(encoding, max_body_bytes)
                async for chunk in resp.content.iter_chunked(_CHUNK):
                    if not inflater.feed(chunk):
                        return fail("too_large", f"body over {max_body_bytes} bytes", 200)
                raw = inflater.finish()
                if raw is None:
                    return fail("too_large", f"body over {max_body_bytes} bytes", 200)
                content_type = resp.headers.get("Content-Type", "text/plain")
                charset = resp.charset or "utf-8"
    except TimeoutError:
        return fail("timeout", f"no complete response within {timeout_seconds} s")
    except aiohttp.ClientConnectorError as exc:
        return fail("connect", str(exc.os_error) if exc.os_error else str(exc))
    except aiohttp.ClientPayloadError as exc:
        return fail("truncated", str(exc))
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
        return fail("connect", str(exc))
    except aiohttp.ClientError as exc:
        return fail("http_error", f"{type(exc).__name__}: {exc}")
    except ValueError as exc:  # a request aiohttp refuses to send (user info and a bearer token)
        return fail("http_error", f"request not sent: {exc}")
    except zlib.error as exc:
        return fail("decode", f"bad {encoding} body: {exc}", 200)
    except _CutStream:
        return fail("truncated", f"{encoding} stream ends early", 200)
    try:
        body = raw.decode(charset)
    except (UnicodeDecodeError, LookupError) as exc:
        return fail("decode", str(exc), 200)
    return ScrapeResult(
        True, mono_clock() - start, body=body, content_type=content_type, status=200
    )


#: Where an SGLang server answers its server arguments: ``/server_info`` (0.5.6 on), else the
#: older ``/get_server_info``; both beside ``/metrics``.
SERVER_INFO_PATHS = ("server_info", "get_server_info")
#: The most of a ``/server_info`` body read (it is the server arguments: a few KiB).
SERVER_INFO_MAX_BYTES = 1 << 20


def server_info_urls(metrics_url: str) -> list[str]:
    """The ``/server_info`` URLs beside a ``/metrics`` URL (same scheme, host and path prefix,
    no query): ``http://h:30000/metrics`` → ``http://h:30000/server_info``, then
    ``.../get_server_info``."""
    parts = urlsplit(metrics_url)
    prefix = parts.path.rsplit("/", 1)[0]
    return [
        urlunsplit((parts.scheme, parts.netloc, f"{prefix}/{p}", "", "")) for p in SERVER_INFO_PATHS
    ]


async def fetch_server_info(
    session: aiohttp.ClientSession,
    metrics_url: str,
    *,
    timeout_seconds: float,
    bearer_token: str | None = None,
) -> tuple[dict[str, object] | None, str]:
    """An SGLang server's ``/server_info`` JSON object, and where it came from (or, with
    ``None``, why there is none: the last failure). Never raises for network, HTTP or JSON
    failures."""
    why = "no /server_info URL"
    for url in server_info_urls(metrics_url):
        got = await fetch_metrics(
            session,
            url,
            timeout_seconds=timeout_seconds,
            max_body_bytes=SERVER_INFO_MAX_BYTES,
            bearer_token=bearer_token,
        )
        if not got.ok:
            why = f"{redact_url(url)}: {got.detail}"
            if got.status == 404:
                continue
            return None, why
        try:
            doc = json.loads(got.body)
        except json.JSONDecodeError as exc:
            return None, f"{redact_url(url)}: not JSON ({exc})"
        if not isinstance(doc, dict):
            return None, f"{redact_url(url)}: not a JSON object"
        return doc, redact_url(url)
    return None, why
