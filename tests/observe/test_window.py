"""Windows: counter increases with reset handling, rolling baselines, missing families."""

from __future__ import annotations

import pytest

from specwatch.core.config import SINCE_START
from specwatch.observe.health import model_windows
from specwatch.observe.parse import parse_page
from specwatch.observe.values import EngineReading, PageReading
from specwatch.observe.window import RollingWindows, page_delta
from tests.fixture_files import body

KEY = ("example-model", "0")


def _page(
    drafts: float, draft_tokens: float, accepted: float, start: float | None = None
) -> PageReading:
    return PageReading(
        engines={
            ("m", "0"): EngineReading(
                counters={
                    "drafts": drafts,
                    "draft_tokens": draft_tokens,
                    "accepted_tokens": accepted,
                },
                per_position={},
                gauges={},
                waiting_by_reason={},
                histograms={},
            )
        },
        process_start_time_seconds=start,
    )


class TestResets:
    def test_c03_reset_uses_post_reset_values(self) -> None:
        """C03 a→b: a reset; increases are b's values: α 700/1200, τ 1 + 700/400."""
        w = RollingWindows({"1m": 60.0})
        assert w.add(0.0, parse_page(body("cases/C03_reset_a.prom"))) == []
        assert w.add(30.0, parse_page(body("cases/C03_reset_b.prom"))) == [KEY]
        d = w.deltas("1m")[KEY]
        assert d.counters["drafts"] == 400
        assert d.counters["draft_tokens"] == 1200
        assert d.counters["accepted_tokens"] == 700
        assert d.counters["prompt_tokens"] == 800
        assert d.counters["generation_tokens"] == 1600
        h = model_windows(w.deltas("1m"))["example-model"].server
        assert h.acceptance_rate == pytest.approx(700 / 1200)
        assert h.acceptance_rate != pytest.approx(0.601449, abs=1e-4)  # the naive negative ratio
        assert h.mean_acceptance_length == pytest.approx(2.75)

    def test_c03_families_gone_gives_no_value(self) -> None:
        """C03 b→c: the page has no vLLM families: no engine, no value (never 0 or negative)."""
        w = RollingWindows({"1m": 60.0})
        for t, name in ((0.0, "a"), (30.0, "b"), (60.0, "c")):
            w.add(t, parse_page(body(f"cases/C03_reset_{name}.prom")))
        assert w.deltas("1m") == {}
        assert w.deltas(SINCE_START) == {}

    def test_family_returns_after_gap(self) -> None:
        """A counter that disappears and comes back continues from its last value."""
        w = RollingWindows({"1m": 60.0})
        w.add(0.0, _page(10, 40, 20))
        w.add(5.0, PageReading(engines={}))
        w.add(10.0, _page(20, 80, 30))
        d = w.deltas("1m")[("m", "0")]
        assert (d.counters["drafts"], d.counters["draft_tokens"]) == (10, 40)
        assert d.counters["accepted_tokens"] == 10

    def test_single_counter_fall_resets_engine(self) -> None:
        """A fall in one spec-decode counter resets the whole engine (all post-reset values)."""
        w = RollingWindows({"1m": 60.0})
        w.add(0.0, _page(100, 400, 200))
        resets = w.add(5.0, _page(101, 3, 1))  # drafts rose, draft_tokens fell
        assert resets == [("m", "0")]
        d = w.deltas("1m")[("m", "0")]
        assert (
            d.counters["drafts"],
            d.counters["draft_tokens"],
            d.counters["accepted_tokens"],
        ) == (
            101,
            3,
            1,
        )

    def test_process_restart_detected_by_start_time(self) -> None:
        """A new process_start_time_seconds is a reset even when counters did not fall."""
        w = RollingWindows({"1m": 60.0})
        w.add(0.0, _page(10, 40, 20, start=1000.0))
        assert w.add(5.0, _page(50, 200, 100, start=2000.0)) == [("m", "0")]
        assert w.deltas("1m")[("m", "0")].counters["drafts"] == 50


class TestRolling:
    def test_baseline_is_newest_page_at_or_before_window_start(self) -> None:
        """1m window at t=100 uses the page at t=40 (not t=0, not t=45)."""
        w = RollingWindows({"1m": 60.0})
        for t, drafts in ((0, 0), (40, 10), (45, 20), (100, 50)):
            w.add(float(t), _page(drafts, drafts * 4, drafts))
        d = w.deltas("1m")[("m", "0")]
        assert d.counters["drafts"] == 40
        assert d.interval_seconds == 60.0
        s = w.deltas(SINCE_START)[("m", "0")]
        assert s.counters["drafts"] == 50
        assert s.interval_seconds == 100.0

    def test_short_history_uses_oldest_page(self) -> None:
        """Before a full window has passed the window spans the history so far."""
        w = RollingWindows({"5m": 300.0})
        w.add(0.0, _page(0, 0, 0))
        w.add(10.0, _page(10, 40, 20))
        d = w.deltas("5m")[("m", "0")]
        assert d.counters["drafts"] == 10
        assert d.interval_seconds == 10.0

    def test_one_page_has_no_window_values(self) -> None:
        """With a single page every counter increase is unknown (None), never 0."""
        w = RollingWindows({"1m": 60.0})
        w.add(0.0, _page(10, 40, 20))
        d = w.deltas("1m")[("m", "0")]
        assert d.counters["drafts"] is None
        assert model_windows(w.deltas("1m"))["m"].server.acceptance_rate is None

    def test_old_pages_pruned_but_baseline_kept(self) -> None:
        """Pages older than the longest window are dropped; the window still has a baseline."""
        w = RollingWindows({"1m": 60.0})
        for t in range(0, 1000, 5):
            w.add(float(t), _page(t, 4 * t, t))
        d = w.deltas("1m")[("m", "0")]
        assert d.counters["drafts"] == 60
        assert len(w._points) <= 14


class TestPageDelta:
    def test_two_real_pages_of_one_window(self) -> None:
        """page_delta between two pages equals the hand-subtracted counters."""
        a = _page(100, 400, 120)
        b = _page(150, 600, 170)
        d = page_delta(a, b, 10.0)[("m", "0")]
        assert (
            d.counters["drafts"],
            d.counters["draft_tokens"],
            d.counters["accepted_tokens"],
        ) == (
            50,
            200,
            50,
        )
        assert d.interval_seconds == 10.0


class TestGaps:
    def test_long_gap_does_not_stretch_window(self) -> None:
        """After an hour without good pages, "1m" does not span the hour."""
        w = RollingWindows({"1m": 60.0})
        w.add(0.0, _page(0, 0, 0))
        w.add(5.0, _page(10, 40, 10))
        w.add(3605.0, _page(1000, 4000, 2000))
        assert w.deltas("1m")[("m", "0")].counters["drafts"] is None
        w.add(3610.0, _page(1010, 4040, 2010))
        d = w.deltas("1m")[("m", "0")]
        assert d.counters["drafts"] == 10
        assert d.interval_seconds == 5.0
        assert w.deltas(SINCE_START)[("m", "0")].counters["drafts"] == 1010


class TestSinceStart:
    def test_engine_started_later_has_its_own_start(self) -> None:
        """An engine first seen on the second page: since_start counts from its first page."""
        w = RollingWindows({"1m": 60.0})
        one = _page(10, 40, 20)
        w.add(0.0, one)
        two = PageReading(engines={**one.engines, ("m", "1"): _page(5, 20, 10).engines[("m", "0")]})
        w.add(5.0, two)
        three = PageReading(
            engines={
                ("m", "0"): one.engines[("m", "0")],
                ("m", "1"): _page(8, 32, 16).engines[("m", "0")],
            }
        )
        w.add(10.0, three)
        d = w.deltas(SINCE_START)
        assert d[("m", "1")].counters["drafts"] == 3
        assert d[("m", "1")].interval_seconds == 5.0
        assert d[("m", "0")].counters["drafts"] == 0
        assert d[("m", "0")].interval_seconds == 10.0


def _scaled(text: str, factor: float) -> str:
    """``text`` with every spec-decode counter multiplied by ``factor`` (a later page)."""
    out = []
    for line in text.splitlines():
        if line.startswith("vllm:spec_decode_num_") and " " in line:
            series, value = line.rsplit(" ", 1)
            line = f"{series} {float(value) * factor!r}"
        out.append(line)
    return "\n".join(out) + "\n"


class TestV0Schema:
    """vLLM's V0 spec-decode schema, from the public-report pages in ``cases/C10_*``."""

    def test_v0_page_alone(self) -> None:
        """V0 (no drafts counter): α = 8547/13311 = 0.642101; K from the efficiency gauge
        (0.598 · 13311 / 10616 = 0.7498 = K/(K+1) → K 3), drafts = 13311/3 = 4437,
        τ = emitted / drafts = 10616/4437 = 2.392608 (not 1 + 8547/4437 = 2.926302)."""
        got = model_windows(page_delta(None, parse_page(body("cases/C10_v0_page.prom")), None))
        h = got["example-model"].server
        assert h.spec_decode_schema == "v0"
        assert h.acceptance_rate == pytest.approx(0.642101, abs=1e-6)
        assert h.num_speculative_tokens == 3
        assert h.drafts == pytest.approx(4437)
        assert h.mean_acceptance_length == pytest.approx(2.392608, abs=1e-6)
        assert h.kv_cache_usage == pytest.approx(0.42)

    def test_configured_k_wins_and_v1_pages(self) -> None:
        """K configured (3) is used as is; the V1 pages give α 6179/13311 = 0.464203 and
        τ = 1 + 6179/4437 = 2.392608, KV 0.42 from whichever name exists (never 0.84)."""
        v0 = parse_page(body("cases/C10_v0_page.prom"))
        h0 = model_windows(page_delta(None, v0, None), configured_k=3)["example-model"].server
        assert h0.mean_acceptance_length == pytest.approx(2.392608, abs=1e-6)
        for name in ("cases/C10_transition_page.prom", "cases/C10_v1_page.prom"):
            h = model_windows(page_delta(None, parse_page(body(name)), None))
            s = h["example-model"].server
            assert s.spec_decode_schema == "v1"
            assert s.acceptance_rate == pytest.approx(0.464203, abs=1e-6)
            assert s.mean_acceptance_length == pytest.approx(2.392608, abs=1e-6)
            assert s.kv_cache_usage == pytest.approx(0.42)

    def test_never_mixed_in_a_window_or_baseline(self) -> None:
        """V0 at 0 s and 60 s (counters doubled), then the upgrade: V1 at 120 s and at 180 s
        (counters doubled). At 120 s no window spans the switch: the 5m window and since_start
        have no values (one V1 page only). At 180 s both give the V1 increase only:
        α = 6179/13311 = 0.464203, τ = 1 + 6179/4437 = 2.392608."""
        v0 = body("cases/C10_v0_page.prom").replace(
            'model_name="example-model"', 'engine="0",model_name="example-model"'
        )
        v1 = body("cases/C10_v1_page.prom")
        w = RollingWindows({"5m": 300.0})
        w.add(0.0, parse_page(v0))
        w.add(60.0, parse_page(_scaled(v0, 2.0)))
        assert model_windows(w.deltas("5m"))["example-model"].server.spec_decode_schema == "v0"
        assert w.add(120.0, parse_page(v1)) == [KEY]  # the switch counts as a reset
        for name in ("5m", SINCE_START):
            h = model_windows(w.deltas(name))["example-model"].server
            assert (h.acceptance_rate, h.mean_acceptance_length) == (None, None)
        w.add(180.0, parse_page(_scaled(v1, 2.0)))
        for name in ("5m", SINCE_START):
            h = model_windows(w.deltas(name))["example-model"].server
            assert h.spec_decode_schema == "v1"
            assert h.interval_seconds == 60.0
            assert h.acceptance_rate == pytest.approx(0.464203, abs=1e-6)
            assert h.mean_acceptance_length == pytest.approx(2.392608, abs=1e-6)


def test_latency_means_from_sum_and_count() -> None:
    """TTFT: 4 requests with _sum 2.0 s → 6 requests with _sum 2.9 s: mean over the window
    0.9 / 2 = 0.45 s; ITL 100 → 300 tokens, _sum 3.0 → 5.0 s: mean 2.0 / 200 = 0.01 s."""

    def page(n_ttft: float, s_ttft: float, n_itl: float, s_itl: float) -> PageReading:
        lab = 'engine="0",model_name="m"'
        return parse_page(
            "# TYPE vllm:time_to_first_token_seconds histogram\n"
            f'vllm:time_to_first_token_seconds_bucket{{{lab},le="+Inf"}} {n_ttft}\n'
            f"vllm:time_to_first_token_seconds_count{{{lab}}} {n_ttft}\n"
            f"vllm:time_to_first_token_seconds_sum{{{lab}}} {s_ttft}\n"
            "# TYPE vllm:inter_token_latency_seconds histogram\n"
            f'vllm:inter_token_latency_seconds_bucket{{{lab},le="+Inf"}} {n_itl}\n'
            f"vllm:inter_token_latency_seconds_count{{{lab}}} {n_itl}\n"
            f"vllm:inter_token_latency_seconds_sum{{{lab}}} {s_itl}\n"
        )

    w = RollingWindows({"1m": 60.0})
    w.add(0.0, page(4, 2.0, 100, 3.0))
    w.add(30.0, page(6, 2.9, 300, 5.0))
    h = model_windows(w.deltas("1m"))["m"].server
    assert h.time_to_first_token_mean_seconds == pytest.approx(0.45)
    assert h.inter_token_latency_mean_seconds == pytest.approx(0.01)
