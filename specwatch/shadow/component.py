"""The shadow chain as one app component: ingest → sample → replay → compare → ledger → stats.

``ShadowComponent(settings)`` is passed to :func:`specwatch.server.app.build_app` (``components=``;
:func:`shadow_components` returns the list for ``specwatch run``). On ``install`` it adds the
mirror routes (mirror mode), a Prometheus collector and a background context that opens the
:class:`~specwatch.shadow.ledger.Ledger` and, in a background task (a large ledger never delays
``/healthz``),

1. rebuilds the monotonic counters and the since-start margin e-process from the ledger's rows
   (a restart keeps the statistics);
2. starts the :class:`~specwatch.shadow.pipeline.ShadowPipeline`, whose ``on_pair`` runs
   :func:`~specwatch.shadow.compare.compare` (in a worker thread for the ``math`` checker),
   queues the row (``Ledger.submit``) and counts it (``OutcomeCounters.add``);
3. every ``paired.refresh_seconds`` rebuilds :class:`~specwatch.shadow.summary.ShadowStats` from
   the ledger's SQL tallies over ``paired.windows`` (plus ``since_start`` = the whole ledger) and
   the pipeline's queue/drop/pause state, exports it (``shadow_families``) and publishes it as
   the snapshot's ``"shadow"`` extra.

The load-aware pause reads the latest core :class:`~specwatch.observe.values.Snapshot`: per arm the
running/waiting gauges of the target named by the arm's ``target`` (else the target whose base
URL is the arm's URL), its ``max_num_seqs`` and the time of its last good scrape.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, Metric

from specwatch.core.logs import log_event
from specwatch.core.wire import server_base
from specwatch.export.shadow import shadow_families
from specwatch.observe.values import Snapshot, TargetSnapshot
from specwatch.server.app import LIVENESS_KEY
from specwatch.shadow.compare import CompareConfig, PairOutcome, compare
from specwatch.shadow.ingest.mirror import mirror_routes
from specwatch.shadow.ledger import Ledger, LedgerRow
from specwatch.shadow.pipeline import ShadowPipeline
from specwatch.shadow.sample import ArmLoad
from specwatch.shadow.settings import ArmEndpoint
from specwatch.shadow.stats.sequential import BettingEProcess, run_betting
from specwatch.shadow.summary import (
    OutcomeCounters,
    ShadowIO,
    ShadowStats,
    build_shadow_stats,
    shadow_stats_json,
)
from specwatch.shadow.tally import labelled_outcome
from specwatch.shadow.values import ReplayPair

logger = logging.getLogger("specwatch.shadow.component")

if TYPE_CHECKING:
    from specwatch.server.app import SnapshotStore
    from specwatch.settings import Settings


def arm_targets(settings: Settings) -> dict[str, str]:
    """``{arm: target name}`` for the arms whose server is also scraped (``standard``, ``fly``
    and ``noise`` when the noise arm is on): the arm's ``target`` when set, else the target
    whose base URL equals the arm's URL. Arms with no such target are left out (they cannot
    pause the replays)."""
    sh = settings.shadow
    by_url = {server_base(t.url): t.name for t in settings.targets}
    arms: dict[str, ArmEndpoint | None] = {
        "standard": sh.standard,
        "fly": sh.fly,
        "noise": sh.noise_endpoint(),
    }
    out: dict[str, str] = {}
    for arm, ep in arms.items():
        if ep is None:
            continue
        name = ep.target if ep.target is not None else by_url.get(server_base(ep.url))
        if name is not None:
            out[arm] = name
    return out


def arm_load(target: TargetSnapshot | None, *, wall_now: float, mono_now: float) -> ArmLoad:
    """The :class:`ArmLoad` of one scraped target (``observed_at`` on the monotonic clock).

    ``waiting`` is ``vllm:num_requests_waiting`` summed over the target's models (server view),
    ``running`` the most-loaded engine's running gauge (``Capacity.num_requests_running``, the
    one that meets ``max_num_seqs``), ``max_num_seqs`` the configured limit. A target never
    scraped gives ``observed_at=None`` (the sampler then pauses with reason ``load_stale``).
    """
    if target is None or target.last_success is None:
        return ArmLoad(None, None, None, None)
    waiting: float | None = None
    running: float | None = target.capacity.num_requests_running
    for models in target.windows.values():
        for mw in models.values():
            w, r = mw.server.num_requests_waiting, mw.server.num_requests_running
            if w is not None:
                waiting = (waiting or 0.0) + w
            if running is None and r is not None:
                running = r
        break  # gauges are the latest page's in every window
    max_seqs = target.capacity.max_num_seqs or target.limits.max_num_seqs
    return ArmLoad(
        running=running,
        waiting=waiting,
        max_num_seqs=max_seqs,
        observed_at=mono_now - max(0.0, wall_now - target.last_success),
    )


class ShadowComponent:
    """The shadow chain plugged into the app (see module docstring).

    ``clock``: unix seconds (ledger times, windows); ``monotonic``: the sampler's clock;
    ``sleep``: async sleep (pipeline and refresh loop); ``session``: the replay session
    (``None``: one is opened on startup and closed on cleanup). :meth:`latest_stats` is what
    the alert detectors read (``None`` until the first refresh).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.settings = settings
        self._clock = clock
        self._mono = monotonic
        self._sleep = sleep
        self._session = session
        self._arm_targets = arm_targets(settings)
        self._compare_config = CompareConfig()
        self.counters = OutcomeCounters()
        self.betting = BettingEProcess(margin=settings.paired.margin)
        self.ledger: Ledger | None = None
        self.pipeline: ShadowPipeline | None = None
        self._stats: ShadowStats | None = None
        self._snapshot: Snapshot | None = None
        self._store: SnapshotStore | None = None
        self._ledger_failing = False
        self._errors_seen = 0
        self._rows_seen = 0
        self._ready = asyncio.Event()
        self._started = False

    # -- public ---------------------------------------------------------------------------

    def latest_stats(self) -> ShadowStats | None:
        """The last published statistics (immutable), ``None`` before the first refresh."""
        return self._stats

    def install(
        self, app: web.Application, store: SnapshotStore, registry: CollectorRegistry
    ) -> None:
        """Mirror routes (mirror mode), the collector, the snapshot listener and the lifecycle."""
        self._store = store
        store.add_listener(self._on_snapshot)
        registry.register(self)
        if "mirror" in self.settings.shadow.modes:
            app.add_routes(mirror_routes(self._mirror))
        app.cleanup_ctx.append(self._ctx)

    async def refresh(self, *, flush: bool = False) -> ShadowStats:
        """Rebuild and publish :class:`ShadowStats` now (``flush``: wait for queued rows first).

        Waits until the startup rebuild from the ledger is done. Raises ``RuntimeError`` when
        the component is not running.
        """
        ledger = self.ledger
        if ledger is None:
            raise RuntimeError("shadow component is not running")
        await self._ready.wait()
        if flush:
            await ledger.flush()
        p = self.settings.paired
        now = self._clock()
        tallies = {
            name: await ledger.tally(since=None if secs is None else now - secs)
            for name, secs in p.window_seconds.items()
        }
        rows = await ledger.row_count()
        health = ledger.health
        errors = dict(health.write_errors)
        if health.dropped:
            errors["queue_full"] = health.dropped
        self._note_ledger_state(sum(errors.values()), health.rows_written, health.last_error)
        io: ShadowIO | None = None
        if self.pipeline is not None:
            m = self.pipeline.metrics()
            io = ShadowIO(
                queue_depth=m.queue_depth,
                in_flight=m.in_flight,
                dropped_total=dict(m.dropped),
                paused={r: bool(v) for r, v in m.paused.items()},
            )
        stats = build_shadow_stats(
            tallies,
            now=now,
            alpha=p.alpha,
            margin=p.margin,
            detect_net_loss=p.detect_net_loss,
            pairs_total=self.counters.pairs,
            unpaired_total=self.counters.unpaired,
            excluded_total=self.counters.excluded,
            betting_log_e_value=self.betting.log_wealth,
            ledger_rows=rows,
            ledger_write_errors=errors,
            io=io,
        )
        self._stats = stats
        if self._store is not None:
            self._store.set_extra("shadow", shadow_stats_json(stats))
        return stats

    # -- collector ------------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        """Prometheus families of the last statistics (no I/O), plus
        ``specwatch_shadow_pauses_total{reason}`` (transitions into a load pause)."""
        stats = self._stats
        if stats is not None:
            yield from shadow_families(stats)
        if self.pipeline is not None:
            fam = CounterMetricFamily(
                "specwatch_shadow_pauses",
                "Times shadow replay entered a load-aware pause, by reason.",
                labels=["reason"],
            )
            for reason, n in sorted(self.pipeline.sampler.pauses.items()):
                fam.add_metric([reason], n)
            yield fam

    # -- internals ------------------------------------------------------------------------

    def _on_snapshot(self, snap: Snapshot) -> None:
        self._snapshot = snap

    def load_state(self) -> Mapping[str, ArmLoad]:
        """Per-arm load from the latest core snapshot (the sampler's ``load_state``)."""
        snap = self._snapshot
        wall, mono = self._clock(), self._mono()
        return {
            arm: arm_load(
                None if snap is None else snap.targets.get(name), wall_now=wall, mono_now=mono
            )
            for arm, name in self._arm_targets.items()
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

    def consume(self, outcome: PairOutcome) -> None:
        """Store and count one compared pair (event-loop thread)."""
        if self.ledger is not None:
            self.ledger.submit(outcome)
        self.counters.add(outcome)
        labelled = labelled_outcome(LedgerRow.from_outcome(outcome))
        if labelled is not None:
            self.betting = run_betting([labelled], self.betting.margin, self.betting)

    def _note_ledger_state(self, errors: int, rows_written: int, last_error: str | None) -> None:
        if errors > self._errors_seen and not self._ledger_failing:
            self._ledger_failing = True
            log_event(
                logger,
                logging.ERROR,
                "ledger writes failing",
                failed_rows=errors,
                error=last_error,
            )
        elif (
            self._ledger_failing and errors == self._errors_seen and rows_written > self._rows_seen
        ):
            self._ledger_failing = False
            log_event(logger, logging.INFO, "ledger writes recovered", failed_rows=errors)
        self._errors_seen = errors
        self._rows_seen = rows_written

    async def _rebuild(self, ledger: Ledger) -> None:
        self.counters.seed(await ledger.tally(), await ledger.reason_counts())
        margin = self.settings.paired.margin
        outcomes = await ledger.labelled_outcomes()
        self.betting = await asyncio.to_thread(run_betting, outcomes, margin)
        n = len(outcomes)
        log_event(
            logger,
            logging.INFO,
            "shadow statistics rebuilt from the ledger",
            labelled_pairs=n,
            path=str(ledger.path),
        )

    async def _run(self, pipeline: ShadowPipeline, ledger: Ledger) -> None:
        """Rebuild from the ledger, start the pipeline, then refresh the statistics forever.

        Runs as a background task so a large ledger never delays serving ``/healthz``. The
        refresh period stretches to 4 × the last refresh's duration when the ledger is large
        (SQL tallies over every window), so statistics never take more than ~20% of a core.
        """
        await self._rebuild(ledger)
        await pipeline.start()
        self._started = True
        self._ready.set()
        while True:
            t0 = self._mono()
            try:
                await self.refresh()
            except (sqlite3.Error, OSError, ValueError) as exc:
                log_event(
                    logger, logging.WARNING, "shadow statistics refresh failed", error=repr(exc)
                )
            took = self._mono() - t0
            await self._sleep(max(self.settings.paired.refresh_seconds, 4.0 * took))

    async def _ctx(self, app: web.Application) -> AsyncIterator[None]:
        s = self.settings
        ledger = Ledger(
            s.ledger.path,
            store_text=s.shadow.store_text,
            max_age_seconds=s.ledger.max_age_seconds,
            max_rows=s.ledger.max_rows,
            synchronous=s.ledger.synchronous,
            clock=self._clock,
        )
        await ledger.open()
        self.ledger = ledger
        own_session = self._session is None
        session = self._session or aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None)  # each arm has its own timeout
        )
        runner: asyncio.Task[None] | None = None
        try:
            pipeline = ShadowPipeline(
                s.shadow,
                session=session,
                on_pair=self._on_pair,
                load_state=self.load_state if self._arm_targets else None,
                clock=self._mono,
                wall_clock=self._clock,
                sleep=self._sleep,
            )
            self.pipeline = pipeline
            runner = asyncio.create_task(self._run(pipeline, ledger), name="shadow-stats")
            app[LIVENESS_KEY].watch(runner)
            yield
        finally:
            if runner is not None:
                runner.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await runner
            if self.pipeline is not None and self._started:
                await self.pipeline.stop()
            self._started = False
            self._ready.clear()
            await ledger.close()
            self.ledger = None
            if own_session:
                await session.close()


def shadow_components(
    settings: Settings,
    *,
    clock: Callable[[], float] = time.time,
    monotonic: Callable[[], float] = time.monotonic,
) -> list[ShadowComponent]:
    """``[ShadowComponent]`` when ``settings.shadow.enabled``, else ``[]`` (for ``build_app``)."""
    if not settings.shadow.enabled:
        return []
    return [ShadowComponent(settings, clock=clock, monotonic=monotonic)]
