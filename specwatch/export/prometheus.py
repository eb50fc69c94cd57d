"""Prometheus collectors: build metric families from immutable values at scrape time.

Three collectors, one per publishing chain, all emitting only families of the catalogue
(:mod:`specwatch.export.catalogue`; a family not in it raises ``KeyError``):

* :class:`SpecwatchCollector` over the current observe :class:`Snapshot` (targets and pair view);
* :class:`ShadowCollector` over the latest :class:`ShadowStats` (paired statistics, ledger and
  the shadow I/O counters :class:`ShadowIO`);
* :class:`AlertsCollector` over the latest :class:`AlertingState`.

``collect()`` reads one reference and builds families; it does no I/O and never awaits
(prometheus_client's handler runs it on the event loop). ``describe()`` yields the catalogue
families of the collector without samples, so a registry built with ``auto_describe=True``
rejects a second collector of the same name at registration. ``None`` and NaN values are not
exported (no sample), never 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from specwatch import __version__
from specwatch.alerts.values import SEND_ERROR_REASONS, STATE_ERROR_REASONS, AlertingState
from specwatch.core.config import OVERALL, SINCE_START
from specwatch.core.listen import REFUSAL_REASONS, ListenerStats
from specwatch.core.numbers import exp_or_inf
from specwatch.export import catalogue as cat
from specwatch.export.catalogue import (
    BUILD_INFO,
    CAPACITY_GAUGES,
    COUNTER_RESETS,
    GAUGE_PROCESSES,
    INVALID_VALUES,
    ITL,
    LAST_SUCCESS,
    LATEST_GAUGES,
    LIMITS_CONFIGURED,
    MISSED_TICKS,
    PAIR_GAUGES,
    PER_POSITION,
    PER_POSITION_CONDITIONAL,
    SCRAPE_DURATION,
    SCRAPE_ERRORS,
    SCRAPES,
    SPECULATIVE_TOKENS,
    TARGET,
    TARGET_ENGINE,
    TARGET_STALE,
    TARGET_UP,
    THROUGHPUT_WITHHELD,
    TTFT,
    WAITING_BY_REASON,
    WINDOW_GAUGES,
    WINDOWED,
)
from specwatch.export.snapshot import SnapshotGetter
from specwatch.export.spec import MetricSpec
from specwatch.observe.values import (
    INVALID_REASONS,
    LIMIT_STATUSES,
    QUANTILES,
    SCRAPE_ERROR_REASONS,
    THROUGHPUT_WITHHELD_REASONS,
    Health,
    PairView,
    SpeculationLimit,
    TargetSnapshot,
)
from specwatch.shadow.published import ShadowStats
from specwatch.shadow.values import (
    EXCLUDED_REASONS,
    LEDGER_STATES,
    PROXY_UPSTREAM_ERROR_REASONS,
    VERDICTS,
    WRITE_ERROR_REASONS,
)


def _family(spec: MetricSpec) -> Metric:
    return Metric(spec.name, spec.help, spec.kind)


def _num(value: float | int | bool | None) -> float | None:
    if value is None:
        return None
    f = float(value)
    return None if math.isnan(f) else f


class _Families:
    """One family per catalogue name in ``specs``; samples carry their own label names (so
    server rows and per-engine rows, which add ``engine``, share a family).

    :meth:`add` raises ``KeyError`` for a family that is not in ``specs`` (so not in the
    catalogue) and ``ValueError`` when the label values do not match the spec's label names.
    """

    def __init__(self, specs: Iterable[MetricSpec]) -> None:
        self.f: dict[str, Metric] = {spec.name: _family(spec) for spec in specs}

    def add(
        self,
        spec: MetricSpec,
        labels: Iterable[str],
        value: float | int | bool | None,
        extra: Mapping[str, str] | None = None,
    ) -> None:
        if spec.name not in self.f:
            raise KeyError(f"{spec.name} is not a family of this collector's catalogue")
        v = _num(value)
        if v is None:
            return
        values = list(labels)
        if extra is not None:
            if not spec.open_labels:
                raise ValueError(f"{spec.name}: no labels beyond {spec.labels}")
            names = {**extra, **dict(zip(spec.labels, values, strict=False))}
        elif len(values) != len(spec.labels):
            raise ValueError(f"{spec.name}: labels {spec.labels} got {values}")
        else:
            names = dict(zip(spec.labels, values, strict=True))
        self.f[spec.name].add_sample(spec.sample_name, names, v)

    def add_counts(
        self,
        spec: MetricSpec,
        counts: Mapping[str, int] | Mapping[tuple[str, str], int],
        known: Iterable[str] = (),
    ) -> None:
        """One sample per key of ``counts`` (a string or a tuple of label values), sorted;
        ``known`` keys are exported at 0 when absent."""
        rows: dict[tuple[str, ...], int] = {(k,): 0 for k in known}
        for key, n in counts.items():
            rows[key if isinstance(key, tuple) else (key,)] = n
        for labels, count in sorted(rows.items()):
            self.add(spec, labels, count)

    def families(self, *, keep_empty: bool) -> Iterator[Metric]:
        """The families in catalogue order (those without samples only with ``keep_empty``)."""
        for f in self.f.values():
            if keep_empty or f.samples:
                yield f


def _describe(specs: Iterable[MetricSpec]) -> Iterator[Metric]:
    return iter([_family(spec) for spec in specs])


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
    if t.engine_kind is not None:
        fam.add(TARGET_ENGINE, (t.name, role, t.engine_kind), 1)
    fam.add(SCRAPE_DURATION, (t.name,), t.last_scrape_duration_seconds)
    fam.add(SCRAPES, (t.name,), t.scrapes_total)
    fam.add(MISSED_TICKS, (t.name,), t.missed_ticks)
    for reason in sorted({*SCRAPE_ERROR_REASONS, *t.scrape_errors}):
        fam.add(SCRAPE_ERRORS, (t.name, reason), t.scrape_errors.get(reason, 0))
    fam.add(LAST_SUCCESS, (t.name,), t.last_success)
    fam.add(TARGET_STALE, (t.name,), t.stale)
    fam.add(GAUGE_PROCESSES, (t.name,), t.gauge_processes)
    for engine, n in sorted(t.counter_resets.items()):
        fam.add(COUNTER_RESETS, (t.name, engine), n)
    for reason in INVALID_REASONS:
        fam.add(INVALID_VALUES, (t.name, reason), t.invalid_values.get(reason, 0))
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
    if cap.num_speculative_tokens is not None and cap.num_speculative_tokens_source is not None:
        labels = (t.name, role, cap.num_speculative_tokens_source)
        fam.add(SPECULATIVE_TOKENS, labels, cap.num_speculative_tokens)
    for attr, spec in CAPACITY_GAUGES.items():
        fam.add(spec, (t.name, role), getattr(cap, attr))


def _observe_view(
    get_snapshot: SnapshotGetter,
) -> tuple[Mapping[str, TargetSnapshot], Mapping[str, PairView], SpeculationLimit | None]:
    """The parts of the current snapshot the observe families read: targets, pair view and
    the speculation limit."""
    snap = get_snapshot()
    return snap.targets, snap.pair, snap.observe.speculation_limit


class SpecwatchCollector(Collector):
    """The observe chain's families (:data:`~specwatch.export.catalogue.OBSERVE`) from
    ``get_snapshot()`` at scrape time (no I/O); families without samples are left out."""

    def __init__(self, get_snapshot: SnapshotGetter) -> None:
        self._get = get_snapshot

    def describe(self) -> Iterator[Metric]:
        """The observe families, without samples (for the registry's name check)."""
        return _describe(cat.OBSERVE)

    def collect(self) -> Iterator[Metric]:
        """Yield the families of the current snapshot."""
        targets, pair, limit = _observe_view(self._get)
        fam = _Families(cat.OBSERVE)
        fam.add(BUILD_INFO, (__version__,), 1)
        for t in targets.values():
            _target_rows(fam, t)
        for window, pv in pair.items():
            for attr, spec in PAIR_GAUGES.items():
                fam.add(spec, (window, pv.standard, pv.fly), getattr(pv, attr))
            for reason in THROUGHPUT_WITHHELD_REASONS:
                labels = (window, pv.standard, pv.fly, reason)
                fam.add(THROUGHPUT_WITHHELD, labels, pv.throughput_ratio_withheld == reason)
        if limit is not None:
            for c in limit.comparisons:
                ref = (c.reference,)
                fam.add(cat.SPECULATION_LIMIT_RUNNING, ref, c.running)
                fam.add(cat.SPECULATION_LIMIT_RUNNING_LOWER, ref, c.running_lower)
                fam.add(cat.SPECULATION_LIMIT_RUNNING_UPPER, ref, c.running_upper)
                fam.add(cat.SPECULATION_LIMIT_HIGHEST_RUNNING, ref, c.highest)
                for state in LIMIT_STATUSES:
                    fam.add(cat.SPECULATION_LIMIT_STATE, (c.reference, state), c.status == state)
            for b in limit.bands:
                fam.add(cat.CONCURRENCY_SPEED_RATIO, (b.band,), b.speed_ratio)
        yield from fam.families(keep_empty=False)


def _shadow_rows(fam: _Families, state: ShadowStats) -> None:
    for (category, arm, outcome), n in sorted(state.pairs_total.items()):
        fam.add(cat.SHADOW_PAIRS, (category, arm, outcome), n)
    fam.add_counts(cat.SHADOW_UNPAIRED, state.unpaired_total)
    fam.add_counts(cat.SHADOW_EXCLUDED, state.excluded_total, EXCLUDED_REASONS)
    fam.add_counts(cat.SHADOW_REPLAYS, state.replays_total)
    fam.add_counts(cat.LEDGER_WRITE_ERRORS, state.ledger_write_errors, WRITE_ERROR_REASONS)
    for attr, spec in cat.SUMMARY_GAUGES.items():
        for window, cats in state.windows.items():
            for category, s in cats.items():
                fam.add(spec, (window, category), getattr(s, attr))
    for window, cats in state.windows.items():
        for category, s in cats.items():
            fam.add(cat.MCNEMAR_P, (window, category, "two_sided"), s.p_two_sided)
            fam.add(cat.MCNEMAR_P, (window, category, "loss"), s.p_loss)
            if window == SINCE_START:  # only since start is anytime-valid: no e-value for a
                # rolling window (its counts, rates and intervals have their own names)
                fam.add(cat.E_VALUE, (window, category, "no_net_loss"), s.e_value)
            fam.add(cat.FLIP_RATIO, (window, category, "fly"), s.fly_flip_ratio)
            fam.add(cat.FLIP_RATIO, (window, category, "noise"), s.noise_flip_ratio)
            if s.lossless_pairs:
                fam.add(cat.LOSSLESS_FLIP_RATIO, (window, category, "standard"), s.spec_flip_ratio)
                fam.add(
                    cat.LOSSLESS_FLIP_RATIO,
                    (window, category, "noise"),
                    s.baseline_noise_flip_ratio,
                )
                if window == SINCE_START:
                    fam.add(cat.LOSSLESS_E_VALUE, (window, category), s.lossless_e_value)
            fam.add(cat.LOSSLESS_PAIRS, (window, category), s.lossless_pairs)
    for row in state.decisions:
        for attr, spec in cat.DECISION_GAUGES.items():
            fam.add(spec, (row.category,), getattr(row, attr))
        for verdict in VERDICTS:
            fam.add(cat.DECISION_VERDICT, (row.category, verdict), row.verdict == verdict)
    for band in state.by_load:
        for arm, n, ratio in (
            ("fly", band.pairs, band.fly_flip_ratio),
            ("noise", band.noise_pairs, band.noise_flip_ratio),
        ):
            fam.add(cat.LOAD_BAND_PAIRS, (band.band, arm), n)
            fam.add(cat.LOAD_BAND_FLIP_RATIO, (band.band, arm), ratio)
        if band.lossless_pairs:
            fam.add(cat.LOSSLESS_LOAD_BAND_PAIRS, (band.band,), band.lossless_pairs)
            for arm, ratio in (
                ("standard", band.lossless_standard_flip_ratio),
                ("noise", band.lossless_noise_flip_ratio),
            ):
                fam.add(cat.LOSSLESS_LOAD_BAND_FLIP_RATIO, (band.band, arm), ratio)
    if state.betting_log_e_value is not None:
        lw = state.betting_log_e_value
        e = exp_or_inf(lw)
        fam.add(cat.E_VALUE, (SINCE_START, OVERALL, "margin"), e)
    if state.change_log_value is not None:
        fam.add(cat.CHANGE_DETECTOR, (), exp_or_inf(state.change_log_value))
        fam.add(cat.CHANGE_DETECTOR_THRESHOLD, (), state.change_threshold)
    fam.add(cat.LEDGER_ROWS, (), state.ledger_rows)
    for name in LEDGER_STATES:
        fam.add(cat.LEDGER_STATE, (name,), state.ledger_state == name)
    for (category, arm, outcome), n in sorted(state.ledger_pairs.items()):
        fam.add(cat.LEDGER_PAIRS, (category, arm, outcome), n)
    fam.add(cat.SHADOW_CATEGORIES_FOLDED, (), state.categories_folded)
    fam.add(cat.SHADOW_CATEGORY_TAKEOVERS, (), state.category_takeovers)
    io = state.io
    if io is None:
        return
    fam.add(cat.SHADOW_QUEUE_DEPTH, (), io.queue_depth)
    fam.add(cat.SHADOW_IN_FLIGHT, (), io.in_flight)
    fam.add_counts(cat.SHADOW_DROPPED, io.dropped)
    fam.add_counts(cat.SHADOW_PAUSED, io.paused)
    fam.add_counts(cat.SHADOW_PAUSES, io.pauses_total)
    fam.add(cat.SHADOW_TRICKLED, (), io.trickled)
    fam.add_counts(cat.SHADOW_RECEIVED, io.received)
    fam.add_counts(cat.SHADOW_INGEST_ERRORS, io.ingest_errors)
    fam.add(cat.SHADOW_OFFERED, (), io.offered)
    fam.add(cat.SHADOW_NOT_SAMPLED, (), io.not_sampled)
    fam.add(cat.SHADOW_ADMITTED, (), io.admitted)
    fam.add_counts(cat.SHADOW_ARM_ERRORS, io.arm_errors)
    fam.add(cat.SHADOW_SINK_ERRORS, (), io.sink_errors)
    fam.add(cat.SHADOW_PROXY_REQUESTS, (), io.proxy_requests)
    fam.add(cat.SHADOW_PROXY_CLIENT_DISCONNECTS, (), io.proxy_client_disconnects)
    fam.add_counts(
        cat.SHADOW_PROXY_UPSTREAM_ERRORS, io.proxy_upstream_errors, PROXY_UPSTREAM_ERROR_REASONS
    )
    fam.add(cat.SHADOW_CANARY_OFFERED, (), io.canary_offered)
    fam.add_counts(cat.SHADOW_CANARY_BAD_LINES, io.canary_bad_lines)
    fam.add_counts(cat.SHADOW_REPLAY_RETRIES, io.replay_retries)
    fam.add_counts(cat.SHADOW_TOKEN_COUNT_FAILURES, io.token_count_failures)
    fam.add_counts(cat.SHADOW_REPLY_SPEC_STEPS, io.reply_spec_steps)
    fam.add_counts(cat.SHADOW_REPLY_DRAFT_TOKENS, io.reply_draft_tokens)
    fam.add_counts(cat.SHADOW_REPLY_ACCEPTED_TOKENS, io.reply_accepted_tokens)
    fam.add_counts(cat.SHADOW_REPLY_SPEC_REFUSED, io.reply_spec_refused)
    for key, alpha in sorted(io.reply_alpha().items()):
        fam.add(cat.SHADOW_REPLY_ACCEPTANCE, key, alpha)
    for key, tau in sorted(io.reply_tau().items()):
        fam.add(cat.SHADOW_REPLY_TAU, key, tau)
    fam.add_counts(cat.SHADOW_REPLY_FINISHES, io.reply_finishes)
    fam.add_counts(cat.SHADOW_REPLY_FINISHES_WITH_SPEC, io.reply_finishes_with_spec)
    for key, share in sorted(io.spec_metrics_coverage().items()):
        fam.add(cat.SHADOW_SPEC_COVERAGE, key, share)


class ShadowCollector(Collector):
    """The shadow chain's families (:data:`~specwatch.export.catalogue.SHADOW`) from
    ``get_stats()`` (``None`` before the first refresh: nothing is exported).

    The counters and paired-statistics gauges are exported even without samples (``# TYPE``
    lines from the first refresh); ``specwatch_ledger_rows`` needs ``stats.ledger_rows`` and the
    I/O families (:data:`~specwatch.export.catalogue.SHADOW_IO`) need ``stats.io``.
    NaN values (no pairs yet) are left out; an overflowed margin e-value is ``+Inf``.
    """

    def __init__(self, get_stats: Callable[[], ShadowStats | None]) -> None:
        self._get = get_stats

    def describe(self) -> Iterator[Metric]:
        """The shadow families, without samples (for the registry's name check)."""
        return _describe(cat.SHADOW)

    def collect(self) -> Iterator[Metric]:
        """Yield the families of the latest statistics."""
        state = self._get()
        if state is None:
            return
        fam = _Families(cat.SHADOW)
        _shadow_rows(fam, state)
        skip = set() if state.io is not None else {spec.name for spec in cat.SHADOW_IO}
        if state.ledger_rows is None:
            skip.add(cat.LEDGER_ROWS.name)
        for f in fam.families(keep_empty=True):
            if f.name not in skip:
                yield f


class AlertsCollector(Collector):
    """The alerting families (:data:`~specwatch.export.catalogue.ALERTS`) from ``get_state()``:
    ``specwatch_alert_firing`` 1 per active alert (its identifying labels, no external labels),
    per configured Alertmanager (``peer``, its redacted URL) the accepted alerts, failed sends
    by reason (the known reasons from 0), the outbox depth, whether the last send succeeded,
    when the last one failed and its clock offset; whether delivery works
    (``specwatch_alertmanager_delivering``), the cause held per target and alert; and
    ``specwatch_alert_state_errors_total{reason}`` (the known reasons from 0)."""

    def __init__(self, get_state: Callable[[], AlertingState]) -> None:
        self._get = get_state

    def describe(self) -> Iterator[Metric]:
        """The alerting families, without samples (for the registry's name check)."""
        return _describe(cat.ALERTS)

    def collect(self) -> Iterator[Metric]:
        """Yield the families of the current alerting state."""
        state = self._get()
        fam = _Families(cat.ALERTS)
        for alert in state.firing:
            fam.add(cat.ALERT_FIRING, (), 1, extra=alert.labels)
        for peer in state.peers:
            fam.add(cat.ALERTMANAGER_SENT, (peer.peer,), peer.sent_alerts)
            errors = {(peer.peer, r): peer.errors.get(r, 0) for r in SEND_ERROR_REASONS}
            fam.add_counts(cat.ALERTMANAGER_SEND_ERRORS, errors)
            fam.add(cat.ALERTMANAGER_OUTBOX_DEPTH, (peer.peer,), peer.outbox_depth)
            fam.add(cat.ALERTMANAGER_LAST_SEND_SUCCESS, (peer.peer,), peer.last_send_ok)
            fam.add(cat.ALERTMANAGER_LAST_ERROR, (peer.peer,), peer.last_error_at)
            fam.add(cat.ALERTMANAGER_CLOCK_OFFSET, (peer.peer,), peer.clock_offset)
        fam.add(cat.ALERTMANAGER_DELIVERING, (), state.delivering)
        for c in state.causes:
            fam.add(cat.ALERT_CAUSE, (c.alertname, c.target, c.role, c.cause), 1)
        fam.add_counts(cat.ALERT_STATE_ERRORS, state.state_errors, STATE_ERROR_REASONS)
        yield from fam.families(keep_empty=True)


class ListenerCollector(Collector):
    """The listener families (:data:`~specwatch.export.catalogue.LISTENERS`) from
    ``get_listeners()``: refused connections and requests by listener and reason (the known
    reasons from 0) and open connections."""

    def __init__(self, get_listeners: Callable[[], Sequence[ListenerStats]]) -> None:
        self._get = get_listeners

    def describe(self) -> Iterator[Metric]:
        """The listener families, without samples."""
        return _describe(cat.LISTENERS)

    def collect(self) -> Iterator[Metric]:
        """Yield the families of the current listener counters."""
        fam = _Families(cat.LISTENERS)
        for stats in self._get():
            for reason in sorted({*REFUSAL_REASONS, *stats.refused}):
                fam.add(cat.LISTENER_REFUSED, (stats.name, reason), stats.refused.get(reason, 0))
            fam.add(cat.LISTENER_OPEN, (stats.name,), stats.open)
        yield from fam.families(keep_empty=True)


#: A collector factory a component may hand to :func:`specwatch.server.app.build_app`.
CollectorFactory = Callable[[SnapshotGetter], Collector]
