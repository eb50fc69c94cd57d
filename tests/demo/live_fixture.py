"""Draw the demo's live view of a fixed snapshot with four alerts firing, as the demo draws it.

``python -m tests.demo.live_fixture SECONDS``: prints the demo's two intro lines, then draws
the view with the demo's own live display (:func:`specwatch.demo.run.live_display`, sized by
:func:`specwatch.demo.run.view_size`) three times, and keeps it on screen for ``SECONDS``; the
tmux tests read that pane. The snapshot is typed, as the sidecar publishes it: two targets, a
pair view, shadow statistics with a verdict, the load's canary scores and four firing alerts
(two ``SpecQualityDrift`` told apart only by their ``hypothesis`` label).
"""

from __future__ import annotations

import sys
import time

from rich.console import Console

from specwatch.alerts.values import AlertingState, FiringAlert
from specwatch.core.config import OVERALL, SINCE_START
from specwatch.core.roles import Role
from specwatch.demo.run import live_display, view_size
from specwatch.demo.view import LoadSummary, ViewContext, build_view
from specwatch.export.snapshot import Snapshot
from specwatch.observe.values import (
    Capacity,
    Health,
    Limits,
    ModelWindow,
    ObserveView,
    PairView,
    TargetSnapshot,
)
from specwatch.shadow.published import ShadowIO, ShadowStats
from specwatch.shadow.summary import summarize
from specwatch.shadow.tally import ArmTotals, PairTally

INTRO = "specwatch demo: sidecar on http://127.0.0.1:9477\n  stop: Ctrl-C (or wait 100 s)"

FIRING = (
    {
        "alertname": "SpecQualityDrift",
        "severity": "critical",
        "check": "e_value",
        "category": OVERALL,
        "hypothesis": "no_net_loss",
    },
    {
        "alertname": "SpecQualityDrift",
        "severity": "critical",
        "check": "e_value",
        "category": OVERALL,
        "hypothesis": "non_inferiority",
    },
    {"alertname": "SpecFlipRateAboveNoise", "severity": "warning", "category": OVERALL},
    {
        "alertname": "SpecAcceptanceDrop",
        "severity": "warning",
        "target": "standard",
        "engine": "1",
        "model": "demo-model",
        "role": "standard",
        "scope": "engine",
    },
)

NOTES = {
    "SpecQualityDrift": "fired after 131 labelled pairs, 41 s",
    "SpecFlipRateAboveNoise": "fired after 40 labelled pairs, 17 s",
    "SpecAcceptanceDrop": "fired after 260 labelled pairs, 62 s",
}


def _target(name: str, alpha: float, tau: float) -> TargetSnapshot:
    health = Health(
        acceptance_rate=alpha,
        mean_acceptance_length=tau,
        generation_tokens_per_second=1226.0,
        num_requests_running=9,
        num_requests_waiting=0,
    )
    return TargetSnapshot(
        name=name,
        role=Role(name),
        url=f"http://127.0.0.1:4123{len(name)}/metrics",
        up=True,
        limits=Limits(max_num_seqs=16),
        capacity=Capacity(limits_configured=True, num_requests_running=5),
        windows={"1m": {"demo-model": ModelWindow(server=health, engines={})}},
    )


def snapshot() -> Snapshot:
    """The fixed snapshot: FLy loses 22 and gains 7 of 131 labelled pairs."""
    tally = PairTally(
        both_correct=90, lost=22, gained=7, both_wrong=12, agree=150, disagree=50, noise_agree=200
    )
    stats = ShadowStats(
        generated_at=1.0,
        alpha=0.05,
        margin=0.01,
        detect_net_loss=0.02,
        windows={SINCE_START: {OVERALL: summarize(tally)}},
        io=ShadowIO(in_flight=8, queue_depth=3, paused={}, dropped={}),
        # the verdict's τ: 100 pairs with per-request τ, means 3.18 and 3.53 (+11 %)
        arm_totals=ArmTotals(tau_pairs=100, standard_tau_sum=318.0, fly_tau_sum=353.0),
    )
    observe = ObserveView(
        generated_at=1.0,
        targets={"standard": _target("standard", 0.546, 3.18), "fly": _target("fly", 0.632, 3.53)},
        pair={"1m": PairView("standard", "fly", 0.087, 1.11, 1.0)},
    )
    firing = tuple(FiringAlert(labels, 90.0) for labels in FIRING)
    return Snapshot(observe=observe, shadow=stats, alerts=AlertingState(firing=firing))


def main(seconds: float) -> None:
    """Print the intro and draw the view (see the module docstring)."""
    print(INTRO, flush=True)
    ctx = ViewContext(
        title="specwatch demo  98 s / 100 s  window 1m  Ctrl-C stops",
        base="http://127.0.0.1:9477",
        standard_url="http://127.0.0.1:41231",
        fly_url="http://127.0.0.1:41232",
        notes=(
            "shadow ledger: /tmp/specwatch-demo-x/ledger.sqlite (removed at exit)",
            "alerts to Alertmanager: none (--alertmanager-url URL)",
        ),
        alert_notes=NOTES,
    )
    load = LoadSummary(
        sent=2_000, ok=1_980, canary={"standard": (334, 376), "fly": (268, 376)}, mirrored=990
    )
    console = Console(file=sys.stdout, force_terminal=True)
    snap = snapshot()
    with live_display(console) as live:
        for _ in range(3):
            width, height = view_size(console, INTRO)
            live.update(build_view(snap, ctx, width=width, height=height, load=load), refresh=True)
            time.sleep(0.2)
        time.sleep(seconds)


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 30.0)
