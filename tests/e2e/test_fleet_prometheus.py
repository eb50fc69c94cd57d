"""``specwatch fleet`` against a real Prometheus scraping three sidecars on simulated pairs: the
fleet numbers equal those computed from the union of the sidecars' ledgers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specwatch.core.config import OVERALL
from specwatch.shadow.ledger.rows import LedgerRow
from specwatch.shadow.summary import summarize
from specwatch.shadow.tally import PairTally, tally_rows
from tests.e2e.shadow_harness import (
    Sidecar,
    canary_done,
    close,
    expected,
    read_rows,
    settings_for,
    sidecar,
    simulators,
    until,
    write_canary,
)
from tests.fakes import free_port
from tests.fakes.prometheus import run_prometheus
from tests.fakes.wait import poll
from tests.shadow.stats.eprocess_reference import count_form
from tests.sidecar_process import run_specwatch

#: (sidecar name, model label, FLy entropy threshold): two sidecars of one model, one of another.
#: Canary items each sidecar replays (the first of the simulator's canary set).
CANARY_ITEMS = 80
SIDECARS = (("a1", "model-a", 0.0), ("a2", "model-a", 0.3), ("b1", "model-b", 0.0))


@contextlib.asynccontextmanager
async def _sidecar_with_pairs(tmp: Path, name: str, threshold: float) -> AsyncIterator[Sidecar]:
    canary = tmp / f"{name}-canary.jsonl"
    write_canary(canary, variants=1, temperature=0.0)
    lines = canary.read_text().splitlines()[::3][:CANARY_ITEMS]  # every category, a short test
    canary.write_text("\n".join(lines) + "\n")
    items = len(lines)
    async with simulators(fly_threshold=threshold) as sims:
        settings = settings_for(
            sims, tmp / f"{name}.sqlite", modes=["canary"], canary_file=str(canary)
        )
        async with sidecar(settings) as sc:
            await until(lambda: canary_done(sc.component, items))
            await sc.component.refresh(flush=True)
            yield sc


def _margin_e(
    m: dict[tuple[str, frozenset[tuple[str, str]]], float], hypothesis: str = "margin"
) -> float:
    key = frozenset(
        {"window": "since_start", "category": OVERALL, "hypothesis": hypothesis}.items()
    )
    return m[("specwatch_paired_e_value", key)]


def _fly_series(m: dict[tuple[str, frozenset[tuple[str, str]]], float]) -> int:
    outcomes = {"both_correct", "lost", "gained", "both_wrong"}
    return sum(
        1
        for (name, labels) in m
        if name == "specwatch_ledger_pairs"
        and ("arm", "fly") in labels
        and dict(labels)["outcome"] in outcomes
    )


@pytest.mark.slow
async def test_fleet_equals_union_of_ledgers(tmp_path: Path) -> None:
    """Per model, the fleet n/lost/gained equal the union of the ledgers, the exact McNemar p
    equals scipy's binomial test on the union, the interval and e-value equal a single
    sidecar's computation on the union (the e-value also from its formula), the margin
    e-values combine the sidecars' own; a scrape job without the model label is skipped and
    counted; ``--listen`` serves the same numbers on /metrics."""
    async with contextlib.AsyncExitStack() as stack:
        cars: dict[str, Sidecar] = {}
        for name, _model, threshold in SIDECARS:
            cars[name] = await stack.enter_async_context(
                _sidecar_with_pairs(tmp_path, name, threshold)
            )
        metrics = {name: await sc.metrics() for name, sc in cars.items()}
        session = await stack.enter_async_context(aiohttp.ClientSession())
        config: dict[str, Any] = {
            "global": {"scrape_interval": "2s", "scrape_timeout": "2s"},
            "scrape_configs": [
                {
                    "job_name": "specwatch",
                    "static_configs": [
                        {
                            "targets": [cars[name].url.removeprefix("http://")],
                            "labels": {"model_name": model, "sidecar": name},
                        }
                        for name, model, _ in SIDECARS
                    ],
                },
                {  # the same b1 sidecar scraped again without the model label
                    "job_name": "unlabelled",
                    "static_configs": [{"targets": [cars["b1"].url.removeprefix("http://")]}],
                },
            ],
        }
        prom = await stack.enter_async_context(run_prometheus(tmp_path, config, session))
        rows: dict[str, list[LedgerRow]] = {"model-a": [], "model-b": []}
        for name, model, _ in SIDECARS:
            rows[model] += await read_rows(tmp_path / f"{name}.sqlite")
        want_series = sum(_fly_series(m) for m in metrics.values()) + _fly_series(metrics["b1"])

        async def all_scraped() -> bool | None:
            q = (
                'count(specwatch_ledger_pairs{arm="fly",outcome!~"agree|disagree"}) + '
                'count(specwatch_paired_e_value{hypothesis="margin"}) * 1000'
            )
            async with session.get(f"{prom}/api/v1/query", params={"query": q}) as r:
                result = (await r.json())["data"]["result"]
            want = want_series + 4 * 1000  # three sidecars' margin e-values, b1's twice
            return True if result and float(result[0]["value"][1]) == want else None

        await poll("prometheus scraped every sidecar", all_scraped, within=30)

        async def fleet_json() -> tuple[dict[str, Any], str] | None:
            """The CLI's JSON once every series is in (a scrape that timed out on this busy
            machine leaves a stale marker until the next one)."""
            rc, out, err = await run_specwatch(
                "fleet", "--prometheus-url", prom, "--format", "json"
            )
            assert rc == 0, err
            doc: dict[str, Any] = json.loads(out)
            return (doc, err) if len(doc["models"]) == 2 and doc["bad_series"] else None

        doc, err = await poll("fleet sees every series", fleet_json, within=60, every=1.0)
        assert doc["window"] == "since_start"
        # the unlabelled job's series are skipped, counted and logged
        # (its pair series and its two e-values)
        assert doc["bad_series"] == {"missing_model_label": _fly_series(metrics["b1"]) + 2}
        assert '"reason":"missing_model_label"' in err
        for model, model_rows in rows.items():
            got = doc["models"][model]
            assert got["sidecars"] == (2 if model == "model-a" else 1)
            tallies = tally_rows(model_rows)
            union = sum(tallies.values(), PairTally())
            for category in [*tallies, OVERALL]:
                exp = expected(model_rows, None if category == OVERALL else category)
                c = got["categories"][category]
                assert (c["n"], c["lost"], c["gained"]) == (exp.n, exp.lost, exp.gained)
                assert close(c["exact_p"], exp.p_two_sided)
                assert close(c["exact_p_loss"], exp.p_loss)
                # a category: the count form of the pooled pairs; all categories: the mean
                # of the sidecars' own since-start e-processes
                own_e = [_margin_e(metrics[n], "no_net_loss") for n, m, _ in SIDECARS if m == model]
                want_e = (
                    sum(own_e) / len(own_e)
                    if category == OVERALL
                    else count_form(exp.lost, exp.gained)
                )
                assert math.isclose(c["e_value"], want_e, rel_tol=1e-7)
                s = summarize(union if category == OVERALL else tallies[category])
                assert close(c["ci"]["lower"], s.ci_lower)
                assert close(c["ci"]["upper"], s.ci_upper)
                assert close(c["net_loss"], (exp.lost - exp.gained) / exp.n)
            assert got["categories"][OVERALL]["n"] > 0
            own = [_margin_e(metrics[n]) for n, m, _ in SIDECARS if m == model]
            assert got["margin_e_value"]["sidecars"] == len(own)
            assert close(got["margin_e_value"]["mean"], sum(own) / len(own))
            assert close(got["margin_e_value"]["product"], math.prod(own))
        # model-a pools two sidecars: its table is not either sidecar's alone
        assert doc["models"]["model-a"]["categories"][OVERALL]["n"] == len(
            [r for r in rows["model-a"] if r.labelled and r.status == "paired"]
        )

        # --listen: the same numbers as gauges on the fleet's own /metrics
        port = free_port()
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "specwatch",
            "fleet",
            "--prometheus-url",
            prom,
            "--selector",
            'job="specwatch"',
            "--listen",
            f"127.0.0.1:{port}",
            "--interval",
            "1s",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        try:

            async def fleet_metrics() -> dict[tuple[str, frozenset[tuple[str, str]]], float] | None:
                async with session.get(f"http://127.0.0.1:{port}/metrics") as r:
                    text = await r.text()
                out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
                for fam in text_string_to_metric_families(text):
                    for s in fam.samples:
                        out[(s.name, frozenset(s.labels.items()))] = s.value
                return (
                    out
                    if ("specwatch_fleet_last_success_timestamp_seconds", frozenset()) in out
                    else None
                )

            fm = await poll("fleet /metrics", fleet_metrics, within=30)
        finally:
            proc.terminate()
            await proc.wait()
        for model in rows:
            c = doc["models"][model]["categories"][OVERALL]
            key = frozenset({"model_name": model, "category": OVERALL}.items())
            assert fm[("specwatch_fleet_paired_n", key)] == c["n"]
            assert fm[("specwatch_fleet_paired_lost", key)] == c["lost"]
            p_key = frozenset(
                {"model_name": model, "category": OVERALL, "alternative": "loss"}.items()
            )
            assert close(fm[("specwatch_fleet_paired_mcnemar_p_value", p_key)], c["exact_p_loss"])
        assert (
            "specwatch_fleet_bad_series",
            frozenset({("reason", "missing_model_label")}),
        ) not in fm
