"""What a page says beyond spec decode: coverage of speculation, prompt tokens by source, the
prefix cache and its block size, and the LoRA adapters (vllm-metrics.md §2 and §5)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from specwatch.__main__ import main as cli_main
from specwatch.export.json import snapshot_json
from specwatch.export.snapshot import Snapshot
from specwatch.observe.parse import parse_page
from specwatch.observe.settings import TargetSettings
from specwatch.observe.tracker import TargetTracker, build_view
from tests.fixture_files import FIXTURES

SEL = 'engine="0",model_name="m"'


def _page(
    *,
    local: float,
    external: float,
    queries: float,
    hits: float,
    prompts_le10: float,
    prompts_le500: float,
    block_size: int = 16,
) -> str:
    """A decode server's page: prompt tokens by source, prefix-cache counters, the prompt-length
    histogram (cumulative), ``cache_config_info`` and two ``lora_requests_info`` series."""
    lines = [
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{{{SEL}}} 100.0",
        "# TYPE vllm:prompt_tokens_by_source_total counter",
        f'vllm:prompt_tokens_by_source_total{{{SEL},source="local_compute"}} {local}',
        f'vllm:prompt_tokens_by_source_total{{{SEL},source="local_cache_hit"}} 0.0',
        f'vllm:prompt_tokens_by_source_total{{{SEL},source="external_kv_transfer"}} {external}',
        "# TYPE vllm:prefix_cache_queries_total counter",
        f"vllm:prefix_cache_queries_total{{{SEL}}} {queries}",
        "# TYPE vllm:prefix_cache_hits_total counter",
        f"vllm:prefix_cache_hits_total{{{SEL}}} {hits}",
        "# TYPE vllm:request_prompt_tokens histogram",
        f'vllm:request_prompt_tokens_bucket{{{SEL},le="10.0"}} {prompts_le10}',
        f'vllm:request_prompt_tokens_bucket{{{SEL},le="500.0"}} {prompts_le500}',
        f'vllm:request_prompt_tokens_bucket{{{SEL},le="+Inf"}} {prompts_le500}',
        f"vllm:request_prompt_tokens_count{{{SEL}}} {prompts_le500}",
        f"vllm:request_prompt_tokens_sum{{{SEL}}} 0.0",
        "# TYPE vllm:cache_config_info gauge",
        f'vllm:cache_config_info{{block_size="{block_size}",cache_dtype="auto",'
        'enable_prefix_caching="True",engine="0",kv_cache_size_tokens="65536"} 1.0',
        "# TYPE vllm:lora_requests_info gauge",
        'vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql,chat",'
        'waiting_lora_adapters=""} 1.7e+09',
        'vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql",'
        'waiting_lora_adapters="chat"} 1.6999e+09',
    ]
    return "\n".join(lines) + "\n"


def test_analyze_reads_prompt_sources_and_prefix_hits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two pages a minute apart: 300 prompt tokens computed here and 700 taken over through the
    KV connector (a decode server of a disaggregated pair), 40 of 200 queried tokens hit the
    prefix cache: ``prompt_tokens_by_source`` = {local_compute 300, local_cache_hit 0,
    external_kv_transfer 700}, hit rate 0.2."""
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text(
        _page(local=0, external=0, queries=0, hits=0, prompts_le10=0, prompts_le500=0), "utf-8"
    )
    b.write_text(
        _page(local=300, external=700, queries=200, hits=40, prompts_le10=0, prompts_le500=5),
        "utf-8",
    )
    assert cli_main(["analyze", str(a), str(b), "--format", "json"]) == 0
    server = json.loads(capsys.readouterr().out)["server"]
    assert server["prompt_tokens_by_source"] == {
        "local_compute": 300.0,
        "local_cache_hit": 0.0,
        "external_kv_transfer": 700.0,
    }
    assert server["prefix_cache_hit_rate"] == pytest.approx(0.2, rel=1e-12)


def test_analyze_shows_coverage_beside_tau(capsys: pytest.CaptureFixture[str]) -> None:
    """The real ngram capture: 488 drafts, 184 accepted, 2656 generated since start, so
    coverage = (184 + 488) / 2656 = 0.2530 (three quarters of its output came from steps that
    proposed nothing) next to τ = 1 + 184 / 488."""
    rc = cli_main(["analyze", str(FIXTURES / "vllm-metrics" / "real-cpu-ngram.txt"), "--format",
                   "json"])  # fmt: skip
    server = json.loads(capsys.readouterr().out)["server"]
    assert rc == 0
    assert server["speculation_coverage"] == pytest.approx((184 + 488) / 2656, rel=1e-12)
    assert server["mean_acceptance_length"] == pytest.approx(1 + 184 / 488, rel=1e-12)


def _tracked(*pages: str) -> TargetTracker:
    tr = TargetTracker(TargetSettings(name="decode", url="http://h:1"), {"1m": 60.0})
    for i, body in enumerate(pages):
        tr.record_page(60.0 * i, parse_page(body), duration_seconds=0.01)
    return tr


def test_snapshot_has_sources_cache_and_lora() -> None:
    """``/api/v1/snapshot``: the window's prompt tokens by source and prefix-cache hit rate;
    the target's cache config (block 16, prefix caching on, 65536 tokens) and LoRA state read
    from the series with the largest value (1.7e9: ``sql`` and ``chat`` running, none waiting),
    never a sum of the two series."""
    tr = _tracked(
        _page(local=0, external=0, queries=0, hits=0, prompts_le10=0, prompts_le500=0),
        _page(local=300, external=700, queries=200, hits=40, prompts_le10=0, prompts_le500=5),
    )
    doc = snapshot_json(Snapshot(build_view([tr.snapshot()], now=60.0)))
    target = doc["targets"]["decode"]
    server = target["windows"]["1m"]["server"]
    assert server["prompt_tokens_by_source"] == {
        "local_compute": 300.0,
        "local_cache_hit": 0.0,
        "external_kv_transfer": 700.0,
    }
    assert server["prefix_cache_hit_rate"] == pytest.approx(0.2, rel=1e-12)
    assert target["cache_config"] == {
        "block_size": 16,
        "enable_prefix_caching": True,
        "kv_cache_size_tokens": 65536,
    }
    assert target["lora"] == {
        "max_lora": 4,
        "running_adapters": ["sql", "chat"],
        "waiting_adapters": [],
        "updated_at": 1.7e9,
    }
    assert target["prefix_cache_below_block"] is False


def test_prefix_cache_below_one_block_warns(caplog: pytest.LogCaptureFixture) -> None:
    """Prefix caching on with 16-token blocks, and every prompt since start at most 10 tokens:
    vLLM caches whole blocks only, so the cache can never hit. The snapshot says so and one
    warning line names the block size; prompts of up to 500 tokens clear it."""
    short = [
        _page(local=0, external=0, queries=0, hits=0, prompts_le10=0, prompts_le500=0),
        _page(local=30, external=0, queries=30, hits=0, prompts_le10=5, prompts_le500=5),
    ]
    with caplog.at_level(logging.WARNING, logger="specwatch"):
        tr = _tracked(*short, short[1])
    assert tr.snapshot().prefix_cache_below_block is True
    warned = [r for r in caplog.records if "one KV block" in r.getMessage()]
    assert len(warned) == 1
    assert getattr(warned[0], "specwatch_fields", {})["block_size"] == 16
    long = _tracked(
        short[0],
        _page(local=300, external=0, queries=300, hits=0, prompts_le10=0, prompts_le500=5),
    )
    assert long.snapshot().prefix_cache_below_block is False


def test_malformed_info_line_skips_only_itself() -> None:
    """An info line that is not exposition text (vLLM's docs elide labels with ``...``) is
    skipped and counted as an invalid series; the rest of the page is read."""
    body = (
        _page(local=1, external=2, queries=0, hits=0, prompts_le10=0, prompts_le500=0)
        + 'vllm:cache_config_info{block_size="16",...} 1.0\n'
    )
    page = parse_page(body)
    assert page.invalid_series == 1
    assert page.cache_config is not None
    assert page.cache_config.block_size == 16
    assert page.engines[("m", "0")].counters["prompt_tokens_external_kv_transfer"] == 2.0
