"""Immutable values passed along the observe chain and published to exporters.

The observe chain is ``scrape`` → ``parse`` (:class:`PageReading`) → ``window``
(:class:`Delta` per window) → ``health`` (:class:`Health`, :class:`Capacity`, :class:`PairView`)
→ one :class:`ObserveView` that the server publishes in :class:`specwatch.export.snapshot.Snapshot`
and the detectors read.
Every value here is frozen; ``None`` always means *unknown / undefined* (never 0).
Times are unix seconds from the injected wall clock, durations in seconds. The label vocabularies
of the chain's families (scrape error, withheld-value and throughput-withheld reasons) are
here beside the values, so the producing stage and the exporter read one definition; the
speculation limit's values and states are defined in :mod:`specwatch.observe.concurrency` and
named here too, so exporters import only this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, get_args

from specwatch.core.roles import Role
from specwatch.observe.concurrency import LIMIT_STATUSES as LIMIT_STATUSES
from specwatch.observe.concurrency import ConcurrencyProfile as ConcurrencyProfile
from specwatch.observe.concurrency import SpeculationLimit as SpeculationLimit
from specwatch.vllm.sglang import EngineKind

#: Quantiles exported for ITL and TTFT.
QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.99)

#: A window name (``"1m"``, ``"5m"``, ``"15m"``, ``"since_start"``).
WindowName = str


#: One (model_name, engine) pair; ``engine`` is vLLM's data-parallel engine index as a string.
EngineKey = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Histogram:
    """Cumulative histogram: ``buckets`` are (upper bound ``le``, cumulative count), sorted by
    ``le`` and ending with ``+inf``; ``count`` and ``sum`` as exposed (``None`` when absent)."""

    buckets: tuple[tuple[float, float], ...]
    count: float | None = None
    sum: float | None = None


@dataclass(frozen=True, slots=True)
class EngineReading:
    """Allow-listed values of one (model_name, engine) from one ``/metrics`` page.

    ``counters`` maps a counter key (see :data:`COUNTER_KEYS`) to its cumulative value; a key is
    absent when the family is absent or NaN. ``per_position`` maps draft position (0-based) to
    cumulative accepted tokens at that position. ``gauges`` maps a gauge key (``running``,
    ``waiting``, ``kv_cache_usage``) to its value. ``waiting_by_reason`` maps reason to count.
    ``histograms`` maps ``itl``/``ttft`` to :class:`Histogram` (old names read as fallbacks).
    """

    counters: Mapping[str, float]
    per_position: Mapping[int, float]
    gauges: Mapping[str, float]
    waiting_by_reason: Mapping[str, float]
    histograms: Mapping[str, Histogram]


#: Counter keys in :attr:`EngineReading.counters` and :class:`Delta`.
#: ``engine_steps`` is ``vllm:iteration_tokens_total_count`` (one observation per engine step).
#: ``emitted_tokens`` is V0's ``vllm:spec_decode_num_emitted_tokens_total``; ``itl_sum`` /
#: ``itl_count`` / ``ttft_sum`` / ``ttft_count`` are the latency histograms' ``_sum`` / ``_count``.
COUNTER_KEYS: tuple[str, ...] = (
    "drafts",
    "draft_tokens",
    "accepted_tokens",
    "generation_tokens",
    "prompt_tokens",
    "prompt_tokens_local_compute",
    "prompt_tokens_local_cache_hit",
    "prompt_tokens_external_kv_transfer",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "preemptions",
    "engine_steps",
    "requests_finished",
    "emitted_tokens",
    "itl_sum",
    "itl_count",
    "ttft_sum",
    "ttft_count",
)

#: The ``source`` values of ``vllm:prompt_tokens_by_source_total`` read, each as the counter key
#: ``prompt_tokens_<source>`` (vllm-metrics.md §2); other sources are left out.
PROMPT_SOURCES: tuple[str, ...] = ("local_compute", "local_cache_hit", "external_kv_transfer")

#: Counters whose fall marks a reset of the engine (vLLM spec-decode counters).
SPEC_DECODE_COUNTER_KEYS: tuple[str, ...] = ("drafts", "draft_tokens", "accepted_tokens")


@dataclass(frozen=True, slots=True)
class PageReading:
    """What :func:`specwatch.observe.parse.parse_page` keeps from one page.

    ``engines``: one :class:`EngineReading` per (model_name, engine).
    ``process_start_time_seconds``: from the page, ``None`` when absent (multiprocess mode).
    ``duplicate_conflicts``: series seen twice with different values (skipped, counted).
    ``families``: allow-listed family names present on the page (for stale detection).
    ``invalid_series``: series skipped for a value or label no vLLM page carries (±Inf, a
    negative counter, a bad ``position`` or ``le``); counted.
    ``engine_kind``: which serving engine wrote the page (``vllm`` or ``sglang``,
    :func:`specwatch.vllm.sglang.detect_engine`).
    ``gauge_processes``: distinct processes (:data:`specwatch.observe.parse.PROCESS_LABEL`
    values) whose gauges the page carries once per process, each such gauge read once (the
    largest copy); 0 when every gauge has one value.
    ``implausible_series``: samples refused for a value no server writes (above 2^53, or a NaN
    counter: :mod:`specwatch.observe.plausible`), skipped and counted; ``implausible`` names
    the first few (``name{labels}=value``); ``invalid`` the first few ``invalid_series``;
    ``duplicates`` the first few ``duplicate_conflicts`` (with the first value seen). A family
    is in ``families`` when the page carries it, also when every sample of it was skipped.
    """

    engines: Mapping[EngineKey, EngineReading]
    process_start_time_seconds: float | None = None
    duplicate_conflicts: int = 0
    families: frozenset[str] = frozenset()
    invalid_series: int = 0
    engine_kind: EngineKind = "vllm"
    gauge_processes: int = 0
    implausible_series: int = 0
    implausible: tuple[str, ...] = ()
    invalid: tuple[str, ...] = ()
    duplicates: tuple[str, ...] = ()
    cache_config: CacheConfig | None = None
    lora: LoraState | None = None


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """What ``vllm:cache_config_info`` says (its labels; the value is always 1), from the
    lowest ``engine`` on the page: ``block_size`` (tokens per KV block; a prompt shorter than one
    block never hits the prefix cache), ``enable_prefix_caching`` and the KV cache size in
    tokens. ``None`` for a label the page does not carry or cannot be read as a number."""

    block_size: int | None = None
    enable_prefix_caching: bool | None = None
    kv_cache_size_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class LoraState:
    """What ``vllm:lora_requests_info`` says. vLLM sets one series to the current wall time
    whenever the adapters change (``set_to_current_time``), and old label sets stay on the page
    with older times: the series with the largest value is the current state, never a sum.
    ``max_lora``: adapters a batch can hold; ``running`` / ``waiting``: adapter names in the
    current series' ``running_lora_adapters`` / ``waiting_lora_adapters`` (comma-separated);
    ``updated_at``: its value (unix seconds)."""

    max_lora: int | None = None
    running: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()
    updated_at: float | None = None


@dataclass(frozen=True, slots=True)
class Delta:
    """Counter increases of one engine (or a sum over engines) over one window.

    ``interval_seconds`` is the time between the two scrapes bracketing the window (``None`` when
    unknown, e.g. ``analyze`` on a single body). Every counter is ``None`` when either end lacks
    it. ``histograms`` hold bucket increases. ``gauges``/``waiting_by_reason`` are the latest
    values (window-free); ``num_speculative_tokens`` is K from the ``position`` labels.
    """

    interval_seconds: float | None
    counters: Mapping[str, float | None]
    per_position: Mapping[int, float]
    histograms: Mapping[str, Histogram]
    gauges: Mapping[str, float]
    waiting_by_reason: Mapping[str, float]
    num_speculative_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Health:
    """Derived spec-decode and serving health over one window (vLLM's own definitions).

    Counts (increases over the window): ``drafts``, ``draft_tokens``, ``accepted_tokens``,
    ``generation_tokens``, ``engine_steps``, ``preemptions``, ``requests_finished`` (every
    ``finished_reason`` of ``vllm:request_success_total``).
    Ratios (``None`` when the denominator is 0 or unknown; source ``SpecDecodingLogging`` /
    ``SpecDecodingProm`` in ``vllm/v1/spec_decode/metrics.py``):

    - ``acceptance_rate`` α = Δaccepted / Δdraft_tokens (0..1)
    - ``mean_acceptance_length`` τ = 1 + Δaccepted / Δdrafts (tokens per verify step)
    - ``mean_draft_length`` ℓ = Δdraft_tokens / Δdrafts
    - ``per_position_acceptance_rate[i]`` = Δper_pos[i] / Δdrafts
    - ``per_position_conditional_acceptance_rate[i]`` = Δper_pos[i] / Δper_pos[i-1]
      (position 0: Δper_pos[0] / Δdrafts)
    - ``drafts_per_step`` = Δdrafts / Δengine_steps
    - rates ``*_per_second`` = Δcount / ``interval_seconds`` (``requests_finished_per_second``
      from ``vllm:request_success_total``, ``prompt_tokens_per_second`` from
      ``vllm:prompt_tokens_total``)
    - ``inter_token_latency_seconds`` / ``time_to_first_token_seconds``: quantile → seconds, from
      bucket increases with PromQL ``histogram_quantile`` interpolation.

    Latest gauges: ``num_requests_running``, ``num_requests_waiting``,
    ``num_requests_waiting_by_reason`` (a breakdown of waiting, not added to it),
    ``kv_cache_usage`` (fraction 0..1; mean over engines in a server view).
    ``num_speculative_tokens`` K: from ``position`` labels, else configuration.
    ``inter_token_latency_mean_seconds`` / ``time_to_first_token_mean_seconds``: Δ``_sum`` /
    Δ``_count`` of the histograms (seconds; beside the quantiles).
    ``spec_decode_schema``: ``"v1"`` (``vllm:spec_decode_num_drafts_total``), ``"sglang_counters"``
    / ``"sglang_interval"`` (SGLang's verify counter / interval gauge,
    :mod:`specwatch.observe.sglang_health`), ``"v0"`` (vLLM V0:
    ``..._num_emitted_tokens_total`` and no drafts counter; drafts = draft tokens / K and
    τ = emitted / drafts, vLLM V0's ``SpecDecodeWorkerMetrics``), ``None`` without spec-decode
    counters. The two are never mixed in one window (:mod:`specwatch.observe.window`).
    ``speculation_coverage`` = (Δaccepted + Δdrafts) / Δgeneration_tokens: the share of output
    tokens emitted by verify steps (vLLM adds 1 + accepted to ``generation_tokens`` for every
    request and step, and counts a draft only for a step that scheduled a draft token, so steps
    without a proposal, an ngram or suffix proposer finding nothing, add 1 token each and no
    draft); 1 when every step drafted (up to each request's first token, which its prefill
    emits); τ describes only the covered steps. At most 1: vLLM counts as accepted the drafts a
    request's last step accepted past its stop (EOS, max_tokens) but leaves them out of
    generation, so with short replies and high acceptance the ratio passes 1 (by up to K per
    finished request); that reads "every step drafted".
    ``prompt_tokens_by_source``: Δ prompt tokens per :data:`PROMPT_SOURCES` value the page
    carries. ``prefix_cache_hit_rate`` = Δhits / Δqueries
    (tokens, local prefix cache). ``scheduled_tokens_per_step`` ≈ (Δprompt local_compute, else
    Δprompt_tokens, + Δgeneration + Δdraft_tokens − Δaccepted) / Δengine_steps (vllm-metrics.md
    §9; compared with max_num_batched_tokens; with the prompt total it is an upper bound).
    ``prompt_length``: bucket increases of ``vllm:request_prompt_tokens`` (prompt length per
    finished request).
    ``withheld``: reasons (:data:`INVALID_REASONS`, sorted) for values set to ``None`` because
    they cannot be right (α > 1, τ > K + 1, ℓ > K, a negative count or rate); empty normally.
    """

    interval_seconds: float | None = None
    drafts: float | None = None
    draft_tokens: float | None = None
    accepted_tokens: float | None = None
    generation_tokens: float | None = None
    engine_steps: float | None = None
    preemptions: float | None = None
    requests_finished: float | None = None
    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None
    mean_draft_length: float | None = None
    per_position_acceptance_rate: tuple[float | None, ...] = ()
    per_position_conditional_acceptance_rate: tuple[float | None, ...] = ()
    num_speculative_tokens: int | None = None
    generation_tokens_per_second: float | None = None
    accepted_tokens_per_second: float | None = None
    drafts_per_second: float | None = None
    drafts_per_step: float | None = None
    engine_steps_per_second: float | None = None
    preemptions_per_second: float | None = None
    requests_finished_per_second: float | None = None
    prompt_tokens_per_second: float | None = None
    inter_token_latency_seconds: Mapping[float, float | None] = field(default_factory=dict)
    time_to_first_token_seconds: Mapping[float, float | None] = field(default_factory=dict)
    num_requests_running: float | None = None
    num_requests_waiting: float | None = None
    num_requests_waiting_by_reason: Mapping[str, float] = field(default_factory=dict)
    kv_cache_usage: float | None = None
    inter_token_latency_mean_seconds: float | None = None
    time_to_first_token_mean_seconds: float | None = None
    spec_decode_schema: str | None = None
    withheld: tuple[str, ...] = ()
    speculation_coverage: float | None = None
    prompt_tokens_by_source: Mapping[str, float] = field(default_factory=dict)
    prefix_cache_hit_rate: float | None = None
    scheduled_tokens_per_step: float | None = None
    prompt_length: Histogram | None = None


#: Why a scrape failed or a page lost series (``specwatch_scrape_errors_total{reason}``; each is
#: exported from 0, so ``rate()`` works from the start). Fetching the page
#: (:mod:`specwatch.observe.fetch`): ``timeout``, ``connect``, ``http_status``, ``too_large``,
#: ``truncated`` (the body ended early), ``decode`` (content encoding or charset),
#: ``http_error`` (any other client error); parsing it (:mod:`specwatch.observe.loop`):
#: ``parse``; the tracker (:mod:`specwatch.observe.tracker`): ``duplicate_conflict`` and
#: ``invalid_series`` (series skipped on a good page), ``no_vllm_families`` and
#: ``counters_alternate`` (a page rejected whole), ``model_cap`` and ``engine_cap`` (engines
#: dropped over the per-target caps), ``implausible_value`` (a sample above 2^53, a NaN
#: counter, or a counter rising faster than any server can: :mod:`specwatch.observe.plausible`).
ScrapeErrorReason = Literal[
    "timeout",
    "connect",
    "http_status",
    "too_large",
    "truncated",
    "parse",
    "decode",
    "duplicate_conflict",
    "invalid_series",
    "http_error",
    "no_vllm_families",
    "counters_alternate",
    "model_cap",
    "engine_cap",
    "implausible_value",
]
#: Every :data:`ScrapeErrorReason`, in that order.
SCRAPE_ERROR_REASONS: tuple[ScrapeErrorReason, ...] = get_args(ScrapeErrorReason)


#: Why a derived value was withheld (``None``) instead of published: numbers that cannot be
#: right. ``acceptance_above_one``: α > 1; ``tau_above_k_plus_one``: τ > K + 1;
#: ``negative_rate``: a negative count or rate; ``draft_length_above_k``: ℓ > K.
INVALID_REASONS: tuple[str, ...] = (
    "acceptance_above_one",
    "draft_length_above_k",
    "negative_rate",
    "tau_above_k_plus_one",
)


@dataclass(frozen=True, slots=True)
class ModelWindow:
    """One model's health in one window: ``server`` (sum over engines) and per ``engines``."""

    server: Health
    engines: Mapping[str, Health]


@dataclass(frozen=True, slots=True)
class Limits:
    """Scheduler limits of a target as configured (vLLM does not export them, §4)."""

    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    num_speculative_tokens: int | None = None
    method: str | None = None
    parallel_drafting: bool = False
    vllm_version: str | None = None
    #: the serving engine (``None``: vLLM); an SGLang target takes SGLang's budget rule
    engine: EngineKind | None = None


#: Where a K (num_speculative_tokens) came from: ``"observed"``, the ``position`` labels of the
#: page (vLLM creates all K of them at start-up), or ``"configured"``, the target's settings.
SpeculativeTokensSource = Literal["observed", "configured"]


@dataclass(frozen=True, slots=True)
class Capacity:
    """Running vs limits and the token budget (vllm-metrics.md §9, :mod:`specwatch.vllm.budget`).

    ``limits_configured``: B, N, K and method all known (else the budget fields are ``None``).
    ``num_requests_running``: the most-loaded engine's running gauge (each engine schedules alone).
    ``running_to_max_seqs_ratio`` = running / max_num_seqs; ``running_gap_requests`` = N − running.
    ``admission_cap_requests`` R_max, ``decode_full_per_step_requests`` D_full, ``budget_bound``
    (D_full < N) from :func:`specwatch.vllm.budget.budget_limits` for the configured vLLM version.
    ``num_speculative_tokens`` is the K all of these used and ``num_speculative_tokens_source``
    where it came from (:func:`specwatch.observe.health.speculative_tokens`, the one precedence
    rule); with K and the method known, ``extra_batch_slots`` S
    (:func:`specwatch.vllm.methods.method_slots`) and ``slots_per_request`` = 1 + K + S, and with
    N too ``required_batched_tokens`` = N · (1 + K + S), the budget that verifies full drafts
    for ``max_num_seqs`` requests (:func:`specwatch.vllm.budget.required_batched_tokens`).
    The detectors read these and never work them out again.
    """

    limits_configured: bool
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    num_requests_running: float | None = None
    running_to_max_seqs_ratio: float | None = None
    running_gap_requests: float | None = None
    admission_cap_requests: int | None = None
    decode_full_per_step_requests: int | None = None
    budget_bound: bool | None = None
    num_speculative_tokens: int | None = None
    num_speculative_tokens_source: SpeculativeTokensSource | None = None
    extra_batch_slots: int | None = None
    slots_per_request: int | None = None
    required_batched_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class TargetSnapshot:
    """Everything known about one scraped vLLM server.

    ``up``: last scrape succeeded. ``stale``: the values shown are the last good ones (last scrape
    failed, or families seen before are missing now). ``ready``: at least one good scrape.
    ``windows[window][model_name]`` → :class:`ModelWindow`. ``scrape_errors`` maps reason → count;
    ``counter_resets`` maps engine → count. ``invalid_values`` maps a reason of
    :data:`INVALID_REASONS` → good pages on which some derived value was withheld for it.
    ``missing_families``: allow-listed families seen on an
    earlier page but absent from the latest good one. ``concurrency``: decode speed per
    running-request band over the good scrapes (:mod:`specwatch.observe.concurrency`).
    ``engine_kind``: ``vllm`` or ``sglang``, from the latest good page.
    ``gauge_processes``: :attr:`PageReading.gauge_processes` of the latest good page (gauges
    exported once per process, read once; 0: one value per gauge).
    """

    name: str
    role: Role
    url: str
    up: bool = False
    stale: bool = False
    ready: bool = False
    last_success: float | None = None
    last_scrape_duration_seconds: float | None = None
    scrapes_total: int = 0
    #: scheduled scrapes skipped because the scrape before ran past them (the loop keeps a
    #: fixed schedule: a skipped tick is counted, never made late)
    missed_ticks: int = 0
    scrape_errors: Mapping[str, int] = field(default_factory=dict)
    counter_resets: Mapping[str, int] = field(default_factory=dict)
    invalid_values: Mapping[str, int] = field(default_factory=dict)
    missing_families: tuple[str, ...] = ()
    limits: Limits = field(default_factory=Limits)
    capacity: Capacity = field(default_factory=lambda: Capacity(limits_configured=False))
    windows: Mapping[WindowName, Mapping[str, ModelWindow]] = field(default_factory=dict)
    concurrency: ConcurrencyProfile = field(default_factory=ConcurrencyProfile)
    #: the serving engine of the latest good page (``None`` before one)
    engine_kind: EngineKind | None = None
    gauge_processes: int = 0
    #: ``vllm:cache_config_info`` and ``vllm:lora_requests_info`` of the latest good page
    cache_config: CacheConfig | None = None
    lora: LoraState | None = None
    #: prefix caching is on but no prompt since start reached one KV block (``block_size``
    #: tokens), so it can never hit (``None``: unknown; see
    #: :func:`specwatch.observe.health.prefix_cache_below_block`)
    prefix_cache_below_block: bool | None = None
    #: the drafter's context limit (tokens) as configured, for the context-limit cause
    drafter_max_model_len: int | None = None
    #: shorter drafts by design, as configured: ``dynamic_k`` / ``structured_output``
    designed_short_drafts: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PairView:
    """FLy vs standard in one window (server views of each target's first model).

    ``acceptance_gain_ratio`` = α_fly − α_std; ``mean_acceptance_length_ratio`` = τ_fly / τ_std;
    ``throughput_ratio`` = generation tokens/s fly / standard, only when both arms serve the
    same traffic (finished requests per second within :data:`THROUGHPUT_RATE_TOLERANCE` of
    each other); otherwise ``None`` with ``throughput_ratio_withheld`` saying why
    (``request_rates_unknown``, ``no_requests``, ``request_rates_differ``). ``None`` when
    undefined.
    """

    standard: str
    fly: str
    acceptance_gain_ratio: float | None = None
    mean_acceptance_length_ratio: float | None = None
    throughput_ratio: float | None = None
    throughput_ratio_withheld: str | None = None


#: Largest relative difference of the two arms' finished requests per second for which the
#: throughput ratio compares like with like (10 %).
THROUGHPUT_RATE_TOLERANCE = 0.1

#: Why the throughput ratio is withheld (:attr:`PairView.throughput_ratio_withheld`).
THROUGHPUT_WITHHELD_REASONS: tuple[str, ...] = (
    "no_requests",
    "request_rates_differ",
    "request_rates_unknown",
)


@dataclass(frozen=True, slots=True)
class ObserveView:
    """What the observe chain publishes: every scraped target and the FLy/standard pair views.

    ``generated_at``: unix seconds of the last rebuild. ``targets`` by name; ``pair`` by window
    (absent without both a fly and a standard target); ``speculation_limit`` from how many
    running requests FLy stops being faster per request than the no-speculation baseline (when
    configured) and than the standard arm (``None`` without both targets).
    Immutable; replaced by swapping one reference.
    """

    generated_at: float
    targets: Mapping[str, TargetSnapshot] = field(default_factory=dict)
    pair: Mapping[WindowName, PairView] = field(default_factory=dict)
    speculation_limit: SpeculationLimit | None = None
