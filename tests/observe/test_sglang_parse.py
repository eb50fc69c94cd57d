"""SGLang pages through the observe chain: one rank read (TP repetition never summed), the
exact verify-counter route, the interval-gauge route, an accept rate above 1 dropped for τ's α,
and SGLang's budget rule in Capacity. Expected values are worked by hand from the fixtures'
provenance lines (SGLang's own formulas, see tests/fixtures/sglang/*.metrics)."""

from __future__ import annotations

import pytest

from specwatch.observe.health import model_windows
from specwatch.observe.parse import ParseError, parse_page
from specwatch.observe.settings import TargetSettings
from specwatch.observe.tracker import TargetTracker
from specwatch.observe.values import Health, PageReading
from specwatch.observe.window import page_delta
from tests.fixture_files import body

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _page(name: str) -> PageReading:
    return parse_page(body(f"sglang/{name}.metrics"))


def _server(
    after: PageReading, before: PageReading | None = None, *, k: int | None = None, dt: float = 60
) -> Health:
    models = model_windows(page_delta(before, after, dt if before else None), configured_k=k)
    return models[MODEL].server


@pytest.mark.parametrize(
    "name", ["sglang-0.5.23-eagle3-tp2-default", "sglang-0.5.23-eagle3-tp2-all-schedulers"]
)
def test_tp2_reads_one_rank(name: str) -> None:
    """Both scheduler modes of a TP=2 server give one engine whose gauges are rank 0's (32
    running, not 64; 400000 KV tokens, not 800000), and the verify counter's exact τ: 481600
    generated tokens / 172000 verifies = 2.8, α = 1.8 / 3 = 0.6, ℓ = N − 1 = 3."""
    page = _page(name)
    assert page.engine_kind == "sglang"
    assert list(page.engines) == [(MODEL, "0")]
    eng = page.engines[(MODEL, "0")]
    assert eng.gauges["running"] == 32.0
    assert eng.gauges["waiting"] == 5.0
    assert eng.gauges["kv_cache_usage"] == 0.41
    assert eng.gauges["sglang_max_total_num_tokens"] == 400000.0
    assert eng.counters["drafts"] == 172000.0
    assert eng.counters["accepted_tokens"] == 481600.0 - 172000.0
    assert eng.counters["draft_tokens"] == 172000.0 * 3
    h = _server(page)
    assert h.spec_decode_schema == "sglang_counters"
    assert h.mean_acceptance_length == pytest.approx(2.8)
    assert h.acceptance_rate == pytest.approx(0.6)
    assert (h.mean_draft_length, h.num_speculative_tokens) == (3.0, 3)
    assert h.withheld == ()


def test_0_5_10_interval_gauge_route() -> None:
    """0.5.10 has no verify counter: τ is the interval gauge 2.8; N = τ / rate = 2.8 / 0.7 = 4
    (the rate's own formula of that era), so α = 0.6, not the biased gauge 0.7."""
    h = _server(_page("sglang-0.5.10-eagle-tp2-all-schedulers"))
    assert h.spec_decode_schema == "sglang_interval"
    assert h.mean_acceptance_length == pytest.approx(2.8)
    assert h.acceptance_rate == pytest.approx(0.6)
    assert h.num_speculative_tokens == 3
    assert h.drafts is None


def test_rate_above_one_is_dropped_for_tau() -> None:
    """0.5.4 NGRAM writes rate 2.5 (= τ: its S is unset): the rate is withheld
    (``acceptance_above_one``), τ 2.5 is kept, and α = (2.5 − 1) / (12 − 1) once N = 12 is
    known (K = 11 configured); without N, α is unknown, never 2.5."""
    page = _page("sglang-0.5.4-ngram-tp2-rate-above-1")
    bare = _server(page)
    assert bare.mean_acceptance_length == pytest.approx(2.5)
    assert bare.acceptance_rate is None
    assert bare.withheld == ("acceptance_above_one",)
    known = _server(page, k=11)
    assert known.acceptance_rate == pytest.approx(1.5 / 11)
    assert known.withheld == ("acceptance_above_one",)


def test_no_speculation_gives_no_tau() -> None:
    """Without speculation SGLang still writes spec_accept_length 0: τ, α and K are unknown."""
    h = _server(_page("sglang-0.5.23-nospec-tp1"))
    assert (h.mean_acceptance_length, h.acceptance_rate, h.num_speculative_tokens) == (
        None,
        None,
        None,
    )
    assert h.spec_decode_schema is None
    assert h.num_requests_running == 64.0


def _bump(text: str, gen: float, verify: float) -> str:
    """The default 0.5.23 page with ``gen`` more non-streaming generated tokens and ``verify``
    more verify calls."""
    return text.replace(
        'is_streaming="false",model_name="meta-llama/Llama-3.1-8B-Instruct"} 385280.0',
        f'is_streaming="false",model_name="meta-llama/Llama-3.1-8B-Instruct"}} {385280.0 + gen}',
    ).replace(
        'sglang:spec_verify_calls_total{engine_type="unified",'
        'model_name="meta-llama/Llama-3.1-8B-Instruct"} 172000.0',
        'sglang:spec_verify_calls_total{engine_type="unified",'
        f'model_name="meta-llama/Llama-3.1-8B-Instruct"}} {172000.0 + verify}',
    )


def test_counter_window_is_exact() -> None:
    """Over a window of 2000 generated tokens and 1000 verifies τ is 2.0 and α = 1 / 3,
    whatever the interval gauge (still 2.8) says: the counters cover the window exactly."""
    text = body("sglang/sglang-0.5.23-eagle3-tp2-default.metrics")
    h = _server(parse_page(_bump(text, 2000, 1000)), parse_page(text))
    assert h.mean_acceptance_length == pytest.approx(2.0)
    assert h.acceptance_rate == pytest.approx(1 / 3)
    assert h.drafts_per_second == pytest.approx(1000 / 60)


def test_interval_gauge_is_withheld_without_traffic() -> None:
    """Two 0.5.10 pages with no generated token between them: the gauge is an older interval's
    (sticky), so the window has no τ."""
    page = _page("sglang-0.5.10-eagle-tp2-all-schedulers")
    h = _server(page, page)
    assert h.mean_acceptance_length is None
    assert h.acceptance_rate is None


DP_PAGE = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{dp_rank="0",model_name="m",pp_rank="0",tp_rank="0"} 10.0
sglang:num_running_reqs{dp_rank="0",model_name="m",pp_rank="0",tp_rank="1"} 10.0
sglang:num_running_reqs{dp_rank="1",model_name="m",pp_rank="0",tp_rank="2"} 7.0
sglang:num_running_reqs{dp_rank="1",model_name="m",pp_rank="0",tp_rank="3"} 7.0
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{dp_rank="0",model_name="m",pp_rank="0",tp_rank="0"} 3.0
sglang:spec_accept_length{dp_rank="1",model_name="m",pp_rank="0",tp_rank="2"} 2.0
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="m"} 1000.0
"""


def test_dp_ranks_are_engines_with_their_lowest_tp_rank() -> None:
    """Under DP attention each dp_rank is an engine read from its lowest tp_rank (10 and 7
    running, never 20 and 14); K = 3 configured gives α 2 / 3 and 1 / 3 per engine."""
    page = parse_page(DP_PAGE)
    assert sorted(page.engines) == [("m", "0"), ("m", "1")]
    assert page.engines[("m", "0")].gauges["running"] == 10.0
    assert page.engines[("m", "1")].gauges["running"] == 7.0
    mw = model_windows(page_delta(None, page, None), configured_k=3)["m"]
    assert mw.engines["0"].acceptance_rate == pytest.approx(2 / 3)
    assert mw.engines["1"].mean_acceptance_length == pytest.approx(2.0)
    assert mw.server.num_requests_running == 17.0


def test_malformed_sglang_page_names_its_line() -> None:
    """A bad value on a kept SGLang line is a ParseError naming that line."""
    text = '# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{tp_rank="0"} x\n'
    with pytest.raises(ParseError) as info:
        parse_page(text)
    assert info.value.line == 2


def test_engine_setting_forces_the_parser() -> None:
    """A target set to ``engine=sglang`` reads a page by SGLang's rules even when vLLM lines
    are on it too (only the sglang:* series are kept)."""
    text = 'vllm:num_requests_running{engine="0",model_name="m"} 3\n' + DP_PAGE
    assert parse_page(text).engine_kind == "vllm"
    forced = parse_page(text, engine="sglang")
    assert forced.engine_kind == "sglang"
    assert forced.engines[("m", "0")].gauges["running"] == 10.0


def test_tracker_capacity_takes_sglang_budget_rule() -> None:
    """An SGLang target with max_running_requests 48 (``max_num_seqs``) and the page's N = 4:
    K 3 observed, every request verifies 4 tokens, a full batch verifies 48 · 4 = 192 tokens,
    all 48 verify full drafts (no per-step token budget), never budget-bound; 32 / 48 running."""
    target = TargetSettings(name="fly", url="http://127.0.0.1:1", max_num_seqs=48)
    tracker = TargetTracker(target, windows={"1m": 60.0})
    tracker.record_page(0.0, _page("sglang-0.5.23-eagle3-tp2-default"), duration_seconds=0.1)
    cap = tracker.snapshot().capacity
    assert cap.limits_configured is True
    assert (cap.num_speculative_tokens, cap.num_speculative_tokens_source) == (3, "observed")
    assert (cap.slots_per_request, cap.required_batched_tokens) == (4, 192)
    assert (cap.admission_cap_requests, cap.decode_full_per_step_requests) == (48, 48)
    assert cap.budget_bound is False
    assert cap.running_to_max_seqs_ratio == pytest.approx(32 / 48)
