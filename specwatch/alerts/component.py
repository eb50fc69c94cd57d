"""The alerting component: detectors over each snapshot, the Alertmanager loop, alert gauges.

``build_app(settings, components=[*alerting_components(settings)])`` plugs it in. Once the app
starts, every ``alerting.evaluation_interval`` seconds it evaluates
:class:`specwatch.alerts.detect.Detector` on the latest :class:`~specwatch.observe.values.Snapshot` (and the
shadow chain's :class:`~specwatch.shadow.summary.ShadowStats` when a provider is given), keeps the
``for`` durations, posts to every Alertmanager in ``alerting.urls`` (none: nothing is sent), and
publishes the result twice: ``specwatch_alert_firing`` / ``specwatch_alertmanager_*`` families in
the registry and ``Snapshot.extras["alerts"]`` (:func:`specwatch.alerts.alertmanager.alerts_json`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from specwatch.alerts.alertmanager import (
    Alert,
    AlertingState,
    AlertLoop,
)
from specwatch.alerts.detect import SINCE_START, Detector
from specwatch.alerts.settings import DetectSettings
from specwatch.core.clock import Clock
from specwatch.core.logs import log_event
from specwatch.export.json import alerts_json
from specwatch.export.prometheus import AlertsCollector
from specwatch.observe.values import Snapshot
from specwatch.server.app import LIVENESS_KEY, SESSION_KEY, SnapshotStore
from specwatch.settings import Settings
from specwatch.shadow.summary import ShadowStats

__all__ = ["AlertingComponent", "ShadowProvider", "alerting_components", "missing_windows"]

logger = logging.getLogger("specwatch.alerts.alertmanager")

#: Returns the shadow chain's latest statistics, ``None`` while there are none (no I/O).
ShadowProvider = Callable[[], ShadowStats | None]


def missing_windows(detect: DetectSettings, windows: Sequence[str]) -> dict[str, str]:
    """Detector window fields naming a window specwatch does not keep → that name.

    Baseline windows (``acceptance_baseline_window``, ``flip_window``) fall back to
    ``since_start`` and are not reported; ``shadow_stalled_window`` is a shadow window and is
    not checked here. A detector whose window is missing never fires.
    """
    kept = {*windows, SINCE_START}
    fields = ("acceptance_short_window", "rate_window", "fly_gain_window")
    return {f: getattr(detect, f) for f in fields if getattr(detect, f) not in kept}


class AlertingComponent:
    """Detectors + Alertmanager delivery as a :class:`specwatch.server.app.Component`.

    ``clock`` (unix seconds) and ``sleep`` are injected (tests pass fakes); ``shadow`` returns
    the latest :class:`ShadowStats` or ``None``. :attr:`state` is the last published
    :class:`AlertingState`; :meth:`tick` runs one evaluation (what the background task does
    every ``evaluation_interval``).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Clock = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        shadow: ShadowProvider | None = None,
    ) -> None:
        self._settings = settings
        self._clock = clock
        self._sleep = sleep
        self._shadow = shadow
        self.detector = Detector(settings.detect)
        missing = missing_windows(settings.detect, settings.windows)
        if missing:
            log_event(
                logger,
                logging.WARNING,
                "detector window not configured; its detectors stay silent",
                missing=missing,
                windows=list(settings.windows),
            )
        self._snapshot: Snapshot | None = None
        self._store: SnapshotStore | None = None
        self._loop: AlertLoop | None = None
        self._state = AlertingState()
        self._published: list[dict[str, Any]] | None = None

    @property
    def state(self) -> AlertingState:
        """The last published alerting state (firing alerts, send errors, outbox depth)."""
        return self._state

    def install(
        self, app: web.Application, store: SnapshotStore, registry: CollectorRegistry
    ) -> None:
        """Register the alert collector, listen to snapshots, start the loop with the app."""
        self._store = store
        self._snapshot = store.get()
        store.add_listener(self._on_snapshot)
        registry.register(AlertsCollector(lambda: self._state))
        store.set_extra("alerts", [])
        app.cleanup_ctx.append(self._ctx)

    def _on_snapshot(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot

    def findings(self) -> Sequence[Alert]:
        """Alerts firing now (after ``for``) on the latest snapshot."""
        if self._snapshot is None:
            return []
        shadow = self._shadow() if self._shadow is not None else None
        return self.detector.evaluate(self._snapshot, shadow, self._clock())

    def _on_state(self, state: AlertingState) -> None:
        self._state = state
        doc = alerts_json(state)
        if self._store is not None and doc != self._published:
            self._published = doc
            self._store.set_extra("alerts", doc)

    async def tick(self) -> None:
        """One evaluation and delivery (needs the app started: the loop uses its session)."""
        if self._loop is None:
            raise RuntimeError("alerting component is not started")
        await self._loop.tick()

    async def _ctx(self, app: web.Application) -> AsyncIterator[None]:
        self._loop = AlertLoop(
            self._settings.alerting,
            app[SESSION_KEY],
            self.findings,
            clock=self._clock,
            sleep=self._sleep,
            on_state=self._on_state,
        )
        task = asyncio.create_task(self._loop.run(), name="specwatch-alerting")
        app[LIVENESS_KEY].watch(task)
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def alerting_components(
    settings: Settings,
    *,
    clock: Clock = time.time,
    shadow: ShadowProvider | None = None,
) -> list[AlertingComponent]:
    """The components ``specwatch run`` adds for alerting (always one: the detectors and the
    ``specwatch_alert_firing`` gauges run even without Alertmanager URLs)."""
    return [AlertingComponent(settings, clock=clock, shadow=shadow)]
