"""The vLLM metric families specwatch reads: the one table the observe parser reads from and the
simulator writes with (names and types as vLLM v0.33 exposes them; old names are fallbacks).

Source: vLLM ``v1/metrics/loggers.py`` and ``docs/design/metrics.md`` (see
``docs/metrics.md`` for what each family is used as).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Family:
    """One vLLM metric family: ``name`` as in ``# TYPE`` (counters with ``_total``), ``kind``
    (``counter|gauge|histogram``) and ``key`` (what specwatch calls it: the key in
    :class:`~specwatch.observe.values.EngineReading`)."""

    name: str
    kind: str
    key: str

    @property
    def base(self) -> str:
        """The name a prometheus_client metric is created with (counters without ``_total``)."""
        return self.name.removesuffix("_total") if self.kind == "counter" else self.name


#: Allow-listed vLLM families: exposition name → (type, key). Old names are fallbacks.
FAMILIES: tuple[Family, ...] = (
    Family("vllm:spec_decode_num_drafts_total", "counter", "drafts"),
    Family("vllm:spec_decode_num_draft_tokens_total", "counter", "draft_tokens"),
    Family("vllm:spec_decode_num_accepted_tokens_total", "counter", "accepted_tokens"),
    Family("vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter", "per_position"),
    # vLLM V0's spec-decode schema: emitted tokens (accepted + bonus) and efficiency; no drafts
    Family("vllm:spec_decode_num_emitted_tokens_total", "counter", "emitted_tokens"),
    Family("vllm:spec_decode_efficiency", "gauge", "spec_decode_efficiency"),
    Family("vllm:generation_tokens_total", "counter", "generation_tokens"),
    Family("vllm:prompt_tokens_total", "counter", "prompt_tokens"),
    # the prompt total by where it came from: local_compute, local_cache_hit, external_kv_transfer
    Family("vllm:prompt_tokens_by_source_total", "counter", "prompt_tokens_by_source"),
    Family("vllm:prefix_cache_queries_total", "counter", "prefix_cache_queries"),
    Family("vllm:prefix_cache_hits_total", "counter", "prefix_cache_hits"),
    Family("vllm:num_preemptions_total", "counter", "preemptions"),
    Family("vllm:request_success_total", "counter", "requests_finished"),
    Family("vllm:num_requests_running", "gauge", "running"),
    Family("vllm:num_requests_waiting", "gauge", "waiting"),
    Family("vllm:num_requests_waiting_by_reason", "gauge", "waiting_by_reason"),
    Family("vllm:kv_cache_usage_perc", "gauge", "kv_cache_usage"),
    Family("vllm:gpu_cache_usage_perc", "gauge", "kv_cache_usage_old"),
    Family("vllm:iteration_tokens_total", "histogram", "engine_steps"),
    Family("vllm:inter_token_latency_seconds", "histogram", "itl"),
    Family("vllm:time_per_output_token_seconds", "histogram", "itl_old"),
    Family("vllm:time_to_first_token_seconds", "histogram", "ttft"),
    Family("vllm:request_prompt_tokens", "histogram", "prompt_length"),
    Family("process_start_time_seconds", "gauge", "process_start_time_seconds"),
)


#: Info gauges of the whole page (no ``model_name``; many labels), read apart from
#: :data:`FAMILIES` by :func:`specwatch.observe.parse.read_info`, never as an engine's values.
CACHE_CONFIG_INFO = "vllm:cache_config_info"
LORA_REQUESTS_INFO = "vllm:lora_requests_info"

#: Family by ``key``.
BY_KEY: dict[str, Family] = {f.key: f for f in FAMILIES}
