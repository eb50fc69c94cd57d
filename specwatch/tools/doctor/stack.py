"""``specwatch doctor``'s checks of the operator's own stack: pure checks (values in, findings
out) and the lookups in Prometheus / Alertmanager that feed them.

* ``inhibit``: an Alertmanager inhibit rule that pairs specwatch alerts (its ``source`` and
  ``target`` matchers may select one each) where an ``equal`` label is missing from either
  alert of a pair, judged per alert (:func:`alert_labels`). Alertmanager compares a missing
  label as the empty string, so such a rule lets a specwatch alert of one cluster/namespace/...
  inhibit another's, or never inhibits when the other alert carries the label.
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
from dataclasses import dataclass
from typing import Any

import aiohttp
import yaml

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


@dataclass(frozen=True)
class AlertLabels:
    """The labels one specwatch alert (one ``alertname``) carries: each with its known values
    (``None``: any value). ``open``: its expression's labels could not be worked out (a metric
    with no series yet), so it may carry labels beyond these and a missing one is not judged."""

    labels: Mapping[str, Sequence[str] | None]
    open: bool = False


def _may_select(matchers: Sequence[tuple[str, str, str]], alert: AlertLabels) -> bool:
    """Whether ``alert`` may satisfy every matcher."""
    for label, op, value in matchers:
        if label not in alert.labels:
            if not alert.open and not _matches(op, value, ""):
                return False
            continue
        known = alert.labels[label]
        if known is not None and not any(_matches(op, value, v) for v in known):
            return False
    return True


#: How many alert pairs one failure names before it counts the rest.
_PAIRS_SHOWN = 3


def check_inhibit_rules(
    config: Mapping[str, Any], alerts: Mapping[str, AlertLabels], source: str
) -> list[Found]:
    """Findings for the ``inhibit_rules`` of an Alertmanager ``config`` (read from ``source``),
    judged per alert: ``alerts`` maps each specwatch ``alertname`` to the labels it carries. A
    rule is judged on the pairs of alerts its ``source`` and ``target`` matchers may select
    (an alert with itself included: two of its instances); a pair where an ``equal`` label is
    missing from either alert is a failure naming both. Rules that select no specwatch alert
    on one side are not judged."""
    rules = config.get("inhibit_rules") or []
    if not isinstance(rules, list):
        return [("fail", "inhibit", f"{source}: inhibit_rules is not a list")]
    out: list[Found] = []
    for i, rule in enumerate(rules, start=1):
        if not isinstance(rule, Mapping):
            out.append(("fail", "inhibit", f"{source}: inhibit rule {i} is not a mapping"))
            continue
        sides = [_am_matchers(rule, s) for s in ("source", "target")]
        if sides[0] is None or sides[1] is None:
            out.append(("warn", "inhibit", f"{source}: inhibit rule {i}: cannot read matchers"))
            continue
        sources = [n for n in sorted(alerts) if _may_select(sides[0], alerts[n])]
        targets = [n for n in sorted(alerts) if _may_select(sides[1], alerts[n])]
        if not sources or not targets:
            continue
        equal = [str(e) for e in rule.get("equal") or []]

        lacks = {
            n: [] if alerts[n].open else [e for e in equal if e not in alerts[n].labels]
            for n in {*sources, *targets}
        }
        bad = [(s, t, lacks[s], lacks[t]) for s in sources for t in targets if lacks[s] or lacks[t]]
        if not bad:
            out.append(("ok", "inhibit", f"{source}: inhibit rule {i}: equal labels carried"))
            continue
        shown = "; ".join(
            f"{s} (source{', no ' + ', '.join(ls) if ls else ''}) with "
            f"{t} (target{', no ' + ', '.join(lt) if lt else ''})"
            for s, t, ls, lt in bad[:_PAIRS_SHOWN]
        )
        more = f"; and {len(bad) - _PAIRS_SHOWN} more pairs" if len(bad) > _PAIRS_SHOWN else ""
        absent = sorted({e for _, _, ls, lt in bad for e in (*ls, *lt)}, key=equal.index)
        out.append(
            (
                "fail",
                "inhibit",
                f"{source}: inhibit rule {i} (equal: {', '.join(equal)}) pairs specwatch alerts "
                f"that do not both carry {', '.join(absent)}: {shown}{more}. Alertmanager "
                "compares a missing label as empty, so such an alert inhibits the other across "
                f"every {absent[0]} (or never, where the other carries it); drop "
                f"{', '.join(absent)} from equal, narrow the matchers to alerts that carry it, "
                "or add it to specwatch's alerts (the Prometheus external labels)",
            )
        )
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


def _alerting_rules(rules: Mapping[str, Any]) -> Iterable[tuple[str, Mapping[str, Any]]]:
    """``(alertname, rule)`` of each alerting rule of the ``specwatch*`` groups of ``rules``
    (Prometheus's ``/api/v1/rules`` answer, or a rules file)."""
    for group in rules.get("groups") or []:
        if str(group.get("name", "")).startswith("specwatch"):
            for rule in group.get("rules") or []:
                name = rule.get("alert") or (rule.get("type") == "alerting" and rule.get("name"))
                if name:
                    yield str(name), rule


def _expr(rule: Mapping[str, Any]) -> str:
    return str(rule.get("query") or rule.get("expr") or "")


def alert_labels(
    rules: Mapping[str, Any], labels_of: Mapping[str, LabelSet], external: Iterable[str]
) -> dict[str, AlertLabels]:
    """The labels each alert of the ``specwatch*`` alerting rules of ``rules`` carries, whether
    or not it fires: ``alertname``; the rule's own labels and those of its firing ``alerts``;
    those its expression sets with ``label_replace`` (:func:`label_replace_labels`, values where
    known); its expression's result labels (:func:`expression_labels` over ``labels_of``, each
    metric's series labels: an outer ``by`` keeps exactly those, ``without`` drops them); and
    the Prometheus ``external`` labels. Rules sharing an alertname carry what all of them do."""
    out: dict[str, AlertLabels] = {}
    for name, rule in _alerting_rules(rules):
        labels: dict[str, list[str] | None] = {"alertname": [name]}
        sets = [rule.get("labels") or {}] + [
            a.get("labels") or {} for a in rule.get("alerts") or []
        ]
        for label, values in [
            *((str(k), [str(v)]) for s in sets for k, v in s.items()),
            *label_replace_labels(_expr(rule)).items(),
        ]:
            known = labels.get(label, [])
            labels[label] = None if values is None or known is None else sorted({*known, *values})
        result = expression_labels(_expr(rule), labels_of)
        for label in (result or frozenset()) | set(external):
            labels.setdefault(label, None)
        found = AlertLabels(labels, open=result is None)
        if name in out:  # the labels both rules' alerts carry
            old = out[name].labels
            both: dict[str, list[str] | None] = {}
            for k in set(labels) & set(old):
                new_v, old_v = labels[k], old[k]
                both[k] = None if new_v is None or old_v is None else sorted({*new_v, *old_v})
            found = AlertLabels(both, open=out[name].open and found.open)
        out[name] = found
    return out


# -- the labels an alerting rule's alerts carry --------------------------------------------------

#: A label set: the label names, or ``None`` where they cannot be known (a metric with no series).
LabelSet = frozenset[str] | None

_AGGREGATIONS = frozenset(
    {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
     "bottomk", "topk", "quantile", "limitk", "limit_ratio"}
)  # fmt: skip
#: Binary operators by precedence, lowest first (``^`` binds tightest).
_BINARY = (("or",), ("and", "unless"), ("==", "!=", "<=", ">=", "<", ">"), ("+", "-"),
           ("*", "/", "%", "atan2"), ("^",))  # fmt: skip
_TOKEN = re.compile(
    r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`)'
    r"|(?P<dur>(?:\d+(?:ms|[smhdwy]))+)(?!\w)"
    r"|(?P<num>(?:0x[0-9a-fA-F]+|\d+(?:\.\d*)?(?:e[+-]?\d+)?|\.\d+|Inf|NaN)(?![\w:]))"
    r"|(?P<op>==|!=|<=|>=|=~|!~|[-+*/%^<>=(),{}\[\]:@])|(?P<name>[a-zA-Z_][\w:]*|:[\w:]+))",
    re.IGNORECASE,
)

_NUMBER = re.compile(r"0x[0-9a-fA-F]+|\d+(?:\.\d*)?(?:e[+-]?\d+)?|\.\d+|Inf|NaN", re.IGNORECASE)


def _tokens(expr: str) -> list[str]:
    out, i = [], 0
    expr = re.sub(r"#[^\n]*", "", expr)
    while i < len(expr):
        m = _TOKEN.match(expr, i)
        if m is None or m.end() == i:
            if expr[i:].strip():
                raise ValueError(f"cannot read {expr[i : i + 20]!r}")
            break
        out.append(m.group().strip())
        i = m.end()
    return [t for t in out if t]


class _Labels:
    """A small PromQL reader that works out which labels an expression's result series have:
    a selector keeps its metric's series labels (``labels_of``), functions keep their vector
    argument's (``label_replace``/``label_join`` add their destination), an aggregation keeps
    exactly its ``by`` labels or drops its ``without`` labels, ``and``/``unless`` and the other
    binary operators keep the left side's (``group_right``: the right side's; ``group_*(x)``
    adds ``x``), ``or`` keeps the labels both sides have; a scalar has none."""

    def __init__(self, tokens: list[str], labels_of: Mapping[str, LabelSet]) -> None:
        self.t, self.i, self.labels_of = tokens, 0, labels_of
        self.metrics: list[str] = []

    def peek(self, k: int = 0) -> str:
        return self.t[self.i + k] if self.i + k < len(self.t) else ""

    def take(self, want: str | None = None) -> str:
        tok = self.peek()
        if not tok or (want is not None and tok.lower() != want):
            raise ValueError(f"expected {want or 'more'} at {tok!r}")
        self.i += 1
        return tok

    def names(self) -> list[str]:
        self.take("(")
        out: list[str] = []
        while self.peek() != ")":
            tok = self.take()
            if tok != ",":
                out.append(tok.strip("\"'`"))
        self.take(")")
        return out

    def expr(self, level: int = 0) -> tuple[LabelSet, bool]:
        """``(labels, is_scalar)`` of the expression at precedence ``level``."""
        if level == len(_BINARY):
            return self.unary()
        left = self.expr(level + 1)
        while self.peek().lower() in _BINARY[level]:
            op = self.take().lower()
            if self.peek().lower() == "bool":
                self.take()
            side, extra = "left", []
            if self.peek().lower() in ("on", "ignoring"):
                self.take()
                self.names()
            if self.peek().lower() in ("group_left", "group_right"):
                side = "right" if self.take().lower() == "group_right" else "left"
                if self.peek() == "(":
                    extra = self.names()
            right = self.expr(level + 1) if op != "^" else self.expr(level)
            left = _combine(op, left, right, side, extra)
        return left

    def unary(self) -> tuple[LabelSet, bool]:
        while self.peek() in ("-", "+"):
            self.take()
        got = self.primary()
        while self.peek() in ("[", "@") or self.peek().lower() == "offset":
            if self.take() == "[":
                while self.take() != "]":
                    pass
            else:  # offset [-]5m, @ 1700000000 or @ start()
                if self.peek() in ("-", "+"):
                    self.take()
                self.take()
                if self.peek() == "(":
                    self.take()
                    self.take(")")
        return got

    def primary(self) -> tuple[LabelSet, bool]:
        tok = self.peek()
        if tok == "(":
            self.take()
            got = self.expr()
            self.take(")")
            return got
        if tok == "{":
            return self.selector("")
        if _NUMBER.fullmatch(tok) or tok[:1] in "\"'`":
            self.take()
            return frozenset(), True
        name = self.take()
        low = name.lower()
        if low in _AGGREGATIONS and self.peek().lower() in ("by", "without", "("):
            return self.aggregation(low)
        if self.peek() == "(":
            return self.call(low)
        return self.selector(name)

    def selector(self, name: str) -> tuple[LabelSet, bool]:
        if self.peek() == "{":
            self.take()
            while self.peek() != "}":
                key = self.take()
                if key == ",":
                    continue
                op, value = self.take(), self.take().strip("\"'`")
                if key == "__name__" and op == "=":
                    name = value
            self.take("}")
        self.metrics.append(name)
        found = self.labels_of.get(name)
        return (None if found is None else frozenset(found) - {"__name__"}), False

    def args(self) -> list[tuple[LabelSet, bool]]:
        self.take("(")
        out = []
        while self.peek() != ")":
            out.append(self.expr())
            if self.peek() == ",":
                self.take()
        self.take(")")
        return out

    def aggregation(self, op: str) -> tuple[LabelSet, bool]:
        grouping: tuple[str, list[str]] | None = None
        if self.peek().lower() in ("by", "without"):
            grouping = (self.take().lower(), self.names())
        args = self.args()
        if self.peek().lower() in ("by", "without"):
            grouping = (self.take().lower(), self.names())
        inner = args[-1][0] if args else frozenset()
        if op == "count_values" and len(args) == 2 and inner is not None:
            inner = inner | {str(self.t[self.i - 1])}  # destination label, read loosely
        if grouping is None:
            return (frozenset() if op not in ("topk", "bottomk", "limitk", "limit_ratio")
                    else inner), False  # fmt: skip
        kind, names = grouping
        if kind == "by":
            return frozenset(names), False
        return (None if inner is None else inner - set(names)), False

    def call(self, name: str) -> tuple[LabelSet, bool]:
        start = self.i
        args = self.args()
        if name in ("label_replace", "label_join") and args:
            dst = self.t[start + 1 :]
            depth, j = 0, 0
            while j < len(dst) and not (dst[j] == "," and depth == 0):  # the first argument
                depth += dst[j] in ("(", "[", "{")
                depth -= dst[j] in (")", "]", "}")
                j += 1
            label = dst[j + 1].strip("\"'`")
            inner = args[0][0]
            return (None if inner is None else inner | {label}), False
        if name in ("scalar", "time", "pi", "minute", "hour", "day_of_month", "day_of_week",
                    "day_of_year", "days_in_month", "month", "year") and not (
                        args and name not in ("scalar", "time", "pi")):  # fmt: skip
            return frozenset(), True
        if name in ("vector", "absent", "absent_over_time"):
            return frozenset(), False
        vectors = [a for a in args if not a[1]]
        if not vectors:
            return frozenset(), False
        got = (
            vectors[-1][0]
            if name in ("histogram_quantile", "quantile_over_time")
            else vectors[0][0]
        )
        if name == "histogram_quantile" and got is not None:
            got = got - {"le"}
        return got, False


def _combine(
    op: str, left: tuple[LabelSet, bool], right: tuple[LabelSet, bool], side: str, extra: list[str]
) -> tuple[LabelSet, bool]:
    if left[1] and right[1]:
        return frozenset(), True
    if left[1] or right[1]:
        return (right if left[1] else left)[0], False
    if op == "or":
        if left[0] is None or right[0] is None:
            return left[0] if right[0] is None else right[0], False
        return left[0] & right[0], False
    got = right[0] if side == "right" else left[0]
    return (None if got is None else got | set(extra)), False


def expression_metrics(expr: str) -> list[str]:
    """The metric names the selectors of ``expr`` read (raises ``ValueError`` if it cannot be
    read)."""
    reader = _Labels(_tokens(expr), {})
    reader.expr()
    return reader.metrics


def expression_labels(expr: str, labels_of: Mapping[str, LabelSet]) -> LabelSet:
    """The labels every result series of ``expr`` has (:class:`_Labels`), from ``labels_of``
    (metric → its series' label names, ``None``: unknown); ``None`` when that cannot be known
    (an expression this reader cannot follow, or a metric with no series)."""
    try:
        reader = _Labels(_tokens(expr), labels_of)
        got, _scalar = reader.expr()
        if reader.peek():
            return None
    except (ValueError, IndexError):
        return None
    return got


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


async def _alert_labels(
    session: aiohttp.ClientSession, url: str, rules: Mapping[str, Any], limit_s: float
) -> dict[str, AlertLabels]:
    """:func:`alert_labels` with each metric's series labels (``/api/v1/labels`` matching it;
    none: unknown) and the external labels of the Prometheus at ``url``."""
    labels_of: dict[str, LabelSet] = {}
    for _name, rule in _alerting_rules(rules):
        try:
            metrics = expression_metrics(_expr(rule))
        except (ValueError, IndexError):
            continue
        for metric in set(metrics) - set(labels_of):
            found = await api_get(
                session, url, "/api/v1/labels", {"match[]": metric}, limit_s=limit_s
            )
            names = [str(n) for n in found or [] if n != "__name__"]
            labels_of[metric] = frozenset(names) if names else None
    status = await api_get(session, url, "/api/v1/status/config", limit_s=limit_s)
    try:
        glob = (yaml.safe_load(str((status or {}).get("yaml", ""))) or {}).get("global") or {}
    except (yaml.YAMLError, AttributeError):
        glob = {}
    return alert_labels(rules, labels_of, [str(k) for k in glob.get("external_labels") or {}])


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
    limit_s: float,
) -> list[Found]:
    """The ``inhibit`` check: ``config`` (from ``--alertmanager-config``) or the live
    configuration at ``alertmanager_url``, against the labels each of specwatch's alerts
    carries in the Prometheus at ``url`` (:func:`_alert_labels`). A failed lookup is one
    failure."""
    try:
        source = "--alertmanager-config" if config is not None else alertmanager_url
        if config is None:
            config = await _alertmanager_config(session, alertmanager_url, limit_s)
        alerts = await _alert_labels(session, url, rules, limit_s)
    except PromApiError as exc:
        return [("fail", "inhibit", f"cannot check inhibit rules: {exc}")]
    return check_inhibit_rules(config, alerts, source)


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
