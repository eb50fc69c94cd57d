"""The aiohttp application that scrapes, publishes one Snapshot and serves it.

``build_app(settings, wall_clock=..., session=..., components=[...])`` returns a
:class:`aiohttp.web.Application` with ``/metrics``, ``/healthz``, ``/readyz`` and
``/api/v1/snapshot``. Its ``cleanup_ctx`` opens the HTTP session (unless one is passed in) and
starts and cancels the scrape loops. The published value is one typed
:class:`~specwatch.export.snapshot.Snapshot` in a :class:`~specwatch.core.store.Store`; after
every scrape the observe part is replaced. Other chains plug in as :class:`Component` objects
(built by :mod:`specwatch.server.wiring`): a component's ``install`` may add routes,
``cleanup_ctx`` entries (background tasks) and collectors, and publishes its own typed part of
the snapshot through the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import signal
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol, runtime_checkable

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.aiohttp import make_aiohttp_handler
from prometheus_client.registry import Collector

from specwatch.core.clock import SYSTEM_MONOTONIC, SYSTEM_WALL, WallClock
from specwatch.core.listen import MAX_FIELD_BYTES, ListenerStats
from specwatch.core.listen_http import BoundAddress, GuardedSite, body_timeout_middleware
from specwatch.core.logs import log_event
from specwatch.core.shutdown import Drain, ShutdownDeadline, StopSignal, close_reserve_seconds
from specwatch.core.store import Store
from specwatch.export.json import snapshot_json
from specwatch.export.prometheus import ListenerCollector, SpecwatchCollector
from specwatch.export.snapshot import Snapshot, SnapshotGetter
from specwatch.observe.loop import Scraper
from specwatch.settings import Settings

logger = logging.getLogger("specwatch.server.app")


class Liveness:
    """What ``/healthz`` reports: alive until a background task dies unexpectedly.

    Components call :meth:`mark_failed` when one of their own tasks dies; the pod is then
    restarted by its liveness probe instead of serving frozen values.
    """

    def __init__(self) -> None:
        self.failed: str | None = None

    def mark_failed(self, reason: str) -> None:
        """Record the first fatal failure."""
        if self.failed is None:
            self.failed = reason

    def watch(self, task: asyncio.Task[Any]) -> None:
        """Mark failed (and log with traceback) when ``task`` ends with an exception."""

        def done(t: asyncio.Task[Any]) -> None:
            if t.cancelled():
                return
            exc = t.exception()
            if exc is not None:
                log_event(
                    logger,
                    logging.ERROR,
                    "background task died",
                    task=t.get_name(),
                    error=repr(exc),
                )
                self.mark_failed(f"{t.get_name()}: {type(exc).__name__}: {exc}")

        task.add_done_callback(done)


SETTINGS_KEY = web.AppKey("specwatch_settings", Settings)
LIVENESS_KEY = web.AppKey("specwatch_liveness", Liveness)
STORE_KEY = web.AppKey("specwatch_store", Store[Snapshot])
REGISTRY_KEY = web.AppKey("specwatch_registry", CollectorRegistry)
SESSION_KEY = web.AppKey("specwatch_session", aiohttp.ClientSession)
SCRAPER_KEY = web.AppKey("specwatch_scraper", Scraper)
#: Counters of specwatch's listeners (``main``; a component adds its own, e.g. ``proxy``).
LISTENERS_KEY = web.AppKey("specwatch_listeners", list[ListenerStats])
#: The shutdown timeline (:class:`~specwatch.core.shutdown.Drain`): begun on SIGTERM.
DRAIN_KEY = web.AppKey("specwatch_drain", Drain)


class Component(Protocol):
    """Something that plugs into the app (shadow, alerting): routes, tasks, collectors.

    ``store`` holds the published :class:`Snapshot`; a component replaces only its own part
    (``store.update(lambda s: replace(s, shadow=...))``) and never reads what it writes.
    """

    def install(
        self, app: web.Application, store: Store[Snapshot], registry: CollectorRegistry
    ) -> None:
        """Add routes / ``app.cleanup_ctx`` entries / ``registry.register(...)`` collectors."""
        ...


@runtime_checkable
class Draining(Protocol):
    """A component with work to let finish on SIGTERM (live streams, replays in flight)."""

    async def drain(self, until: float) -> None:
        """Accept nothing new; let what is open finish until ``until`` (monotonic seconds),
        then cut or abandon (and count) what is left."""
        ...


#: The components of an app that drain on SIGTERM (:class:`Draining`), in install order.
DRAINERS_KEY: web.AppKey[list[Draining]] = web.AppKey("specwatch_drainers")


async def _healthz(request: web.Request) -> web.Response:
    failed = request.app[LIVENESS_KEY].failed
    if failed is not None:
        return web.Response(status=503, text=f"failed: {failed}\n")
    return web.Response(text="ok\n")


def statistics_state(shadow_enabled: bool, snapshot: Snapshot) -> str:
    """The paired statistics' readiness: ``off`` (shadow off), ``rebuilding`` (shadow on, no
    statistics published yet: the start-up rebuild from the ledger is still running) or
    ``ready``."""
    if not shadow_enabled:
        return "off"
    return "rebuilding" if snapshot.shadow is None else "ready"


async def _readyz(request: web.Request) -> web.Response:
    if request.app[DRAIN_KEY].draining:  # SIGTERM: out of load balancing before anything closes
        return web.json_response({"ready": False, "draining": True}, status=503)
    scraper = request.app[SCRAPER_KEY]
    waiting = [name for name, t in scraper.trackers.items() if not t.snapshot().ready]
    statistics = statistics_state(
        request.app[SETTINGS_KEY].shadow.enabled, request.app[STORE_KEY].get()
    )
    if waiting or statistics == "rebuilding":
        body = {"ready": False, "waiting_for": waiting, "statistics": statistics}
        return web.json_response(body, status=503)
    return web.json_response({"ready": True, "statistics": statistics})


#: What the well-known endpoints are for (``/`` lists every route, described or not).
ENDPOINT_HELP: dict[str, str] = {
    "/": "this list",
    "/metrics": "Prometheus metrics (specwatch_*)",
    "/healthz": "liveness: ok, or 503 when a component failed",
    "/readyz": "readiness: 200 once every target was scraped and the statistics are rebuilt; "
    "503 while shutting down",
    "/api/v1/snapshot": "everything specwatch knows now, as JSON (with the verdict)",
}


async def _index(request: web.Request) -> web.Response:
    """``GET /``: every route of the app as JSON, ``{"endpoints": [{"path", "methods",
    "about"}]}``, sorted by path (components' routes included, e.g. the shadow mirror)."""
    routes: dict[str, set[str]] = {}
    for route in request.app.router.routes():
        path = route.resource.canonical if route.resource is not None else ""
        if path and route.method != "HEAD":
            routes.setdefault(path, set()).add(route.method)
    endpoints = [
        {"path": p, "methods": sorted(m), "about": ENDPOINT_HELP.get(p, "")}
        for p, m in sorted(routes.items())
    ]
    return web.json_response({"service": "specwatch", "endpoints": endpoints})


async def _snapshot(request: web.Request) -> web.Response:
    doc = snapshot_json(request.app[STORE_KEY].get())
    return web.Response(text=json.dumps(doc, allow_nan=False), content_type="application/json")


def build_app(
    settings: Settings,
    *,
    wall_clock: WallClock = SYSTEM_WALL,
    session: aiohttp.ClientSession | None = None,
    registry: CollectorRegistry | None = None,
    components: Sequence[Component] = (),
    extra_collectors: Sequence[Callable[[SnapshotGetter], Collector]] = (),
    scrape: bool = True,
) -> web.Application:
    """Build the sidecar's application.

    ``wall_clock``: unix time source. ``session``: a shared :class:`aiohttp.ClientSession`
    (closed by the caller); ``None`` creates one on startup and closes it on cleanup.
    ``registry``: a fresh :class:`CollectorRegistry` by default (never the global one).
    ``extra_collectors``: factories called with the snapshot getter. ``scrape=False`` starts no
    scrape loops (tests drive :meth:`Scraper.scrape_once` themselves).
    """
    main_listener = ListenerStats("main")
    app = web.Application(
        middlewares=[body_timeout_middleware(settings.server.limits, main_listener)]
    )

    def publish_observe() -> None:
        store.update(lambda snap: replace(snap, observe=scraper.view(wall_clock())))

    scraper = Scraper(
        settings.targets,
        settings.scrape,
        settings.window_seconds,
        wall_clock=wall_clock,
        on_update=publish_observe,
    )
    store: Store[Snapshot] = Store(Snapshot(observe=scraper.view(wall_clock())))
    reg = registry if registry is not None else CollectorRegistry(auto_describe=True)
    if registry is None:
        ProcessCollector(registry=reg)
        PlatformCollector(registry=reg)
        GCCollector(registry=reg)
    reg.register(SpecwatchCollector(store.get))
    listeners = [main_listener]
    reg.register(ListenerCollector(lambda: listeners))
    for factory in extra_collectors:
        reg.register(factory(store.get))
    app[SETTINGS_KEY] = settings
    app[LIVENESS_KEY] = Liveness()
    app[STORE_KEY] = store
    app[SCRAPER_KEY] = scraper
    app[REGISTRY_KEY] = reg
    app[LISTENERS_KEY] = listeners
    app[DRAIN_KEY] = Drain(settings.server.shutdown_timeout_seconds, SYSTEM_MONOTONIC)
    drainers: list[Draining] = [c for c in components if isinstance(c, Draining)]
    app[DRAINERS_KEY] = drainers
    app.router.add_get("/", _index)
    app.router.add_get("/metrics", make_aiohttp_handler(reg))
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/api/v1/snapshot", _snapshot)

    async def _scrape_ctx(app: web.Application) -> AsyncIterator[None]:
        own = session is None
        sess = session or aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None),  # each request has its own asyncio.timeout
            auto_decompress=True,
        )
        app[SESSION_KEY] = sess
        scraper.use_session(sess)
        task = asyncio.create_task(scraper.run(), name="specwatch-scrape") if scrape else None
        if task is not None:
            app[LIVENESS_KEY].watch(task)
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            scraper.use_session(None)
            if own:
                await sess.close()

    app.cleanup_ctx.append(_scrape_ctx)
    for component in components:
        component.install(app, store, reg)
    return app


def serve(app: web.Application, settings: Settings) -> None:
    """Serve ``app`` on ``settings.server`` until SIGTERM or SIGINT, then shut down within
    ``server.shutdown_timeout_seconds`` (the budget, see :mod:`specwatch.core.shutdown`):
    ``/readyz`` answers 503 at once, every :class:`Draining` component stops accepting and lets
    its live streams and replays in flight run until the budget less the close reserve, then
    the main listener closes and the app's cleanup runs (alert state saved, ledger flushed,
    sessions closed) until the budget; the process is ended at the budget if its teardown
    hangs. Returns after SIGTERM; raises :class:`KeyboardInterrupt` after the same orderly
    stop when SIGINT (Ctrl-C) started it (:meth:`StopSignal.end`). Raises
    :class:`~specwatch.core.listen_http.CannotListen` when the address cannot be bound."""
    budget = settings.server.shutdown_timeout_seconds
    stopped_by = StopSignal()
    deadline = ShutdownDeadline(max(0.0, budget - FORCED_EXIT_MARGIN_SECONDS), stopped_by)
    try:
        asyncio.run(_serve(app, settings, deadline, stopped_by))
    finally:
        deadline.cancel()
    stopped_by.end()


#: Seconds before the budget's end the process is ended if it is still alive (the thread that
#: ends it may wait a few milliseconds for the interpreter on a loaded machine).
FORCED_EXIT_MARGIN_SECONDS = 0.1

#: Seconds before the budget's end the cleanup is cut off, so ``serve`` returns and the
#: interpreter exits before :class:`ShutdownDeadline` has to end it.
EXIT_MARGIN_SECONDS = 0.2


async def _serve(
    app: web.Application, settings: Settings, deadline: ShutdownDeadline, stopped_by: StopSignal
) -> None:
    srv = settings.server
    budget = srv.shutdown_timeout_seconds
    drain = app[DRAIN_KEY]
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        # the main listener closes after the drain: its requests (probes, scrapes) are short
        shutdown_timeout=close_reserve_seconds(budget) / 4,
        keepalive_timeout=srv.keepalive_timeout_seconds,
        max_line_size=MAX_FIELD_BYTES,
        max_field_size=MAX_FIELD_BYTES,
    )
    # the port is taken before the runner's start-up (ledger opened, alert state restored), so
    # a port in use fails a start that has changed nothing
    bound = await BoundAddress.take(srv.host, srv.port)
    try:
        await runner.setup()
    except BaseException:
        bound.close()
        raise
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(signum: int, frame: object) -> None:
        # a Python-level handler, not the loop's: it runs at the signal's arrival even while
        # the loop is busy, so the budget counts from then (a loop handler ran up to a busy
        # turn later, and the exit overran the budget by as much)
        stopped_by.note(signum)
        deadline.start()
        drain.begin()
        loop.call_soon_threadsafe(stop.set)

    before = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        site = GuardedSite(
            runner,
            srv.host,
            srv.port,
            limits=srv.limits,
            stats=app[LISTENERS_KEY][0],
            bound=bound,
        )
        await site.start()
        # the bound port, not the configured one: with ``server.port: 0`` only this says it
        assert bound.server is not None
        port = bound.server.sockets[0].getsockname()[1]
        log_event(logger, logging.INFO, "listening", url=f"http://{srv.host}:{port}/metrics")
        # what start-up loaded (modules, settings, the restored state) lives as long as the
        # process: kept out of the collector's full passes, which otherwise walk it all and
        # hold the event loop for up to a second on a loaded machine
        gc.freeze()
        await stop.wait()
        log_event(logger, logging.INFO, "shutting down", budget_seconds=budget)
        drainers: list[Draining] = app[DRAINERS_KEY]
        await _drain(drainers, drain)
    finally:
        drain.begin()  # an error above: the cleanup still keeps to a budget
        try:
            async with asyncio.timeout(max(0.0, drain.exit_left() - EXIT_MARGIN_SECONDS)):
                await runner.cleanup()
            deadline.cleaned()
        except TimeoutError:
            log_event(
                logger,
                logging.WARNING,
                "shutdown budget exceeded",
                reason="shutdown_timeout",
                budget_seconds=budget,
            )
        for sig, handler in before.items():
            signal.signal(sig, handler)
        log_event(logger, logging.INFO, "stopped", seconds=round(drain.elapsed(), 3))


async def _drain(drainers: Sequence[Draining], drain: Drain) -> None:
    """Run every component's drain together until :attr:`Drain.until` (a component that
    overruns it is cancelled with a WARNING line)."""
    if not drainers:
        return
    until = drain.until
    try:
        async with asyncio.timeout(drain.left() + 0.1):
            await asyncio.gather(*(d.drain(until) for d in drainers))
    except TimeoutError:
        log_event(logger, logging.WARNING, "drain overran its budget", reason="shutdown_timeout")
