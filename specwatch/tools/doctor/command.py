"""``specwatch doctor --prometheus-url URL``: say why a specwatch dashboard would be empty.

Checks, each printed as one line ``OK|WARN|FAIL  check  message``:

* ``targets``: every specwatch target Prometheus knows (``job`` matching ``--specwatch-job``) is
  up; none at all is a failure;
* ``rules``: rule groups named ``specwatch*`` are loaded and healthy (and, with ``--rules FILE``,
  every group of that rules file / PrometheusRule);
* ``role``: every vLLM series (``vllm:num_requests_running``) carries a ``role`` label;
* ``selectors``: with ``--prometheus-object FILE`` (the Prometheus custom resource, e.g. from
  ``kubectl get prometheus -o yaml``) and ``--manifest FILE`` (PodMonitor, ServiceMonitor,
  PrometheusRule), each monitor's and rule's labels match the Prometheus object's selectors
  (kube-prometheus-stack selects on ``release: <release name>``);
* ``ports``: with ``--manifest``, each PodMonitor/ServiceMonitor endpoint's ``port`` names a
  container port / Service port of what it selects;
* ``ledger``: with ``--manifest``, a warning when the ledger directory is an ``emptyDir``;
* ``mirror``: with ``--manifest`` holding an Istio VirtualService or Gateway API HTTPRoute
  mirror, the share of live requests that reached specwatch's mirror listener over the last
  hour against each route's percentage (every Istio and Gateway API form): under half the
  smallest fails, short of it by more than the window's edges explain warns with the numbers;
* ``inhibit``: with ``--alertmanager-config FILE`` or ``--alertmanager-url URL``, each inhibit
  rule that selects specwatch's alerts compares (``equal``) only labels they carry;
* ``labels``: with ``--dashboard``, every label a panel's matcher needs exists on some series of
  the metric it selects;
* ``dashboard``: with ``--dashboard FILE`` (Grafana JSON), every panel query at the dashboard's
  default variable values returns data; a panel whose description says when it is empty is a
  warning, not a failure. A ``label_values`` query variable with no saved value takes the first
  value Prometheus returns for it (as Grafana opens the dashboard); none at all is a failure.

Without Prometheus too (:mod:`specwatch.tools.doctor.deployed`):

* ``filesystem``: with ``--config``, the ledger's filesystem (``/proc/self/mountinfo``, so run
  it in the container): a warning on a network (NFS, CIFS/SMB, ...), memory (tmpfs, ramfs) or
  container-layer filesystem;
* ``alertmanager``: with ``--config``, each ``alerting.urls`` entry's ``/api/v2/status``: a
  cluster of more peers than URLs listed is a Service in front of replicas (a warning);
* ``dashboard``: with ``--dashboard``, one exported for sharing (``__inputs``, ``${DS_...}``)
  instead of fit to provision is a warning;
* ``rule-range``: with ``--rules``, a range under 4 scrape intervals (Prometheus' targets, else
  the monitors' ``interval`` in ``--manifest``) is a warning;
* ``shutdown``: with ``--manifest``, specwatch as a native sidecar whose drain budget does not
  fit what the grace period leaves after the main containers' preStop is a warning.

Failures come first, the most upstream check first (the root cause on the first line); when no
specwatch target is up, the dashboard failures that follow are one line. ``$__rate_interval`` is
Grafana's: 4 × the targets' scrape interval (60s at 15 s).

Exit 0 when nothing failed, 1 when a check failed, 2 on unreadable input or a bad flag.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from specwatch.cli.args import (
    add_described_command,
    add_output_format,
    add_prometheus_url,
    output_format,
)
from specwatch.core.config import parse_duration
from specwatch.core.roles import Role
from specwatch.tools.doctor.fold import fold_missing_labels

if TYPE_CHECKING:  # aiohttp and the Prometheus client load when diagnosing, not for --help
    import aiohttp

#: A series every vLLM server exports (vllm-metrics.md: scheduler state gauges).
VLLM_PROBE = "vllm:num_requests_running"
#: The same for SGLang servers (its scheduler's running gauge, one series per TP rank).
SGLANG_PROBE = "sglang:num_running_reqs"


@dataclass(frozen=True, slots=True)
class Finding:
    """One check's result: ``status`` ``ok``, ``warn`` or ``fail``; ``check`` the check's name;
    ``message`` one sentence."""

    status: str
    check: str
    message: str


#: The jobs of the shipped deployments: prometheus-operator names a PodMonitor's job
#: ``<namespace>/<name>`` (``deploy/base``: ``<namespace>/vllm-pair``) and a ServiceMonitor's job
#: after the Service (``deploy/standalone``: ``specwatch``).
DEFAULT_SPECWATCH_JOB = ".*specwatch.*|.+/vllm-pair"


class InputError(ValueError):
    """An unreadable or malformed file given on the command line."""


# -- pure checks ---------------------------------------------------------------------------------


def check_targets(targets: Mapping[str, Any], job_pattern: str) -> list[Finding]:
    """Findings for ``/api/v1/targets`` data: each active target whose ``job`` fully matches
    ``job_pattern`` must have ``health == "up"``."""
    rx = re.compile(job_pattern)
    out: list[Finding] = []
    for t in targets.get("activeTargets", []):
        labels = t.get("labels", {})
        if not rx.fullmatch(str(labels.get("job", ""))):
            continue
        where = f"{labels.get('instance', t.get('scrapeUrl', '?'))} (job {labels.get('job')})"
        if t.get("health") == "up":
            out.append(Finding("ok", "targets", f"specwatch target {where} is up"))
        else:
            err = t.get("lastError") or t.get("health")
            out.append(Finding("fail", "targets", f"specwatch target {where} is down: {err}"))
    if not out:
        out.append(
            Finding(
                "fail",
                "targets",
                f"Prometheus has no target whose job matches {job_pattern!r}: check the "
                "ServiceMonitor/PodMonitor is selected (see the selectors check) or the scrape "
                "config",
            )
        )
    return out


def _require_targets_shape(targets: object, url: str) -> None:
    """Raise ``PromApiError("decode", ...)`` naming the URL unless ``targets`` has the shape of
    ``/api/v1/targets`` data (``activeTargets``: a list of objects whose ``labels`` is an object):
    the checks would otherwise report made-up targets."""
    from specwatch.core.logs import redact_url
    from specwatch.tools.prom_api import PromApiError

    active = targets.get("activeTargets") if isinstance(targets, dict) else None
    if not isinstance(active, list) or not all(
        isinstance(t, dict) and isinstance(t.get("labels", {}), dict) for t in active
    ):
        where = redact_url(url.rstrip("/") + "/api/v1/targets")
        raise PromApiError(
            "decode", f"{where}: malformed answer (not a targets list with activeTargets)"
        )


def _pod_specs(objects: Sequence[Mapping[str, Any]]) -> list[tuple[str, Mapping[str, Any], Any]]:
    """``(what, pod labels, pod spec)`` of each Deployment/StatefulSet/DaemonSet/Pod."""
    out: list[tuple[str, Mapping[str, Any], Any]] = []
    for o in objects:
        kind, meta = o.get("kind"), o.get("metadata") or {}
        if kind == "Pod":
            out.append((f"Pod {meta.get('name')}", meta.get("labels") or {}, o.get("spec") or {}))
        elif kind in ("Deployment", "StatefulSet", "DaemonSet"):
            tpl = (o.get("spec") or {}).get("template") or {}
            labels = (tpl.get("metadata") or {}).get("labels") or {}
            out.append((f"{kind} {meta.get('name')}", labels, tpl.get("spec") or {}))
    return out


def check_ports(objects: Sequence[Mapping[str, Any]]) -> list[Finding]:
    """Findings for the monitors among ``objects``: each PodMonitor endpoint's ``port`` must be
    the name of a container port of a workload (in ``objects``) its selector matches, each
    ServiceMonitor endpoint's ``port`` the name of a port of a Service it selects. A name that
    resolves to nothing is scraped by nobody, silently (prometheus-operator keeps no target)."""
    out: list[Finding] = []
    pods = _pod_specs(objects)
    services = [o for o in objects if o.get("kind") == "Service"]
    for m in objects:
        kind = m.get("kind")
        if kind not in ("PodMonitor", "ServiceMonitor"):
            continue
        spec = m.get("spec") or {}
        selector = spec.get("selector") or {}
        what = f"{kind} {(m.get('metadata') or {}).get('name')}"
        if kind == "PodMonitor":
            names = {
                str(p.get("name"))
                for _, labels, pod in pods
                if selector_matches(selector, labels)
                for c in pod.get("containers") or []
                for p in c.get("ports") or []
            }
            endpoints = spec.get("podMetricsEndpoints") or []
            where = "container port"
        else:
            names = {
                str(p.get("name"))
                for svc in services
                if selector_matches(selector, (svc.get("metadata") or {}).get("labels") or {})
                for p in (svc.get("spec") or {}).get("ports") or []
            }
            endpoints = spec.get("endpoints") or []
            where = "Service port"
        if not names:
            continue  # the workloads or Services are not among the files given
        for ep in endpoints:
            port = ep.get("port")
            if port is None:
                continue
            if port in names:
                out.append(Finding("ok", "ports", f"{what} port {port!r} names a {where}"))
            else:
                out.append(
                    Finding(
                        "fail",
                        "ports",
                        f"{what} port {port!r} names no {where} of what it selects "
                        f"(there: {', '.join(sorted(names))}): nothing is scraped there",
                    )
                )
    return out


#: Where the shipped image keeps the ledger (``ledger.path`` /var/lib/specwatch/ledger.sqlite).
LEDGER_DIR = "/var/lib/specwatch"


def check_ledger_volume(objects: Sequence[Mapping[str, Any]]) -> list[Finding]:
    """A warning for each workload whose container mounts an ``emptyDir`` at
    :data:`LEDGER_DIR`: the paired-outcome ledger survives container restarts but not the pod
    (a rollout, an eviction or a node drain wipes every pair)."""
    out: list[Finding] = []
    for what, _, pod in _pod_specs(objects):
        volumes = {str(v.get("name")): v for v in pod.get("volumes") or []}
        for c in pod.get("containers") or []:
            for mount in c.get("volumeMounts") or []:
                if str(mount.get("mountPath", "")).rstrip("/") != LEDGER_DIR:
                    continue
                vol = volumes.get(str(mount.get("name")), {})
                if "emptyDir" in vol:
                    out.append(
                        Finding(
                            "warn",
                            "ledger",
                            f"{what} keeps the ledger ({LEDGER_DIR}) on emptyDir "
                            f"{mount.get('name')!r}: a new pod starts with no pairs; mount a "
                            "PersistentVolumeClaim there to keep them",
                        )
                    )
                else:
                    out.append(
                        Finding("ok", "ledger", f"{what} keeps the ledger on a lasting volume")
                    )
    return out


def scrape_seconds(targets: Mapping[str, Any], job_pattern: str) -> float:
    """The longest ``scrapeInterval`` of the specwatch targets (``job`` fully matching
    ``job_pattern``) in ``/api/v1/targets`` data: the interval Grafana's ``$__rate_interval``
    must cover; :data:`GRAFANA_SCRAPE_SECONDS` when none reports one."""
    rx = re.compile(job_pattern)
    found = [
        parse_duration(str(t["scrapeInterval"]))
        for t in targets.get("activeTargets", [])
        if rx.fullmatch(str(t.get("labels", {}).get("job", ""))) and t.get("scrapeInterval")
    ]
    return max(found, default=GRAFANA_SCRAPE_SECONDS)


def check_rules(rules: Mapping[str, Any], expected: Sequence[str]) -> list[Finding]:
    """Findings for ``/api/v1/rules`` data: ``specwatch*`` groups loaded, every group named in
    ``expected`` present, and no rule with ``health != "ok"``."""
    groups = {g.get("name", ""): g for g in rules.get("groups", [])}
    ours = sorted(n for n in groups if n.startswith("specwatch"))
    out: list[Finding] = []
    if not ours:
        out.append(
            Finding(
                "fail",
                "rules",
                "no specwatch rule group is loaded: recording rules behind the dashboards are "
                "missing (PrometheusRule not selected, or rule_files not set)",
            )
        )
    for name in expected:
        if name not in groups:
            out.append(Finding("fail", "rules", f"rule group {name} is not loaded"))
    for name in ours:
        bad = [r for r in groups[name].get("rules", []) if r.get("health", "ok") != "ok"]
        for r in bad:
            out.append(
                Finding(
                    "fail",
                    "rules",
                    f"rule {r.get('name')} in group {name} is unhealthy: {r.get('lastError')}",
                )
            )
        if not bad:
            out.append(Finding("ok", "rules", f"rule group {name} is loaded"))
    return out


def check_roles(rows: Sequence[tuple[Mapping[str, str], float]]) -> list[Finding]:
    """Findings for the :data:`VLLM_PROBE` and :data:`SGLANG_PROBE` series: each must carry
    ``role`` with a known value (one finding per job and instance)."""
    known = {r.value for r in Role}
    out: list[Finding] = []
    seen: set[tuple[str, str]] = set()
    for labels, _ in rows:
        key = (labels.get("job", ""), labels.get("instance", ""))
        if key in seen:
            continue
        seen.add(key)
        engine = "SGLang" if labels.get("__name__", "").startswith("sglang:") else "vLLM"
        where = f"{engine} target {key[1]} (job {key[0]})"
        role = labels.get("role")
        if role is None:
            out.append(
                Finding(
                    "fail",
                    "role",
                    f"{where} has no role label: the per-role panels and rules drop it "
                    "(add a relabeling that sets role: standard|fly)",
                )
            )
        elif role not in known:
            out.append(
                Finding("fail", "role", f"{where} has role={role!r}, not one of {sorted(known)}")
            )
        else:
            out.append(Finding("ok", "role", f"{where} has role={role}"))
    if not rows:
        out.append(
            Finding(
                "warn",
                "role",
                f"Prometheus has no {VLLM_PROBE} or {SGLANG_PROBE} series"
                " (no vLLM or SGLang target)",
            )
        )
    return out


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Kubernetes label-selector semantics as prometheus-operator applies them: ``None`` (the
    field absent) matches nothing, ``{}`` matches everything; ``matchLabels`` and
    ``matchExpressions`` (``In``, ``NotIn``, ``Exists``, ``DoesNotExist``) must all hold."""
    if selector is None:
        return False
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != str(v):
            return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e.get("key"), e.get("operator"), [str(v) for v in e.get("values") or []]
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


_SELECTOR_FIELD = {
    "ServiceMonitor": "serviceMonitorSelector",
    "PodMonitor": "podMonitorSelector",
    "PrometheusRule": "ruleSelector",
}


def _namespace_ok(prom: Mapping[str, Any], field: str, namespace: str | None) -> str | None:
    """Why the object's namespace is not selected, or ``None`` when it is (or cannot be told)."""
    spec = prom.get("spec") or {}
    own = (prom.get("metadata") or {}).get("namespace")
    ns_field = field.replace("Selector", "NamespaceSelector")
    ns_sel = spec.get(ns_field)
    if ns_sel is None:
        if namespace is not None and own is not None and namespace != own:
            return (
                f"it is in namespace {namespace} but {ns_field} is unset, so only namespace "
                f"{own} is watched"
            )
        return None
    wanted = (ns_sel.get("matchLabels") or {}).get("kubernetes.io/metadata.name")
    if wanted is not None and namespace is not None and wanted != namespace:
        return f"its namespace {namespace} is not selected (namespace selector wants {wanted})"
    return None


def check_selectors(prom: Mapping[str, Any], objects: Sequence[Mapping[str, Any]]) -> list[Finding]:
    """Findings for each PodMonitor/ServiceMonitor/PrometheusRule in ``objects`` against the
    Prometheus custom resource ``prom``: its labels must match the matching selector (an unset
    selector selects nothing) and its namespace must be watched."""
    spec = prom.get("spec") or {}
    pname = (prom.get("metadata") or {}).get("name", "?")
    out: list[Finding] = []
    for obj in objects:
        kind = str(obj.get("kind", ""))
        field = _SELECTOR_FIELD.get(kind)
        if field is None:
            continue
        meta = obj.get("metadata") or {}
        what = f"{kind} {meta.get('name', '?')}"
        labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
        selector = spec.get(field)
        if not selector_matches(selector, labels):
            if selector is None:
                why = f"Prometheus {pname} has no {field}, which selects nothing"
            else:
                need = selector.get("matchLabels") or {}
                missing = {k: v for k, v in need.items() if labels.get(k) != str(v)}
                why = f"its labels do not match Prometheus {pname}'s {field}" + (
                    f" (needs {missing})" if missing else f" ({selector})"
                )
            out.append(Finding("fail", "selectors", f"{what} is not selected: {why}"))
            continue
        ns_problem = _namespace_ok(prom, field, meta.get("namespace"))
        if ns_problem is not None:
            out.append(Finding("fail", "selectors", f"{what} is not selected: {ns_problem}"))
            continue
        out.append(Finding("ok", "selectors", f"{what} is selected by Prometheus {pname}"))
    return out


#: Grafana's Prometheus data source scrape interval when nothing else is known (its default).
GRAFANA_SCRAPE_SECONDS = 15.0


def grafana_builtins(scrape_seconds: float = GRAFANA_SCRAPE_SECONDS) -> dict[str, str]:
    """Grafana's built-in variables for a panel on the default 1 h range, for a data source whose
    scrape interval is ``scrape_seconds``: ``$__interval`` is the scrape interval (the data
    source's minimum interval) and ``$__rate_interval`` is Grafana's
    ``max($__interval + scrape interval, 4 × scrape interval)``: 60 s at a 15 s scrape."""
    interval = scrape_seconds
    rate = max(interval + scrape_seconds, 4 * scrape_seconds)
    return {
        "__rate_interval": f"{rate:g}s",
        "__interval": f"{interval:g}s",
        "__range": "1h",
        "__range_s": "3600",
        "__interval_ms": f"{interval * 1000:g}",
    }


_BUILTINS = grafana_builtins()


#: A Grafana Prometheus query variable: ``label_values(LABEL)``, ``label_values(SELECTOR, LABEL)``.
_LABEL_VALUES = re.compile(
    r"\s*label_values\(\s*(?:(?P<selector>.+?)\s*,\s*)?(?P<label>[a-zA-Z_]\w*)\s*\)\s*", re.S
)


def _variable_defaults(dashboard: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for var in (dashboard.get("templating") or {}).get("list", []):
        name = var.get("name")
        current = (var.get("current") or {}).get("value")
        if isinstance(current, list):
            current = "|".join(str(c) for c in current)
        if current in (None, "", "$__all"):
            options = var.get("options") or []
            current = options[0].get("value") if options else ".*"
            if current == "$__all":
                current = ".*"
        if name:
            out[str(name)] = str(current)
    return out


def _substitute(expr: str, values: Mapping[str, str]) -> str:
    """``expr`` with ``$var``/``${var}``/``[[var]]`` replaced from ``values`` (others kept)."""

    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        return values.get(name, m.group(0))

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)", repl, expr)


def unset_query_variables(dashboard: Mapping[str, Any]) -> list[tuple[str, str, str | None]]:
    """``(name, label, selector or None)`` of each ``label_values`` query variable that has no
    current value and no "All" option, in the dashboard's order. Grafana shows such a variable at
    the first value its query returns, so its default is only known from Prometheus; the selector
    may name earlier variables (``$namespace``), to be substituted before the query is sent."""
    out: list[tuple[str, str, str | None]] = []
    for var in (dashboard.get("templating") or {}).get("list", []):
        current = (var.get("current") or {}).get("value")
        if var.get("type") != "query" or var.get("includeAll") or current not in (None, "", []):
            continue
        query = var.get("query")
        if isinstance(query, Mapping):
            query = query.get("query")
        m = _LABEL_VALUES.fullmatch(query) if isinstance(query, str) else None
        if m is not None and var.get("name"):
            out.append((str(var["name"]), m.group("label"), m.group("selector")))
    return out


def dashboard_queries(
    dashboard: Mapping[str, Any],
    resolved: Mapping[str, str] | None = None,
    builtins: Mapping[str, str] = _BUILTINS,
) -> Iterator[tuple[str, str, str]]:
    """``(panel title, panel description, PromQL)`` for every Prometheus target of every panel
    (rows' nested panels included), with ``$var``/``${var}``/``[[var]]`` replaced by the
    variable's default value (``resolved`` first: values looked up in Prometheus for variables
    without a default) and Grafana's built-ins by ``builtins`` (:func:`grafana_builtins`)."""
    values = {**builtins, **_variable_defaults(dashboard), **(resolved or {})}

    def substitute(expr: str) -> str:
        return _substitute(expr, values)

    def panels(items: Sequence[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
        for p in items:
            yield p
            yield from panels(p.get("panels") or [])

    for p in panels(dashboard.get("panels") or []):
        for t in p.get("targets") or []:
            expr = t.get("expr")
            if isinstance(expr, str) and expr.strip():
                yield str(p.get("title", "?")), str(p.get("description", "")), substitute(expr)


# -- I/O ---------------------------------------------------------------------------------------


def _load_docs(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise InputError(f"{path}: cannot read: {exc}") from exc
    out: list[dict[str, Any]] = []
    for d in docs:
        if isinstance(d, dict) and d.get("kind") == "List":
            out.extend(i for i in d.get("items") or [] if isinstance(i, dict))
        elif isinstance(d, dict):
            out.append(d)
        else:
            raise InputError(f"{path}: not a Kubernetes object or rules file")
    return out


def _rule_group_names(paths: Sequence[Path]) -> list[str]:
    names: list[str] = []
    for path in paths:
        for doc in _load_docs(path):
            groups = doc.get("groups") or (doc.get("spec") or {}).get("groups") or []
            names += [str(g["name"]) for g in groups if isinstance(g, dict) and "name" in g]
    return names


def _load_dashboard(path: Path) -> dict[str, Any]:
    try:
        dash = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{path}: cannot read dashboard JSON: {exc}") from exc
    except RecursionError:
        raise InputError(f"{path}: cannot read dashboard JSON: nested too deep") from None
    if isinstance(dash, dict) and "dashboard" in dash:
        dash = dash["dashboard"]
    if not isinstance(dash, dict):
        raise InputError(f"{path}: not a Grafana dashboard")
    dash.setdefault("title", path.name)
    return dash


@dataclass(frozen=True, slots=True)
class Inputs:
    """What the files on the command line hold, read before any query: rule group names to
    expect, the Prometheus custom resource (or ``None``), the monitoring objects, dashboards."""

    expected_groups: list[str]
    prometheus_object: dict[str, Any] | None
    objects: list[dict[str, Any]]
    dashboards: list[dict[str, Any]]
    alertmanager_config: dict[str, Any] | None = None
    rule_docs: tuple[dict[str, Any], ...] = ()


def read_inputs(args: argparse.Namespace) -> Inputs:
    """Read ``--rules``, ``--prometheus-object``, ``--manifest`` and ``--dashboard`` files;
    raises :class:`InputError` naming the file that is unreadable or malformed."""
    prom_obj: dict[str, Any] | None = None
    if args.prometheus_object is not None:
        found = [o for o in _load_docs(args.prometheus_object) if o.get("kind") == "Prometheus"]
        if not found:
            raise InputError(f"{args.prometheus_object}: no object of kind Prometheus")
        prom_obj = found[0]
    return Inputs(
        expected_groups=_rule_group_names(args.rules),
        prometheus_object=prom_obj,
        objects=[o for p in args.manifest for o in _load_docs(p)],
        dashboards=[_load_dashboard(p) for p in args.dashboard],
        alertmanager_config=_load_alertmanager_config(getattr(args, "alertmanager_config", None)),
        rule_docs=tuple(d for p in args.rules for d in _load_docs(p)),
    )


def _load_alertmanager_config(path: Path | None) -> dict[str, Any] | None:
    if path is None:
        return None
    docs = _load_docs(path)
    if len(docs) != 1:
        raise InputError(f"{path}: not an Alertmanager configuration")
    return docs[0]


async def _dashboard_findings(
    session: aiohttp.ClientSession,
    url: str,
    dash: Mapping[str, Any],
    limit_s: float,
    builtins: Mapping[str, str] = _BUILTINS,
) -> list[Finding]:
    from specwatch.tools.prom_api import PromApiError, api_get, instant_query

    title = dash["title"]
    out: list[Finding] = []
    resolved: dict[str, str] = {}
    for name, label, selector in unset_query_variables(dash):
        # Grafana opens the dashboard at the first value of the variable's query.
        values = {**builtins, **_variable_defaults(dash), **resolved}
        params = {} if selector is None else {"match[]": _substitute(selector, values)}
        shown = f"label_values({', '.join([*params.values(), label])})"
        try:
            found = await api_get(
                session, url, f"/api/v1/label/{label}/values", params, limit_s=limit_s
            )
        except PromApiError as exc:
            out.append(Finding("fail", "dashboard", f"{title}: ${name}: {shown} failed ({exc})"))
            continue
        if isinstance(found, list) and found:
            resolved[name] = str(found[0])
        else:
            out.append(
                Finding("fail", "dashboard", f"{title}: ${name} has no value: {shown} is empty")
            )
    for panel, description, expr in dashboard_queries(dash, resolved, builtins):
        where = f"{title} / {panel}"
        try:
            rows = await instant_query(session, url, expr, limit_s=limit_s)
        except PromApiError as exc:
            out.append(Finding("fail", "dashboard", f"{where}: query failed ({exc}): {expr}"))
            continue
        if rows:
            out.append(Finding("ok", "dashboard", f"{where}: {len(rows)} series"))
        elif "empty" in description.lower():
            out.append(Finding("warn", "dashboard", f"{where}: no data ({description})"))
        else:
            out.append(Finding("fail", "dashboard", f"{where}: no data for {expr}"))
    return out


async def diagnose(
    url: str, inputs: Inputs, *, job_pattern: str, limit_s: float, alertmanager_url: str = ""
) -> list[Finding]:
    """Run every check against the Prometheus at ``url`` (a failed API call is one ``fail``
    finding for check ``prometheus`` and ends the run)."""
    import aiohttp

    from specwatch.tools.doctor.deployed import rule_range_findings
    from specwatch.tools.doctor.stack import inhibit_findings, label_findings, mirror_findings
    from specwatch.tools.prom_api import PromApiError, api_get, instant_query

    out: list[Finding] = []
    async with aiohttp.ClientSession() as session:
        try:
            targets = await api_get(
                session, url, "/api/v1/targets", {"state": "active"}, limit_s=limit_s
            )
            _require_targets_shape(targets, url)
            out += check_targets(targets, job_pattern)
            builtins = grafana_builtins(scrape_seconds(targets, job_pattern))
            ranges = rule_range_findings(inputs.rule_docs, scrape_seconds(targets, job_pattern))
            out += [Finding(*r) for r in ranges]
            rules = await api_get(session, url, "/api/v1/rules", limit_s=limit_s)
            out += check_rules(rules, inputs.expected_groups)
            probes = [
                row
                for probe in (VLLM_PROBE, SGLANG_PROBE)
                for row in await instant_query(session, url, probe, limit_s=limit_s)
            ]
            out += check_roles(probes)
        except PromApiError as exc:
            out.append(Finding("fail", "prometheus", f"cannot query {url}: {exc}"))
            return out
        labels_of: dict[str, list[str]] = {}
        for dash in inputs.dashboards:
            out += await _dashboard_findings(session, url, dash, limit_s, builtins)
            queries = [(p, e) for p, _, e in dashboard_queries(dash, None, builtins)]
            found = await label_findings(session, url, dash["title"], queries, labels_of, limit_s)
            out += [Finding(*f) for f in found]
        if inputs.alertmanager_config is not None or alertmanager_url:
            found = await inhibit_findings(
                session,
                url,
                inputs.alertmanager_config,
                alertmanager_url,
                rules,
                limit_s,
            )
            out += [Finding(*f) for f in found]
    if inputs.prometheus_object is not None:
        out += check_selectors(inputs.prometheus_object, inputs.objects)
    elif inputs.objects:
        out.append(
            Finding(
                "warn", "selectors", "--manifest given without --prometheus-object: not checked"
            )
        )
    out += check_ports(inputs.objects)
    async with aiohttp.ClientSession() as session:
        found = await mirror_findings(session, url, inputs.objects, job_pattern, limit_s)
    out += [Finding(*f) for f in found]
    out += check_ledger_volume(inputs.objects)
    return out


def config_findings(path: Path, limit_s: float = 10.0) -> list[Finding]:
    """The whole-configuration checks of the config file at ``path``
    (:func:`specwatch.server.checks.check_settings`) as findings of check ``config``: an error
    fails, a warning warns; a file that does not load raises :class:`InputError`."""
    from specwatch.server.checks import check_settings
    from specwatch.settings import ConfigError, load_settings
    from specwatch.tools.doctor.deployed import deployment_rows

    try:
        settings = load_settings(config_file=path)
    except ConfigError as exc:
        raise InputError(f"--config {path}: {exc}") from None
    found = [
        Finding("fail" if f.level == "error" else "warn", "config", f"{f.setting}: {f.message}")
        for f in check_settings(settings)
    ]
    found = found or [Finding("ok", "config", f"{path}: no check is blind")]
    return found + [Finding(*r) for r in deployment_rows(settings, limit_s)]


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``doctor``."""
    p = add_described_command(
        subparsers,
        "doctor",
        help="say why a specwatch dashboard would be empty",
        description=__doc__,
    )
    add_prometheus_url(p, required=False)
    p.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="check this specwatch config file as a whole (blind arm combinations)",
    )
    p.add_argument(
        "--specwatch-job",
        default=DEFAULT_SPECWATCH_JOB,
        metavar="REGEX",
        help=f"job label of specwatch targets (default {DEFAULT_SPECWATCH_JOB})",
    )
    p.add_argument("--rules", type=Path, action="append", default=[], metavar="FILE")
    p.add_argument("--manifest", type=Path, action="append", default=[], metavar="FILE")
    p.add_argument("--prometheus-object", type=Path, metavar="FILE")
    p.add_argument("--dashboard", type=Path, action="append", default=[], metavar="FILE")
    p.add_argument(
        "--alertmanager-config",
        type=Path,
        metavar="FILE",
        help="Alertmanager configuration whose inhibit rules to check",
    )
    p.add_argument(
        "--alertmanager-url",
        default="",
        metavar="URL",
        help="live Alertmanager whose inhibit rules to check (/api/v2/status)",
    )
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per query")
    add_output_format(p)
    p.set_defaults(handler=main)


#: Checks from upstream to downstream: a failure upstream explains failures below it.
CHECK_ORDER: tuple[str, ...] = (
    "config",
    "prometheus",
    "ports",
    "targets",
    "selectors",
    "rules",
    "role",
    "ledger",
    "mirror",
    "inhibit",
    "labels",
    "dashboard",
)


def triage(findings: Sequence[Finding]) -> list[Finding]:
    """``findings`` as the operator should read them: failures first, the most upstream check
    (:data:`CHECK_ORDER`) first, so the root cause is the first line; when no specwatch target is
    up (the targets check has no ``ok``), the dashboard failures follow from that and become one
    line counting them; identical findings (a panel with several queries) are one line with a
    count; then warnings, then the checks that passed."""
    rank = {c: i for i, c in enumerate(CHECK_ORDER)}
    no_sidecar = any(f.check == "targets" and f.status == "fail" for f in findings) and not any(
        f.check == "targets" and f.status == "ok" for f in findings
    )
    counts: dict[Finding, int] = {}
    for f in findings:
        counts[f] = counts.get(f, 0) + 1
    unique = [
        f if n == 1 else Finding(f.status, f.check, f"{f.message} (x{n})")
        for f, n in counts.items()
    ]
    follow = [f for f in unique if no_sidecar and f.check == "dashboard" and f.status == "fail"]
    rest = [f for f in unique if f not in follow]
    if follow:
        rest.append(
            Finding(
                "fail",
                "dashboard",
                f"{len(follow)} dashboard queries have no data: they follow from the targets "
                "failure above (no specwatch target is up); fix it and run doctor again",
            )
        )
    rest, first = fold_missing_labels(rest, Finding)
    severity = {"fail": 0, "warn": 1, "ok": 2}
    ordered = sorted(rest, key=lambda f: (severity.get(f.status, 1), rank.get(f.check, len(rank))))
    return first + ordered


def main(args: argparse.Namespace) -> int:
    """Print the findings; 0 when none failed, 1 when one did, 2 on bad input."""
    files = args.dashboard or args.rules or args.manifest
    if args.config is None and args.prometheus_url is None and not files:
        print("specwatch doctor: give --prometheus-url URL, --config FILE or both", file=sys.stderr)
        return 2
    from specwatch.tools.doctor.deployed import file_rows

    try:
        inputs = read_inputs(args)
        findings = config_findings(args.config, args.timeout) if args.config is not None else []
    except InputError as exc:
        print(f"specwatch doctor: {exc}", file=sys.stderr)
        return 2
    objects = [*inputs.objects, *([inputs.prometheus_object] if inputs.prometheus_object else [])]
    rows = file_rows(
        inputs.dashboards, inputs.rule_docs, objects, offline=args.prometheus_url is None
    )
    findings += [Finding(*r) for r in rows]
    if args.prometheus_url is not None:
        findings += asyncio.run(
            diagnose(
                args.prometheus_url,
                inputs,
                job_pattern=args.specwatch_job,
                limit_s=args.timeout,
                alertmanager_url=args.alertmanager_url,
            )
        )
    findings = triage(findings)
    if output_format(args.format) == "json":
        print(
            json.dumps(
                [{"status": f.status, "check": f.check, "message": f.message} for f in findings],
                indent=2,
            )
        )
    else:
        for f in findings:
            print(f"{f.status.upper():<4}  {f.check:<10} {f.message}")
    return 1 if any(f.status == "fail" for f in findings) else 0
