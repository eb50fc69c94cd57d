"""Replay one sampled request through the standard, FLy and optional noise and baseline arms,
concurrently.

Each arm gets the same body with: ``seed`` added when absent (from the request hash, so a replay is
repeatable), ``stream`` off (or on with ``stream_options.include_usage`` for arms that only stream),
``max_tokens``/``max_completion_tokens`` capped, ``model`` overridden when the arm says so, and the
shadow marker header set to ``1``. The replayer only does HTTP: it returns each arm's
:class:`~specwatch.shadow.values.ArmResult` (a 400/422 naming an unknown parameter is
``unsupported_parameter``, another 400/422 ``bad_request``, other failures ``timeout``, ``connect``,
``http_<status>``, …) and never classifies the pair; :mod:`specwatch.shadow.classify` does.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from specwatch.shadow.sample import seed_from_hash
from specwatch.shadow.sse import CompletionStreamAccumulator, extract_mean_acceptance_length
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


def _parse_completion(arm: Arm, status: int, obj: object, latency: float) -> ArmResult:
    if not isinstance(obj, Mapping):
        return ArmResult(arm, False, latency, status=status, error="invalid_body")
    if isinstance(obj.get("error"), Mapping):
        return ArmResult(arm, False, latency, status=status, error="in_band_error")
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        return ArmResult(arm, False, latency, status=status, error="invalid_body")
    ch = choices[0]
    msg = ch.get("message")
    text: object = msg.get("content") if isinstance(msg, Mapping) else ch.get("text")
    if text is None:
        text = ""
    if not isinstance(text, str):
        return ArmResult(arm, False, latency, status=status, error="invalid_body")
    fr = ch.get("finish_reason")
    ids = ch.get("token_ids")
    token_ids = (
        tuple(ids)
        if isinstance(ids, list)
        and all(isinstance(t, int) and not isinstance(t, bool) for t in ids)
        else None
    )
    usage = obj.get("usage")
    pt = ct = None
    if isinstance(usage, Mapping):
        p, c = usage.get("prompt_tokens"), usage.get("completion_tokens")
        pt = p if isinstance(p, int) and not isinstance(p, bool) else None
        ct = c if isinstance(c, int) and not isinstance(c, bool) else None
    return ArmResult(
        arm,
        True,
        latency,
        status=status,
        text=text,
        finish_reason=fr if isinstance(fr, str) else None,
        prompt_tokens=pt,
        completion_tokens=ct,
        token_ids=token_ids,
        mean_acceptance_length=extract_mean_acceptance_length(obj),
    )


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
        baseline: ArmTarget | None = None,
    ) -> None:
        self._session = session
        self.standard = standard
        self.fly = fly
        self.noise = noise
        self.baseline = baseline
        self._cap = max_tokens_cap
        self._extra = dict(extra_body or {})
        self._marker = marker_header
        self._clock = clock

    async def replay(self, req: ShadowRequest, *, running: float | None = None) -> ReplayPair:
        """Send ``req`` to every arm at once (standard, FLy, then noise and baseline when set);
        ``running`` (running requests at replay time) is carried into the pair."""
        given = req.body.get("seed")
        seed = (
            given
            if isinstance(given, int) and not isinstance(given, bool)
            else seed_from_hash(req.request_hash)
        )
        targets = [self.standard, self.fly, self.noise, self.baseline]
        asked = [t for t in targets if t is not None]
        got = dict(
            zip(
                asked, await asyncio.gather(*(self._one(t, req, seed) for t in asked)), strict=False
            )
        )
        return ReplayPair(
            request=req,
            standard=got[self.standard],
            fly=got[self.fly],
            noise=got.get(self.noise) if self.noise is not None else None,
            seed=seed,
            baseline=got.get(self.baseline) if self.baseline is not None else None,
            running=running,
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
                try:
                    obj = json.loads(raw)
                except ValueError:
                    return ArmResult(t.arm, False, latency, status=200, error="invalid_body")
                return _parse_completion(t.arm, 200, obj, latency)
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
        r = acc.close()
        latency = self._clock() - t0
        if r.error is not None:
            return ArmResult(arm, False, latency, status=200, error="in_band_error")
        if not r.done_seen and r.finish_reason is None:
            return ArmResult(arm, False, latency, status=200, error="truncated_stream")
        return ArmResult(
            arm,
            True,
            latency,
            status=200,
            text=r.text,
            finish_reason=r.finish_reason,
            prompt_tokens=r.prompt_tokens,
            completion_tokens=r.completion_tokens,
            token_ids=tuple(r.token_ids) if r.token_ids is not None else None,
            mean_acceptance_length=r.mean_acceptance_length,
        )
