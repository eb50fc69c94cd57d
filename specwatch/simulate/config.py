"""Simulator configuration (flags named as vLLM names them) and fault state."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

from specwatch.core.roles import Role as Role
from specwatch.vllm.methods import (
    SPEC_METHODS,
    BudgetRegime,
    method_slots,
    regime_for_version,
    static_reservation_slots,
)
from specwatch.vllm.request_metrics import MODES


@dataclass(frozen=True, slots=True)
class StepTimeModel:
    """Simulated step duration in seconds:
    ``base_s + token_s * batch_rows + seq_s * num_seqs`` where ``batch_rows`` counts the scheduled
    tokens plus the drafter's extra rows (S per request), i.e. what fills
    ``max_num_batched_tokens``.
    """

    base_s: float = 0.004
    token_s: float = 25e-6
    seq_s: float = 20e-6

    def duration(self, batch_rows: int, num_seqs: int) -> float:
        return self.base_s + self.token_s * batch_rows + self.seq_s * num_seqs


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Everything one simulated vLLM server needs.

    Budget fields follow vLLM (``max_num_batched_tokens`` B, ``max_num_seqs`` N,
    ``max_num_scheduled_tokens`` T, default B). ``max_num_queued_reqs`` and
    ``max_num_queued_tokens`` are vLLM 0.33's frontend admission limits (``None`` = unlimited,
    the default): see :meth:`specwatch.simulate.server.SimServer.admission_rejection`.
    ``vllm_version`` picks the budget regime
    (:func:`specwatch.vllm.methods.regime_for_version`). ``time_scale`` multiplies simulated step
    durations in real-time mode (0 = as fast as the CPU allows).
    """

    role: Role = Role.STANDARD
    served_model_name: str = "sim-model"
    method: str = "eagle3"
    num_speculative_tokens: int = 4
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_num_scheduled_tokens: int | None = None
    max_num_queued_reqs: int | None = None
    max_num_queued_tokens: int | None = None
    max_model_len: int = 4096
    enable_chunked_prefill: bool = True
    fly_window_size: int | None = None
    fly_entropy_threshold: float = 0.3
    fly_entropy_top_k: int = 3
    draft_sample_method: str = "greedy"
    data_parallel_size: int = 1
    vllm_version: str = "0.33.0"
    seed: int = 0
    vocab_size: int = 128
    target_sharpness: float = 8.0
    draft_noise: float = 0.8
    step_time: StepTimeModel = field(default_factory=StepTimeModel)
    time_scale: float = 1.0
    per_request_spec_decode_metrics: str = "none"
    num_gpu_blocks: int = 16384
    block_size: int = 16
    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False

    @property
    def speculative(self) -> bool:
        return self.role is not Role.BASELINE

    @property
    def regime(self) -> BudgetRegime:
        return regime_for_version(self.vllm_version)

    @property
    def fly_window(self) -> int:
        k = self.num_speculative_tokens
        return self.fly_window_size if self.fly_window_size is not None else min(6, k - 1)

    def validate(self) -> None:
        """Raise ``ValueError`` with one clear sentence on an invalid combination."""
        k = self.num_speculative_tokens
        if self.method not in SPEC_METHODS:
            raise ValueError(f"unknown --method {self.method!r}")
        if k < 1:
            raise ValueError("--num-speculative-tokens must be >= 1")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("--max-num-seqs and --max-num-batched-tokens must be >= 1")
        for flag, limit in (
            ("--max-num-queued-reqs", self.max_num_queued_reqs),
            ("--max-num-queued-tokens", self.max_num_queued_tokens),
        ):
            if limit is not None and limit < 0:
                raise ValueError(f"{flag} must be >= 0 (or unset for no limit)")
        if self.data_parallel_size < 1:
            raise ValueError("--data-parallel-size must be >= 1")
        if self.vocab_size < 32:
            raise ValueError("--vocab-size must be >= 32")
        numbers = {
            "--time-scale": self.time_scale,
            "--target-sharpness": self.target_sharpness,
            "--draft-noise": self.draft_noise,
            "--step-time-base-ms": self.step_time.base_s,
            "--step-time-per-token-us": self.step_time.token_s,
            "--step-time-per-seq-us": self.step_time.seq_s,
        }
        for flag, value in numbers.items():
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{flag} must be a finite number >= 0, not {value}")
        if math.isnan(self.fly_entropy_threshold):  # +inf is allowed: FLy never waives
            raise ValueError("--fly-entropy-threshold must be a number, not nan")
        if self.draft_sample_method not in {"greedy", "random"}:
            raise ValueError("--draft-sample-method must be greedy or random")
        if self.per_request_spec_decode_metrics not in MODES:
            raise ValueError("--per-request-spec-decode-metrics must be none, summary or detailed")
        regime_for_version(self.vllm_version)
        if self.num_gpu_blocks * self.block_size < self.max_model_len + k + 1:
            raise ValueError("--num-gpu-blocks too small to hold one max_model_len request")
        if self.role is Role.FLY:
            if k < 2:
                raise ValueError("FLy needs --num-speculative-tokens >= 2")
            if not 1 <= self.fly_window < k:
                raise ValueError("--fly-window-size must satisfy 1 <= W < K")
            if self.fly_entropy_threshold < 0 or self.fly_entropy_top_k < 1:
                raise ValueError(
                    "--fly-entropy-threshold must be >= 0 and --fly-entropy-top-k >= 1"
                )
        if self.speculative:
            slots = method_slots(self.method, k, regime=self.regime)
            if self.max_num_batched_tokens <= slots.lookahead_slots:
                raise ValueError("--max-num-batched-tokens must exceed the lookahead slots L")
            if self.regime is BudgetRegime.STATIC:
                s_old = static_reservation_slots(self.method, k)
                if self.max_num_batched_tokens - s_old * self.max_num_seqs <= 0:
                    raise ValueError(
                        "static reservation leaves no token budget: "
                        "max_num_batched_tokens - S_old * max_num_seqs <= 0"
                    )

    def with_overrides(self, **kw: Any) -> SimConfig:
        return replace(self, **kw)


#: Fault keys the admin endpoint accepts, with their types.
FAULT_KEYS: dict[str, type] = {
    "fly_entropy_threshold": float,
    "draft_noise_multiplier": float,
    "draft_noise_engine": int,
    "max_num_batched_tokens": int,
    "vllm_version": str,
    "stall_admission": bool,
    "metrics_mode": str,
    "completion_delay_s": float,
    "completion_error_rate": float,
    "wrong_answer_rate": float,
    "stream_usage_ignored": bool,
    "tokenize_error": bool,
}


@dataclass(slots=True)
class Faults:
    """Faults in force (all off by default). See ``docs`` in :mod:`specwatch.simulate.faults`."""

    fly_entropy_threshold: float | None = None
    draft_noise_multiplier: float = 1.0
    draft_noise_engine: int | None = None
    max_num_batched_tokens: int | None = None
    vllm_version: str | None = None
    stall_admission: bool = False
    metrics_mode: str = "ok"
    completion_delay_s: float = 0.0
    completion_error_rate: float = 0.0
    wrong_answer_rate: float = 0.0
    stream_usage_ignored: bool = False
    tokenize_error: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
