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
import math
import re
import sys
import time
import traceback
from collections.abc import Iterable
from typing import Any, TextIO
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from specwatch.core.clock import SYSTEM_MONOTONIC, MonotonicClock

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
        elif record.exc_text:
            out["exc"] = record.exc_text
        return json.dumps(_json_safe(out), default=str, separators=(",", ":"), allow_nan=False)


def _json_safe(value: Any) -> Any:
    """``value`` with every non-finite float (anywhere in dicts, lists and tuples) written as
    the string Prometheus uses for it (``"NaN"``, ``"+Inf"``, ``"-Inf"``): strict JSON has no
    NaN or Infinity literal."""
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


class PlainFormatter(logging.Formatter):
    """``2026-01-01T00:00:00Z info specwatch.scrape scrape failed target=fly reason=timeout``."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))
        fields = " ".join(f"{k}={v}" for k, v in event_fields(record).items())
        line = f"{ts} {record.levelname.lower()} {record.name} {record.getMessage()} {fields}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        elif record.exc_text:
            line += "\n" + record.exc_text
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


class RateLimitedLog:
    """:func:`log_event` for events that outside input can repeat at will (bad requests,
    refused connections): at most ``burst`` lines per ``period_seconds`` for each (event,
    ``reason`` field); the lines over that are not written but counted, and the next line
    written for that key carries ``suppressed=N`` (how many were left out since the last one).
    ``suppressed_total`` counts every line left out. ``mono_clock``: monotonic seconds."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        burst: int = 10,
        period_seconds: float = 60.0,
        mono_clock: MonotonicClock = SYSTEM_MONOTONIC,
    ) -> None:
        self._logger = logger
        self._burst = burst
        self._period = period_seconds
        self._mono_clock = mono_clock
        self._state: dict[tuple[str, str], list[float]] = {}  # [period start, lines, suppressed]
        self.suppressed_total = 0

    def log(self, level: int, event: str, **fields: Any) -> bool:
        """Write the line unless over the limit; True when written."""
        key = (event, str(fields.get("reason", "")))
        now = self._mono_clock()
        st = self._state.get(key)
        if st is None or now - st[0] >= self._period:
            suppressed = int(st[2]) if st is not None else 0
            st = self._state[key] = [now, 0.0, float(suppressed)]
        if st[1] >= self._burst:
            st[2] += 1
            self.suppressed_total += 1
            return False
        st[1] += 1
        if st[2]:
            fields["suppressed"] = int(st[2])
            st[2] = 0
        log_event(self._logger, level, event, **fields)
        return True

    def warning(self, event: str, **fields: Any) -> bool:
        """:meth:`log` at WARNING."""
        return self.log(logging.WARNING, event, **fields)


#: Loggers of the libraries specwatch serves and fetches with; their records go through the
#: same handler (and :class:`SecretFilter`) as specwatch's own.
LIBRARY_LOGGERS = ("aiohttp", "asyncio")


def resolve_format(fmt: str, stream: TextIO | None = None) -> str:
    """``fmt`` (``json``, ``plain`` or ``auto``) made definite: ``auto`` is ``plain`` when
    ``stream`` (default stderr) is a terminal, else ``json`` (a log collector's pipe or file)."""
    if fmt != "auto":
        return fmt
    target = stream if stream is not None else sys.stderr
    isatty = getattr(target, "isatty", None)
    return "plain" if callable(isatty) and isatty() else "json"


def setup_logging(
    level: str = "INFO",
    fmt: str = "json",
    stream: TextIO | None = None,
    *,
    secrets: Iterable[str] = (),
) -> None:
    """Configure the ``specwatch`` logger tree (idempotent): one handler writing to ``stream``
    (default stderr, so stdout stays free for command output); ``fmt`` is ``json``, ``plain`` or
    ``auto`` (:func:`resolve_format`);
    ``level`` a logging level name (``INFO``). The handler masks credentials in every record
    (:class:`SecretFilter`, with the configured ``secrets`` masked wherever they appear) and
    also writes aiohttp's and asyncio's records (:data:`LIBRARY_LOGGERS`, level WARNING), which
    otherwise reach stderr unformatted and unmasked (aiohttp echoes a bad request's header
    lines, ``Authorization`` included)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    fmt = resolve_format(fmt, handler.stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else PlainFormatter())
    masking = SecretFilter(secrets)
    handler.addFilter(masking)
    for name in ("specwatch", *LIBRARY_LOGGERS):
        lg = logging.getLogger(name)
        for old in list(lg.handlers):
            if getattr(old, "_specwatch", False):
                lg.removeHandler(old)
        lg.addHandler(handler)
    handler._specwatch = True  # type: ignore[attr-defined]
    logger = logging.getLogger("specwatch")
    logger.setLevel(level)
    logger.propagate = True
    for name in LIBRARY_LOGGERS:
        lib = logging.getLogger(name)
        if lib.level == logging.NOTSET:
            lib.setLevel(logging.WARNING)


_SECRET_PATTERNS: tuple[re.Pattern[str], ...] = (
    # user info of a URL: scheme://user:PASSWORD@host
    re.compile(r"(?P<keep>\b[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@'\"]*:)[^/\s@'\"]+(?=@)"),
    # an Authorization header line or mapping entry: keep the scheme word, hide the rest
    re.compile(
        r"(?i)(?P<keep>\b(?:proxy-)?authorization['\"]?\s*[:=,]\s*['\"]?(?:(?:bearer|basic|token)\s+)?)"
        r"[^\s'\",;\\]+"
    ),
    # a bare "Bearer xxx" / "Basic xxx" credential
    re.compile(r"(?i)(?P<keep>\b(?:bearer|basic)\s+)[A-Za-z0-9._~+/=-]{4,}"),
    # key=value / "key": "value" with a secret-looking key (query strings, JSON, headers)
    re.compile(
        r"(?i)(?P<keep>\b(?:api[_-]?key|x-api-key|access[_-]?token|auth[_-]?token|token|password|"
        r"passwd|secret)['\"]?\s*[:=]\s*['\"]?)(?!\*{10})[^\s'\",;&\\]+"
    ),
)


def mask_secrets(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with credentials replaced by ``**********``: each of ``secrets`` (configured
    tokens and passwords, masked wherever they appear), URL passwords, ``Authorization`` values,
    ``Bearer``/``Basic`` credentials and the values of ``token=``/``password=``-like keys."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, _HIDDEN)
    for pattern in _SECRET_PATTERNS:
        text = pattern.sub(lambda m: m.group("keep") + _HIDDEN, text)
    return text


def _mask_value(value: Any, secrets: tuple[str, ...]) -> Any:
    if isinstance(value, str):
        return mask_secrets(value, secrets)
    if isinstance(value, dict):
        return {k: _mask_value(v, secrets) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_mask_value(v, secrets) for v in value]
    if isinstance(value, int | float | bool) or value is None:
        return value
    return mask_secrets(str(value), secrets)


class SecretFilter(logging.Filter):
    """A handler filter that masks credentials (:func:`mask_secrets`) in a record's message,
    fields and exception text before any formatter sees them; never drops a record.

    ``secrets``: literal values to mask (configured bearer tokens, passwords); more can be
    added with :meth:`add`.
    """

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self._secrets: tuple[str, ...] = tuple(s for s in secrets if s)

    @property
    def secrets(self) -> tuple[str, ...]:
        """The literal values masked now."""
        return self._secrets

    def add(self, secret: str) -> None:
        """Mask ``secret`` from now on."""
        if secret and secret not in self._secrets:
            self._secrets = (*self._secrets, secret)

    def filter(self, record: logging.LogRecord) -> bool:
        """Mask ``record`` in place; always True."""
        secrets = self._secrets
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # bad %-args: show the template and the args as text
            message = f"{record.msg} {record.args}"
        masked = mask_secrets(message, secrets)
        if masked != message or record.args:
            record.msg, record.args = masked, None
        for key, value in list(record.__dict__.items()):
            if key == _FIELDS or (key not in _STANDARD and not key.startswith("_")):
                record.__dict__[key] = _mask_value(value, secrets)
        if record.exc_info and record.exc_info[0] is not None:
            text = "".join(traceback.format_exception(*record.exc_info)).rstrip()
            record.exc_text = mask_secrets(text, secrets)
            record.exc_info = None
        elif record.exc_text:
            record.exc_text = mask_secrets(record.exc_text, secrets)
        return True


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
