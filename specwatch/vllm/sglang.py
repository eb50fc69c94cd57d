"""SGLang's metric families and serving facts: the table the SGLang page parser reads, the rank
rule, the accept-rate formula eras and the scheduler budget rule (pure, no I/O).

Source: SGLang's ``SchedulerMetricsCollector`` / ``TokenizerMetricsCollector``
(``sglang/srt/metrics/collector.py`` up to 0.5.9, ``sglang/srt/observability/metrics_collector.py``
from 0.5.10), the scheduler's ``log_decode_stats`` and ``server_args.py`` of the PyPI wheels 0.4.0
to 0.5.23; ``docs/metrics.md`` says which versions each rule covers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from specwatch.vllm.families import Family
from specwatch.vllm.request_metrics import SpecDecodeReading

#: The serving engines specwatch reads: vLLM (``vllm:*`` counters) and SGLang (``sglang:*``).
EngineKind = Literal["vllm", "sglang"]
#: Every :data:`EngineKind`, vLLM first (the default when nothing says otherwise).
ENGINE_KINDS: tuple[EngineKind, ...] = ("vllm", "sglang")

#: Allow-listed SGLang families: exposition name → (type, key). Keys shared with vLLM
#: (``running``, ``waiting``, ``kv_cache_usage``, ``generation_tokens`` ...) mean the same thing;
#: the ``sglang_*`` keys are SGLang's interval gauges and constants, read only by
#: :mod:`specwatch.observe.sglang_health`.
FAMILIES: tuple[Family, ...] = (
    # tokenizer-side counters (no tp_rank label; summed over is_streaming / cache_source)
    Family("sglang:generation_tokens_total", "counter", "generation_tokens"),
    Family("sglang:prompt_tokens_total", "counter", "prompt_tokens"),
    Family("sglang:num_requests_total", "counter", "requests_finished"),
    # from 0.5.13: one per verify forward of a request, counted when the request finishes
    Family("sglang:spec_verify_calls_total", "counter", "sglang_verify_calls"),
    Family("sglang:inter_token_latency_seconds", "histogram", "itl"),
    Family("sglang:time_to_first_token_seconds", "histogram", "ttft"),
    # scheduler gauges (one per tp_rank when every scheduler writes them)
    Family("sglang:num_running_reqs", "gauge", "running"),
    Family("sglang:num_queue_reqs", "gauge", "waiting"),
    Family("sglang:token_usage", "gauge", "kv_cache_usage"),
    Family("sglang:num_used_tokens", "gauge", "sglang_used_tokens"),
    Family("sglang:max_total_num_tokens", "gauge", "sglang_max_total_num_tokens"),
    Family("sglang:num_retracted_reqs", "gauge", "sglang_retracted"),
    Family("sglang:spec_accept_length", "gauge", "sglang_accept_length"),
    Family("sglang:spec_accept_rate", "gauge", "sglang_accept_rate"),
    Family("sglang:spec_num_steps", "gauge", "sglang_num_steps"),
    Family("sglang:spec_num_draft_tokens", "gauge", "sglang_num_draft_tokens"),
)

#: Family by exposition name.
BY_NAME: dict[str, Family] = {f.name: f for f in FAMILIES}

#: The labels that tell ranks apart. Only the stats-logging rank (``attn_tp_rank == 0``) writes
#: the interval gauges unless ``--enable-metrics-for-all-schedulers`` is set, and from 0.5.11
#: every rank writes the start-up constants: so one rank is read, the lowest ``tp_rank`` of each
#: ``dp_rank`` (``tp_rank="0"`` without DP attention), and the lowest ``pp_rank``.
RANK_LABEL = "tp_rank"
PIPELINE_LABEL = "pp_rank"
#: The label that names a data-parallel scheduler: specwatch's ``engine`` for SGLang.
DP_LABEL = "dp_rank"


#: How a page's ``sglang:spec_accept_rate`` was computed, told by its HELP text:
#: ``"tau_over_n"`` (0.5.3.post2 to 0.5.10.post1: (accepted + bonus) / (verifies · N), or
#: · (S + 1) before 0.5.5.post3, which is τ itself for NGRAM, where S is unset) or
#: ``"alpha"`` (0.5.11 on: accepted drafts / (verifies · (N − 1))).
RateFormula = Literal["tau_over_n", "alpha"]

#: Words of each era's HELP text that tell them apart.
_RATE_HELP: tuple[tuple[str, RateFormula], ...] = (
    ("accepted tokens / total draft tokens", "tau_over_n"),
    ("accepted drafts / proposed drafts", "alpha"),
)

#: Gauge value the parser writes under ``sglang_rate_formula`` for each era (gauges are floats).
RATE_FORMULA_CODES: dict[RateFormula, float] = {"tau_over_n": 1.0, "alpha": 2.0}


def rate_formula(help_text: str) -> RateFormula | None:
    """The accept-rate era of a ``sglang:spec_accept_rate`` HELP text; ``None`` when unknown."""
    for words, era in _RATE_HELP:
        if words in help_text:
            return era
    return None


def draft_tokens_from_rate(tau: float, rate: float, era: RateFormula | None) -> int | None:
    """N (``speculative_num_draft_tokens``) implied by a page's τ and accept-rate gauge, for a
    page that does not show N itself (before 0.5.13): ``τ / rate`` in the ``tau_over_n`` era,
    ``1 + (τ − 1) / rate`` in the ``alpha`` era. Only a rate in (0, 1] is trusted, and N only
    within 0.05 of a whole number ≥ 2 (the gauges are averages of whole counts); else ``None``."""
    if era is None or not 0 < rate <= 1 or tau < 1:
        return None
    n = tau / rate if era == "tau_over_n" else 1 + (tau - 1) / rate
    whole = round(n)
    return whole if whole >= 2 and abs(n - whole) <= 0.05 else None


def alpha_from_tau(tau: float, num_draft_tokens: int) -> float | None:
    """Strict per-draft-token acceptance α = (τ − 1) / (N − 1) (every SGLang version; from 0.5.11
    the rate gauge equals it). ``None`` when N < 2."""
    if num_draft_tokens < 2:
        return None
    return (tau - 1) / (num_draft_tokens - 1)


@dataclass(frozen=True, slots=True)
class SglangBudget:
    """SGLang's per-step scheduler budget for one data-parallel scheduler.

    ``admission_cap``: requests in the running batch at most (``max_running_requests``);
    ``tokens_per_request``: target tokens each running request verifies per decode step (N with
    speculation, 1 without); ``verify_tokens_per_step``: ``admission_cap · tokens_per_request``,
    the size of the verify forward at a full batch (the CUDA-graph batch in tokens);
    ``kv_reserved_per_request``: KV slots reserved per request before each decode step
    (``max(S · topk, N)``, page-aligned by the engine).
    SGLang has no per-step token budget on decode (``chunked_prefill_size`` bounds a prefill
    chunk only), so a full batch always verifies full drafts: never budget-bound in vLLM's sense.
    """

    admission_cap: int
    tokens_per_request: int
    verify_tokens_per_step: int
    kv_reserved_per_request: int


def budget(
    max_running_requests: int, num_draft_tokens: int | None, num_steps: int | None, topk: int
) -> SglangBudget:
    """The budget of ``max_running_requests`` requests verifying N draft tokens each (``None``:
    no speculation), with ``num_steps`` S draft steps of ``topk`` tokens each."""
    n = num_draft_tokens if num_draft_tokens else 1
    reserve = max((num_steps or 0) * topk, n)
    return SglangBudget(
        admission_cap=max_running_requests,
        tokens_per_request=n,
        verify_tokens_per_step=max_running_requests * n,
        kv_reserved_per_request=reserve,
    )


#: ``max_running_requests`` SGLang sets for any speculative algorithm when it is not given
#: ("Max running requests is reset to 48 for speculative decoding", ``server_args.py``).
SPECULATIVE_DEFAULT_MAX_RUNNING_REQUESTS = 48


def server_info_facts(info: dict[str, object]) -> dict[str, int | str | None]:
    """The serving facts specwatch reads from SGLang's ``GET /server_info`` body (a JSON object
    of the server arguments; ``/get_server_info`` before 0.5.6): ``version``,
    ``speculative_algorithm``, ``num_draft_tokens``, ``num_steps``, ``topk``,
    ``max_running_requests`` (the resolved per-DP value when the body has it) and
    ``chunked_prefill_size``; ``None`` where absent."""

    def whole(name: str, source: dict[str, object] = info) -> int | None:
        v = source.get(name)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    def text(name: str) -> str | None:
        v = info.get(name)
        return v if isinstance(v, str) else None

    states = info.get("internal_states")
    per_dp: int | None = None
    if isinstance(states, list) and states and isinstance(states[0], dict):
        per_dp = whole("effective_max_running_requests_per_dp", states[0])
    return {
        "version": text("version"),
        "speculative_algorithm": text("speculative_algorithm"),
        "num_draft_tokens": whole("speculative_num_draft_tokens"),
        "num_steps": whole("speculative_num_steps"),
        "topk": whole("speculative_eagle_topk"),
        "max_running_requests": per_dp if per_dp is not None else whole("max_running_requests"),
        "chunked_prefill_size": whole("chunked_prefill_size"),
    }


def detect_engine(body: str) -> EngineKind | None:
    """Which engine wrote a ``/metrics`` page: ``"vllm"`` when any line starts with ``vllm:``
    (a vLLM page never carries ``sglang:`` series), else ``"sglang"`` when one starts with
    ``sglang:``, else ``None`` (neither: not a serving engine's page)."""
    if body.startswith("vllm:") or "\nvllm:" in body:
        return "vllm"
    if body.startswith("sglang:") or "\nsglang:" in body:
        return "sglang"
    return None


#: Per-request accepted-draft and proposed-draft keys by version, newest first: 0.5.12 on,
#: 0.5.11 (kept as aliases to 0.5.20), 0.5.5.post3 to 0.5.10.
_REQUEST_DRAFT_KEYS: tuple[tuple[str, str], ...] = (
    ("spec_num_correct_drafts", "spec_num_proposed_drafts"),
    ("spec_accepted_drafts", "spec_proposed_drafts"),
    ("spec_accept_token_num", "spec_draft_token_num"),
)


def _count(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def read_sglang_spec(obj: Mapping[str, Any]) -> SpecDecodeReading | None:
    """SGLang's per-request speculative fields of a reply, or ``None`` when absent or malformed:
    ``sglext.spec_tokens_details`` of an OpenAI reply (0.5.19 on, asked with
    ``return_spec_tokens_details``; a list when n > 1: choice 0's) or ``meta_info`` of a native
    ``/generate`` reply. Steps = ``spec_verify_ct``; accepted and proposed drafts by the
    version's names (:data:`_REQUEST_DRAFT_KEYS`); τ = 1 + accepted / steps and α = accepted /
    proposed, as for vLLM (SGLang's own ``spec_accept_length`` = completion tokens / verifies
    also counts the first token, from prefill, so it is not read). Pure."""
    details: object = None
    ext = obj.get("sglext")
    if isinstance(ext, Mapping):
        details = ext.get("spec_tokens_details")
        if isinstance(details, list):
            details = details[0] if details else None
    if details is None:
        details = obj.get("meta_info")
    if not isinstance(details, Mapping):
        return None
    steps = _count(details.get("spec_verify_ct"))
    if steps is None:
        return None
    for accepted_key, proposed_key in _REQUEST_DRAFT_KEYS:
        accepted, proposed = _count(details.get(accepted_key)), _count(details.get(proposed_key))
        if accepted is None or proposed is None:
            continue
        if accepted > proposed:
            return None
        if steps == 0:
            return SpecDecodeReading(0, proposed, accepted, None, None)
        alpha = accepted / proposed if proposed else None
        return SpecDecodeReading(steps, proposed, accepted, 1.0 + accepted / steps, alpha)
    return None
