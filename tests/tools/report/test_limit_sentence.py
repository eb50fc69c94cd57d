"""The speculation-limit sentence is one sentence: the sidecar's snapshot and the report (from
that snapshot or from the sidecar's ``/metrics``) show the same comparisons in the same order."""

from __future__ import annotations

import json
from dataclasses import replace

from prometheus_client import CollectorRegistry, generate_latest

from specwatch.export.json import snapshot_json
from specwatch.export.prometheus import SpecwatchCollector
from specwatch.export.snapshot import Snapshot
from specwatch.observe.concurrency import ConcurrencyProfile, add_point, speculation_limit
from specwatch.tools.report.data import parse_acceptance
from tests.export.test_prometheus import _full_snapshot

#: Both references at 100 tokens/s per request at 1 and at 4 running, FLy at 150 then 75: the
#: gain crosses zero ln 1.5 / ln 2 of the way from 1 to 4 in log(running), at about 2.
HEAD = "stops paying from about 2 running requests (95 % interval 1-4)"


def _snapshot_with_baseline() -> Snapshot:
    ref, fly = ConcurrencyProfile(), ConcurrencyProfile()
    for _ in range(8):
        ref = add_point(ref, 1, 100.0, 0.01)
        fly = add_point(fly, 1, 150.0, 0.008)
        ref = add_point(ref, 4, 400.0, 0.01)
        fly = add_point(fly, 4, 300.0, 0.012)
    snap = _full_snapshot()
    limit = speculation_limit(ref, fly, baseline=ref)
    return replace(snap, observe=replace(snap.observe, speculation_limit=limit))


def test_snapshot_and_report_show_the_same_sentence() -> None:
    """FLy against the no-speculation baseline and the standard arm: the snapshot's sentence
    names the baseline first, then the standard arm, joined by ". "; the report shows that
    sentence from the snapshot, and from ``/metrics`` (no gain there) the same two headlines
    in the same order, joined the same way."""
    snap = _snapshot_with_baseline()
    text = snapshot_json(snap)["speculation_limit"]["text"]
    registry = CollectorRegistry()
    registry.register(SpecwatchCollector(lambda: snap))
    from_metrics = parse_acceptance(generate_latest(registry).decode(), "1m", "metrics")
    from_snapshot = parse_acceptance(json.dumps(snapshot_json(snap)), "1m", "snapshot")
    heads = [f"FLy vs no speculation: {HEAD}", f"FLy vs standard speculation: {HEAD}"]
    assert from_metrics.speculation_limit == ". ".join(heads)
    assert from_snapshot.speculation_limit == text
    first, second = text.split(". FLy vs ")
    assert first.startswith(heads[0] + "; per-request decode speed at ")
    assert ("FLy vs " + second).startswith(heads[1] + "; per-request decode speed at ")
