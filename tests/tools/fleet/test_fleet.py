"""The fleet summary from Prometheus rows: sums per model, hand-worked statistics, bad series."""

from __future__ import annotations

import logging
import math

import pytest
from prometheus_client import CollectorRegistry

from specwatch.core.config import OVERALL
from specwatch.tools.fleet.stats import (
    FleetCollector,
    FleetHealth,
    fleet_stats,
    margin_e_selector,
    pairs_selector,
)
from tests.shadow.stats.eprocess_reference import count_form


def _rows(instance: str, model: str | None, **counts: float) -> list[tuple[dict[str, str], float]]:
    out = []
    for outcome, value in counts.items():
        labels = {"instance": instance, "category": "math", "arm": "fly", "outcome": outcome}
        if model is not None:
            labels["model_name"] = model
        out.append((labels, value))
    return out


PAIRS = [
    *_rows("s1:9464", "m", both_correct=10, lost=3, gained=1, both_wrong=2),
    *_rows("s2:9464", "m", both_correct=5, lost=2, both_wrong=1),
]


def test_union_table_and_hand_worked_statistics() -> None:
    """Two sidecars of model m: union 15/5/1/3 (n=24). Exact McNemar on 5 of 6 discordant:
    P(X>=5 | 6, 1/2) = 7/64 (loss), 14/64 (two-sided); net loss 4/24; without the sidecars'
    exported e-processes the no_net_loss e-value is the count form
    sum_j w_j (2 q_j)^5 (2 (1 - q_j))^1 with the 6 % bets."""
    stats = fleet_stats(PAIRS, now=100.0)
    m = stats.models["m"]
    assert m.sidecars == 2
    for category in ("math", OVERALL):
        s = m.summaries[category]
        assert (s.n, s.lost, s.gained, s.tally.both_correct, s.tally.both_wrong) == (
            24,
            5,
            1,
            15,
            3,
        )
        assert s.p_loss == pytest.approx(7 / 64, rel=1e-12)
        assert s.p_two_sided == pytest.approx(14 / 64, rel=1e-12)
        assert s.net_loss_ratio == pytest.approx(4 / 24, rel=1e-12)
        assert s.e_value == pytest.approx(count_form(5, 1), rel=1e-9)
        assert s.ci_lower < 4 / 24 < s.ci_upper
    assert stats.bad_series == {}


def test_net_loss_e_values_mean_and_product_with_replicas_counted_once() -> None:
    """The sidecars' exported no-net-loss e-processes 3 and 12 (the second also read through a
    second HA replica): mean 7.5 is the fleet's overall e-value, product 36; the category keeps
    the count form of the pooled counts."""
    rows = [
        ({"instance": "s1", "model_name": "m", "prometheus_replica": "a"}, 3.0),
        ({"instance": "s2", "model_name": "m", "prometheus_replica": "a"}, 12.0),
        ({"instance": "s2", "model_name": "m", "prometheus_replica": "b"}, 12.0),
    ]
    stats = fleet_stats(PAIRS, (), rows, now=1.0)
    m = stats.models["m"]
    assert (m.net_loss_e_mean, m.net_loss_e_product, m.net_loss_sidecars) == (7.5, 36.0, 2)
    assert m.summaries[OVERALL].e_value == pytest.approx(7.5, rel=1e-12)
    assert m.summaries["math"].e_value == pytest.approx(count_form(5, 1), rel=1e-9)
    assert stats.bad_series == {"replica_duplicate": 1}


def test_margin_e_values_mean_and_product() -> None:
    """Sidecar margin e-values 2 and 8: mean 5 (any dependence), product 16 (independent)."""
    margins = [
        ({"instance": "s1", "model_name": "m"}, 2.0),
        ({"instance": "s2", "model_name": "m"}, 8.0),
    ]
    m = fleet_stats(PAIRS, margins, now=1.0).models["m"]
    assert (m.margin_e_mean, m.margin_e_product, m.margin_sidecars) == (5.0, 16.0, 2)


def test_bad_series_are_counted_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    """A series without the model label and a fractional count are skipped, counted by reason,
    each logged with its labels; the rest is summarised."""
    bad = [*_rows("s3", None, lost=4), *_rows("s4", "m", gained=2.5)]
    with caplog.at_level(logging.WARNING, logger="specwatch.fleet"):
        stats = fleet_stats(PAIRS + bad, now=1.0)
    assert stats.bad_series == {"missing_model_label": 1, "not_a_count": 1}
    assert stats.models["m"].summaries[OVERALL].n == 24
    reasons = sorted(r.specwatch_fields["reason"] for r in caplog.records)  # type: ignore[attr-defined]
    assert reasons == ["missing_model_label", "not_a_count"]


def test_empty_model_label_pools_every_series() -> None:
    """``model_label=""`` puts every series, labelled or not, in one ``_all`` group."""
    stats = fleet_stats([*PAIRS, *_rows("s3", None, lost=4)], now=1.0, model_label="")
    assert list(stats.models) == ["_all"]
    assert stats.models["_all"].summaries[OVERALL].lost == 9


def test_selectors_carry_the_users_matchers() -> None:
    """The queries select the FLy correctness outcomes each ledger holds (the gauge a sidecar
    restart keeps, not the counter of the process's own pairs) and the since-start margin
    e-value."""
    assert pairs_selector('job="sw"') == (
        'specwatch_ledger_pairs{arm="fly",outcome=~"both_correct|lost|gained|both_wrong",job="sw"}'
    )
    assert margin_e_selector() == (
        'specwatch_paired_e_value{hypothesis="margin",window="since_start",category="_all"}'
    )


def test_collector_exports_the_catalogue_families(registry: CollectorRegistry) -> None:
    """The gauges carry model_name and category; the exporter's own counters are exported."""
    stats = fleet_stats(PAIRS, now=100.0)
    health = FleetHealth(query_errors={"timeout": 2}, last_success=100.0)
    registry.register(FleetCollector(lambda: (stats, health)))
    get = registry.get_sample_value
    labels = {"model_name": "m", "category": OVERALL}
    assert get("specwatch_fleet_paired_n", labels) == 24
    assert get("specwatch_fleet_paired_mcnemar_p_value", {**labels, "alternative": "loss"}) == (
        pytest.approx(7 / 64)
    )
    assert get("specwatch_fleet_sidecars", {"model_name": "m"}) == 2
    assert get("specwatch_fleet_query_errors_total", {"reason": "timeout"}) == 2
    assert get("specwatch_fleet_last_success_timestamp_seconds") == 100.0
    assert math.isnan(stats.models["m"].margin_e_mean or math.nan)
