"""``doctor``'s reading order when one label is missing from every series (Prometheus outside
Kubernetes: no ``namespace``): that label leads as one line, the dashboard failures that select
on it are one counted line, failures with another cause keep their own lines."""

from __future__ import annotations

from specwatch.tools.doctor.command import Finding, triage


def _missing(metric: str, label: str, dash: str = "D") -> Finding:
    return Finding(
        "fail",
        "labels",
        f'{dash}: no series of {metric} has label {label!r}, so {label}=".*" selects nothing '
        f"(its labels: instance, job); panels: P",
    )


def test_missing_namespace_leads_and_its_panels_are_counted() -> None:
    """3 metrics without ``namespace`` on two dashboards -> one ``labels`` line first (counting 3
    metrics, naming both dashboards, saying how to set it outside Kubernetes); the 4 dashboard
    failures that select on ``namespace`` (3 queries, 1 variable) -> one line saying 4; the
    dashboard failure on another query and the rules failure keep their lines, after them."""
    findings = [
        Finding("fail", "rules", "no specwatch rule group is loaded"),
        _missing("a_total", "namespace", "D1"),
        _missing("b_total", "namespace", "D1"),
        _missing("c_total", "namespace", "D2"),
        *[
            Finding("fail", "dashboard", f'D1 / p{i}: no data for x{{namespace=".*"}}')
            for i in range(3)
        ],
        Finding("fail", "dashboard", "D2: $namespace has no value: label_values(up, namespace)"),
        Finding("fail", "dashboard", 'D2 / other: no data for y{job="j"}'),
        Finding("ok", "targets", "specwatch target t is up"),
    ]
    got = triage(findings)
    assert got[0] == Finding(
        "fail",
        "labels",
        "no series of 3 metrics has label 'namespace', which the dashboards select on (D1, D2); "
        "e.g. a_total; Prometheus outside Kubernetes? prometheus-operator sets 'namespace' "
        "there; else set it in the scrape config (static_configs: labels) or a relabeling",
    )
    assert got[1] == Finding(
        "fail",
        "dashboard",
        "4 dashboard queries and variables have no data: they follow from the missing label "
        "'namespace' above; fix it and run doctor again",
    )
    assert got[2:] == [
        Finding("fail", "rules", "no specwatch rule group is loaded"),
        Finding("fail", "dashboard", 'D2 / other: no data for y{job="j"}'),
        Finding("ok", "targets", "specwatch target t is up"),
    ]
