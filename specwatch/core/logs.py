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
from collections.abc import Hashable, Iterable, Mapping
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
    _emit(logger, level, event, fields, limited=False)


#: A record attribute: the line was limited where it was written (:class:`RateLimitedLog`), so
#: :class:`LimitFilter` passes it (its clock and budget are that log's).
_LIMITED = "_specwatch_limited"


def _emit(
    logger: logging.Logger, level: int, event: str, fields: dict[str, Any], *, limited: bool
) -> None:
    if logger.isEnabledFor(level):
        exc_info = bool(fields.pop("exc_info", False))
        logger.log(level, event, exc_info=exc_info, extra={_FIELDS: fields, _LIMITED: limited})


#: The fields that tell one repeated warning from another besides its event: the same event
#: with another reason, setting, target, listener, source, arm or task has its own budget.
LIMIT_KEY_FIELDS = ("reason", "setting", "target", "listener", "source", "arm", "task")
#: Lines of one kind written per period (what the runbook promises: 10 a minute per reason).
LIMIT_BURST = 10
LIMIT_PERIOD_SECONDS = 60.0
#: Kinds remembered at most; past it the oldest periods are forgotten (an event name or reason
#: is code's, so this bounds only what a bug could grow).
_MAX_KINDS = 4096


class LogLimiter:
    """The one rate limiter of repeated log lines: at most ``burst`` lines per
    ``period_seconds`` for each kind (a hashable key); the lines over that are left out and
    counted, and the next line admitted for that kind is told how many were (``suppressed``).
    ``suppressed_total`` counts every line left out. ``mono_clock``: monotonic seconds."""

    def __init__(
        self,
        *,
        burst: int = LIMIT_BURST,
        period_seconds: float = LIMIT_PERIOD_SECONDS,
        mono_clock: MonotonicClock = SYSTEM_MONOTONIC,
    ) -> None:
        self._burst = burst
        self._period = period_seconds
        self._mono_clock = mono_clock
        self._state: dict[Hashable, list[float]] = {}  # [period start, lines, suppressed]
        self.suppressed_total = 0

    def admit(self, kind: Hashable) -> int | None:
        """``None`` when a line of ``kind`` is to be left out now (counted); else the number
        left out since the last one written (0: none)."""
        now = self._mono_clock()
        st = self._state.get(kind)
        if st is None or now - st[0] >= self._period:
            suppressed = st[2] if st is not None else 0.0
            if st is None and len(self._state) >= _MAX_KINDS:
                self._forget(now)
            st = self._state[kind] = [now, 0.0, suppressed]
        if st[1] >= self._burst:
            st[2] += 1
            self.suppressed_total += 1
            return None
        st[1] += 1
        left_out, st[2] = int(st[2]), 0.0
        return left_out

    def _forget(self, now: float) -> None:
        for kind in [k for k, st in self._state.items() if now - st[0] >= self._period]:
            del self._state[kind]
        if len(self._state) >= _MAX_KINDS:
            self._state.clear()


def limit_kind(logger_name: str, event: str, fields: Mapping[str, Any]) -> tuple[Any, ...]:
    """What one repeated line is counted as: its logger, its event and the
    :data:`LIMIT_KEY_FIELDS` it has."""
    return (logger_name, event, *(str(fields.get(k, "")) for k in LIMIT_KEY_FIELDS))


class RateLimitedLog:
    """:func:`log_event` for events that outside input can repeat at will (bad requests,
    refused connections), limited by a :class:`LogLimiter` of its own: at most ``burst``
    lines per ``period_seconds`` for each (event, ``reason``, ...) kind (:func:`limit_kind`);
    the next line written for that kind carries ``suppressed=N``. Every other WARNING or
    ERROR line is limited the same way where it is written (:class:`LimitFilter` on the
    handler of :func:`setup_logging`); this one also counts (``suppressed_total``) and takes a
    clock."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        burst: int = LIMIT_BURST,
        period_seconds: float = LIMIT_PERIOD_SECONDS,
        mono_clock: MonotonicClock = SYSTEM_MONOTONIC,
    ) -> None:
        self._logger = logger
        self._limiter = LogLimiter(
            burst=burst, period_seconds=period_seconds, mono_clock=mono_clock
        )

    @property
    def suppressed_total(self) -> int:
        """Every line left out so far."""
        return self._limiter.suppressed_total

    def log(self, level: int, event: str, **fields: Any) -> bool:
        """Write the line unless over the limit; True when written."""
        left_out = self._limiter.admit(limit_kind(self._logger.name, event, fields))
        if left_out is None:
            return False
        if left_out:
            fields["suppressed"] = left_out
        _emit(self._logger, level, event, fields, limited=True)
        return True

    def warning(self, event: str, **fields: Any) -> bool:
        """:meth:`log` at WARNING."""
        return self.log(logging.WARNING, event, **fields)


class LimitFilter(logging.Filter):
    """A handler filter: every record at WARNING or above (specwatch's and the libraries')
    is limited per kind (:func:`limit_kind`: its logger, event or message template, and its
    reason-like fields) by one :class:`LogLimiter`; a record over the limit is dropped and the
    next one of its kind written carries ``suppressed=N``. INFO and DEBUG pass untouched."""

    def __init__(self, limiter: LogLimiter | None = None) -> None:
        super().__init__()
        self.limiter = limiter if limiter is not None else LogLimiter()

    def filter(self, record: logging.LogRecord) -> bool:
        """False for a record left out; adds ``suppressed`` to the next one written."""
        if record.levelno < logging.WARNING or getattr(record, _LIMITED, False):
            return True
        fields = event_fields(record)
        left_out = self.limiter.admit(limit_kind(record.name, str(record.msg), fields))
        if left_out is None:
            return False
        if left_out and "suppressed" not in fields:
            given = getattr(record, _FIELDS, None)
            if isinstance(given, dict):
                setattr(record, _FIELDS, {**given, "suppressed": left_out})
            else:
                record.suppressed = left_out
        return True


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
    ``auto`` (:func:`resolve_format`); ``level`` a logging level name (``INFO``). The handler
    writes at most 10 lines a minute of each kind of WARNING or ERROR (:class:`LimitFilter`: per
    event and reason, the next line carrying ``suppressed=N``), masks credentials in every record
    (:class:`SecretFilter`, with the configured ``secrets`` masked wherever they appear) and
    also writes aiohttp's and asyncio's records (:data:`LIBRARY_LOGGERS`, level WARNING), which
    otherwise reach stderr unformatted and unmasked (aiohttp echoes a bad request's header
    lines, ``Authorization`` included)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    fmt = resolve_format(fmt, handler.stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else PlainFormatter())
    handler.addFilter(LimitFilter())  # first: a line left out is never masked or formatted
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
