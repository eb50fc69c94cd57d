"""The fleet summary behind HA Prometheus replicas that are not deduplicated (Thanos Querier with
dedup off, or two replicas federated): each sidecar's series arrives once per replica, told
apart only by the replica label."""

from __future__ import annotations

from specwatch.core.config import DEFAULT_REPLICA_LABELS, OVERALL
from specwatch.tools.fleet.stats import fleet_json, fleet_stats


def _sidecar(
    instance: str, extra: dict[str, str], **counts: int
) -> list[tuple[dict[str, str], float]]:
    out = []
    for outcome, value in counts.items():
        labels = {
            "instance": instance,
            "model_name": "m",
            "category": "math",
            "arm": "fly",
            "outcome": outcome,
            **extra,
        }
        out.append((labels, float(value)))
    return out


ONE = {"both_correct": 10, "lost": 3, "gained": 1, "both_wrong": 2}


def test_replicas_counted_once_and_reported() -> None:
    """Two sidecars seen through two replicas (``prometheus_replica`` a/b): the table is the two
    sidecars' union once (n = 16 + 16 = 32, lost 6, gained 2), not twice (n = 64), there are 2
    sidecars, and the 8 duplicate series are reported as skipped."""
    rows = []
    for replica in ("a", "b"):
        for inst in ("s1:9477", "s2:9477"):
            rows += _sidecar(inst, {"prometheus_replica": replica}, **ONE)
    stats = fleet_stats(rows, now=1.0)
    m = stats.models["m"]
    s = m.summaries[OVERALL]
    assert (s.n, s.lost, s.gained) == (32, 6, 2)
    assert m.sidecars == 2
    assert stats.bad_series == {"replica_duplicate": 8}
    assert fleet_json(stats)["bad_series"] == {"replica_duplicate": 8}
    assert DEFAULT_REPLICA_LABELS == ("replica", "prometheus_replica")


def test_replica_labels_are_configurable() -> None:
    """A replica label of one's own (``__replica__``, Thanos receive style) deduplicates only
    when named; the default labels leave it as two sidecars counted twice."""
    rows = [
        *_sidecar("s1", {"__replica__": "0"}, **ONE),
        *_sidecar("s1", {"__replica__": "1"}, **ONE),
    ]
    assert fleet_stats(rows, now=1.0).models["m"].summaries[OVERALL].n == 32
    named = fleet_stats(rows, now=1.0, replica_labels=("__replica__",))
    assert named.models["m"].summaries[OVERALL].n == 16
    assert named.models["m"].sidecars == 1


def test_replicas_one_behind_take_the_larger_count() -> None:
    """Replicas scraped a moment apart disagree by the pairs added in between: the fleet takes
    the larger value of each series (the newer read of a count that only grows between
    prunings): lost 4 from replica b, not 3 + 4."""
    rows = [
        *_sidecar("s1", {"replica": "a"}, both_correct=10, lost=3, gained=1, both_wrong=2),
        *_sidecar("s1", {"replica": "b"}, both_correct=10, lost=4, gained=1, both_wrong=2),
    ]
    s = fleet_stats(rows, now=1.0).models["m"].summaries[OVERALL]
    assert (s.n, s.lost) == (17, 4)
