"""Golden ``/metrics``: specwatch's own families for one fixed scenario, compared byte for byte.

The scenario: a standard and a FLy target scraped from the vLLM fixture captures at fixed times
(``tests/fixtures/vllm-metrics``), one fixed :class:`ShadowStats` (ledger rows, I/O counters),
load pauses, and one firing alert with a send error. Process/platform/GC series (``process_``,
``python_``) are left out: their values vary from run to run.

Regenerate after an intended change of the exposition with::

    SPECWATCH_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/core/test_metrics_golden.py

and review the diff of ``tests/fixtures/golden/metrics.prom`` before committing it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from specwatch.alerts.alertmanager import AlertingState, FiringAlert, alert_families
from specwatch.export.prometheus import SpecwatchCollector
from specwatch.export.shadow import shadow_families
from tests.core.test_export import _full_snapshot
from tests.ship.test_dashboards import full_shadow_stats

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "golden" / "metrics.prom"


def _alerting() -> AlertingState:
    return AlertingState(
        firing=(
            FiringAlert(
                labels={"alertname": "SpecwatchAcceptanceDrop", "severity": "warning"},
                starts_at=20.0,
            ),
        ),
        send_errors={"timeout": 1},
        outbox_depth=1,
    )


class _Others(Collector):
    def collect(self) -> Iterator[Metric]:
        yield from shadow_families(full_shadow_stats())
        pauses = CounterMetricFamily(
            "specwatch_shadow_pauses",
            "Times shadow replay entered a load-aware pause, by reason.",
            labels=["reason"],
        )
        pauses.add_metric(["waiting"], 2)
        yield pauses
        yield from alert_families(_alerting())


def scenario_text() -> str:
    """The exposition text of the scenario, only ``specwatch_`` families."""
    snap = _full_snapshot()
    reg = CollectorRegistry(auto_describe=False)
    reg.register(SpecwatchCollector(lambda: snap))
    reg.register(_Others())
    return own_families(generate_latest(reg).decode())


def own_families(text: str) -> str:
    """The lines of ``text`` that belong to ``specwatch_*`` families (HELP, TYPE and samples)."""
    keep: list[str] = []
    for line in text.splitlines():
        name = line.split(" ", 3)[2] if line.startswith("#") else line
        if name.startswith("specwatch_"):
            keep.append(line)
    return "\n".join(keep) + "\n"


def test_metrics_match_golden() -> None:
    """The scenario's exposition equals tests/fixtures/golden/metrics.prom byte for byte."""
    text = scenario_text()
    if os.environ.get("SPECWATCH_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text, encoding="utf-8")
    assert text == GOLDEN.read_text(encoding="utf-8")
