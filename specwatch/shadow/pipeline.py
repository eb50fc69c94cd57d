"""Wires shadow ingest -> sampler -> replay and hands every :class:`ReplayPair` to a
:class:`PairSink` (in the sidecar :class:`~specwatch.shadow.live.ShadowStatistics`).

Usage on the sidecar's aiohttp app::

    pipeline = ShadowPipeline.from_settings(
        settings.shadow, session=session, sink=statistics, load_state=loads
    )
    pipeline.mount(app)          # start/stop with the app's lifecycle

or without an app: ``await pipeline.start()`` ... ``await pipeline.stop()``.

``start`` launches ``max_in_flight`` replay workers, the mirror listener on its own port (if
``"mirror"`` in modes and ``serve_mirror``; :attr:`mirror_port` is the bound port), the proxy on
its own port (if ``"proxy"`` in modes) and the canary runner (if ``"canary"``). Each worker takes
one queued request, drops it as ``expired`` if it waited longer than ``max_queue_age_seconds``,
waits while the sampler reports a load pause (re-checked every :data:`PAUSE_POLL_SECONDS`), replays
it through all arms and awaits ``sink.take_pair(pair)``. Every pair is delivered unjudged: the
pipeline never classifies a pair (the sink compares it,
:func:`specwatch.shadow.compare.compare`, which gives it its one status); its own counters are
the I/O side's (sampler, ingest, arm failures, the replies' speculative-decoding counts).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import aiohttp
from aiohttp import web

from specwatch.core.canary_file import CanaryLoad
from specwatch.core.clock import SYSTEM_MONOTONIC, SYSTEM_WALL, MonotonicClock, WallClock
from specwatch.core.listen import ListenerStats, ListenLimits
from specwatch.core.logs import RateLimitedLog, log_event
from specwatch.shadow.classify import (
    COMPLETE_FINISH_REASONS,
    TRUNCATED_FINISH_REASONS,
    is_structured_output,
)
from specwatch.shadow.ingest.canary import CanaryRunner, load_canary
from specwatch.shadow.ingest.mirror import MirrorIngest, MirrorListener
from specwatch.shadow.ingest.offer import IngestCounters
from specwatch.shadow.ingest.proxy import ShadowProxy
from specwatch.shadow.published import ShadowIO
from specwatch.shadow.replay import ArmTarget, ReplayArms, Replayer
from specwatch.shadow.sample import (
    OTHER_CATEGORY,
    PAUSE_REASONS,
    CategoryBound,
    CategoryQuota,
    LoadPause,
    LoadState,
    Sampler,
    Takeover,
)
from specwatch.shadow.settings import ArmEndpoint, ShadowSettings
from specwatch.shadow.values import Arm, ReplayPair, ShadowRequest, Source

log = logging.getLogger("specwatch.shadow.pipeline")

CANARY_TASK = "shadow-canary"

#: The modes whose requests come from outside and are counted as received (by source).
RECEIVING_MODES: frozenset[str] = frozenset({Source.MIRROR.value, Source.PROXY.value})

#: Seconds between two checks of a load pause by a request waiting for it to end.
PAUSE_POLL_SECONDS = 0.5


class PairSink(Protocol):
    """Where the pipeline hands each replayed pair, unjudged: in the sidecar
    :meth:`ShadowStatistics.take_pair <specwatch.shadow.live.ShadowStatistics.take_pair>`
    (compare, ledger row, counters, e-processes)."""

    async def take_pair(self, pair: ReplayPair) -> None: ...


@dataclass(frozen=True, slots=True)
class Runtime:
    """How the shadow side meets the world: ``wall_clock`` (unix seconds: ``received_at``,
    ledger times, windows), ``mono_clock`` (the sampler's and the replays' clock), ``sleep``
    (the load-pause poll, the refresh loop), the listeners' ``listen`` limits and their
    ``shutdown_timeout_seconds`` exit deadline."""

    wall_clock: WallClock = SYSTEM_WALL
    mono_clock: MonotonicClock = SYSTEM_MONOTONIC
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    listen: ListenLimits = field(default_factory=ListenLimits)
    shutdown_timeout_seconds: float = 5.0


#: The system clocks, ``asyncio.sleep`` and the default listen limits.
DEFAULT_RUNTIME = Runtime()


def _target(arm: Arm, ep: ArmEndpoint, stream_arms: tuple[str, ...]) -> ArmTarget:
    return ArmTarget(
        arm=arm,
        base_url=ep.url,
        timeout_seconds=ep.timeout_seconds,
        token=ep.token,
        model=ep.model,
        stream=arm.value in stream_arms,
        keepalive_seconds=ep.keepalive_seconds,
    )


def category_bound_from_settings(s: ShadowSettings, *, mono_clock: MonotonicClock) -> CategoryBound:
    """The :class:`CategoryBound` of ``s``: ``max_categories`` slots kept by volume with the
    ``category_*`` takeover rule, timed by ``mono_clock``."""
    rule = Takeover(
        window_seconds=s.category_window_seconds,
        ratio=s.category_takeover_ratio,
        sustain_seconds=s.category_takeover_seconds,
        min_requests=s.category_takeover_min_requests,
    )
    return CategoryBound(s.max_categories, mono_clock=mono_clock, takeover=rule)


def sampler_from_settings(
    s: ShadowSettings,
    *,
    mono_clock: MonotonicClock,
    load_state: LoadState | None = None,
    categories: CategoryBound | None = None,
) -> Sampler:
    """The :class:`Sampler` of ``s``: sample probability and salt, queue, rate cap, category
    quotas and bound (``categories``, else :func:`category_bound_from_settings`) and the
    load-aware pause over ``load_state``; ``mono_clock``: monotonic seconds."""
    return Sampler(
        probability=s.sample_probability,
        mono_clock=mono_clock,
        queue_size=s.queue_size,
        max_rps=s.max_shadow_rps,
        salt=s.sample_salt,
        quota=CategoryQuota(
            s.category_quota_per_second,
            s.default_category_quota_per_second,
            s.category_quota_burst,
        ),
        pause=LoadPause(
            load_state,
            s.pause_on_waiting,
            s.pause_running_fraction,
            s.load_state_max_age_seconds,
            trickle_per_second=(
                min(s.canary_min_rate_per_second, s.canary_rate_per_second)
                if "canary" in s.modes
                else 0.0
            ),
        ),
        categories=(
            categories
            if categories is not None
            else category_bound_from_settings(s, mono_clock=mono_clock)
        ),
    )


def replayer_from_settings(
    s: ShadowSettings,
    session: aiohttp.ClientSession | Mapping[Arm, aiohttp.ClientSession],
    *,
    mono_clock: MonotonicClock,
) -> Replayer:
    """The :class:`Replayer` of ``s``: the standard and FLy arms (and the noise and baseline
    arms when set), streamed as ``s.stream_arms`` says. Raises ``ValueError`` without the
    standard or the FLy arm."""
    std_ep, fly_ep = s.standard, s.fly
    if std_ep is None or fly_ep is None:
        raise ValueError("shadow pipeline needs shadow.standard and shadow.fly")
    noise_ep = s.noise_endpoint()
    arms = ReplayArms(
        standard=_target(Arm.STANDARD, std_ep, s.stream_arms),
        fly=_target(Arm.FLY, fly_ep, s.stream_arms),
        noise=_target(Arm.NOISE, noise_ep, s.stream_arms) if noise_ep is not None else None,
        baseline=(
            _target(Arm.BASELINE, s.baseline, s.stream_arms) if s.baseline is not None else None
        ),
    )
    return Replayer(
        session,
        arms,
        max_tokens_cap=s.max_tokens_cap,
        marker_header=s.marker_header,
        mono_clock=mono_clock,
        extra_body=s.replay_extra_body,
    )


#: The ``finish_reason`` label τ coverage counts a structured-output reply under, whatever its
#: finish (vLLM does not speculate on those requests: counted apart, not as missing τ).
STRUCTURED_LABEL = "structured_output"


def finish_label(reason: str | None) -> str:
    """The ``finish_reason`` label of a reply: vLLM's known reasons as sent, ``none`` when it
    named none, ``other`` for anything else (the label stays bounded)."""
    if reason is None:
        return "none"
    known = (*COMPLETE_FINISH_REASONS, *TRUNCATED_FINISH_REASONS)
    return reason if reason in known else "other"


@dataclass(frozen=True, slots=True)
class Ingest:
    """The ways requests enter the pipeline, all offering to one sampler and counting into one
    :class:`IngestCounters`: the ``mirror`` handler (always built: a caller may serve it on its
    own listener), its ``mirror_listener`` (``None``: not served by the pipeline), the
    ``proxy`` (``None`` outside proxy mode) and the ``canary`` runner with the ``canary_load``
    it runs (``None`` outside canary mode)."""

    counters: IngestCounters
    mirror: MirrorIngest
    mirror_listener: MirrorListener | None = None
    proxy: ShadowProxy | None = None
    canary: CanaryRunner | None = None
    canary_load: CanaryLoad | None = None


def ingest_from_settings(
    s: ShadowSettings,
    sampler: Sampler,
    *,
    wall_clock: WallClock,
    sleep: Callable[[float], Awaitable[None]],
    listen: ListenLimits | None = None,
    listener: ListenerStats | None = None,
    shutdown_timeout_seconds: float = 5.0,
    serve_mirror: bool = True,
) -> Ingest:
    """The :class:`Ingest` of ``s`` over ``sampler``: the mirror handler, its listener when
    ``serve_mirror`` and ``"mirror"`` is a mode, the proxy in proxy mode (``listen``,
    ``listener``, ``shutdown_timeout_seconds`` are its listener's limits, counters and exit
    deadline) and the canary runner in canary mode (its items loaded now, offered with
    ``force``). ``wall_clock``: unix seconds (``received_at``). Raises
    :class:`~specwatch.core.canary_file.CanaryFileError` when canary mode has no usable item."""
    counters = IngestCounters()
    mirror = MirrorIngest(
        sampler.offer,
        counters=counters,
        wall_clock=wall_clock,
        salt=s.sample_salt,
        max_body_bytes=s.mirror_max_body_bytes,
        require_shadow_host=s.mirror_require_shadow_host,
        marker_header=s.marker_header,
    )
    mirror_listener: MirrorListener | None = None
    if serve_mirror and "mirror" in s.modes:
        mirror_listener = MirrorListener(mirror.routes(), max_body_bytes=s.mirror_max_body_bytes)
    proxy: ShadowProxy | None = None
    if "proxy" in s.modes and s.proxy_upstream is not None:
        proxy = ShadowProxy(
            s,
            sampler.offer,
            counters=counters,
            wall_clock=wall_clock,
            listen=listen,
            listener=listener,
            shutdown_timeout_seconds=shutdown_timeout_seconds,
        )
    canary: CanaryRunner | None = None
    canary_load: CanaryLoad | None = None
    if "canary" in s.modes:
        canary_load = load_canary(s.canary_file, builtin=s.canary_builtin, model=s.canary_model)
        canary = CanaryRunner(
            canary_load.items,
            lambda r: sampler.offer(r, force=True, trickle=True),
            rate_per_second=s.canary_rate_per_second,
            wall_clock=wall_clock,
            sleep=sleep,
            loop=s.canary_loop,
            salt=s.sample_salt,
        )
    return Ingest(counters, mirror, mirror_listener, proxy, canary, canary_load)


class ShadowPipeline:
    """The shadow I/O component (see module docstring).

    :meth:`from_settings` builds one from the ``shadow`` settings group; ``__init__`` takes the
    built parts: ``settings`` (the group; the pipeline reads its listen addresses, proxy mode,
    ``max_in_flight`` and ``max_queue_age_seconds``), the ``sampler``,
    the ``replayer``, the ``ingest`` parts offering to that sampler, the ``sink`` every pair is
    handed to; ``load_state``: ``() -> {arm: ArmLoad}`` (the running count stamped
    on each pair; ``None``: unknown); ``wall_clock``: unix seconds (a queued request's age);
    ``sleep``: async sleep (the load-pause poll).
    """

    def __init__(
        self,
        settings: ShadowSettings,
        *,
        sampler: Sampler,
        replayer: Replayer,
        ingest: Ingest,
        sink: PairSink,
        load_state: LoadState | None = None,
        wall_clock: WallClock = SYSTEM_WALL,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.settings = settings
        self._sink = sink
        self._wall_clock = wall_clock
        self._sleep = sleep
        self.sampler = sampler
        self.replayer = replayer
        self._load_state = load_state
        self.ingest_counters = ingest.counters
        self.mirror = ingest.mirror
        self.mirror_listener = ingest.mirror_listener
        self.proxy = ingest.proxy
        self.canary = ingest.canary
        self.canary_load = ingest.canary_load
        self.in_flight = 0
        self.arm_errors: Counter[tuple[str, str]] = Counter()
        self.spec_steps: Counter[tuple[str, str]] = Counter()
        # per-request τ coverage: successful replies and those with spec metrics, by finish
        self.finishes: Counter[tuple[str, str]] = Counter()
        self.finishes_with_spec: Counter[tuple[str, str]] = Counter()
        self.spec_drafted: Counter[tuple[str, str]] = Counter()
        self.spec_accepted: Counter[tuple[str, str]] = Counter()
        #: Replies whose speculative-decoding counts were refused, by (arm, reason).
        self.spec_refused: Counter[tuple[str, str]] = Counter()
        self._spec_log = RateLimitedLog(log)
        self.sink_errors = 0
        self._tasks: list[asyncio.Task[None]] = []
        #: Workers holding a request (taken from the queue, not yet handed to the sink).
        self._holding = 0
        self._abandoned = False  # the requests held counted as shutdown_in_flight already
        self._idle = asyncio.Event()
        self._idle.set()
        self._draining = False
        #: Pairs handed to the sink so far.
        self.delivered = 0
        #: the proxy listener is up (:meth:`start_proxy` ran and :meth:`stop` has not)
        self.proxy_started = False

    @classmethod
    def from_settings(
        cls,
        settings: ShadowSettings,
        *,
        session: aiohttp.ClientSession | Mapping[Arm, aiohttp.ClientSession],
        sink: PairSink,
        load_state: LoadState | None = None,
        runtime: Runtime = DEFAULT_RUNTIME,
        categories: CategoryBound | None = None,
        listener: ListenerStats | None = None,
        serve_mirror: bool = True,
    ) -> ShadowPipeline:
        """The pipeline of the ``shadow`` settings group.

        ``session``: an open ``aiohttp.ClientSession`` for replays, or one per arm (``{Arm:
        session}``, see :func:`~specwatch.shadow.replay.open_arm_session`), owned by the
        caller; ``load_state``: ``() -> {arm: ArmLoad}`` with keys ``standard``, ``fly`` (and
        ``noise`` when used), ``None`` to disable the load-aware pause; ``runtime``: clocks,
        sleep and the proxy listener's limits and exit deadline (:class:`Runtime`);
        ``categories``: the category bound (default :func:`category_bound_from_settings`);
        ``listener``: the proxy listener's counters; ``serve_mirror``: start the mirror listener
        (``False`` when the caller serves :attr:`mirror` itself). Raises ``ValueError`` if the
        settings lack the standard/FLy arms and
        :class:`~specwatch.core.canary_file.CanaryFileError` if canary mode has no usable item.
        """
        mono = runtime.mono_clock
        replayer = replayer_from_settings(settings, session, mono_clock=mono)
        sampler = sampler_from_settings(
            settings, mono_clock=mono, load_state=load_state, categories=categories
        )
        ingest = ingest_from_settings(
            settings,
            sampler,
            wall_clock=runtime.wall_clock,
            sleep=runtime.sleep,
            listen=runtime.listen,
            listener=listener,
            shutdown_timeout_seconds=runtime.shutdown_timeout_seconds,
            serve_mirror=serve_mirror,
        )
        return cls(
            settings,
            sampler=sampler,
            replayer=replayer,
            ingest=ingest,
            sink=sink,
            load_state=load_state,
            wall_clock=runtime.wall_clock,
            sleep=runtime.sleep,
        )

    # -- ingest entry -------------------------------------------------------------------------

    def offer(self, req: ShadowRequest) -> str:
        """Offer a live request to the sampler (synchronous, never waits)."""
        return self.sampler.offer(req)

    # -- lifecycle ----------------------------------------------------------------------------

    def mount(self, app: web.Application) -> None:
        """Tie :meth:`start`/:meth:`stop` to ``app`` (no route is added to ``app``)."""
        app.cleanup_ctx.append(self._ctx)

    @property
    def mirror_port(self) -> int | None:
        """The mirror listener's bound port (``None`` before :meth:`start` or without one)."""
        return None if self.mirror_listener is None else self.mirror_listener.port

    async def _ctx(self, app: web.Application) -> AsyncIterator[None]:
        await self.start()
        yield
        await self.stop()

    async def start_proxy(self) -> None:
        """Start the proxy listener alone (proxy mode; once): the live path needs nothing from
        the ledger or the statistics, so a caller starts it before rebuilding them and live
        traffic is never refused while they load. Copies it hands over before :meth:`start`
        wait in the sampler's queue (bounded, aged out as usual). Raises ``OSError`` when the
        port cannot be bound."""
        if self.proxy is None or self.proxy_started or self._draining:
            return
        port = await self.proxy.start(
            self.settings.proxy_listen_host, self.settings.proxy_listen_port
        )
        self.proxy_started = True
        log_event(log, logging.INFO, "shadow proxy listening", port=port)

    async def start(self) -> None:
        """Start replay workers, the proxy listener (unless :meth:`start_proxy` did) and the
        canary runner (as configured); nothing once :meth:`drain` began."""
        if self._draining:
            return
        if self.mirror_listener is not None:
            port = await self.mirror_listener.start(
                self.settings.mirror_listen_host, self.settings.mirror_listen_port
            )
            log_event(log, logging.INFO, "shadow mirror listening", port=port)
        for i in range(self.settings.max_in_flight):
            self._tasks.append(asyncio.create_task(self._worker(), name=f"shadow-replay-{i}"))
        await self.start_proxy()
        if self.canary is not None:
            self._tasks.append(asyncio.create_task(self.canary.run(), name=CANARY_TASK))

    async def drain(self, until: float, mono_clock: MonotonicClock = SYSTEM_MONOTONIC) -> None:
        """Shut down within a budget: admit nothing more (offers and the requests still queued
        are dropped as ``shutdown_queued``), stop the proxy listener accepting and let its open
        exchanges run, and let the replays in flight finish, all until ``until`` (monotonic
        seconds on ``mono_clock``); then cut the proxy's exchanges still open, and count each replay
        still in flight as ``shutdown_in_flight`` (its worker is cancelled). Logs one line with
        the counts (WARNING when a replay was abandoned)."""
        started = mono_clock()
        self.sampler.closed = True
        self._draining = True
        queued = self._drop_queued()
        for t in self._tasks:
            if t.get_name() == CANARY_TASK:  # the canary offers nothing more
                t.cancel()
        delivered = self.delivered
        logged = False

        def log_counts() -> None:
            # once, as soon as the replays' time is up: before the proxy's connections are
            # closed, and also when the drain itself is cut (a loaded machine)
            nonlocal logged
            if logged:
                return
            logged = True
            abandoned = self._abandon_workers()
            log_event(
                log,
                logging.WARNING if abandoned else logging.INFO,
                "shadow replays drained",
                completed=self.delivered - delivered,
                abandoned_in_flight=abandoned,
                abandoned_queued=queued,
                seconds=round(mono_clock() - started, 3),
            )

        async def replays() -> None:
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._idle.wait(), max(0.0, until - mono_clock()))
            finally:
                log_counts()

        parts = [replays()]
        if self.proxy is not None and self.proxy_started:
            parts.append(self.proxy.stop(max(0.0, until - mono_clock())))
        try:
            await asyncio.gather(*parts)
        finally:
            self.proxy_started = False
            log_counts()
        await self._reap_workers()

    def _drop_queued(self) -> int:
        """Drop every request still queued as ``shutdown_queued``; returns how many."""
        q, n = self.sampler.queue, 0
        while not q.empty():
            q.get_nowait()
            q.task_done()
            n += 1
        for _ in range(n):
            self.sampler.count_drop("shutdown_queued")
        return n

    async def _cancel_workers(self) -> int:
        """Cancel workers and canary; each request a worker still held is counted as
        ``shutdown_in_flight``. Returns that count."""
        held = self._abandon_workers()
        await self._reap_workers()
        return held

    def _abandon_workers(self) -> int:
        """Count each request a worker still holds as ``shutdown_in_flight`` (once) and cancel
        every worker and the canary, without waiting; returns that count."""
        held = 0 if self._abandoned else self._holding
        self._abandoned = True
        for _ in range(held):
            self.sampler.count_drop("shutdown_in_flight")
        for t in self._tasks:
            t.cancel()
        return held

    async def _reap_workers(self) -> None:
        """Wait for the cancelled workers to end."""
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    async def stop(self) -> None:
        """Cancel workers and canary (a request a worker still held is counted as
        ``shutdown_in_flight``), stop the proxy and the mirror listener. Queued requests are
        abandoned."""
        self.sampler.closed = True
        await self._cancel_workers()
        if self.proxy is not None:
            await self.proxy.stop()
            self.proxy_started = False
        if self.mirror_listener is not None:
            await self.mirror_listener.stop()

    # -- workers ------------------------------------------------------------------------------

    def _expired(self, req: ShadowRequest) -> bool:
        return self._wall_clock() - req.received_at > self.settings.max_queue_age_seconds

    async def _worker(self) -> None:
        q = self.sampler.queue
        while True:
            req = await q.get()
            self._holding += 1
            self._idle.clear()
            try:
                await self._process(req)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # one replay's bug must not end the worker: count, log
                self.sampler.count_drop("replay_error")
                self._spec_log.log(
                    logging.ERROR,
                    "shadow replay failed",
                    reason="replay_error",
                    error=type(exc).__name__,
                    exc_info=True,
                    request_hash=req.request_hash,
                )
            finally:
                self._holding -= 1
                if self._holding == 0:
                    self._idle.set()
                q.task_done()

    async def _process(self, req: ShadowRequest) -> None:
        through = self.sampler.passes_pause(req)  # a canary trickled through a chosen pause
        while True:
            if self._expired(req):
                self.sampler.count_drop("expired")
                return
            if self.sampler.held():  # queued before the ledger failed: not replayed
                self.sampler.count_drop("ledger_unusable")
                return
            if self._draining:  # waited out a load pause into the shutdown: never replayed
                self.sampler.count_drop("shutdown_queued")
                return
            if through or not self.sampler.current_pause():
                break
            await self._sleep(PAUSE_POLL_SECONDS)
        self.in_flight += 1
        try:
            pair = await self.replayer.replay(req, running=self._running())
        finally:
            self.in_flight -= 1
        for a in (pair.standard, pair.fly, pair.noise, pair.baseline):
            if a is None:
                continue
            if not a.ok:
                self.arm_errors[(a.arm.value, a.error or "unknown")] += 1
                log_event(
                    log,
                    logging.INFO,
                    "shadow arm failed",
                    arm=a.arm.value,
                    reason=a.error or "unknown",
                    status=a.status,
                    request_hash=req.request_hash,
                )
            if a.spec_refused is not None:
                self.spec_refused[(a.arm.value, a.spec_refused)] += 1
                self._spec_log.log(
                    logging.WARNING,
                    "shadow reply speculative counts refused",
                    arm=a.arm.value,
                    reason=a.spec_refused,
                    request_hash=req.request_hash,
                )
            sd = a.spec_decode
            if a.ok:
                label = finish_label(a.finish_reason)
                if is_structured_output(req.body, req.path):
                    label = STRUCTURED_LABEL
                finish = (a.arm.value, label)
                self.finishes[finish] += 1
                self.finishes_with_spec[finish] += sd is not None
            if a.ok and sd is not None and sd.num_spec_steps > 0:
                key = (a.arm.value, req.category)
                self.spec_steps[key] += sd.num_spec_steps
                self.spec_drafted[key] += sd.num_draft_tokens
                self.spec_accepted[key] += sd.num_accepted_draft_tokens
        try:
            await self._sink.take_pair(pair)
            self.delivered += 1
        except asyncio.CancelledError:
            raise
        except Exception:  # the sink is injected code: count, log, keep the workers alive
            self.sink_errors += 1
            log_event(
                log,
                logging.ERROR,
                "shadow pair sink failed",
                exc_info=True,
                request_hash=req.request_hash,
            )

    def _running(self) -> float | None:
        """Running requests on the busiest arm's server now (``None`` when no load is known)."""
        if self._load_state is None:
            return None
        known = [a.running for a in self._load_state().values() if a.running is not None]
        return max(known) if known else None

    # -- metrics ------------------------------------------------------------------------------

    def metrics(self) -> ShadowIO:
        """The I/O counters now (a copy; no I/O). The per-category reply counters of a
        category whose slot changed hands are counted as ``other`` from then on."""
        sm = self.sampler
        for counts in (self.spec_steps, self.spec_drafted, self.spec_accepted):
            for key in [k for k in counts if sm.categories.map(k[1]) != k[1]]:
                counts[(key[0], OTHER_CATEGORY)] += counts.pop(key)
        ic = self.ingest_counters
        return ShadowIO(
            queue_depth=sm.queue.qsize(),
            in_flight=self.in_flight,
            offered=sm.offered,
            not_sampled=sm.not_sampled,
            admitted=sm.admitted,
            dropped=dict(sm.dropped),
            paused={r: int(r in sm.paused) for r in PAUSE_REASONS},
            pause_text=sm.pause_text,
            trickled=sm.trickled,
            pauses_total=dict(sm.pauses),
            # a source's series from 0 at start: increase() misses what a counter held when it
            # first appeared (the copies before the first scrape); only the modes that take
            # requests in (canary items are generated here: canary_offered counts them)
            received={
                **dict.fromkeys((m for m in self.settings.modes if m in RECEIVING_MODES), 0),
                **ic.received,
            },
            ingest_errors=dict(ic.errors),
            arm_errors=dict(self.arm_errors),
            sink_errors=self.sink_errors,
            proxy_requests=ic.proxy_requests,
            proxy_client_disconnects=ic.proxy_client_disconnects,
            proxy_upstream_errors=dict(ic.proxy_upstream_errors),
            canary_offered=sum(self.canary.offered.values()) if self.canary else 0,
            canary_bad_lines=dict(self.canary_load.bad_lines) if self.canary_load else {},
            replay_retries=dict(self.replayer.retries),
            token_count_failures=dict(self.replayer.token_count_failures),
            reply_spec_steps=dict(self.spec_steps),
            reply_spec_refused=dict(self.spec_refused),
            reply_draft_tokens=dict(self.spec_drafted),
            reply_accepted_tokens=dict(self.spec_accepted),
            reply_finishes=dict(self.finishes),
            reply_finishes_with_spec=dict(self.finishes_with_spec),
        )
