"""``specwatch advise``: τ for smaller K on real captures, budget formulas, the CLI as run."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from specwatch.__main__ import main as cli_main
from specwatch.tools.advise.advisor import (
    MIN_DRAFTS,
    KRow,
    advice,
    budget_for_full_decode,
    mean_acceptance_length,
    rows_by_k,
)
from specwatch.tools.advise.command import SGLANG_CANNOT
from specwatch.vllm.methods import BudgetRegime
from tests.fakes import REPO

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "vllm-metrics"


def _advise(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specwatch", "advise", *argv],
        capture_output=True,
        text=True,
        check=check,
    )


def _json(*argv: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(_advise(*argv, "--format", "json").stdout)
    return doc


def test_tau_for_smaller_k_on_the_draft_model_pair() -> None:
    """Captures real-cpu-draft-model-midflight -> real-cpu-draft-model (a restart between them,
    so the window is AFTER's totals): 2603 drafts, per-position accepted 33, 0, 0, 0. By hand:
    τ(K') = 1 + 33/2603 = 1.0126777 for every K' in 1..4."""
    doc = _json(
        str(FIXTURES / "real-cpu-draft-model-midflight.txt"),
        str(FIXTURES / "real-cpu-draft-model.txt"),
    )
    assert doc["drafts"] == 2603
    assert doc["num_speculative_tokens"] == 4
    assert [r["k"] for r in doc["by_k"]] == [1, 2, 3, 4]
    for r in doc["by_k"]:
        assert r["mean_acceptance_length"] == pytest.approx(1 + 33 / 2603)
        assert r["expected_tokens_per_step"] is None
    assert any("K=1 keeps" in a for a in doc["advice"])


def test_tau_for_smaller_k_on_the_ngram_capture() -> None:
    """real-cpu-ngram: 488 drafts, per-position accepted 146, 18, 12, 8. By hand:
    τ = 1 + 146/488, 1 + 164/488, 1 + 176/488, 1 + 184/488."""
    doc = _json(str(FIXTURES / "real-cpu-ngram.txt"))
    taus = [r["mean_acceptance_length"] for r in doc["by_k"]]
    assert taus == pytest.approx([1 + 146 / 488, 1 + 164 / 488, 1 + 176 / 488, 1 + 184 / 488])


def test_ngram_budget_rows_and_advice() -> None:
    """ngram (S = 0), N = 128, B = 512, no requests running on the page, so concurrency 128.
    Only 488 of the 2656 − 184 = 2472 request steps drafted (coverage 0.197): a request emits
    1 + (488/2472)·(τ(K) − 1) = 1 + Σ_{i<K} per_pos[i] / 2472 tokens a step.
    K=4: D_full = 512 // 5 = 102, the other 26 requests get 1 token: 102·(1 + 184/2472) + 26 =
    135.59; K=3: 512 // 4 = 128 in full: 128·(1 + 176/2472) = 137.11 (the best); K=1:
    128·(1 + 146/2472) = 135.56, within 2 % of the best (137.11 / 1.02 = 134.42), and K=3 is
    not 2 % above K=4: no K pays, K=1 is enough (planned as if every step drafted, K=2 looked
    2.7 % better: 171.0 vs 166.5); the budget for all 128 at K=4 is 128·5 = 640, a gain under
    2 % at this coverage, so no budget line."""
    doc = _json(
        str(FIXTURES / "real-cpu-ngram.txt"),
        "--max-num-seqs",
        "128",
        "--max-num-batched-tokens",
        "512",
        "--method",
        "ngram",
    )
    by_k = {r["k"]: r for r in doc["by_k"]}
    assert doc["concurrency"] == 128
    assert by_k[4]["decode_full_per_step_requests"] == 102
    assert doc["step_coverage"] == pytest.approx(488 / 2472)
    assert doc["speculation_coverage"] == pytest.approx((184 + 488) / 2656)
    assert by_k[4]["expected_tokens_per_step"] == pytest.approx(102 * (1 + 184 / 2472) + 26)
    assert by_k[3]["expected_tokens_per_step"] == pytest.approx(128 * (1 + 176 / 2472))
    assert [by_k[k]["budget_for_max_num_seqs"] for k in (1, 2, 3, 4)] == [256, 384, 512, 640]
    assert doc["advice"][0].startswith(
        "no K pays: every K from 1 to 4 gives within 2 % of the best 137.1 expected tokens per "
        "step (K=4: 135.6), so K=1 is enough"
    )
    assert not any("max_num_batched_tokens=640" in a for a in doc["advice"])
    assert any(a.startswith("only 20% of request steps drafted") for a in doc["advice"])


@pytest.mark.parametrize(
    ("version", "d_full", "budget"),
    [("0.33.0", 85, 768), ("0.30.0", 51, 1280)],
)
def test_dspark_worked_example(version: str, d_full: int, budget: int) -> None:
    """dspark, K = 5, B = 512, N = 128. v0.33: S = 0, L = K + 1 = 6, admission cap 512 // 6 =
    85, D_full = min(85, 512 // 6) = 85; full budget 128·6 = 768. v0.26-v0.32: S = K - 1 = 4,
    D_full = 512 // (1 + 5 + 4) = 51; full budget 128·10 = 1280."""
    regime = BudgetRegime.V0_33 if version == "0.33.0" else BudgetRegime.V0_32
    rows = rows_by_k(
        [0.7, 0.5, 0.35, 0.25, 0.15],
        max_num_seqs=128,
        max_num_batched_tokens=512,
        method="dspark",
        regime=regime,
    )
    assert rows[4].decode_full_per_step_requests == d_full
    assert rows[4].budget_for_max_num_seqs == budget
    assert rows[4].expected_tokens_per_step == pytest.approx(d_full * 2.95)
    assert budget_for_full_decode(128, 5, "dspark", regime=regime) == budget


def test_dspark_worked_example_through_the_cli(tmp_path: Path) -> None:
    """The same example driven as a user runs it (--vllm-version 0.33.0 vs 0.30.0) on the
    ngram capture's acceptance: K=4 is the largest K there, so check the K=4 dspark row:
    v0.33: L = 5, cap 512 // 5 = 102 = D_full; v0.30: S = 3, 512 // 8 = 64."""
    for version, expected in (("0.33.0", 102), ("0.30.0", 64)):
        doc = _json(
            str(FIXTURES / "real-cpu-ngram.txt"),
            "--max-num-seqs",
            "128",
            "--max-num-batched-tokens",
            "512",
            "--method",
            "dspark",
            "--vllm-version",
            version,
        )
        assert doc["by_k"][3]["decode_full_per_step_requests"] == expected


def test_static_regime_budget() -> None:
    """v0.20-v0.25 static reservation, dspark K = 3, N = 16: S_old = K - 1 = 2, so
    B = N·(1 + K + S_old) = 16·6 = 96."""
    assert budget_for_full_decode(16, 3, "dspark", regime=BudgetRegime.STATIC) == 96


def test_smaller_k_tau_and_errors() -> None:
    """τ(2) of [0.6, 0.3, 0.1] = 1.9; k outside 1..3 raises."""
    assert mean_acceptance_length([0.6, 0.3, 0.1], 2) == pytest.approx(1.9)
    with pytest.raises(ValueError, match="k must be"):
        mean_acceptance_length([0.6], 2)


def test_no_claim_on_few_drafts_or_unknown_k() -> None:
    """Below MIN_DRAFTS drafts, or without per-position data, advice says so and claims
    nothing."""
    rows = rows_by_k([0.5, 0.2])
    few = advice(rows, drafts=MIN_DRAFTS - 1, configured_k=2)
    assert len(few) == 1
    assert "too noisy" in few[0]
    unknown = advice([], drafts=10_000, configured_k=None)
    assert "K unknown" in unknown[0]


def test_page_without_spec_decode_says_k_unknown() -> None:
    """real-cpu-nospec has no spec-decode counters: no rows, advice says K is unknown."""
    doc = _json(str(FIXTURES / "real-cpu-nospec.txt"))
    assert doc["by_k"] == []
    assert "K unknown" in doc["advice"][0]


def test_table_and_bad_input(tmp_path: Path) -> None:
    """--format table prints one line per K; a missing file exits 2 with one stderr line."""
    out = _advise(str(FIXTURES / "real-cpu-ngram.txt"), "--format", "table").stdout
    assert out.splitlines()[0].startswith("model tiny: drafts 488, K 4")
    assert sum(1 for line in out.splitlines() if line.lstrip()[:2] in {"1 ", "2 ", "3 ", "4 "}) >= 4
    bad = _advise(str(tmp_path / "missing.txt"), check=False)
    assert bad.returncode == 2
    assert bad.stderr.startswith("specwatch advise:")
    assert len(bad.stderr.strip().splitlines()) == 1


def _series(tmp_path: Path, name: str, points: list[tuple[float, float]]) -> list[str]:
    """Saved pages: the mid-flight capture with its running gauge and generation-token counter
    set to each ``(running, generation_tokens_total)``; every other counter stays put."""
    base = (FIXTURES / "real-cpu-draft-model-midflight.txt").read_text(encoding="utf-8")
    out = []
    for i, (running, tokens) in enumerate(points):
        text = base.replace(
            'vllm:num_requests_running{engine="0",model_name="tiny"} 8.0',
            f'vllm:num_requests_running{{engine="0",model_name="tiny"}} {running}',
        ).replace(
            'vllm:generation_tokens_total{engine="0",model_name="tiny"} 1585.0',
            f'vllm:generation_tokens_total{{engine="0",model_name="tiny"}} {tokens}',
        )
        path = tmp_path / f"{name}-{i}.txt"
        path.write_text(text, encoding="utf-8")
        out.append(str(path))
    return out


def test_speculation_limit_from_saved_series(tmp_path: Path) -> None:
    """Pages 10 s apart. Standard: 8 windows at 1 running with 500 tokens (50 tokens/s per
    request), then 8 at 8 running with 3,200 (320/8 = 40). FLy: 800 at 1 (80, 1.6×), then 2,800
    at 8 (280/8 = 35, 0.875×). The log ratio is ln 1.6 at 1 and ln 0.875 at 8, a straight line
    in ln(running) between them: zero at t = ln 1.6 / (ln 1.6 − ln 0.875) = 0.7788, so 8^0.7788 =
    5.05 running, interpolated (the bands would say "from 8"). A baseline series (no
    speculation, 50 per request at both) is compared first when given, each comparison
    labelled: the log ratio is ln 1.6 at 1 and ln 0.7 at 8, zero at 8^(ln 1.6 / ln(1.6/0.7))
    = 3.26."""

    def pages(name: str, at1: int, at8: int) -> list[str]:
        counts = [(1.0, float(at1 * i)) for i in range(9)]
        counts += [(8.0, float(at1 * 8 + at8 * i)) for i in range(1, 9)]
        return _series(tmp_path, name, counts)

    std, fly = pages("std", 500, 3200), pages("fly", 800, 2800)
    doc = _json(
        str(FIXTURES / "real-cpu-draft-model-midflight.txt"),
        "--standard-series",
        *std,
        "--fly-series",
        *fly,
        "--series-interval",
        "10",
    )
    lim = doc["speculation_limit"]
    (std_cmp,) = lim["comparisons"]
    assert (std_cmp["reference"], std_cmp["status"]) == ("standard", "reached")
    t = math.log(1.6) / (math.log(1.6) - math.log(0.875))
    assert std_cmp["running"] == pytest.approx(8**t, rel=1e-6)
    assert [b["band"] for b in lim["bands"]] == ["1", "8-15"]
    assert [round(b["speed_ratio"], 6) for b in lim["bands"]] == [1.6, 0.875]
    assert [b["standard_speed"] for b in lim["bands"]] == [50.0, 40.0]
    assert lim["text"] in doc["advice"]
    assert lim["text"] == std_cmp["text"]
    assert lim["text"].startswith(
        "FLy vs standard speculation: stops paying from about 5 running requests (95 % "
        "interval 1-8)"
    )
    table = _advise(
        str(FIXTURES / "real-cpu-draft-model-midflight.txt"),
        "--standard-series",
        *std,
        "--fly-series",
        *fly,
        "--series-interval",
        "10",
        "--format",
        "table",
    ).stdout
    assert f"- {lim['text']}" in table
    base = pages("base", 500, 4000)
    with_base = _json(
        str(FIXTURES / "real-cpu-draft-model-midflight.txt"),
        "--standard-series",
        *std,
        "--fly-series",
        *fly,
        "--baseline-series",
        *base,
        "--series-interval",
        "10",
    )["speculation_limit"]
    against_base, against_std = with_base["comparisons"]
    assert against_base["reference"] == "baseline"
    assert against_base["running"] == pytest.approx(8 ** (math.log(1.6) / math.log(1.6 / 0.7)))
    assert against_std == std_cmp
    assert with_base["text"] == f"{against_base['text']}. {std_cmp['text']}"
    assert with_base["text"].startswith("FLy vs no speculation: stops paying from about 3 running")
    # without the series: null; one series alone or no interval: exit 2, one line
    assert _json(str(FIXTURES / "real-cpu-draft-model-midflight.txt"))["speculation_limit"] is None
    bad = _advise(
        str(FIXTURES / "real-cpu-draft-model-midflight.txt"), "--fly-series", *fly, check=False
    )
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        "specwatch advise: --standard-series and --fly-series go together"
    )


def test_sglang_page_says_what_it_can_and_cannot_tell(capsys: pytest.CaptureFixture[str]) -> None:
    """An SGLang 0.5.23 EAGLE3 TP=2 page: τ 2.8 = 481600 / 172000 generated tokens per verify
    call, α (2.8 − 1) / (4 − 1) = 0.6 at N = 4 (K 3), 32 running (one rank, not 64): about
    32 × 2.8 = 89.6 tokens emitted and 32 × 4 = 128 verified per step; with
    --max-num-seqs 64 read as max_running_requests, 256 verified per step. No row per K: the
    page has no per-position acceptance, and the advice says so."""
    page = REPO / "tests/fixtures/sglang/sglang-0.5.23-eagle3-tp2-default.metrics"
    assert cli_main(["advise", str(page), "--max-num-seqs", "64", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["serving_engine"] == "sglang"
    assert doc["mean_acceptance_length"] == pytest.approx(481600 / 172000)
    assert doc["acceptance_rate"] == pytest.approx(0.6)
    assert (doc["num_speculative_tokens"], doc["concurrency"], doc["by_k"]) == (3, 32.0, [])
    assert doc["advice"] == [
        "τ 2.80 tokens per verify step, α 0.600, at N = 4 draft tokens per verify step (K = 3)",
        "at 32 running requests: about 90 tokens emitted and 128 verified per step",
        "max_running_requests 64: up to 256 tokens verified per step (SGLang's rule: N per "
        "running request, no token-budget cap on drafts)",
        SGLANG_CANNOT,
    ]
    assert cli_main(["advise", str(page), "--format", "table"]) == 0
    table = capsys.readouterr().out
    assert "no per-position acceptance" in table
    assert "tau" not in table.splitlines()[1]  # no K table header


def _running_page(tmp_path: Path, running: float) -> str:
    """The ngram capture with ``running`` requests on its running gauge, and as if every step
    had drafted: generated tokens = drafts + accepted = 488 + 184 = 672 (coverage 1), so the
    budget arithmetic is τ's alone."""
    text = (FIXTURES / "real-cpu-ngram.txt").read_text(encoding="utf-8")
    old = 'vllm:num_requests_running{engine="0",model_name="tiny"} 0.0'
    gen = 'vllm:generation_tokens_total{engine="0",model_name="tiny"} 2656.0'
    assert old in text
    assert gen in text
    path = tmp_path / f"running-{running:g}.txt"
    text = text.replace(gen, 'vllm:generation_tokens_total{engine="0",model_name="tiny"} 672.0')
    path.write_text(
        text.replace(old, f'vllm:num_requests_running{{engine="0",model_name="tiny"}} {running}'),
        encoding="utf-8",
    )
    return str(path)


def test_budget_gain_quoted_at_the_observed_concurrency_and_at_max_num_seqs(
    tmp_path: Path,
) -> None:
    """ngram (S = 0), K = 4, τ = 1 + 184/488 = 1.37705, N = 256, B = 400: D_full = 400 // 5 = 80,
    every other running request gets 1 token. The page shows 100 running. By hand, now: 80·τ +
    20 = 130.16 tokens per step; with the full budget 256·5 = 1280 all 100 get full drafts:
    100·τ = 137.70, +5.8 %. At max_num_seqs: 80·τ + 176 = 286.16 against 256·τ = 352.52,
    +23.2 %. Both are quoted and labelled; with 80 running (all already in full) the gain now
    is +0.0 % and the line says the budget pays only under more load."""
    limits = ("--max-num-seqs", "256", "--max-num-batched-tokens", "400", "--method", "ngram")
    doc = _json(_running_page(tmp_path, 100), *limits)
    assert doc["concurrency"] == 100
    k4 = doc["by_k"][3]
    tau = 1 + 184 / 488
    assert k4["expected_tokens_per_step"] == pytest.approx(80 * tau + 20)
    assert k4["expected_tokens_per_step_at_max_num_seqs"] == pytest.approx(80 * tau + 176)
    line = next(a for a in doc["advice"] if a.startswith("a larger budget"))
    assert line.startswith("a larger budget should give more throughput: ")
    assert "max_num_batched_tokens=1280 (now 400)" in line
    assert "at the 100 running requests now: +5.8 % (137.7 vs 130.2 tokens per step)" in line
    assert "at max_num_seqs=256: +23.2 % (352.5 vs 286.2 tokens per step)" in line
    table = _advise(_running_page(tmp_path, 100), *limits, "--format", "table").stdout
    assert "at the 100 running requests now: +5.8 %" in table
    light = _json(_running_page(tmp_path, 80), *limits)
    line = next(a for a in light["advice"] if a.startswith("a larger budget"))
    assert line.startswith("a larger budget pays only under more load: ")
    assert "at the 80 running requests now: +0.0 %" in line
    assert "at max_num_seqs=256: +23.2 %" in line
    planned = _json(_running_page(tmp_path, 100), *limits, "--running", "50")
    line = next(a for a in planned["advice"] if a.startswith("a larger budget"))
    assert "at the planned 50 running requests (--running): +0.0 %" in line


def test_all_k_tie_goes_to_the_smallest_k_through_the_cli() -> None:
    """The draft-model pair (τ = 1 + 33/2603 for every K; 2603 of the 2656 − 33 = 2623 request
    steps drafted, so a request emits 1 + (2603/2623)(33/2603) = 1 + 33/2623 tokens a step) with
    N = 256 and a budget of 8192 that serves all 256 requests with full drafts at every K: each
    K gives 256 · 1.0125810 = 259.2 tokens per step, so no K pays and the smallest, K=1, is
    named (not K=4)."""
    doc = _json(
        str(FIXTURES / "real-cpu-draft-model-midflight.txt"),
        str(FIXTURES / "real-cpu-draft-model.txt"),
        "--max-num-seqs", "256", "--max-num-batched-tokens", "8192", "--method", "draft_model",
    )  # fmt: skip
    toks = [r["expected_tokens_per_step"] for r in doc["by_k"]]
    assert toks == pytest.approx([256 * (1 + 33 / 2623)] * 4)
    assert doc["advice"][0] == (
        "no K pays: every K from 1 to 4 gives within 2 % of the best 259.2 expected tokens per "
        "step (K=4: 259.2), so K=1 is enough; a larger K costs drafter compute this model "
        "leaves out."
    )


def test_ties_within_two_percent_go_to_the_smallest_k() -> None:
    """Hand-worked, tolerance 2 %: tokens per step 100, 101.5, 103 (K=3 configured): the best
    is 103, the floor 103 / 1.02 = 100.98, so K=2 is the smallest within it and K=3 does not
    beat it by 2 %: "no K pays", K=2. Tokens 108, 110, 100: floor 110 / 1.02 = 107.84, so K=1
    (108) is named, +8.0 % over K=3's 100."""

    def rows(*toks: float) -> list[KRow]:
        return [
            KRow(k=i, mean_acceptance_length=1.5, served_full_requests=64,
                 expected_tokens_per_step=t)
            for i, t in enumerate(toks, 1)
        ]  # fmt: skip

    tie = advice(rows(100.0, 101.5, 103.0), drafts=1000, configured_k=3)
    assert tie[0].startswith("no K pays: every K from 2 to 3 gives within 2 % of the best 103.0")
    assert "so K=2 is enough" in tie[0]
    win = advice(rows(108.0, 110.0, 100.0), drafts=1000, configured_k=3)
    assert win[0].startswith(
        "K=1 should give more throughput than K=3: 108.0 vs 100.0 expected tokens per step (+8.0%)"
    )
