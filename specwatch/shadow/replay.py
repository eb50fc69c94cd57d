"""Replay one sampled request through the standard, FLy and optional noise arms, concurrently.

Each arm gets the same body with: ``seed`` added when absent (from the request hash, so a replay is
repeatable), ``stream`` off (or on with ``stream_options.include_usage`` for arms that only stream),
``max_tokens``/``max_completion_tokens`` capped, ``model`` overridden when the arm says so, and the
shadow marker header set to ``1``. The replayer only does HTTP: it returns each arm's
:class:`~specwatch.shadow.values.ArmResult` (a 400/422 naming an unknown parameter is
``unsupported_parameter``, another 400/422 ``bad_request``, other failures ``timeout``, ``connect``,
``http_<status>``, …) and never classifies the pair; :mod:`specwatch.shadow.classify` does, and
also decides what a 200 reply means (complete, truncated, or failed and why).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from specwatch.shadow.classify import body_result, stream_result
from specwatch.shadow.sample import seed_from_hash
from specwatch.shadow.sse import CompletionStreamAccumulator
from specwatch.shadow.values import Arm, ArmResult, ReplayPair, ShadowRequest

#: Largest arm response body read (bytes); larger answers fail the arm with ``too_large``.
MAX_RESPONSE_BYTES = 16 << 20

_UNSUPPORTED = re.compile(
    r"unsupported|not supported|unknown (?:field|param)|unrecognized|extra (?:inputs|fields)"
    r"|not permitted|not allowed|extra_forbidden",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class ArmTarget:
    """One arm's endpoint: ``base_url`` without ``/v1``; ``stream`` for arms that only stream."""

    arm: Arm
    base_url: str
    timeout_seconds: float
    token: str | None = None
    model: str | None = None
    stream: bool = False


def prepare_body(
    body: Mapping[str, Any],
    *,
    seed: int,
    max_tokens_cap: int,
    stream: bool,
    model: str | None = None,
    extra_body: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The body sent to an arm (see module docstring). Pure; ``body`` is not modified.

    ``extra_body`` fields (the same for every arm, e.g. ``{"return_token_ids": true}`` where the
    server supports it) are set before the seed/stream/cap rules apply.
    """
    out = dict(body)
    if extra_body:
        out.update(extra_body)
    if out.get("seed") is None:
        out["seed"] = seed
    if stream:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    else:
        out["stream"] = False
        out.pop("stream_options", None)
    capped = False
    for key in ("max_tokens", "max_completion_tokens"):
        v = out.get(key)
        if isinstance(v, int) and not isinstance(v, bool):
            out[key] = min(v, max_tokens_cap)
            capped = True
    if not capped:
        out["max_tokens"] = max_tokens_cap
    if model is not None:
        out["model"] = model
    return out


def _error_message(obj: object) -> str:
    if isinstance(obj, Mapping):
        err = obj.get("error", obj)
        if isinstance(err, Mapping):
            return str(err.get("message", err))
        return str(err)
    return str(obj)


def client_error_kind(status: int, message: str) -> str:
    """``unsupported_parameter`` for a 400/422 whose message names an unsupported parameter,
    ``bad_request`` for other 400/422, else ``http_<status>``."""
    if status in (400, 422):
        return "unsupported_parameter" if _UNSUPPORTED.search(message) else "bad_request"
    return f"http_{status}"


class Replayer:
    """Sends a :class:`ShadowRequest` to every arm concurrently and returns the :class:`ReplayPair`.

    ``session`` is an open ``aiohttp.ClientSession`` owned by the caller; ``clock`` gives monotonic
    seconds for latencies (``time.perf_counter`` in production). Never raises for arm failures
    (they become ``ArmResult(ok=False)``); ``asyncio.CancelledError`` propagates.
    """

    def __init__(
        self,
        session: aiohttp.ClientSession,
        *,
        standard: ArmTarget,
        fly: ArmTarget,
        noise: ArmTarget | None,
        max_tokens_cap: int,
        marker_header: str,
        clock: Callable[[], float],
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        self._session = session
        self.standard = standard
        self.fly = fly
        self.noise = noise
        self._cap = max_tokens_cap
        self._extra = dict(extra_body or {})
        self._marker = marker_header
        self._clock = clock

    async def replay(self, req: ShadowRequest) -> ReplayPair:
        given = req.body.get("seed")
        seed = (
            given
            if isinstance(given, int) and not isinstance(given, bool)
            else seed_from_hash(req.request_hash)
        )
        targets = [self.standard, self.fly] + ([self.noise] if self.noise is not None else [])
        results = await asyncio.gather(*(self._one(t, req, seed) for t in targets))
        return ReplayPair(
            request=req,
            standard=results[0],
            fly=results[1],
            noise=results[2] if len(results) > 2 else None,
            seed=seed,
        )

    async def _one(self, t: ArmTarget, req: ShadowRequest, seed: int) -> ArmResult:
        body = prepare_body(
            req.body,
            seed=seed,
            max_tokens_cap=self._cap,
            stream=t.stream,
            model=t.model,
            extra_body=self._extra,
        )
        headers = {"Content-Type": "application/json", self._marker: "1"}
        if t.token:
            headers["Authorization"] = f"Bearer {t.token}"
        data = json.dumps(body, ensure_ascii=False).encode("utf-8")
        t0 = self._clock()
        timeout = aiohttp.ClientTimeout(total=t.timeout_seconds)
        try:
            async with self._session.post(
                t.base_url + req.path, data=data, headers=headers, timeout=timeout
            ) as resp:
                if resp.status != 200:
                    raw = await resp.content.read(64 << 10)
                    msg = raw.decode("utf-8", errors="replace")
                    return ArmResult(
                        t.arm,
                        False,
                        self._clock() - t0,
                        status=resp.status,
                        error=client_error_kind(resp.status, msg),
                    )
                if t.stream:
                    return await self._read_stream(t.arm, resp, t0)
                raw = await resp.content.read(MAX_RESPONSE_BYTES + 1)
                latency = self._clock() - t0
                if len(raw) > MAX_RESPONSE_BYTES:
                    return ArmResult(t.arm, False, latency, status=200, error="too_large")
                return body_result(
                    t.arm,
                    raw,
                    status=200,
                    latency=latency,
                    content_type=resp.headers.get("Content-Type"),
                )
        except TimeoutError:
            return ArmResult(t.arm, False, self._clock() - t0, error="timeout")
        except aiohttp.ClientConnectorError:
            return ArmResult(t.arm, False, self._clock() - t0, error="connect")
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError):
            return ArmResult(t.arm, False, self._clock() - t0, error="disconnected")
        except aiohttp.ClientError:
            return ArmResult(t.arm, False, self._clock() - t0, error="connect")

    async def _read_stream(self, arm: Arm, resp: aiohttp.ClientResponse, t0: float) -> ArmResult:
        acc = CompletionStreamAccumulator()
        total = 0
        async for chunk in resp.content.iter_any():
            total += len(chunk)
            if total > MAX_RESPONSE_BYTES:
                return ArmResult(arm, False, self._clock() - t0, status=200, error="too_large")
            acc.feed(chunk)
        return stream_result(
            arm,
            acc,
            status=200,
            latency=self._clock() - t0,
            content_type=resp.headers.get("Content-Type"),
        )
