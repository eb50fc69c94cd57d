"""Prometheus' ``for:`` in Python and the stateful :class:`Detector`.

:class:`ForTracker` keeps how long each candidate alert has held; :func:`for_seconds` gives each
alert's duration from :class:`~specwatch.alerts.settings.DetectSettings`; :func:`evaluate` and
:class:`Detector` run :func:`specwatch.alerts.rules.candidates` through the tracker.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence

from specwatch.alerts.alert import Alert, AlertKey, alert_key, keep_distinct
from specwatch.alerts.rules import (
    NOT_ONE_SERVER_WINDOW_SECONDS,
    SustainedKey,
    candidates,
    sustained_levels,
)
from specwatch.alerts.settings import DetectSettings
from specwatch.observe.values import ObserveView
from specwatch.shadow.published import ShadowStats

__all__ = ["Detector", "ForTracker", "evaluate", "for_seconds"]


class ForTracker:
    """Prometheus' ``for:``: a candidate alert fires once it has held continuously for its
    duration. A candidate missing from one update starts over (pending state is dropped), as a
    rule whose expression returns nothing for one evaluation does.
    """

    def __init__(self, for_seconds: Callable[[Alert], float]) -> None:
        self._for = for_seconds
        self._since: dict[AlertKey, float] = {}
        self._restored: set[AlertKey] = set()
        self._hold_until = float("-inf")

    def update(self, candidates: Sequence[Alert], now: float) -> list[Alert]:
        """Candidates true now → those that have been true for their ``for`` (input order).

        A timer restored by :meth:`restore` that is missing from this update is kept until its
        hold ends (the detectors' windows refill after a restart); one seen again becomes an
        ordinary timer."""
        seen: dict[AlertKey, float] = {}
        firing: list[Alert] = []
        for alert in candidates:
            key = alert_key(alert.identity())
            since = seen.get(key, self._since.get(key, now))
            seen[key] = since
            if now - since >= self._for(alert):
                firing.append(alert)
        self._restored -= seen.keys()
        if now < self._hold_until:
            for key in self._restored:
                seen[key] = self._since[key]
        else:
            self._restored.clear()
        self._since = seen
        return firing

    def export(self) -> dict[AlertKey, float]:
        """``{alert identity: unix seconds its condition has held since}`` (pending and firing)."""
        return dict(self._since)

    def restore(self, since: Mapping[AlertKey, float], hold_until: float) -> None:
        """Take back timers from :meth:`export` of a previous process (start times kept, as
        Prometheus restores ``for`` state). Until ``hold_until`` (unix seconds) a restored timer
        survives updates that miss it; after that, a miss drops it as usual."""
        for key, start in since.items():
            self._since.setdefault(key, start)
            self._restored.add(key)
        self._hold_until = hold_until

    def pending(self) -> int:
        """Candidates currently tracked (pending or firing)."""
        return len(self._since)


def for_seconds(s: DetectSettings) -> Callable[[Alert], float]:
    """The ``for`` duration of an alert (by name)."""
    by_name = {
        "SpecAcceptanceDrop": s.acceptance_drop_for,
        "SpecAcceptanceDecay": s.acceptance_decay_for,
        "SpecFLyGainLost": s.fly_gain_for,
        "SpecDecodeInactive": s.inactive_for,
        "SpecBudgetStarvation": s.budget_for,
        "SpecAdmissionStall": s.stall_for,
        "SpecFlipRateAboveNoise": s.flip_for,
        "SpecLosslessFlips": s.lossless_for,
        "SpecwatchTargetDown": s.target_down_for,
        "SpecwatchTargetNotOneServer": s.target_down_for,
        "SpecwatchShadowStalled": s.shadow_stalled_for,
        "SpecwatchLedgerFailing": s.ledger_failing_for,
        "SpecNonInferiorityNotShown": s.quality_non_inferiority_for,
        "SpecTokenBudgetBound": s.budget_finding_for,
    }

    def get(alert: Alert) -> float:
        if alert.alertname == "SpecQualityDrift":
            return s.quality_e_value_for
        return by_name.get(alert.alertname, 0.0)

    return get


def evaluate(
    observe: ObserveView,
    shadow: ShadowStats | None,
    settings: DetectSettings,
    now: float,
    *,
    tracker: ForTracker | None = None,
    ledger_errors_increase: float | None = None,
    sustained_best: Mapping[SustainedKey, float] | None = None,
    alternations: Mapping[str, float] | None = None,
) -> list[Alert]:
    """The alerts firing at ``now``: :func:`candidates` that have held for their ``for``
    duration according to ``tracker`` (keep one :class:`ForTracker` built with
    :func:`for_seconds` across calls; :class:`Detector` does). Without a tracker, every
    candidate is returned (``for`` = 0). The candidates' labels go through
    :func:`~specwatch.alerts.alert.keep_distinct` first, so the ``for`` timers, the replay and
    Alertmanager all key an alert by the label set Alertmanager will see."""
    found = keep_distinct(
        candidates(
            observe,
            shadow,
            settings,
            ledger_errors_increase=ledger_errors_increase,
            sustained_best=sustained_best,
            alternations=alternations,
        )
    )
    return tracker.update(found, now) if tracker is not None else found


class Detector:
    """Stateful wrapper: one :class:`ForTracker` and the ledger-error history across calls.

    ``evaluate(observe, shadow, now)`` → firing alerts (not thread-safe; call from one task).
    """

    def __init__(self, settings: DetectSettings) -> None:
        self.settings = settings
        self.tracker = ForTracker(for_seconds(settings))
        self._ledger: deque[tuple[float, float]] = deque()
        self._sustained: dict[SustainedKey, deque[tuple[float, float]]] = {}
        self._alternate: dict[str, deque[tuple[float, float]]] = {}

    def _ledger_increase(self, shadow: ShadowStats | None, now: float) -> float | None:
        if shadow is None:
            return None
        total = float(sum(shadow.ledger_write_errors.values()))
        self._ledger.append((now, total))
        while (
            len(self._ledger) > 1 and self._ledger[1][0] <= now - self.settings.ledger_errors_window
        ):
            self._ledger.popleft()
        return max(0.0, total - self._ledger[0][1])

    def _alternations(self, observe: ObserveView, now: float) -> dict[str, float]:
        """Each target's ``counters_alternate`` refusals over the last
        :data:`~specwatch.alerts.rules.NOT_ONE_SERVER_WINDOW_SECONDS` (PromQL ``increase`` of
        ``specwatch_scrape_errors_total{reason="counters_alternate"}``, sampled at each
        evaluation); targets no longer configured are forgotten."""
        out: dict[str, float] = {}
        for name in [n for n in self._alternate if n not in observe.targets]:
            del self._alternate[name]
        for name, t in observe.targets.items():
            total = float(t.scrape_errors.get("counters_alternate", 0))
            q = self._alternate.setdefault(name, deque())
            q.append((now, total))
            while len(q) > 1 and q[1][0] <= now - NOT_ONE_SERVER_WINDOW_SECONDS:
                q.popleft()
            out[name] = max(0.0, total - q[0][1])
        return out

    def _sustained_best(self, observe: ObserveView, now: float) -> dict[SustainedKey, float]:
        """Highest sustained-window α of each series over the lookback (PromQL
        ``max_over_time`` of the recorded 15m ratio, sampled at each evaluation)."""
        cutoff = now - self.settings.acceptance_decay_lookback
        for key, value in sustained_levels(observe, self.settings).items():
            self._sustained.setdefault(key, deque()).append((now, value))
        best: dict[SustainedKey, float] = {}
        for key in list(self._sustained):
            q = self._sustained[key]
            while q and q[0][0] < cutoff:
                q.popleft()
            if not q:
                del self._sustained[key]
                continue
            best[key] = max(v for _, v in q)
        return best

    def evaluate(self, observe: ObserveView, shadow: ShadowStats | None, now: float) -> list[Alert]:
        """Firing alerts now (see :func:`evaluate`)."""
        return evaluate(
            observe,
            shadow,
            self.settings,
            now,
            tracker=self.tracker,
            ledger_errors_increase=self._ledger_increase(shadow, now),
            sustained_best=self._sustained_best(observe, now),
            alternations=self._alternations(observe, now),
        )
