"""Alert state that outlives the process: the ``for`` timers and the active alerts on disk.

Prometheus restores ``for`` state across its restarts; specwatch does the same with a small JSON
file next to the ledger. :class:`SavedAlerts` is the value (pending timers by alert identity,
active alerts with their ``startsAt``, when it was written); :func:`dump` / :func:`load` turn it
into text and back (``load`` raises ``ValueError`` on anything malformed); :func:`write_atomic`
replaces the file in one step (temporary file, ``fsync``, ``os.replace``), so a ``kill -9``
leaves either the old or the new file. Both file functions block: call them off the event loop.

File shape (``version`` 1)::

    {"version": 1, "written_at": 1767225600.0, "targets": "3f2a9c01d4e5",
     "pending": [{"labels": {"alertname": ..., "severity": ..., ...}, "since": 1767225000.0}],
     "active": [{"alertname": ..., "severity": "warning", "summary": ..., "description": ...,
                 "labels": {...}, "runbook_url": "", "starts_at": 1767225300.0}]}
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specwatch.alerts.alert import Alert, AlertKey, Severity, alert_key

__all__ = [
    "VERSION",
    "SavedAlerts",
    "dump",
    "load",
    "read_text",
    "write_atomic",
]

#: The file format version :func:`dump` writes and :func:`load` accepts.
VERSION = 1


@dataclass(frozen=True, slots=True)
class SavedAlerts:
    """``written_at``: unix seconds; ``pending``: ``{identity: since}`` (unix seconds, as
    :meth:`~specwatch.alerts.pending.ForTracker.export` gives); ``active``: ``(finding,
    startsAt)`` pairs (as :meth:`~specwatch.alerts.alertmanager.ActiveAlerts.export` gives);
    ``targets``: the key of the scrape targets the state belongs to (``""``: unknown), so a
    run against other targets restores nothing."""

    written_at: float
    pending: Mapping[AlertKey, float] = field(default_factory=dict)
    active: tuple[tuple[Alert, float], ...] = ()
    targets: str = ""


def dump(saved: SavedAlerts) -> str:
    """The JSON text of ``saved`` (keys sorted; one line)."""
    doc = {
        "version": VERSION,
        "written_at": saved.written_at,
        "targets": saved.targets,
        "pending": [
            {"labels": dict(key), "since": since} for key, since in sorted(saved.pending.items())
        ],
        "active": [
            {
                "alertname": a.alertname,
                "severity": str(a.severity),
                "summary": a.summary,
                "description": a.description,
                "labels": dict(a.labels),
                "runbook_url": a.runbook_url,
                "starts_at": starts_at,
            }
            for a, starts_at in saved.active
        ],
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def _labels(raw: Any) -> dict[str, str]:
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
    ):
        raise ValueError("labels must map strings to strings")
    return dict(raw)


def _time(raw: Any, name: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
        raise ValueError(f"{name} must be a finite number of seconds")
    return float(raw)


def _str(raw: Mapping[str, Any], name: str) -> str:
    value = raw.get(name)
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string")
    return value


def load(text: str) -> SavedAlerts:
    """Parse :func:`dump`'s text. Raises ``ValueError`` naming what is wrong (not JSON or nested
    too deep to parse, another version, a field of the wrong type, an unknown severity)."""
    try:
        doc = json.loads(text)  # JSONDecodeError is a ValueError
    except RecursionError:
        raise ValueError("not JSON: nested too deep") from None
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        raise ValueError(f"not a version {VERSION} alert state")
    pending_raw, active_raw = doc.get("pending"), doc.get("active")
    if not isinstance(pending_raw, list) or not isinstance(active_raw, list):
        raise ValueError("pending and active must be lists")
    pending: dict[AlertKey, float] = {}
    for item in pending_raw:
        if not isinstance(item, dict):
            raise ValueError("a pending entry is not an object")
        pending[alert_key(_labels(item.get("labels")))] = _time(item.get("since"), "since")
    active: list[tuple[Alert, float]] = []
    for item in active_raw:
        if not isinstance(item, dict):
            raise ValueError("an active entry is not an object")
        alert = Alert(
            alertname=_str(item, "alertname"),
            severity=Severity(_str(item, "severity")),
            summary=_str(item, "summary"),
            description=_str(item, "description"),
            labels=_labels(item.get("labels")),
            runbook_url=_str(item, "runbook_url"),
        )
        active.append((alert, _time(item.get("starts_at"), "starts_at")))
    targets = doc.get("targets", "")
    if not isinstance(targets, str):
        raise ValueError("targets must be a string")
    written_at = _time(doc.get("written_at"), "written_at")
    return SavedAlerts(written_at, pending, tuple(active), targets=targets)


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one step (a temporary file of its own beside ``path``,
    fsync, rename), so two writes at once never share a temporary file. Blocking; raises
    ``OSError``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def read_text(path: Path) -> str | None:
    """The file's text, or ``None`` when it does not exist. Blocking; raises ``OSError`` (and
    ``UnicodeDecodeError``, a ``ValueError``) for an unreadable file."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
