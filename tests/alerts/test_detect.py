"""Detector conditions (specwatch.alerts.conditions): the same cases as the promtool tests, same
numbers, and the thresholds checked against the Prometheus rules file."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
from scipy.stats import chi2_contingency

from deploy.mixin.render import alert_rules, load_rules
from specwatch.alerts.alert import Alert, Severity
from specwatch.alerts.conditions import (
    BudgetInputs,
    acceptance_drop,
    admission_stall,
    budget_starvation,
    decode_inactive,
    flip_rate_above_noise,
    fly_gain_lost,
    mcnemar_z,
    quality_drift,
    token_budget_bound,
    two_proportion_z,
)
from specwatch.alerts.pending import ForTracker
from specwatch.alerts.settings import DetectSettings
from specwatch.shadow.settings import PairedSettings
from specwatch.shadow.stats.policy import PagePolicy
from specwatch.vllm.budget import budget_limits

S = DetectSettings()
#: The default paired.alpha; the e-value bound everywhere is 1/alpha = 20.
ALPHA = PairedSettings().alpha
NAN = float("nan")


def _has(expr: str, fragment: str) -> bool:
    """``fragment`` occurs in ``expr`` not followed by more digits ("< 0.8" is not in "< 0.85")."""
    return re.search(re.escape(fragment) + r"(?![\d.])", expr) is not None


def _seconds(duration: str) -> float:
    unit = {"s": 1, "m": 60, "h": 3600}[duration[-1]]
    return float(duration[:-1]) * unit


class TestRulesAgree:
    """Each default threshold appears in the matching rule's expression, `for` durations match."""

    @pytest.fixture(scope="class")
    @classmethod
    def rules(cls) -> dict[str, list[dict[str, Any]]]:
        by_name: dict[str, list[dict[str, Any]]] = {}
        for rule in alert_rules(load_rules()):
            by_name.setdefault(rule["alert"], []).append(rule)
        return by_name

    @pytest.mark.parametrize(
        ("alert", "fragments", "for_field"),
        [
            (
                "SpecAcceptanceDrop",
                [f"< {S.acceptance_drop_ratio:g}", f">= {S.acceptance_min_drafts_per_second:g}"],
                "acceptance_drop_for",
            ),
            (
                "SpecFLyGainLost",
                [f"< {S.fly_gain_min:g}", f">= {S.fly_gain_min_drafts_per_second:g}"],
                "fly_gain_for",
            ),
            (
                "SpecDecodeInactive",
                [f"> {S.inactive_min_generation_tokens_per_second:g}", "== 0"],
                "inactive_for",
            ),
            (
                "SpecAdmissionStall",
                [
                    f">= {S.stall_min_waiting:g}",
                    f"<= {S.stall_max_running_ratio:g}",
                    f"< {S.stall_max_kv_cache_usage:g}",
                    f"< {S.stall_max_generation_tokens_per_second:g}",
                ],
                "stall_for",
            ),
            (
                "SpecFlipRateAboveNoise",
                [f">= {S.flip_z:g}", f">= {S.flip_min_compared:g}"],
                "flip_for",
            ),
            ("SpecwatchTargetDown", ["== 0"], "target_down_for"),
            (
                "SpecwatchShadowStalled",
                [f"> {S.shadow_min_generation_tokens_per_second:g}"],
                "shadow_stalled_for",
            ),
            ("SpecwatchLedgerFailing", ["> 0"], "ledger_failing_for"),
            ("SpecTokenBudgetBound", ["<"], "budget_finding_for"),
            (
                "SpecAcceptanceDecay",
                [
                    f"< {S.acceptance_drop_ratio:g}",
                    f">= {S.acceptance_min_drafts_per_second:g}",
                    f"[{S.acceptance_decay_lookback:g}s]",
                ],
                "acceptance_decay_for",
            ),
            (
                "SpecNonInferiorityNotShown",
                [f">= {S.quality_min_pairs}", "== 0"],
                "quality_non_inferiority_for",
            ),
        ],
    )
    def test_single_rule_alerts(
        self,
        rules: dict[str, list[dict[str, Any]]],
        alert: str,
        fragments: list[str],
        for_field: str,
    ) -> None:
        """Each single-rule alert's expression holds its thresholds and its `for` equals the
        setting."""
        records = {
            r["record"]: r["expr"]
            for g in load_rules()["groups"]
            for r in g["rules"]
            if "record" in r
        }
        for rule in rules[alert]:
            # an alert reading a recording rule of its own condition is checked through it
            expr = rule["expr"] + "".join(e for n, e in records.items() if n in rule["expr"])
            for fragment in fragments:
                assert _has(expr, fragment), (alert, fragment)
            assert _seconds(rule["for"]) == getattr(S, for_field), alert

    def test_budget_rules(self, rules: dict[str, list[dict[str, Any]]]) -> None:
        """SpecBudgetStarvation is one rule whose branches (joined by ``or``) each set their
        ``reason``, with the ratios, minimum running and `for` of the settings."""
        (rule,) = rules["SpecBudgetStarvation"]
        by_reason = {
            reason: body
            for body, reason in re.findall(
                r'label_replace\((.*?)"reason", "(\w+)", "", ""', rule["expr"], re.S
            )
        }
        assert set(by_reason) == {"budget_cap", "drafts_per_step", "draft_truncation"}
        assert f"({S.budget_drafts_per_step_ratio:g} *" in by_reason["drafts_per_step"]
        assert f"({S.budget_draft_length_ratio:g} *" in by_reason["draft_truncation"]
        for reason in ("drafts_per_step", "draft_truncation"):
            assert _has(by_reason[reason], f">= {S.budget_min_running:g}")
        assert _seconds(rule["for"]) == S.budget_for

    def test_quality_rules(self, rules: dict[str, list[dict[str, Any]]]) -> None:
        """The critical quality alert reads only the e-value (evidence); the non-inferiority
        state is a separate info alert."""
        by_check = {r["labels"]["check"]: r for r in rules["SpecQualityDrift"]}
        assert set(by_check) == {"e_value"}
        assert ALPHA == 0.05
        policy = PagePolicy(alpha=ALPHA)
        for category, hypothesis in (
            ("_all", "no_net_loss"),
            ("c", "no_net_loss"),
            ("_all", "margin"),
        ):
            bound = f"{policy.level(category, hypothesis):.10g}"
            assert _has(by_check["e_value"]["expr"], f">= {bound}"), bound
        assert _seconds(by_check["e_value"]["for"]) == S.quality_e_value_for == 0
        assert by_check["e_value"]["labels"]["severity"] == "critical"
        (ni,) = rules["SpecNonInferiorityNotShown"]
        assert ni["labels"]["severity"] == "info"

    def test_no_stray_thresholds(self, rules: dict[str, list[dict[str, Any]]]) -> None:
        """Every comparison constant in the alert expressions is one the tests above know."""
        known = {
            f"{v:g}"
            for v in S.model_dump().values()
            if isinstance(v, int | float) and not isinstance(v, bool)
        } | {"0", "1", f"{1 / ALPHA:g}", "30", "680.4123711", "2000", "500000"}
        for name, group in rules.items():
            for rule in group:
                for const in re.findall(r"[<>=]=?\s*(\d+(?:\.\d+)?)\b", rule["expr"]):
                    assert const in known, (name, const)


class TestAcceptanceDrop:
    def test_server_drop(self) -> None:
        """α 0.2 against 0.5 (the promtool case): ratio 0.4 fires."""
        assert acceptance_drop(0.2, 0.5, 1.6, 2.5, 1.0, S) == pytest.approx(0.4)

    def test_one_engine_of_four(self) -> None:
        """Aggregate 0.5/0.575 = 0.87 stays quiet; the decaying engine's 0.2/0.5 fires."""
        assert acceptance_drop(0.5, 0.575, 1 + 360 / 240, 1 + 24840 / 14400, 4.0, S) is None
        assert acceptance_drop(0.2, 0.5, 1.6, 2.5, 1.0, S) == pytest.approx(0.4)

    def test_tau_only_drop(self) -> None:
        """α unchanged but drafts truncated: (τ−1) 0.5 against 1.8 gives 0.2778."""
        assert acceptance_drop(0.6, 0.6, 1.5, 2.8, 1.0, S) == pytest.approx(0.5 / 1.8)

    def test_low_volume_and_undefined(self) -> None:
        """Under 0.2 drafts/s, without drafts (None/NaN) or after a restart: nothing fires."""
        assert acceptance_drop(0.2, 0.5, 1.6, 2.5, 0.1, S) is None
        assert acceptance_drop(None, 0.6, None, 2.8, 0.0, S) is None
        assert acceptance_drop(NAN, 0.6, NAN, 2.8, 1.0, S) is None
        assert acceptance_drop(0.6, 0.6, 2.8, 2.8, 1.0, S) is None  # restart: same α both sides


class TestOtherConditions:
    def test_fly_gain(self) -> None:
        """fly_gain_lost returns the gain only when it is below the threshold and FLy is
        drafting."""
        assert fly_gain_lost(0.51 - 0.5, 1.0, 1.0, S) == pytest.approx(0.01)
        assert fly_gain_lost(0.1, 1.0, 1.0, S) is None
        assert fly_gain_lost(0.0, 1.0, 0.0, S) is None  # FLy not drafting
        assert fly_gain_lost(None, 1.0, 1.0, S) is None

    def test_decode_inactive(self) -> None:
        """Fires only with K > 0 (speculation configured), tokens flowing and zero drafts."""
        assert decode_inactive(10.0, 0.0, 3, S) == 10.0
        assert decode_inactive(10.0, None, 3, S) is None  # no drafts counter
        assert decode_inactive(10.0, 0.0, None, S) is None  # K unknown: does not speculate
        assert decode_inactive(10.0, 0.0, 0, S) is None  # K = 0: does not speculate
        assert decode_inactive(10.0, 1.0, 3, S) is None
        assert decode_inactive(0.5, 0.0, 3, S) is None

    def test_zero_drafts_fires_only_inactive(self) -> None:
        """The promtool zero-drafts case: 16 running over D_full 8 would look budget-bound,
        but with no drafts only SpecDecodeInactive holds."""
        budget = BudgetInputs(
            running_most_loaded=16,
            d_full=8,
            max_num_seqs=256,
            waiting=0,
            drafts_per_second=0,
            mean_draft_length=None,
            running=16,
            k=3,
            engines=(("0", 0.0, 16.0),),
        )
        assert budget_starvation(budget, S) == {}
        assert acceptance_drop(None, None, None, None, 0.0, S) is None
        assert fly_gain_lost(None, 1.0, 0.0, S) is None
        assert admission_stall(0, 16, 256, 0.3, 5, 10.0, S) is None
        assert decode_inactive(10.0, 0.0, 3, S) == 10.0

    def test_mtp_budget_case_is_budget_bound_not_stall(self) -> None:
        """mtp, K=7, B=4096, N=1024: 8 slots a request, D_full 512 (vllm.budget); running 512
        with 4 waiting is budget_cap, and not an admission stall."""
        limits = budget_limits(
            max_num_batched_tokens=4096, max_num_seqs=1024, num_speculative_tokens=7, method="mtp"
        )
        assert limits.decode_full_per_step == 512
        assert limits.budget_bound
        budget = BudgetInputs(
            running_most_loaded=512,
            d_full=limits.decode_full_per_step,
            max_num_seqs=1024,
            waiting=4,
            drafts_per_second=4000,
            mean_draft_length=7,
            running=512,
            k=7,
            engines=(("0", 512.0, 512.0),),
        )
        assert budget_starvation(budget, S) == {"budget_cap": 512}
        assert admission_stall(4, 512, 1024, 0.6, 100, 10000.0, S) is None
        idle_queue = BudgetInputs(**{**_fields(budget), "waiting": 0})
        assert budget_starvation(idle_queue, S) == {}

    def test_budget_other_reasons(self) -> None:
        """Budget starvation reports drafts-per-step per engine and draft truncation, the latter
        not for short-draft methods."""
        b = BudgetInputs(
            running_most_loaded=16,
            d_full=1024,
            max_num_seqs=1024,
            drafts_per_second=30,
            mean_draft_length=2.5,
            running=16,
            k=5,
            engines=(("0", 3.0, 16.0), ("1", 14.0, 16.0)),
        )
        assert budget_starvation(b, S) == {"drafts_per_step:0": 3.0, "draft_truncation": 2.5}
        ngram = BudgetInputs(**{**_fields(b), "short_draft_method": True})
        assert budget_starvation(ngram, S) == {"drafts_per_step:0": 3.0}

    def test_admission_stall(self) -> None:
        """Relative to capacity: the public report's 4 of 256 running (0.015625 <= 0.1) with
        492 waiting, KV 0.2, no request finished and 0.483 tokens/s is a stall; an absolute
        "running <= 2" would have missed it."""
        assert admission_stall(492, 4, 256, 0.2, 0, 0.483333, S) == 4 / 256
        assert admission_stall(492, 4, 256, 0.95, 0, 0.0, S) is None  # KV saturated: memory
        assert admission_stall(492, 4, 256, 0.2, 3, 0.0, S) is None  # requests finish
        assert admission_stall(492, 30, 256, 0.2, 0, 0.0, S) is None  # 30/256 = 0.117 > 0.1
        assert admission_stall(0, 4, 256, 0.2, 0, 0.0, S) is None  # nothing waits
        assert admission_stall(492, 4, None, 0.2, 0, 0.0, S) is None  # ceiling unknown
        assert admission_stall(492, 4, 256, None, 0, 0.0, S) is None

    def test_token_budget_bound(self) -> None:
        """D_full below max_num_seqs is the finding (value D_full); equal or unknown is not."""
        assert token_budget_bound(256, 64) == 64
        assert token_budget_bound(256, 256) is None
        assert token_budget_bound(None, 64) is None

    def test_quality_drift(self) -> None:
        """At alpha 0.05 the e-value bound is 1/0.05 = 20; non-inferiority needs 200 pairs."""
        assert quality_drift(35.0, False, 250, ALPHA, S) == {
            "e_value": 35.0,
            "non_inferiority": 250,
        }
        assert quality_drift(4.0, False, 120, ALPHA, S) == {}
        assert quality_drift(NAN, None, None, ALPHA, S) == {}
        assert quality_drift(19.99, True, 500, ALPHA, S) == {}
        assert quality_drift(20.0, True, 500, ALPHA, S) == {"e_value": 20.0}
        assert quality_drift(math.inf, None, None, ALPHA, S) == {"e_value": math.inf}

    def test_quality_drift_bound_follows_alpha(self) -> None:
        """alpha 0.01 moves the bound to 1/0.01 = 100: e = 50 stays quiet, e = 120 fires."""
        assert quality_drift(50.0, None, None, 0.01, S) == {}
        assert quality_drift(120.0, None, None, 0.01, S) == {"e_value": 120.0}
        assert quality_drift(100.0, None, None, 0.01, S) == {"e_value": 100.0}

    def test_quality_drift_rejects_bad_alpha(self) -> None:
        """alpha outside (0, 1) has no Ville bound: ValueError, as the summary's alarm."""
        for alpha in (0.0, 1.0, -0.1):
            with pytest.raises(ValueError, match="alpha"):
                quality_drift(50.0, None, None, alpha, S)


def _fields(b: BudgetInputs) -> dict[str, Any]:
    return {name: getattr(b, name) for name in BudgetInputs.__slots__}


class TestStatistics:
    def test_mcnemar_z(self) -> None:
        """120 lost, 60 gained: 60/√180 = √20 (the promtool fleet case)."""
        assert mcnemar_z(120, 60) == pytest.approx(math.sqrt(20))
        assert mcnemar_z(60, 60) == 0
        assert mcnemar_z(0, 0) is None
        with pytest.raises(ValueError, match=">= 0"):
            mcnemar_z(-1, 3)

    def test_two_proportion_z_matches_chi_square(self) -> None:
        """z² equals scipy's uncorrected chi-square of the 2x2 table (independent reference)."""
        z = two_proportion_z(120, 600, 60, 600)
        assert z == pytest.approx(4.8507125, rel=1e-6)
        stat = chi2_contingency([[120, 480], [60, 540]], correction=False).statistic
        assert z is not None
        assert z * z == pytest.approx(stat)
        assert two_proportion_z(0, 100, 0, 100) is None
        assert two_proportion_z(1, 0, 1, 10) is None

    def test_flip_rate(self) -> None:
        """The flip-rate check fires on a z-score above the noise arm, not at equal rates or
        under 50 per arm."""
        assert flip_rate_above_noise(120, 600, 60, 600, S) == pytest.approx(4.8507125, rel=1e-6)
        assert flip_rate_above_noise(120, 600, 120, 600, S) is None
        assert flip_rate_above_noise(20, 40, 2, 40, S) is None  # under 50 compared per arm


class TestForTracker:
    def test_for_duration_and_reset(self) -> None:
        """Fires after `for` of continuous truth; one missing evaluation starts it over."""
        a = Alert("SpecAcceptanceDrop", Severity.WARNING, "s", "d", {"target": "t"})
        b = Alert("SpecAdmissionStall", Severity.CRITICAL, "s", "d", {"target": "t"})
        durations = {"SpecAcceptanceDrop": 600.0, "SpecAdmissionStall": 300.0}
        tracker = ForTracker(lambda alert: durations[alert.alertname])
        assert tracker.update([a, b], 0.0) == []
        assert tracker.update([a, b], 300.0) == [b]
        assert tracker.update([a, b], 600.0) == [a, b]
        assert tracker.update([b], 660.0) == [b]
        assert tracker.pending() == 1
        assert tracker.update([a, b], 720.0) == [b]
        assert tracker.update([a, b], 1320.0) == [a, b]
