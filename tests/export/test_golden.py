"""Golden ``/metrics``: specwatch's own families for one fixed scenario, compared byte for byte.

The scenario: a standard and a FLy target scraped from the vLLM fixture captures at fixed times
(``tests/fixtures/vllm-metrics``), one fixed :class:`ShadowStats` (ledger rows and every shadow
I/O counter, load pauses included), and one firing alert with a send error. Process, platform
and GC series (``process_``, ``python_``) are left out: their values vary from run to run.

Regenerate after an intended change of the exposition with::

    SPECWATCH_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/export/test_golden.py

and review the diff of ``tests/fixtures/golden/metrics.prom`` before committing it.
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, generate_latest

from specwatch.alerts.values import AlertingState, FiringAlert, PeerState
from specwatch.export.prometheus import AlertsCollector, ShadowCollector, SpecwatchCollector
from tests.deploy.test_dashboards import full_shadow_stats
from tests.export.test_prometheus import _full_snapshot
from tests.fakes import REPO

GOLDEN = REPO / "tests" / "fixtures" / "golden" / "metrics.prom"


def _alerting() -> AlertingState:
    return AlertingState(
        firing=(
            FiringAlert(
                labels={"alertname": "SpecwatchAcceptanceDrop", "severity": "warning"},
                starts_at=20.0,
            ),
        ),
        peers=(
            PeerState(
                "http://alertmanager:9093",
                sent_alerts=3,
                errors={"timeout": 1},
                outbox_depth=1,
                last_send_ok=False,
                last_error="timeout",
                last_error_at=25.0,
                clock_offset=-1.5,
            ),
        ),
    )


def scenario_text() -> str:
    """The exposition text of the scenario, only ``specwatch_`` families."""
    snap = _full_snapshot()
    reg = CollectorRegistry(auto_describe=False)
    reg.register(SpecwatchCollector(lambda: snap))
    stats = full_shadow_stats()
    alerting = _alerting()
    reg.register(ShadowCollector(lambda: stats))
    reg.register(AlertsCollector(lambda: alerting))
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
