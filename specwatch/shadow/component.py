"""The shadow chain's lifetime: the ledger, the pipeline, the mirror listener and the refresh loop.

:class:`ShadowComponent` takes its settings groups (``shadow``, ``paired``, ``ledger``), a
:data:`~specwatch.shadow.sample.LoadState` callable (the arms' load, joined from the observe
chain by the server) and a :class:`StatsSink` (the server publishes what it is given). The pair
path itself does not turn through it: the :class:`~specwatch.shadow.pipeline.ShadowPipeline`
hands each :class:`~specwatch.shadow.values.ReplayPair` to
:class:`~specwatch.shadow.live.ShadowStatistics` (compare, ledger row, counters, e-processes),
which hands the row to the :class:`~specwatch.shadow.ledger.Ledger`; the ledger tells
:class:`~specwatch.shadow.live.LiveTallies` of every committed batch. While running, in a
background task (a large ledger never delays ``/healthz``), the component rebuilds the
statistics from the ledger (:meth:`ShadowStatistics.rebuild
<specwatch.shadow.live.ShadowStatistics.rebuild>`), starts the pipeline, then every
``paired.refresh_seconds`` builds the published
:class:`~specwatch.shadow.published.ShadowStats` (no SQL: the in-memory tallies) and hands it to
the sink. :func:`~specwatch.shadow.live.ledger_inputs` is the full recomputation from SQL, kept
as the reference the live path is tested against.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, Protocol

import aiohttp
from aiohttp import web

from specwatch.core.listen import ListenerStats
from specwatch.core.logs import log_event
from specwatch.shadow.ingest.mirror import MirrorListener, mirror_routes
from specwatch.shadow.ledger.ledger import Ledger
from specwatch.shadow.live import ShadowStatistics, SnapshotSide, StatsInputs
from specwatch.shadow.pipeline import (
    DEFAULT_RUNTIME,
    Runtime,
    ShadowPipeline,
    category_bound_from_settings,
)
from specwatch.shadow.published import ShadowIO, ShadowStats
from specwatch.shadow.replay import open_arm_session
from specwatch.shadow.sample import ArmLoad, LoadState
from specwatch.shadow.settings import LedgerSettings, PairedSettings, ShadowSettings
from specwatch.shadow.summary import LedgerView
from specwatch.shadow.values import Arm

logger = logging.getLogger("specwatch.shadow.component")

#: How often a ledger that cannot store rows (full, read-only, unavailable) is tried again.
LEDGER_RETRY_SECONDS = 30.0
#: The share of the shutdown timeout the mirror listener gives the copies it is reading (they
#: are copies, not live answers: the live streams and replays get the whole drain).
MIRROR_SHUTDOWN_SHARE = 0.5


class StatsSink(Protocol):
    """Where each new published snapshot goes: the server's
    :meth:`ShadowPlug.publish <specwatch.server.wiring.ShadowPlug.publish>` (into
    ``Snapshot.shadow``)."""

    def publish(self, stats: ShadowStats) -> None: ...


class ShadowComponent:
    """The shadow chain's lifetime (see module docstring).

    ``shadow``, ``paired``, ``ledger``: its settings groups. ``load_state``: per-arm load for the
    sampler's load-aware pause (``None``: never pauses for load). ``publish``: given each new
    :class:`ShadowStats` (the server publishes it). ``runtime``: clocks, sleep and the
    listeners' limits (:class:`~specwatch.shadow.pipeline.Runtime`); ``session``: the replay
    session (``None``: one per arm is opened by :meth:`running` and closed on exit).
    :meth:`latest_stats` is ``None`` until the first refresh.
    """

    def __init__(
        self,
        shadow: ShadowSettings,
        paired: PairedSettings,
        ledger: LedgerSettings,
        *,
        load_state: LoadState | None = None,
        publish: StatsSink | None = None,
        runtime: Runtime = DEFAULT_RUNTIME,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.shadow_settings = shadow
        self.paired_settings = paired
        self.ledger_settings = ledger
        self.runtime = runtime
        self._watch: Callable[[asyncio.Task[Any]], None] | None = None
        #: Counters of the proxy listener (proxy mode).
        self.proxy_listener = ListenerStats("proxy")
        #: Counters of the mirror listener (mirror mode).
        self.mirror_listener = ListenerStats("mirror")
        self._load_state = load_state
        self._publish = publish
        self._session = session
        #: Compare, ledger row, counters, e-processes and the published snapshot.
        self.statistics = ShadowStatistics(
            paired,
            category_bound_from_settings(shadow, mono_clock=runtime.mono_clock),
            shadow.store_text,
        )
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
        """Build :class:`ShadowStats` now and hand it to the :class:`StatsSink` (``flush``: wait
        for queued rows first).

        No SQL: expires the buckets that left a window and reads the in-memory tallies
        (:meth:`ShadowStatistics.current_inputs
        <specwatch.shadow.live.ShadowStatistics.current_inputs>`); the window
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
        now = self.runtime.wall_clock()
        version, inputs = self.statistics.current_inputs(now)
        io = self.pipeline.metrics() if self.pipeline is not None else None
        stats = self.build_stats(inputs, now, io, version=version)
        self._stats = stats
        if self._publish is not None:
            self._publish.publish(stats)
        return stats

    async def _final_refresh(self) -> None:
        """At stop, once the pipeline finished its pairs: the last statistics
        (:meth:`latest_stats`), so what the process prints at exit counts every pair the
        ledger holds. Skipped before the startup rebuild finished; a failing ledger is logged."""
        if not self._ready.is_set() or self.statistics.live is None:
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
        """:class:`ShadowStats` from ``inputs`` with this component's statistics and ledger
        health (no I/O; logs when ledger writes start or stop failing). ``version``: the
        :attr:`LiveTallies.version` ``inputs`` were read at (see
        :meth:`ShadowStatistics.snapshot <specwatch.shadow.live.ShadowStatistics.snapshot>`);
        ``None``: computed afresh."""
        view = LedgerView()
        ledger = self.ledger
        if ledger is not None:
            health = ledger.health
            errors = dict(health.write_errors)
            if health.dropped:
                errors["queue_full"] = health.dropped
            self._note_ledger_state(health.state, health.last_error)
            view = LedgerView(write_errors=errors, state=ledger.state)
        return self.statistics.snapshot(inputs, now, SnapshotSide(io, view, version))

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
        now = self.runtime.mono_clock()
        if ledger.state not in ("ok", "corrupt") and now - self._last_retry >= (
            LEDGER_RETRY_SECONDS
        ):
            self._last_retry = now
            await ledger.retry()
        every = self.ledger_settings.integrity_check_seconds
        if every is not None and ledger.state == "ok" and now - self._last_check >= every:
            self._last_check = now
            await ledger.quick_check()

    async def _run(self, pipeline: ShadowPipeline, ledger: Ledger) -> None:
        """Start the proxy listener (proxy mode), rebuild from the ledger, start the rest of
        the pipeline, then refresh the statistics every ``paired.refresh_seconds`` (a cheap
        tick: no SQL, see the module docstring).

        Runs as a background task so a large ledger never delays serving ``/healthz``.
        """
        await pipeline.start_proxy()  # the live path first: it needs nothing from the ledger
        self.statistics.rows = ledger
        await self.statistics.rebuild(ledger, self.runtime.wall_clock())
        pipeline.sampler.hold = self._ledger_hold
        await pipeline.start()
        self._started = True
        self._ready.set()
        self._last_retry = self._last_check = self.runtime.mono_clock()
        while True:
            try:
                await self._ledger_upkeep(ledger)
                await self.refresh()
            except (sqlite3.Error, OSError, ValueError) as exc:
                log_event(
                    logger, logging.WARNING, "shadow statistics refresh failed", error=repr(exc)
                )
            await self.runtime.sleep(self.paired_settings.refresh_seconds)

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
            wall_clock=self.runtime.wall_clock,
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
                sink=self.statistics,
                load_state=self._load_state,
                runtime=self.runtime,
                categories=self.statistics.categories,
                listener=self.proxy_listener,
                serve_mirror=False,
            )
            self.pipeline = pipeline
            sh = self.shadow_settings
            if "mirror" in sh.modes:
                listener = MirrorListener(
                    mirror_routes(self._mirror),
                    max_body_bytes=sh.mirror_max_body_bytes,
                    listen=self.runtime.listen,
                    listener=self.mirror_listener,
                    shutdown_timeout_seconds=self.runtime.shutdown_timeout_seconds
                    * MIRROR_SHUTDOWN_SHARE,
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
            self.statistics.reset()
            if own_session and isinstance(session, Mapping):
                for s in session.values():
                    await s.close()
