"""Wiring: the aiohttp application that scrapes, publishes one Snapshot and serves it.

``build_app(settings, clock=..., session=..., components=[...])`` returns a
:class:`aiohttp.web.Application` with ``/metrics``, ``/healthz``, ``/readyz`` and
``/api/v1/snapshot``. Its ``cleanup_ctx`` opens the HTTP session (unless one is passed in) and
starts and cancels the scrape loops. Other chains plug in as :class:`Component` objects, one line
each: a component's ``install`` may add routes, ``cleanup_ctx`` entries (background tasks),
collectors in the registry, and publish JSON-able values under its own name in
``Snapshot.extras`` through :meth:`SnapshotStore.set_extra`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Protocol

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.aiohttp import make_aiohttp_handler
from prometheus_client.registry import Collector

from specwatch.core.clock import Clock
from specwatch.core.logs import log_event
from specwatch.export.json import snapshot_json
from specwatch.export.prometheus import SpecwatchCollector
from specwatch.observe.loop import Scraper
from specwatch.observe.tracker import TargetTracker, build_snapshot
from specwatch.observe.values import Snapshot, SnapshotGetter
from specwatch.settings import Settings

logger = logging.getLogger("specwatch.server.app")


class SnapshotStore:
    """Holds the current :class:`Snapshot`; :meth:`publish` swaps one reference.

    ``get`` is safe to call from collectors (no I/O, no locking: the value is immutable).
    """

    def __init__(self, trackers: dict[str, TargetTracker], clock: Clock) -> None:
        self.trackers = trackers
        self._clock = clock
        self._extras: dict[str, Any] = {}
        self._listeners: list[Callable[[Snapshot], None]] = []
        self._snap = Snapshot(generated_at=clock())
        self.publish()

    def get(self) -> Snapshot:
        """The current snapshot."""
        return self._snap

    def publish(self) -> None:
        """Rebuild the snapshot from the trackers and extras (called after every scrape)."""
        self._snap = build_snapshot(
            [t.snapshot() for t in self.trackers.values()],
            now=self._clock(),
            extras=self._extras,
        )
        for listener in self._listeners:
            listener(self._snap)

    def add_listener(self, listener: Callable[[Snapshot], None]) -> None:
        """Call ``listener(snapshot)`` after every publish (detectors, alerting). It runs on the
        event loop and must not block; an exception from it propagates to the scrape task."""
        self._listeners.append(listener)

    def set_extra(self, name: str, value: Any) -> None:
        """Publish a component's JSON-able value (``"shadow"``, ``"alerts"``, ...)."""
        self._extras[name] = value
        self.publish()

    @property
    def ready(self) -> bool:
        """True once every target had a good scrape."""
        return all(t.snapshot().ready for t in self.trackers.values())


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
STORE_KEY = web.AppKey("specwatch_store", SnapshotStore)
REGISTRY_KEY = web.AppKey("specwatch_registry", CollectorRegistry)
SESSION_KEY = web.AppKey("specwatch_session", aiohttp.ClientSession)
SCRAPER_KEY = web.AppKey("specwatch_scraper", Scraper)


class Component(Protocol):
    """Something that plugs into the app (shadow, alerting): routes, tasks, collectors."""

    def install(
        self, app: web.Application, store: SnapshotStore, registry: CollectorRegistry
    ) -> None:
        """Add routes / ``app.cleanup_ctx`` entries / ``registry.register(...)`` collectors."""
        ...


async def _healthz(request: web.Request) -> web.Response:
    failed = request.app[LIVENESS_KEY].failed
    if failed is not None:
        return web.Response(status=503, text=f"failed: {failed}\n")
    return web.Response(text="ok\n")


async def _readyz(request: web.Request) -> web.Response:
    store = request.app[STORE_KEY]
    waiting = [name for name, t in store.trackers.items() if not t.snapshot().ready]
    if waiting:
        return web.json_response({"ready": False, "waiting_for": waiting}, status=503)
    return web.json_response({"ready": True})


async def _snapshot(request: web.Request) -> web.Response:
    doc = snapshot_json(request.app[STORE_KEY].get())
    return web.Response(text=json.dumps(doc, allow_nan=False), content_type="application/json")


def build_app(
    settings: Settings,
    *,
    clock: Clock = time.time,
    session: aiohttp.ClientSession | None = None,
    registry: CollectorRegistry | None = None,
    components: Sequence[Component] = (),
    extra_collectors: Sequence[Callable[[SnapshotGetter], Collector]] = (),
    scrape: bool = True,
) -> web.Application:
    """Build the sidecar's application.

    ``clock``: unix time source. ``session``: a shared :class:`aiohttp.ClientSession` (closed by
    the caller); ``None`` creates one on startup and closes it on cleanup. ``registry``: a fresh
    :class:`CollectorRegistry` by default (never the global one), built with ``auto_describe``
    so a collector whose family name clashes with one already registered raises ``ValueError``
    here; it gets :class:`ProcessCollector`, :class:`PlatformCollector` and :class:`GCCollector`
    (``process_*``, ``python_*``). ``extra_collectors``: factories called with the snapshot
    getter. ``/metrics`` is prometheus_client's own aiohttp handler: text format or OpenMetrics
    by ``Accept``, gzip by ``Accept-Encoding``. ``scrape=False`` starts no scrape loops (tests drive
    :meth:`Scraper.scrape_once` themselves).
    """
    app = web.Application()
    trackers = {t.name: TargetTracker(t, settings.window_seconds) for t in settings.targets}
    store = SnapshotStore(trackers, clock)
    reg = registry if registry is not None else CollectorRegistry(auto_describe=True)
    if registry is None:
        ProcessCollector(registry=reg)
        PlatformCollector(registry=reg)
        GCCollector(registry=reg)
    reg.register(SpecwatchCollector(store.get))
    for factory in extra_collectors:
        reg.register(factory(store.get))
    app[SETTINGS_KEY] = settings
    app[LIVENESS_KEY] = Liveness()
    app[STORE_KEY] = store
    app[REGISTRY_KEY] = reg
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
        scraper = Scraper(settings, sess, trackers, clock=clock, on_update=store.publish)
        app[SCRAPER_KEY] = scraper
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
            if own:
                await sess.close()

    app.cleanup_ctx.append(_scrape_ctx)
    for component in components:
        component.install(app, store, reg)
    return app
