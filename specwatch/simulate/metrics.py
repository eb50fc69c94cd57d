"""vLLM 0.33 ``/metrics`` for the simulator, in its own prometheus_client ``CollectorRegistry``.

Names, types, labels and default buckets follow ``vllm/v1/metrics/loggers.py``,
``vllm/v1/spec_decode/metrics.py`` and ``vllm/v1/metrics/buckets.py`` (vllm-metrics.md §2-§3).
Counters are declared without ``_total`` so prometheus_client exposes ``<name>_total`` plus a
``<name>_created`` gauge, as vLLM does outside multiprocess mode. A restart replaces the registry
(counters start from 0 with new ``_created`` values).
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from specwatch.simulate.config import SimConfig
from specwatch.simulate.engine_core import SimRequest, StepStats
from specwatch.vllm.families import BY_KEY, CACHE_CONFIG_INFO

REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
ITERATION_TOKENS_BUCKETS = (
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
)  # fmt: skip
PARAMS_N_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0)
PREEMPTION_BUCKETS = (1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0)
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
#: ``vllm:admission_rejections_total{reason}`` (vLLM ``loggers.py`` ``ADMISSION_REASONS``).
ADMISSION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")
#: what vLLM 0.32 (prometheus_client 0.21+) sends for ``/metrics``.
CONTENT_TYPE = "text/plain; version=1.0.0; charset=utf-8"


#: ``vllm:prompt_tokens_cached_by_source_total{source}`` (vLLM 0.32).
CACHED_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
_LAB = ("model_name", "engine")
_MFU = "(for Model Flops Utilization calculations)."
#: vLLM 0.32 counters with nothing to count in the simulator: name, help, labels.
_ZERO_COUNTERS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("vllm:estimated_flops_per_gpu",
     f"Estimated number of floating point operations per GPU {_MFU}", _LAB),
    ("vllm:estimated_read_bytes_per_gpu",
     f"Estimated number of bytes read from memory per GPU {_MFU}", _LAB),
    ("vllm:estimated_write_bytes_per_gpu",
     f"Estimated number of bytes written to memory per GPU {_MFU}", _LAB),
    ("vllm:external_prefix_cache_queries",
     "External prefix cache queries from KV connector cross-instance cache sharing, in terms of "
     "number of queried tokens.", _LAB),
    ("vllm:external_prefix_cache_hits",
     "External prefix cache hits from KV connector cross-instance cache sharing, in terms of "
     "number of cached tokens.", _LAB),
    ("vllm:mm_cache_queries",
     "Multi-modal cache queries, in terms of number of queried items.", _LAB),
    ("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.", _LAB),
    ("vllm:prompt_tokens_cached_by_source",
     "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host "
     "(offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
     "external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + "
     "vllm:external_prefix_cache_hits.", (*_LAB, "source")),
)  # fmt: skip
#: vLLM 0.32's ``vllm:cache_config_info`` labels (besides ``engine``), as the real server sends
#: them for a CPU target without KV offloading; :func:`cache_config_values` fills them.
CACHE_CONFIG_LABELS = (
    "_block_size_resolved", "block_size", "cache_dtype", "cache_hit_alignment_tokens",
    "effective_attention_block_size", "enable_mamba_shared_prefix_checkpoint",
    "enable_prefix_caching", "gpu_memory_utilization", "hash_block_size", "is_attention_free",
    "kv_cache_dtype_skip_layers", "kv_cache_layout", "kv_cache_max_concurrency",
    "kv_cache_memory_bytes", "kv_cache_size_tokens", "kv_offloading_backend",
    "kv_offloading_size", "kv_sharing_fast_prefill", "mamba_block_size", "mamba_cache_dtype",
    "mamba_cache_mode", "mamba_page_size_padded", "mamba_ssm_cache_dtype", "num_cpu_blocks",
    "num_gpu_blocks", "num_gpu_blocks_override", "prefix_cache_retention_interval",
    "prefix_caching_hash_algo", "prefix_match_unit", "replayssm_buffer_len",
    "skip_page_size_padded", "sliding_window", "swa_bounded_replay", "use_kda_recoverssm",
    "use_replayssm", "user_specified_block_size",
)  # fmt: skip


def cache_config_values(c: SimConfig) -> dict[str, str]:
    """The ``vllm:cache_config_info`` label values of a simulated server: its block size and
    block count, the KV size and concurrency they imply, vLLM 0.32's defaults for the rest."""
    tokens = c.num_gpu_blocks * c.block_size
    values = {
        "_block_size_resolved": "True",
        "block_size": str(c.block_size),
        "cache_dtype": "auto",
        "effective_attention_block_size": str(c.block_size),
        "enable_mamba_shared_prefix_checkpoint": "False",
        "enable_prefix_caching": "True",
        "gpu_memory_utilization": "0.92",
        "is_attention_free": "False",
        "kv_cache_dtype_skip_layers": "[]",
        "kv_cache_max_concurrency": str(tokens / c.max_model_len),
        "kv_cache_memory_bytes": "None",
        "kv_cache_size_tokens": str(tokens),
        "kv_offloading_backend": "native",
        "kv_sharing_fast_prefill": "False",
        "mamba_cache_dtype": "auto",
        "mamba_cache_mode": "none",
        "mamba_ssm_cache_dtype": "auto",
        "num_gpu_blocks": str(c.num_gpu_blocks),
        "prefix_cache_retention_interval": "0",
        "prefix_caching_hash_algo": "sha256",
        "replayssm_buffer_len": "16",
        "swa_bounded_replay": "True",
        "use_kda_recoverssm": "False",
        "use_replayssm": "False",
        "user_specified_block_size": "False",
    }
    return {k: values.get(k, "None") for k in CACHE_CONFIG_LABELS}


def request_tokens_buckets(max_model_len: int) -> tuple[float, ...]:
    """1-2-5 series up to ``max_model_len`` (vLLM ``build_1_2_5_buckets``)."""
    out: list[float] = []
    exp = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exp
            if v > max_model_len:
                return tuple(out)
            out.append(float(v))
        exp += 1


class SimMetrics:
    """The simulator's ``/metrics``.

    Implements :class:`specwatch.simulate.engine_core.MetricsSink`.
    """

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.registry = CollectorRegistry()
        self._build()

    def reset(self) -> None:
        """Restart: a fresh registry, every counter back at 0."""
        self.registry = CollectorRegistry()
        self._build()

    def exposition(self) -> bytes:
        """The text exposition (format 0.0.4)."""
        return generate_latest(self.registry)

    def _build(self) -> None:
        c = self.config
        r = self.registry
        lab = ("model_name", "engine")

        def gauge(name: str, doc: str, labels: Sequence[str] = lab) -> Gauge:
            return Gauge(name, doc, labels, registry=r, multiprocess_mode="mostrecent")

        def counter(name: str, doc: str, labels: Sequence[str] = lab) -> Counter:
            return Counter(name, doc, labels, registry=r)

        def histogram(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            return Histogram(name, doc, lab, buckets=buckets, registry=r)

        self.running = gauge(
            BY_KEY["running"].base, "Number of requests in model execution batches."
        )
        self.waiting = gauge(BY_KEY["waiting"].base, "Number of requests waiting to be processed.")
        self.waiting_by_reason = gauge(
            BY_KEY["waiting_by_reason"].base,
            "Number of requests waiting, by reason.",
            [*lab, "reason"],
        )
        self.kv_usage = gauge(
            BY_KEY["kv_cache_usage"].base, "KV-cache usage. 1 means 100 percent usage."
        )
        cache_labels = ["engine", *CACHE_CONFIG_LABELS]
        self.cache_info = gauge(
            CACHE_CONFIG_INFO,
            "Information of the LLMEngine CacheConfig",
            cache_labels,
        )
        self.sleep_state = gauge(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is "
            "awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level "
            "2.",
            [*lab, "sleep_state"],
        )
        # families vLLM 0.32 exports that the simulated engine never moves (created at 0)
        self.zero_counters = [counter(name, doc, labels) for name, doc, labels in _ZERO_COUNTERS]
        self.preemptions = counter(
            BY_KEY["preemptions"].base, "Cumulative number of preemption from the engine."
        )
        self.prompt_tokens = counter(
            BY_KEY["prompt_tokens"].base, "Number of prefill tokens processed."
        )
        self.prompt_by_source = counter(
            BY_KEY["prompt_tokens_by_source"].base,
            "Number of prompt tokens by source.",
            [*lab, "source"],
        )
        self.prompt_cached = counter(
            "vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external)."
        )
        self.generation_tokens = counter(
            BY_KEY["generation_tokens"].base, "Number of generation tokens processed."
        )
        self.prefix_queries = counter(
            BY_KEY["prefix_cache_queries"].base,
            "Prefix cache queries, in terms of number of queried tokens.",
        )
        self.prefix_hits = counter(
            BY_KEY["prefix_cache_hits"].base,
            "Prefix cache hits, in terms of number of cached tokens.",
        )
        # frontend admission: one series per reason, no engine label, created at 0
        admission = counter(
            "vllm:admission_rejections",
            "Number of admission attempts rejected by a queue limit, by reason.",
            ["model_name", "reason"],
        )
        self.admission_rejections = {
            reason: admission.labels(c.served_model_name, reason) for reason in ADMISSION_REASONS
        }
        self.success = counter(
            BY_KEY["requests_finished"].base,
            "Count of successfully processed requests.",
            [*lab, "finished_reason"],
        )
        rt = request_tokens_buckets(c.max_model_len)
        self.h_prompt = histogram(
            BY_KEY["prompt_length"].base, "Number of prefill tokens processed.", rt
        )
        self.h_gen = histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", rt
        )
        self.h_iter = histogram(
            BY_KEY["engine_steps"].base,
            "Histogram of number of tokens per engine_step.",
            ITERATION_TOKENS_BUCKETS,
        )
        self.h_max_gen = histogram(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            rt,
        )
        self.h_n = histogram(
            "vllm:request_params_n", "Histogram of the n request parameter.", PARAMS_N_BUCKETS
        )
        self.h_max_tokens = histogram(
            "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", rt
        )
        self.h_ttft = histogram(
            BY_KEY["ttft"].base, "Histogram of time to first token in seconds.", TTFT_BUCKETS
        )
        self.h_itl = histogram(
            BY_KEY["itl"].base, "Histogram of inter-token latency in seconds.", ITL_BUCKETS
        )
        self.h_tpot = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            ITL_BUCKETS,
        )
        self.h_e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.h_queue = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.h_inference = histogram(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.h_prefill = histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.h_decode = histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.h_preempt = histogram(
            "vllm:request_num_preemptions",
            "Number of preemptions per finished request.",
            PREEMPTION_BUCKETS,
        )
        self.h_kv_computed = histogram(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            rt,
        )
        # vLLM serves the default registry, which carries these collectors too
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        self.spec = c.speculative
        if self.spec:
            self.sd_drafts = counter(BY_KEY["drafts"].base, "Number of spec decoding drafts.")
            self.sd_draft_tokens = counter(BY_KEY["draft_tokens"].base, "Number of draft tokens.")
            self.sd_accepted = counter(BY_KEY["accepted_tokens"].base, "Number of accepted tokens.")
            self.sd_per_pos = counter(
                BY_KEY["per_position"].base,
                "Accepted tokens per draft position.",
                [*lab, "position"],
            )
        name = c.served_model_name
        self._eng: list[_EngineChildren] = []
        for e in range(c.data_parallel_size):
            self._eng.append(_EngineChildren(self, name, str(e)))
            self.cache_info.labels(engine=str(e), **cache_config_values(c)).set(1)
            for state, value in (("awake", 1), ("weights_offloaded", 0), ("discard_all", 0)):
                self.sleep_state.labels(name, str(e), state).set(value)

    def on_admission_rejected(self, reason: str) -> None:
        """The frontend refused a request (``reason`` in :data:`ADMISSION_REASONS`)."""
        self.admission_rejections[reason].inc()

    # -- MetricsSink ------------------------------------------------------------------------
    def on_step(self, engine: int, stats: StepStats) -> None:
        ch = self._eng[engine]
        if stats.prompt_tokens:
            ch.prompt_tokens.inc(stats.prompt_tokens)
            ch.prompt_local.inc(stats.prompt_tokens)
        if stats.generation_tokens:
            ch.generation_tokens.inc(stats.generation_tokens)
        if stats.preemptions:
            ch.preemptions.inc(stats.preemptions)
        ch.prefix_queries.inc(stats.prompt_tokens)
        ch.iter_tokens.observe(stats.computed_prompt_tokens + stats.generation_tokens)
        if self.spec and stats.num_drafts:
            ch.sd_drafts.inc(stats.num_drafts)
            ch.sd_draft_tokens.inc(stats.num_draft_tokens)
            ch.sd_accepted.inc(stats.num_accepted_tokens)
            for i, v in enumerate(stats.accepted_per_pos):
                if v:
                    ch.sd_per_pos[i].inc(v)

    def on_output(self, engine: int, req: SimRequest, now: float, first: bool) -> None:
        ch = self._eng[engine]
        if first:
            ch.ttft.observe(max(now - req.arrival, 0.0))
        elif req.last_token is not None:
            ch.itl.observe(max(now - req.last_token, 0.0))

    def on_finished(self, engine: int, req: SimRequest, now: float) -> None:
        ch = self._eng[engine]
        reason = req.finish_reason or "abort"
        ch.success[reason if reason in ch.success else "abort"].inc()
        ch.e2e.observe(max(now - req.arrival, 0.0))
        sched = req.first_scheduled if req.first_scheduled is not None else now
        ch.queue.observe(max(sched - req.arrival, 0.0))
        ch.inference.observe(max(now - sched, 0.0))
        first = req.first_token if req.first_token is not None else now
        last = req.last_token if req.last_token is not None else now
        ch.prefill.observe(max(first - sched, 0.0))
        ch.decode.observe(max(last - first, 0.0))
        n_gen = len(req.output)
        ch.tpot.observe((last - first) / (n_gen - 1) if n_gen > 1 else 0.0)
        ch.h_prompt.observe(req.prompt_len)
        ch.h_gen.observe(n_gen)
        ch.h_max_gen.observe(n_gen)
        ch.h_n.observe(1)
        if req.max_tokens_set:
            ch.h_max_tokens.observe(req.max_tokens)
        ch.h_preempt.observe(req.num_preemptions)
        ch.h_kv_computed.observe(req.prompt_len)

    def on_queue(self, engine: int, running: int, waiting: int, kv_usage: float) -> None:
        ch = self._eng[engine]
        ch.running.set(running)
        ch.waiting.set(waiting)
        ch.waiting_capacity.set(waiting)
        ch.kv.set(kv_usage)


class _EngineChildren:
    """Label children of one engine, bound once (observing through them is cheap)."""

    def __init__(self, m: SimMetrics, name: str, engine: str) -> None:
        self.running = m.running.labels(name, engine)
        self.waiting = m.waiting.labels(name, engine)
        self.waiting_capacity = m.waiting_by_reason.labels(name, engine, "capacity")
        m.waiting_by_reason.labels(name, engine, "deferred").set(0)
        self.kv = m.kv_usage.labels(name, engine)
        self.preemptions = m.preemptions.labels(name, engine)
        self.prompt_tokens = m.prompt_tokens.labels(name, engine)
        self.prompt_local = m.prompt_by_source.labels(name, engine, "local_compute")
        m.prompt_by_source.labels(name, engine, "local_cache_hit")
        m.prompt_by_source.labels(name, engine, "external_kv_transfer")
        m.prompt_cached.labels(name, engine)
        self.generation_tokens = m.generation_tokens.labels(name, engine)
        self.prefix_queries = m.prefix_queries.labels(name, engine)
        m.prefix_hits.labels(name, engine)
        for fam, (_, _, labels) in zip(m.zero_counters, _ZERO_COUNTERS, strict=True):
            if "source" in labels:
                for source in CACHED_SOURCES:
                    fam.labels(name, engine, source)
            else:
                fam.labels(name, engine)
        self.success = {r: m.success.labels(name, engine, r) for r in FINISHED_REASONS}
        self.h_prompt = m.h_prompt.labels(name, engine)
        self.h_gen = m.h_gen.labels(name, engine)
        self.iter_tokens = m.h_iter.labels(name, engine)
        self.h_max_gen = m.h_max_gen.labels(name, engine)
        self.h_n = m.h_n.labels(name, engine)
        self.h_max_tokens = m.h_max_tokens.labels(name, engine)
        self.ttft = m.h_ttft.labels(name, engine)
        self.itl = m.h_itl.labels(name, engine)
        self.tpot = m.h_tpot.labels(name, engine)
        self.e2e = m.h_e2e.labels(name, engine)
        self.queue = m.h_queue.labels(name, engine)
        self.inference = m.h_inference.labels(name, engine)
        self.prefill = m.h_prefill.labels(name, engine)
        self.decode = m.h_decode.labels(name, engine)
        self.h_preempt = m.h_preempt.labels(name, engine)
        self.h_kv_computed = m.h_kv_computed.labels(name, engine)
        if m.spec:
            k = m.config.num_speculative_tokens
            self.sd_drafts = m.sd_drafts.labels(name, engine)
            self.sd_draft_tokens = m.sd_draft_tokens.labels(name, engine)
            self.sd_accepted = m.sd_accepted.labels(name, engine)
            self.sd_per_pos = [m.sd_per_pos.labels(name, engine, str(i)) for i in range(k)]
