"""Drive the trackers: one scrape loop per target = fetch → parse → tracker, with logging.

:class:`Scraper` runs one loop per target (never two scrapes of one target at once), fetches
the page (:func:`specwatch.observe.fetch.fetch_metrics`), parses it (in a worker thread when
it is over :data:`PARSE_IN_THREAD_BYTES`: a page of 100k series takes seconds to parse, and
``/healthz`` must answer meanwhile), updates the
:class:`~specwatch.observe.tracker.TargetTracker`, logs the changes worth a line, and calls
``on_update`` so the server can publish a new view.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import aiohttp

from specwatch.core.clock import SYSTEM_MONOTONIC, MonotonicClock, WallClock
from specwatch.core.logs import log_event, redact_url
from specwatch.observe.fetch import fetch_metrics, fetch_server_info
from specwatch.observe.parse import PROCESS_LABEL, ParseError, parse_page
from specwatch.observe.sglang_health import sglang_observed_k
from specwatch.observe.tracker import TargetTracker, build_view
from specwatch.observe.values import ObserveView, PageReading
from specwatch.vllm.sglang import EngineKind, server_info_facts

if TYPE_CHECKING:  # annotations only: the loop runs on values the root settings built
    from specwatch.observe.settings import ScrapeSettings, TargetSettings

__all__ = ["Scraper", "next_tick"]

logger = logging.getLogger("specwatch.scrape")

#: Pages larger than this are parsed in a worker thread (the parse is pure; the event loop gets
#: the interpreter back every switch interval, so other requests are answered meanwhile);
#: smaller ones, the usual vLLM page of tens of KiB, inline (no thread hop).
PARSE_IN_THREAD_BYTES = 256 << 10


class _CollectorPause:
    """The cyclic garbage collector paused while at least one large page parses in a worker
    thread (a parse of 100k series builds hundreds of thousands of objects; each full
    collection they set off held the interpreter, and so the event loop, for up to 0.6 s on a
    loaded machine; the parse makes no reference cycles, so nothing waits for the collector).
    The collector runs again when the last parse ends, if it ran before the first began."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders = 0
        self._was_enabled = False

    def __enter__(self) -> None:
        with self._lock:
            if self._holders == 0:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._holders += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._holders -= 1
            if self._holders == 0 and self._was_enabled:
                gc.enable()


_COLLECTOR_PAUSE = _CollectorPause()


def _parse_large(body: str, content_type: str, engine: EngineKind | None) -> PageReading:
    """:func:`parse_page` of a large page, in a worker thread, the collector paused."""
    with _COLLECTOR_PAUSE:
        return parse_page(body, content_type=content_type, engine=engine)


#: What a page rejected by the tracker means (the ``error`` field of its log line).
_REJECTED: dict[str, str] = {
    "no_vllm_families": (
        "the page has no vllm:* or sglang:* series: not a vLLM or SGLang /metrics page"
    ),
    "counters_alternate": (
        "counters fall and rise in turn across scrapes: this URL is not one server "
        "(a load balancer or cache in front of several)"
    ),
}


def scrape_hint(url: str, content_type: str | None) -> str | None:
    """A fix for the two common wrong target URLs, or ``None``: the OpenAI base URL (path
    ending in ``/v1``: specwatch wants the server's ``/metrics``) and a page served as HTML
    (a UI or proxy, not a Prometheus text page)."""
    path = urlsplit(url).path.rstrip("/")
    if path.endswith("/v1") or "/v1/" in path:
        base = url[: url.rfind("/v1")]
        return f"this looks like the OpenAI API URL; specwatch scrapes {base}/metrics"
    if content_type is not None and "html" in content_type.lower():
        return "the server answered with HTML, not metrics; give the vLLM server's /metrics URL"
    return None


def next_tick(tick: float, interval: float, now: float) -> tuple[int, float]:
    """The tick after ``tick`` on a grid ``interval`` apart that is not yet past at ``now``, and
    how many ticks between them were missed (passed at ``now``; pure). A tick exactly at
    ``now`` is still to be made, not missed."""
    due = tick + interval
    if now <= due:
        return 0, due
    missed = math.ceil((now - due) / interval)
    ahead = due + missed * interval
    if ahead < now:  # rounding of the float division
        missed += 1
        ahead += interval
    return missed, ahead


#: Seconds before an SGLang target's ``/server_info`` is asked again after a failed read.
SERVER_INFO_RETRY_SECONDS = 300.0


class Scraper:
    """Scrape every target on its own interval and feed its tracker.

    ``targets``: the scraped servers; ``scrape``: the default interval, timeout (seconds) and
    body cap (bytes); ``window_seconds``: window name → length in seconds for each
    :class:`TargetTracker` (:attr:`trackers`, by target name). ``wall_clock`` gives the unix time
    stamped on each page, ``mono_clock`` times each fetch and parse and keeps the schedule
    (:meth:`run_target`), ``sleep`` waits until the next tick; ``on_update`` is called
    (synchronously) after every scrape, good or bad. The HTTP session is handed over with
    :meth:`use_session` when the app starts.
    """

    def __init__(
        self,
        targets: Sequence[TargetSettings],
        scrape: ScrapeSettings,
        window_seconds: Mapping[str, float],
        *,
        wall_clock: WallClock,
        on_update: Callable[[], None],
        mono_clock: MonotonicClock = SYSTEM_MONOTONIC,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._targets = tuple(targets)
        self._sleep = sleep
        self._scrape_settings = scrape
        self.trackers: dict[str, TargetTracker] = {
            t.name: TargetTracker.from_settings(t, scrape, window_seconds) for t in self._targets
        }
        self._session: aiohttp.ClientSession | None = None
        self._wall_clock = wall_clock
        self._on_update = on_update
        self._mono_clock = mono_clock
        names = list(self.trackers)
        self._locks = {name: asyncio.Lock() for name in names}
        self._last_reason: dict[str, str | None] = dict.fromkeys(names)
        self._last_missing: dict[str, tuple[str, ...]] = dict.fromkeys(names, ())
        self._last_processes: dict[str, int] = dict.fromkeys(names, 0)
        #: (target, reason) -> series skipped on the last page, so a count is logged once.
        self._last_skipped: dict[tuple[str, str], int] = {}
        self._last_implausible: dict[str, tuple[str, ...]] = {}
        #: target -> engines whose counters fell on the last page (a reset logged once)
        self._last_resets: dict[str, frozenset[str]] = {}
        #: target -> monotonic time before which /server_info is not asked again.
        self._server_info_next: dict[str, float] = {}

    def use_session(self, session: aiohttp.ClientSession | None) -> None:
        """The session the scrapes use (``None`` when the app stops)."""
        self._session = session

    def view(self, now: float) -> ObserveView:
        """The observe chain's current :class:`ObserveView`, stamped ``now`` (pure)."""
        return build_view([t.snapshot() for t in self.trackers.values()], now=now)

    @property
    def ready(self) -> bool:
        """True once every target had a good scrape."""
        return all(t.snapshot().ready for t in self.trackers.values())

    def interval_for(self, target: TargetSettings) -> float:
        """Scrape interval of ``target`` in seconds (its own, else the default)."""
        return target.scrape_interval_seconds or self._scrape_settings.interval_seconds

    def timeout_for(self, target: TargetSettings) -> float:
        """Scrape timeout of ``target`` in seconds (its own, else the default)."""
        return target.scrape_timeout_seconds or self._scrape_settings.timeout_seconds

    async def scrape_once(self, target: TargetSettings) -> bool:
        """Scrape ``target`` once (waits if a scrape of it is in progress); True when good."""
        async with self._locks[target.name]:
            return await self._scrape(target)

    async def _scrape(self, target: TargetSettings) -> bool:
        if self._session is None:
            raise RuntimeError("scraper has no session: the app is not started")
        tracker = self.trackers[target.name]
        token = target.bearer_token.get_secret_value() if target.bearer_token else None
        result = await fetch_metrics(
            self._session,
            target.url,
            timeout_seconds=self.timeout_for(target),
            max_body_bytes=self._scrape_settings.max_body_bytes,
            bearer_token=token,
            mono_clock=self._mono_clock,
        )
        now = self._wall_clock()
        if not result.ok:
            assert result.reason is not None
            tracker.record_error(result.reason, duration_seconds=result.duration_seconds)
            self._failed(target, result.reason, result.detail, None, result.content_type)
            self._on_update()
            return False
        start = self._mono_clock()
        try:
            if len(result.body) > PARSE_IN_THREAD_BYTES:
                page = await asyncio.to_thread(
                    _parse_large,
                    result.body,
                    result.content_type,
                    target.engine,
                )
            else:
                page = parse_page(
                    result.body, content_type=result.content_type, engine=target.engine
                )
        except ParseError as exc:
            tracker.record_error("parse", duration_seconds=result.duration_seconds)
            self._failed(target, "parse", exc.message, exc.line, result.content_type)
            self._on_update()
            return False
        if page.engine_kind == "sglang":
            await self._read_server_info(target, tracker, page)
        resets = tracker.record_page(now, page, duration_seconds=result.duration_seconds)
        if tracker.rejected is not None:
            self._failed(target, tracker.rejected, _REJECTED[tracker.rejected], None)
            self._on_update()
            return False
        for reason, count in tracker.capped.items():
            self._log_skipped(target.name, "over-cap", reason, count)
        self._log_skipped(
            target.name,
            "duplicate",
            "duplicate_conflict",
            page.duplicate_conflicts,
            url=redact_url(target.url),
            samples=list(page.duplicates),
        )
        self._log_skipped(
            target.name,
            "invalid",
            "invalid_series",
            page.invalid_series,
            url=redact_url(target.url),
            samples=list(page.invalid),
        )
        self._log_implausible(target, tracker.implausible)
        self._log_processes(target.name, page.gauge_processes)
        missing = tracker.snapshot().missing_families
        if missing != self._last_missing[target.name]:
            self._last_missing[target.name] = missing
            if missing:
                log_event(
                    logger,
                    logging.WARNING,
                    "families missing",
                    target=target.name,
                    families=list(missing),
                )
        self._log_resets(target, resets, tracker.snapshot().counter_resets)
        if self._last_reason[target.name] is not None:
            log_event(logger, logging.INFO, "scrape recovered", target=target.name)
        self._last_reason[target.name] = None
        log_event(
            logger,
            logging.DEBUG,
            "scrape",
            target=target.name,
            duration_seconds=round(result.duration_seconds, 6),
            parse_seconds=round(self._mono_clock() - start, 6),
            bytes=len(result.body),
        )
        self._on_update()
        return True

    def _log_resets(
        self, target: TargetSettings, resets: list[str], totals: Mapping[str, int]
    ) -> None:
        """One "counter reset" line per engine whose counters fell on this page after a page
        on which they did not (a server restart); an engine that resets on every page (a broken
        exporter) is logged once, with its count so far, until a page without a reset."""
        now = frozenset(resets)
        before = self._last_resets.get(target.name, frozenset())
        self._last_resets[target.name] = now
        for engine in sorted(now - before):
            log_event(
                logger,
                logging.WARNING,
                "counter reset",
                target=target.name,
                url=redact_url(target.url),
                engine=engine,
                resets=totals.get(engine, 0),
            )

    def _log_implausible(self, target: TargetSettings, samples: tuple[str, ...]) -> None:
        """One warning line naming the target's URL and the samples refused for values no
        server writes, when that set changes (not on every page that repeats it)."""
        if samples == self._last_implausible.get(target.name, ()):
            return
        self._last_implausible[target.name] = samples
        if samples:
            log_event(
                logger,
                logging.WARNING,
                "implausible values refused",
                target=target.name,
                url=redact_url(target.url),
                reason="implausible_value",
                samples=list(samples),
                error="above 2^53, a NaN counter, or a counter rising faster than any server; "
                "the last good values are kept",
            )

    async def _read_server_info(
        self, target: TargetSettings, tracker: TargetTracker, page: PageReading
    ) -> None:
        """For an SGLang target whose page does not show N (``sglang:spec_num_draft_tokens``,
        before 0.5.13) and whose settings give no K: read N, and ``max_running_requests`` when
        ``max_num_seqs`` is not set, from the server's ``/server_info`` once, as if configured
        (one INFO line; on a failure one WARNING line, asked again after
        :data:`SERVER_INFO_RETRY_SECONDS`)."""
        have = tracker.target
        if have.num_speculative_tokens is not None or sglang_observed_k(page) is not None:
            return
        now = self._mono_clock()
        if now < self._server_info_next.get(target.name, now):
            return
        assert self._session is not None
        token = target.bearer_token.get_secret_value() if target.bearer_token else None
        doc, where = await fetch_server_info(
            self._session, target.url, timeout_seconds=self.timeout_for(target), bearer_token=token
        )
        facts = server_info_facts(doc) if doc is not None else {}
        n, running = facts.get("num_draft_tokens"), facts.get("max_running_requests")
        if not isinstance(n, int) or n < 2:
            self._server_info_next[target.name] = now + SERVER_INFO_RETRY_SECONDS
            log_event(
                logger,
                logging.WARNING,
                "sglang server_info without draft tokens",
                target=target.name,
                detail=where if doc is None else f"{where}: no speculative_num_draft_tokens >= 2",
            )
            return
        update: dict[str, int] = {"num_speculative_tokens": n - 1}
        if have.max_num_seqs is None and isinstance(running, int) and running > 0:
            update["max_num_seqs"] = running
        tracker.target = have.model_copy(update=update)
        log_event(
            logger,
            logging.INFO,
            "sglang server_info read",
            target=target.name,
            url=where,
            num_draft_tokens=n,
            max_running_requests=update.get("max_num_seqs"),
        )

    def _log_processes(self, target: str, processes: int) -> None:
        """Log "gauges per process" when the number of processes whose copies of the gauges a
        page carries changes (once, not on every page): their gauges are read once, not summed
        (:func:`specwatch.observe.parse.parse_page`)."""
        if processes == self._last_processes[target]:
            return
        self._last_processes[target] = processes
        log_event(
            logger,
            logging.INFO,
            "gauges per process",
            target=target,
            processes=processes,
            label=PROCESS_LABEL,
            read="largest copy" if processes else "one value per gauge",
        )

    def _log_skipped(
        self, target: str, kind: str, reason: str, count: int, **where: object
    ) -> None:
        """Log "<kind> series skipped" when a page's count for ``reason`` changes (once, not on
        every page with the same count); ``where``: more fields (the URL, the samples)."""
        if count == self._last_skipped.get((target, reason), 0):
            return
        self._last_skipped[target, reason] = count
        if count:
            event = f"{kind} series skipped"
            log_event(
                logger,
                logging.WARNING,
                event,
                target=target,
                reason=reason,
                count=count,
                **where,
            )

    def _failed(
        self,
        target: TargetSettings,
        reason: str,
        detail: str,
        line: int | None,
        content_type: str | None = None,
    ) -> None:
        level = logging.WARNING if self._last_reason[target.name] != reason else logging.DEBUG
        fields: dict[str, object] = {
            "target": target.name,
            "url": redact_url(target.url),
            "reason": reason,
            "error": detail,
        }
        if line:
            fields["line"] = line
        hint = scrape_hint(target.url, content_type)
        if hint:
            fields["hint"] = hint
        log_event(logger, level, "scrape failed", **fields)
        self._last_reason[target.name] = reason

    async def run_target(self, target: TargetSettings) -> None:
        """Scrape ``target`` forever on its interval (cancel to stop).

        The scrapes keep a fixed schedule, ticks ``interval`` apart from the first: a scrape
        that runs long (a slow target, a loaded machine) delays no later tick, and a late
        wake-up is not carried into the next one. A tick that has passed while the scrape
        before it was still running is skipped, not made late, and counted
        (``specwatch_scrape_missed_ticks_total``); the next scrape is at the next tick ahead.
        """
        interval = self.interval_for(target)
        tracker = self.trackers[target.name]
        tick = self._mono_clock()
        while True:
            await self.scrape_once(target)
            missed, tick = next_tick(tick, interval, self._mono_clock())
            if missed:
                tracker.record_missed(missed)
                log_event(
                    logger,
                    logging.DEBUG,
                    "scrape ticks missed",
                    target=target.name,
                    missed=missed,
                    interval_seconds=interval,
                )
                self._on_update()
            await self._sleep(max(tick - self._mono_clock(), 0.0))

    async def run(self) -> None:
        """Run every target's loop until cancelled."""
        async with asyncio.TaskGroup() as tg:
            for target in self._targets:
                tg.create_task(self.run_target(target), name=f"scrape:{target.name}")
