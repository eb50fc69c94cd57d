"""What bounds each exported label's values: the number of distinct values of every label of
every family in :mod:`specwatch.export.catalogue` is fixed by configuration or by code, never by
traffic or by what a target serves (a test holds the catalogue and this table to each other)."""

from __future__ import annotations

#: Every label of an exported family → what bounds its values (the number of distinct values
#: is fixed by configuration or by code, never by traffic or by what a target serves).
LABEL_BOUNDS: dict[str, str] = {
    "version": "1 (the running version)",
    "target": "the configured targets",
    "role": "5: standard, fly, baseline, prefill, decode",
    "serving_engine": "2: vllm, sglang",
    "model_name": "scrape.max_models_per_target per target (default 8); further models are "
    'dropped and counted in specwatch_scrape_errors_total{reason="model_cap"}',
    "engine": "scrape.max_engines_per_target per target (default 64); further engines are "
    'dropped and counted in specwatch_scrape_errors_total{reason="engine_cap"}',
    "window": "the configured windows + since_start",
    "position": "num_speculative_tokens K, at most 128 (parse.MAX_POSITIONS)",
    "q": "the fixed latency quantiles (observe.values.QUANTILES)",
    "reason": "a fixed list per family in code (see docs/metrics.md), plus http_<status> of "
    "specwatch_shadow_arm_errors_total (three-digit codes: at most 900) and the exception types "
    "the ledger writer catches; vLLM's waiting reasons at most 16 per engine, the rest summed "
    "into 'other'",
    "standard": "the configured targets",
    "fly": "the configured targets",
    "category": "shadow.max_categories (default 10) + 'other' + '_all'",
    "arm": "3: standard, fly, noise",
    "finish_reason": "7: stop, tool_calls, function_call, length, content_filter, other, none",
    "outcome": "6: both_correct, lost, gained, both_wrong, agree, disagree",
    "alternative": "2: two_sided, loss",
    "hypothesis": "2: no_net_loss, margin",
    "verdict": "4: pays, costs_quality, not_faster, not_decided",
    "band": "paired.load_bands (default 3) + unknown; the speed ratio's 10 powers-of-two bands "
    "(observe.concurrency.BANDS)",
    "state": "3: reached, not_reached, no_data",
    "reference": "2: baseline (when a baseline target is configured), standard",
    "source": "3: mirror, proxy, canary",
    "status": "3: paired, unpaired, excluded",
    "alertname": "the detectors' alerts (fixed in code)",
    "severity": "the detectors' severities (fixed in code)",
    "cause": "specwatch.alerts.causes.CAUSES plus undetermined (fixed in code)",
    "listener": "3: main, proxy, simulator",
    "peer": "the configured Alertmanager URLs (alerting.urls)",
}
