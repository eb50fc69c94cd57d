"""Prometheus export: one custom collector over the current immutable :class:`Snapshot`.

``collect()`` reads one snapshot reference and builds metric families; it does no I/O and never
awaits (prometheus_client runs it on the event loop). Every name, help text and label set is in
:data:`CATALOGUE` (documented in ``docs/metrics.md``; the contract is ``docs/architecture.md``).
``None`` values are not exported (no sample), never 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from specwatch import __version__
from specwatch.alerts.alertmanager import alerts_json
from specwatch.export.snapshot import Snapshot, SnapshotGetter
from specwatch.observe.values import QUANTILES, Health, TargetSnapshot
from specwatch.shadow.summary import shadow_stats_json

#: Scrape error reasons always exported (at 0) so ``rate()`` works from the start.
KNOWN_REASONS: tuple[str, ...] = (
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
)

TARGET = ("target", "role", "model_name")
WINDOWED = ("target", "role", "model_name", "window")


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One exported family: ``name`` (counters without ``_total``), type, help, labels."""

    name: str
    kind: str
    help: str
    labels: tuple[str, ...]


def _g(name: str, help_: str, labels: tuple[str, ...]) -> MetricSpec:
    return MetricSpec(name, "gauge", help_, labels)


def _c(name: str, help_: str, labels: tuple[str, ...]) -> MetricSpec:
    return MetricSpec(name, "counter", help_, labels)


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
SCRAPE_DURATION = _g(
    "specwatch_scrape_duration_seconds", "Duration of the last scrape of the target.", ("target",)
)
SCRAPES = _c("specwatch_scrapes", "Scrapes attempted per target.", ("target",))
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
COUNTER_RESETS = _c(
    "specwatch_engine_resets", "Engine counter resets (restarts) detected.", ("target", "engine")
)

PAIR = ("window", "standard", "fly")
PAIR_GAUGES: dict[str, MetricSpec] = {
    "acceptance_gain_ratio": _g(
        "specwatch_fly_acceptance_gain_ratio", "FLy minus standard acceptance rate.", PAIR
    ),
    "mean_acceptance_length_ratio": _g(
        "specwatch_fly_mean_acceptance_length_ratio", "tau of FLy divided by tau of standard.", PAIR
    ),
    "throughput_ratio": _g(
        "specwatch_fly_throughput_ratio",
        "Generation tokens/s of FLy divided by standard.",
        PAIR,
    ),
}

CAP = ("target", "role")
LIMITS_CONFIGURED = _g(
    "specwatch_limits_configured",
    "1 when max_num_seqs, max_num_batched_tokens, K and method are configured for the target.",
    CAP,
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

#: Every exported family (for docs and tests).
CATALOGUE: tuple[MetricSpec, ...] = (
    BUILD_INFO,
    TARGET_UP,
    SCRAPE_DURATION,
    SCRAPES,
    SCRAPE_ERRORS,
    LAST_SUCCESS,
    TARGET_STALE,
    COUNTER_RESETS,
    *WINDOW_GAUGES.values(),
    PER_POSITION,
    PER_POSITION_CONDITIONAL,
    ITL,
    TTFT,
    *LATEST_GAUGES.values(),
    WAITING_BY_REASON,
    *PAIR_GAUGES.values(),
    LIMITS_CONFIGURED,
    *CAPACITY_GAUGES.values(),
)


def _family(spec: MetricSpec) -> Metric:
    return Metric(spec.name, spec.help, spec.kind)


def _num(value: float | int | bool | None) -> float | None:
    if value is None:
        return None
    f = float(value)
    return None if math.isnan(f) else f


class _Families:
    """One family per catalogue name; samples carry their own label names (so server rows and
    per-engine rows, which add ``engine``, share a family)."""

    def __init__(self) -> None:
        self.f: dict[str, Metric] = {spec.name: _family(spec) for spec in CATALOGUE}

    def add(
        self, spec: MetricSpec, labels: Iterable[str], value: float | int | bool | None
    ) -> None:
        v = _num(value)
        if v is None:
            return
        values = list(labels)
        if len(values) != len(spec.labels):
            raise ValueError(f"{spec.name}: labels {spec.labels} got {values}")
        sample = spec.name + "_total" if spec.kind == "counter" else spec.name
        self.f[spec.name].add_sample(sample, dict(zip(spec.labels, values, strict=True)), v)


def _health_rows(
    fam: _Families, base: tuple[str, ...], window: str, engine: str | None, h: Health
) -> None:
    suffix = (engine,) if engine is not None else ()
    for attr, spec in WINDOW_GAUGES.items():
        fam.add(_spec(spec, engine), (*base, window, *suffix), getattr(h, attr))
    for i, v in enumerate(h.per_position_acceptance_rate):
        fam.add(_spec(PER_POSITION, engine), (*base, window, *suffix, str(i)), v)
    for i, v in enumerate(h.per_position_conditional_acceptance_rate):
        fam.add(_spec(PER_POSITION_CONDITIONAL, engine), (*base, window, *suffix, str(i)), v)
    for q in QUANTILES:
        fam.add(
            _spec(ITL, engine),
            (*base, window, *suffix, str(q)),
            h.inter_token_latency_seconds.get(q),
        )
        fam.add(
            _spec(TTFT, engine),
            (*base, window, *suffix, str(q)),
            h.time_to_first_token_seconds.get(q),
        )


_ENGINE_SPECS: dict[str, MetricSpec] = {}


def _spec(spec: MetricSpec, engine: str | None) -> MetricSpec:
    """The same family with ``engine`` inserted after the base labels, for per-engine rows."""
    if engine is None:
        return spec
    got = _ENGINE_SPECS.get(spec.name)
    if got is None:
        n = len(WINDOWED) if "window" in spec.labels else len(TARGET)
        got = MetricSpec(
            spec.name, spec.kind, spec.help, (*spec.labels[:n], "engine", *spec.labels[n:])
        )
        _ENGINE_SPECS[spec.name] = got
    return got


def _target_rows(fam: _Families, t: TargetSnapshot) -> None:
    role = t.role.value
    fam.add(TARGET_UP, (t.name, role), t.up)
    fam.add(SCRAPE_DURATION, (t.name,), t.last_scrape_duration_seconds)
    fam.add(SCRAPES, (t.name,), t.scrapes_total)
    for reason in sorted(set(KNOWN_REASONS) | set(t.scrape_errors)):
        fam.add(SCRAPE_ERRORS, (t.name, reason), t.scrape_errors.get(reason, 0))
    fam.add(LAST_SUCCESS, (t.name,), t.last_success)
    fam.add(TARGET_STALE, (t.name,), t.stale)
    for engine, n in sorted(t.counter_resets.items()):
        fam.add(COUNTER_RESETS, (t.name, engine), n)
    for window, models in t.windows.items():
        for model, mw in models.items():
            base = (t.name, role, model)
            _health_rows(fam, base, window, None, mw.server)
            for engine, h in mw.engines.items():
                _health_rows(fam, base, window, engine, h)
    latest = next(iter(t.windows.values()), {})
    for model, mw in latest.items():
        rows: list[tuple[str | None, Health]] = [(None, mw.server), *mw.engines.items()]
        for eng, h in rows:
            labels: tuple[str, ...] = (t.name, role, model, *((eng,) if eng is not None else ()))
            for attr, spec in LATEST_GAUGES.items():
                fam.add(_spec(spec, eng), labels, getattr(h, attr))
            for reason, v in h.num_requests_waiting_by_reason.items():
                fam.add(_spec(WAITING_BY_REASON, eng), (*labels, reason), v)
    cap = t.capacity
    fam.add(LIMITS_CONFIGURED, (t.name, role), cap.limits_configured)
    for attr, spec in CAPACITY_GAUGES.items():
        fam.add(spec, (t.name, role), getattr(cap, attr))


class SpecwatchCollector(Collector):
    """Builds every ``specwatch_*`` family from ``get_snapshot()`` at scrape time (no I/O)."""

    def __init__(self, get_snapshot: SnapshotGetter) -> None:
        self._get = get_snapshot

    def collect(self) -> Iterator[Metric]:
        """Yield the families of the current snapshot (empty families are skipped)."""
        snap = self._get()
        fam = _Families()
        fam.add(BUILD_INFO, (__version__,), 1)
        for t in snap.targets.values():
            _target_rows(fam, t)
        for window, pv in snap.pair.items():
            for attr, spec in PAIR_GAUGES.items():
                fam.add(spec, (window, pv.standard, pv.fly), getattr(pv, attr))
        for f in fam.f.values():
            if f.samples:
                yield f


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
        }
    )
    return doc


def snapshot_json(snap: Snapshot) -> dict[str, Any]:
    """The ``/api/v1/snapshot`` document (shape in ``docs/architecture.md``); NaN/missing → null.

    Per window: ``server``/``engines`` of the target's only model (``null`` when it serves several
    or none yet) and ``models`` with every model.
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
            "last_success": t.last_success,
            "last_scrape_duration_seconds": t.last_scrape_duration_seconds,
            "scrapes_total": t.scrapes_total,
            "scrape_errors": dict(t.scrape_errors),
            "counter_resets": dict(t.counter_resets),
            "missing_families": list(t.missing_families),
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
        }
        for w, pv in snap.pair.items()
    }
    out: dict[str, Any] = {
        "generated_at": snap.generated_at,
        "targets": targets,
        "pair": pair,
        "shadow": shadow_stats_json(snap.shadow) if snap.shadow is not None else {},
        "alerts": alerts_json(snap.alerts) if snap.alerts is not None else [],
    }
    doc: dict[str, Any] = _jsonable(out)
    return doc


#: A collector factory a component may hand to :func:`specwatch.server.app.build_app`.
CollectorFactory = Callable[[SnapshotGetter], Collector]
