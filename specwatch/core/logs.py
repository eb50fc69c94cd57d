"""Structured logging to stderr with the standard library: one JSON object (or a plain
``event key=value`` line) per event.

Log with ``log_event(logger, logging.WARNING, "scrape failed", target="fly", reason="timeout")``;
the event name is the message and the keyword fields become keys. ``log_event`` is the one
logging call in specwatch (a test rejects ``extra=`` anywhere else); the formatters still emit
any attribute a record carries beyond the standard ``LogRecord`` ones, so a field passed some
other way is never dropped.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

_FIELDS = "specwatch_fields"

# Attributes every LogRecord has (plus those set by Formatter.format and by pytest's caplog);
# anything else on a record was passed through ``extra`` and is a field.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "taskName",
    _FIELDS,
}


def event_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields of a record: those given to :func:`log_event`, then any other
    non-standard attribute (``extra=`` keys) that does not clash with them."""
    fields: dict[str, Any] = dict(getattr(record, _FIELDS, {}))
    for key, value in record.__dict__.items():
        if key not in _STANDARD and not key.startswith("_"):
            fields.setdefault(key, value)
    return fields


class JsonFormatter(logging.Formatter):
    """``{"ts": ..., "level": ..., "logger": ..., "event": ..., **fields}`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        for key, value in event_fields(record).items():
            out.setdefault(key, value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, separators=(",", ":"))


class PlainFormatter(logging.Formatter):
    """``2026-01-01T00:00:00Z info specwatch.scrape scrape failed target=fly reason=timeout``."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))
        fields = " ".join(f"{k}={v}" for k, v in event_fields(record).items())
        line = f"{ts} {record.levelname.lower()} {record.name} {record.getMessage()} {fields}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line.rstrip()


def log_event(logger: logging.Logger, level: int, event: str, **fields: Any) -> None:
    """Emit one structured event named ``event`` at ``level`` (``logging.WARNING``, ...) with
    ``fields`` as keys of the line. The field ``exc_info=True`` is not shown as a key: it appends
    the exception being handled under ``exc`` (as ``logger.exception`` does). ``fields`` must not
    contain secrets (pass URLs through :func:`redact_url`); the keys ``ts``, ``level``,
    ``logger``, ``event`` and ``exc`` are taken by the line itself and a field with one of those
    names is not shown."""
    if logger.isEnabledFor(level):
        exc_info = bool(fields.pop("exc_info", False))
        logger.log(level, event, exc_info=exc_info, extra={_FIELDS: fields})


def setup_logging(level: str = "INFO", fmt: str = "json", stream: TextIO | None = None) -> None:
    """Configure the ``specwatch`` logger tree (idempotent): one handler writing to ``stream``
    (default stderr, so stdout stays free for command output); ``fmt`` is ``json`` or ``plain``;
    ``level`` a logging level name (``INFO``)."""
    logger = logging.getLogger("specwatch")
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else PlainFormatter())
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = True


_HIDDEN = "**********"


def redact_url(url: str) -> str:
    """``url`` with the password of its user info and every query value replaced by
    ``**********`` (aiohttp sends user info as HTTP basic auth, and tokens often ride in the
    query), for logs, ``/api/v1/snapshot`` and anything else shown. Other parts are unchanged;
    text that is not a URL is returned as it is."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    netloc = parts.netloc
    userinfo, at, where = netloc.rpartition("@")
    if at and ":" in userinfo:
        netloc = f"{userinfo.partition(':')[0]}:{_HIDDEN}@{where}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, _HIDDEN) for k, _ in pairs], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
