"""An alert finding and its label rules: :class:`Alert`, :class:`Severity`, label sanitising.

What a detector returns (:mod:`specwatch.alerts.rules`) and what the Alertmanager client
(:mod:`specwatch.alerts.alertmanager`) delivers. Pure values; no I/O.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from specwatch.alerts.settings import LABEL_NAME_RE

__all__ = [
    "Alert",
    "AlertKey",
    "Severity",
    "alert_key",
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


def sanitize_label_name(name: str) -> str | None:
    """Map ``name`` to a valid Prometheus label name, or ``None`` if it is empty.

    Invalid characters become ``_`` and a leading digit gets a ``_`` prefix:
    ``"model.name"`` → ``"model_name"``, ``"0pos"`` → ``"_0pos"``, ``" "`` → ``None``.
    """
    if LABEL_NAME_RE.match(name):
        return name
    stripped = name.strip()
    if not stripped:
        return None
    cleaned = _INVALID_CHAR_RE.sub("_", stripped)
    if cleaned[0].isdigit():
        cleaned = "_" + cleaned
    return cleaned


def sanitize_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """Return ``labels`` with valid names and no empty names or values.

    Names are sanitised with :func:`sanitize_label_name`; entries whose name or value ends up
    empty are dropped. When two names collide after sanitising, the one that was already valid
    wins, otherwise the lexicographically first original name wins (deterministic).
    """
    out: dict[str, str] = {}
    valid_first = sorted(labels.items(), key=lambda kv: (not LABEL_NAME_RE.match(kv[0]), kv[0]))
    for name, value in valid_first:
        clean = sanitize_label_name(name)
        if clean is None or value == "" or clean in out:
            continue
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
