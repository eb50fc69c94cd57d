"""Faults on demand, for demos, game days and tests.

State lives in :class:`specwatch.simulate.config.Faults` (shared by every engine of a server).
The admin endpoint takes a JSON object of the keys below (``POST /admin/faults`` merges,
``DELETE /admin/faults`` clears, ``GET /admin/faults`` reads; ``POST /admin/restart`` resets
counters):

=========================  =========  ==========================================================
key                        type       effect
=========================  =========  ==========================================================
fly_entropy_threshold      float|null FLy entropy threshold override (nats; lower = more waivers)
draft_noise_multiplier     float      multiply the draft's noise (>1 = acceptance drop)
draft_noise_engine         int|null   apply that multiplier to one engine only
max_num_batched_tokens     int|null   shrink B (and T) at run time (starvation)
vllm_version               str|null   switch budget accounting (e.g. "0.32.0", "0.25.0")
stall_admission            bool       admit no WAITING request (waiting grows)
metrics_mode               str        ``ok`` | ``error`` (HTTP 500) | ``malformed`` (bad body)
completion_delay_s         float      delay before each completion is queued
completion_error_rate      float      fraction of completions answered with HTTP 500
wrong_answer_rate          float      fraction of requests whose answer the model favours is a
                                      wrong one (each digit of the gold shifted): a quality loss
                                      on this server alone, whatever its rejection sampler
stream_usage_ignored       bool       never send streamed ``usage``, even when
                                      ``stream_options.include_usage`` asks (a server that
                                      ignores it)
tokenize_error             bool       ``POST /tokenize`` answers HTTP 500
=========================  =========  ==========================================================
"""

from __future__ import annotations

import math
from typing import Any

from specwatch.simulate.config import FAULT_KEYS, Faults
from specwatch.vllm.methods import regime_for_version

METRICS_MODES = frozenset({"ok", "error", "malformed"})

#: What ``metrics_mode = "malformed"`` serves: an unescaped quote in a label value.
MALFORMED_METRICS_BODY = (
    b"# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
    b"# TYPE vllm:num_requests_running gauge\n"
    b'vllm:num_requests_running{engine="0",model_name="sim"model"} 3.0\n'
    b"vllm:spec_decode_num_drafts_total{engine=0 12\n"
)


class FaultError(ValueError):
    """A fault patch that cannot be applied (message says which key and why)."""


def _coerce(key: str, value: Any) -> Any:
    typ = FAULT_KEYS[key]
    nullable = key in {
        "fly_entropy_threshold",
        "draft_noise_engine",
        "max_num_batched_tokens",
        "vllm_version",
    }
    if value is None:
        if nullable:
            return None
        raise FaultError(f"{key} cannot be null")
    if typ is bool:
        if not isinstance(value, bool):
            raise FaultError(f"{key} must be a boolean")
        return value
    if typ is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise FaultError(f"{key} must be an integer")
        return value
    if typ is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise FaultError(f"{key} must be a number")
        if not math.isfinite(value):  # NaN/Infinity from a lax JSON client
            raise FaultError(f"{key} must be a finite number")
        return float(value)
    if not isinstance(value, str):
        raise FaultError(f"{key} must be a string")
    return value


def apply_patch(faults: Faults, patch: dict[str, Any]) -> Faults:
    """Validate ``patch`` and apply it to ``faults`` in place (all or nothing); returns it.

    Raises :class:`FaultError` on an unknown key or a bad value.
    """
    staged: dict[str, Any] = {}
    for key, value in patch.items():
        if key not in FAULT_KEYS:
            raise FaultError(f"unknown fault {key!r}; known: {', '.join(sorted(FAULT_KEYS))}")
        v = _coerce(key, value)
        if key == "metrics_mode" and v not in METRICS_MODES:
            raise FaultError("metrics_mode must be ok, error or malformed")
        if key == "vllm_version" and v is not None:
            try:
                regime_for_version(v)
            except ValueError as exc:
                raise FaultError(str(exc)) from exc
        if key in ("completion_error_rate", "wrong_answer_rate") and not 0.0 <= v <= 1.0:
            raise FaultError(f"{key} must be in [0, 1]")
        if key in {"completion_delay_s", "draft_noise_multiplier"} and v < 0:
            raise FaultError(f"{key} must be >= 0")
        if key == "fly_entropy_threshold" and v is not None and v < 0:
            raise FaultError("fly_entropy_threshold must be >= 0")
        if key == "max_num_batched_tokens" and v is not None and v < 1:
            raise FaultError("max_num_batched_tokens must be >= 1")
        staged[key] = v
    for key, v in staged.items():
        setattr(faults, key, v)
    return faults


def clear(faults: Faults) -> Faults:
    """Turn every fault off (in place)."""
    fresh = Faults()
    for key in FAULT_KEYS:
        setattr(faults, key, getattr(fresh, key))
    return faults
