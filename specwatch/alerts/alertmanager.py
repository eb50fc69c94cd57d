"""Alertmanager API v2 client: alert values, lease bookkeeping, an outbox and the resend loop.

Contract followed (prometheus.io ``docs/alerting/clients``, Prometheus' notifier):

* ``POST {url}/api/v2/alerts`` with a JSON **array** of ``{labels, annotations, startsAt,
  endsAt, generatorURL}``; ``labels`` identify an alert (``alertname`` required), annotations
  are last-received-wins (``summary``, ``description``, ``runbook_url``).
* ``startsAt`` is fixed for the life of an alert; every (re)send carries ``endsAt = now + lease``
  with ``lease = LEASE_FACTOR * max(resend_interval, evaluation_interval)`` (4, as Prometheus),
  so Alertmanager resolves on its own if specwatch dies. A firing alert is re-posted every
  ``resend_interval`` (its annotations, which carry live values, go with the next resend; a
  change of them alone posts nothing). A cleared alert is sent with ``endsAt`` = its resolution
  time, and re-sent with that ``endsAt`` every ``resend_interval`` for
  :data:`RESOLVED_RETENTION_SECONDS` (Prometheus keeps resolved alerts 15 min and resends them
  likewise), so a peer that missed the first resolve still gets it.
* Each Alertmanager is a peer of its own (an HA cluster is several peers; each gets every
  alert, as Prometheus sends them): its own outbox, counters and last-error state, and its own
  clock offset, read from the ``Date`` header of its answers. ``startsAt``/``endsAt`` are sent
  in the peer's clock (specwatch's time plus the offset, once the offset is
  :data:`CLOCK_TOLERANCE_SECONDS` or more): a sidecar 6 minutes slow would otherwise post alerts
  whose ``endsAt`` Alertmanager already sees as past (accepted, never notified), 6 minutes fast
  resolves that end in its future (alerts hang on). Compensating rather than refusing keeps
  alerts flowing while the clock is wrong; an offset over :data:`CLOCK_WARN_SECONDS` is logged
  (once per peer until it comes back) and exported.
* Delivery is known to work, not assumed: a peer posted nothing for ``resend_interval`` gets
  an empty array posted (Alertmanager answers it like any post, credentials and TLS
  included), and :meth:`AlertSender.delivering` is true while some peer acknowledged a post within
  :func:`delivery_window`. The sidecar exports it (``specwatch_alertmanager_delivering``) and the
  mixin's rules with the sidecar's alert names fire only unless it is 1: one loss, one page,
  and the rules page when this path is broken.
* Label names are sanitised to ``[a-zA-Z_][a-zA-Z0-9_]*`` under stable names, and an empty
  value is dropped only where that merges no two alerts
  (:func:`~specwatch.alerts.alert.keep_distinct`).

Pure parts (:class:`Alert`, :func:`sanitize_labels`, :func:`build_payload`, :class:`ActiveAlerts`,
:class:`Outbox`) take values and return values. :class:`AlertSender` does the HTTP over an
injected ``aiohttp.ClientSession``; :class:`AlertLoop` ties them to an injected clock and sleep.
The published :class:`~specwatch.alerts.values.AlertingState` is exported by
:class:`specwatch.export.prometheus.AlertsCollector` and :func:`specwatch.export.json.alerts_json`.
"""

from __future__ import annotations

import asyncio
import base64
import email.utils
import logging
import ssl
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from specwatch.alerts.alert import (
    Alert,
    AlertKey,
    alert_key,
    keep_distinct,
    runbook_url,
    sanitize_labels,
)
from specwatch.alerts.settings import (
    DEFAULT_RUNBOOK_BASE_URL,
    AlertingSettings,
    TLSSettings,
)
from specwatch.alerts.values import SEND_ERROR_REASONS, AlertingState, FiringAlert, PeerState
from specwatch.core.clock import SYSTEM_WALL, WallClock, format_rfc3339
from specwatch.core.logs import log_event, redact_url

#: The first retry of a failed send waits this many seconds; each further one twice as long.
RETRY_INITIAL_BACKOFF_SECONDS = 0.5
#: No retry waits longer than this many seconds.
RETRY_MAX_BACKOFF_SECONDS = 8.0
#: A resolved alert is re-sent (same ``endsAt``) every ``resend_interval`` for this long after
#: it resolved (Prometheus' resolved-alert retention, 15 min).
RESOLVED_RETENTION_SECONDS = 900.0
#: A peer's clock offset below this is not compensated: the ``Date`` header has one-second
#: resolution, so smaller offsets cannot be told from rounding and the request's own time.
CLOCK_TOLERANCE_SECONDS = 2.0
#: A peer's clock offset above this many seconds is logged as a warning.
CLOCK_WARN_SECONDS = 30.0
#: A ``Date`` header further than this many seconds from specwatch's clock is not believed
#: (counted as ``bad_date``, the last offset kept): no clock drifts a day, and an absurd year
#: would put alert times out of range.
CLOCK_MAX_OFFSET_SECONDS = 86400.0
#: At most this many bytes of an error answer's body are read (for the log line).
ERROR_BODY_MAX_BYTES = 1024

__all__ = [
    "DEFAULT_RUNBOOK_BASE_URL",
    "ActiveAlerts",
    "AlertLoop",
    "AlertSender",
    "AlertingSettings",
    "Delivery",
    "Outbox",
    "TLSSettings",
    "build_payload",
    "build_ssl_context",
    "date_offset",
    "delivery_window",
]

log = logging.getLogger("specwatch.alerts.alertmanager")

#: Where ``docs/runbook.md`` is published; anchors are the lower-cased alert names.

#: 4xx answers that say "later", not "never": retried like a 5xx (counted as http_4xx).
_RETRYABLE_4XX = frozenset({408, 429})


@dataclass(frozen=True, slots=True)
class Delivery:
    """One alert as it goes to Alertmanager.

    ``labels`` are final (external labels applied, sanitised); ``ends_at`` is ``None`` for a
    firing alert (the sender stamps ``now + lease`` when it actually posts, so an alert queued
    while Alertmanager was down still arrives with a live lease) and the resolution time for a
    resolved one.
    """

    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    starts_at: float
    ends_at: float | None
    generator_url: str = ""

    @property
    def key(self) -> AlertKey:
        return alert_key(self.labels)

    @property
    def resolved(self) -> bool:
        return self.ends_at is not None


def build_payload(
    deliveries: Iterable[Delivery], now: float, lease: float, offset: float = 0.0
) -> list[dict[str, Any]]:
    """JSON body for ``POST /api/v2/alerts``: one object per delivery.

    Firing alerts get ``endsAt = now + lease`` (seconds); resolved ones their own ``ends_at``
    less :data:`CLOCK_TOLERANCE_SECONDS` (never before ``starts_at``): Alertmanager takes an
    ``endsAt`` still in its future as a shorter lease, which loses to the lease it holds, so a
    resolve must reach it already past even under an offset too small to measure. Every time
    is shifted by ``offset`` seconds (the peer's clock minus specwatch's).
    """
    body: list[dict[str, Any]] = []
    for d in deliveries:
        if d.ends_at is None:
            ends = now + lease
        else:
            ends = max(d.ends_at - CLOCK_TOLERANCE_SECONDS, d.starts_at)
        item: dict[str, Any] = {
            "labels": dict(d.labels),
            "annotations": {k: v for k, v in d.annotations.items() if v},
            "startsAt": format_rfc3339(d.starts_at + offset),
            "endsAt": format_rfc3339(ends + offset),
        }
        if d.generator_url:
            item["generatorURL"] = d.generator_url
        body.append(item)
    return body


def date_offset(date_header: str | None, sent_at: float, received_at: float) -> float | None:
    """The peer's clock minus ours, in seconds, from its HTTP ``Date`` header (RFC 9110
    IMF-fixdate, whole seconds) and our wall times before the request and after the answer:
    the header's second plus 0.5 (its mean truncation) against the midpoint of the exchange.
    ``None`` when the header is absent or unreadable."""
    if not date_header:
        return None
    try:
        when = email.utils.parsedate_to_datetime(date_header)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return when.timestamp() + 0.5 - (sent_at + received_at) / 2


def delivery_window(settings: AlertingSettings) -> float:
    """Seconds after an acknowledged post that delivery still counts as working: two resend
    intervals (one missed heartbeat or resend tolerated; the evaluation interval when longer)
    plus the send timeout."""
    return 2 * max(settings.resend_interval, settings.evaluation_interval) + settings.timeout


@dataclass(slots=True)
class _Active:
    alert: Alert
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: float
    last_sent: float
    ends_at: float | None = None


class ActiveAlerts:
    """Lease bookkeeping: which alerts fire, since when, and what must be (re)sent now.

    :meth:`update` takes the current findings and ``now`` (unix seconds) and returns the
    deliveries due: new alerts, alerts whose last send is ``resend_interval`` old (with their
    latest annotations; a change of annotations alone is not a reason to post), alerts that
    disappeared (``ends_at = now``), and resolved alerts whose last send is ``resend_interval``
    old, for :data:`RESOLVED_RETENTION_SECONDS` after they resolved (the same ``ends_at``).
    ``startsAt`` of an alert never changes while it stays in the findings; one that fires
    again after resolving is a new alert (a new ``startsAt``).
    """

    def __init__(
        self,
        *,
        resend_interval: float,
        external_labels: Mapping[str, str] | None = None,
        runbook_base_url: str = DEFAULT_RUNBOOK_BASE_URL,
        generator_url: str = "",
    ) -> None:
        self._resend = resend_interval
        self._external = sanitize_labels(external_labels or {})
        self._runbook_base = runbook_base_url
        self._generator_url = generator_url
        self._active: dict[AlertKey, _Active] = {}
        self._resolved: dict[AlertKey, _Active] = {}
        self._held: set[AlertKey] = set()
        self._hold_until = float("-inf")

    @classmethod
    def from_settings(cls, settings: AlertingSettings) -> ActiveAlerts:
        """The bookkeeping of the ``alerting`` group: its ``resend_interval``, the provenance
        labels (``external_labels`` plus ``namespace`` and ``pod``), ``runbook_base_url`` and
        ``generator_url``."""
        return cls(
            resend_interval=settings.resend_interval,
            external_labels=settings.provenance_labels(),
            runbook_base_url=settings.runbook_base_url,
            generator_url=settings.generator_url,
        )

    def _labels(self, alert: Alert) -> dict[str, str]:
        labels = dict(self._external)
        labels.update(alert.identity())  # the alert's own labels win (Prometheus does the same)
        return labels

    def _annotations(self, alert: Alert) -> dict[str, str]:
        url = alert.runbook_url or runbook_url(self._runbook_base, alert.alertname)
        return {"summary": alert.summary, "description": alert.description, "runbook_url": url}

    def update(self, findings: Sequence[Alert], now: float) -> list[Delivery]:
        """Fold in this tick's findings; return what to send now (see class doc)."""
        due: list[Delivery] = []
        seen: set[AlertKey] = set()
        for alert in keep_distinct(findings):
            labels = self._labels(alert)
            key = alert_key(labels)
            if key in seen:
                continue  # duplicate finding in one tick: first one wins
            seen.add(key)
            annotations = self._annotations(alert)
            current = self._active.get(key)
            if current is None:
                self._resolved.pop(key, None)
                current = _Active(alert, labels, annotations, starts_at=now, last_sent=now)
                self._active[key] = current
            else:
                current.alert = alert
                current.annotations = annotations  # carried by the next resend
                if now - current.last_sent < self._resend:
                    continue
                current.last_sent = now
            due.append(Delivery(labels, annotations, current.starts_at, None, self._generator_url))
        for key, old in list(self._resolved.items()):
            assert old.ends_at is not None
            if now - old.ends_at >= RESOLVED_RETENTION_SECONDS:
                del self._resolved[key]
            elif now - old.last_sent >= self._resend:
                old.last_sent = now
                due.append(
                    Delivery(
                        old.labels, old.annotations, old.starts_at, old.ends_at, self._generator_url
                    )
                )
        self._held -= seen
        if now >= self._hold_until:
            self._held.clear()
        for key in [k for k in self._active if k not in seen]:
            if key in self._held:  # restored and not yet re-evaluated: keep its lease alive
                held = self._active[key]
                if now - held.last_sent >= self._resend:
                    held.last_sent = now
                    due.append(
                        Delivery(
                            held.labels, held.annotations, held.starts_at, None, self._generator_url
                        )
                    )
                continue
            gone = self._active.pop(key)
            gone.ends_at = gone.last_sent = now
            self._resolved[key] = gone
            due.append(
                Delivery(gone.labels, gone.annotations, gone.starts_at, now, self._generator_url)
            )
        return due

    def export(self) -> list[tuple[Alert, float]]:
        """The active alerts as ``(finding, startsAt unix seconds)``, sorted by labels."""
        return [(a.alert, a.starts_at) for _, a in sorted(self._active.items())]

    def restore(self, active: Iterable[tuple[Alert, float]], hold_until: float) -> None:
        """Take back :meth:`export` of a previous process: each alert keeps its ``startsAt``
        and is resent on the next :meth:`update`. Until ``hold_until`` (unix seconds) a restored
        alert missing from the findings stays firing (its lease renewed every
        ``resend_interval``) instead of being resolved; once seen again it is an ordinary one."""
        for alert, starts_at in active:
            labels = self._labels(alert)
            key = alert_key(labels)
            if key in self._active:
                continue
            self._active[key] = _Active(
                alert, labels, self._annotations(alert), starts_at, last_sent=float("-inf")
            )
            self._held.add(key)
        self._hold_until = hold_until

    def firing(self) -> tuple[FiringAlert, ...]:
        """Alerts active after the last :meth:`update`, sorted by labels."""
        return tuple(
            FiringAlert(labels=dict(a.alert.identity()), starts_at=a.starts_at)
            for _, a in sorted(self._active.items())
        )


class Outbox:
    """Bounded queue of pending deliveries for one Alertmanager, latest state per alert.

    Adding a delivery for an alert already queued replaces it (a resolve replaces a pending
    fire and vice versa), keeping its place. When full, the oldest entry is dropped and
    counted; dropping is safe because firing alerts are renewed on every resend and a
    dropped resolve still ends when its lease runs out.
    """

    def __init__(self, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError("outbox maxsize must be >= 1")
        self._max = maxsize
        self._items: OrderedDict[AlertKey, Delivery] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def add(self, deliveries: Iterable[Delivery]) -> int:
        """Queue ``deliveries``; return how many old entries were dropped for room."""
        dropped = 0
        for d in deliveries:
            key = d.key
            if key in self._items:
                self._items[key] = d
                continue
            if len(self._items) >= self._max:
                self._items.popitem(last=False)
                dropped += 1
            self._items[key] = d
        return dropped

    def peek(self) -> list[Delivery]:
        return list(self._items.values())

    def remove(self, sent: Iterable[Delivery]) -> None:
        """Drop entries that were delivered, unless a newer delivery replaced them since."""
        for d in sent:
            if self._items.get(d.key) is d:
                del self._items[d.key]


def build_ssl_context(tls: TLSSettings) -> ssl.SSLContext | bool:
    """The ``ssl=`` argument for aiohttp: ``False`` (skip verification), ``True`` (system
    defaults) or a context with the CA file / client cert loaded. Reads files: call once at
    start-up. Raises ``OSError``/``ssl.SSLError`` for unreadable files.
    """
    if tls.insecure_skip_verify:
        return False
    if tls.ca_file is None and tls.cert_file is None:
        return True
    ctx = ssl.create_default_context(cafile=str(tls.ca_file) if tls.ca_file else None)
    if tls.cert_file is not None and tls.key_file is not None:
        ctx.load_cert_chain(str(tls.cert_file), str(tls.key_file))
    return ctx


@dataclass(slots=True)
class _Peer:
    """One Alertmanager's outbox, counters, last-error state and clock offset."""

    url: str
    outbox: Outbox
    errors: dict[str, int]
    sent_alerts: int = 0
    last_send_ok: bool | None = None
    last_error: str = ""
    last_error_at: float | None = None
    clock_offset: float | None = None
    clock_warned: bool = False
    compensating: bool = False
    last_ack_at: float | None = None
    last_post_at: float | None = None

    @property
    def label(self) -> str:
        return redact_url(self.url)

    @property
    def applied_offset(self) -> float:
        """The offset sent times are shifted by: on from :data:`CLOCK_TOLERANCE_SECONDS`, off
        again only under half of it (so the header's rounding near the edge does not switch
        it at every answer)."""
        off = self.clock_offset
        return off if off is not None and self.compensating else 0.0

    def state(self) -> PeerState:
        return PeerState(
            peer=self.label,
            sent_alerts=self.sent_alerts,
            errors=dict(self.errors),
            outbox_depth=len(self.outbox),
            last_send_ok=self.last_send_ok,
            last_error=self.last_error,
            last_error_at=self.last_error_at,
            clock_offset=self.clock_offset,
        )


class AlertSender:
    """Posts deliveries to every configured Alertmanager (a peer each), each with its own outbox,
    counters, last-error state and clock offset (see the module doc).

    A send is one ``POST``; connection errors, timeouts and 5xx are retried up to
    ``max_attempts`` with exponential backoff (:data:`RETRY_INITIAL_BACKOFF_SECONDS`
    ``* 2**n`` capped at :data:`RETRY_MAX_BACKOFF_SECONDS`) through the injected ``sleep``;
    what still fails stays in the outbox
    for the next :meth:`flush`. A 4xx is logged and counted (``http_4xx``) and the batch is
    dropped: resending the same body cannot succeed (408 and 429 are retried like a 5xx); a
    redirect is not followed and is handled likewise (``http_3xx``). At most
    :data:`ERROR_BODY_MAX_BYTES` of an error answer's body are read, decoded leniently, for the
    log line. A ``Date`` header over :data:`CLOCK_MAX_OFFSET_SECONDS` off is counted as
    ``bad_date`` and not used. One failed flush counts one reason (a flush cut off after a refused
    connection is ``connect``, not also ``timeout``); a flush failing on an error of our own is
    counted as ``internal`` and logged with its traceback, and the loop goes on.
    One flush of one Alertmanager is cut off after ``evaluation_interval`` seconds (counted as
    ``timeout``), so a black-holed Alertmanager delays the loop by at most one interval.
    An accepted batch whose answer shows the peer's clock offset moved by
    :data:`CLOCK_TOLERANCE_SECONDS` or more from the one it was built with is posted once more
    at once with corrected times (the first post to a peer whose clock is off).
    """

    def __init__(
        self,
        settings: AlertingSettings,
        session: aiohttp.ClientSession,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        ssl_context: ssl.SSLContext | bool | None = None,
        wall_clock: WallClock = SYSTEM_WALL,
    ) -> None:
        self._settings = settings
        self._session = session
        self._sleep = sleep
        self._wall_clock = wall_clock
        self._ssl = build_ssl_context(settings.tls) if ssl_context is None else ssl_context
        self._peers = [
            _Peer(url, Outbox(settings.outbox_size), dict.fromkeys(SEND_ERROR_REASONS, 0))
            for url in settings.urls
        ]
        headers = {"Content-Type": "application/json"}
        if settings.bearer_token is not None:
            headers["Authorization"] = f"Bearer {settings.bearer_token.get_secret_value()}"
        if settings.basic_username is not None and settings.basic_password is not None:
            token = base64.b64encode(
                f"{settings.basic_username}:{settings.basic_password.get_secret_value()}".encode()
            ).decode("ascii")
            headers["Authorization"] = f"Basic {token}"
        self._headers = headers

    @property
    def outbox_depth(self) -> int:
        """Pending deliveries summed over all Alertmanagers."""
        return sum(len(p.outbox) for p in self._peers)

    @property
    def errors(self) -> dict[str, int]:
        """Failed sends by reason, summed over all Alertmanagers."""
        out = dict.fromkeys(SEND_ERROR_REASONS, 0)
        for p in self._peers:
            for reason, n in p.errors.items():
                out[reason] += n
        return out

    def peers(self) -> tuple[PeerState, ...]:
        """Each Alertmanager's state now, in the order of ``alerting.urls``."""
        return tuple(p.state() for p in self._peers)

    def delivering(self, now: float) -> bool:
        """Whether some Alertmanager acknowledged a post (alerts or the empty heartbeat) within
        :func:`delivery_window` of ``now`` and its last send succeeded."""
        window = delivery_window(self._settings)
        return any(
            p.last_send_ok and p.last_ack_at is not None and now - p.last_ack_at <= window
            for p in self._peers
        )

    def enqueue(self, deliveries: Sequence[Delivery]) -> None:
        for peer in self._peers:
            dropped = peer.outbox.add(deliveries)
            if dropped:
                peer.errors["outbox_overflow"] += dropped
                log_event(
                    log,
                    logging.WARNING,
                    "alertmanager outbox full",
                    url=peer.label,
                    dropped=dropped,
                )

    def _failed(self, peer: _Peer, reason: str) -> None:
        peer.errors[reason] += 1
        peer.last_send_ok = False
        peer.last_error = reason
        peer.last_error_at = self._wall_clock()

    async def flush(self, now: float) -> None:
        """Try to deliver every outbox (concurrently across Alertmanagers)."""
        await asyncio.gather(*(self._flush_one(peer, now) for peer in self._peers))

    async def _flush_one(self, peer: _Peer, now: float) -> None:
        pending = peer.outbox.peek()
        last = peer.last_post_at
        if not pending and last is not None and now - last < self._settings.resend_interval:
            return  # nothing to send, and the last post (or heartbeat) is recent
        peer.last_post_at = now
        endpoint = f"{peer.url}/api/v2/alerts"
        failures = sum(peer.errors.values())
        try:
            # One flush never outlasts an evaluation interval, so an unreachable Alertmanager
            # cannot hold up the next evaluation; what is left stays queued.
            async with asyncio.timeout(self._settings.evaluation_interval):
                await self._attempts(peer, endpoint, now, pending)
        except TimeoutError:
            if sum(peer.errors.values()) == failures:  # one reason per failed flush
                self._failed(peer, "timeout")
            log_event(
                log, logging.WARNING, "alertmanager flush ran out of time", url=redact_url(endpoint)
            )
        except Exception:  # a bug of ours on some answer must not end the alert loop
            self._failed(peer, "internal")
            log_event(
                log,
                logging.ERROR,
                "alertmanager flush failed",
                url=redact_url(endpoint),
                reason="internal",
                exc_info=True,
            )

    async def _attempts(
        self, peer: _Peer, endpoint: str, now: float, pending: list[Delivery]
    ) -> None:
        delay = RETRY_INITIAL_BACKOFF_SECONDS
        corrected = False
        attempt = 1
        while attempt <= self._settings.max_attempts:
            offset = peer.applied_offset
            body = build_payload(pending, now, self._settings.lease, offset)
            outcome = await self._post(peer, endpoint, body)
            moved = abs(peer.applied_offset - offset) >= CLOCK_TOLERANCE_SECONDS
            if outcome == "ok" and moved and not corrected:
                corrected = True  # built with a stale offset: once more, in the peer's clock
                continue
            if outcome in ("ok", "http_3xx", "http_4xx"):  # cannot succeed on resend: drop it
                peer.outbox.remove(pending)
                return
            if attempt < self._settings.max_attempts:
                await self._sleep(min(delay, RETRY_MAX_BACKOFF_SECONDS))
                delay *= 2
            attempt += 1

    def _clock(self, peer: _Peer, date_header: str | None, sent_at: float) -> None:
        offset = date_offset(date_header, sent_at, self._wall_clock())
        if not date_header:
            return
        if offset is None or abs(offset) > CLOCK_MAX_OFFSET_SECONDS:
            peer.errors["bad_date"] += 1  # the last good offset stays
            log_event(
                log,
                logging.WARNING,
                "alertmanager answered with an unbelievable Date header; its clock offset is kept",
                url=peer.label,
                reason="bad_date",
                date=date_header[:64],
            )
            return
        peer.clock_offset = offset
        if abs(offset) >= CLOCK_TOLERANCE_SECONDS:
            peer.compensating = True
        elif abs(offset) < CLOCK_TOLERANCE_SECONDS / 2:
            peer.compensating = False
        far = abs(offset) > CLOCK_WARN_SECONDS
        if far and not peer.clock_warned:
            log_event(
                log,
                logging.WARNING,
                "alertmanager clock differs from specwatch's; alert times are sent in its clock",
                url=peer.label,
                offset_seconds=round(offset, 1),
                hint="fix NTP on this node or the Alertmanager's",
            )
        elif not far and peer.clock_warned:
            log_event(
                log,
                logging.INFO,
                "alertmanager clock agrees with specwatch's again",
                url=peer.label,
                offset_seconds=round(offset, 1),
            )
        peer.clock_warned = far

    async def _post(self, peer: _Peer, endpoint: str, body: list[dict[str, Any]]) -> str:
        timeout = aiohttp.ClientTimeout(total=self._settings.timeout)
        sent_at = self._wall_clock()
        try:
            async with self._session.post(
                endpoint,
                json=body,
                headers=self._headers,
                ssl=self._ssl,
                timeout=timeout,
                allow_redirects=False,
            ) as resp:
                self._clock(peer, resp.headers.get("Date"), sent_at)
                if resp.status < 300:
                    peer.sent_alerts += len(body)
                    peer.last_send_ok = True
                    peer.last_ack_at = self._wall_clock()
                    return "ok"
                text = (await _read_bounded(resp.content)).decode("utf-8", errors="replace")
                if resp.status < 400:
                    reason = "http_3xx"  # a redirect is not followed for a POST
                elif resp.status < 500:
                    reason = "http_4xx"
                else:
                    reason = "http_5xx"
                self._failed(peer, reason)
                log_event(
                    log,
                    logging.WARNING,
                    "alertmanager rejected alerts",
                    url=redact_url(endpoint),
                    status=resp.status,
                    reason=reason,
                    body=text[:200],
                )
                if resp.status in _RETRYABLE_4XX:
                    return "retry"
                return reason
        except TimeoutError:
            self._failed(peer, "timeout")
            log_event(log, logging.WARNING, "alertmanager send timed out", url=redact_url(endpoint))
            return "timeout"
        except aiohttp.ClientError as exc:
            self._failed(peer, "connect")
            log_event(
                log,
                logging.WARNING,
                "alertmanager send failed",
                url=redact_url(endpoint),
                error=str(exc),
            )
            return "connect"


async def _read_bounded(content: aiohttp.StreamReader) -> bytes:
    """The first :data:`ERROR_BODY_MAX_BYTES` of a body (less at its end); the rest is never
    read (the connection is closed rather than drained when the answer is released)."""
    chunks: list[bytes] = []
    left = ERROR_BODY_MAX_BYTES
    while left > 0:
        chunk = await content.read(left)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class AlertLoop:
    """Every ``evaluation_interval``: read findings, renew/resolve leases, deliver.

    ``current_findings`` is called once per tick and returns the findings of that moment
    (an empty sequence resolves everything active). ``wall_clock`` returns unix seconds.
    ``on_state`` is called with every newly published :class:`AlertingState` (the alerting
    component hands it to the server, which publishes it as ``Snapshot.alerts``);
    ``after_tick`` is awaited at the end of every tick (the component saves its state there);
    ``state_errors`` (a live mapping owned by the caller) is published as
    :attr:`AlertingState.state_errors`.
    With no ``urls`` configured nothing is sent, but :attr:`state` still tracks firing alerts.
    """

    def __init__(
        self,
        settings: AlertingSettings,
        session: aiohttp.ClientSession,
        current_findings: Callable[[], Sequence[Alert]],
        *,
        wall_clock: WallClock = SYSTEM_WALL,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        ssl_context: ssl.SSLContext | bool | None = None,
        on_state: Callable[[AlertingState], None] | None = None,
        after_tick: Callable[[], Awaitable[None]] | None = None,
        state_errors: Mapping[str, int] | None = None,
    ) -> None:
        self._settings = settings
        self._on_state = on_state
        self._after_tick = after_tick
        self._state_errors = state_errors if state_errors is not None else {}
        self._findings = current_findings
        self._wall_clock = wall_clock
        self._sleep = sleep
        self._active = ActiveAlerts.from_settings(settings)
        self._sender = AlertSender(
            settings, session, sleep=sleep, ssl_context=ssl_context, wall_clock=wall_clock
        )
        self._state = AlertingState(
            peers=self._sender.peers(), state_errors=dict(self._state_errors)
        )

    @property
    def state(self) -> AlertingState:
        """The last published :class:`AlertingState`."""
        return self._state

    @property
    def active(self) -> ActiveAlerts:
        """The lease bookkeeping (export/restore across restarts)."""
        return self._active

    async def tick(self) -> None:
        """One evaluation: findings → deliveries → outbox → send; then publish state."""
        now = self._wall_clock()
        due = self._active.update(self._findings(), now)
        self._sender.enqueue(due)
        self._publish()
        await self._sender.flush(self._wall_clock())
        if self._after_tick is not None:
            await self._after_tick()
        self._publish()

    def _publish(self) -> None:
        self._state = AlertingState(
            firing=self._active.firing(),
            peers=self._sender.peers(),
            state_errors=dict(self._state_errors),
            delivering=self._sender.delivering(self._wall_clock()),
        )
        if self._on_state is not None:
            self._on_state(self._state)

    async def run(self) -> None:
        """Tick forever (cancel the task to stop)."""
        while True:
            await self.tick()
            await self._sleep(self._settings.evaluation_interval)
