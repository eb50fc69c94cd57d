"""``specwatch doctor``'s checks of the operator's own stack: pure checks (values in, findings
out) and the lookups in Prometheus / Alertmanager that feed them.

* ``inhibit``: an Alertmanager inhibit rule that can select specwatch's alerts on both sides
  (its ``source``/``target`` matchers) but whose ``equal`` names a label no specwatch alert
  carries. Alertmanager compares a missing label as the empty string, so such a rule lets a
  specwatch alert of one cluster/namespace/... inhibit another's, or never inhibits when the
  other side's alerts carry the label.
* ``labels``: a dashboard query whose label matcher (``{container="vllm"}``) names a label that
  no series of that metric has in Prometheus: the selector can never match, so the panel stays
  empty whatever the data.

The findings are :class:`specwatch.tools.doctor.command.Finding`-shaped ``(status, check, message)``
tuples; :mod:`specwatch.tools.doctor.command` wraps them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import aiohttp
import yaml

from specwatch.alerts.alert import Severity
from specwatch.tools.prom_api import PromApiError, api_get, instant_query

#: ``(status, check, message)``, as :class:`specwatch.tools.doctor.command.Finding` takes them.
Found = tuple[str, str, str]

#: A selector: optional metric name, then ``{...}`` (no nested braces in PromQL selectors).
_SELECTOR = re.compile(r"(?<![\w:])([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*\{([^{}]*)\}")
#: One PromQL label matcher inside a selector.
_PROMQL_MATCHER = re.compile(r'([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
#: One Alertmanager matcher string (``severity="critical"``, ``team=~"a|b"``, unquoted values).
_AM_MATCHER = re.compile(
    r'\s*\{?\s*([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*(?:"((?:[^"\\]|\\.)*)"|([^,}]*?))\s*\}?\s*'
)


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", r"\1", value)


def _matches(op: str, pattern: str, value: str) -> bool:
    """Whether matcher ``op pattern`` accepts label value ``value`` (``""``: label absent)."""
    if op in ("=", "!="):
        return (value == pattern) == (op == "=")
    try:
        hit = re.fullmatch(pattern, value) is not None
    except re.error:
        return True  # cannot judge: assume it may match
    return hit == (op == "=~")


def promql_matchers(expr: str) -> list[tuple[str, str, str, str]]:
    """``(metric, label, op, value)`` for each label matcher of each selector in ``expr`` that
    names its metric (by name or ``__name__="..."``); ``__name__`` itself is left out."""
    out: list[tuple[str, str, str, str]] = []
    for m in _SELECTOR.finditer(expr):
        found = [(n, op, _unescape(v)) for n, op, v in _PROMQL_MATCHER.findall(m.group(2))]
        metric = m.group(1) or next((v for n, op, v in found if n == "__name__" and op == "="), "")
        if metric and metric not in ("by", "without", "on", "ignoring"):
            out += [(metric, n, op, v) for n, op, v in found if n != "__name__"]
    return out


def check_dashboard_labels(
    title: str,
    queries: Iterable[tuple[str, str]],
    labels_of: Mapping[str, Sequence[str]],
) -> list[Found]:
    """Findings for one dashboard: ``queries`` are ``(panel title, PromQL)``; ``labels_of`` maps
    a metric to the label names its series have in Prometheus (a metric with no series is not
    judged: the panel's own no-data finding covers it). A matcher that needs its label to be
    present (one that does not accept the empty value) on a label no series has is a failure,
    one line per metric and label naming the panels."""
    missing: dict[tuple[str, str, str], list[str]] = {}
    for panel, expr in queries:
        for metric, label, op, value in promql_matchers(expr):
            have = labels_of.get(metric)
            if not have or label in have or _matches(op, value, ""):
                continue
            panels = missing.setdefault((metric, label, f'{label}{op}"{value}"'), [])
            if panel not in panels:
                panels.append(panel)
    out: list[Found] = []
    for (metric, label, shown, panels), have in (
        ((k[0], k[1], k[2], v), labels_of[k[0]]) for k, v in missing.items()
    ):
        out.append(
            (
                "fail",
                "labels",
                f"{title}: no series of {metric} has label {label!r}, so {shown} selects "
                f"nothing (its labels: {', '.join(sorted(have))}); panels: {', '.join(panels)}",
            )
        )
    return out


def _am_matchers(rule: Mapping[str, Any], side: str) -> list[tuple[str, str, str]] | None:
    """``(label, op, value)`` of one side (``source``/``target``) of an inhibit rule, from
    ``<side>_matchers`` and the older ``<side>_match`` / ``<side>_match_re``; ``None`` when a
    matcher string cannot be read."""
    out: list[tuple[str, str, str]] = []
    for text in rule.get(f"{side}_matchers") or []:
        m = _AM_MATCHER.fullmatch(str(text))
        if m is None:
            return None
        value = _unescape(m.group(3)) if m.group(3) is not None else m.group(4)
        out.append((m.group(1), m.group(2), value))
    out += [(str(k), "=", str(v)) for k, v in (rule.get(f"{side}_match") or {}).items()]
    out += [(str(k), "=~", str(v)) for k, v in (rule.get(f"{side}_match_re") or {}).items()]
    return out


def _may_select(
    matchers: Sequence[tuple[str, str, str]], carried: Mapping[str, Sequence[str] | None]
) -> bool:
    """Whether some specwatch alert may satisfy every matcher: ``carried`` maps each label its
    alerts carry to its known values (``None``: any value)."""
    for label, op, value in matchers:
        if label not in carried:
            if not _matches(op, value, ""):
                return False
            continue
        known = carried[label]
        if known is not None and not any(_matches(op, value, v) for v in known):
            return False
    return True


def check_inhibit_rules(
    config: Mapping[str, Any], carried: Mapping[str, Sequence[str] | None], source: str
) -> list[Found]:
    """Findings for the ``inhibit_rules`` of an Alertmanager ``config`` (read from ``source``):
    a rule whose both sides may select specwatch alerts (``carried``: the labels they carry, with
    known values or ``None``) and whose ``equal`` names labels outside ``carried`` is a failure;
    rules that cannot select specwatch alerts are not judged."""
    rules = config.get("inhibit_rules") or []
    if not isinstance(rules, list):
        return [("fail", "inhibit", f"{source}: inhibit_rules is not a list")]
    out: list[Found] = []
    for i, rule in enumerate(rules, start=1):
        if not isinstance(rule, Mapping):
            out.append(("fail", "inhibit", f"{source}: inhibit rule {i} is not a mapping"))
            continue
        sides = [_am_matchers(rule, s) for s in ("source", "target")]
        if any(s is None for s in sides):
            out.append(("warn", "inhibit", f"{source}: inhibit rule {i}: cannot read matchers"))
            continue
        if not all(_may_select(s or [], carried) for s in sides):
            continue
        equal = [str(e) for e in rule.get("equal") or []]
        absent = [e for e in equal if e not in carried]
        if absent:
            out.append(
                (
                    "fail",
                    "inhibit",
                    f"{source}: inhibit rule {i} (equal: {', '.join(equal)}) selects specwatch "
                    f"alerts, which carry no {', '.join(absent)}: Alertmanager compares a "
                    "missing label as empty, so one specwatch alert inhibits others across every "
                    f"{absent[0]} (or never, where the other side carries it); drop "
                    f"{', '.join(absent)} from equal or add it to specwatch's alerts "
                    "(alerting.external_labels, or the Prometheus external labels)",
                )
            )
        else:
            out.append(("ok", "inhibit", f"{source}: inhibit rule {i}: equal labels carried"))
    return out


#: The destination label and replacement of a ``label_replace`` after its first argument.
_REPLACE_ARGS = re.compile(r'\s*,\s*"((?:[^"\\]|\\.)*)"\s*,\s*"((?:[^"\\]|\\.)*)"')


def label_replace_labels(expr: str) -> dict[str, list[str] | None]:
    """The labels every ``label_replace(v, "dst", "replacement", ...)`` of ``expr`` sets, with
    their values (``None`` where the replacement refers to a capture group, so any value):
    the labels an alerting rule adds that no series has, e.g. ``scope`` on SpecAcceptanceDrop.
    The first argument is skipped by its brackets (those in quoted strings ignored)."""
    out: dict[str, list[str] | None] = {}
    for m in re.finditer(r"\blabel_replace\s*\(", expr):
        depth, i, quote = 1, m.end(), False
        while i < len(expr) and not (depth == 1 and expr[i] == "," and not quote):
            c = expr[i]
            if c == '"' and expr[i - 1] != "\\":
                quote = not quote
            elif not quote and c in "([{":
                depth += 1
            elif not quote and c in ")]}":
                depth -= 1
            i += 1
        args = _REPLACE_ARGS.match(expr, i)
        if args is None:
            continue
        label, value = args.group(1), _unescape(args.group(2))
        known = out.get(label, [])
        if "$" in value or known is None:
            out[label] = None
        else:
            out[label] = sorted({*known, value})
    return out


def rule_labels(rules: Mapping[str, Any]) -> dict[str, list[str] | None]:
    """The labels the alerting rules of the ``specwatch*`` groups of ``rules`` (Prometheus's
    ``/api/v1/rules`` answer) give their alerts besides ``severity``, whether or not one fires:
    each rule's ``labels``, those of its active ``alerts`` and those its expression (``query``)
    sets with ``label_replace`` (:func:`label_replace_labels`, values where known)."""
    out: dict[str, list[str] | None] = {}

    def add(label: str, values: list[str] | None) -> None:
        known = out.get(label, [])
        out[label] = None if values is None or known is None else sorted({*known, *values})

    for group in rules.get("groups") or []:
        if not str(group.get("name", "")).startswith("specwatch"):
            continue
        for rule in group.get("rules") or []:
            for labels in [rule.get("labels") or {}] + [
                a.get("labels") or {} for a in rule.get("alerts") or []
            ]:
                for k in labels:
                    if k != "severity":
                        add(str(k), None)
            expr = rule.get("query") or rule.get("expr") or ""
            for label, values in label_replace_labels(str(expr)).items():
                add(label, values)
    return out


# -- lookups ------------------------------------------------------------------------------------


async def _alertmanager_config(
    session: aiohttp.ClientSession, url: str, limit_s: float
) -> dict[str, Any]:
    """The live Alertmanager's configuration (``/api/v2/status``'s ``config.original``)."""
    where = url.rstrip("/") + "/api/v2/status"
    try:
        async with session.get(where, timeout=aiohttp.ClientTimeout(total=limit_s)) as resp:
            body = await resp.json(content_type=None)
        text = body["config"]["original"]
        config = yaml.safe_load(text)
    except (TimeoutError, aiohttp.ClientError, ValueError, KeyError, TypeError) as exc:
        raise PromApiError("connect", f"{where}: no configuration ({exc})") from exc
    except yaml.YAMLError as exc:
        raise PromApiError("decode", f"{where}: configuration is not YAML") from exc
    if not isinstance(config, dict):
        raise PromApiError("decode", f"{where}: configuration is not a mapping")
    return config


async def _carried_labels(
    session: aiohttp.ClientSession,
    url: str,
    rules: Mapping[str, Any],
    job_pattern: str,
    limit_s: float,
) -> dict[str, list[str] | None]:
    """The labels specwatch's alerts may carry, with known values (``None``: any): the labels
    of specwatch's series (rule alerts keep theirs; the sidecar's carry ``target``, ``role``,
    ``model_name``, also on its series), the labels of the ``specwatch*`` alerting rules
    (:func:`rule_labels`: their own, their firing alerts', and those ``label_replace`` sets in
    their expressions, so ``scope`` / ``reason`` count before any such alert fires),
    Prometheus's external labels, ``alertname`` and ``severity``."""
    names = await api_get(
        session, url, "/api/v1/labels", {"match[]": f'{{job=~"{job_pattern}"}}'}, limit_s=limit_s
    )
    carried: dict[str, list[str] | None] = {str(n): None for n in names or [] if n != "__name__"}
    carried["alertname"] = None
    severities = {s.value for s in Severity}
    for group in rules.get("groups") or []:
        if str(group.get("name", "")).startswith("specwatch"):
            for rule in group.get("rules") or []:
                for labels in [rule.get("labels") or {}] + [
                    a.get("labels") or {} for a in rule.get("alerts") or []
                ]:
                    if "severity" in labels:
                        severities.add(str(labels["severity"]))
    for label, values in rule_labels(rules).items():
        carried[label] = values if label not in carried else None
    status = await api_get(session, url, "/api/v1/status/config", limit_s=limit_s)
    try:
        glob = (yaml.safe_load(str((status or {}).get("yaml", ""))) or {}).get("global") or {}
    except (yaml.YAMLError, AttributeError):
        glob = {}
    carried.update({str(k): None for k in glob.get("external_labels") or {}})
    carried["severity"] = sorted(severities)
    return carried


async def label_findings(
    session: aiohttp.ClientSession,
    url: str,
    title: str,
    queries: Sequence[tuple[str, str]],
    labels_of: dict[str, list[str]],
    limit_s: float,
) -> list[Found]:
    """The ``labels`` check of one dashboard (``queries``: ``(panel, PromQL)`` at its defaults)
    against the Prometheus at ``url``; ``labels_of`` caches each metric's label names. A failed
    lookup is one failure."""
    try:
        await _fill_labels(session, url, queries, labels_of, limit_s)
    except PromApiError as exc:
        return [("fail", "labels", f"{title}: cannot read label names: {exc}")]
    return check_dashboard_labels(title, queries, labels_of)


async def _fill_labels(
    session: aiohttp.ClientSession,
    url: str,
    queries: Sequence[tuple[str, str]],
    labels_of: dict[str, list[str]],
    limit_s: float,
) -> None:
    for metric in {m for _, expr in queries for m, *_ in promql_matchers(expr)} - set(labels_of):
        found = await api_get(session, url, "/api/v1/labels", {"match[]": metric}, limit_s=limit_s)
        labels_of[metric] = [str(n) for n in found or [] if n != "__name__"]


async def inhibit_findings(
    session: aiohttp.ClientSession,
    url: str,
    config: Mapping[str, Any] | None,
    alertmanager_url: str,
    rules: Mapping[str, Any],
    job_pattern: str,
    limit_s: float,
) -> list[Found]:
    """The ``inhibit`` check: ``config`` (from ``--alertmanager-config``) or the live
    configuration at ``alertmanager_url``, against the labels specwatch's alerts carry in the
    Prometheus at ``url``. A failed lookup is one failure."""
    try:
        source = "--alertmanager-config" if config is not None else alertmanager_url
        if config is None:
            config = await _alertmanager_config(session, alertmanager_url, limit_s)
        carried = await _carried_labels(session, url, rules, job_pattern, limit_s)
    except PromApiError as exc:
        return [("fail", "inhibit", f"cannot check inhibit rules: {exc}")]
    return check_inhibit_rules(config, carried, source)


# -- mirror coverage ----------------------------------------------------------------------------

#: The window the mirror's coverage is measured over.
MIRROR_WINDOW = "1h"
#: Fewer expected mirrored requests than this in the window: too few to judge the share.
MIRROR_MIN_EXPECTED = 20.0


#: A shortfall of mirrored copies under this share of the expected count (or under 3 binomial
#: standard deviations, or 5 requests) is the window's edges, not a route that loses copies.
MIRROR_SHORTFALL_TOLERANCE = 0.02


def _percent(value: object, default: float = 100.0) -> float:
    """A percentage as a manifest writes it: a number, a numeric string (``"10"``, ``"10%"``),
    or Istio's wrapper ``{value: 10}``; ``default`` when absent or unreadable."""
    if isinstance(value, Mapping):
        value = value.get("value")
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip().removesuffix("%"))
        except ValueError:
            return default
    return default


#: Istio's percentage fields of the single ``mirror`` of an HTTP route, newest first: the
#: ``Percent`` message (``mirrorPercentage: {value: 5.0}``) and the deprecated integer
#: (``mirrorPercent: 5``, or ``{value: 5}`` as a UInt32Value), each also as snake case.
_ISTIO_MIRROR_PERCENT = ("mirrorPercentage", "mirror_percentage", "mirrorPercent", "mirror_percent")


def mirror_percentages(objects: Sequence[Mapping[str, Any]]) -> list[tuple[str, float]]:
    """``(route, percent)`` for each mirror in Istio VirtualServices (``mirrors[].percentage``,
    or ``mirror`` with ``mirrorPercentage`` / the older ``mirrorPercent``, in camel or snake
    case; Istio mirrors 100 % when unset) and Gateway API HTTPRoutes (``RequestMirror`` filters'
    ``percent`` or ``fraction``, ``denominator`` 100 when unset; 100 % when neither), each named
    by its object and route (Istio: the route's ``name`` or its position; Gateway API: the
    rule's position, from 1)."""
    out: list[tuple[str, float]] = []
    for obj in objects:
        kind, spec = obj.get("kind"), obj.get("spec") or {}
        name = f"{kind} {(obj.get('metadata') or {}).get('name', '?')}"
        if kind == "VirtualService":
            for i, route in enumerate(spec.get("http") or [], start=1):
                where = f"{name} route {route.get('name') or i}"
                for m in route.get("mirrors") or []:
                    out.append((where, _percent(m.get("percentage"))))
                if route.get("mirror"):
                    key = next((k for k in _ISTIO_MIRROR_PERCENT if k in route), None)
                    out.append((where, _percent(route.get(key)) if key else 100.0))
        elif kind == "HTTPRoute":
            for i, rule in enumerate(spec.get("rules") or [], start=1):
                where = f"{name} rule {i}"
                for f in rule.get("filters") or []:
                    if f.get("type") != "RequestMirror":
                        continue
                    mirror = f.get("requestMirror") or {}
                    frac = mirror.get("fraction")
                    if isinstance(frac, Mapping) and _percent(frac.get("denominator"), 100) > 0:
                        share = _percent(frac.get("numerator"), 0) / _percent(
                            frac.get("denominator"), 100
                        )
                        out.append((where, 100 * share))
                    else:
                        out.append((where, _percent(mirror.get("percent"))))
    return out


def check_mirror_coverage(
    configured: Sequence[tuple[str, float]], mirrored: float, live: float
) -> list[Found]:
    """Findings for the share of live requests that reached specwatch's mirror listener
    (``mirrored`` of ``live`` over :data:`MIRROR_WINDOW`) against the ``configured`` mirror
    percentages, route by route.

    specwatch counts copies, not the route that sent them, so with routes of different shares
    the expected count lies between the smallest and the largest share of the live requests:
    none reaching the mirror, or under half the smallest share, is a failure; under the smallest
    share by more than the window's edges explain (:data:`MIRROR_SHORTFALL_TOLERANCE`, 3
    binomial standard deviations, 5 requests) a warning with the numbers (94 % of a 100 %
    mirror); over twice the largest a warning; too little traffic to judge (fewer than
    :data:`MIRROR_MIN_EXPECTED` expected) a warning."""
    if not configured:
        return []
    low = min(p for _, p in configured)
    high = max(p for _, p in configured)
    where = ", ".join(sorted({f"{w} ({p:g} %)" for w, p in configured}))
    sends = f"{low:g} %" if low == high else f"between {low:g} % and {high:g} %"
    if live <= 0:
        return [
            ("warn", "mirror", f"no live requests in the last {MIRROR_WINDOW}: {where} not judged")
        ]
    expected = live * low / 100
    share = (
        f"{100 * mirrored / live:.3g} % ({mirrored:.0f} of {live:.0f} live requests in the last "
        f"{MIRROR_WINDOW})"
    )
    if mirrored <= 0 and expected >= MIRROR_MIN_EXPECTED:
        return [
            (
                "fail",
                "mirror",
                f"no live request reached specwatch's mirror listener, {where} sends {sends}: "
                "check the route binds the served Service, the mirror's backend names "
                "specwatch's mirror port, and that the mesh's sidecar runs in the client pods",
            )
        ]
    if live * high / 100 < MIRROR_MIN_EXPECTED:
        return [("warn", "mirror", f"too few requests to judge: {share}; {where}")]
    if mirrored < expected / 2:
        return [
            (
                "fail",
                "mirror",
                f"only {share} reached specwatch's mirror, {where} sends {sends}: part of the "
                "traffic bypasses the route (another Service, path or port) or copies are lost",
            )
        ]
    missing = expected - mirrored
    p = low / 100
    tolerance = max(MIRROR_SHORTFALL_TOLERANCE * expected, 3 * math.sqrt(live * p * (1 - p)), 5.0)
    if missing > tolerance:
        return [
            (
                "warn",
                "mirror",
                f"only {share} reached specwatch's mirror, {where} sends {sends}: "
                f"{missing:.0f} of {expected:.0f} expected copies "
                f"({100 * missing / expected:.2g} %) missing; some requests bypass the route "
                "or copies are dropped (the mesh's mirror queue, "
                "specwatch_shadow_ingest_errors_total)",
            )
        ]
    if mirrored > 2 * live * high / 100:
        return [("warn", "mirror", f"{share} reached the mirror, more than {where} sends")]
    return [("ok", "mirror", f"{share} reached the mirror; {where}")]


async def mirror_findings(
    session: aiohttp.ClientSession,
    url: str,
    objects: Sequence[Mapping[str, Any]],
    job_pattern: str,
    limit_s: float,
) -> list[Found]:
    """The ``mirror`` check with the mirrors in ``objects``: specwatch's own count of mirrored
    requests against the standard servers' finished requests less twice specwatch's replays
    (which reach them as the standard and the noise arm), over :data:`MIRROR_WINDOW`."""
    configured = mirror_percentages(objects)
    if not configured:
        return []
    w = MIRROR_WINDOW
    queries = (
        f'sum(increase(specwatch_shadow_received_total{{source="mirror",job=~"{job_pattern}"}}[{w}]))',
        f'sum(increase(vllm:request_success_total{{role="standard"}}[{w}]))',
        f'sum(increase(specwatch_shadow_replays_total{{job=~"{job_pattern}"}}[{w}]))',
    )
    try:
        got = [await instant_query(session, url, q, limit_s=limit_s) for q in queries]
    except PromApiError as exc:
        return [("fail", "mirror", f"cannot measure the mirror's coverage: {exc}")]
    mirrored, served, replays = (rows[0][1] if rows else 0.0 for rows in got)
    # each replay reaches a standard server up to twice (standard arm, noise arm): the live
    # count is a lower bound, so a coverage failure is never specwatch's own traffic
    return check_mirror_coverage(configured, mirrored, max(served - 2 * replays, 0.0))
