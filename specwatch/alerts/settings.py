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

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    # SpecAcceptanceDrop: short-window value below ratio x baseline (alpha, or tau - 1)
    acceptance_drop_ratio: float = Field(default=0.8, gt=0, lt=1)
    acceptance_min_drafts_per_second: float = Field(default=0.2, ge=0)
    acceptance_drop_for: float = Field(default=600.0, ge=0)
    # SpecAcceptanceDecay: short-window alpha below acceptance_drop_ratio x the best sustained
    # alpha (the acceptance_sustained_window value, at its highest over the last
    # acceptance_decay_lookback seconds); a baseline that does not decay with the signal, and
    # that spans restarts, so a restarted engine that comes back lower fires too
    acceptance_decay_lookback: float = Field(default=21600.0, gt=0)
    acceptance_decay_for: float = Field(default=900.0, ge=0)
    # SpecFLyGainLost: alpha_fly - alpha_standard below this (15m window)
    fly_gain_min: float = 0.02
    fly_gain_min_drafts_per_second: float = Field(default=0.2, ge=0)
    fly_gain_for: float = Field(default=1800.0, ge=0)
    # SpecDecodeInactive: tokens flow (tokens/s above this) and zero drafts
    inactive_min_generation_tokens_per_second: float = Field(default=1.0, ge=0)
    inactive_for: float = Field(default=600.0, ge=0)
    # SpecBudgetStarvation
    budget_min_running: float = Field(default=8.0, ge=0)
    budget_drafts_per_step_ratio: float = Field(default=0.5, gt=0, le=1)
    budget_draft_length_ratio: float = Field(default=0.9, gt=0, le=1)
    budget_for: float = Field(default=900.0, ge=0)
    # SpecTokenBudgetBound (info): a configuration finding, reported once limits are known
    budget_finding_for: float = Field(default=0.0, ge=0)
    # SpecAdmissionStall: requests wait while running is far below the ceiling the limits allow
    # (min of max_num_seqs and the token budget's R_max, most-loaded engine), the KV cache is not
    # saturated, no request finished over rate_window and generation is near zero
    stall_min_waiting: float = Field(default=1.0, ge=0)
    stall_max_running_ratio: float = Field(default=0.1, gt=0, le=1)
    stall_max_kv_cache_usage: float = Field(default=0.9, gt=0, le=1)
    stall_max_generation_tokens_per_second: float = Field(default=1.0, ge=0)
    stall_for: float = Field(default=300.0, ge=0)
    # SpecQualityDrift: the e-value bound is 1/paired.alpha (the summary's alarm), not a knob here
    quality_min_pairs: int = Field(default=200, ge=1)
    quality_e_value_for: float = Field(default=300.0, ge=0)
    quality_non_inferiority_for: float = Field(default=900.0, ge=0)
    # SpecFlipRateAboveNoise: pooled two-proportion z (one-sided p <= 0.001 at 3.09)
    flip_z: float = Field(default=3.09, gt=0)
    flip_min_compared: int = Field(default=50, ge=1)
    flip_for: float = Field(default=900.0, ge=0)
    # SpecLosslessFlips: since-start lossless e-value >= 1/paired.alpha on >= this many greedy
    # pairs with a baseline (no speculation) and a noise answer
    lossless_min_pairs: int = Field(default=10, ge=1)
    lossless_for: float = Field(default=300.0, ge=0)
    # self-health
    target_down_for: float = Field(default=300.0, ge=0)
    shadow_min_generation_tokens_per_second: float = Field(default=10.0, ge=0)
    shadow_stalled_for: float = Field(default=900.0, ge=0)
    ledger_failing_for: float = Field(default=600.0, ge=0)
    # Which of specwatch's windows each detector reads (names of ``Settings.windows`` or
    # ``since_start``). A baseline window that is not configured falls back to ``since_start``.
    acceptance_short_window: str = "5m"
    acceptance_baseline_window: str = "1h"
    acceptance_sustained_window: str = "15m"
    rate_window: str = "5m"
    fly_gain_window: str = "15m"
    flip_window: str = "1h"
    shadow_stalled_window: str = "15m"
    ledger_errors_window: float = Field(default=300.0, gt=0)


#: Where runbook links point by default; teams set ``alerting.runbook_base_url`` to their copy.
DEFAULT_RUNBOOK_BASE_URL = "https://github.com/specwatch/specwatch/blob/main/docs/runbook.md"

#: A valid Prometheus label name.
LABEL_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def default_generator_url(host: str, port: int) -> str:
    """The sidecar's snapshot, the ``generatorURL`` of its alerts when none is configured:
    ``http://{host}:{port}/api/v1/snapshot``."""
    return f"http://{host}:{port}/api/v1/snapshot"


class TLSSettings(BaseModel):
    """TLS options for the Alertmanager connection."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    insecure_skip_verify: bool = False

    @model_validator(mode="after")
    def _cert_and_key(self) -> Self:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("tls.cert_file and tls.key_file must be set together")
        return self


class AlertingSettings(BaseModel):
    """Settings group ``alerting`` (env ``SPECWATCH_ALERTING__*``). Durations in seconds.

    ``urls`` empty disables delivery (detectors and gauges still run). ``lease_factor`` times
    ``max(resend_interval, evaluation_interval)`` is the ``endsAt`` lease (Prometheus: 4).

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

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    urls: list[str] = Field(default_factory=list)
    bearer_token: SecretStr | None = None
    basic_username: str | None = None
    basic_password: SecretStr | None = None
    tls: TLSSettings = Field(default_factory=TLSSettings)
    evaluation_interval: float = Field(default=15.0, gt=0)
    resend_interval: float = Field(default=60.0, gt=0)
    lease_factor: float = Field(default=4.0, ge=2.0)
    timeout: float = Field(default=10.0, gt=0)
    max_attempts: int = Field(default=3, ge=1)
    retry_initial_backoff: float = Field(default=0.5, ge=0)
    retry_max_backoff: float = Field(default=8.0, ge=0)
    outbox_size: int = Field(default=1000, ge=1)
    external_labels: dict[str, str] = Field(default_factory=dict)
    runbook_base_url: str = DEFAULT_RUNBOOK_BASE_URL
    generator_url: str = ""
    namespace: str = ""
    pod: str = ""
    state_file: str | None = None
    restore_max_age: float = Field(default=3600.0, gt=0)
    restore_grace: float = Field(default=600.0, ge=0)

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
        return self.lease_factor * max(self.resend_interval, self.evaluation_interval)
