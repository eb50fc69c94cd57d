"""The shadow chain as one unit: ingest → sample → replay → compare → ledger → stats.

:class:`ShadowComponent` takes its settings groups (``shadow``, ``paired``, ``ledger``), a
:data:`~specwatch.shadow.sample.LoadState` callable (the arms' load, joined from the observe
chain by the server) and an ``on_stats`` callback (the server publishes what it is given). The
server (:mod:`specwatch.server.wiring`) mounts :meth:`ShadowComponent.routes`, registers it as a
collector and enters :meth:`ShadowComponent.running` with the app. While running it opens the
:class:`~specwatch.shadow.ledger.Ledger` and, in a background task (a large ledger never delays
``/healthz``),

1. rebuilds the order-dependent statistics (the no-net-loss e-process with its change
   detector, the margin e-process, the "within margin" declaration) by replaying the ledger's
   labelled pairs in write order, the order they were folded live (a restart keeps the
   statistics; the ledger's totals are exported as gauges, while the counters start at 0 with
   the process) and seeds the category bound with the ledger's categories, most rows first;
2. starts the :class:`~specwatch.shadow.pipeline.ShadowPipeline`, whose ``on_pair`` runs
   :func:`~specwatch.shadow.compare.compare` (in a worker thread for the ``math`` checker; the
   pair's one classification), turns the outcome into its one ledger row, queues it
   (``Ledger.submit``) and counts it (``OutcomeCounters.add``, the one set of pair counters);
3. every ``paired.refresh_seconds`` builds :class:`~specwatch.shadow.summary.ShadowStats` from
   the in-memory :class:`~specwatch.shadow.summary.LiveTallies` over ``paired.windows`` (plus
   ``since_start`` = the whole ledger) and the pipeline's queue/drop/pause state, the
   per-category decision table (:func:`~specwatch.shadow.decision.decision_table`) and the flip
   rates per running-request band, exports it (``ShadowCollector``) and hands it to
   ``on_stats``.

The statistics never re-read the ledger while running: :class:`LiveTallies` is rebuilt once at
start from the ledger's stored per-day aggregates plus one grouped SQL pass over the recent
rows (:meth:`Ledger.history <specwatch.shadow.ledger.Ledger.history>`, in a worker thread) and
then told by the ledger of
every committed batch and every retention prune (O(1) per row); a refresh tick only expires the
time buckets that left a window and computes the derived statistics again when something
changed (the per-tally summaries are remembered). Windows are bucket-granular
(:data:`STATS_BUCKET_SECONDS`; see :mod:`specwatch.shadow.windows`). :func:`ledger_inputs`
is the full recomputation from SQL, kept as the reference the live path is tested against.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from specwatch.core.clock import SYSTEM_MONOTONIC, SYSTEM_WALL, MonotonicClock, WallClock
from specwatch.core.config import SINCE_START
from specwatch.core.listen import ListenerStats, ListenLimits
from specwatch.core.logs import log_event
from specwatch.shadow.compare import CompareConfig, compare
from specwatch.shadow.decision import (
    ReplyCounts,
    add_replies,
    decision_table,
    reply_counts,
    stored_replies,
)
from specwatch.shadow.ingest.mirror import MirrorListener, mirror_routes
from specwatch.shadow.ledger.ledger import Ledger
from specwatch.shadow.ledger.rows import LedgerRow
from specwatch.shadow.pipeline import ShadowPipeline, category_bound_from_settings
from specwatch.shadow.replay import open_arm_session
from specwatch.shadow.sample import ArmLoad, LoadState
from specwatch.shadow.settings import LedgerSettings, PairedSettings, ShadowSettings
from specwatch.shadow.stats.alarms import LiveAlarmState
from specwatch.shadow.stats.sequential import BettingEProcess
from specwatch.shadow.summary import (
    DecisionRow,
    LiveTallies,
    LoadBand,
    OutcomeCounters,
    ShadowIO,
    ShadowStats,
    build_shadow_stats,
    categories_by_volume,
    load_bands,
)
from specwatch.shadow.tally import ArmTotals, PairTally, labelled_outcome, load_band_labels
from specwatch.shadow.values import Arm, PairOutcome, ReplayPair

logger = logging.getLogger("specwatch.shadow.component")

#: Width of the live statistics' time buckets: every finite window reaches back between its
#: length and its length plus this (see :mod:`specwatch.shadow.windows`).
STATS_BUCKET_SECONDS = 10.0
#: How often a ledger that cannot store rows (full, read-only, unavailable) is tried again.
LEDGER_RETRY_SECONDS = 30.0
#: The share of the shutdown timeout the mirror listener gives the copies it is reading (they
#: are copies, not live answers: the live streams and replays get the whole drain).
MIRROR_SHUTDOWN_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class StatsInputs:
    """What :class:`ShadowStats` is built from, however it was counted: ``tallies[window]
    [category]``, since-start ``arm_totals[category]`` and load bands ``by_load``, and the
    ledger's ``rows``."""

    tallies: Mapping[str, Mapping[str, PairTally]]
    arm_totals: Mapping[str, ArmTotals]
    by_load: tuple[LoadBand, ...]
    rows: int

    @classmethod
    def from_live(cls, live: LiveTallies) -> StatsInputs:
        """From the in-memory tallies (no I/O)."""
        return cls(
            live.tallies(),
            live.arm_totals(),
            load_bands(live.by_load(), load_band_labels(live.bands)),
            live.rows(),
        )


async def ledger_inputs(ledger: Ledger, paired: PairedSettings, now: float) -> StatsInputs:
    """The full recomputation from the ledger's SQL tallies (one query per window, plus arm
    totals in fixed point, load bands and the row count): exact per-row window edges ``time >=
    now - seconds``; the reference :class:`LiveTallies` is checked against."""
    tallies = {
        name: await ledger.tally(since=None if secs is None else now - secs)
        for name, secs in paired.window_seconds.items()
    }
    if SINCE_START not in tallies:
        tallies[SINCE_START] = await ledger.tally()
    by_load = load_bands(
        await ledger.tally_by_load(paired.load_bands), load_band_labels(paired.load_bands)
    )
    totals = await ledger.arm_totals(fixed_point=True)
    return StatsInputs(tallies, totals, by_load, await ledger.row_count())


class ShadowComponent:
    """The shadow chain (see module docstring).

    ``shadow``, ``paired``, ``ledger``: its settings groups. ``load_state``: per-arm load for the
    sampler's load-aware pause (``None``: never pauses for load). ``on_stats``: called with each
    new :class:`ShadowStats` (the server publishes it). ``wall_clock``: unix seconds (ledger times,
    windows); ``mono_clock``: the sampler's clock; ``sleep``: async sleep (pipeline and refresh
    loop); ``session``: the replay session (``None``: one is opened by :meth:`running` and closed
    on exit). :meth:`latest_stats` is ``None`` until the first refresh.
    """

    def __init__(
        self,
        shadow: ShadowSettings,
        paired: PairedSettings,
        ledger: LedgerSettings,
        *,
        load_state: LoadState | None = None,
        on_stats: Callable[[ShadowStats], None] | None = None,
        wall_clock: WallClock = SYSTEM_WALL,
        mono_clock: MonotonicClock = SYSTEM_MONOTONIC,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        session: aiohttp.ClientSession | None = None,
        listen: ListenLimits | None = None,
        shutdown_timeout_seconds: float = 5.0,
    ) -> None:
        self.shadow_settings = shadow
        self._listen = listen if listen is not None else ListenLimits()
        self._shutdown_timeout = shutdown_timeout_seconds
        self._watch: Callable[[asyncio.Task[Any]], None] | None = None
        #: Counters of the proxy listener (proxy mode).
        self.proxy_listener = ListenerStats("proxy")
        #: Counters of the mirror listener (mirror mode).
        self.mirror_listener = ListenerStats("mirror")
        self.paired_settings = paired
        self.ledger_settings = ledger
        self._load_state = load_state
        self._on_stats = on_stats
        self._wall_clock = wall_clock
        self._mono_clock = mono_clock
        self._sleep = sleep
        self._session = session
        self._compare_config = CompareConfig()
        self.categories = category_bound_from_settings(shadow, mono_clock=mono_clock)
        self.counters = OutcomeCounters(self.categories)
        #: The no-net-loss e-process and its change detector, the margin e-process and the
        #: "within margin" declaration (folded pair by pair; replayed from the ledger at start).
        self.alarms = LiveAlarmState.fresh(paired)
        #: The in-memory tallies, built when the component starts (``None`` before).
        self.live: LiveTallies | None = None
        self._inputs: tuple[int, StatsInputs] | None = None
        self._decisions: tuple[tuple[Any, ...], tuple[DecisionRow, ...]] | None = None
        #: Reply counts the ledger held when this process started (added to its own counters).
        self._stored_replies: dict[tuple[str, str], ReplyCounts] = {}
        self.ledger: Ledger | None = None
        self.pipeline: ShadowPipeline | None = None
        self._stats: ShadowStats | None = None
        self._ledger_state_seen = "ok"
        self._last_retry = self._last_check = 0.0
        self._ready = asyncio.Event()
        self._started = False
        self._mirror_listener: MirrorListener | None = None

    # -- public ---------------------------------------------------------------------------

    def latest_stats(self) -> ShadowStats | None:
        """The last statistics (immutable), ``None`` before the first refresh."""
        return self._stats

    @property
    def mirror_port(self) -> int | None:
        """The mirror listener's bound port while running in mirror mode, else ``None``."""
        return None if self._mirror_listener is None else self._mirror_listener.port

    def pauses(self) -> Mapping[str, int] | None:
        """Transitions into a load pause by reason, ``None`` while the pipeline is not built."""
        return None if self.pipeline is None else dict(self.pipeline.sampler.pauses)

    async def drain(self, until: float) -> None:
        """SIGTERM: the pipeline drains until ``until`` (monotonic seconds; see
        :meth:`ShadowPipeline.drain <specwatch.shadow.pipeline.ShadowPipeline.drain>`) while the
        mirror listener stops accepting and finishes the copies it is reading (within
        :data:`MIRROR_SHUTDOWN_SHARE` of the shutdown timeout)."""
        parts: list[Awaitable[None]] = []
        if self.pipeline is not None:
            parts.append(self.pipeline.drain(until))
        mirror, self._mirror_listener = self._mirror_listener, None
        if mirror is not None:
            parts.append(mirror.stop())
        await asyncio.gather(*parts)

    def load_state(self) -> Mapping[str, ArmLoad]:
        """Per-arm load as the sampler reads it (``{}`` without a ``load_state`` callable)."""
        return {} if self._load_state is None else self._load_state()

    async def refresh(self, *, flush: bool = False) -> ShadowStats:
        """Build :class:`ShadowStats` now and hand it to ``on_stats`` (``flush``: wait for
        queued rows first).

        No SQL: expires the buckets that left a window and reads :attr:`live`; the window
        tallies and the decision table are computed again only when they changed. Waits until
        the startup rebuild from the ledger is done. Raises ``RuntimeError`` when the component
        is not running.
        """
        ledger = self.ledger
        if ledger is None:
            raise RuntimeError("shadow component is not running")
        await self._ready.wait()
        if flush:
            await ledger.flush()
        live = self.live
        if live is None:
            raise RuntimeError("shadow component is not running")
        now = self._wall_clock()
        live.advance(now)
        io = self.pipeline.metrics() if self.pipeline is not None else None
        if self._inputs is None or self._inputs[0] != live.version:
            self._inputs = (live.version, StatsInputs.from_live(live))
        stats = self.build_stats(self._inputs[1], now, io, version=live.version)
        self._stats = stats
        if self._on_stats is not None:
            self._on_stats(stats)
        return stats

    async def _final_refresh(self) -> None:
        """At stop, once the pipeline finished its pairs: the last statistics
        (:meth:`latest_stats`), so what the process prints at exit counts every pair the
        ledger holds. Skipped before the startup rebuild finished; a failing ledger is logged."""
        if not self._ready.is_set() or self.live is None:
            return
        try:
            await self.refresh(flush=True)
        except (OSError, RuntimeError, sqlite3.Error) as exc:
            log_event(logger, logging.WARNING, "shadow final statistics failed", error=repr(exc))

    def build_stats(
        self,
        inputs: StatsInputs,
        now: float,
        io: ShadowIO | None = None,
        *,
        version: int | None = None,
    ) -> ShadowStats:
        """:class:`ShadowStats` from ``inputs`` with this component's settings, counters,
        e-process, category bound and ledger health (no I/O; logs when ledger writes start or
        stop failing). ``version``: the :attr:`LiveTallies.version` ``inputs`` were read at
        (the decision table is reused while it, the settings, the reply counts of ``io`` and
        the kept categories are unchanged); ``None``: computed afresh."""
        p = self.paired_settings
        replies = add_replies(self._stored_replies, reply_counts(io))
        kept = tuple(self.categories.kept)
        log_e = self.alarms.net_loss.log_e_value
        dkey = (version, p.alpha, p.margin, p.detect_net_loss, p.power, replies, kept, log_e)
        if version is None or self._decisions is None or self._decisions[0] != dkey:
            decisions = decision_table(
                inputs.tallies[SINCE_START],
                inputs.arm_totals,
                alpha=p.alpha,
                margin=p.margin,
                detect_net_loss=p.detect_net_loss,
                power=p.power,
                replies=replies,
                kept=self.categories.kept,
                overall_log_e_value=log_e,
            )
            self._decisions = (dkey, decisions)
        self.counters.fold()
        ledger = self.ledger
        errors: dict[str, int] = {}
        if ledger is not None:
            health = ledger.health
            errors = dict(health.write_errors)
            if health.dropped:
                errors["queue_full"] = health.dropped
            self._note_ledger_state(health.state, health.last_error)
        return build_shadow_stats(
            inputs.tallies,
            now=now,
            alpha=p.alpha,
            margin=p.margin,
            detect_net_loss=p.detect_net_loss,
            pairs_total=self.counters.pairs,
            unpaired_total=self.counters.unpaired,
            excluded_total=self.counters.excluded,
            betting_log_e_value=self.betting.log_wealth,
            change_log_value=self.alarms.net_loss.log_detector,
            change_threshold=self.alarms.change_arl,
            within_margin_declared_at=self.alarms.declaration.declared_at,
            ledger_rows=inputs.rows,
            ledger_write_errors=errors,
            io=io,
            decisions=self._decisions[1],
            by_load=inputs.by_load,
            categories=self.categories.kept,
            categories_folded=self.categories.overflowed,
            category_takeovers=self.categories.demoted,
            replays_total=self.counters.by_status(),
            ledger_state=ledger.state if ledger is not None else "ok",
            net_loss_log_e_value=log_e,
            arm_totals=sum(inputs.arm_totals.values(), ArmTotals()),
        )

    # -- internals ------------------------------------------------------------------------

    def _arm_sessions(self) -> dict[Arm, aiohttp.ClientSession]:
        """One replay session per arm, idle keep-alive from the arm's ``keepalive_seconds``."""
        s = self.shadow_settings
        eps = {
            Arm.STANDARD: s.standard,
            Arm.FLY: s.fly,
            Arm.NOISE: s.noise_endpoint(),
            Arm.BASELINE: s.baseline,
        }
        return {
            arm: open_arm_session(ep.keepalive_seconds) for arm, ep in eps.items() if ep is not None
        }

    async def _mirror(self, request: web.Request) -> web.Response:
        pipe = self.pipeline
        if pipe is None:
            return web.json_response({"shadow": "not_started"}, status=503)
        return await pipe.mirror.handle(request)

    def _needs_thread(self, pair: ReplayPair) -> bool:
        return pair.request.checker == "math"

    async def _on_pair(self, pair: ReplayPair) -> None:
        if self._needs_thread(pair):
            outcome = await asyncio.to_thread(compare, pair, self._compare_config)
        else:
            outcome = compare(pair, self._compare_config)
        self.consume(outcome)

    @property
    def betting(self) -> BettingEProcess:
        """The since-start margin e-process (part of :attr:`alarms`)."""
        return self.alarms.betting

    def consume(self, outcome: PairOutcome) -> None:
        """Store and count one compared pair (event-loop thread): its one ledger row is queued
        for writing, counted and fed to the order-dependent statistics (:attr:`alarms`)."""
        row = LedgerRow.from_outcome(outcome, self.shadow_settings.store_text)
        if self.ledger is not None:
            self.ledger.submit(row)
        self.counters.add(row)
        labelled = labelled_outcome(row)
        if labelled is not None:
            self.alarms = self.alarms.add([labelled])

    def _note_ledger_state(self, state: str, last_error: str | None) -> None:
        """One log line when the ledger's state changes (pairing stops or starts again)."""
        if state == self._ledger_state_seen:
            return
        was, self._ledger_state_seen = self._ledger_state_seen, state
        if state == "ok":
            log_event(logger, logging.INFO, "ledger writes recovered", was=was)
        else:
            log_event(
                logger,
                logging.ERROR,
                "ledger writes failing",
                state=state,
                was=was,
                error=last_error,
                pairing="stopped",
            )

    def _ledger_hold(self) -> str | None:
        """The ledger's state while its rows cannot be stored (the sampler replays nothing)."""
        ledger = self.ledger
        if ledger is None or ledger.state == "ok":
            return None
        return ledger.state

    async def _ledger_upkeep(self, ledger: Ledger) -> None:
        """Between refreshes: try a failing ledger again every :data:`LEDGER_RETRY_SECONDS`,
        and run the integrity check every ``ledger.integrity_check_seconds`` (worker thread)."""
        now = self._mono_clock()
        if ledger.state not in ("ok", "corrupt") and now - self._last_retry >= (
            LEDGER_RETRY_SECONDS
        ):
            self._last_retry = now
            await ledger.retry()
        every = self.ledger_settings.integrity_check_seconds
        if every is not None and ledger.state == "ok" and now - self._last_check >= every:
            self._last_check = now
            await ledger.quick_check()

    async def _rebuild(self, ledger: Ledger) -> None:
        # One grouped SQL pass for every tally and one streamed read for the order-dependent
        # e-process, both in worker threads. The counters start at 0 with the process (a
        # restart is a true counter reset); the ledger only chooses which categories keep
        # their own series (most rows first).
        p = self.paired_settings
        live = LiveTallies(
            p.window_seconds,
            p.load_bands,
            now=self._wall_clock(),
            bucket_seconds=STATS_BUCKET_SECONDS,
        )
        ledger.listener = live  # holds back what is committed meanwhile (see LiveTallies.start)
        as_of = 0  # nothing to read (the ledger cannot be read): the statistics start empty
        if ledger.state == "ok":
            try:
                as_of, groups = await ledger.history(live.grouping())
            except sqlite3.DatabaseError:
                # a damaged page the open did not touch: the integrity check marks the ledger
                # corrupt (the next start moves it aside); anything else is raised
                if await ledger.quick_check() is None:
                    raise
            else:
                await asyncio.to_thread(live.add_groups, groups)
        live.start(as_of)
        since_start = live.tallies()[SINCE_START]
        self.categories.seed(categories_by_volume(since_start))
        if ledger.state == "ok":
            # in write order: the order the live fold saw the pairs (as replays finished)
            self.alarms = await ledger.fold_labelled(
                lambda state, chunk: state.add(chunk), LiveAlarmState.fresh(p), written_order=True
            )
            self._stored_replies = stored_replies(await ledger.reply_totals())
        self.live = live
        log_event(
            logger,
            logging.INFO,
            "shadow statistics rebuilt from the ledger",
            labelled_pairs=sum(t.paired_counts().n for t in since_start.values()),
            rows=live.rows(),
            path=str(ledger.path),
        )

    async def _run(self, pipeline: ShadowPipeline, ledger: Ledger) -> None:
        """Start the proxy listener (proxy mode), rebuild from the ledger, start the rest of
        the pipeline, then refresh the statistics every ``paired.refresh_seconds`` (a cheap
        tick: no SQL, see the module docstring).

        Runs as a background task so a large ledger never delays serving ``/healthz``.
        """
        await pipeline.start_proxy()  # the live path first: it needs nothing from the ledger
        await self._rebuild(ledger)
        pipeline.sampler.hold = self._ledger_hold
        await pipeline.start()
        self._started = True
        self._ready.set()
        self._last_retry = self._last_check = self._mono_clock()
        while True:
            try:
                await self._ledger_upkeep(ledger)
                await self.refresh()
            except (sqlite3.Error, OSError, ValueError) as exc:
                log_event(
                    logger, logging.WARNING, "shadow statistics refresh failed", error=repr(exc)
                )
            await self._sleep(self.paired_settings.refresh_seconds)

    @asynccontextmanager
    async def running(
        self, watch: Callable[[asyncio.Task[Any]], None] | None = None
    ) -> AsyncIterator[None]:
        """Open the ledger and the sessions, bind the mirror listener (mirror mode; it answers
        ``503 not_started`` until the pipeline runs), start the background task, and stop all on
        exit.

        ``watch`` is handed the background task (the server marks the process failed when it
        dies). Raises what :meth:`Ledger.open` raises when the ledger cannot be opened and
        ``OSError`` when the mirror port cannot be bound.
        """
        self._watch = watch
        led = self.ledger_settings
        ledger = Ledger(
            led.path,
            store_text=self.shadow_settings.store_text,
            max_age_seconds=led.max_age_seconds,
            max_rows=led.max_rows,
            synchronous=led.synchronous,
            wall_clock=self._wall_clock,
        )
        await ledger.open()  # a failing file leaves it open in that state (never raises for it)
        self.ledger = ledger
        own_session = self._session is None
        session = self._session or self._arm_sessions()
        runner: asyncio.Task[None] | None = None
        try:
            pipeline = ShadowPipeline.from_settings(
                self.shadow_settings,
                session=session,
                on_pair=self._on_pair,
                load_state=self._load_state,
                mono_clock=self._mono_clock,
                wall_clock=self._wall_clock,
                sleep=self._sleep,
                categories=self.categories,
                listen=self._listen,
                listener=self.proxy_listener,
                shutdown_timeout_seconds=self._shutdown_timeout,
                serve_mirror=False,
            )
            self.pipeline = pipeline
            sh = self.shadow_settings
            if "mirror" in sh.modes:
                listener = MirrorListener(
                    mirror_routes(self._mirror),
                    max_body_bytes=sh.mirror_max_body_bytes,
                    listen=self._listen,
                    listener=self.mirror_listener,
                    shutdown_timeout_seconds=self._shutdown_timeout * MIRROR_SHUTDOWN_SHARE,
                )
                port = await listener.start(sh.mirror_listen_host, sh.mirror_listen_port)
                self._mirror_listener = listener
                log_event(logger, logging.INFO, "shadow mirror listening", port=port)
            runner = asyncio.create_task(self._run(pipeline, ledger), name="shadow-stats")
            if watch is not None:
                watch(runner)
            yield
        finally:
            if runner is not None:
                runner.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await runner
            if self.pipeline is not None and (self._started or self.pipeline.proxy_started):
                await self.pipeline.stop()
            await self._final_refresh()
            self._started = False
            self._ready.clear()
            if self._mirror_listener is not None:
                await self._mirror_listener.stop()
                self._mirror_listener = None
            ledger.listener = None
            await ledger.close()
            self.ledger = None
            self.live = None
            self._inputs = self._decisions = None
            if own_session and isinstance(session, Mapping):
                for s in session.values():
                    await s.close()
