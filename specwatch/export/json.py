"""JSON documents: ``/api/v1/snapshot`` and its parts, ``specwatch analyze --format json``.

Every function returns plain JSON-able values (no NaN or infinity: those become ``null``) and
does no I/O. Shapes are in ``docs/architecture.md`` and ``docs/metrics.md``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, fields
from typing import TYPE_CHECKING, Any

from specwatch.core.clock import format_rfc3339
from specwatch.core.config import OVERALL, SINCE_START
from specwatch.core.numbers import exp_or_inf, finite_or_none
from specwatch.observe.values import QUANTILES, Health

if TYPE_CHECKING:  # annotations only: `specwatch analyze` loads neither aiohttp nor scipy
    from specwatch.alerts.values import AlertingState
    from specwatch.export.snapshot import Snapshot
    from specwatch.shadow.published import PairedSummary, ShadowStats

#: Summary fields a rolling window leaves out (``null``): e-values are anytime-valid since
#: start only; a window's counts, rates and intervals keep their own names.
ROLLING_WITHOUT = ("log_e_value", "e_value", "alarm", "lossless_e_value")


def _jsonable(value: Any) -> Any:
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def health_json(h: Health) -> dict[str, Any]:
    """A :class:`Health` as the JSON object of ``/api/v1/snapshot`` and ``specwatch analyze``."""
    doc: dict[str, Any] = _jsonable(
        {
            "interval_seconds": h.interval_seconds,
            "acceptance_rate": h.acceptance_rate,
            "mean_acceptance_length": h.mean_acceptance_length,
            "speculation_coverage": h.speculation_coverage,
            "mean_draft_length": h.mean_draft_length,
            "per_position_acceptance_rate": list(h.per_position_acceptance_rate),
            "per_position_conditional_acceptance_rate": list(
                h.per_position_conditional_acceptance_rate
            ),
            "num_speculative_tokens": h.num_speculative_tokens,
            "drafts": h.drafts,
            "draft_tokens": h.draft_tokens,
            "accepted_tokens": h.accepted_tokens,
            "generation_tokens": h.generation_tokens,
            "engine_steps": h.engine_steps,
            "preemptions": h.preemptions,
            "generation_tokens_per_second": h.generation_tokens_per_second,
            "accepted_tokens_per_second": h.accepted_tokens_per_second,
            "drafts_per_second": h.drafts_per_second,
            "drafts_per_step": h.drafts_per_step,
            "engine_steps_per_second": h.engine_steps_per_second,
            "preemptions_per_second": h.preemptions_per_second,
            "requests_finished": h.requests_finished,
            "requests_finished_per_second": h.requests_finished_per_second,
            "prompt_tokens_per_second": h.prompt_tokens_per_second,
            "prompt_tokens_by_source": dict(h.prompt_tokens_by_source),
            "prefix_cache_hit_rate": h.prefix_cache_hit_rate,
            "scheduled_tokens_per_step": h.scheduled_tokens_per_step,
            "inter_token_latency_seconds": {
                str(q): h.inter_token_latency_seconds.get(q) for q in QUANTILES
            },
            "time_to_first_token_seconds": {
                str(q): h.time_to_first_token_seconds.get(q) for q in QUANTILES
            },
            "num_requests_running": h.num_requests_running,
            "num_requests_waiting": h.num_requests_waiting,
            "num_requests_waiting_by_reason": dict(h.num_requests_waiting_by_reason),
            "kv_cache_usage": h.kv_cache_usage,
            "inter_token_latency_mean_seconds": h.inter_token_latency_mean_seconds,
            "time_to_first_token_mean_seconds": h.time_to_first_token_mean_seconds,
            "spec_decode_schema": h.spec_decode_schema,
            "withheld": list(h.withheld),
        }
    )
    return doc


def snapshot_json(snap: Snapshot) -> dict[str, Any]:
    """The ``/api/v1/snapshot`` document (shape in ``docs/architecture.md``); NaN/missing → null.

    ``speculation_limit``: where FLy stops decoding faster per request than the no-speculation
    baseline (when configured) and than the standard arm, each a labelled comparison
    (:class:`~specwatch.observe.concurrency.SpeculationLimit` as an object, ``null`` without
    both targets). Per window: ``server``/``engines`` of the target's only model (``null`` when
    it serves several or none yet) and ``models`` with every model.
    """
    targets: dict[str, Any] = {}
    for name, t in snap.targets.items():
        windows: dict[str, Any] = {}
        for w, models in t.windows.items():
            per_model = {
                m: {
                    "server": health_json(mw.server),
                    "engines": {e: health_json(h) for e, h in mw.engines.items()},
                }
                for m, mw in models.items()
            }
            only = next(iter(per_model.values())) if len(per_model) == 1 else None
            windows[w] = {
                "server": only["server"] if only else None,
                "engines": only["engines"] if only else None,
                "models": per_model,
            }
        lim, cap = t.limits, t.capacity
        targets[name] = {
            "role": t.role.value,
            "url": t.url,
            "up": t.up,
            "stale": t.stale,
            "ready": t.ready,
            "serving_engine": t.engine_kind,
            "last_success": t.last_success,
            "last_scrape_duration_seconds": t.last_scrape_duration_seconds,
            "scrapes_total": t.scrapes_total,
            "missed_ticks": t.missed_ticks,
            "scrape_errors": dict(t.scrape_errors),
            "counter_resets": dict(t.counter_resets),
            "missing_families": list(t.missing_families),
            "gauge_processes": t.gauge_processes,
            "cache_config": None if t.cache_config is None else asdict(t.cache_config),
            "prefix_cache_below_block": t.prefix_cache_below_block,
            "lora": None
            if t.lora is None
            else {
                "max_lora": t.lora.max_lora,
                "running_adapters": list(t.lora.running),
                "waiting_adapters": list(t.lora.waiting),
                "updated_at": t.lora.updated_at,
            },
            "limits": {
                "max_num_seqs": lim.max_num_seqs,
                "max_num_batched_tokens": lim.max_num_batched_tokens,
                "num_speculative_tokens": lim.num_speculative_tokens,
                "method": lim.method,
                "parallel_drafting": lim.parallel_drafting,
                "vllm_version": lim.vllm_version,
            },
            "capacity": {
                "limits_configured": cap.limits_configured,
                "num_requests_running": cap.num_requests_running,
                "running_to_max_seqs_ratio": cap.running_to_max_seqs_ratio,
                "running_gap_requests": cap.running_gap_requests,
                "admission_cap_requests": cap.admission_cap_requests,
                "decode_full_per_step_requests": cap.decode_full_per_step_requests,
                "budget_bound": cap.budget_bound,
                "num_speculative_tokens": cap.num_speculative_tokens,
                "num_speculative_tokens_source": cap.num_speculative_tokens_source,
                "extra_batch_slots": cap.extra_batch_slots,
                "slots_per_request": cap.slots_per_request,
                "required_batched_tokens": cap.required_batched_tokens,
            },
            "windows": windows,
        }
    pair = {
        w: {
            "standard": pv.standard,
            "fly": pv.fly,
            "acceptance_gain_ratio": pv.acceptance_gain_ratio,
            "mean_acceptance_length_ratio": pv.mean_acceptance_length_ratio,
            "throughput_ratio": pv.throughput_ratio,
            "throughput_ratio_withheld": pv.throughput_ratio_withheld,
        }
        for w, pv in snap.pair.items()
    }
    limit = snap.observe.speculation_limit
    out: dict[str, Any] = {
        "generated_at": snap.generated_at,
        "targets": targets,
        "pair": pair,
        "speculation_limit": None if limit is None else asdict(limit),
        "shadow": shadow_stats_json(snap.shadow) if snap.shadow is not None else {},
        "alerts": alerts_json(snap.alerts) if snap.alerts is not None else [],
        "verdict": snapshot_verdict(snap),
    }
    doc: dict[str, Any] = _jsonable(out)
    return doc


def snapshot_verdict(snap: Snapshot) -> str | None:
    """The verdict sentence (:func:`specwatch.shadow.verdict.verdict_line`) for a snapshot.

    With shadow statistics: :func:`shadow_verdict` (τ and speed from the paired requests' own
    per-request counts, as ``specwatch report`` reads them from the ledger, so the two print
    the same sentence). Without: τ ratio from the first pair window and throughput as
    per-request generation speed in the same window (τ ÷ median inter-token latency of each
    server, by :func:`specwatch.shadow.verdict.per_request_speed_ratio`: equal traffic,
    whatever share of the load each server gets). ``None`` with neither a pair view nor shadow
    stats.
    """
    # imported here: the verdict's sample size needs scipy, which `specwatch analyze` never loads
    from specwatch.shadow.verdict import Verdict, per_request_speed_ratio, verdict_line

    if snap.shadow is not None:
        return shadow_verdict(snap.shadow)
    window, pv = next(iter(snap.pair.items()), (None, None))
    if window is None or pv is None:
        return None
    tau = pv.mean_acceptance_length_ratio
    speed: float | None = None

    def server(name: str) -> Health | None:
        t = snap.targets.get(name)
        models = t.windows.get(window, {}) if t is not None else {}
        return next(iter(models.values())).server if len(models) == 1 else None

    std, fly = server(pv.standard), server(pv.fly)
    if std is not None and fly is not None:
        speed = per_request_speed_ratio(
            fly.mean_acceptance_length,
            fly.inter_token_latency_seconds.get(0.5),
            std.mean_acceptance_length,
            std.inter_token_latency_seconds.get(0.5),
        )
    return verdict_line(Verdict(tau_ratio=tau, throughput_ratio=speed))


def shadow_verdict(st: ShadowStats) -> str:
    """The verdict sentence of shadow statistics: quality from the ``since_start`` overall
    summary (its e-value is the anytime-valid one), τ and speed from ``st.arm_totals``
    (:func:`specwatch.shadow.verdict.arm_ratios`, the function ``specwatch report`` uses on
    the ledger's sums): one source for the view, ``/api/v1/snapshot``, the demo's exit line and
    the report."""
    from specwatch.shadow.verdict import (
        DecodeRatios,
        Verdict,
        arm_ratios,
        decode_ratios,
        verdict_from_summary,
        verdict_line,
    )

    tau, speed = arm_ratios(st.arm_totals) if st.arm_totals is not None else (None, None)
    dec = decode_ratios(st.arm_totals) if st.arm_totals is not None else DecodeRatios()
    cats = st.windows.get(SINCE_START) or next(iter(st.windows.values()), {})
    overall = cats.get(OVERALL)
    if overall is None:
        line = verdict_line(
            Verdict(
                tau_ratio=tau,
                throughput_ratio=speed,
                decode_ratio=dec.decode,
                ttft_ratio=dec.ttft,
                decode_interval=dec.decode_interval,
            )
        )
    else:
        line = verdict_line(
            verdict_from_summary(
                overall,
                alpha=st.alpha,
                margin=st.margin,
                tau_ratio=tau,
                throughput_ratio=speed,
                declared_at=st.within_margin_declared_at,
                decode=dec,
            )
        )
    # replays paused for load: the verdict says why it moves slowly (or not at all)
    pause = st.io.pause_text if st.io is not None else ""
    return f"{line} ({pause})" if pause else line


def alerts_json(state: AlertingState) -> list[dict[str, Any]]:
    """The ``alerts`` list of ``/api/v1/snapshot``: ``[{"labels": {...}, "startsAt": RFC 3339,
    "state": "firing"}]``, one per active alert, sorted by labels."""
    return [
        {"labels": dict(a.labels), "startsAt": format_rfc3339(a.starts_at), "state": "firing"}
        for a in state.firing
    ]


def _json_num(v: object) -> object:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def shadow_stats_json(stats: ShadowStats) -> dict[str, Any]:
    """JSON-safe dict of a snapshot for ``/api/v1/snapshot``'s ``"shadow"`` key.

    Non-finite numbers (NaN, an overflowed e-value) become ``null`` (``log_e_value`` and
    ``betting_log_e_value`` stay finite); ``pairs_total`` becomes a
    list of ``{"category", "arm", "outcome", "count"}``; ``decisions`` the per-category
    decision table (one object per :class:`~specwatch.shadow.published.DecisionRow`, categories
    bounded, ``overall`` last) and ``by_load`` the flip rates per running-request band (one
    object per :class:`~specwatch.shadow.published.LoadBand`); ``change_detector`` the change
    detector's ``ln M`` and its threshold (``null`` when not run), ``within_margin_declared_at``
    the labelled pair at which "within margin" was declared (``null`` while not).
    """

    def summary(s: PairedSummary, window: str) -> dict[str, object]:
        d: dict[str, object] = {
            f.name: _json_num(getattr(s, f.name)) for f in fields(s) if f.name != "tally"
        }
        if window != SINCE_START:  # only since start is anytime-valid
            for name in ROLLING_WITHOUT:
                d[name] = None
        d["tally"] = asdict(s.tally)
        return d

    io = stats.io
    bet = stats.betting_log_e_value
    return {
        "generated_at": stats.generated_at,
        "alpha": stats.alpha,
        "margin": stats.margin,
        "detect_net_loss": stats.detect_net_loss,
        "windows": {
            w: {cat: summary(s, w) for cat, s in cats.items()} for w, cats in stats.windows.items()
        },
        "pairs_total": [
            {"category": c, "arm": a, "outcome": o, "count": n}
            for (c, a, o), n in sorted(stats.pairs_total.items())
        ],
        "unpaired_total": dict(stats.unpaired_total),
        "excluded_total": dict(stats.excluded_total),
        "betting_e_value": None if bet is None else finite_or_none(exp_or_inf(bet)),
        "betting_log_e_value": bet,
        "change_detector": None
        if stats.change_log_value is None
        else {
            "log_value": finite_or_none(stats.change_log_value),
            "threshold": stats.change_threshold,
        },
        "within_margin_declared_at": stats.within_margin_declared_at,
        "ledger_rows": stats.ledger_rows,
        "ledger_write_errors": dict(stats.ledger_write_errors),
        "io": None
        if io is None
        else {
            "queue_depth": io.queue_depth,
            "in_flight": io.in_flight,
            "dropped_total": dict(io.dropped),
            "paused": {r: bool(v) for r, v in io.paused.items()},
            "pause": io.pause_text,
            "trickled_total": io.trickled,
        },
        "decisions": [
            {f.name: _json_num(getattr(r, f.name)) for f in fields(r)} for r in stats.decisions
        ],
        "by_load": [
            {f.name: _json_num(getattr(b, f.name)) for f in fields(b)} for b in stats.by_load
        ],
    }
