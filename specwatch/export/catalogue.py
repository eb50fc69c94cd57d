"""The metric catalogue: every ``specwatch_*`` family specwatch exports, in one table.

Each :class:`MetricSpec` gives the family name (counters without ``_total``; the exposition adds
it), type, help text and label names. The collectors in :mod:`specwatch.export.prometheus` emit
only families listed here (:data:`BY_NAME`); ``docs/metrics.md`` lists the same names, types and
labels, with the fleet tool's families (checked by a test). Order of :data:`CATALOGUE` = order of
the exposition. These are the running sidecar's families only: the fleet view's
(``specwatch fleet --listen``) live with that tool, in :mod:`specwatch.tools.fleet.catalogue`;
the spec type in :mod:`specwatch.export.spec`.
"""

from __future__ import annotations

from specwatch.export.spec import REASON, MetricSpec, _c, _g

# -- observe chain ------------------------------------------------------------------------------

TARGET = ("target", "role", "model_name")
WINDOWED = ("target", "role", "model_name", "window")


#: Health fields exported per window: Health attribute → spec.
WINDOW_GAUGES: dict[str, MetricSpec] = {
    "acceptance_rate": _g(
        "specwatch_acceptance_ratio",
        "Draft acceptance rate alpha = increase(accepted)/increase(draft_tokens) over the window.",
        WINDOWED,
    ),
    "mean_acceptance_length": _g(
        "specwatch_mean_acceptance_length",
        "Mean acceptance length tau = 1 + increase(accepted)/increase(drafts), tokens per step.",
        WINDOWED,
    ),
    "speculation_coverage": _g(
        "specwatch_speculation_coverage",
        "Share of output tokens emitted by steps that verified a draft = (increase(accepted) + "
        "increase(drafts))/increase(generation_tokens); below 1 when steps had no proposal "
        "(ngram, suffix): tau then describes only the covered steps. At most 1 (vLLM counts "
        "drafts accepted past a request's stop as accepted, not generated).",
        WINDOWED,
    ),
    "prefix_cache_hit_rate": _g(
        "specwatch_prefix_cache_hit_ratio",
        "Prefix-cache hit rate = increase(prefix_cache_hits)/increase(prefix_cache_queries) "
        "(tokens, the local prefix cache).",
        WINDOWED,
    ),
    "scheduled_tokens_per_step": _g(
        "specwatch_scheduled_tokens_per_step",
        "Tokens scheduled per engine step ~ (increase(prompt tokens computed locally, else all) + "
        "increase(generation_tokens) + increase(draft_tokens) - increase(accepted)) / "
        "increase(engine steps); compared with max_num_batched_tokens.",
        WINDOWED,
    ),
    "mean_draft_length": _g(
        "specwatch_mean_draft_length",
        "Mean draft length = increase(draft_tokens)/increase(drafts).",
        WINDOWED,
    ),
    "generation_tokens_per_second": _g(
        "specwatch_generation_tokens_per_second",
        "Generated tokens per second over the window.",
        WINDOWED,
    ),
    "accepted_tokens_per_second": _g(
        "specwatch_accepted_tokens_per_second",
        "Accepted draft tokens per second over the window.",
        WINDOWED,
    ),
    "drafts_per_second": _g(
        "specwatch_drafts_per_second", "Drafts (verify steps of a request) per second.", WINDOWED
    ),
    "drafts_per_step": _g(
        "specwatch_drafts_per_step",
        "Drafts per engine step = increase(drafts)/increase(iteration_tokens_total_count).",
        WINDOWED,
    ),
    "engine_steps_per_second": _g(
        "specwatch_engine_steps_per_second", "Engine steps per second.", WINDOWED
    ),
    "preemptions_per_second": _g(
        "specwatch_preemptions_per_second", "Preemptions per second over the window.", WINDOWED
    ),
    "requests_finished_per_second": _g(
        "specwatch_requests_finished_per_second",
        "Finished requests per second over the window (vllm:request_success_total, every "
        "finished_reason).",
        WINDOWED,
    ),
    "inter_token_latency_mean_seconds": _g(
        "specwatch_inter_token_latency_mean_seconds",
        "Mean inter-token latency over the window = increase(_sum)/increase(_count).",
        WINDOWED,
    ),
    "time_to_first_token_mean_seconds": _g(
        "specwatch_time_to_first_token_mean_seconds",
        "Mean time to first token over the window = increase(_sum)/increase(_count).",
        WINDOWED,
    ),
    "prompt_tokens_per_second": _g(
        "specwatch_prompt_tokens_per_second",
        "Prompt (prefill) tokens per second over the window (vllm:prompt_tokens_total).",
        WINDOWED,
    ),
}

PER_POSITION = _g(
    "specwatch_per_position_acceptance_ratio",
    "Per-position acceptance = increase(accepted_per_pos[position])/increase(drafts).",
    (*WINDOWED, "position"),
)
PER_POSITION_CONDITIONAL = _g(
    "specwatch_per_position_conditional_acceptance_ratio",
    "Conditional per-position acceptance = increase(per_pos[i])/increase(per_pos[i-1]); "
    "position 0 over drafts.",
    (*WINDOWED, "position"),
)
ITL = _g(
    "specwatch_inter_token_latency_quantile_seconds",
    "Inter-token latency quantile from bucket increases (histogram_quantile interpolation).",
    (*WINDOWED, "q"),
)
TTFT = _g(
    "specwatch_time_to_first_token_quantile_seconds",
    "Time-to-first-token quantile from bucket increases (histogram_quantile interpolation).",
    (*WINDOWED, "q"),
)

#: Window-free gauges: Health attribute → spec.
LATEST_GAUGES: dict[str, MetricSpec] = {
    "num_speculative_tokens": _g(
        "specwatch_num_speculative_tokens",
        "K: draft positions seen in the position labels, else configured.",
        TARGET,
    ),
    "kv_cache_usage": _g(
        "specwatch_kv_cache_usage_ratio",
        "KV-cache usage fraction 0..1 (vllm:kv_cache_usage_perc; mean over engines server-wide).",
        TARGET,
    ),
    "num_requests_running": _g(
        "specwatch_num_requests_running", "Requests in RUNNING (vllm:num_requests_running).", TARGET
    ),
    "num_requests_waiting": _g(
        "specwatch_num_requests_waiting", "Waiting requests (vllm:num_requests_waiting).", TARGET
    ),
}
WAITING_BY_REASON = _g(
    "specwatch_num_requests_waiting_by_reason",
    "Waiting requests by reason (a breakdown of num_requests_waiting).",
    (*TARGET, "reason"),
)

BUILD_INFO = _g("specwatch_build_info", "specwatch build information (always 1).", ("version",))
TARGET_UP = _g(
    "specwatch_target_up", "1 when the last scrape of the target succeeded.", ("target", "role")
)
TARGET_ENGINE = _g(
    "specwatch_target_engine_info",
    "The serving engine of the target's latest good page (always 1): vllm or sglang.",
    ("target", "role", "serving_engine"),
)
SCRAPE_DURATION = _g(
    "specwatch_scrape_duration_seconds", "Duration of the last scrape of the target.", ("target",)
)
SCRAPES = _c("specwatch_scrapes", "Scrapes attempted per target.", ("target",))
MISSED_TICKS = _c(
    "specwatch_scrape_missed_ticks",
    "Scheduled scrapes of the target skipped because the scrape before them ran past them.",
    ("target",),
)
SCRAPE_ERRORS = _c(
    "specwatch_scrape_errors", "Failed scrapes and skipped series by reason.", ("target", "reason")
)
LAST_SUCCESS = _g(
    "specwatch_last_scrape_success_timestamp_seconds",
    "Unix time of the last good scrape of the target.",
    ("target",),
)
TARGET_STALE = _g(
    "specwatch_target_stale",
    "1 when the exported values of the target are the last good ones (scrape failed or "
    "families missing).",
    ("target",),
)
GAUGE_PROCESSES = _g(
    "specwatch_target_processes",
    "Processes whose copies of the target's gauges the last good page carries (a pid label, "
    "prometheus_client multiprocess mode); each such gauge is read once, not summed. 0: one "
    "value per gauge.",
    ("target",),
)
INVALID_VALUES = _c(
    "specwatch_invalid_values",
    "Good pages on which a derived value was withheld because it cannot be right, by reason "
    "(acceptance_above_one, tau_above_k_plus_one, draft_length_above_k, negative_rate).",
    ("target", "reason"),
)
COUNTER_RESETS = _c(
    "specwatch_engine_resets", "Engine counter resets (restarts) detected.", ("target", "engine")
)

PAIR = ("window", "standard", "fly")
THROUGHPUT_WITHHELD = _g(
    "specwatch_fly_throughput_ratio_withheld",
    "1 when the FLy / standard throughput ratio is withheld for this reason (request_rates_differ, "
    "request_rates_unknown, no_requests), else 0: the arms do not serve the same traffic.",
    (*PAIR, "reason"),
)
PAIR_GAUGES: dict[str, MetricSpec] = {
    "acceptance_gain_ratio": _g(
        "specwatch_fly_acceptance_gain_ratio", "FLy minus standard acceptance rate.", PAIR
    ),
    "mean_acceptance_length_ratio": _g(
        "specwatch_fly_mean_acceptance_length_ratio", "tau of FLy divided by tau of standard.", PAIR
    ),
    "throughput_ratio": _g(
        "specwatch_fly_throughput_ratio",
        "Generation tokens/s of FLy divided by standard; only when both arms finish requests at "
        "rates within 10% of each other (same traffic), else withheld.",
        PAIR,
    ),
}

SPECULATION_LIMIT_RUNNING = _g(
    "specwatch_speculation_limit_running",
    "Running requests from which FLy's per-request decode speed is no higher than the reference "
    "arm's (baseline: the no-speculation target, speculation against none; standard: the "
    "standard speculative arm), interpolated between the levels seen; absent while not reached "
    "or without data.",
    ("reference",),
)
SPECULATION_LIMIT_RUNNING_LOWER = _g(
    "specwatch_speculation_limit_running_lower",
    "Lower end of the 95% interval of specwatch_speculation_limit_running: the highest "
    "concurrency below it at which FLy is shown faster per request, every lower one too; absent "
    "when the crossing may lie at or below the lowest concurrency seen.",
    ("reference",),
)
SPECULATION_LIMIT_RUNNING_UPPER = _g(
    "specwatch_speculation_limit_running_upper",
    "Upper end of the 95% interval of specwatch_speculation_limit_running: the first "
    "concurrency at which FLy is shown no faster per request.",
    ("reference",),
)
SPECULATION_LIMIT_HIGHEST_RUNNING = _g(
    "specwatch_speculation_limit_highest_running",
    "Highest concurrency at which FLy and the reference arm were compared (the top of the "
    "observed range behind specwatch_speculation_limit_state); absent without data.",
    ("reference",),
)
SPECULATION_LIMIT_STATE = _g(
    "specwatch_speculation_limit_state",
    "1 on the current state of the speculation limit against each reference (reached, "
    "not_reached, no_data).",
    ("reference", "state"),
)
CONCURRENCY_SPEED_RATIO = _g(
    "specwatch_concurrency_speed_ratio",
    "FLy's per-request decode speed (generation tokens/s / running) over the standard arm's, "
    "per running-request band seen on both.",
    ("band",),
)

CAP = ("target", "role")
LIMITS_CONFIGURED = _g(
    "specwatch_limits_configured",
    "1 when max_num_seqs, max_num_batched_tokens, K (observed or configured) and method are "
    "known for the target.",
    CAP,
)
SPECULATIVE_TOKENS = _g(
    "specwatch_speculative_tokens",
    "K the token budget and capacity gauges use, with its source: observed (the page's "
    "position labels, which vLLM creates at start-up) or configured.",
    ("target", "role", "source"),
)
CAPACITY_GAUGES: dict[str, MetricSpec] = {
    "max_num_seqs": _g("specwatch_max_num_seqs", "Configured max_num_seqs.", CAP),
    "max_num_batched_tokens": _g(
        "specwatch_max_num_batched_tokens", "Configured max_num_batched_tokens.", CAP
    ),
    "running_to_max_seqs_ratio": _g(
        "specwatch_running_to_max_seqs_ratio",
        "Most-loaded engine's running requests / max_num_seqs.",
        CAP,
    ),
    "running_gap_requests": _g(
        "specwatch_running_gap_requests", "max_num_seqs minus running (most-loaded engine).", CAP
    ),
    "admission_cap_requests": _g(
        "specwatch_admission_cap_requests", "R_max: most requests that can be RUNNING.", CAP
    ),
    "decode_full_per_step_requests": _g(
        "specwatch_decode_full_per_step_requests",
        "D_full: decode requests whose K drafts are all verified per step.",
        CAP,
    ),
    "budget_bound": _g(
        "specwatch_budget_bound", "1 when the token budget, not max_num_seqs, limits D_full.", CAP
    ),
}

#: The observe chain's families, in exposition order.
OBSERVE: tuple[MetricSpec, ...] = (
    BUILD_INFO,
    TARGET_UP,
    TARGET_ENGINE,
    SCRAPE_DURATION,
    SCRAPES,
    MISSED_TICKS,
    SCRAPE_ERRORS,
    LAST_SUCCESS,
    TARGET_STALE,
    GAUGE_PROCESSES,
    COUNTER_RESETS,
    INVALID_VALUES,
    *WINDOW_GAUGES.values(),
    PER_POSITION,
    PER_POSITION_CONDITIONAL,
    ITL,
    TTFT,
    *LATEST_GAUGES.values(),
    WAITING_BY_REASON,
    *PAIR_GAUGES.values(),
    SPECULATION_LIMIT_RUNNING,
    SPECULATION_LIMIT_RUNNING_LOWER,
    SPECULATION_LIMIT_RUNNING_UPPER,
    SPECULATION_LIMIT_HIGHEST_RUNNING,
    SPECULATION_LIMIT_STATE,
    CONCURRENCY_SPEED_RATIO,
    THROUGHPUT_WITHHELD,
    LIMITS_CONFIGURED,
    SPECULATIVE_TOKENS,
    *CAPACITY_GAUGES.values(),
)


# -- shadow and paired statistics ------------------------------------------------------------

WC = ("window", "category")

SHADOW_PAIRS = _c(
    "specwatch_shadow_pairs",
    "Compared shadow pairs by outcome versus the standard arm (correctness outcomes for "
    "labelled pairs, agree/disagree for every paired request).",
    ("category", "arm", "outcome"),
)
SHADOW_UNPAIRED = _c("specwatch_shadow_unpaired", "Shadow requests where one arm failed.", REASON)
SHADOW_EXCLUDED = _c(
    "specwatch_shadow_excluded", "Shadow requests excluded from comparison.", REASON
)
LEDGER_WRITE_ERRORS = _c(
    "specwatch_ledger_write_errors",
    "Ledger rows that failed to write, by exception type (queue_full: dropped unwritten).",
    REASON,
)

#: PairedSummary attribute → per-window, per-category gauge.
SUMMARY_GAUGES: dict[str, MetricSpec] = {
    "lost": _g(
        "specwatch_paired_lost", "Labelled pairs the standard arm got right and FLy wrong.", WC
    ),
    "gained": _g(
        "specwatch_paired_gained", "Labelled pairs the standard arm got wrong and FLy right.", WC
    ),
    "n": _g("specwatch_paired_n", "Labelled pairs (both arms answered, gold known).", WC),
    "net_loss_ratio": _g(
        "specwatch_paired_net_loss_ratio",
        "Paired accuracy difference acc(standard) - acc(FLy) = (lost - gained) / n.",
        WC,
    ),
    "ci_lower": _g(
        "specwatch_paired_net_loss_ci_lower_ratio",
        "Lower bound of the Tango score interval (level 1 - alpha) for the net loss.",
        WC,
    ),
    "ci_upper": _g(
        "specwatch_paired_net_loss_ci_upper_ratio",
        "Upper bound of the Tango score interval (level 1 - alpha) for the net loss.",
        WC,
    ),
    "discordant_ratio": _g(
        "specwatch_paired_discordant_ratio",
        "Share of labelled pairs whose correctness flipped.",
        WC,
    ),
    "non_inferiority_pass": _g(
        "specwatch_paired_non_inferiority_pass",
        "1 when the Tango non-inferiority test shows net loss < margin at level alpha.",
        WC,
    ),
    "questions_still_needed": _g(
        "specwatch_paired_questions_needed",
        "Labelled pairs still needed (Connor 1987, power 0.8) to detect the configured net loss "
        "delta at discordant rate max(observed, delta); absent while there are no labelled "
        "pairs.",
        WC,
    ),
    "excess_flip_ratio": _g(
        "specwatch_excess_flip_ratio",
        "FLy's answer-flip rate minus the noise arm's, on the same requests.",
        WC,
    ),
}
LOSSLESS_FLIP_RATIO = _g(
    "specwatch_lossless_flip_ratio",
    "Greedy requests whose answer differs from the no-speculation baseline's: arm=standard "
    "(the speculative standard arm) and arm=noise (the noise floor), on the same requests.",
    (*WC, "arm"),
)
LOSSLESS_E_VALUE = _g(
    "specwatch_lossless_e_value",
    "Anytime-valid e-value (beta-binomial mixture, p0 = 1/2) that the standard arm flips greedy "
    "answers against the baseline more often than the noise arm does (window since_start only).",
    WC,
)
LOSSLESS_PAIRS = _g(
    "specwatch_lossless_pairs",
    "Greedy paired requests where the baseline and the noise arm both answered.",
    WC,
)
DC = ("category",)
#: DecisionRow attribute -> per-category gauge (since start, bounded categories + overall).
DECISION_GAUGES: dict[str, MetricSpec] = {
    "tau_gain": _g(
        "specwatch_decision_tau_gain",
        "Acceptance length (tau, 1 + accepted / verify steps summed over the pairs) of FLy "
        "minus the standard arm's.",
        DC,
    ),
    "throughput_gain_ratio": _g(
        "specwatch_decision_throughput_gain_ratio",
        "FLy's replay decode throughput over the standard arm's, minus 1.",
        DC,
    ),
    "standard_decode_tokens_per_second": _g(
        "specwatch_decision_standard_decode_tokens_per_second",
        "Standard arm's decode speed on replays both arms streamed: tokens after the first over "
        "seconds after the first output (TTFT left out), summed since start.",
        DC,
    ),
    "fly_decode_tokens_per_second": _g(
        "specwatch_decision_fly_decode_tokens_per_second",
        "FLy arm's decode speed on replays both arms streamed: tokens after the first over "
        "seconds after the first output (TTFT left out), summed since start.",
        DC,
    ),
    **{
        f"{arm}_decode_ci_{bound}": _g(
            f"specwatch_decision_{arm}_decode_ci_{bound}_tokens_per_second",
            f"{bound.capitalize()} bound of the {shown} arm's decode speed's 95 % interval "
            "(delta method on the ratio of sums over the streamed pairs); absent below 2 such "
            "pairs.",
            DC,
        )
        for arm, shown in (("standard", "standard"), ("fly", "FLy"))
        for bound in ("lower", "upper")
    },
    "standard_ttft_seconds": _g(
        "specwatch_decision_standard_ttft_seconds",
        "Standard arm's mean time to the first output on replays both arms streamed.",
        DC,
    ),
    "fly_ttft_seconds": _g(
        "specwatch_decision_fly_ttft_seconds",
        "FLy arm's mean time to the first output on replays both arms streamed.",
        DC,
    ),
    "net_loss_ratio": _g(
        "specwatch_decision_net_loss_ratio",
        "Net loss acc(standard) - acc(FLy) on labelled pairs since start.",
        DC,
    ),
    "ci_lower": _g(
        "specwatch_decision_net_loss_ci_lower_ratio",
        "Lower bound of the net loss's Tango interval (level 1 - alpha).",
        DC,
    ),
    "ci_upper": _g(
        "specwatch_decision_net_loss_ci_upper_ratio",
        "Upper bound of the net loss's Tango interval (level 1 - alpha).",
        DC,
    ),
    "e_value": _g(
        "specwatch_decision_e_value",
        "E-value against 'no net loss' since start (a function of the lost and gained "
        "counts, overall and per category).",
        DC,
    ),
    "noise_flip_ratio": _g(
        "specwatch_decision_noise_flip_ratio",
        "Noise floor: share of paired requests where the noise arm's answer differs.",
        DC,
    ),
    "pairs_more": _g(
        "specwatch_decision_pairs_needed",
        "Labelled pairs still needed before the category is decided (Connor 1987).",
        DC,
    ),
}
DECISION_VERDICT = _g(
    "specwatch_decision_verdict",
    "1 on the category's current verdict (pays, costs_quality, not_faster, not_decided), "
    "0 on the others.",
    ("category", "verdict"),
)
LOAD_BAND_FLIP_RATIO = _g(
    "specwatch_load_band_flip_ratio",
    "Share of paired requests whose answer differs from the standard arm's, by the running "
    "requests at replay time (band) and arm (fly, noise), since start.",
    ("band", "arm"),
)
LOAD_BAND_PAIRS = _g(
    "specwatch_load_band_pairs",
    "Paired requests compared per running-request band and arm, since start.",
    ("band", "arm"),
)
LOSSLESS_LOAD_BAND_FLIP_RATIO = _g(
    "specwatch_lossless_load_band_flip_ratio",
    "Share of greedy paired requests whose answer differs from the no-speculation baseline's, "
    "by the running requests at replay time (band) and arm (standard, noise), since start.",
    ("band", "arm"),
)
LOSSLESS_LOAD_BAND_PAIRS = _g(
    "specwatch_lossless_load_band_pairs",
    "Greedy paired requests where the baseline and the noise arm both answered, per "
    "running-request band, since start.",
    ("band",),
)
MCNEMAR_P = _g(
    "specwatch_paired_mcnemar_p_value",
    "Exact McNemar p-value on the discordant pairs (two-sided, or one-sided for FLy loss).",
    (*WC, "alternative"),
)
E_VALUE = _g(
    "specwatch_paired_e_value",
    "Anytime-valid e-value, window since_start only: against 'no net loss' (a mixture over the "
    "lost share of the discordant pairs, per category and overall) and against 'net loss <= "
    "margin' (betting); each pages at its share of paired.alpha (the alerting policy).",
    (*WC, "hypothesis"),
)
CHANGE_DETECTOR = _g(
    "specwatch_paired_change_detector",
    "The change detector's value M (Shiryaev-Roberts e-detector on the no-net-loss bets, pair "
    "clock; 0 before the first discordant pair); the warning SpecQualityChange fires at "
    "paired.change_arl, its mean run length to a false alarm in labelled pairs.",
)
CHANGE_DETECTOR_THRESHOLD = _g(
    "specwatch_paired_change_detector_threshold",
    "The change detector's alarm level (paired.change_arl, labelled pairs).",
)
FLIP_RATIO = _g(
    "specwatch_flip_ratio",
    "Share of paired requests whose answer differs from the standard arm's.",
    (*WC, "arm"),
)
LEDGER_ROWS = _g("specwatch_ledger_rows", "Rows in the pair ledger.")
LEDGER_STATE = _g(
    "specwatch_ledger_state",
    "1 for the ledger's state (ok, corrupt, full, read_only, unavailable), 0 for the others; "
    "pairing stops while it is not ok.",
    ("state",),
)
LEDGER_PAIRS = _g(
    "specwatch_ledger_pairs",
    "Compared pairs the ledger holds now, by outcome (as specwatch_shadow_pairs_total, over the "
    "retained rows: retention pruning lowers it).",
    ("category", "arm", "outcome"),
)
SHADOW_CATEGORIES_FOLDED = _c(
    "specwatch_shadow_categories_folded",
    "Requests whose category was counted as 'other' (more distinct categories than "
    "shadow.max_categories).",
)
SHADOW_CATEGORY_TAKEOVERS = _c(
    "specwatch_shadow_category_takeovers",
    "Times a busier category took the slot of the least busy kept one "
    "(shadow.category_takeover_*).",
)
SHADOW_QUEUE_DEPTH = _g("specwatch_shadow_queue_depth", "Sampled requests waiting to replay.")
SHADOW_IN_FLIGHT = _g("specwatch_shadow_in_flight", "Shadow replays in flight.")
SHADOW_DROPPED = _c(
    "specwatch_shadow_dropped", "Sampled shadow requests dropped, by reason.", REASON
)
SHADOW_PAUSED = _g(
    "specwatch_shadow_paused", "1 while shadow replay is paused for this reason.", REASON
)
SHADOW_PAUSES = _c(
    "specwatch_shadow_pauses", "Times shadow replay entered a load-aware pause, by reason.", REASON
)
SHADOW_TRICKLED = _c(
    "specwatch_shadow_canary_trickled",
    "Canary requests admitted through a load pause specwatch chose "
    "(shadow.canary_min_rate_per_second), so the quality verdict keeps moving.",
)

# Shadow I/O self-health counters (ShadowIO), after the families above.
SHADOW_RECEIVED = _c(
    "specwatch_shadow_received",
    "Requests the mirror/proxy/ingest paths considered for shadowing, by source.",
    ("source",),
)
SHADOW_INGEST_ERRORS = _c(
    "specwatch_shadow_ingest_errors",
    "Requests not offered for shadowing, by source and reason (too_large, incomplete_body, "
    "bad_encoding, invalid_json, too_deep, not_object, unsupported_path, not_shadow_host, "
    "offer_error; client_retry: an SDK retry of a request already taken in).",
    ("source", "reason"),
)
SHADOW_OFFERED = _c("specwatch_shadow_offered", "Requests offered to the shadow sampler.")
SHADOW_NOT_SAMPLED = _c(
    "specwatch_shadow_not_sampled", "Offered requests the sampler did not pick."
)
SHADOW_ADMITTED = _c("specwatch_shadow_admitted", "Sampled requests admitted to the replay queue.")
SHADOW_REPLAYS = _c(
    "specwatch_shadow_replays",
    "Finished shadow replays by status (paired, unpaired, excluded).",
    ("status",),
)
SHADOW_ARM_ERRORS = _c(
    "specwatch_shadow_arm_errors",
    "Failed arm requests by arm and reason (timeout, http_500, too_large, invalid_body, ...).",
    ("arm", "reason"),
)
SHADOW_SINK_ERRORS = _c(
    "specwatch_shadow_sink_errors",
    "Replayed pairs whose comparison/ledger sink raised (the pair is lost).",
)
SHADOW_PROXY_REQUESTS = _c("specwatch_shadow_proxy_requests", "Requests through the shadow proxy.")
SHADOW_PROXY_CLIENT_DISCONNECTS = _c(
    "specwatch_shadow_proxy_client_disconnects",
    "Proxied requests whose client went away before the answer was sent.",
)
SHADOW_PROXY_UPSTREAM_ERRORS = _c(
    "specwatch_shadow_proxy_upstream_errors",
    "Proxied requests the upstream server failed, by reason (connect, timeout, "
    "disconnected, client_error, stalled).",
    REASON,
)
SHADOW_CANARY_OFFERED = _c(
    "specwatch_shadow_canary_offered", "Canary items offered for shadow replay."
)
SHADOW_CANARY_BAD_LINES = _c(
    "specwatch_shadow_canary_bad_lines", "Canary file lines skipped at load, by reason.", REASON
)
SHADOW_REPLAY_RETRIES = _c(
    "specwatch_shadow_replay_retries",
    "Replay requests sent once more after the arm closed the connection before any response "
    "byte (a reused idle connection), by arm.",
    ("arm",),
)
SHADOW_TOKEN_COUNT_FAILURES = _c(
    "specwatch_shadow_token_count_failures",
    "Replies without usage whose generated text the arm's /tokenize did not count (their "
    "speed and decode speed are unknown), by arm and reason.",
    ("arm", "reason"),
)
ARM_CATEGORY = ("arm", "category")
SHADOW_REPLY_SPEC_STEPS = _c(
    "specwatch_shadow_reply_spec_steps",
    "Speculative-decoding verify steps reported in replayed replies (vLLM per-request metrics "
    "num_spec_steps), by arm and category.",
    ARM_CATEGORY,
)
SHADOW_REPLY_DRAFT_TOKENS = _c(
    "specwatch_shadow_reply_draft_tokens",
    "Draft tokens reported in replayed replies (num_draft_tokens), by arm and category.",
    ARM_CATEGORY,
)
SHADOW_REPLY_SPEC_REFUSED = _c(
    "specwatch_shadow_reply_spec_refused",
    "Replayed replies whose speculative-decoding counts were inconsistent and not counted, by "
    "arm and reason (malformed, accepted_over_drafted, histogram_steps, histogram_accepted, "
    "tau_mismatch).",
    ("arm", "reason"),
)
SHADOW_REPLY_ACCEPTED_TOKENS = _c(
    "specwatch_shadow_reply_accepted_tokens",
    "Accepted draft tokens reported in replayed replies (num_accepted_draft_tokens), by arm and "
    "category.",
    ARM_CATEGORY,
)
SHADOW_REPLY_ACCEPTANCE = _g(
    "specwatch_shadow_reply_acceptance_ratio",
    "Draft acceptance rate alpha (accepted / drafted) over replayed replies since start, by arm "
    "and category; absent until a reply with drafts.",
    ARM_CATEGORY,
)
SHADOW_REPLY_TAU = _g(
    "specwatch_shadow_reply_mean_acceptance_length",
    "Mean acceptance length tau (1 + accepted / verify steps, tokens per step) over replayed "
    "replies since start, by arm and category; replies without a verify step (vLLM's 1.0 "
    "placeholder) are left out.",
    ARM_CATEGORY,
)
ARM_FINISH = ("arm", "finish_reason")
SHADOW_REPLY_FINISHES = _c(
    "specwatch_shadow_reply_finishes",
    "Successful replayed replies, by arm and finish_reason.",
    ARM_FINISH,
)
SHADOW_REPLY_FINISHES_WITH_SPEC = _c(
    "specwatch_shadow_reply_finishes_with_spec_metrics",
    "Successful replayed replies that carried vLLM's per-request speculative-decoding metrics, "
    "by arm and finish_reason.",
    ARM_FINISH,
)
SHADOW_SPEC_COVERAGE = _g(
    "specwatch_shadow_spec_metrics_coverage_ratio",
    "Per-request tau coverage: the share of successful replayed replies that carry vLLM's "
    "per-request speculative-decoding metrics, by arm and finish_reason (vLLM sends none for a "
    "stop-string finish or n > 1, so per-request tau and alpha describe only the covered "
    "finishes); absent until a reply.",
    ARM_FINISH,
)

#: The shadow I/O families (from ``ShadowStats.io``; absent while the pipeline does not run).
SHADOW_IO: tuple[MetricSpec, ...] = (
    SHADOW_QUEUE_DEPTH,
    SHADOW_IN_FLIGHT,
    SHADOW_DROPPED,
    SHADOW_PAUSED,
    SHADOW_PAUSES,
    SHADOW_TRICKLED,
    SHADOW_RECEIVED,
    SHADOW_INGEST_ERRORS,
    SHADOW_OFFERED,
    SHADOW_NOT_SAMPLED,
    SHADOW_ADMITTED,
    SHADOW_REPLAYS,
    SHADOW_ARM_ERRORS,
    SHADOW_SINK_ERRORS,
    SHADOW_PROXY_REQUESTS,
    SHADOW_PROXY_CLIENT_DISCONNECTS,
    SHADOW_PROXY_UPSTREAM_ERRORS,
    SHADOW_CANARY_OFFERED,
    SHADOW_CANARY_BAD_LINES,
    SHADOW_REPLAY_RETRIES,
    SHADOW_TOKEN_COUNT_FAILURES,
    SHADOW_REPLY_SPEC_STEPS,
    SHADOW_REPLY_DRAFT_TOKENS,
    SHADOW_REPLY_ACCEPTED_TOKENS,
    SHADOW_REPLY_SPEC_REFUSED,
    SHADOW_REPLY_ACCEPTANCE,
    SHADOW_REPLY_TAU,
    SHADOW_REPLY_FINISHES,
    SHADOW_REPLY_FINISHES_WITH_SPEC,
    SHADOW_SPEC_COVERAGE,
)

#: The shadow chain's families, in exposition order.
SHADOW: tuple[MetricSpec, ...] = (
    SHADOW_PAIRS,
    SHADOW_UNPAIRED,
    SHADOW_EXCLUDED,
    LEDGER_WRITE_ERRORS,
    *SUMMARY_GAUGES.values(),
    MCNEMAR_P,
    E_VALUE,
    CHANGE_DETECTOR,
    CHANGE_DETECTOR_THRESHOLD,
    FLIP_RATIO,
    LOSSLESS_FLIP_RATIO,
    LOSSLESS_E_VALUE,
    LOSSLESS_PAIRS,
    *DECISION_GAUGES.values(),
    DECISION_VERDICT,
    LOAD_BAND_FLIP_RATIO,
    LOAD_BAND_PAIRS,
    LOSSLESS_LOAD_BAND_FLIP_RATIO,
    LOSSLESS_LOAD_BAND_PAIRS,
    LEDGER_ROWS,
    LEDGER_STATE,
    LEDGER_PAIRS,
    SHADOW_CATEGORIES_FOLDED,
    SHADOW_CATEGORY_TAKEOVERS,
    *SHADOW_IO,
)

# -- alerts -----------------------------------------------------------------------------------

ALERT_FIRING = MetricSpec(
    "specwatch_alert_firing",
    "gauge",
    "1 for each alert specwatch's detectors have active (labels: alertname, severity, ...).",
    ("alertname", "severity"),
    open_labels=True,
)
ALERTMANAGER_SENT = _c(
    "specwatch_alertmanager_sent_alerts",
    "Alerts (firing and resolved) an Alertmanager accepted, by peer (its URL).",
    ("peer",),
)
ALERTMANAGER_SEND_ERRORS = _c(
    "specwatch_alertmanager_send_errors",
    "Failed Alertmanager sends and dropped deliveries, by peer (its URL) and reason.",
    ("peer", "reason"),
)
ALERTMANAGER_OUTBOX_DEPTH = _g(
    "specwatch_alertmanager_outbox_depth",
    "Alert deliveries waiting for an Alertmanager, by peer (its URL).",
    ("peer",),
)
ALERTMANAGER_LAST_SEND_SUCCESS = _g(
    "specwatch_alertmanager_last_send_success",
    "1 when the last send to this Alertmanager succeeded, 0 when it failed (absent before one).",
    ("peer",),
)
ALERTMANAGER_LAST_ERROR = _g(
    "specwatch_alertmanager_last_error_timestamp_seconds",
    "Unix time of the last failed send to this Alertmanager (absent before one).",
    ("peer",),
)
ALERTMANAGER_CLOCK_OFFSET = _g(
    "specwatch_alertmanager_clock_offset_seconds",
    "This Alertmanager's clock minus specwatch's, from the Date header of its last answer.",
    ("peer",),
)
ALERTMANAGER_DELIVERING = _g(
    "specwatch_alertmanager_delivering",
    "1 while an Alertmanager acknowledged one of this sidecar's posts (alerts or the empty "
    "heartbeat) within 2 x max(resend_interval, evaluation_interval) + timeout, else 0 (and with "
    "no alerting.urls); the mixin's rules named like the sidecar's alerts fire unless it is 1.",
    (),
)
ALERT_CAUSE = _g(
    "specwatch_alert_cause",
    "1 for the cause the detectors name for a target's acceptance or budget alert while it is "
    "pending or firing (undetermined: several remain); the mixin's rules copy its cause label.",
    ("alertname", "target", "role", "cause"),
)

ALERT_STATE_ERRORS = _c(
    "specwatch_alert_state_errors",
    "Alert state (for timers, active alerts) not restored at start or not saved, by reason.",
    REASON,
)

#: The alerting families, in exposition order.
ALERTS: tuple[MetricSpec, ...] = (
    ALERT_FIRING,
    ALERTMANAGER_SENT,
    ALERTMANAGER_SEND_ERRORS,
    ALERTMANAGER_OUTBOX_DEPTH,
    ALERTMANAGER_LAST_SEND_SUCCESS,
    ALERTMANAGER_LAST_ERROR,
    ALERTMANAGER_CLOCK_OFFSET,
    ALERTMANAGER_DELIVERING,
    ALERT_CAUSE,
    ALERT_STATE_ERRORS,
)

# -- listeners --------------------------------------------------------------------------------

LISTENER_REFUSED = _c(
    "specwatch_listener_refused",
    "Connections and requests a listener refused, by reason (header_timeout, body_timeout, "
    "connection_limit, bad_request).",
    ("listener", "reason"),
)
LISTENER_OPEN = _g(
    "specwatch_listener_open_connections", "Open connections of a listener.", ("listener",)
)

#: The listener families, in exposition order.
LISTENERS: tuple[MetricSpec, ...] = (LISTENER_REFUSED, LISTENER_OPEN)

#: Every exported family, in exposition order.
CATALOGUE: tuple[MetricSpec, ...] = (*OBSERVE, *SHADOW, *ALERTS, *LISTENERS)

#: Family name (without ``_total``) → spec.
BY_NAME: dict[str, MetricSpec] = {spec.name: spec for spec in CATALOGUE}
