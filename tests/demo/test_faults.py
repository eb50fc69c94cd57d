"""Every fault docs/demo.md lists fires its alert at the demo's defaults within the time the
docs give (each test runs ``specwatch demo --no-ui`` in a child process and reads
``/api/v1/snapshot``; the bounds are the documented ones, which hold on a busy 2-core machine;
on a quiet one the alerts come in about a third of that)."""

from __future__ import annotations

import pytest

from tests.demo.faults import fault_to_alert

pytestmark = pytest.mark.slow  # 17-76 s each (a demo run until its alert fires)


def test_fly_entropy_fault_fires_quality_drift_within_120_s() -> None:
    """FLy waives far more rejections (threshold 0.05) after 20 s of normal traffic: the
    e-value passes 20 and the critical SpecQualityDrift (check e_value, hypothesis
    no_net_loss) fires within 120 s (about 45 s measured on a quiet machine)."""
    run = fault_to_alert(
        "fly", {"fly_entropy_threshold": 0.05}, "SpecQualityDrift", warmup_s=20, timeout_s=120
    )
    assert run.seconds is not None, run.output
    assert run.labels["check"] == "e_value"
    assert run.labels["severity"] == "critical"


def test_single_engine_drafter_fault_fires_acceptance_drop_within_90_s() -> None:
    """The drafter degrades on engine 1 of the standard server after 30 s: engine 1's α over
    the 20 s window falls under 80 % of the longest window's and SpecAcceptanceDrop fires for
    that engine within 90 s (about 30 s measured on a quiet machine)."""
    fault = {"draft_noise_multiplier": 3, "draft_noise_engine": 1}
    run = fault_to_alert("standard", fault, "SpecAcceptanceDrop", warmup_s=30, timeout_s=90)
    assert run.seconds is not None, run.output
    assert run.labels["engine"] == "1"
    assert run.labels["scope"] == "engine"
    assert run.labels["target"] == "standard"


def test_token_budget_bound_demo_fires_budget_starvation_within_90_s() -> None:
    """``--max-num-batched-tokens 24`` (below N × (1 + K) = 80; D_full 4): the demo raises
    its load to a closed loop and says so, and SpecBudgetStarvation (reason budget_cap) fires
    within 90 s of the start."""
    run = fault_to_alert(
        "standard",
        {},
        "SpecBudgetStarvation",
        warmup_s=0,
        timeout_s=90,
        extra=("--max-num-batched-tokens", "24"),
    )
    assert run.seconds is not None, run.output
    assert run.labels["reason"] == "budget_cap"


def test_scrape_failure_fault_fires_target_down_within_30_s() -> None:
    """The FLy simulator answers /metrics with HTTP 500: SpecwatchTargetDown fires for the fly
    target within 30 s (about 12 s measured)."""
    run = fault_to_alert(
        "fly", {"metrics_mode": "error"}, "SpecwatchTargetDown", warmup_s=10, timeout_s=30
    )
    assert run.seconds is not None, run.output
    assert run.labels["target"] == "fly"
