"""Derived health from window deltas (pure): α, τ, per-position acceptance, rates, latency
quantiles, the FLy-vs-standard pair view and capacity / token budget.

Formulas are vLLM's own (vllm-metrics.md §6): ``SpecDecodingLogging`` and the
``SpecDecodingProm`` docstring in ``vllm/v1/spec_decode/metrics.py``; quantiles follow PromQL
``histogram_quantile``; the budget follows ``vllm/config/vllm.py:_set_max_num_scheduled_tokens``
through :func:`specwatch.vllm.budget.budget_limits`.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from itertools import accumulate, pairwise

from specwatch.observe.sglang_health import is_sglang, sglang_capacity, sglang_health
from specwatch.observe.values import (
    COUNTER_KEYS,
    PROMPT_SOURCES,
    QUANTILES,
    THROUGHPUT_RATE_TOLERANCE,
    CacheConfig,
    Capacity,
    Delta,
    EngineKey,
    Health,
    Histogram,
    Limits,
    ModelWindow,
    PairView,
    SpeculativeTokensSource,
)
from specwatch.vllm.budget import budget_limits, required_batched_tokens
from specwatch.vllm.methods import method_slots, regime_for_version


def _div(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den == 0:
        return None
    return num / den


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Quantile ``q`` (0..1) of a cumulative histogram, as PromQL ``histogram_quantile``.

    ``buckets``: (upper bound, cumulative count) sorted by bound, the last bound ``+inf``.
    Linear interpolation inside the bucket holding rank ``q·total``; the first bucket starts at 0
    (when its bound is positive); a rank in the ``+Inf`` bucket returns the highest finite bound.
    ``None`` when there are no observations, fewer than two buckets, or no ``+Inf`` bucket.
    """
    return _quantiles_of(buckets, (q,))[0]


def _quantiles_of(
    buckets: Sequence[tuple[float, float]], qs: Sequence[float]
) -> list[float | None]:
    if len(buckets) < 2 or buckets[-1][0] != math.inf:
        return [None] * len(qs)
    # cumulative counts made monotonic, as PromQL does for float noise
    counts = list(accumulate([c for _, c in buckets], max))
    total = counts[-1]
    out: list[float | None] = []
    for q in qs:
        if math.isnan(q) or total <= 0:
            out.append(None)
            continue
        if q < 0:
            out.append(-math.inf)
            continue
        if q > 1:
            out.append(math.inf)
            continue
        rank = q * total
        index = bisect_left(counts, rank)
        if index == len(buckets) - 1:
            out.append(buckets[-2][0])
            continue
        if index == 0 and buckets[0][0] <= 0:
            out.append(buckets[0][0])
            continue
        start = 0.0 if index == 0 else buckets[index - 1][0]
        prev = 0.0 if index == 0 else counts[index - 1]
        end = buckets[index][0]
        width = counts[index] - prev
        out.append(end if width == 0 else start + (end - start) * ((rank - prev) / width))
    return out


def _quantiles(hist: Histogram | None) -> dict[float, float | None]:
    if hist is None:
        return {}
    return dict(zip(QUANTILES, _quantiles_of(hist.buckets, QUANTILES), strict=True))


def speculative_tokens(
    observed: int | None, configured: int | None
) -> tuple[int, SpeculativeTokensSource] | None:
    """Which K (num_speculative_tokens) applies, and where it came from: the one precedence
    rule, used for :class:`Health` and :class:`Capacity` alike. ``None`` when neither is known.

    The page wins: ``observed`` (the number of ``position`` labels of
    ``vllm:spec_decode_num_accepted_tokens_per_pos``) else ``configured`` (the target's
    settings). vLLM creates all K position children when the engine starts, at 0, so the labels
    are the server's own K before any traffic, while the configured value is the operator's copy
    of it, which goes stale when the server is redeployed with another K; the token budget and
    the detectors must judge the K the server runs. The configured K fills in where the page has
    no labels (vLLM V0, a page without spec-decode families). This is also the order
    ``specwatch_num_speculative_tokens`` has always been documented with ("position labels,
    else configured"), so that exported value is unchanged.
    """
    if observed is not None:
        return observed, "observed"
    if configured is not None:
        return configured, "configured"
    return None


def _coverage(
    accepted: float | None, drafts: float | None, generation: float | None
) -> float | None:
    """(Δaccepted + Δdrafts) / Δgeneration, at most 1 (see :attr:`Health.speculation_coverage`)."""
    if accepted is None or drafts is None:
        return None
    share = _div(accepted + drafts, generation)
    return None if share is None else min(share, 1.0)


def _scheduled(c: Mapping[str, float | None], accepted: float | None) -> float | None:
    """Tokens scheduled per engine step (:attr:`Health.scheduled_tokens_per_step`)."""
    prompt = c.get("prompt_tokens_local_compute")
    if prompt is None:
        prompt = c.get("prompt_tokens")
    gen, drafted = c.get("generation_tokens"), c.get("draft_tokens")
    if prompt is None or gen is None:
        return None
    return _div(prompt + gen + (drafted or 0.0) - (accepted or 0.0), c.get("engine_steps"))


def prefix_cache_below_block(cache: CacheConfig | None, prompts: Histogram | None) -> bool | None:
    """Whether prefix caching is on and every prompt in ``prompts`` (bucket increases of
    ``vllm:request_prompt_tokens``) is shorter than one KV block of ``cache.block_size`` tokens:
    vLLM caches whole blocks only, so such a prefix cache never hits. ``None`` when the cache
    config, its block size or the prompts are unknown or no prompt finished; ``False`` with
    prefix caching off."""
    if cache is None or cache.block_size is None or prompts is None or not prompts.buckets:
        return None
    if cache.enable_prefix_caching is False:
        return False
    total = prompts.buckets[-1][1]
    if total <= 0:
        return None
    below = max((c for le, c in prompts.buckets if le < cache.block_size), default=0.0)
    return below >= total


def derive_health(delta: Delta, *, configured_k: int | None = None) -> Health:
    """Turn one :class:`Delta` into :class:`Health` (see its docstring for every formula).

    K by :func:`speculative_tokens` of ``delta.num_speculative_tokens`` (the ``position``
    labels) and ``configured_k``; a V0 page with neither estimates it from its efficiency gauge.
    With zero drafts α, τ, ℓ and per-position values are ``None``, never 0.
    """
    c = delta.counters
    drafts, draft_tokens, accepted = (
        c.get("drafts"),
        c.get("draft_tokens"),
        c.get("accepted_tokens"),
    )
    steps = c.get("engine_steps")
    interval = delta.interval_seconds
    chosen = speculative_tokens(delta.num_speculative_tokens, configured_k)
    k = None if chosen is None else chosen[0]
    schema = _schema(c)
    if schema == "v0":
        if k is None:
            k = _v0_k(c, delta.gauges.get("spec_decode_efficiency"))
        # V0 has no drafts counter: every draft is K tokens, so drafts = draft tokens / K
        drafts = None if k is None or draft_tokens is None else draft_tokens / k
    positions = max(delta.per_position) + 1 if delta.per_position else 0
    per_pos: list[float | None] = []
    cond: list[float | None] = []
    for i in range(positions):
        value = delta.per_position.get(i)
        per_pos.append(_div(value, drafts))
        prev = drafts if i == 0 else delta.per_position.get(i - 1)
        cond.append(_div(value, prev))
    tau_num = _div(accepted, drafts)
    if schema == "v0":
        # V0: tau = emitted / drafts (emitted = accepted + one bonus token per draft that
        # reached it); 1 + accepted / drafts would overcount
        tau = _div(c.get("emitted_tokens"), drafts)
        tau_num = None if tau is None else tau - 1.0

    def rate(name: str) -> float | None:
        return _div(c.get(name), interval)

    def drafts_rate() -> float | None:
        return _div(drafts, interval)

    g = delta.gauges
    h = Health(
        interval_seconds=interval,
        drafts=drafts,
        draft_tokens=draft_tokens,
        accepted_tokens=accepted,
        generation_tokens=c.get("generation_tokens"),
        engine_steps=steps,
        preemptions=c.get("preemptions"),
        requests_finished=c.get("requests_finished"),
        acceptance_rate=_div(accepted, draft_tokens),
        mean_acceptance_length=None if tau_num is None else 1.0 + tau_num,
        mean_draft_length=_div(draft_tokens, drafts),
        per_position_acceptance_rate=tuple(per_pos),
        per_position_conditional_acceptance_rate=tuple(cond),
        num_speculative_tokens=k,
        generation_tokens_per_second=rate("generation_tokens"),
        accepted_tokens_per_second=rate("accepted_tokens"),
        drafts_per_second=drafts_rate(),
        drafts_per_step=_div(drafts, steps),
        engine_steps_per_second=rate("engine_steps"),
        preemptions_per_second=rate("preemptions"),
        requests_finished_per_second=rate("requests_finished"),
        prompt_tokens_per_second=rate("prompt_tokens"),
        inter_token_latency_seconds=_quantiles(delta.histograms.get("itl")),
        time_to_first_token_seconds=_quantiles(delta.histograms.get("ttft")),
        num_requests_running=g.get("running"),
        num_requests_waiting=g.get("waiting"),
        num_requests_waiting_by_reason=dict(delta.waiting_by_reason),
        kv_cache_usage=g.get("kv_cache_usage"),
        inter_token_latency_mean_seconds=_div(c.get("itl_sum"), c.get("itl_count")),
        time_to_first_token_mean_seconds=_div(c.get("ttft_sum"), c.get("ttft_count")),
        spec_decode_schema=schema,
        speculation_coverage=_coverage(accepted, drafts, c.get("generation_tokens")),
        prompt_tokens_by_source={
            src: v for src in PROMPT_SOURCES if (v := c.get(f"prompt_tokens_{src}")) is not None
        },
        prefix_cache_hit_rate=_div(c.get("prefix_cache_hits"), c.get("prefix_cache_queries")),
        scheduled_tokens_per_step=_scheduled(c, accepted),
        prompt_length=delta.histograms.get("prompt_length"),
    )
    if is_sglang(g):
        h = sglang_health(h, delta, configured_k=configured_k)
    return withhold_invalid(h)


def _schema(c: Mapping[str, float | None]) -> str | None:
    """``"v1"`` with a drafts counter, ``"v0"`` with V0's emitted-tokens counter and none,
    ``None`` without spec-decode counters."""
    if c.get("drafts") is not None:
        return "v1"
    if c.get("emitted_tokens") is not None:
        return "v0"
    return None


def _v0_k(c: Mapping[str, float | None], efficiency: float | None) -> int | None:
    """K of a V0 server from its ``vllm:spec_decode_efficiency`` gauge, when not configured.

    V0: efficiency = emitted / (drafts (K + 1)) with drafts = draft tokens / K, so
    K / (K + 1) = efficiency · draft tokens / emitted. The gauge is rounded (3 digits), so K is
    accepted only within 0.1 of a whole number ≥ 1; otherwise ``None`` (τ unknown).
    """
    emitted, draft_tokens = c.get("emitted_tokens"), c.get("draft_tokens")
    if efficiency is None or not emitted or not draft_tokens:
        return None
    x = efficiency * draft_tokens / emitted
    if not 0 < x < 1:
        return None
    k = x / (1 - x)
    whole = round(k)
    return whole if whole >= 1 and abs(k - whole) <= 0.1 else None


_COUNT_FIELDS = (
    "drafts",
    "draft_tokens",
    "accepted_tokens",
    "generation_tokens",
    "engine_steps",
    "preemptions",
    "requests_finished",
)
_RATE_FIELDS = (
    "generation_tokens_per_second",
    "accepted_tokens_per_second",
    "drafts_per_second",
    "drafts_per_step",
    "engine_steps_per_second",
    "preemptions_per_second",
    "requests_finished_per_second",
    "prompt_tokens_per_second",
)


def withhold_invalid(h: Health) -> Health:
    """``h`` with every value that cannot be right set to ``None`` and its reason recorded in
    ``withheld``: α > 1 (``acceptance_above_one``; per-position rates above 1 too), τ > K + 1
    (``tau_above_k_plus_one``), ℓ > K (``draft_length_above_k``), a negative count or rate
    (``negative_rate``). K unknown: τ and ℓ are not judged. Returns ``h`` itself when valid."""
    changes: dict[str, object] = {}
    reasons: set[str] = set()
    eps = 1e-9
    if h.acceptance_rate is not None and h.acceptance_rate > 1 + eps:
        changes["acceptance_rate"] = None
        reasons.add("acceptance_above_one")
    if any(v is not None and v > 1 + eps for v in h.per_position_acceptance_rate):
        changes["per_position_acceptance_rate"] = tuple(
            None if v is not None and v > 1 + eps else v for v in h.per_position_acceptance_rate
        )
        reasons.add("acceptance_above_one")
    k = h.num_speculative_tokens
    tau = h.mean_acceptance_length
    if k is not None and tau is not None and tau > k + 1 + eps:
        changes["mean_acceptance_length"] = None
        reasons.add("tau_above_k_plus_one")
    ell = h.mean_draft_length
    if k is not None and ell is not None and ell > k + eps:
        changes["mean_draft_length"] = None
        reasons.add("draft_length_above_k")
    for name in (*_COUNT_FIELDS, *_RATE_FIELDS):
        v = getattr(h, name)
        if v is not None and v < 0:
            changes[name] = None
            reasons.add("negative_rate")
    if tau is not None and tau < 1:
        changes["mean_acceptance_length"] = None
        reasons.add("negative_rate")
    if not reasons:
        return h
    reasons.update(h.withheld)
    return replace(h, withheld=tuple(sorted(reasons)), **changes)  # type: ignore[arg-type]


def _sum_opt(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _same_bounds(parts: Sequence[Histogram]) -> tuple[float, ...] | None:
    """The bucket bounds of ``parts`` when every one has the same bounds, distinct and
    ascending (as parsed pages give them), else ``None``."""
    first = [le for le, _ in parts[0].buckets]
    if any(a >= b for a, b in pairwise(first)):
        return None
    for h in parts[1:]:
        if [le for le, _ in h.buckets] != first:
            return None
    return tuple(first)


def _column_sums(parts: Sequence[Histogram]) -> list[float]:
    """Per bucket, the sum of the parts' counts, added in the parts' order from 0.0 (the same
    float sums as adding bucket by bucket)."""
    sums = [0.0] * len(parts[0].buckets)
    for h in parts:
        sums = [t + v for t, (_, v) in zip(sums, h.buckets, strict=True)]
    return sums


def sum_deltas(deltas: Sequence[Delta]) -> Delta:
    """Server view: counters, per-position, bucket increases, running/waiting summed over engines;
    KV-cache usage averaged; K the largest; interval the longest of the engines'.

    A counter is the sum over the engines that have it (``None`` when none has it).
    """
    counters = {name: _sum_opt(d.counters.get(name) for d in deltas) for name in COUNTER_KEYS}
    per_pos: dict[int, float] = {}
    for d in deltas:
        for pos, v in d.per_position.items():
            per_pos[pos] = per_pos.get(pos, 0.0) + v
    hists: dict[str, Histogram] = {}
    for name in {h for d in deltas for h in d.histograms}:
        parts = [d.histograms[name] for d in deltas if name in d.histograms]
        same = _same_bounds(parts)
        if same is not None:
            hists[name] = Histogram(tuple(zip(same, _column_sums(parts), strict=True)))
            continue
        common = set.intersection(*(set(le for le, _ in h.buckets) for h in parts))
        summed: dict[float, float] = {}
        for h in parts:
            for le, v in h.buckets:
                if le in common:
                    summed[le] = summed.get(le, 0.0) + v
        hists[name] = Histogram(tuple(sorted(summed.items())))
    gauges: dict[str, float] = {}
    for name in ("running", "waiting"):
        total = _sum_opt(d.gauges.get(name) for d in deltas)
        if total is not None:
            gauges[name] = total
    kv = [d.gauges["kv_cache_usage"] for d in deltas if "kv_cache_usage" in d.gauges]
    if kv:
        gauges["kv_cache_usage"] = sum(kv) / len(kv)
    for name in sorted({n for d in deltas for n in d.gauges if n.startswith("sglang_")}):
        # SGLang's interval gauges and constants: the mean over the DP schedulers that have them
        values = [d.gauges[name] for d in deltas if name in d.gauges]
        gauges[name] = sum(values) / len(values)
    by_reason: dict[str, float] = {}
    for d in deltas:
        for r, v in d.waiting_by_reason.items():
            by_reason[r] = by_reason.get(r, 0.0) + v
    ks = [d.num_speculative_tokens for d in deltas if d.num_speculative_tokens is not None]
    intervals = [d.interval_seconds for d in deltas if d.interval_seconds is not None]
    return Delta(
        interval_seconds=max(intervals) if intervals else None,
        counters=counters,
        per_position=dict(sorted(per_pos.items())),
        histograms=hists,
        gauges=gauges,
        waiting_by_reason=dict(sorted(by_reason.items())),
        num_speculative_tokens=max(ks) if ks else None,
    )


def model_windows(
    deltas: Mapping[EngineKey, Delta], *, configured_k: int | None = None
) -> dict[str, ModelWindow]:
    """Group per-engine deltas by model_name → :class:`ModelWindow` (server sum + per engine)."""
    by_model: dict[str, dict[str, Delta]] = {}
    for (model, engine), d in deltas.items():
        by_model.setdefault(model, {})[engine] = d
    out: dict[str, ModelWindow] = {}
    for model in sorted(by_model):
        engines = by_model[model]
        per_engine = {
            e: derive_health(engines[e], configured_k=configured_k) for e in sorted(engines)
        }
        if len(engines) == 1:
            server_health = next(iter(per_engine.values()))  # a sum over one engine is itself
        else:
            server = sum_deltas([engines[e] for e in sorted(engines)])
            server_health = derive_health(server, configured_k=configured_k)
        out[model] = ModelWindow(server=server_health, engines=per_engine)
    return out


def pair_view(
    standard_name: str, standard: Health | None, fly_name: str, fly: Health | None
) -> PairView:
    """FLy minus standard α, τ_fly / τ_std and the generation-throughput ratio (``None``:
    undefined). The throughput ratio compares like with like only: it is given when both arms
    finished requests at rates within :data:`THROUGHPUT_RATE_TOLERANCE` of each other (the same
    traffic; prompt tokens per second when neither finished a request), else withheld with the
    reason in ``throughput_ratio_withheld``."""
    gain = None
    tau_ratio = None
    tput = None
    withheld = None
    if standard is not None and fly is not None:
        if standard.acceptance_rate is not None and fly.acceptance_rate is not None:
            gain = fly.acceptance_rate - standard.acceptance_rate
        tau_ratio = _div(fly.mean_acceptance_length, standard.mean_acceptance_length)
        withheld = _traffic_differs(standard, fly)
        if withheld is None:
            tput = _div(fly.generation_tokens_per_second, standard.generation_tokens_per_second)
    return PairView(standard_name, fly_name, gain, tau_ratio, tput, withheld)


def _traffic_differs(standard: Health, fly: Health) -> str | None:
    """``None`` when both arms serve the same traffic: finished requests per second within
    :data:`THROUGHPUT_RATE_TOLERANCE` of each other (when neither finished any request in the
    window, prompt tokens per second instead); else the reason the ratio is withheld."""
    pairs = (
        (standard.requests_finished_per_second, fly.requests_finished_per_second),
        (standard.prompt_tokens_per_second, fly.prompt_tokens_per_second),
    )
    for a, b in pairs:
        if a is None or b is None:
            return "request_rates_unknown"
        if a <= 0 and b <= 0:
            continue  # nothing finished on either arm: judge by admitted prompt tokens
        if abs(a - b) > THROUGHPUT_RATE_TOLERANCE * max(a, b):
            return "request_rates_differ"
        return None
    return "no_requests"


def capacity(
    limits: Limits, running_per_engine: Iterable[float], *, observed_k: int | None = None
) -> Capacity:
    """Running vs ``max_num_seqs`` and the token budget for the configured method and version.

    ``running_per_engine``: latest ``num_requests_running`` of each engine (the maximum is used:
    every engine has its own scheduler and limits). K by :func:`speculative_tokens` of
    ``observed_k`` (the page's ``position`` labels) and the configured one, kept with its source;
    S, the slots per request and the batched tokens N · (1 + K + S) need K and the method
    (and N). ``limits_configured`` needs N, B, K and the method; otherwise budget fields are
    ``None``. An SGLang target (``limits.engine``) takes SGLang's rule
    (:func:`specwatch.observe.sglang_health.sglang_capacity`). Raises ``ValueError`` for an
    unknown method or unreadable version (settings
    validate both).
    """
    running_values = list(running_per_engine)
    running = max(running_values) if running_values else None
    n, b = limits.max_num_seqs, limits.max_num_batched_tokens
    chosen = speculative_tokens(observed_k, limits.num_speculative_tokens)
    k, source = (None, None) if chosen is None else chosen
    if limits.engine == "sglang":
        return sglang_capacity(limits, running, k, source)
    s: int | None = None
    per_request: int | None = None
    need: int | None = None
    if k is not None and limits.method is not None:
        s = method_slots(
            limits.method,
            k,
            parallel_drafting=limits.parallel_drafting,
            regime=regime_for_version(limits.vllm_version),
        ).extra_batch_slots
        per_request = required_batched_tokens(1, k, s)
        need = None if n is None else required_batched_tokens(n, k, s)
    known = Capacity(
        limits_configured=False,
        max_num_seqs=n,
        max_num_batched_tokens=b,
        num_requests_running=running,
        running_to_max_seqs_ratio=_div(running, n),
        running_gap_requests=n - running if n is not None and running is not None else None,
        num_speculative_tokens=k,
        num_speculative_tokens_source=source,
        extra_batch_slots=s,
        slots_per_request=per_request,
        required_batched_tokens=need,
    )
    if n is None or b is None or k is None or limits.method is None:
        return known
    lim = budget_limits(
        max_num_batched_tokens=b,
        max_num_seqs=n,
        num_speculative_tokens=k,
        method=limits.method,
        parallel_drafting=limits.parallel_drafting,
        regime=regime_for_version(limits.vllm_version),
    )
    return replace(
        known,
        limits_configured=True,
        admission_cap_requests=lim.admission_cap,
        decode_full_per_step_requests=lim.decode_full_per_step,
        budget_bound=lim.budget_bound,
    )
