"""The cross-chain joins: the only place where observe, shadow and alerts meet.

- arm ↔ target: :func:`arm_targets` names the scraped target of each shadow arm and
  :func:`arm_loads` turns the published observe view into the shadow sampler's
  :data:`~specwatch.shadow.sample.LoadState`;
- shadow stats → detectors: :class:`AlertingPlug` feeds the detectors the published observe
  view and shadow statistics, and publishes the
  :class:`~specwatch.alerts.values.AlertingState` it gets back;
- :class:`ShadowPlug` and :class:`AlertingPlug` are the :class:`~specwatch.server.app.Component`
  objects ``specwatch run`` and the demo plug into :func:`~specwatch.server.app.build_app`
  (:func:`shadow_components`, :func:`alerting_components`). Each replaces only its own part of
  the :class:`~specwatch.export.snapshot.Snapshot`.
"""

from __future__ import annotations

import hashlib
import socket
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import replace
from pathlib import Path

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from specwatch.alerts.component import AlertingComponent
from specwatch.alerts.settings import default_generator_url
from specwatch.alerts.values import AlertingState
from specwatch.core.clock import SYSTEM_MONOTONIC, SYSTEM_WALL, MonotonicClock, WallClock
from specwatch.core.store import Store
from specwatch.core.wire import server_base
from specwatch.export.prometheus import AlertsCollector, ShadowCollector
from specwatch.export.snapshot import Snapshot
from specwatch.observe.values import ObserveView, TargetSnapshot
from specwatch.server.app import LISTENERS_KEY, LIVENESS_KEY, SESSION_KEY
from specwatch.settings import Settings
from specwatch.shadow.component import ShadowComponent
from specwatch.shadow.pipeline import Runtime
from specwatch.shadow.published import ShadowStats
from specwatch.shadow.sample import ArmLoad, LoadState
from specwatch.shadow.settings import ArmEndpoint

__all__ = [
    "AlertingPlug",
    "ShadowPlug",
    "alert_state_path",
    "alerting_components",
    "arm_load",
    "arm_loads",
    "arm_targets",
    "shadow_components",
    "targets_key",
]


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


def arm_loads(
    observe: Callable[[], ObserveView | None],
    arms: Mapping[str, str],
    *,
    wall_clock: WallClock,
    mono_clock: MonotonicClock,
) -> LoadState:
    """The sampler's :data:`LoadState`: per arm in ``arms`` (arm → target name), the
    :func:`arm_load` of that target in the view ``observe()`` returns now (no I/O)."""

    def state() -> Mapping[str, ArmLoad]:
        view = observe()
        wall, mono = wall_clock(), mono_clock()
        return {
            arm: arm_load(
                None if view is None else view.targets.get(name), wall_now=wall, mono_now=mono
            )
            for arm, name in arms.items()
        }

    return state


class ShadowPlug:
    """The shadow chain as a :class:`~specwatch.server.app.Component`.

    Builds :attr:`component` from ``settings`` (its ``shadow``, ``paired`` and ``ledger``
    groups), with the arms' load read from the published observe view and its statistics
    published as ``Snapshot.shadow``. ``wall_clock``: unix seconds; ``mono_clock``: the
    sampler's clock; ``session``: the replay session (``None``: the component opens its own).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        wall_clock: WallClock = SYSTEM_WALL,
        mono_clock: MonotonicClock = SYSTEM_MONOTONIC,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self._store: Store[Snapshot] | None = None
        arms = arm_targets(settings)
        loads = arm_loads(self._observe, arms, wall_clock=wall_clock, mono_clock=mono_clock)
        self.component = ShadowComponent(
            settings.shadow,
            settings.paired,
            settings.ledger,
            load_state=loads if arms else None,
            publish=self,
            runtime=Runtime(
                wall_clock=wall_clock,
                mono_clock=mono_clock,
                listen=settings.server.limits,
                shutdown_timeout_seconds=settings.server.shutdown_timeout_seconds,
            ),
            session=session,
        )

    def _observe(self) -> ObserveView | None:
        return None if self._store is None else self._store.get().observe

    async def drain(self, until: float) -> None:
        """SIGTERM: the shadow chain's live streams and replays in flight run until ``until``
        (:meth:`ShadowComponent.drain`)."""
        await self.component.drain(until)

    def publish(self, stats: ShadowStats) -> None:
        """The component's :class:`~specwatch.shadow.component.StatsSink`: ``stats`` becomes
        ``Snapshot.shadow``."""
        if self._store is not None:
            self._store.update(lambda snap: replace(snap, shadow=stats))

    def install(
        self, app: web.Application, store: Store[Snapshot], registry: CollectorRegistry
    ) -> None:
        """The collector and the component's lifetime (the mirror listener has its own port,
        never this app's)."""
        self._store = store
        registry.register(ShadowCollector(lambda: store.get().shadow))
        if "proxy" in self.component.shadow_settings.modes:
            app[LISTENERS_KEY].append(self.component.proxy_listener)
        if "mirror" in self.component.shadow_settings.modes:
            app[LISTENERS_KEY].append(self.component.mirror_listener)
        app.cleanup_ctx.append(self._ctx)

    async def _ctx(self, app: web.Application) -> AsyncIterator[None]:
        async with self.component.running(watch=app[LIVENESS_KEY].watch):
            yield


class AlertingPlug:
    """The alerting chain as a :class:`~specwatch.server.app.Component`.

    Builds :attr:`component` from ``settings`` (``detect``, ``alerting``, ``windows``); its
    detectors read the published ``Snapshot.observe`` and ``Snapshot.shadow`` and its
    :class:`AlertingState` is published as ``Snapshot.alerts`` (the detectors never read it).
    ``state_path``: where alert state is saved across restarts (``None``: not saved;
    :func:`alert_state_path` gives ``specwatch run``'s).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        wall_clock: WallClock = SYSTEM_WALL,
        state_path: Path | None = None,
    ) -> None:
        self._store: Store[Snapshot] | None = None
        alerting = settings.alerting
        if not alerting.generator_url:
            host = alerting.pod or socket.gethostname()
            url = default_generator_url(host, settings.server.port)
            alerting = alerting.model_copy(update={"generator_url": url})
        self.component = AlertingComponent(
            settings.detect,
            alerting,
            settings.windows,
            inputs=self._inputs,
            on_state=self._publish,
            wall_clock=wall_clock,
            state_path=state_path,
            state_key=targets_key(settings),
        )

    def _inputs(self) -> tuple[ObserveView | None, ShadowStats | None]:
        if self._store is None:
            return None, None
        snap = self._store.get()
        return snap.observe, snap.shadow

    def _publish(self, state: AlertingState) -> None:
        if self._store is not None:
            self._store.update(lambda snap: replace(snap, alerts=state))

    def install(
        self, app: web.Application, store: Store[Snapshot], registry: CollectorRegistry
    ) -> None:
        """Register the alert collector, publish the empty state, run the loop with the app."""
        self._store = store
        registry.register(AlertsCollector(lambda: self.component.state))
        self._publish(self.component.state)
        app.cleanup_ctx.append(self._ctx)

    async def _ctx(self, app: web.Application) -> AsyncIterator[None]:
        async with self.component.running(app[SESSION_KEY], watch=app[LIVENESS_KEY].watch):
            yield


def shadow_components(
    settings: Settings,
    *,
    wall_clock: WallClock = SYSTEM_WALL,
    mono_clock: MonotonicClock = SYSTEM_MONOTONIC,
) -> list[ShadowPlug]:
    """``[ShadowPlug]`` when ``settings.shadow.enabled``, else ``[]`` (for ``build_app``)."""
    if not settings.shadow.enabled:
        return []
    return [ShadowPlug(settings, wall_clock=wall_clock, mono_clock=mono_clock)]


def alert_state_path(settings: Settings) -> Path | None:
    """Where alert state survives restarts: ``alerting.state_file``, or when that is unset
    ``<ledger.path>-alerts.json`` next to the ledger while shadow is on or ``ledger.path`` is
    set (with shadow off and the default ledger path there is no ledger, and nothing is
    written to the working directory: ``None``); ``None`` when it is ``""``."""
    state_file = settings.alerting.state_file
    if state_file is None:
        beside = settings.shadow.enabled or "path" in settings.ledger.model_fields_set
        return Path(settings.ledger.path + "-alerts.json") if beside else None
    return Path(state_file) if state_file else None


def targets_key(settings: Settings) -> str:
    """The key of the scrape targets alert state belongs to: 12 hex digits of the SHA-256 of
    the sorted ``name=url`` lines, so a run against other targets (or other URLs) restores
    nothing saved by this one."""
    lines = sorted(f"{t.name}={t.url}" for t in settings.targets)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:12]


def alerting_components(
    settings: Settings, *, wall_clock: WallClock = SYSTEM_WALL
) -> list[AlertingPlug]:
    """The components ``specwatch run`` adds for alerting (always one: the detectors and the
    ``specwatch_alert_firing`` gauges run even without Alertmanager URLs), saving alert state
    at :func:`alert_state_path`."""
    return [AlertingPlug(settings, wall_clock=wall_clock, state_path=alert_state_path(settings))]
