"""Fleet-wide paired statistics from the sidecars' counters, as Prometheus returns them (pure).

Each sidecar exports ``specwatch_ledger_pairs{category, arm, outcome}``: the pairs its ledger
holds now, by outcome (rebuilt from the ledger at start, so a restart keeps them; retention
pruning lowers them). ``specwatch_shadow_pairs_total`` is not used: it counts this process's
pairs from 0, so after a sidecar restart it would drop that sidecar's history from the fleet.
Summed over the sidecars of one model, the ``arm="fly"`` correctness outcomes
(``both_correct``, ``lost``, ``gained``, ``both_wrong``) are the 2x2 table of the union of
their ledgers, and every statistic that is a function of that table is the one a single sidecar
would compute on the union of the pairs, exactly:

* exact McNemar p-values (two-sided and one-sided for a FLy loss), the net loss and its Tango
  score interval, the Tango non-inferiority test, the discordant ratio;
* per category, the ``no_net_loss`` e-value
  (:func:`specwatch.shadow.stats.eprocess.count_log_e_value`: a function of ``(lost,
  gained)``, so exact for the pooled pairs).

The ``no_net_loss`` e-process of all pairs (:mod:`specwatch.shadow.stats.eprocess`) and the
``margin`` e-process (testing by betting) depend on the order of the pairs, which the counters
do not carry. The fleet view combines the sidecars' own since-start values instead
(``specwatch_paired_e_value{hypothesis="no_net_loss"|"margin", window="since_start",
category="overall"}``): their **mean** is an e-value under any dependence between sidecars (a
mixture of e-values), and their **product** is an e-value when the sidecars see independent
traffic (a product of independent e-values is an e-value). Both are exported
(``combination="mean"|"product"``); the fleet's ``overall`` no-net-loss e-value is the mean, so
for one sidecar it is that sidecar's value. Alarm on the mean unless the sidecars' traffic is
independent. Series read through several HA Prometheus replicas count once.

This module takes the query results as values (``(labels, value)`` rows) and returns values;
the HTTP queries live in :mod:`specwatch.tools.fleet.server`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from specwatch.core.config import DEFAULT_REPLICA_LABELS, OVERALL, SINCE_START
from specwatch.core.logs import log_event
from specwatch.export import catalogue as cat
from specwatch.export.prometheus import _describe, _Families
from specwatch.shadow.published import PairedSummary
from specwatch.shadow.summary import Levels, OrderedState, build_shadow_stats
from specwatch.shadow.tally import PairTally
from specwatch.tools.fleet import catalogue as fc

log = logging.getLogger("specwatch.fleet")

#: The correctness outcomes of ``specwatch_ledger_pairs`` that make the FLy 2x2 table.
CORRECTNESS_OUTCOMES: tuple[str, ...] = ("both_correct", "lost", "gained", "both_wrong")
#: The window name of the fleet statistics: the gauges count each ledger's retained rows.
FLEET_WINDOW = SINCE_START
#: Labels of a ``specwatch_ledger_pairs`` series that are not the sidecar's identity.
_PAIR_LABELS = frozenset({"__name__", "category", "arm", "outcome"})
#: Label values that name a whole-fleet group when no model label is used.
ALL_MODELS = OVERALL

Row = tuple[Mapping[str, str], float]

# DEFAULT_REPLICA_LABELS (the HA replica labels) lives in core.config, so ``fleet --help`` can
# name it without this module's statistics imports.


def dedup_replicas(rows: Iterable[Row], replica_labels: Iterable[str]) -> tuple[list[Row], int]:
    """``rows`` with each series kept once across HA replicas: rows equal but for the
    ``replica_labels`` become one row without those labels, with the largest value (replicas
    scrape a moment apart; the newer read of a pair count is the larger one). Returns the rows
    and how many duplicates were dropped."""
    drop = frozenset(replica_labels)
    kept: dict[frozenset[tuple[str, str]], Row] = {}
    dropped = 0
    for labels, value in rows:
        key = frozenset((k, v) for k, v in labels.items() if k not in drop)
        if key in kept:
            dropped += 1
            if value > kept[key][1]:
                kept[key] = (kept[key][0], value)
            continue
        kept[key] = ({k: v for k, v in labels.items() if k not in drop}, value)
    return list(kept.values()), dropped


def pairs_selector(matchers: str = "") -> str:
    """The PromQL instant query of the FLy correctness outcomes each sidecar's ledger holds
    (``specwatch_ledger_pairs``), with the user's extra label ``matchers`` (e.g.
    ``job="specwatch",cluster="eu1"``; empty for none)."""
    extra = f",{matchers}" if matchers.strip() else ""
    outcomes = "|".join(CORRECTNESS_OUTCOMES)
    return f'{cat.LEDGER_PAIRS.sample_name}{{arm="fly",outcome=~"{outcomes}"{extra}}}'


def e_value_selector(hypothesis: str, matchers: str = "") -> str:
    """The PromQL instant query of each sidecar's since-start e-value of all categories for
    ``hypothesis`` (``margin`` or ``no_net_loss``)."""
    extra = f",{matchers}" if matchers.strip() else ""
    return (
        f'{cat.E_VALUE.sample_name}{{hypothesis="{hypothesis}",window="{FLEET_WINDOW}",'
        f'category="{OVERALL}"{extra}}}'
    )


def margin_e_selector(matchers: str = "") -> str:
    """The PromQL instant query of each sidecar's since-start margin e-value."""
    return e_value_selector("margin", matchers)


def net_loss_e_selector(matchers: str = "") -> str:
    """The PromQL instant query of each sidecar's since-start no-net-loss e-process."""
    return e_value_selector("no_net_loss", matchers)


@dataclass(frozen=True, slots=True)
class FleetModel:
    """Fleet statistics for one model: ``sidecars`` (distinct sidecar series identities that
    reported pairs), ``summaries[category]`` (category :data:`OVERALL` = all; the same
    :class:`PairedSummary` a sidecar computes for its ``since_start`` window, here on the union
    of the sidecars' pairs), and the combined margin e-values (``None`` when no sidecar runs the
    margin e-process): ``margin_e_mean`` (valid under any dependence), ``margin_e_product``
    (valid for independent sidecars), from ``margin_sidecars`` sidecars; the same for the
    no-net-loss e-process (``net_loss_e_*``; the mean is also ``summaries[OVERALL].e_value``)."""

    model: str
    sidecars: int
    summaries: Mapping[str, PairedSummary]
    margin_e_mean: float | None = None
    margin_e_product: float | None = None
    margin_sidecars: int = 0
    net_loss_e_mean: float | None = None
    net_loss_e_product: float | None = None
    net_loss_sidecars: int = 0


@dataclass(frozen=True, slots=True)
class FleetStats:
    """One fleet snapshot: ``models[model]`` at ``generated_at`` (unix seconds), the test
    settings used (``alpha``, ``margin``), and ``bad_series[reason]``: series skipped in this
    snapshot (``missing_model_label``, ``not_a_count``, ``replica_duplicate``)."""

    generated_at: float
    alpha: float
    margin: float
    models: Mapping[str, FleetModel]
    bad_series: Mapping[str, int] = field(default_factory=dict)


def _sidecar_identity(labels: Mapping[str, str]) -> frozenset[tuple[str, str]]:
    return frozenset((k, v) for k, v in labels.items() if k not in _PAIR_LABELS)


def _model_of(labels: Mapping[str, str], model_label: str) -> str | None:
    if not model_label:
        return ALL_MODELS
    value = labels.get(model_label)
    return value if value else None


def _skip(bad: dict[str, int], reason: str, labels: Mapping[str, str], value: float) -> None:
    bad[reason] = bad.get(reason, 0) + 1
    log_event(
        log,
        logging.WARNING,
        "fleet series skipped",
        reason=reason,
        series=dict(sorted(labels.items())),
        # a value that was not a number keeps the text the server sent (see prom_api)
        value=getattr(value, "text", value),
    )


def fleet_stats(
    pair_rows: Iterable[Row],
    margin_rows: Iterable[Row] = (),
    net_loss_rows: Iterable[Row] = (),
    *,
    now: float,
    model_label: str = "model_name",
    levels: Levels = Levels(),
    replica_labels: Iterable[str] = DEFAULT_REPLICA_LABELS,
) -> FleetStats:
    """Sum the ``pair_rows`` (series of :func:`pairs_selector`: labels and the counter value) per
    model (the series' ``model_label`` label; an empty ``model_label`` pools every series under
    :data:`ALL_MODELS`) and category, and summarise each table with
    :func:`specwatch.shadow.summary.build_shadow_stats` at ``levels``. ``margin_rows`` (series of
    :func:`margin_e_selector`) and ``net_loss_rows`` (of :func:`net_loss_e_selector`) are
    combined per model by mean and product; the mean of ``net_loss_rows`` is the e-value of the
    model's :data:`OVERALL` summary (without such rows: the count form on the pooled pairs).

    A series without the model label, or whose value is not a non-negative whole number (a
    counter of pairs always is), is skipped, counted in ``bad_series[reason]`` and logged once
    per snapshot with its labels. Series read through several HA Prometheus replicas (equal but
    for ``replica_labels``) count once (:func:`dedup_replicas`); the duplicates are reported as
    ``bad_series["replica_duplicate"]``. Raises nothing on bad rows.
    """
    bad: dict[str, int] = {}
    replicas = tuple(replica_labels)
    pair_rows, dup_pairs = dedup_replicas(pair_rows, replicas)
    margin_rows, dup_margins = dedup_replicas(margin_rows, replicas)
    net_loss_rows, dup_net = dedup_replicas(net_loss_rows, replicas)
    dup_margins += dup_net
    if dup_pairs + dup_margins:
        bad["replica_duplicate"] = dup_pairs + dup_margins
        log_event(
            log,
            logging.WARNING,
            "fleet series seen through several Prometheus replicas, counted once",
            duplicates=dup_pairs + dup_margins,
            replica_labels=sorted(replicas),
        )
    cells: dict[str, dict[str, dict[str, int]]] = {}
    sidecars: dict[str, set[frozenset[tuple[str, str]]]] = {}
    for labels, value in pair_rows:
        model = _model_of(labels, model_label)
        if model is None:
            _skip(bad, "missing_model_label", labels, value)
            continue
        outcome = labels.get("outcome", "")
        if (
            not math.isfinite(value)
            or value < 0
            or value != math.floor(value)
            or outcome not in CORRECTNESS_OUTCOMES
        ):
            _skip(bad, "not_a_count", labels, value)
            continue
        by_cat = cells.setdefault(model, {})
        counts = by_cat.setdefault(labels.get("category", ""), {})
        counts[outcome] = counts.get(outcome, 0) + int(value)
        sidecars.setdefault(model, set()).add(_sidecar_identity(labels))
    margins = _e_values(margin_rows, model_label, bad)
    net_loss = _e_values(net_loss_rows, model_label, bad)
    models: dict[str, FleetModel] = {}
    for model in sorted(set(cells) | set(margins) | set(net_loss)):
        tallies = {
            category: PairTally(**{o: counts.get(o, 0) for o in CORRECTNESS_OUTCOMES})
            for category, counts in cells.get(model, {}).items()
        }
        stats = build_shadow_stats(
            {FLEET_WINDOW: tallies},
            now=now,
            levels=levels,
            ordered=OrderedState(net_loss_log_e_value=_log_mean(net_loss.get(model, []))),
        )
        es = margins.get(model, [])
        ns = net_loss.get(model, [])
        models[model] = FleetModel(
            model=model,
            sidecars=len(sidecars.get(model, ())),
            summaries=stats.windows[FLEET_WINDOW],
            margin_e_mean=sum(es) / len(es) if es else None,
            margin_e_product=math.prod(es) if es else None,  # +Inf on overflow
            margin_sidecars=len(es),
            net_loss_e_mean=sum(ns) / len(ns) if ns else None,
            net_loss_e_product=math.prod(ns) if ns else None,
            net_loss_sidecars=len(ns),
        )
    a, m = levels.alpha, levels.margin
    return FleetStats(generated_at=now, alpha=a, margin=m, models=models, bad_series=bad)


def _e_values(rows: Iterable[Row], model_label: str, bad: dict[str, int]) -> dict[str, list[float]]:
    """The e-values of ``rows`` per model (a row without the model label, or not an e-value,
    is skipped and counted)."""
    out: dict[str, list[float]] = {}
    for labels, value in rows:
        model = _model_of(labels, model_label)
        if model is None:
            _skip(bad, "missing_model_label", labels, value)
            continue
        if math.isnan(value) or value < 0:
            _skip(bad, "not_an_e_value", labels, value)
            continue
        out.setdefault(model, []).append(value)
    return out


def _log_mean(values: list[float]) -> float | None:
    """``ln`` of the mean of e-values (``None`` for none; ``-inf`` for a mean of 0)."""
    if not values:
        return None
    mean = sum(values) / len(values)
    return math.log(mean) if mean > 0 else -math.inf


def _num(x: float) -> float | None:
    return None if math.isnan(x) else x


def fleet_json(stats: FleetStats) -> dict[str, object]:
    """The JSON document ``specwatch fleet --format json`` prints: per model, the sidecar count,
    the combined margin e-values and per category the 2x2 table, net loss (fraction), its
    interval, exact McNemar p-values, non-inferiority verdict and the ``no_net_loss`` e-value
    (NaN as ``null``; an overflowed e-value as ``Infinity``)."""
    models: dict[str, object] = {}
    for name, m in stats.models.items():
        cats: dict[str, object] = {}
        for category, s in sorted(m.summaries.items()):
            cats[category] = {
                "n": s.n,
                "both_correct": s.tally.both_correct,
                "lost": s.lost,
                "gained": s.gained,
                "both_wrong": s.tally.both_wrong,
                "net_loss": _num(s.net_loss_ratio),
                "ci": {
                    "lower": _num(s.ci_lower),
                    "upper": _num(s.ci_upper),
                    "level": s.ci_level,
                },
                "exact_p": s.p_two_sided,
                "exact_p_loss": s.p_loss,
                "discordant_ratio": _num(s.discordant_ratio),
                "non_inferiority": {
                    "p_value": s.non_inferiority_p,
                    "verdict": "non_inferior" if s.non_inferiority_pass else "not_shown",
                },
                "e_value": s.e_value,
            }
        models[name] = {
            "sidecars": m.sidecars,
            "margin_e_value": {
                "mean": m.margin_e_mean,
                "product": m.margin_e_product,
                "sidecars": m.margin_sidecars,
            },
            "net_loss_e_value": {
                "mean": m.net_loss_e_mean,
                "product": m.net_loss_e_product,
                "sidecars": m.net_loss_sidecars,
            },
            "categories": cats,
        }
    return {
        "window": FLEET_WINDOW,
        "alpha": stats.alpha,
        "margin": stats.margin,
        "generated_at": stats.generated_at,
        "bad_series": dict(stats.bad_series),
        "models": models,
    }


@dataclass(frozen=True, slots=True)
class FleetHealth:
    """The fleet exporter's own state: ``query_errors[reason]`` since start and the unix time of
    the last snapshot built from a successful query (``None`` before the first)."""

    query_errors: Mapping[str, int] = field(default_factory=dict)
    bad_series: Mapping[str, int] = field(default_factory=dict)
    last_success: float | None = None


def _fleet_rows(fam: _Families, stats: FleetStats) -> None:
    for name, m in sorted(stats.models.items()):
        fam.add(fc.FLEET_SIDECARS, (name,), m.sidecars)
        for category, s in sorted(m.summaries.items()):
            key = (name, category)
            fam.add(fc.FLEET_N, key, s.n)
            fam.add(fc.FLEET_LOST, key, s.lost)
            fam.add(fc.FLEET_GAINED, key, s.gained)
            fam.add(fc.FLEET_NET_LOSS, key, s.net_loss_ratio)
            fam.add(fc.FLEET_CI_LOWER, key, s.ci_lower)
            fam.add(fc.FLEET_CI_UPPER, key, s.ci_upper)
            fam.add(fc.FLEET_NON_INFERIORITY, key, s.non_inferiority_pass)
            fam.add(fc.FLEET_MCNEMAR_P, (*key, "two_sided"), s.p_two_sided)
            fam.add(fc.FLEET_MCNEMAR_P, (*key, "loss"), s.p_loss)
            fam.add(fc.FLEET_E_VALUE, (*key, "no_net_loss"), s.e_value)
        fam.add(fc.FLEET_MARGIN_E_VALUE, (name, "mean"), m.margin_e_mean)
        fam.add(fc.FLEET_MARGIN_E_VALUE, (name, "product"), m.margin_e_product)
        fam.add(fc.FLEET_NET_LOSS_E_VALUE, (name, "mean"), m.net_loss_e_mean)
        fam.add(fc.FLEET_NET_LOSS_E_VALUE, (name, "product"), m.net_loss_e_product)


#: ``() -> (latest FleetStats or None, FleetHealth)``.
FleetGetter = Callable[[], tuple[FleetStats | None, FleetHealth]]


class FleetCollector(Collector):
    """The fleet families (:data:`~specwatch.tools.fleet.catalogue.FLEET`) from ``get()`` →
    ``(latest FleetStats or None, FleetHealth)``. No I/O in :meth:`collect`."""

    def __init__(self, get: FleetGetter) -> None:
        self._get = get

    def describe(self) -> Iterator[Metric]:
        """The fleet families, without samples."""
        return _describe(fc.FLEET)

    def collect(self) -> Iterator[Metric]:
        """Yield the families of the latest fleet snapshot and the exporter's own counters."""
        stats, health = self._get()
        fam = _Families(fc.FLEET)
        if stats is not None:
            _fleet_rows(fam, stats)
        fam.add_counts(fc.FLEET_QUERY_ERRORS, health.query_errors)
        fam.add_counts(fc.FLEET_BAD_SERIES, health.bad_series)
        fam.add(fc.FLEET_LAST_SUCCESS, (), health.last_success)
        yield from fam.families(keep_empty=True)
