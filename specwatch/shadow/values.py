"""Values passed along the shadow chain (shared by ingest, replay, compare, ledger, stats).

All are frozen; times are unix seconds (float) from an injected wall clock, durations in seconds.
The chain's label vocabularies (the reason and verdict names its counters and gauges carry,
exported from 0) are here too, so the stage that produces a name and the exporter that lists it
read one definition.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from specwatch.vllm.request_metrics import SpecDecodeReading

#: A pair's status (the pair-status rule of :mod:`specwatch.shadow.classify` gives it).
PairStatus = Literal["paired", "unpaired", "excluded"]


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
    BASELINE = "baseline"


@dataclass(frozen=True, slots=True)
class ShadowRequest:
    """One OpenAI-compatible request to replay through every arm.

    ``path`` is ``/v1/completions`` or ``/v1/chat/completions``; ``body`` the parsed JSON body;
    ``request_hash`` a hex digest of the canonical body (sampling and ledger key);
    ``gold`` and ``checker`` are set for canary items (``checker``: ``exact|regex:<pattern>|
    json:<path>|math``), ``None`` for live traffic. ``request_id`` is the live request's
    ``x-request-id`` header (mirror and proxy; ``None`` when absent or not a printable token of at
    most 200 characters), stored with the pair in the ledger.
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
    request_id: str | None = None


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
    ``spec_decode`` vLLM's per-request speculative-decoding counts when returned
    (``--per-request-spec-decode-metrics``), ``mean_acceptance_length`` its τ when measured (never
    vLLM's 1.0 placeholder for a reply without a verify step). ``first_token_seconds`` and
    ``last_token_seconds`` (streamed replies only, else ``None``): seconds from sending the
    request to the first and the last network read that carried generated output (text,
    reasoning or a tool call), so TTFT and the decode time after it are told apart.
    ``spec_refused``: why the reply's speculative-decoding counts were refused as inconsistent
    (:data:`specwatch.vllm.request_metrics.SPEC_PROBLEMS`; ``spec_decode`` is then ``None``).
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
    spec_decode: SpecDecodeReading | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    reasoning: str | None = None
    error_code: int | None = None
    first_token_seconds: float | None = None
    last_token_seconds: float | None = None
    spec_refused: str | None = None


@dataclass(frozen=True, slots=True)
class ReplayPair:
    """A request and the result of each arm that was asked (noise and baseline are optional).

    ``running`` is the number of running requests (``vllm:num_requests_running``) on the busiest
    arm's server when the replay started, as the sampler's load state last saw it (``None`` when
    no load was known).
    """

    request: ShadowRequest
    standard: ArmResult
    fly: ArmResult
    noise: ArmResult | None = None
    seed: int | None = None
    baseline: ArmResult | None = None
    running: float | None = None


@dataclass(frozen=True, slots=True)
class ArmOutcome:
    """One arm's result after comparison with the standard arm.

    ``exact_match``, ``first_divergence_*``, ``similarity`` and ``agrees`` are ``None`` for the
    standard arm itself and whenever either side failed. ``first_divergence_char`` is the index of
    the first differing character (``None`` when identical; the shorter length when one text is
    a prefix of the other), likewise ``first_divergence_token`` over token ids. ``correct`` is
    ``None`` when there is no gold answer or the pair is not graded (truncated). ``text``,
    ``tool_calls`` and ``reasoning`` are the reply's comparison fields (see
    :mod:`specwatch.shadow.compare`); ``truncated`` marks a ``length`` / ``content_filter``
    finish; ``content_agrees``, ``tool_calls_agree`` and ``reasoning_agrees`` are the per-field
    comparisons behind ``agrees`` (``None`` where ``agrees`` is, or where neither arm has the
    field). ``error_code`` is an in-band error's code. ``spec_decode``: the reply's per-request
    speculative-decoding counts (as :class:`ArmResult`), kept so the ledger stores them, as
    are ``first_token_seconds`` / ``last_token_seconds`` (as :class:`ArmResult`). Texts
    are kept only so a ledger with ``store_text`` can save them.
    """

    arm: Arm
    ok: bool
    error: str | None
    status: int | None
    latency_seconds: float
    prompt_tokens: int | None
    completion_tokens: int | None
    mean_acceptance_length: float | None
    finish_reason: str | None
    answer: str | None
    correct: bool | None
    exact_match: bool | None
    agrees: bool | None
    first_divergence_char: int | None
    first_divergence_token: int | None
    similarity: float | None
    text: str
    truncated: bool = False
    tool_calls: tuple[ToolCall, ...] = ()
    reasoning: str | None = None
    error_code: int | None = None
    content_agrees: bool | None = None
    tool_calls_agree: bool | None = None
    reasoning_agrees: bool | None = None
    spec_decode: SpecDecodeReading | None = None
    first_token_seconds: float | None = None
    last_token_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class PairOutcome:
    """Everything the ledger and the statistics need about one replayed request.

    ``status``: ``paired`` (standard and FLy both answered), ``unpaired`` (one side failed;
    never counted as a mismatch), ``excluded`` (e.g. a 400 for an unsupported parameter, or a
    checker that cannot run); ``reason`` says why for the last two. ``noise`` is ``None`` when no
    noise arm was asked; a failed noise arm leaves the pair paired with ``noise.ok`` False.
    ``baseline`` (a server without speculation) is compared with the standard arm like the other
    arms (its ``agrees`` = the standard arm's answer equals the baseline's);
    ``noise_baseline_agrees`` is the noise arm's agreement with the baseline (the noise floor of
    the lossless check), ``None`` unless both answered. ``greedy``: the request asked for greedy
    decoding (temperature 0 or top_k 1), the only requests a lossless rule must reproduce
    exactly. ``running``: running requests at replay time (see :class:`ReplayPair`).
    ``request_id`` is the live request's ``X-Request-Id`` (mirror/proxy), ``None`` otherwise.
    """

    time: float
    request_hash: str
    category: str
    source: Source
    item_id: str | None
    seed: int | None
    labelled: bool
    status: PairStatus
    reason: str | None
    standard: ArmOutcome
    fly: ArmOutcome
    noise: ArmOutcome | None
    baseline: ArmOutcome | None = None
    noise_baseline_agrees: bool | None = None
    greedy: bool = False
    running: float | None = None
    request_id: str | None = None

    def arm(self, arm: Arm) -> ArmOutcome | None:
        """The outcome of ``arm`` (``None`` for a noise or baseline arm that was not asked)."""
        return {
            Arm.STANDARD: self.standard,
            Arm.FLY: self.fly,
            Arm.NOISE: self.noise,
            Arm.BASELINE: self.baseline,
        }[arm]


# -- label vocabularies ----------------------------------------------------------------------

#: Why a pair is excluded (``specwatch_shadow_excluded_total{reason}``, exported from 0; the
#: pair-status rule of :mod:`specwatch.shadow.classify` gives them): an arm refused the request
#: as one it does not support (400/422 naming a parameter) or as otherwise bad (other 400/422),
#: the request's checker spec is invalid, it asks for more than one choice, the arms counted
#: different prompt tokens, or one arm does not serve the model (or adapter) asked for.
EXCLUDED_REASONS: tuple[str, ...] = (
    "unsupported_parameter",
    "bad_request",
    "bad_checker",
    "multiple_choices",
    "prompt_tokens_mismatch",
    "standard_model_not_found",
    "fly_model_not_found",
)

#: Known ``specwatch_ledger_write_errors_total{reason}`` values, exported from 0 (the ledger's
#: writer, :mod:`specwatch.shadow.ledger.writer`, counts them): ``queue_full`` (rows dropped
#: because the write queue was full), ``not_stored`` (rows refused while the ledger is corrupt,
#: full or read-only) and the exception types a failed write is counted under
#: (``sqlite3`` errors a disk or database fault raises, and ``OSError``). Other exception types
#: caught by the writer (``sqlite3.Error``, ``OSError``, ``ValueError`` subclasses) are added
#: when they occur.
WRITE_ERROR_REASONS: tuple[str, ...] = (
    "queue_full",
    "not_stored",
    "OperationalError",
    "IntegrityError",
    "DatabaseError",
    "OSError",
)

#: Whether the ledger stores rows: ``ok``; ``corrupt`` (the file is not a sound SQLite
#: database: found by an open, a write or the periodic quick check); ``full`` (no space left, or
#: the file size limit reached); ``read_only`` (the file or its directory cannot be written);
#: ``unavailable`` (any other error that stopped a write or the open).
LedgerState = Literal["ok", "corrupt", "full", "read_only", "unavailable"]
#: Every :data:`LedgerState`, in that order (``specwatch_ledger_state{state}``, each exported).
LEDGER_STATES: tuple[LedgerState, ...] = get_args(LedgerState)

#: Why the proxy's upstream failed a request (``IngestCounters.proxy_upstream_errors`` keys,
#: ``specwatch_shadow_proxy_upstream_errors_total{reason}``): unreachable (502), no answer in
#: time (504), closed before the answer ended, a malformed answer (502), no byte for the stream
#: idle timeout while an answer was owed (504, or the client connection aborted). Exported from
#: 0, so ``increase()`` sees the first failure.
PROXY_UPSTREAM_ERROR_REASONS: tuple[str, ...] = (
    "client_error",
    "connect",
    "disconnected",
    "stalled",
    "timeout",
)

#: A verdict of the per-category decision table (:mod:`specwatch.shadow.decision`).
Verdict = Literal["pays", "costs_quality", "not_faster", "not_decided"]

#: Every verdict (``specwatch_decision_verdict{verdict}`` exports each, 1 on the current one).
VERDICTS: tuple[Verdict, ...] = ("pays", "costs_quality", "not_faster", "not_decided")
