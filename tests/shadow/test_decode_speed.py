"""Decode speed per arm from streamed replays, over real HTTP with two simulators (real time,
so a reply's engine steps arrive in separate reads).

Replies that carry no ``usage`` (the ``stream_usage_ignored`` fault: a server that ignores
``stream_options.include_usage``): completion tokens are counted by the arm's own
``POST /tokenize`` over the generated text, never by SSE chunks; a failed count leaves the
pair's decode speed unknown and is counted with its reason. The simulator's tokenizer gives
one token per whitespace-separated word (plus BOS, which ``add_special_tokens: false`` leaves
out), so the count of a text is ``len(text.split())``.

The decode speed's interval is the same on ``/metrics``, ``/api/v1/snapshot`` and the report.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from scipy.stats import norm

from specwatch.__main__ import main
from specwatch.shadow.ledger.rows import LedgerRow
from specwatch.simulate.config import Role, SimConfig
from specwatch.simulate.launcher import SimulatorHandle, start_simulator
from tests.e2e.shadow_harness import Sidecar, read_rows, settings_for, sidecar, until

BODY = {"prompt": "count the words", "max_tokens": 24, "temperature": 0}


@asynccontextmanager
async def _arms(
    *, usage: bool = False, **faults: dict[str, Any]
) -> AsyncIterator[dict[str, SimulatorHandle]]:
    """Standard and FLy simulators in real time, ignoring ``include_usage`` unless ``usage``;
    ``faults[name]`` patched into that one."""
    sims = {
        "standard": await start_simulator(SimConfig(role=Role.STANDARD, time_scale=1.0)),
        "fly": await start_simulator(SimConfig(role=Role.FLY, time_scale=1.0)),
    }
    try:
        async with aiohttp.ClientSession() as client:
            for name, sim in sims.items():
                patch = {"stream_usage_ignored": not usage} | faults.get(name, {})
                async with client.post(sim.url + "/admin/faults", json=patch) as r:
                    assert r.status == 200, await r.text()
        yield sims
    finally:
        for s in sims.values():
            await s.stop()


async def _one_pair(sc: Sidecar) -> None:
    async with sc.client.post(sc.mirror_url + "/v1/completions", json=BODY) as r:
        assert r.status == 202, await r.text()
    await until(lambda: sum(sc.component.statistics.counters.by_status().values()) >= 1, limit=20)


def _decode_tps(tokens: int, first: float | None, last: float | None) -> float:
    assert first is not None
    assert last is not None
    assert last > first
    return (tokens - 1) / (last - first)


async def test_reply_without_usage_is_counted_by_the_arms_tokenizer(tmp_path: Path) -> None:
    """Neither arm sends usage; each reply's tokens are its words (the simulator's tokenizer),
    and the decode speed per arm is (words − 1) ÷ (last − first output time)."""
    ledger = tmp_path / "ledger.sqlite"
    async with _arms() as sims:
        settings = settings_for(
            sims, ledger, modes=["mirror"], stream_arms=["standard", "fly"], store_text=True
        )
        async with sidecar(settings) as sc:
            await _one_pair(sc)
            stats = await sc.component.refresh(flush=True)
            pipe = sc.component.pipeline
            assert pipe is not None
            assert dict(pipe.replayer.token_count_failures) == {}
    (row,) = await read_rows(ledger)
    assert (row.status, row.reason) == ("paired", None)
    words = _words(row)
    assert words[0] >= 2
    assert words[1] >= 2
    assert (row.standard_tokens, row.fly_tokens) == words
    decision = {r.category: r for r in stats.decisions}["default"]
    assert decision.decode_pairs == 1
    s_tps = _decode_tps(words[0], row.standard_first_token_seconds, row.standard_last_token_seconds)
    f_tps = _decode_tps(words[1], row.fly_first_token_seconds, row.fly_last_token_seconds)
    assert decision.standard_decode_tokens_per_second == pytest.approx(s_tps, rel=1e-6)
    assert decision.fly_decode_tokens_per_second == pytest.approx(f_tps, rel=1e-6)


def _words(row: LedgerRow) -> tuple[int, int]:
    assert row.standard_text is not None
    assert row.fly_text is not None
    return len(row.standard_text.split()), len(row.fly_text.split())


async def test_a_failed_count_leaves_the_decode_speed_unknown(tmp_path: Path) -> None:
    """FLy's /tokenize answers 500: FLy's tokens stay unknown, the pair has no decode speed
    (not a chunk count), and the failure is counted by arm and reason on /metrics."""
    ledger = tmp_path / "ledger.sqlite"
    async with _arms(fly={"tokenize_error": True}) as sims:
        settings = settings_for(
            sims, ledger, modes=["mirror"], stream_arms=["standard", "fly"], store_text=True
        )
        async with sidecar(settings) as sc:
            await _one_pair(sc)
            stats = await sc.component.refresh(flush=True)
            metrics = await sc.metrics()
    (row,) = await read_rows(ledger)
    assert row.status == "paired"
    assert row.standard_tokens == _words(row)[0]
    assert row.fly_tokens is None
    decision = {r.category: r for r in stats.decisions}["default"]
    assert decision.decode_pairs == 0
    assert decision.standard_decode_tokens_per_second is None
    assert decision.fly_decode_tokens_per_second is None
    key = ("specwatch_shadow_token_count_failures_total",
           frozenset({("arm", "fly"), ("reason", "http_500")}))  # fmt: skip
    assert metrics[key] == 1.0


def _delta_interval(tokens: list[int], seconds: list[float]) -> tuple[float, float]:
    """The 95 % interval of ΣT ÷ ΣS over pairs, worked out from the per-pair values: the delta
    method's influence of pair i is (Tᵢ − R·Sᵢ) ÷ S̄, the standard error √(Σ influence² ÷
    ((n − 1)·n)), the bounds R ∓ z₀.₉₇₅ · se (scipy's normal quantile)."""
    t, s = np.asarray(tokens, dtype=float), np.asarray(seconds, dtype=float)
    n = len(t)
    r = t.sum() / s.sum()
    influence = (t - r * s) / s.mean()
    se = math.sqrt(float((influence**2).sum()) / ((n - 1) * n))
    z = float(norm.ppf(0.975))
    return r - z * se, r + z * se


async def test_decode_interval_is_the_same_on_metrics_snapshot_and_report(
    tmp_path: Path,
) -> None:
    """Four streamed pairs of different lengths (usage sent): each arm's decode tokens/s
    interval on /metrics, in /api/v1/snapshot's decision table and in the report equals the
    delta-method interval worked out here from the ledger's per-pair tokens and times."""
    ledger = tmp_path / "ledger.sqlite"
    async with _arms(usage=True) as sims:
        settings = settings_for(sims, ledger, modes=["mirror"], stream_arms=["standard", "fly"])
        async with sidecar(settings) as sc:
            for i, max_tokens in enumerate((12, 20, 28, 36)):
                body = {"prompt": f"request {i}", "max_tokens": max_tokens, "temperature": 0}
                async with sc.client.post(sc.mirror_url + "/v1/completions", json=body) as r:
                    assert r.status == 202, await r.text()
            counters = sc.component.statistics.counters
            await until(lambda: sum(counters.by_status().values()) >= 4, limit=30)
            await sc.component.refresh(flush=True)
            metrics = await sc.metrics()
            async with sc.client.get(sc.url + "/api/v1/snapshot") as r:
                snapshot = json.loads(await r.text())
    rows = await read_rows(ledger)
    assert [row.status for row in rows] == ["paired"] * 4
    page = await asyncio.to_thread(_report_page, ledger, tmp_path)
    (decision,) = [d for d in snapshot["shadow"]["decisions"] if d["category"] == "default"]
    assert decision["decode_pairs"] == 4
    span = re.search(r"<span data-field='decode'[^>]*>", page)
    assert span is not None
    rel_se: list[float] = []
    speeds: list[float] = []
    for arm in ("standard", "fly"):
        tokens = [(getattr(row, f"{arm}_tokens") or 0) - 1 for row in rows]
        seconds = [
            getattr(row, f"{arm}_last_token_seconds") - getattr(row, f"{arm}_first_token_seconds")
            for row in rows
        ]
        lo, hi = _delta_interval(tokens, seconds)
        speed = sum(tokens) / sum(seconds)
        assert 0 < lo < speed < hi
        speeds.append(speed)
        rel_se.append((hi - lo) / 2 / float(norm.ppf(0.975)) / speed)
        labels = frozenset({("category", "default")})
        on_metrics = (
            metrics[(f"specwatch_decision_{arm}_decode_ci_lower_tokens_per_second", labels)],
            metrics[(f"specwatch_decision_{arm}_decode_ci_upper_tokens_per_second", labels)],
        )
        in_snapshot = (decision[f"{arm}_decode_ci_lower"], decision[f"{arm}_decode_ci_upper"])
        lower = re.search(rf"data-{arm}-lower='([^']*)'", span[0])
        upper = re.search(rf"data-{arm}-upper='([^']*)'", span[0])
        assert lower is not None
        assert upper is not None
        in_report = (float(lower[1]), float(upper[1]))
        # the report sums the rows as floats: equal to the per-pair computation but for float
        # rounding; the live statistics keep the sums in fixed point (1e-9 of a second, of a
        # token-second and of a second squared), and the residual sum ΣT² − 2RΣTS + R²ΣS²
        # weighs the rounding of ΣS² by R² (about 4e5 here): 1e-4 of the bounds covers it
        assert in_report == pytest.approx((lo, hi), rel=1e-9)
        assert on_metrics == in_snapshot
        assert on_metrics == pytest.approx((lo, hi), rel=1e-4)
    # the verdict's decode ratio FLy / standard with its interval: exp(log ratio ∓ z·√(Σ rel
    # se²)), the arms' relative standard errors (half-width ÷ z ÷ speed) combined
    ratio = speeds[1] / speeds[0]
    half = float(norm.ppf(0.975)) * math.hypot(*rel_se)
    shown = [round(100 * (x - 1)) for x in (ratio, ratio * math.exp(-half), ratio * math.exp(half))]
    pct = [f"{p:+d} %" if p else "±0 %" for p in shown]
    want = f"decode tokens/s {pct[0]} (95 % interval {pct[1]} to {pct[2]})"
    assert want in snapshot["verdict"]
    assert want in page


def _report_page(ledger: Path, tmp_path: Path) -> str:
    """``specwatch report`` on the ledger, as a user runs it: the page's HTML."""
    out = tmp_path / "report"
    assert main(["report", "--ledger", str(ledger), "--out", str(out)]) == 0
    return (out / "index.html").read_text(encoding="utf-8")
