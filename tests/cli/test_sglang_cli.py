"""``specwatch analyze``, ``replay`` and ``run`` on SGLang pages: TP=2 repetition (one rank
read), the exact verify-counter route of 0.5.23 and the interval gauges of 0.5.4 whose accept
rate is above 1 (dropped; α from τ). ``run`` scrapes real HTTP servers on 127.0.0.1 that serve
the fixture pages, beside a vLLM page (one view). Expected values are worked by hand from the
fixtures' provenance lines (τ = 481600 / 172000 = 2.8, α = (τ − 1) / (N − 1))."""

from __future__ import annotations

import asyncio
import json
import re
import signal
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from specwatch.__main__ import main as cli_main
from tests.fakes import free_port
from tests.fakes.vllm import FakeVllm, Reply
from tests.fixture_files import FIXTURES
from tests.sidecar_process import run_config, specwatch_process

SG = FIXTURES / "sglang"
DEFAULT_0_5_23 = SG / "sglang-0.5.23-eagle3-tp2-default.metrics"
NGRAM_0_5_4 = SG / "sglang-0.5.4-ngram-tp2-rate-above-1.metrics"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
_GEN_FALSE = re.compile(
    r'^(sglang:generation_tokens_total\{engine_type="unified",is_streaming="false",[^}]*\}) (\S+)$',
    re.M,
)
_GEN_ANY = re.compile(r"^(sglang:generation_tokens_total\{[^}]*\}) (\S+)$", re.M)
_VERIFY = re.compile(r"^(sglang:spec_verify_calls_total\{[^}]*\}) (\S+)$", re.M)
_TAU = re.compile(r"^(sglang:spec_accept_(?:length|rate)\{[^}]*\}) (\S+)$", re.M)


def _add(pattern: re.Pattern[str], text: str, more: float) -> str:
    return pattern.sub(lambda m: f"{m[1]} {float(m[2]) + more!r}", text, count=1)


def counter_page(gen: float, verify: float) -> str:
    """The default 0.5.23 TP=2 page with ``gen`` more generated tokens and ``verify`` more
    verify calls."""
    text = DEFAULT_0_5_23.read_text(encoding="utf-8")
    return _add(_VERIFY, _add(_GEN_FALSE, text, gen), verify)


def ngram_page(gen: float, tau: float) -> str:
    """The 0.5.4 NGRAM TP=2 page with ``gen`` more generated tokens and its interval gauges
    (accept length and the rate, equal in that era for NGRAM) at ``tau`` on both ranks."""
    text = _add(_GEN_ANY, NGRAM_0_5_4.read_text(encoding="utf-8"), gen)
    return _TAU.sub(lambda m: f"{m[1]} {tau!r}", text)


def _analyze(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    capsys.readouterr()
    assert cli_main(["analyze", *argv, "--format", "json"]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


class TestAnalyze:
    def test_tp2_page_since_start(self, capsys: pytest.CaptureFixture[str]) -> None:
        """One 0.5.23 TP=2 page: τ 2.8 and α 0.6 from the counters, 32 running (rank 0 only)."""
        doc = _analyze(capsys, str(DEFAULT_0_5_23))
        s = doc["server"]
        assert doc["model_name"] == MODEL
        assert list(doc["engines"]) == ["0"]
        assert s["mean_acceptance_length"] == pytest.approx(2.8)
        assert s["acceptance_rate"] == pytest.approx(0.6)
        assert (s["num_speculative_tokens"], s["spec_decode_schema"]) == (3, "sglang_counters")
        assert s["num_requests_running"] == 32.0

    def test_window_between_two_pages(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        """3000 tokens over 2000 verifies in 60 s: τ 1.5, α 0.5 / 3, 2000 / 60 verifies/s."""
        before, after = tmp_path / "a.prom", tmp_path / "b.prom"
        before.write_text(counter_page(0, 0))
        after.write_text(counter_page(3000, 2000))
        s = _analyze(capsys, str(before), str(after), "--interval", "60")["server"]
        assert s["mean_acceptance_length"] == pytest.approx(1.5)
        assert s["acceptance_rate"] == pytest.approx(0.5 / 3)
        assert s["drafts_per_second"] == pytest.approx(2000 / 60)

    def test_rate_above_one_with_server_info(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        """0.5.4 NGRAM (rate 2.5 > 1): without N only τ 2.5; with its /server_info
        (speculative_num_draft_tokens 12) α = 1.5 / 11; the rate is withheld both times."""
        bare = _analyze(capsys, str(NGRAM_0_5_4))["server"]
        assert bare["mean_acceptance_length"] == pytest.approx(2.5)
        assert bare["acceptance_rate"] is None
        assert bare["withheld"] == ["acceptance_above_one"]
        info = tmp_path / "server_info.json"
        info.write_text(
            json.dumps(
                {
                    "speculative_algorithm": "NGRAM",
                    "speculative_num_draft_tokens": 12,
                    "speculative_num_steps": None,
                    "tp_size": 2,
                    "version": "0.5.4",
                }
            )
        )
        s = _analyze(capsys, str(NGRAM_0_5_4), "--server-info", str(info))["server"]
        assert s["acceptance_rate"] == pytest.approx(1.5 / 11)
        assert s["num_speculative_tokens"] == 11
        assert s["withheld"] == ["acceptance_above_one"]

    def test_table_names_the_engine_columns(self, capsys: pytest.CaptureFixture[str]) -> None:
        """The table of the 0.5.10 page (server and engine 0 columns; at 80 columns the engine
        column is a block of its own below the server's) shows α 0.6 (τ 2.8, N = τ / rate =
        4), not the biased gauge 0.7."""
        capsys.readouterr()
        path = SG / "sglang-0.5.10-eagle-tp2-all-schedulers.metrics"
        assert cli_main(["analyze", str(path), "--format", "table"]) == 0
        rows: dict[str, list[str]] = {}
        for line in capsys.readouterr().out.splitlines()[2:]:
            if line.split() and line.startswith(("acceptance_rate", "spec_decode_schema")):
                rows.setdefault(line.split()[0], []).extend(line.split()[1:])
        assert rows["acceptance_rate"] == ["0.6", "0.6"]  # server, engine 0
        assert rows["spec_decode_schema"] == ["sglang_interval", "sglang_interval"]


def _replay(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict[str, Any]]:
    capsys.readouterr()
    assert cli_main(["replay", *argv, "--format", "json"]) == 0
    alerts: list[dict[str, Any]] = json.loads(capsys.readouterr().out)["alerts"]
    return alerts


@pytest.fixture
def every_minute(monkeypatch: pytest.MonkeyPatch) -> None:
    """Evaluate the detectors once a minute (the scrape interval of the written pages)."""
    monkeypatch.setenv("SPECWATCH_ALERTING__EVALUATION_INTERVAL", "60")


@pytest.mark.usefixtures("every_minute")
class TestReplay:
    def test_counter_route_drop_fires(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        """TP=2 0.5.23 pages, 1000 verifies a minute: τ 2.8 for an hour, then 1.6. The default
        windows have no 1h, so the baseline is since_start: at minute 60 + m (m ≥ 2) the 5m
        value of τ − 1 is below 0.8 × the baseline's (m = 2: 1.32 / (109.2 / 62) = 0.75), so
        SpecAcceptanceDrop fires 600 s later, at 72 min = 4320 s, with α_5m / α_since_start =
        0.6 / ((60 · 1.8 + 12 · 0.6) / 72) = 0.6 / 1.6 = 0.375."""
        d = tmp_path / "sg"
        d.mkdir()
        gen = 0.0
        for minute in range(76):
            gen += 0 if minute == 0 else (2800 if minute <= 60 else 1600)
            (d / f"{60 * minute}.prom").write_text(counter_page(gen, 1000 * minute))
        alerts = _replay(capsys, "--target", f"fly={d}")
        drops = [a for a in alerts if a["alertname"] == "SpecAcceptanceDrop"]
        assert [(a["fired_at"], a["resolved_at"]) for a in drops] == [(4320.0, None)]
        assert drops[0]["labels"] == {
            "model_name": MODEL,
            "role": "fly",
            "scope": "server",
            "target": "fly",
            # SGLang exports no per-position acceptance: the conditional rates cannot be
            # compared, so a changed drafter or changed traffic remain
            "cause": "undetermined",
        }
        assert drops[0]["value"] == pytest.approx(0.375)

    def test_interval_route_rate_above_one(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        """0.5.4 NGRAM pages (rate = τ > 1), K = 11 configured, 1000 tokens a minute: τ 2.5 for
        an hour then 1.3. α = (τ − 1) / 11 falls from 1.5 / 11 to 0.3 / 11, 0.2 of its best
        sustained level, so SpecAcceptanceDecay fires 900 s after the first low page (3660 s),
        at 4560 s, value 0.2; the rate gauge 2.5 never reaches α. SpecAcceptanceDrop cannot
        fire: a 5m and a 1h window read the same interval gauge."""
        d = tmp_path / "ngram"
        d.mkdir()
        for minute in range(80):
            tau = 2.5 if minute <= 60 else 1.3
            (d / f"{60 * minute}.prom").write_text(ngram_page(1000.0 * minute, tau))
        alerts = _replay(capsys, "--target", f"fly={d},num_speculative_tokens=11")
        decay = [a for a in alerts if a["alertname"] == "SpecAcceptanceDecay"]
        assert [(a["fired_at"], a["resolved_at"]) for a in decay] == [(4560.0, None)]
        assert decay[0]["value"] == pytest.approx(0.2)
        assert not [a for a in alerts if a["alertname"] == "SpecAcceptanceDrop"]


async def test_run_scrapes_sglang_and_vllm_in_one_view(tmp_path: Path) -> None:
    """``specwatch run`` over HTTP: an SGLang 0.5.23 TP=2 server (counters, +2800 tokens over
    +1000 verifies: τ 2.8, α 0.6), an SGLang 0.5.4 NGRAM server (rate 2.5 withheld, τ 2.5,
    α 1.5 / 11 with K 11) and a vLLM server, all in one /api/v1/snapshot and one /metrics
    (``specwatch_target_engine_info`` tells the engines apart)."""
    sg23, sg04, vllm = FakeVllm(), FakeVllm(), FakeVllm()
    sg23.push(Reply(counter_page(0, 0)), Reply(counter_page(2800, 1000)))
    sg04.push(Reply(ngram_page(0, 2.5)), Reply(ngram_page(1000, 2.5)))
    vllm.push(Reply((FIXTURES / "vllm-metrics/real-cpu-ngram.txt").read_text()))
    for fake in (sg23, sg04, vllm):
        await fake.server.start_server()
    port = free_port()
    cfg = run_config(
        tmp_path,
        port,
        targets=[
            {"name": "fly", "url": sg23.url},
            {"name": "standard", "url": sg04.url, "num_speculative_tokens": 11, "engine": "sglang"},
            {"name": "baseline", "url": vllm.url},
        ],
        scrape={"interval_seconds": 0.2, "timeout_seconds": 2.0},
    )
    try:
        async with specwatch_process(tmp_path, ["run", "--config", str(cfg)], port=port) as p:
            doc: dict[str, Any] = {}
            async with aiohttp.ClientSession() as s:
                for _ in range(300):
                    async with s.get(p.url + "/api/v1/snapshot") as r:
                        doc = await r.json()
                    targets = doc.get("targets", {})
                    if all(
                        targets.get(n, {}).get("scrapes_total", 0) >= 3
                        for n in ("fly", "standard", "baseline")
                    ):
                        break
                    await asyncio.sleep(0.1)
                async with s.get(p.url + "/metrics") as r:
                    metrics = await r.text()
            code, _ = await p.stop(signal.SIGTERM)
            assert code == 0
    finally:
        for fake in (sg23, sg04, vllm):
            await fake.server.close()
    fly = doc["targets"]["fly"]["windows"]["since_start"]["server"]
    assert fly["mean_acceptance_length"] == pytest.approx(2.8)
    assert fly["acceptance_rate"] == pytest.approx(0.6)
    assert fly["num_requests_running"] == 32.0
    std = doc["targets"]["standard"]["windows"]["since_start"]["server"]
    assert std["mean_acceptance_length"] == pytest.approx(2.5)
    assert std["acceptance_rate"] == pytest.approx(1.5 / 11)
    assert std["withheld"] == ["acceptance_above_one"]
    assert [doc["targets"][n]["serving_engine"] for n in ("fly", "standard", "baseline")] == [
        "sglang",
        "sglang",
        "vllm",
    ]
    info = sorted(ln for ln in metrics.splitlines() if ln.startswith("specwatch_target_engine"))
    assert info == [
        'specwatch_target_engine_info{role="baseline",serving_engine="vllm",target="baseline"} 1.0',
        'specwatch_target_engine_info{role="fly",serving_engine="sglang",target="fly"} 1.0',
        'specwatch_target_engine_info{role="standard",serving_engine="sglang",'
        'target="standard"} 1.0',
    ]
    base = doc["targets"]["baseline"]
    assert base["up"] is True
    assert base["scrape_errors"].get("no_vllm_families", 0) == 0
