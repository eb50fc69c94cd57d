"""Values passed along the shadow chain (shared by ingest, replay, compare, ledger, stats).

All are frozen; times are unix seconds (float) from an injected clock, durations in seconds.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class Source(enum.StrEnum):
    """How a request entered the shadow chain."""

    MIRROR = "mirror"
    PROXY = "proxy"
    CANARY = "canary"


class Arm(enum.StrEnum):
    """Which replica a replay went to. ``STANDARD`` is the lossless reference."""

    STANDARD = "standard"
    FLY = "fly"
    NOISE = "noise"


@dataclass(frozen=True, slots=True)
class ShadowRequest:
    """One OpenAI-compatible request to replay through every arm.

    ``path`` is ``/v1/completions`` or ``/v1/chat/completions``; ``body`` the parsed JSON body;
    ``request_hash`` a hex digest of the canonical body (sampling and ledger key);
    ``gold`` and ``checker`` are set for canary items (``checker``: ``exact|regex:<pattern>|
    json:<path>|math``), ``None`` for live traffic.
    """

    path: str
    body: Mapping[str, Any]
    request_hash: str
    received_at: float
    source: Source
    category: str = "default"
    item_id: str | None = None
    gold: str | None = None
    checker: str | None = None


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call of a reply, as compared: the function ``name`` and its ``arguments``
    JSON-normalised (parsed and re-serialised with sorted keys and no spaces, so ``{"a": 1,
    "b": 2}`` and ``{"b":2,"a":1}`` are equal; arguments that are not valid JSON are kept as sent,
    ends stripped). The call ``id`` is left out: servers make it up per reply."""

    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ArmResult:
    """What one arm returned.

    ``ok`` False means the arm failed (``error`` says why: a transport or HTTP failure from the
    replayer, ``timeout|connect|http_<status>|unsupported_parameter|bad_request|too_large|...``,
    or a failed HTTP 200 reply, :data:`specwatch.shadow.classify.REPLY_FAILURES`:
    ``aborted|in_band_5xx|empty_stream|invalid_json|...``); a failed arm makes the pair
    unpaired. ``text`` is the generated text of the first choice (``message.content`` /
    ``delta.content`` for chat, ``text`` for completions; ``""`` when absent; for a failed arm the
    partial text received, never compared); ``tool_calls`` its tool calls in order (chat only);
    ``reasoning`` the reasoning text (``reasoning_content`` or ``reasoning``; ``None`` when the
    server sent none); ``finish_reason`` as the server sent it (also unknown values such as
    ``cancelled``); ``error_code`` the code of an in-band error (``500``, ``400``; ``None`` when
    there was none or it carried no code); ``token_ids`` when the server returned them;
    ``mean_acceptance_length`` from vLLM's per-request spec-decode metrics when returned.
    """

    arm: Arm
    ok: bool
    latency_seconds: float
    status: int | None = None
    error: str | None = None
    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    token_ids: tuple[int, ...] | None = None
    mean_acceptance_length: float | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    reasoning: str | None = None
    error_code: int | None = None


@dataclass(frozen=True, slots=True)
class ReplayPair:
    """A request and the result of each arm that was asked (noise is optional)."""

    request: ShadowRequest
    standard: ArmResult
    fly: ArmResult
    noise: ArmResult | None = None
    seed: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
