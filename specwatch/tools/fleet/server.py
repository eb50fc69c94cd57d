"""The fleet view's I/O: query Prometheus for the sidecars' pair counters and margin e-values,
build a :class:`~specwatch.tools.fleet.stats.FleetStats`, and (with ``--listen``) serve it.

:func:`query_fleet` does one round of queries; :func:`build_fleet_app` returns an aiohttp
application whose background task refreshes every ``interval`` seconds and whose ``/metrics``
exposes :class:`~specwatch.tools.fleet.stats.FleetCollector` (``/healthz`` answers while it runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field, replace

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler

from specwatch.core.clock import WallClock
from specwatch.core.config import DEFAULT_REPLICA_LABELS
from specwatch.core.logs import log_event, redact_url
from specwatch.core.store import Store
from specwatch.shadow.summary import Levels
from specwatch.tools.fleet.stats import (
    FleetCollector,
    FleetHealth,
    FleetStats,
    fleet_stats,
    margin_e_selector,
    net_loss_e_selector,
    pairs_selector,
)
from specwatch.tools.prom_api import PromApiError, instant_query

log = logging.getLogger("specwatch.fleet")


@dataclass(frozen=True, slots=True)
class FleetQuery:
    """What to ask and how to summarise: the Prometheus (or Thanos Querier) base URL, extra
    label ``matchers`` for every query (``job="specwatch"``; empty for none), the series label
    naming the model (empty: pool every series), the ``levels`` the tests are run at, the
    per-query ``timeout`` in seconds and the ``replica_labels`` that tell HA Prometheus
    replicas apart (series counted once across them)."""

    prometheus_url: str
    matchers: str = ""
    model_label: str = "model_name"
    levels: Levels = Levels()
    timeout: float = 10.0
    replica_labels: tuple[str, ...] = DEFAULT_REPLICA_LABELS


async def query_fleet(session: aiohttp.ClientSession, q: FleetQuery, *, now: float) -> FleetStats:
    """Run the three instant queries (pair counts, margin and no-net-loss e-values) and
    summarise them (see :func:`fleet_stats`). Raises
    :class:`~specwatch.tools.prom_api.PromApiError` when any query fails."""
    pairs, margins, net_loss = await asyncio.gather(
        instant_query(session, q.prometheus_url, pairs_selector(q.matchers), limit_s=q.timeout),
        instant_query(session, q.prometheus_url, margin_e_selector(q.matchers), limit_s=q.timeout),
        instant_query(
            session, q.prometheus_url, net_loss_e_selector(q.matchers), limit_s=q.timeout
        ),
    )
    return fleet_stats(
        pairs,
        margins,
        net_loss,
        now=now,
        model_label=q.model_label,
        levels=q.levels,
        replica_labels=q.replica_labels,
    )


@dataclass(frozen=True, slots=True)
class _State:
    stats: FleetStats | None = None
    health: FleetHealth = field(default_factory=FleetHealth)


def _count(errors: Mapping[str, int], reason: str) -> dict[str, int]:
    out = dict(errors)
    out[reason] = out.get(reason, 0) + 1
    return out


async def refresh_once(
    store: Store[_State], session: aiohttp.ClientSession, q: FleetQuery, *, now: float
) -> None:
    """One refresh: publish the new snapshot, or count and log the failed query and keep the
    previous snapshot (its ``specwatch_fleet_last_success_timestamp_seconds`` then ages)."""
    state = store.get()
    try:
        stats = await query_fleet(session, q, now=now)
    except PromApiError as exc:
        log_event(
            log,
            logging.WARNING,
            "fleet query failed",
            prometheus=redact_url(q.prometheus_url),
            reason=exc.reason,
            detail=exc.detail,
        )
        store.swap(
            replace(
                state,
                health=replace(
                    state.health, query_errors=_count(state.health.query_errors, exc.reason)
                ),
            )
        )
        return
    store.swap(
        _State(
            stats=stats,
            health=replace(state.health, bad_series=dict(stats.bad_series), last_success=now),
        )
    )


def build_fleet_app(q: FleetQuery, *, interval: float, wall_clock: WallClock) -> web.Application:
    """The ``fleet --listen`` application: ``/metrics`` (the fleet families), ``/healthz``, and a
    background task that refreshes every ``interval`` seconds using ``wall_clock()`` (unix seconds)
    for the snapshot time."""
    store: Store[_State] = Store(_State())
    reg = CollectorRegistry(auto_describe=True)

    def get() -> tuple[FleetStats | None, FleetHealth]:
        s = store.get()
        return s.stats, s.health

    reg.register(FleetCollector(get))
    app = web.Application()
    app.router.add_get("/metrics", make_aiohttp_handler(reg))

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    app.router.add_get("/healthz", healthz)

    async def refresher(_: web.Application) -> AsyncIterator[None]:
        async with aiohttp.ClientSession() as session:

            async def loop() -> None:
                while True:
                    await refresh_once(store, session, q, now=wall_clock())
                    await asyncio.sleep(interval)

            task = asyncio.create_task(loop())
            yield
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    app.cleanup_ctx.append(refresher)
    return app
