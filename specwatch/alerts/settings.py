"""Settings of the alerts chain: detector thresholds and windows, Alertmanager and its TLS."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from specwatch.core.logs import redact_url


class DetectSettings(BaseModel):
    """Settings group ``detect`` (env ``SPECWATCH_DETECT__*``); durations in seconds.

    Defaults equal the Prometheus rules' constants; change both together.
    """

    model_config = ConfigDict(
        frozen=True, extra="forbid", allow_inf_nan=False, use_attribute_docstrings=True
    )

    # SpecAcceptanceDrop: short-window value below ratio x baseline (alpha, or tau - 1)
    acceptance_drop_ratio: float = Field(default=0.8, gt=0, lt=1)
    """SpecAcceptanceDrop fires when the short-window acceptance falls below this fraction
    of the baseline window's."""
    acceptance_min_drafts_per_second: float = Field(default=0.2, ge=0)
    """Acceptance alerts need at least this many drafts per second (too few drafts make
    acceptance noise)."""
    acceptance_drop_for: float = Field(default=600.0, ge=0)
    """Seconds SpecAcceptanceDrop's condition must hold before it fires."""
    # SpecAcceptanceDecay: short-window alpha below acceptance_drop_ratio x the best sustained
    # alpha (the acceptance_sustained_window value, at its highest over the last
    # acceptance_decay_lookback seconds); a baseline that does not decay with the signal, and
    # that spans restarts, so a restarted engine that comes back lower fires too
    acceptance_decay_lookback: float = Field(default=21600.0, gt=0)
    """SpecAcceptanceDecay compares with the best sustained acceptance of the last this many
    seconds (spans restarts)."""
    acceptance_decay_for: float = Field(default=900.0, ge=0)
    """Seconds SpecAcceptanceDecay's condition must hold before it fires."""
    # SpecFLyGainLost: alpha_fly - alpha_standard below this (15m window)
    fly_gain_min: float = 0.02
    """SpecFLyGainLost fires when FLy's acceptance exceeds the standard arm's by less than
    this (absolute)."""
    fly_gain_min_drafts_per_second: float = Field(default=0.2, ge=0)
    """SpecFLyGainLost needs at least this many drafts per second on both servers."""
    fly_gain_for: float = Field(default=1800.0, ge=0)
    """Seconds SpecFLyGainLost's condition must hold before it fires."""
    # SpecDecodeInactive: tokens flow (tokens/s above this) and zero drafts
    inactive_min_generation_tokens_per_second: float = Field(default=1.0, ge=0)
    """SpecDecodeInactive fires when tokens flow above this rate (per second) and no drafts
    are made."""
    inactive_for: float = Field(default=600.0, ge=0)
    """Seconds SpecDecodeInactive's condition must hold before it fires."""
    # SpecBudgetStarvation
    budget_min_running: float = Field(default=8.0, ge=0)
    """SpecBudgetStarvation looks only at servers running at least this many requests."""
    budget_drafts_per_step_ratio: float = Field(default=0.5, gt=0, le=1)
    """SpecBudgetStarvation fires when fewer than this fraction of running requests get
    drafts per step ..."""
    budget_draft_length_ratio: float = Field(default=0.9, gt=0, le=1)
    """... or drafts are shorter than this fraction of K."""
    budget_fill_ratio: float = Field(default=0.9, gt=0, le=1)
    """Short drafts are blamed on the token budget only while the tokens scheduled per engine
    step reach this fraction of max_num_batched_tokens (below it every step had room: the
    drafts are short by design, dynamic K or structured output)."""
    budget_for: float = Field(default=900.0, ge=0)
    """Seconds SpecBudgetStarvation's condition must hold before it fires."""
    # SpecTokenBudgetBound (info): a configuration finding, reported once limits are known
    budget_finding_for: float = Field(default=0.0, ge=0)
    """Seconds before the SpecTokenBudgetBound configuration finding (info) is reported."""
    # SpecAdmissionStall: requests wait while running is far below the ceiling the limits allow
    # (min of max_num_seqs and the token budget's R_max, most-loaded engine), the KV cache is not
    # saturated, no request finished over rate_window and generation is near zero
    stall_min_waiting: float = Field(default=1.0, ge=0)
    """SpecAdmissionStall needs at least this many requests waiting ..."""
    stall_max_running_ratio: float = Field(default=0.1, gt=0, le=1)
    """... while running is below this fraction of the ceiling the limits allow ..."""
    stall_max_kv_cache_usage: float = Field(default=0.9, gt=0, le=1)
    """... the KV cache is used below this fraction ..."""
    stall_max_generation_tokens_per_second: float = Field(default=1.0, ge=0)
    """... and generation is below this many tokens per second."""
    stall_for: float = Field(default=300.0, ge=0)
    """Seconds SpecAdmissionStall's condition must hold before it fires."""
    # SpecQualityDrift: the e-value bounds follow from paired.alpha (the alerting policy of
    # specwatch.shadow.stats.policy), not knobs here
    quality_min_pairs: int = Field(default=200, ge=1)
    """SpecQualityDrift needs at least this many paired outcomes."""
    quality_e_value_for: float = Field(default=0.0, ge=0)
    """Seconds the e-value must stay at its page bound before SpecQualityDrift fires (0: an
    e-value at its bound is decisive when it gets there; Ville's inequality holds at any
    stopping time)."""
    quality_non_inferiority_for: float = Field(default=900.0, ge=0)
    """Seconds non-inferiority must stay rejected before SpecQualityDrift fires."""
    # SpecFlipRateAboveNoise: pooled two-proportion z (one-sided p <= 0.001 at 3.09)
    flip_z: float = Field(default=3.09, gt=0)
    """SpecFlipRateAboveNoise fires when FLy's flip rate exceeds the noise arm's by this
    z-score (3.09: one-sided p <= 0.001)."""
    flip_min_compared: int = Field(default=50, ge=1)
    """SpecFlipRateAboveNoise needs at least this many compared pairs on each side."""
    flip_for: float = Field(default=900.0, ge=0)
    """Seconds SpecFlipRateAboveNoise's condition must hold before it fires."""
    # SpecLosslessFlips: since-start lossless e-value >= 1/paired.alpha on >= this many greedy
    # pairs with a baseline (no speculation) and a noise answer
    lossless_min_pairs: int = Field(default=10, ge=1)
    """SpecLosslessFlips needs at least this many greedy pairs with a baseline and a noise
    answer."""
    lossless_for: float = Field(default=0.0, ge=0)
    """Seconds SpecLosslessFlips' condition must hold before it fires (0: the e-value at
    1/alpha on at least `lossless_min_pairs` pairs is decisive; thin evidence is held back by
    the minimum pairs, not by waiting)."""
    # self-health
    target_down_for: float = Field(default=300.0, ge=0)
    """Seconds a target's scrapes must fail before SpecwatchTargetDown fires."""
    shadow_min_generation_tokens_per_second: float = Field(default=10.0, ge=0)
    """SpecwatchShadowStalled fires only while the servers together generate more than this
    many tokens per second (live traffic flows)."""
    shadow_stalled_for: float = Field(default=900.0, ge=0)
    """Seconds with no new pair (while the arms generate) before SpecwatchShadowStalled
    fires."""
    ledger_failing_for: float = Field(default=600.0, ge=0)
    """Seconds of ledger write errors before SpecwatchLedgerFailing fires."""
    # Which of specwatch's windows each detector reads (names of ``Settings.windows`` or
    # ``since_start``). A baseline window that is not configured falls back to ``since_start``.
    acceptance_short_window: str = "5m"
    """Window (a name from `windows`) of the current acceptance in the acceptance alerts."""
    acceptance_baseline_window: str = "1h"
    """Window of the baseline acceptance in SpecAcceptanceDrop; absent from `windows`:
    `since_start`."""
    acceptance_sustained_window: str = "15m"
    """Window whose best value over `acceptance_decay_lookback` is SpecAcceptanceDecay's
    baseline."""
    rate_window: str = "5m"
    """Window of the rates (drafts, tokens, requests per second) the detectors read."""
    fly_gain_window: str = "15m"
    """Window of the acceptances SpecFLyGainLost compares."""
    flip_window: str = "1h"
    """Window (a name from `paired.windows`) of the flip rates SpecFlipRateAboveNoise
    compares."""
    shadow_stalled_window: str = "15m"
    """Window (from `paired.windows`) in which SpecwatchShadowStalled looks for new pairs."""
    ledger_errors_window: float = Field(default=300.0, gt=0)
    """Seconds over which ledger write errors are counted for SpecwatchLedgerFailing."""


#: Where runbook links point by default; teams set ``alerting.runbook_base_url`` to their copy.
DEFAULT_RUNBOOK_BASE_URL = "https://github.com/specwatch/specwatch/blob/main/docs/runbook.md"

#: An alert's ``endsAt`` is this many times ``max(resend_interval, evaluation_interval)``
#: ahead, so Alertmanager resolves it on its own when specwatch stops (Prometheus uses 4).
LEASE_FACTOR = 4.0

#: A valid Prometheus label name.
LABEL_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def default_generator_url(host: str, port: int) -> str:
    """The sidecar's snapshot, the ``generatorURL`` of its alerts when none is configured:
    ``http://{host}:{port}/api/v1/snapshot``."""
    return f"http://{host}:{port}/api/v1/snapshot"


class TLSSettings(BaseModel):
    """TLS options for the Alertmanager connection."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", allow_inf_nan=False, use_attribute_docstrings=True
    )

    ca_file: Path | None = None
    """CA bundle that signs Alertmanager's certificate; unset: the system's."""
    cert_file: Path | None = None
    """Client certificate for mutual TLS (with `key_file`)."""
    key_file: Path | None = None
    """Private key of `cert_file`."""
    insecure_skip_verify: bool = False
    """Do not verify Alertmanager's certificate. For tests only."""

    @model_validator(mode="after")
    def _cert_and_key(self) -> Self:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("tls.cert_file and tls.key_file must be set together")
        return self


class AlertingSettings(BaseModel):
    """Settings group ``alerting`` (env ``SPECWATCH_ALERTING__*``). Durations in seconds.

    ``urls`` empty disables delivery (detectors and gauges still run).
    :data:`LEASE_FACTOR` times ``max(resend_interval, evaluation_interval)`` is the ``endsAt``
    lease.

    Provenance of every pushed alert: ``namespace`` and ``pod`` become labels (set them from the
    downward API: ``SPECWATCH_ALERTING__NAMESPACE`` from ``metadata.namespace`` and
    ``SPECWATCH_ALERTING__POD`` from ``metadata.name``, as ``deploy/base/deployment.yaml`` does),
    so two FLy pairs in one cluster never merge into one alert; ``generator_url`` is the
    ``generatorURL`` (the sidecar's ``/api/v1/snapshot``; empty: built from ``pod`` or the host
    name and the server port by the caller); ``runbook_base_url`` the runbook link base.
    Restarts: ``specwatch run`` saves its ``for`` timers and active alerts every evaluation to
    ``state_file`` (``None``: ``<ledger.path>-alerts.json``, next to the ledger; ``""``: not
    saved). A file written less than ``restore_max_age`` seconds ago is restored at start
    (Prometheus' ``for-outage-tolerance``: 1 h); a restored alert the detectors do not find
    again stays firing for at most ``restore_grace`` seconds after the start (their windows
    refill meanwhile; Prometheus' ``for-grace-period``: 10 min).
    """

    model_config = ConfigDict(
        frozen=True, extra="forbid", allow_inf_nan=False, use_attribute_docstrings=True
    )

    urls: list[str] = Field(default_factory=list)
    """Alertmanager base URLs; every alert goes to each. Empty: no delivery (detectors and
    gauges still run)."""
    bearer_token: SecretStr | None = None
    """Sent as `Authorization: Bearer` to Alertmanager; not with `basic_username`."""
    basic_username: str | None = None
    """HTTP basic auth user for Alertmanager (with `basic_password`)."""
    basic_password: SecretStr | None = None
    """HTTP basic auth password for Alertmanager."""
    tls: TLSSettings = Field(default_factory=TLSSettings)
    """TLS to Alertmanager (the `alerting.tls.*` keys)."""
    evaluation_interval: float = Field(default=15.0, gt=0)
    """Seconds between two evaluations of the detectors."""
    resend_interval: float = Field(default=60.0, gt=0)
    """Seconds between two sends of a still-firing alert; alerts resolve on their own 4
    times max(this, evaluation_interval) after specwatch stops sending."""
    timeout: float = Field(default=10.0, gt=0)
    """Seconds one send to Alertmanager may take."""
    max_attempts: int = Field(default=3, ge=1)
    """Sends per alert batch before it waits in the outbox for the next evaluation (5xx,
    408, 429 and network errors are retried)."""
    outbox_size: int = Field(default=1000, ge=1)
    """Most distinct alerts kept while an Alertmanager is unreachable (the oldest go first);
    raise it if `specwatch_alertmanager_send_errors_total{reason="outbox_overflow"}` grows."""
    external_labels: dict[str, str] = Field(default_factory=dict)
    """Labels added to every alert (`{"cluster": "eu-1"}`)."""
    runbook_base_url: str = DEFAULT_RUNBOOK_BASE_URL
    """Base of the `runbook_url` annotation; point it at your copy of the runbook."""
    generator_url: str = ""
    """`generatorURL` of the alerts; empty: the sidecar's `/api/v1/snapshot`, from `pod` or
    the host name."""
    namespace: str = ""
    """`namespace` label on every alert; set it from the downward API
    (`metadata.namespace`)."""
    pod: str = ""
    """`pod` label on every alert; set it from the downward API (`metadata.name`)."""
    state_file: str | None = None
    """Where firing alerts and `for` timers are saved across restarts; unset: next to the
    ledger; empty: not saved."""
    restore_max_age: float = Field(default=3600.0, gt=0)
    """A saved state older than this many seconds is not restored at start."""
    restore_grace: float = Field(default=600.0, ge=0)
    """A restored alert the detectors do not find again keeps firing at most this many
    seconds after start."""

    @field_validator("urls")
    @classmethod
    def _http_urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"alertmanager url must be http(s): {redact_url(url)!r}")
        return [u.rstrip("/") for u in urls]

    def provenance_labels(self) -> dict[str, str]:
        """``external_labels`` plus ``namespace`` and ``pod`` when set."""
        out = dict(self.external_labels)
        if self.namespace:
            out["namespace"] = self.namespace
        if self.pod:
            out["pod"] = self.pod
        return out

    @field_validator("external_labels")
    @classmethod
    def _valid_labels(cls, labels: dict[str, str]) -> dict[str, str]:
        for name, value in labels.items():
            if not LABEL_NAME_RE.match(name) or not value:
                raise ValueError(f"external label {name!r}={value!r} is not a valid label")
        return labels

    @model_validator(mode="after")
    def _one_auth(self) -> Self:
        if self.bearer_token is not None and self.basic_username is not None:
            raise ValueError("set either bearer_token or basic_username/password, not both")
        if (self.basic_username is None) != (self.basic_password is None):
            raise ValueError("basic_username and basic_password must be set together")
        return self

    @property
    def lease(self) -> float:
        """``endsAt`` lease in seconds."""
        return LEASE_FACTOR * max(self.resend_interval, self.evaluation_interval)
