"""The fleet view's metric families (``specwatch fleet --listen``), kept with the tool so the
running sidecar's catalogue (:mod:`specwatch.export.catalogue`) does not carry them.

:data:`DOCUMENTED` joins both: ``docs/metrics.md`` lists every family of the sidecar and of
the fleet view (checked by a test), and :data:`DOCUMENTED_LABEL_BOUNDS` bounds all their labels.
"""

from __future__ import annotations

from specwatch.export.catalogue import CATALOGUE
from specwatch.export.label_bounds import LABEL_BOUNDS
from specwatch.export.spec import REASON, MetricSpec, _c, _g

# -- fleet (``specwatch fleet --listen``: one process over the sidecars' counters in Prometheus) --

FLEET_MODEL = ("model_name",)
FLEET_MC = ("model_name", "category")
FLEET_SIDECARS = _g(
    "specwatch_fleet_sidecars",
    "Sidecars whose specwatch_ledger_pairs series Prometheus returned for this model.",
    FLEET_MODEL,
)
FLEET_N = _g(
    "specwatch_fleet_paired_n",
    "Labelled pairs of the model summed over its sidecars (the union of their ledgers).",
    FLEET_MC,
)
FLEET_LOST = _g(
    "specwatch_fleet_paired_lost",
    "Fleet labelled pairs the standard arm got right and FLy wrong.",
    FLEET_MC,
)
FLEET_GAINED = _g(
    "specwatch_fleet_paired_gained",
    "Fleet labelled pairs the standard arm got wrong and FLy right.",
    FLEET_MC,
)
FLEET_NET_LOSS = _g(
    "specwatch_fleet_paired_net_loss_ratio",
    "Fleet paired accuracy difference acc(standard) - acc(FLy) = (lost - gained) / n.",
    FLEET_MC,
)
FLEET_CI_LOWER = _g(
    "specwatch_fleet_paired_net_loss_ci_lower_ratio",
    "Lower bound of the Tango score interval (level 1 - alpha) for the fleet net loss.",
    FLEET_MC,
)
FLEET_CI_UPPER = _g(
    "specwatch_fleet_paired_net_loss_ci_upper_ratio",
    "Upper bound of the Tango score interval (level 1 - alpha) for the fleet net loss.",
    FLEET_MC,
)
FLEET_NON_INFERIORITY = _g(
    "specwatch_fleet_paired_non_inferiority_pass",
    "1 when the Tango non-inferiority test on the fleet table shows net loss < margin.",
    FLEET_MC,
)
FLEET_MCNEMAR_P = _g(
    "specwatch_fleet_paired_mcnemar_p_value",
    "Exact McNemar p-value on the fleet's discordant pairs (two-sided, or one-sided for loss).",
    (*FLEET_MC, "alternative"),
)
FLEET_E_VALUE = _g(
    "specwatch_fleet_paired_e_value",
    "The e-value against 'no net loss': for category overall the mean of the sidecars' "
    "since-start e-processes, per category the count form on the fleet's pooled pairs.",
    (*FLEET_MC, "hypothesis"),
)
FLEET_MARGIN_E_VALUE = _g(
    "specwatch_fleet_paired_margin_e_value",
    "The sidecars' since-start margin e-values combined: mean (valid under any dependence) or "
    "product (valid for sidecars with independent traffic).",
    (*FLEET_MODEL, "combination"),
)
FLEET_NET_LOSS_E_VALUE = _g(
    "specwatch_fleet_paired_net_loss_e_value",
    "The sidecars' since-start no-net-loss e-processes combined: mean (valid under any "
    "dependence) or product (valid for sidecars with independent traffic).",
    (*FLEET_MODEL, "combination"),
)
FLEET_QUERY_ERRORS = _c(
    "specwatch_fleet_query_errors",
    "Failed Prometheus queries of the fleet view, by reason.",
    REASON,
)
FLEET_BAD_SERIES = _g(
    "specwatch_fleet_bad_series",
    "Series skipped in the latest fleet snapshot, by reason (missing model label, not a count).",
    REASON,
)
FLEET_LAST_SUCCESS = _g(
    "specwatch_fleet_last_success_timestamp_seconds",
    "Unix time of the latest fleet snapshot built from successful queries.",
)

#: The fleet view's families, in exposition order.
FLEET: tuple[MetricSpec, ...] = (
    FLEET_SIDECARS,
    FLEET_N,
    FLEET_LOST,
    FLEET_GAINED,
    FLEET_NET_LOSS,
    FLEET_CI_LOWER,
    FLEET_CI_UPPER,
    FLEET_NON_INFERIORITY,
    FLEET_MCNEMAR_P,
    FLEET_E_VALUE,
    FLEET_MARGIN_E_VALUE,
    FLEET_NET_LOSS_E_VALUE,
    FLEET_QUERY_ERRORS,
    FLEET_BAD_SERIES,
    FLEET_LAST_SUCCESS,
)

#: The fleet view's own labels → what bounds their values (the others are the sidecar's).
FLEET_LABEL_BOUNDS: dict[str, str] = {
    "combination": "2: mean, product (the fleet margin e-value)",
}

#: Every family ``docs/metrics.md`` lists: the running sidecar's, then the fleet view's.
DOCUMENTED: tuple[MetricSpec, ...] = (*CATALOGUE, *FLEET)

#: Every label of a documented family → its bound.
DOCUMENTED_LABEL_BOUNDS: dict[str, str] = {**LABEL_BOUNDS, **FLEET_LABEL_BOUNDS}
