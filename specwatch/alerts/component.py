"""The alerting component: detectors over the latest inputs, the Alertmanager loop, alert gauges.

:class:`AlertingComponent` takes its settings groups (``detect``, ``alerting``, the window
names), an ``inputs`` callable returning the latest observe view and shadow statistics, and an
``on_state`` callback. The server (:mod:`specwatch.server.wiring`) joins it to the published
snapshot and enters :meth:`AlertingComponent.running` with the app. Every
``alerting.evaluation_interval`` seconds the loop evaluates
:class:`~specwatch.alerts.pending.Detector`, keeps the ``for`` durations, posts to every
Alertmanager in ``alerting.urls`` (none: nothing is sent) and hands the resulting
:class:`~specwatch.alerts.alertmanager.AlertingState` to ``on_state``: the detectors never
write into what they read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import aiohttp

from specwatch.alerts.alert import Alert
from specwatch.alerts.alertmanager import AlertingState, AlertLoop
from specwatch.alerts.pending import Detector
from specwatch.alerts.settings import AlertingSettings, DetectSettings
from specwatch.core.clock import Clock
from specwatch.core.config import SINCE_START
from specwatch.core.logs import log_event
from specwatch.observe.values import ObserveView
from specwatch.shadow.summary import ShadowStats

__all__ = ["AlertInputs", "AlertingComponent", "missing_windows"]

logger = logging.getLogger("specwatch.alerts.alertmanager")

#: Returns what the detectors read now: the observe view (``None`` before the first one) and
#: the shadow chain's latest statistics (``None`` while there are none). No I/O.
AlertInputs = Callable[[], tuple[ObserveView | None, ShadowStats | None]]


def missing_windows(detect: DetectSettings, windows: Sequence[str]) -> dict[str, str]:
    """Detector window fields naming a window specwatch does not keep → that name.

    Baseline windows (``acceptance_baseline_window``, ``acceptance_sustained_window``,
    ``flip_window``) fall back to
    ``since_start`` and are not reported; ``shadow_stalled_window`` is a shadow window and is
    not checked here. A detector whose window is missing never fires.
    """
    kept = {*windows, SINCE_START}
    fields = ("acceptance_short_window", "rate_window", "fly_gain_window")
    return {f: getattr(detect, f) for f in fields if getattr(detect, f) not in kept}


class AlertingComponent:
    """Detectors + Alertmanager delivery (the server exports its :attr:`state`).

    ``detect``, ``alerting``: its settings groups; ``windows``: the observe chain's window
    names (a detector window not among them is logged once: its detectors stay silent).
    ``inputs``: see :data:`AlertInputs`. ``on_state``: called with each new
    :class:`AlertingState` (the server publishes it). ``clock`` (unix seconds) and ``sleep``
    are injected (tests pass fakes). :attr:`state` is the last state; :meth:`tick` runs one
    evaluation (what the background task does every ``evaluation_interval``).
    """

    def __init__(
        self,
        detect: DetectSettings,
        alerting: AlertingSettings,
        windows: Sequence[str],
        *,
        inputs: AlertInputs,
        on_state: Callable[[AlertingState], None] | None = None,
        clock: Clock = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._alerting = alerting
        self._inputs = inputs
        self._on_state_cb = on_state
        self._clock = clock
        self._sleep = sleep
        self.detector = Detector(detect)
        missing = missing_windows(detect, windows)
        if missing:
            log_event(
                logger,
                logging.WARNING,
                "detector window not configured; its detectors stay silent",
                missing=missing,
                windows=list(windows),
            )
        self._loop: AlertLoop | None = None
        self._state = AlertingState()

    @property
    def state(self) -> AlertingState:
        """The last alerting state (firing alerts, send errors, outbox depth)."""
        return self._state

    def findings(self) -> Sequence[Alert]:
        """Alerts firing now (after ``for``) on the latest inputs; none before an observe view."""
        observe, shadow = self._inputs()
        if observe is None:
            return []
        return self.detector.evaluate(observe, shadow, self._clock())

    def _on_state(self, state: AlertingState) -> None:
        changed = state != self._state
        self._state = state
        if changed and self._on_state_cb is not None:
            self._on_state_cb(state)

    async def tick(self) -> None:
        """One evaluation and delivery (needs :meth:`running`: the loop uses its session).

        Raises ``RuntimeError`` when the component is not running."""
        if self._loop is None:
            raise RuntimeError("alerting component is not started")
        await self._loop.tick()

    @contextlib.asynccontextmanager
    async def running(
        self,
        session: aiohttp.ClientSession,
        watch: Callable[[asyncio.Task[Any]], None] | None = None,
    ) -> AsyncIterator[None]:
        """Start the alert loop on ``session`` (``watch`` gets its task); cancel it on exit."""
        self._loop = AlertLoop(
            self._alerting,
            session,
            self.findings,
            clock=self._clock,
            sleep=self._sleep,
            on_state=self._on_state,
        )
        task = asyncio.create_task(self._loop.run(), name="specwatch-alerting")
        if watch is not None:
            watch(task)
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self._loop = None
