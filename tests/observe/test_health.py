"""Derived health: vLLM's definitions on real captures and hard cases, quantiles, capacity."""

from __future__ import annotations

import json
import math

import pytest

from specwatch.observe.health import (
    capacity,
    derive_health,
    histogram_quantile,
    model_windows,
    pair_view,
    speculative_tokens,
)
from specwatch.observe.parse import parse_page
from specwatch.observe.values import Delta, Health, Limits
from specwatch.observe.window import page_delta
from tests.fixture_files import FIXTURES, body


class TestRealCaptures:
    def test_ngram_since_start(self) -> None:
        """real-cpu-ngram: drafts 488, draft tokens 1828, accepted 184, per_pos [146,18,12,8]."""
        mw = parse_page(body("vllm-metrics/real-cpu-ngram.txt"))
        h = model_windows(page_delta(None, mw, None))["tiny"].server
        assert h.acceptance_rate == pytest.approx(184 / 1828)
        assert h.mean_acceptance_length == pytest.approx(1 + 184 / 488)
        assert h.mean_draft_length == pytest.approx(1828 / 488)
        assert h.per_position_acceptance_rate == pytest.approx(
            [146 / 488, 18 / 488, 12 / 488, 8 / 488]
        )
        assert h.per_position_conditional_acceptance_rate == pytest.approx(
            [146 / 488, 18 / 146, 12 / 18, 8 / 12]
        )
        # identity: tau = 1 + sum of unconditional per-position rates
        assert 1 + sum(h.per_position_acceptance_rate) == pytest.approx(h.mean_acceptance_length)  # type: ignore[arg-type]
        assert h.num_speculative_tokens == 4
        assert h.drafts_per_step == pytest.approx(488 / 620)
        assert h.generation_tokens_per_second is None  # no interval for a single body

    def test_ngram_latency_quantiles_by_hand(self) -> None:
        """ITL p50/p90/p99 and TTFT quantiles interpolate as histogram_quantile, by hand."""
        page = parse_page(body("vllm-metrics/real-cpu-ngram.txt"))
        h = model_windows(page_delta(None, page, None))["tiny"].server
        itl = h.inter_token_latency_seconds
        # ITL buckets: le 0.01 → 2233, le 0.025 → 2462 = total
        assert itl[0.5] == pytest.approx(0.01 * (0.5 * 2462) / 2233)
        assert itl[0.9] == pytest.approx(0.01 * (0.9 * 2462) / 2233)
        assert itl[0.99] == pytest.approx(0.01 + 0.015 * (0.99 * 2462 - 2233) / (2462 - 2233))
        ttft = h.time_to_first_token_seconds
        # TTFT: le .02 → 7, le .04 → 15, le 1 → 15, le 2.5 → 20 = total
        assert ttft[0.5] == pytest.approx(0.02 + 0.02 * (10 - 7) / 8)
        assert ttft[0.9] == pytest.approx(1.0 + 1.5 * (18 - 15) / 5)
        assert ttft[0.99] == pytest.approx(1.0 + 1.5 * (19.8 - 15) / 5)

    def test_zero_acceptance_is_zero_not_none(self) -> None:
        """Midflight draft_model: 1577 drafts, 0 accepted → α 0, τ 1; conditional c1 undefined."""
        page = parse_page(body("vllm-metrics/real-cpu-draft-model-midflight.txt"))
        h = model_windows(page_delta(None, page, None))["tiny"].server
        assert h.acceptance_rate == 0.0
        assert h.mean_acceptance_length == 1.0
        assert h.per_position_conditional_acceptance_rate[0] == 0.0
        assert h.per_position_conditional_acceptance_rate[1] is None
        assert h.num_requests_running == 8
        assert h.num_requests_waiting == 4
        assert h.num_requests_waiting_by_reason == {"capacity": 4.0, "deferred": 0.0}

    def test_no_spec_decode_gives_none(self) -> None:
        """Without spec decode α and τ are absent (None), not 0."""
        page = parse_page(body("vllm-metrics/real-cpu-nospec.txt"))
        h = model_windows(page_delta(None, page, None))["tiny"].server
        assert h.acceptance_rate is None
        assert h.mean_acceptance_length is None
        assert h.per_position_acceptance_rate == ()


class TestHardCases:
    def test_c01_expected(self) -> None:
        """C01: sum over engines before dividing; per-engine values kept (expected.json)."""
        expected = json.loads((FIXTURES / "cases/expected.json").read_text())["C01"]
        page = parse_page(body("cases/C01_dp_engines.prom"))
        mw = model_windows(page_delta(None, page, None))["example-model"]
        agg = expected["aggregate"]
        assert mw.server.drafts == agg["drafts"]
        assert mw.server.draft_tokens == agg["draft_tokens"]
        assert mw.server.accepted_tokens == agg["accepted"]
        assert mw.server.acceptance_rate == pytest.approx(agg["acceptance_rate"], abs=1e-6)
        assert mw.server.mean_acceptance_length == pytest.approx(
            agg["mean_acceptance_length"], abs=1e-6
        )
        assert mw.server.per_position_acceptance_rate == pytest.approx(
            agg["per_position"], abs=1e-6
        )
        for engine, values in expected["per_engine"].items():
            assert mw.engines[engine].acceptance_rate == pytest.approx(
                values["acceptance_rate"], abs=1e-6
            )
            assert mw.engines[engine].mean_acceptance_length == pytest.approx(
                values["mean_acceptance_length"], abs=1e-6
            )
        for wrong in expected["wrong_values_to_reject"].values():
            assert mw.server.acceptance_rate != pytest.approx(wrong, abs=1e-4)

    def test_c11_per_model(self) -> None:
        """C11: α per model 0.4 and 0.7."""
        page = parse_page(body("cases/C11_escaped_labels_valid.prom"))
        models = model_windows(page_delta(None, page, None))
        assert models['team\\chat "v2" {beta},x=1'].server.acceptance_rate == pytest.approx(0.4)
        assert models["plain-model"].server.acceptance_rate == pytest.approx(0.7)


class TestHistogramQuantile:
    BUCKETS = ((0.1, 10.0), (0.2, 30.0), (0.4, 40.0), (math.inf, 40.0))

    def test_interpolation_by_hand(self) -> None:
        """p50 of 40 observations: rank 20 in (0.1, 0.2] holding 20 → 0.1 + 0.1 * 10/20."""
        assert histogram_quantile(0.5, self.BUCKETS) == pytest.approx(0.15)
        assert histogram_quantile(0.25, self.BUCKETS) == pytest.approx(0.1)
        assert histogram_quantile(0.1, self.BUCKETS) == pytest.approx(0.1 * 4 / 10)

    def test_inf_bucket_returns_highest_finite_bound(self) -> None:
        """A rank in +Inf returns the largest finite upper bound (PromQL rule)."""
        assert histogram_quantile(0.99, ((0.1, 1.0), (math.inf, 10.0))) == 0.1

    def test_empty_is_none(self) -> None:
        """No observations → no value."""
        assert histogram_quantile(0.5, ((0.1, 0.0), (math.inf, 0.0))) is None


class TestDerive:
    def test_zero_drafts_absent(self) -> None:
        """Zero drafts in a window: α and τ absent, rates still defined."""
        d = Delta(
            interval_seconds=10.0,
            counters={
                "drafts": 0.0,
                "draft_tokens": 0.0,
                "accepted_tokens": 0.0,
                "generation_tokens": 50.0,
            },
            per_position={0: 0.0},
            histograms={},
            gauges={},
            waiting_by_reason={},
        )
        h = derive_health(d)
        assert h.acceptance_rate is None
        assert h.mean_acceptance_length is None
        assert h.per_position_acceptance_rate == (None,)
        assert h.generation_tokens_per_second == 5.0
        assert h.drafts_per_second == 0.0

    def test_configured_k_used_without_positions(self) -> None:
        """K comes from configuration when the page has no position labels."""
        d = Delta(None, {}, {}, {}, {}, {})
        assert derive_health(d, configured_k=3).num_speculative_tokens == 3


class TestCapacity:
    def test_dspark_new_and_old_accounting(self) -> None:
        """dspark K=5, B=512, N=128: D_full 85 on v0.33, 51 on v0.32."""
        new = capacity(Limits(128, 512, 5, "dspark", vllm_version="0.33.0"), [100.0, 60.0])
        assert new.limits_configured
        assert new.decode_full_per_step_requests == 85
        assert new.admission_cap_requests == 85
        assert new.budget_bound is True
        assert new.running_to_max_seqs_ratio == pytest.approx(100 / 128)
        assert new.running_gap_requests == 28
        old = capacity(Limits(128, 512, 5, "dspark", vllm_version="0.32.0"), [100.0])
        assert old.decode_full_per_step_requests == 51

    def test_unknown_limits(self) -> None:
        """Without limits nothing is guessed."""
        cap = capacity(Limits(), [3.0])
        assert not cap.limits_configured
        assert cap.admission_cap_requests is None
        assert cap.running_to_max_seqs_ratio is None
        assert cap.num_requests_running == 3.0

    def test_observed_k_completes_limits(self) -> None:
        """K from position labels completes N, B and method (eagle3 K=3, B=8192, N=1024 → 1024)."""
        cap = capacity(Limits(1024, 8192, None, "eagle3"), [], observed_k=3)
        assert cap.limits_configured
        assert cap.decode_full_per_step_requests == 1024
        assert (cap.num_speculative_tokens, cap.num_speculative_tokens_source) == (3, "observed")


class TestSpeculativeTokens:
    def test_the_page_wins_then_the_configuration(self) -> None:
        """Observed (position labels) before configured; either alone is used with its source;
        neither gives ``None``."""
        assert speculative_tokens(5, 3) == (5, "observed")
        assert speculative_tokens(None, 3) == (3, "configured")
        assert speculative_tokens(4, None) == (4, "observed")
        assert speculative_tokens(None, None) is None

    def test_health_and_capacity_follow_the_one_rule(self) -> None:
        """K configured 3, page K 5: Health and Capacity both take 5. eagle3 (S 0), N 128,
        B 512, v0.33: slots 1 + 5 + 0 = 6, need 128 · 6 = 768, D_full = 512 // 6 = 85 < 128.
        Without a page K the configured 3 is used: slots 4, need 512, D_full 512 // 4 = 128."""
        d = Delta(None, {}, {}, {}, {}, {}, num_speculative_tokens=5)
        assert derive_health(d, configured_k=3).num_speculative_tokens == 5
        limits = Limits(128, 512, 3, "eagle3")
        page = capacity(limits, [10.0], observed_k=5)
        assert (page.num_speculative_tokens, page.num_speculative_tokens_source) == (5, "observed")
        assert (page.extra_batch_slots, page.slots_per_request) == (0, 6)
        assert page.required_batched_tokens == 768
        assert (page.decode_full_per_step_requests, page.budget_bound) == (85, True)
        cfg = capacity(limits, [10.0])
        assert (cfg.num_speculative_tokens, cfg.num_speculative_tokens_source) == (3, "configured")
        assert (cfg.slots_per_request, cfg.required_batched_tokens) == (4, 512)
        assert (cfg.decode_full_per_step_requests, cfg.budget_bound) == (128, False)

    def test_slots_and_need_without_a_budget(self) -> None:
        """dspark K 5 on v0.32 (S = K - 1 = 4): slots 1 + 5 + 4 = 10 and, with N 128, need
        128 · 10 = 1280, even while B is unknown (no budget limits then); without N no need,
        without a method no slots; without any K nothing."""
        no_b = capacity(Limits(128, None, 5, "dspark", vllm_version="0.32.0"), [])
        assert not no_b.limits_configured
        assert (no_b.extra_batch_slots, no_b.slots_per_request) == (4, 10)
        assert no_b.required_batched_tokens == 1280
        assert no_b.decode_full_per_step_requests is None
        no_n = capacity(Limits(None, 512, 5, "dspark", vllm_version="0.32.0"), [])
        assert (no_n.slots_per_request, no_n.required_batched_tokens) == (10, None)
        no_method = capacity(Limits(128, 512, 5, None), [])
        assert (no_method.num_speculative_tokens, no_method.slots_per_request) == (5, None)
        none = capacity(Limits(128, 512, None, "dspark"), [])
        assert none.num_speculative_tokens is None
        assert none.num_speculative_tokens_source is None
        assert none.required_batched_tokens is None


class TestPair:
    def test_pair_view(self) -> None:
        """Gain is a difference of rates; τ and throughput are ratios."""
        std = Health(
            acceptance_rate=0.5,
            mean_acceptance_length=2.0,
            generation_tokens_per_second=100.0,
            requests_finished_per_second=2.0,
        )
        fly = Health(
            acceptance_rate=0.6,
            mean_acceptance_length=2.5,
            generation_tokens_per_second=120.0,
            requests_finished_per_second=2.1,
        )
        pv = pair_view("s", std, "f", fly)
        assert pv.acceptance_gain_ratio == pytest.approx(0.1)
        assert pv.mean_acceptance_length_ratio == pytest.approx(1.25)
        assert pv.throughput_ratio == pytest.approx(1.2)
        assert pv.throughput_ratio_withheld is None
        empty = pair_view("s", Health(), "f", fly)
        assert empty.acceptance_gain_ratio is None

    def test_throughput_ratio_only_like_with_like(self) -> None:
        """Requests finishing at 2.0/s and 2.1/s (5 % apart, within 10 %): the ratio 1.2 is
        given; at 2.0/s and 3.0/s (33 % apart) the arms serve different loads and it is
        withheld with a reason; unknown or zero rates are withheld too; with no request
        finished on either arm, prompt tokens per second decide."""
        std = Health(generation_tokens_per_second=100.0, requests_finished_per_second=2.0)

        def fly(rate: float | None) -> Health:
            return Health(generation_tokens_per_second=120.0, requests_finished_per_second=rate)

        assert pair_view("s", std, "f", fly(2.1)).throughput_ratio == pytest.approx(1.2)
        differ = pair_view("s", std, "f", fly(3.0))
        assert (differ.throughput_ratio, differ.throughput_ratio_withheld) == (
            None,
            "request_rates_differ",
        )
        unknown = pair_view("s", std, "f", fly(None))
        assert unknown.throughput_ratio_withheld == "request_rates_unknown"
        none = Health(requests_finished_per_second=0.0, prompt_tokens_per_second=0.0)
        idle = pair_view("s", none, "f", none)
        assert idle.throughput_ratio_withheld == "no_requests"

        def long(prompt: float, gen: float) -> Health:
            """Long requests, none finished yet: judged by admitted prompt tokens."""
            return Health(
                generation_tokens_per_second=gen,
                requests_finished_per_second=0.0,
                prompt_tokens_per_second=prompt,
            )

        # 500 against 520 prompt tokens/s (4 % apart): 90 / 100 tokens/s = 0.9
        assert pair_view("s", long(500, 100), "f", long(520, 90)).throughput_ratio == 0.9


def test_c08_stall_rates() -> None:
    """The public admission-stall report (cases/C08, pages 60 s apart): waiting 492 (the
    by-reason gauges 19 + 473 are a breakdown, never added: not 984), KV 0.20, 29 generated
    tokens / 60 s = 0.483333 tokens/s, 116760 prompt tokens / 60 s = 1946 tokens/s and no
    request finished in the window (0 /s)."""
    before = parse_page(body("cases/C08_stall_t000.prom"))
    after = parse_page(body("cases/C08_stall_t060.prom"))
    h = model_windows(page_delta(before, after, 60.0))["example-model"].server
    expected = json.loads((FIXTURES / "cases/expected.json").read_text())["C08"]
    assert h.num_requests_waiting == expected["waiting"] == 492
    assert h.kv_cache_usage == pytest.approx(expected["kv_cache_usage"])
    assert h.generation_tokens_per_second == pytest.approx(expected["generation_tokens_per_s"])
    assert h.prompt_tokens_per_second == pytest.approx(expected["prompt_tokens_per_s"])
    assert h.requests_finished == expected["requests_finished_in_window"] == 0
    assert h.requests_finished_per_second == 0.0
