"""An alert finding and its label rules: :class:`Alert`, :class:`Severity`, label sanitising.

What a detector returns (:mod:`specwatch.alerts.rules`) and what the Alertmanager client
(:mod:`specwatch.alerts.alertmanager`) delivers. Pure values; no I/O.
"""

from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from specwatch.alerts.settings import LABEL_NAME_RE

__all__ = [
    "BLANK_LABEL_NAME",
    "EMPTY_LABEL_VALUE",
    "Alert",
    "AlertKey",
    "Severity",
    "alert_key",
    "keep_distinct",
    "runbook_url",
    "sanitize_label_name",
    "sanitize_labels",
]

_INVALID_CHAR_RE = re.compile(r"[^a-zA-Z0-9_]")


class Severity(enum.StrEnum):
    """``severity`` label values (the kubernetes-mixin convention)."""

    CRITICAL = "critical"
    WARNING = "warning"
    INFO = "info"


def runbook_url(base: str, alertname: str) -> str:
    """``{base}#{alertname.lower()}``: the GitHub anchor of ``## AlertName`` in the runbook."""
    return f"{base.rstrip('#')}#{alertname.lower()}"


#: The value an empty label value is sent as where dropping it would merge two alerts
#: (:func:`keep_distinct`): Alertmanager drops empty-valued labels, as Prometheus does.
EMPTY_LABEL_VALUE = "(empty)"

#: The name a label with a blank name is sent under (before any collision suffix).
BLANK_LABEL_NAME = "label"


def sanitize_label_name(name: str) -> str:
    """Map ``name`` to a valid Prometheus label name (``[a-zA-Z_][a-zA-Z0-9_]*``).

    Surrounding blanks are stripped, other invalid characters become ``_`` and a leading digit
    gets a ``_`` prefix: ``"model.name"`` → ``"model_name"``, ``"0pos"`` → ``"_0pos"``; a
    blank name becomes :data:`BLANK_LABEL_NAME` (``" "`` → ``"label"``).
    """
    if LABEL_NAME_RE.match(name):
        return name
    stripped = name.strip()
    if not stripped:
        return BLANK_LABEL_NAME
    cleaned = _INVALID_CHAR_RE.sub("_", stripped)
    if cleaned[0].isdigit():
        cleaned = "_" + cleaned
    return cleaned


def _suffixed(clean: str, original: str) -> str:
    """``clean`` plus ``_`` and the first 8 hex digits of the SHA-256 of ``original``: the
    stable name of a sanitised label whose plain sanitised name is already taken."""
    return f"{clean}_{hashlib.sha256(original.encode()).hexdigest()[:8]}"


def sanitize_labels(labels: Mapping[str, str], *, keep_empty: bool = False) -> dict[str, str]:
    """Return ``labels`` under valid names, each label kept under a stable name.

    Names go through :func:`sanitize_label_name`. When two names meet on one sanitised name,
    an already-valid name keeps it, otherwise the lexicographically first original name does;
    each other one takes that name plus ``_`` and 8 hex digits of the SHA-256 of its original
    name (``"a.b"`` beside ``"a_b"`` → ``"a_b_<8 hex>"``), so no label is lost and a name never
    depends on the other labels' values. Empty values are dropped unless ``keep_empty``
    (:func:`keep_distinct` decides which empty values an alert keeps).
    """
    out: dict[str, str] = {}
    valid_first = sorted(labels.items(), key=lambda kv: (not LABEL_NAME_RE.match(kv[0]), kv[0]))
    for name, value in valid_first:
        if value == "" and not keep_empty:
            continue
        clean = sanitize_label_name(name)
        if clean in out:
            clean = _suffixed(clean, name)
        out[clean] = value
    return out


@dataclass(frozen=True, slots=True)
class Alert:
    """One finding: what a detector says is wrong right now.

    ``alertname`` and ``severity`` become labels; ``labels`` are the other identifying labels
    (``target``, ``role``, ``engine``, ``category``, ``reason``; bounded values only). Two
    findings with the same final label set are the same alert. ``runbook_url`` empty means
    "build it from the settings' runbook base and the alert name". ``value`` is what Prometheus
    calls ``$value``: the number the condition compared (a ratio, tokens/s, an e-value, a count;
    the unit is the alert's, see ``docs/runbook.md``), ``None`` when the alert has none.
    """

    alertname: str
    severity: Severity
    summary: str
    description: str
    labels: Mapping[str, str] = field(default_factory=dict)
    runbook_url: str = ""
    value: float | None = None

    def identity(self) -> dict[str, str]:
        """Sanitised identifying labels: ``labels`` plus ``alertname`` and ``severity``."""
        merged = dict(self.labels)
        merged["alertname"] = self.alertname
        merged["severity"] = str(self.severity)
        return sanitize_labels(merged)


AlertKey = tuple[tuple[str, str], ...]


def alert_key(labels: Mapping[str, str]) -> AlertKey:
    """The hashable identity of a sanitised label set: its items sorted by name."""
    return tuple(sorted(labels.items()))


def keep_distinct(alerts: Sequence[Alert]) -> list[Alert]:
    """The same alerts with labels that keep distinct alerts distinct in Alertmanager.

    Label names are sanitised (:func:`sanitize_labels`, stable names). An empty label value is
    dropped (Alertmanager drops it anyway) only where no other alert of that name differs from
    this one by its empty labels alone: where dropping would give two different alerts one
    label set (``engine=""`` beside the same alert without ``engine``), each such alert sends
    its empty values as :data:`EMPTY_LABEL_VALUE`. Order and everything but ``labels`` are kept;
    applying it again changes nothing.
    """
    full = [sanitize_labels(a.labels, keep_empty=True) for a in alerts]
    groups: dict[tuple[str, AlertKey], set[AlertKey]] = {}
    for a, labels in zip(alerts, full, strict=True):
        reduced = alert_key({k: v for k, v in labels.items() if v != ""})
        groups.setdefault((a.alertname, reduced), set()).add(alert_key(labels))
    out: list[Alert] = []
    for a, labels in zip(alerts, full, strict=True):
        reduced_items = {k: v for k, v in labels.items() if v != ""}
        if len(groups[(a.alertname, alert_key(reduced_items))]) > 1:
            kept = {k: v or EMPTY_LABEL_VALUE for k, v in labels.items()}
        else:
            kept = reduced_items
        out.append(a if kept == dict(a.labels) else replace(a, labels=kept))
    return out
