"""The shadow component end to end over real HTTP: mirrored requests replayed to four fake
OpenAI arms (standard, FLy, noise, baseline) on 127.0.0.1, stored in a real SQLite ledger, and
turned into the decision table, the lossless check and the flips by load band.

The arms answer fixed texts, so every count below follows from the traffic sent:

- standard ``"alpha beta"`` accepting 1 and 1 of 4 drafts in two verify steps (τ 1 + 2/2 = 2.0,
  α 2/8), FLy ``"alpha beta"`` accepting 3 and 2 (τ 1 + 5/2 = 3.5, α 5/8): FLy always agrees,
  τ gain 1.5, acceptance gain 3/8;
- baseline (no speculation) ``"alpha gamma"`` and noise ``"alpha gamma"``: on every request the
  standard arm differs from the baseline and the noise arm does not, so each greedy request is
  a standard-only flip of the lossless check, and the noise arm differs from the standard arm.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from specwatch.alerts.rules import candidates
from specwatch.alerts.settings import DetectSettings
from specwatch.export.json import shadow_stats_json
from specwatch.export.prometheus import ShadowCollector
from specwatch.observe.values import ObserveView
from specwatch.shadow.component import ShadowComponent
from specwatch.shadow.ledger.ledger import Ledger
from specwatch.shadow.ledger.rows import LedgerRow
from specwatch.shadow.live import ShadowStatistics, ledger_inputs
from specwatch.shadow.pipeline import Runtime
from specwatch.shadow.sample import ArmLoad
from specwatch.shadow.settings import LedgerSettings, PairedSettings, ShadowSettings
from tests.e2e.shadow_harness import until
from tests.fakes import FakeWallClock
from tests.fakes.arm import FakeArm, serve_arm
from tests.shadow.test_summary import NOW, PAIRED, varied_rows


@asynccontextmanager
async def _arms(arms: Mapping[str, FakeArm]) -> AsyncIterator[dict[str, str]]:
    async with AsyncExitStack() as stack:
        yield {name: await stack.enter_async_context(serve_arm(a)) for name, a in arms.items()}


async def _run(tmp_path: Path) -> tuple[Any, dict[tuple[str, frozenset[tuple[str, str]]], float]]:
    """Send 12 greedy (category t0) and 4 temperature-1 (t1) requests, the first 8 while the
    arms report 3 running requests and the last 8 while they report 40."""
    arms = {
        "standard": FakeArm(text="alpha beta", spec_steps=[1, 1]),
        "fly": FakeArm(text="alpha beta", spec_steps=[3, 2]),
        "noise": FakeArm(text="alpha gamma"),
        "baseline": FakeArm(text="alpha gamma"),
    }
    running = {"now": 3.0}

    def loads() -> dict[str, ArmLoad]:
        now = time.monotonic()  # the sampler's clock: the reading is always fresh
        load = ArmLoad(running=running["now"], waiting=0.0, max_num_seqs=None, observed_at=now)
        return {"standard": load, "fly": load}

    async with _arms(arms) as urls:
        shadow = ShadowSettings.model_validate(
            {
                "enabled": True,
                "modes": ["mirror"],
                "sample_probability": 1.0,
                "max_shadow_rps": 1000.0,
                "max_in_flight": 1,
                "pause_on_waiting": False,
                "mirror_listen_host": "127.0.0.1",
                "mirror_listen_port": 0,
                "standard": {"url": urls["standard"]},
                "fly": {"url": urls["fly"]},
                "noise": {"url": urls["noise"]},
                "noise_kind": "baseline",
                "baseline": {"url": urls["baseline"]},
            }
        )
        paired = PairedSettings(windows=("1h",), refresh_seconds=3600.0)
        ledger = LedgerSettings(path=str(tmp_path / "ledger.sqlite"))
        comp = ShadowComponent(shadow, paired, ledger, load_state=loads)
        async with comp.running(), aiohttp.ClientSession() as client:
            url = f"http://127.0.0.1:{comp.mirror_port}/v1/completions"
            await until(lambda: comp.pipeline is not None and comp._started)
            for i in range(16):
                if i == 8:
                    await until(lambda: sum(comp.statistics.counters.by_status().values()) == 8)
                    running["now"] = 40.0
                greedy = i < 6 or 8 <= i < 14
                body = {
                    "prompt": f"question {i}",
                    "max_tokens": 8,
                    "temperature": 0 if greedy else 1.0,
                }
                headers = {"X-Specwatch-Category": "t0" if greedy else "t1"}
                async with client.post(url, json=body, headers=headers) as r:
                    assert r.status == 202
            await until(lambda: sum(comp.statistics.counters.by_status().values()) == 16)
            stats = await comp.refresh(flush=True)
    registry = CollectorRegistry()
    registry.register(ShadowCollector(lambda: stats))
    metrics: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            metrics[(s.name, frozenset(s.labels.items()))] = s.value
    return stats, metrics


def _key(name: str, **labels: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return name, frozenset(labels.items())


async def test_baseline_arm_load_bands_and_decisions(tmp_path: Path) -> None:
    """Greedy flips of the standard arm against the baseline fire SpecLosslessFlips with the
    e-value (2^13 - 1)/13; flips split 8/8 into the 0-7 and 32+ bands; the decision table has
    t0, t1 and _all with τ gain 1.5 and "no labelled pairs yet"."""
    stats, m = await _run(tmp_path)
    since = stats.windows["since_start"]["_all"]
    # 12 greedy requests, each a standard-only flip against the baseline; t1 requests not counted
    assert since.lossless_pairs == 12
    assert since.tally.lossless_spec_only == 12
    assert since.tally.lossless_noise_only == 0
    assert since.spec_flip_ratio == 1.0
    assert since.baseline_noise_flip_ratio == 0.0
    assert math.isclose(since.lossless_e_value, (2**13 - 1) / 13, rel_tol=1e-9)
    assert math.isclose(since.lossless_p, 0.5**12, rel_tol=1e-9)
    assert m[_key("specwatch_lossless_pairs", window="since_start", category="_all")] == 12
    assert math.isclose(
        m[_key("specwatch_lossless_e_value", window="since_start", category="_all")],
        8191 / 13,
        rel_tol=1e-9,
    )
    assert (
        m[_key("specwatch_lossless_flip_ratio", window="since_start", category="_all", arm="noise")]
        == 0.0
    )
    alerts = candidates(ObserveView(generated_at=0.0, targets={}), stats, DetectSettings())
    lossless = [a for a in alerts if a.alertname == "SpecLosslessFlips"]
    assert len(lossless) == 1
    assert "in 12 and the noise arm's in 0" in lossless[0].description
    # load bands: 8 pairs at 3 running, 8 at 40; FLy never flips, the noise arm always does
    bands = {b.band: b for b in stats.by_load}
    assert list(bands) == ["0-7", "8-31", "32+"]
    assert (bands["0-7"].pairs, bands["8-31"].pairs, bands["32+"].pairs) == (8, 0, 8)
    assert bands["0-7"].fly_flip_ratio == 0.0
    assert bands["32+"].noise_flip_ratio == 1.0
    assert math.isnan(bands["8-31"].fly_flip_ratio)
    assert m[_key("specwatch_load_band_pairs", band="32+", arm="noise")] == 8
    assert m[_key("specwatch_load_band_flip_ratio", band="0-7", arm="fly")] == 0.0
    # decision table: per category, then _all
    rows = {r.category: r for r in stats.decisions}
    assert list(rows) == ["t0", "t1", "_all"]
    assert (rows["t0"].pairs, rows["t1"].pairs, rows["_all"].pairs) == (12, 4, 16)
    assert rows["t0"].tau_gain == 1.5
    assert rows["t0"].tau_pairs == 12
    assert rows["t0"].acceptance_gain == pytest.approx(3 / 8)
    assert rows["_all"].acceptance_gain == pytest.approx(3 / 8)
    assert rows["t1"].noise_flip_ratio == 1.0
    assert rows["_all"].verdict == "not_decided"
    assert rows["_all"].verdict_text == "not decided: no labelled pairs yet"
    assert rows["t0"].speed_pairs == 12
    assert rows["t0"].throughput_gain_ratio is not None
    assert m[_key("specwatch_decision_tau_gain", category="t0")] == 1.5
    assert m[_key("specwatch_decision_verdict", category="t1", verdict="not_decided")] == 1
    assert m[_key("specwatch_decision_verdict", category="t1", verdict="pays")] == 0
    doc = shadow_stats_json(stats)
    assert [d["category"] for d in doc["decisions"]] == ["t0", "t1", "_all"]
    assert doc["decisions"][0]["verdict_text"] == "not decided: no labelled pairs yet"
    assert [b["band"] for b in doc["by_load"]] == ["0-7", "8-31", "32+"]
    assert doc["by_load"][1]["fly_flip_ratio"] is None


async def test_live_statistics_equal_the_sql_recomputation_through_a_restart(
    tmp_path: Path,
) -> None:
    """A ledger pre-filled with 1,000 varied rows (over 30 hours) is rebuilt when the component
    starts; 500 more rows then go through the ledger's write path (``submit``, as ``consume``
    does). At each step the published statistics equal those built from the full SQL
    recomputation at the same ``now`` (every window, decision table, load bands, row count).
    Ten minutes later with no new row the 15-minute window holds only the rows of its last
    five minutes (times a multiple of the 10-second bucket away from the edges, so both paths
    cut the same rows), again equal to the SQL recomputation."""
    rows = varied_rows(5, 1500)
    path = tmp_path / "ledger.sqlite"
    async with Ledger(path, wall_clock=FakeWallClock(NOW)) as led:
        for r in rows[:1000]:
            led.submit(r)
        await led.flush()
    wall_clock = FakeWallClock(NOW)
    shadow = ShadowSettings.model_validate(
        {
            "enabled": True,
            "modes": ["mirror"],
            "mirror_listen_host": "127.0.0.1",
            "mirror_listen_port": 0,
            "standard": {"url": "http://127.0.0.1:9"},
            "fly": {"url": "http://127.0.0.1:9"},
        }
    )
    comp = ShadowComponent(
        shadow,
        PAIRED,
        LedgerSettings.model_validate({"path": str(path)}),
        runtime=Runtime(wall_clock=wall_clock),
    )

    async def both() -> tuple[dict[str, Any], dict[str, Any]]:
        live = await comp.refresh(flush=True)
        assert comp.ledger is not None
        assert comp.pipeline is not None
        ref = comp.build_stats(
            await ledger_inputs(comp.ledger, PAIRED, wall_clock()),
            wall_clock(),
            comp.pipeline.metrics(),
        )
        return shadow_stats_json(live), shadow_stats_json(ref)

    async with comp.running():
        got, want = await both()
        assert got == want
        assert got["ledger_rows"] == 1000
        ledger = comp.ledger
        assert ledger is not None
        for r in rows[1000:]:
            ledger.submit(r)
        got, want = await both()
        assert got == want
        assert got["ledger_rows"] == 1500
        assert _paired_in_15m(got) == _paired_since(rows, NOW - 900.0)
        wall_clock.t = NOW + 600.0
        got, want = await both()
        assert got == want
        assert _paired_in_15m(got) == _paired_since(rows, NOW - 300.0)
        assert _paired_since(rows, NOW - 300.0) < _paired_since(rows, NOW - 900.0)


def _paired_in_15m(stats_json: dict[str, Any]) -> int:
    tally = stats_json["windows"]["15m"]["_all"]["tally"]
    return int(tally["agree"]) + int(tally["disagree"])


def _paired_since(rows: list[LedgerRow], since: float) -> int:
    """Paired rows with a known agreement at or after ``since``, counted directly."""
    return sum(
        1 for r in rows if r.status == "paired" and r.fly_agrees is not None and r.time >= since
    )


async def test_the_proxy_relays_live_traffic_while_the_statistics_are_rebuilt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In proxy mode the live path comes up before the rebuild from the ledger: with the
    rebuild held back, a completion through the proxy port is answered by the upstream (its
    text), and the copy is replayed once the rebuild ends and the pipeline starts."""
    held = asyncio.Event()
    rebuild = ShadowStatistics.rebuild

    async def slow_rebuild(self: ShadowStatistics, ledger: Ledger, now: float) -> None:
        await held.wait()
        await rebuild(self, ledger, now)

    monkeypatch.setattr(ShadowStatistics, "rebuild", slow_rebuild)
    arms = {"standard": FakeArm(text="alpha beta"), "fly": FakeArm(text="alpha beta")}
    async with _arms(arms) as urls:
        shadow = ShadowSettings.model_validate(
            {
                "enabled": True,
                "modes": ["proxy"],
                "sample_probability": 1.0,
                "pause_on_waiting": False,
                "proxy_listen_host": "127.0.0.1",
                "proxy_listen_port": 0,
                "proxy_upstream": urls["fly"],
                "standard": {"url": urls["standard"]},
                "fly": {"url": urls["fly"]},
            }
        )
        paired = PairedSettings(windows=("1h",), refresh_seconds=3600.0)
        ledger = LedgerSettings(path=str(tmp_path / "ledger.sqlite"))
        comp = ShadowComponent(shadow, paired, ledger)
        async with comp.running(), aiohttp.ClientSession() as client:
            await until(lambda: comp.pipeline is not None and comp.pipeline.proxy_started)
            assert comp.pipeline is not None
            assert comp.pipeline.proxy is not None
            assert not comp._started  # the rebuild is still held back
            url = f"http://127.0.0.1:{comp.pipeline.proxy.port}/v1/completions"
            async with client.post(url, json={"prompt": "q", "max_tokens": 4}) as r:
                assert r.status == 200
                assert (await r.json())["choices"][0]["text"] == "alpha beta"
            assert sum(comp.statistics.counters.by_status().values()) == 0
            held.set()
            await until(lambda: sum(comp.statistics.counters.by_status().values()) == 1)
            assert comp._started
