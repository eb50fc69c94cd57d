"""The alerting component: detectors over the latest inputs, the Alertmanager loop, alert gauges.

:class:`AlertingComponent` takes its settings groups (``detect``, ``alerting``, the window
names), an ``inputs`` callable returning the latest observe view and shadow statistics, and an
``on_state`` callback. The server (:mod:`specwatch.server.wiring`) joins it to the published
snapshot and enters :meth:`AlertingComponent.running` with the app. Every
``alerting.evaluation_interval`` seconds the loop evaluates
:class:`~specwatch.alerts.pending.Detector`, keeps the ``for`` durations, posts to every
Alertmanager in ``alerting.urls`` (none: nothing is sent) and hands the resulting
:class:`~specwatch.alerts.values.AlertingState` to ``on_state``: the detectors never
write into what they read.

With a ``state_path`` the component survives restarts as Prometheus does: at start it restores
the ``for`` timers and the active alerts saved there (their start times and ``startsAt`` kept;
restored alerts are resent on the first tick, before their Alertmanager lease runs out), and
after every tick it saves them again (:mod:`specwatch.alerts.saved`, written off the event
loop). A missing file is a first start; an unreadable, malformed or too old one is counted in
``specwatch_alert_state_errors_total{reason}`` (``read``, ``corrupt``, ``too_old``; ``write``
for a failed save), logged once, and the component starts empty.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from specwatch.alerts.alert import Alert, AlertKey
from specwatch.alerts.alertmanager import AlertLoop
from specwatch.alerts.pending import Detector
from specwatch.alerts.saved import SavedAlerts, dump, load, read_text, write_atomic
from specwatch.alerts.settings import AlertingSettings, DetectSettings
from specwatch.alerts.values import (
    CAUSE_ALERTS,
    STATE_ERROR_REASONS,
    AlertCause,
    AlertingState,
)
from specwatch.core.clock import SYSTEM_WALL, WallClock
from specwatch.core.config import SINCE_START
from specwatch.core.logs import log_event
from specwatch.observe.values import ObserveView
from specwatch.shadow.published import ShadowStats

__all__ = ["AlertInputs", "AlertingComponent", "held_causes", "missing_windows"]

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


def held_causes(held: Iterable[AlertKey]) -> tuple[AlertCause, ...]:
    """The ``cause`` of every :data:`~specwatch.alerts.values.CAUSE_ALERTS` finding the ``for``
    timers hold (pending or firing), one per alert and target: its cause, or ``undetermined``
    where the target's findings of that alert name different causes; sorted."""
    found: dict[tuple[str, str, str], set[str]] = {}
    for key in held:
        labels = dict(key)
        name, cause = labels.get("alertname", ""), labels.get("cause")
        if name in CAUSE_ALERTS and cause:
            where = (name, labels.get("target", ""), labels.get("role", ""))
            found.setdefault(where, set()).add(cause)
    return tuple(
        AlertCause(name, target, role, next(iter(c)) if len(c) == 1 else "undetermined")
        for (name, target, role), c in sorted(found.items())
    )


class AlertingComponent:
    """Detectors + Alertmanager delivery (the server exports its :attr:`state`).

    ``detect``, ``alerting``: its settings groups; ``windows``: the observe chain's window
    names (a detector window not among them is logged once: its detectors stay silent).
    ``inputs``: see :data:`AlertInputs`. ``on_state``: called with each new
    :class:`AlertingState` (the server publishes it). ``wall_clock`` (unix seconds) and ``sleep``
    are injected (tests pass fakes). :attr:`state` is the last state; :meth:`tick` runs one
    evaluation (what the background task does every ``evaluation_interval``). ``state_path``:
    where the alert state is saved and restored from (``None``: nowhere; see the module doc);
    ``state_key``: the key of the targets it belongs to, written into the file; a file with
    another key (state of other targets) is not restored.
    """

    def __init__(
        self,
        detect: DetectSettings,
        alerting: AlertingSettings,
        windows: Sequence[str],
        *,
        inputs: AlertInputs,
        on_state: Callable[[AlertingState], None] | None = None,
        wall_clock: WallClock = SYSTEM_WALL,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        state_path: Path | None = None,
        state_key: str = "",
    ) -> None:
        self._alerting = alerting
        self._state_path = state_path
        self._state_key = state_key
        self._state_errors: dict[str, int] = dict.fromkeys(STATE_ERROR_REASONS, 0)
        self._last_saved: str | None = None
        self._inputs = inputs
        self._on_state_cb = on_state
        self._wall_clock = wall_clock
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
        self._state = AlertingState(state_errors=dict(self._state_errors))

    @property
    def state(self) -> AlertingState:
        """The last alerting state (firing alerts, send errors, outbox depth)."""
        return self._state

    def findings(self) -> Sequence[Alert]:
        """Alerts firing now (after ``for``) on the latest inputs; none before an observe view."""
        observe, shadow = self._inputs()
        if observe is None:
            return []
        return self.detector.evaluate(observe, shadow, self._wall_clock())

    def _on_state(self, state: AlertingState) -> None:
        state = dataclasses.replace(state, causes=held_causes(self.detector.tracker.export()))
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

    def _state_error(self, reason: str, message: str, **fields: Any) -> None:
        self._state_errors[reason] += 1
        log_event(logger, logging.WARNING, message, path=str(self._state_path), **fields)

    async def _restore(self, loop: AlertLoop) -> None:
        """Load the saved state into the tracker and ``loop`` (see the module doc)."""
        path = self._state_path
        if path is None:
            return
        try:
            text = await asyncio.to_thread(read_text, path)
            if text is None:
                return
            saved = load(text)
        except OSError as exc:
            self._state_error("read", "alert state unreadable; starting empty", error=str(exc))
            return
        except ValueError as exc:
            self._state_error("corrupt", "alert state malformed; starting empty", error=str(exc))
            return
        if saved.targets != self._state_key:
            log_event(
                logger,
                logging.INFO,
                "alert state belongs to other targets; starting empty",
                path=str(path),
                saved_targets=saved.targets,
                targets=self._state_key,
            )
            return
        now = self._wall_clock()
        age = now - saved.written_at
        if age > self._alerting.restore_max_age:
            self._state_error(
                "too_old",
                "alert state older than restore_max_age; starting empty",
                age_seconds=round(age, 3),
                restore_max_age=self._alerting.restore_max_age,
            )
            return
        hold_until = now + self._alerting.restore_grace
        self.detector.tracker.restore(saved.pending, hold_until)
        loop.active.restore(saved.active, hold_until)
        log_event(
            logger,
            logging.INFO,
            "alert state restored",
            path=str(path),
            age_seconds=round(age, 3),
            pending=len(saved.pending),
            active=len(saved.active),
        )

    async def _save(self) -> None:
        """Write the tracker's timers and the active alerts (off the event loop)."""
        path, loop = self._state_path, self._loop
        if path is None or loop is None:
            return
        tracker = self.detector.tracker
        saved = SavedAlerts(
            self._wall_clock(),
            tracker.export(),
            tuple(loop.active.export()),
            targets=self._state_key,
        )
        text = dump(saved)
        try:
            await asyncio.to_thread(write_atomic, path, text)
        except OSError as exc:
            if self._last_saved != "failed":  # one line per run of failures
                self._state_error("write", "alert state not saved", error=str(exc))
            else:
                self._state_errors["write"] += 1
            self._last_saved = "failed"
            return
        self._last_saved = "ok"

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
            wall_clock=self._wall_clock,
            sleep=self._sleep,
            on_state=self._on_state,
            after_tick=self._save,
            state_errors=self._state_errors,
        )
        await self._restore(self._loop)
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
