"""What the alerting chain publishes, and its label vocabularies (pure values, no I/O).

:class:`AlertingState` is the alert loop's published value (one immutable value per tick,
``Snapshot.alerts``); :data:`SEND_ERROR_REASONS` and :data:`STATE_ERROR_REASONS` are the reason
names its counters carry, exported from 0. The producers (:mod:`specwatch.alerts.alertmanager`,
:mod:`specwatch.alerts.component`) and the exporters (:mod:`specwatch.export.prometheus`,
:mod:`specwatch.export.json`) read them from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "ALERT_NAMES",
    "CAUSE_ALERTS",
    "RULES_ONLY_ALERTS",
    "SEND_ERROR_REASONS",
    "STATE_ERROR_REASONS",
    "AlertCause",
    "AlertingState",
    "FiringAlert",
    "PeerState",
]

#: Every alert the sidecar's own evaluation raises and pushes to Alertmanager
#: (:mod:`specwatch.alerts.rules`); the mixin (deploy/mixin) has the same names plus
#: :data:`RULES_ONLY_ALERTS`, a test holds the two to that.
ALERT_NAMES: tuple[str, ...] = (
    "SpecQualityDrift",
    "SpecQualityChange",
    "SpecFlipRateAboveNoise",
    "SpecLosslessFlips",
    "SpecNonInferiorityNotShown",
    "SpecAcceptanceDrop",
    "SpecAcceptanceDecay",
    "SpecFLyGainLost",
    "SpecDecodeInactive",
    "SpecBudgetStarvation",
    "SpecAdmissionStall",
    "SpecTokenBudgetBound",
    "SpecwatchTargetDown",
    "SpecwatchTargetNotOneServer",
    "SpecwatchShadowStalled",
    "SpecwatchLedgerFailing",
)

#: Alerts only the Prometheus rules have, each with why the sidecar cannot raise it.
RULES_ONLY_ALERTS: Mapping[str, str] = {
    "SpecQualityDriftFleet": (
        "the fleet page averages the since-start e-values of every specwatch sidecar; one "
        "sidecar sees only its own"
    ),
}

#: ``reason`` values of ``specwatch_alertmanager_send_errors_total``: ``http_3xx`` is a redirect
#: (not followed), ``bad_date`` an answer whose ``Date`` header is unreadable or more than
#: a day from specwatch's clock (its offset not used), ``internal`` a flush that failed on an
#: error of specwatch's own (logged with its traceback; the loop goes on).
SEND_ERROR_REASONS: tuple[str, ...] = (
    "timeout",
    "connect",
    "http_3xx",
    "http_4xx",
    "http_5xx",
    "bad_date",
    "internal",
    "outbox_overflow",
)

#: ``reason`` values of ``specwatch_alert_state_errors_total`` (the saved alert state file:
#: unreadable, malformed, older than it may be, not written).
STATE_ERROR_REASONS: tuple[str, ...] = ("read", "corrupt", "too_old", "write")


#: The alerts whose sidecar findings carry a ``cause`` label the mixin's rules take over
#: (``specwatch_alert_cause``).
CAUSE_ALERTS: tuple[str, ...] = (
    "SpecAcceptanceDrop",
    "SpecAcceptanceDecay",
    "SpecBudgetStarvation",
)


@dataclass(frozen=True, slots=True)
class AlertCause:
    """The cause the detectors name for one target's alert (``undetermined`` while several
    remain; where several findings of one alert and target disagree, ``undetermined`` too)."""

    alertname: str
    target: str
    role: str
    cause: str


@dataclass(frozen=True, slots=True)
class FiringAlert:
    """An active alert as the ``specwatch_alert_firing`` gauge shows it."""

    labels: Mapping[str, str]
    starts_at: float


@dataclass(frozen=True, slots=True)
class PeerState:
    """One configured Alertmanager as the sender sees it: ``peer`` (its URL, redacted), the
    alerts it accepted (2xx), failed sends by reason (:data:`SEND_ERROR_REASONS`), deliveries
    waiting for it, whether the last send succeeded (``None``: none tried yet), the reason and
    unix time of the last failure, and its clock minus specwatch's in seconds (from the
    ``Date`` header of its last answer; ``None`` before one)."""

    peer: str
    sent_alerts: int = 0
    errors: Mapping[str, int] = field(default_factory=dict)
    outbox_depth: int = 0
    last_send_ok: bool | None = None
    last_error: str = ""
    last_error_at: float | None = None
    clock_offset: float | None = None


@dataclass(frozen=True, slots=True)
class AlertingState:
    """What the alert loop publishes (one immutable value, swapped per tick); ``peers`` in the
    order of ``alerting.urls``; ``delivering``: some Alertmanager acknowledged a post recently
    (:meth:`specwatch.alerts.alertmanager.AlertSender.delivering`); ``causes``: for each target
    and cause-bearing alert the detectors hold (pending or firing), the cause they name
    (:data:`CAUSE_ALERTS`)."""

    firing: tuple[FiringAlert, ...] = ()
    peers: tuple[PeerState, ...] = ()
    state_errors: Mapping[str, int] = field(default_factory=dict)
    delivering: bool = False
    causes: tuple[AlertCause, ...] = ()

    @property
    def send_errors(self) -> dict[str, int]:
        """Failed sends by reason, summed over the peers."""
        out = dict.fromkeys(SEND_ERROR_REASONS, 0)
        for p in self.peers:
            for reason, n in p.errors.items():
                out[reason] = out.get(reason, 0) + n
        return out

    @property
    def outbox_depth(self) -> int:
        """Deliveries waiting, summed over the peers."""
        return sum(p.outbox_depth for p in self.peers)
