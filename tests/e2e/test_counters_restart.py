"""specwatch's pair counters over a restart with ledger pruning, read by the fleet rules.

specwatch runs for 45 minutes (2 lost and 1 gained pair a minute), restarts on the same ledger
after retention has pruned it to its newest 30 rows, and runs 45 more minutes. Its
``/metrics`` exposition is read once a minute, and the values become promtool input series for
the mixin's fleet rules. Worked out by hand: over the hour ending at minute 90 there were
60 x 2 = 120 lost and 60 gained pairs, so ``increase`` must give 120 and 60 and McNemar's z
(120 - 60) / sqrt(180) = 4.4721. Before the fix the counters restarted at the retained rows'
totals (20 lost, 10 gained: the 30 newest rows at 2:1), which Prometheus read as a reset and
counted again as new pairs (this test then fails).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from specwatch.export.prometheus import ShadowCollector
from specwatch.shadow.compare import PairOutcome, compare
from specwatch.shadow.component import ShadowComponent
from specwatch.shadow.pipeline import Runtime
from specwatch.shadow.settings import (
    ArmEndpoint,
    LedgerSettings,
    PairedSettings,
    ShadowSettings,
)
from specwatch.shadow.values import Arm, ArmResult, ReplayPair, ShadowRequest, Source
from tests.fakes import REPO, FakeClocks

pytestmark = pytest.mark.promtool

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
RULES = REPO / "deploy/mixin/specwatch.rules.yaml"


def _pair(t: float, n: int, std_ok: bool, fly_ok: bool) -> PairOutcome:
    """One labelled canary pair in category ``math``."""
    req = ShadowRequest("/v1/completions", {}, f"h{n}", t, Source.CANARY, "math", "q", "yes", None)
    return compare(
        ReplayPair(
            req,
            ArmResult(Arm.STANDARD, True, 0.1, text="yes" if std_ok else "no"),
            ArmResult(Arm.FLY, True, 0.1, text="yes" if fly_ok else "no"),
            None,
        )
    )


def _component(path: Path, clocks: FakeClocks) -> ShadowComponent:
    arm = ArmEndpoint(url="http://127.0.0.1:9")  # never called: nothing is sampled
    return ShadowComponent(
        ShadowSettings(
            enabled=True, standard=arm, fly=arm, sample_probability=0.0, mirror_listen_port=0
        ),
        PairedSettings(),
        LedgerSettings(path=str(path), max_rows=30, max_age_seconds=None),
        runtime=Runtime(wall_clock=clocks.wall, mono_clock=clocks.mono),
    )


def _counter(comp: ShadowComponent, outcome: str) -> float:
    """``specwatch_shadow_pairs_total{category="math",arm="fly",outcome}`` as exported."""
    reg = CollectorRegistry(auto_describe=True)
    reg.register(ShadowCollector(comp.latest_stats))
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            want = {"category": "math", "arm": "fly", "outcome": outcome}
            if s.name == "specwatch_shadow_pairs_total" and s.labels == want:
                return float(s.value)
    return 0.0


async def _run(
    path: Path, clocks: FakeClocks, minutes: int, start: int, series: dict[str, list[float]]
) -> int:
    """One specwatch process: ``minutes`` minutes of 2 lost + 1 gained pair each, /metrics read
    at the end of each minute. Returns the next pair number."""
    comp = _component(path, clocks)
    n = start
    async with comp.running():
        comp.statistics.categories("math")  # admitted where the pipeline admits it, at sampling
        for _ in range(minutes):
            for std_ok, fly_ok in ((True, False), (True, False), (False, True)):
                comp.statistics.take_outcome(_pair(clocks.wall(), n, std_ok, fly_ok))
                n += 1
            clocks.advance(60)
            await comp.refresh(flush=True)
            assert comp.ledger is not None
            await comp.ledger.prune()
            for outcome in ("lost", "gained"):
                series[outcome].append(_counter(comp, outcome))
    return n


async def test_fleet_rules_see_no_false_increase_over_a_restart_with_pruning(
    tmp_path: Path,
) -> None:
    """Counters start at 0 with the new process (a true reset); the ledger's retained totals
    are a gauge: the fleet rules' 1h increase equals the pairs that happened (120 lost,
    60 gained), and the pruned ledger holds 30 rows (20 lost, 10 gained)."""
    clocks = FakeClocks()
    path = tmp_path / "ledger.sqlite"
    series: dict[str, list[float]] = {"lost": [], "gained": []}
    n = await _run(path, clocks, 45, 0, series)
    assert series["lost"][:2] == [2, 4]
    assert series["lost"][-1] == 90
    await _run(path, clocks, 45, n, series)
    assert series["lost"][44:47] == [90, 2, 4]  # restart: from 0, never from the ledger's 20
    comp = _component(path, clocks)
    async with comp.running():
        stats = await comp.refresh()
    assert stats.ledger_pairs[("math", "fly", "lost")] == 20
    assert stats.ledger_pairs[("math", "fly", "gained")] == 10

    base = 'job="specwatch",instance="sw-a:9464",category="math",arm="fly"'
    values = {k: "0 " + " ".join(f"{v:g}" for v in vals) for k, vals in series.items()}
    doc = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {
                        "series": f'specwatch_shadow_pairs_total{{{base},outcome="{k}"}}',
                        "values": v,
                    }
                    for k, v in values.items()
                ],
                "promql_expr_test": [
                    {
                        "expr": "job_arm_outcome:specwatch_shadow_pairs:increase1h",
                        "eval_time": "90m",
                        "exp_samples": [
                            {
                                "labels": "job_arm_outcome:specwatch_shadow_pairs:increase1h"
                                f'{{job="specwatch",arm="fly",outcome="{k}"}}',
                                "value": want,
                            }
                            for k, want in (("gained", 60), ("lost", 120))
                        ],
                    },
                    {
                        "expr": "round(job_arm:specwatch_shadow_mcnemar_z:increase1h, 0.0001)",
                        "eval_time": "90m",
                        "exp_samples": [{"labels": '{job="specwatch",arm="fly"}', "value": 4.4721}],
                    },
                ],
            }
        ],
    }
    test_file = tmp_path / "restart_test.yaml"
    test_file.write_text(yaml.safe_dump(doc), encoding="utf-8")
    done = await asyncio.to_thread(
        subprocess.run,
        [PROMTOOL, "test", "rules", str(test_file)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
