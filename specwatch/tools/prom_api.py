"""A small client for the Prometheus HTTP API (``/api/v1/...``; Thanos Querier serves the same).

Used by ``specwatch fleet`` and ``specwatch doctor``. Every call takes the aiohttp session and
the base URL; failures raise :class:`PromApiError` with a short ``reason`` for a counter label:
``connect``, ``timeout``, ``http_status``, ``decode`` (not JSON / not the API's envelope),
``api_error`` (``"status": "error"``, e.g. a PromQL parse error) or ``not_a_vector``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import aiohttp

from specwatch.core.logs import redact_url

#: One sample of an instant vector: its labels (``__name__`` included when the series has one)
#: and its value.
Row = tuple[dict[str, str], float]

QUERY_ERROR_REASONS: tuple[str, ...] = (
    "connect",
    "timeout",
    "http_status",
    "decode",
    "api_error",
    "not_a_vector",
)


class PromApiError(Exception):
    """A failed Prometheus API call: ``reason`` (one of :data:`QUERY_ERROR_REASONS`) and a
    one-line ``detail``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


async def api_get(
    session: aiohttp.ClientSession,
    base_url: str,
    path: str,
    params: Mapping[str, str] | None = None,
    *,
    limit_s: float = 10.0,
) -> Any:
    """GET ``base_url`` + ``path`` (e.g. ``/api/v1/targets``) and return the envelope's
    ``data``. Raises :class:`PromApiError`."""
    url = base_url.rstrip("/") + path
    where = redact_url(url)
    try:
        async with session.get(
            url, params=dict(params or {}), timeout=aiohttp.ClientTimeout(total=limit_s)
        ) as resp:
            raw = await resp.read()
            status = resp.status
    except TimeoutError as exc:
        raise PromApiError("timeout", f"{where}: no answer within {limit_s:g} s") from exc
    except aiohttp.ClientError as exc:
        raise PromApiError("connect", f"{where}: {exc}") from exc
    try:
        text = raw.decode("utf-8")  # the API answers JSON, which is UTF-8 (RFC 8259)
    except UnicodeDecodeError as exc:
        if status >= 400:
            raise PromApiError("http_status", f"{where}: HTTP {status}") from exc
        raise PromApiError("decode", f"{where}: not UTF-8") from exc
    try:
        body = json.loads(text)
    except RecursionError:
        raise PromApiError("decode", f"{where}: JSON nested too deep") from None
    except ValueError as exc:
        if status >= 400:
            raise PromApiError("http_status", f"{where}: HTTP {status}") from exc
        raise PromApiError("decode", f"{where}: not JSON") from exc
    if not isinstance(body, dict) or "status" not in body:
        raise PromApiError("decode", f"{where}: not a Prometheus API answer")
    if body["status"] != "success":
        raise PromApiError("api_error", f"{where}: {body.get('error', 'status ' + str(status))}")
    if status >= 400:
        raise PromApiError("http_status", f"{where}: HTTP {status}")
    return body.get("data")


async def instant_query(
    session: aiohttp.ClientSession, base_url: str, promql: str, *, limit_s: float = 10.0
) -> list[Row]:
    """Evaluate ``promql`` now (``/api/v1/query``) and return its instant vector as rows.
    A scalar result is one row without labels. Raises :class:`PromApiError`."""
    data = await api_get(session, base_url, "/api/v1/query", {"query": promql}, limit_s=limit_s)
    if not isinstance(data, dict):
        raise PromApiError("decode", "query answer has no data object")
    kind = data.get("resultType")
    result = data.get("result")
    if kind == "scalar" and isinstance(result, list) and len(result) == 2:
        return [({}, _value(result[1]))]
    if kind != "vector" or not isinstance(result, list):
        raise PromApiError("not_a_vector", f"{promql!r} gave a {kind} result")
    rows: list[Row] = []
    for item in result:
        try:
            labels = {str(k): str(v) for k, v in item["metric"].items()}
            rows.append((labels, _value(item["value"][1])))
        except (KeyError, TypeError, IndexError, AttributeError) as exc:
            raise PromApiError("decode", f"malformed vector sample {item!r}") from exc
    return rows


class SampleValue(float):
    """A sample's value that is not a number (``"bad"``): NaN as a float, and the ``text`` the
    server sent, for a log line to show."""

    text: str

    def __new__(cls, text: str) -> SampleValue:
        self = super().__new__(cls, math.nan)
        self.text = text
        return self


def _value(text: object) -> float:
    try:
        return float(str(text))
    except ValueError:
        return SampleValue(str(text))
