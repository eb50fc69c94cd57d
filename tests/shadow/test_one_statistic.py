"""One statistic under one name: the same ordered pairs fed to `paired-test` (a JSONL file),
`first_alarms`, a running sidecar (its real /api/v1/snapshot and /metrics, before and after a
restart), the report, the decision table and the fleet view of that one sidecar give the same
no-net-loss e-value, equal to the formulas worked pair by pair; and the same "about N more
pairs" everywhere."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from specwatch.__main__ import main
from specwatch.core.config import OVERALL, SINCE_START
from specwatch.server.app import build_app
from specwatch.server.wiring import shadow_components
from specwatch.settings import Settings
from specwatch.shadow.settings import PairedSettings
from specwatch.shadow.stats import first_alarms
from specwatch.shadow.stats.power import pairs_to_decide
from specwatch.shadow.verdict import more_pairs_needed, verdict_from_summary
from specwatch.tools.fleet.stats import fleet_stats
from tests.shadow.stats.eprocess_reference import count_form, reference
from tests.tools.report.test_report import T0, report_of, row, write_ledger


def _outcomes() -> list[int]:
    """300 harmless pairs at 4 % discordance, then 300 at 30 % discordance where FLy loses
    70 % of the discordant pairs (a loss the bets must follow the discordance to see)."""
    rng = np.random.default_rng(22)
    disc = np.repeat([0.04, 0.3], 300)
    lost = np.repeat([0.5, 0.7], 300)
    u, v = rng.random(600), rng.random(600)
    return np.where(u < disc, np.where(v < lost, 1, -1), 0).tolist()  # type: ignore[no-any-return]


def _pairs(outcomes: list[int]) -> list[tuple[bool, bool]]:
    """(standard right, FLy right) per outcome; agreeing pairs alternate both right / both wrong."""
    out = []
    for i, x in enumerate(outcomes):
        out.append((True, False) if x == 1 else (False, True) if x == -1 else (i % 2 == 0,) * 2)
    return out


def _paired_test(tmp_path: Path, pairs: list[tuple[bool, bool]], capsys: Any) -> dict[str, Any]:
    base, cand = tmp_path / "base.jsonl", tmp_path / "cand.jsonl"
    base.write_text(
        "".join(json.dumps({"id": i, "correct": s}) + "\n" for i, (s, _) in enumerate(pairs))
    )
    cand.write_text(
        "".join(json.dumps({"id": i, "correct": f}) + "\n" for i, (_, f) in enumerate(pairs))
    )
    capsys.readouterr()
    assert main(["paired-test", str(base), str(cand), "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def _settings(ledger: Path) -> Settings:
    return Settings.model_validate(
        {
            "shadow": {
                "enabled": True,
                "modes": ["mirror"],
                "mirror_listen_host": "127.0.0.1",
                "mirror_listen_port": 0,
                "standard": {"url": "http://127.0.0.1:9"},
                "fly": {"url": "http://127.0.0.1:9"},
            },
            "ledger": {"path": str(ledger)},
            "paired": {"refresh_seconds": 0.05},
        }
    )


async def _sidecar(ledger: Path) -> tuple[dict[str, Any], str]:
    """Start a sidecar on ``ledger`` (it replays the ledger in time order), wait for its first
    statistics over every labelled pair, and read /api/v1/snapshot and /metrics over HTTP."""
    settings = _settings(ledger)
    app = build_app(settings, scrape=False, components=shadow_components(settings))
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        doc: dict[str, Any] = {}

        async def read() -> None:
            doc.clear()
            doc.update(json.loads(await (await client.get("/api/v1/snapshot")).text()))

        async def ready() -> bool:
            await read()
            shadow = doc.get("shadow") or {}
            since = (shadow.get("windows") or {}).get(SINCE_START, {})
            return bool(since.get(OVERALL, {}).get("n") == 600)

        for _ in range(3000):
            if await ready():
                break
            await asyncio.sleep(0.02)
        else:
            raise TimeoutError("the sidecar never published its statistics")
        metrics = await (await client.get("/metrics")).text()
    return doc, metrics


def _metric_rows(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Samples of ``name`` as Prometheus would return them for the fleet view (the sidecar's
    identity and model labels added)."""
    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                out.append(({**s.labels, "instance": "s1:9464", "model_name": "m"}, s.value))
    return out


def test_the_same_ordered_pairs_give_the_same_e_value_everywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """600 ordered pairs, the discordance jumping from 4 % to 30 % with a loss: every surface's
    since-start no-net-loss e-value equals the plain-Python fold of the formulas (to 1e-9) and
    each other (to 1e-12); the sidecar shows the same value after a restart (it replays the
    ledger in time order); ``first_alarms`` and paired-test's first crossing agree with the
    reference path; every "about N more pairs" is the one function's number."""
    outcomes = _outcomes()
    pairs = _pairs(outcomes)
    e_ref, _ = reference(outcomes)
    first_ref = next((i + 1 for i, e in enumerate(e_ref) if e >= 20.0), None)

    cli = _paired_test(tmp_path, pairs, capsys)
    alarms = first_alarms(outcomes, PairedSettings())
    report = report_of(
        tmp_path / "report.sqlite", [row(T0 + i, "math", s, f) for i, (s, f) in enumerate(pairs)]
    )
    rep = report.stats.windows[SINCE_START][OVERALL]
    decision = next(r for r in report.stats.decisions if r.category == OVERALL)

    ledger = tmp_path / "ledger.sqlite"
    asyncio.run(write_ledger(ledger, [row(T0 + i, "math", s, f) for i, (s, f) in enumerate(pairs)]))
    snap, metrics = asyncio.run(_sidecar(ledger))
    again, _ = asyncio.run(_sidecar(ledger))  # a restart: a fresh process on the same ledger
    live = snap["shadow"]["windows"][SINCE_START][OVERALL]
    fleet = fleet_stats(
        _metric_rows(metrics, "specwatch_ledger_pairs"),
        (),
        [
            r
            for r in _metric_rows(metrics, "specwatch_paired_e_value")
            if r[0]["hypothesis"] == "no_net_loss"
            and r[0]["window"] == SINCE_START
            and r[0]["category"] == OVERALL
        ],
        now=1.0,
    ).models["m"]

    e_values = {
        "paired-test": cli["e_value"],
        "report": rep.e_value,
        "report path": math.exp(report.evalue.log_e_no_net_loss[-1]),
        "decision table": decision.e_value,
        "sidecar snapshot": live["e_value"],
        "sidecar decision table": next(
            d["e_value"] for d in snap["shadow"]["decisions"] if d["category"] == OVERALL
        ),
        "sidecar after restart": again["shadow"]["windows"][SINCE_START][OVERALL]["e_value"],
        "fleet": fleet.summaries[OVERALL].e_value,
        "fleet mean": fleet.net_loss_e_mean,
    }
    assert e_values["paired-test"] == pytest.approx(e_ref[-1], rel=1e-9)
    for where, e in e_values.items():
        assert e == pytest.approx(e_values["paired-test"], rel=1e-12), where
    assert cli["first_crossing"]["no_net_loss"] == alarms["no_net_loss"] == first_ref
    assert report.first_alarm[OVERALL] == first_ref
    assert first_ref is not None
    assert first_ref > 300  # the loss starts at pair 301
    # the e-value is a function of the counts: the same number from the counts alone
    lost, gained = outcomes.count(1), outcomes.count(-1)
    assert count_form(lost, gained) == pytest.approx(e_ref[-1], rel=1e-9)

    n = len(outcomes)
    expected_more = pairs_to_decide((lost - gained) / n, (lost + gained) / n, n, 0.01, 0.05)
    summary = report.stats.windows[SINCE_START][OVERALL]
    more = {
        "paired-test": cli["pairs_more"],
        "fleet": fleet.summaries[OVERALL].questions_still_needed,
        "sidecar": live["questions_still_needed"],
        "report": rep.questions_still_needed,
        "verdict": more_pairs_needed(verdict_from_summary(summary, alpha=0.05, margin=0.01)),
    }
    assert set(more.values()) == {expected_more}, more
