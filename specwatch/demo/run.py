"""``specwatch demo``: a standard and a FLy simulator, live traffic and the sidecar in one process.

Everything runs in one asyncio event loop (no child process), so stopping the loop stops
everything: :func:`run_demo` starts two in-process simulators
(:func:`specwatch.simulate.launcher.start_simulator`), a :class:`LoadGenerator` sending the
canary categories and chat prompts to both (same request, same seed: a paired comparison),
and the sidecar (:func:`specwatch.server.app.build_app`) scraping both every second. It prints
the sidecar's URL with the port it actually bound, then a live view
(:func:`specwatch.demo.view.build_view`; redrawn in place with :class:`rich.live.Live` on a
terminal, plain text blocks otherwise) until SIGINT, SIGTERM or the end of ``duration_s``; it
then stops the load, the sidecar and the simulators and returns 0.

The sidecar runs the whole product (:func:`specwatch.demo.config.demo_components`, the same
components as ``specwatch run``): shadow sampling and alerting, see
:class:`specwatch.demo.config.DemoConfig`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import shutil
import signal
import socket
import sys
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TextIO

from aiohttp import web
from rich.console import Console
from rich.live import Live

from specwatch.core.clock import SYSTEM_MONOTONIC, MonotonicClock
from specwatch.core.config import OVERALL, SINCE_START
from specwatch.core.shutdown import StopSignal
from specwatch.demo import config as demo_config
from specwatch.demo.config import (
    DemoConfig,
    DemoFiles,
    DemoTargets,
    demo_components,
    demo_settings,
    prepare_demo_files,
    remove_demo_files,
    simulator_configs,
)
from specwatch.demo.view import (
    ViewContext,
    alert_name,
    build_view,
    fault_command,
    load_summary,
    render_text,
)
from specwatch.export.json import shadow_verdict
from specwatch.export.snapshot import Snapshot
from specwatch.server.app import STORE_KEY, Component, build_app
from specwatch.server.wiring import ShadowPlug
from specwatch.shadow.live import OutcomeCounters
from specwatch.simulate.launcher import SimulatorHandle, start_simulator
from specwatch.simulate.loadgen import LoadConfig, LoadGenerator

# -- running it ---------------------------------------------------------------------------------


@dataclass
class _Latest:
    """A store listener keeping the last published snapshot for the view."""

    snap: Snapshot | None = None

    def __call__(self, snap: Snapshot) -> None:
        self.snap = snap


def bind_sidecar(host: str, port: int | None) -> socket.socket:
    """A listening socket for the sidecar, bound before anything starts (so a taken port fails
    first, with nothing to stop and nothing logged): ``port`` (0: a free one), or ``None``: the
    default port, or a free one when it is taken. Raises ``OSError``; no blocking wait."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    want = demo_config.DEFAULT_PORT if port is None else port
    for attempt in (want, 0):
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, attempt))
            sock.listen(128)
            sock.setblocking(False)
            return sock
        except OSError as exc:
            sock.close()
            if port is not None or exc.errno != errno.EADDRINUSE or attempt == 0:
                raise
    raise AssertionError("unreachable")  # the loop returns or raises


def _print(out: TextIO, text: str) -> None:
    out.write(text + "\n")
    out.flush()


async def run_demo(
    cfg: DemoConfig,
    *,
    out: TextIO,
    tty: bool = False,
    stop: asyncio.Event | None = None,
    mono_clock: MonotonicClock = SYSTEM_MONOTONIC,
    stopped_by: StopSignal | None = None,
) -> int:
    """Run the demo until SIGINT/SIGTERM (handlers installed here; ``stopped_by`` notes which
    came, for the caller to end as it asks), ``stop`` is set, or ``cfg.duration_s`` elapses;
    then stop everything and return 0.

    ``out``: where the URLs and the view go; ``tty``: redraw the view in place with ANSI
    escapes (else plain text blocks). Raises ``OSError`` when the sidecar's port cannot be
    bound or the demo's files cannot be written and :class:`specwatch.settings.ConfigError` on
    bad settings (nothing is left running, the temporary directory is removed).
    """
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = stopped_by or StopSignal()

    def on_signal(sig: signal.Signals) -> None:
        signals.note(sig)
        stop.set()

    installed: list[signal.Signals] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_signal, sig)
            installed.append(sig)
    std_cfg, fly_cfg = simulator_configs(cfg)
    sims: list[SimulatorHandle] = []
    runner: web.AppRunner | None = None
    tasks: list[asyncio.Task[Any]] = []
    gen: LoadGenerator | None = None
    files: DemoFiles | None = None
    shadow_pairs: Callable[[], int | None] = _no_pairs
    components: Sequence[Component] = ()
    sock: socket.socket | None = None
    try:
        sock = bind_sidecar(cfg.host, cfg.port)
        port = int(sock.getsockname()[1])
        if cfg.shadow:
            files = await asyncio.to_thread(prepare_demo_files, cfg)
        sims.append(await start_simulator(std_cfg, host=cfg.host, port=0))
        sims.append(await start_simulator(fly_cfg, host=cfg.host, port=0))
        if cfg.shadow:  # the noise arm's own server: standard and FLy get equal traffic
            sims.append(await start_simulator(std_cfg, host=cfg.host, port=0))
        targets = DemoTargets(
            standard_url=sims[0].url,
            fly_url=sims[1].url,
            noise_url=sims[2].url if len(sims) > 2 else None,
        )
        settings = demo_settings(cfg, targets, port=port, files=files)
        components = demo_components(settings, alerts=cfg.alerts)
        shadow_pairs = _pairs_counter(components)
        app = build_app(settings, components=components)
        latest = _Latest()
        app[STORE_KEY].subscribe(latest)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        await web.SockSite(runner, sock).start()
        base = f"http://{cfg.host}:{port}"
        notes: list[str] = []
        if files is not None:
            keep = "kept" if cfg.ledger_path else "removed at exit"
            notes.append(f"shadow ledger: {files.ledger} ({keep})")
        if cfg.alerts:
            sent = ", ".join(cfg.alertmanager_urls) or "none (--alertmanager-url URL)"
            notes.append(f"alerts to Alertmanager: {sent}")
        ctx = ViewContext(
            title="specwatch demo",
            base=base,
            standard_url=targets.standard_url,
            fly_url=targets.fly_url,
            notes=tuple(notes),
        )
        intro = intro_text(cfg, port, ctx, show_links=not (tty and cfg.ui))
        _print(out, intro)
        gen = LoadGenerator(
            [targets.standard_url, targets.fly_url],
            LoadConfig(
                concurrency=cfg.concurrency,
                rate=cfg.rate,
                duration_s=None,
                max_tokens=cfg.max_tokens,
                temperature=cfg.temperature,
                fanout=True,
                seed=cfg.seed,
                mirror_url=_mirror_url(components, cfg.host) if files is not None else None,
                mirror_fraction=cfg.mirror_fraction,
            ),
        )
        tasks.append(asyncio.create_task(gen.run(), name="demo-load"))
        boost = LoadBoost()
        tasks.append(
            asyncio.create_task(
                _boost_loop(cfg, sims[:2], gen, boost, out, tty and cfg.ui), name="demo-boost"
            )
        )
        load = _ShownLoad(
            gen,
            roles={targets.standard_url: "standard", targets.fly_url: "fly"},
            mirror=files is not None,
            boost=boost,
            started=mono_clock(),
        )
        if cfg.ui:
            tasks.append(
                asyncio.create_task(
                    _view_loop(cfg, out, tty, intro, ctx, latest, load, mono_clock),
                    name="demo-view",
                )
            )
        for t in tasks:  # a task that fails (the view's stdout closed: ``| head``) stops the demo
            t.add_done_callback(lambda done: _stop_on_failure(done, stop))
        timeout = cfg.duration_s
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout)
    finally:
        for t in tasks:
            if t.get_name() in ("demo-view", "demo-boost"):
                t.cancel()
        if gen is not None:
            gen.stop()
        for t in tasks:
            if t.get_name() == "demo-load":
                # requests in flight finish (each takes well under a second); then give up
                with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                    await asyncio.wait_for(asyncio.shield(t), 5.0)
            t.cancel()
        failed: Exception | None = None
        for t in tasks:
            try:
                await t
            except asyncio.CancelledError:
                pass
            except Exception as exc:  # raised once everything below is stopped
                failed = failed or exc
        if runner is not None:
            await runner.cleanup()
        if sock is not None:
            sock.close()
        for h in reversed(sims):
            await h.stop()
        if files is not None:
            await asyncio.to_thread(remove_demo_files, files)
        for sig in installed:
            loop.remove_signal_handler(sig)
        if failed is not None:
            raise failed
    if gen is not None:
        st = gen.stats
        pairs = shadow_pairs()
        verdict = final_verdict(components)
        if verdict is not None:
            line = f"verdict: {verdict}"
            if tty:  # on a terminal within its width (piped: one line, for grep)
                cols = shutil.get_terminal_size((100, 24)).columns
                line = "\n".join(textwrap.wrap(line, cols - 1, subsequent_indent="  "))
            _print(out, line)
        # "kept" only where the file is (a ledger that could not be written is not claimed)
        kept = files.ledger if files is not None and cfg.ledger_path else None
        if kept is not None and not await asyncio.to_thread(kept.is_file):
            kept = None
        _print(
            out,
            f"specwatch demo: stopped; {st.sent:,} requests sent, {st.ok:,} answered"
            + (f", {pairs:,} shadow pairs" if pairs is not None else "")
            + (f"; ledger kept at {kept}" if kept is not None else ""),
        )
    return 0


def _stop_on_failure(task: asyncio.Task[Any], stop: asyncio.Event) -> None:
    """Set ``stop`` when ``task`` ended with an exception (not when it was cancelled)."""
    if not task.cancelled() and task.exception() is not None:
        stop.set()


def final_verdict(components: Sequence[Component]) -> str | None:
    """The shadow component's last verdict sentence (its statistics at stop, every pair in the
    ledger counted: what ``specwatch report`` prints from that ledger); ``None`` without one."""
    for c in components:
        if isinstance(c, ShadowPlug):
            st = c.component.latest_stats()
            return shadow_verdict(st) if st is not None else None
    return None


def _no_pairs() -> int | None:
    return None


def paired_requests(counters: OutcomeCounters) -> int:
    """Paired requests counted so far: FLy's ``agree`` + ``disagree`` outcomes, as
    ``sum(specwatch_shadow_pairs_total{arm="fly",outcome=~"agree|disagree"})``."""
    return sum(
        n
        for (_cat, arm, outcome), n in counters.pairs.items()
        if arm == "fly" and outcome in ("agree", "disagree")
    )


def _pairs_counter(components: Sequence[Component]) -> Callable[[], int | None]:
    """Reads the shadow component's paired requests (:func:`_no_pairs` without one)."""
    for c in components:
        if isinstance(c, ShadowPlug):
            return functools.partial(paired_requests, c.component.statistics.counters)
    return _no_pairs


def intro_text(cfg: DemoConfig, port: int, ctx: ViewContext, *, show_links: bool) -> str:
    """What the demo prints once it listens: the sidecar's URL with the port it actually bound
    (saying so when the default was taken); with ``show_links`` (no live view redrawing them)
    the endpoints, the simulators, the fault command and ``ctx.notes`` too."""
    moved = (
        f" (port {demo_config.DEFAULT_PORT} was taken)"
        if cfg.port is None and port != demo_config.DEFAULT_PORT
        else ""
    )
    lines = [f"specwatch demo: sidecar on {ctx.base}{moved}"]
    if show_links:
        lines += [
            f"  metrics:  {ctx.base}/metrics",
            f"  snapshot: {ctx.base}/api/v1/snapshot",
            f"  standard simulator: {ctx.standard_url}  (vLLM API, /metrics, /admin)",
            f"  fly simulator:      {ctx.fly_url}",
            "  try a fault:",
            f"{fault_command(ctx.fly_url)}",
            *(f"  {n}" for n in ctx.notes),
        ]
    stop = "  stop: Ctrl-C" + (
        f" (or wait {cfg.duration_s:g} s)" if cfg.duration_s is not None else ""
    )
    return "\n".join([*lines, stop])


@dataclass
class _AlertClock:
    """When the view first saw each alert firing: name → "fired after N labelled pairs, T s"."""

    notes: dict[str, str] = field(default_factory=dict)

    def see(self, snap: Snapshot, elapsed: float) -> Mapping[str, str]:
        names = {alert_name(a) for a in snap.alerts.firing} if snap.alerts is not None else set()
        pairs = _labelled_pairs(snap)
        for name in names - self.notes.keys():
            after = f"{pairs:,} labelled pairs, " if pairs is not None else ""
            self.notes[name] = f"fired after {after}{elapsed:.0f} s"
        for gone in self.notes.keys() - names:
            del self.notes[gone]
        return dict(self.notes)


def _labelled_pairs(snap: Snapshot) -> int | None:
    """Labelled pairs of the since-start overall summary (``None`` before there is one)."""
    stats = snap.shadow
    if stats is None or SINCE_START not in stats.windows:
        return None
    cats = stats.windows[SINCE_START]
    return cats[OVERALL].n if OVERALL in cats else None


@dataclass(frozen=True, slots=True)
class _ShownLoad:
    """The demo's load as the view shows it: ``gen``'s counts by role (``roles``: base URL ->
    role name; ``mirror``: with the mirrored copies), ``boost``'s status and the time shown
    as elapsed since ``started`` (monotonic seconds, when the load began)."""

    gen: LoadGenerator
    roles: Mapping[str, str]
    mirror: bool
    boost: LoadBoost
    started: float


async def _view_loop(
    cfg: DemoConfig,
    out: TextIO,
    tty: bool,
    intro: str,
    ctx: ViewContext,
    latest: _Latest,
    load: _ShownLoad,
    mono_clock: MonotonicClock,
) -> None:
    """Draw the view every ``cfg.refresh_s``: in place with rich's :class:`Live` on a terminal,
    sized to the rows ``intro`` (printed above it) leaves, less one for the cursor, so nothing
    scrolls off (the view drops its least important parts to fit); else as plain text blocks
    as wide as ``COLUMNS`` (default 100), every part shown. On a terminal the frame is drawn
    once more when the loop is cancelled at stop (the load generator already stopped), so the
    view's last "sent" equals the exit line's."""
    window = cfg.windows[0] if cfg.windows else SINCE_START
    alert_clock = _AlertClock()
    total = f" / {cfg.duration_s:g} s" if cfg.duration_s is not None else ""

    def frame(width: int, height: int | None = None) -> Any:
        snap = latest.snap
        assert snap is not None
        elapsed = mono_clock() - load.started
        view_ctx = ViewContext(
            title=f"specwatch demo  {elapsed:.0f} s{total}  window {window}  Ctrl-C stops",
            base=ctx.base,
            standard_url=ctx.standard_url,
            fly_url=ctx.fly_url,
            notes=ctx.notes,
            alert_notes=alert_clock.see(snap, elapsed),
            status=load.boost.status,
        )
        counts = load_summary(load.gen.stats, load.roles, mirror=load.mirror)
        return build_view(snap, view_ctx, width=width, height=height, window=window, load=counts)

    if not tty:
        width = shutil.get_terminal_size((100, 24)).columns
        while True:
            await asyncio.sleep(cfg.refresh_s)
            if latest.snap is not None:
                _print(out, render_text(frame(width), width=width) + "\n")
    console = Console(file=out, force_terminal=True)
    with live_display(console, stderr_is_terminal=_stderr_is_terminal()) as live:
        try:
            while True:
                await asyncio.sleep(cfg.refresh_s)
                if latest.snap is not None:
                    live.update(frame(*view_size(console, intro)), refresh=True)
        except asyncio.CancelledError:
            # the last frame stays on screen: draw it with the load stopped, so its "sent"
            # is the count the exit line prints
            if latest.snap is not None:
                live.update(frame(*view_size(console, intro)), refresh=True)
            raise


@dataclass
class LoadBoost:
    """Whether the demo raised its load for a token-budget fault; ``status`` says so (empty
    while off)."""

    status: str = ""


def budget_fault_on(cfg: DemoConfig, sims: Sequence[SimulatorHandle]) -> bool:
    """A token-budget fault (``max_num_batched_tokens``) is set on one of ``sims``, or the
    demo runs with a budget below N × (1 + K) (``--max-num-batched-tokens``)."""
    bound = cfg.max_num_batched_tokens < cfg.max_num_seqs * (1 + cfg.num_speculative_tokens)
    return bound or any(h.server.faults.max_num_batched_tokens is not None for h in sims)


def boosted_load(cfg: DemoConfig) -> tuple[float | None, str]:
    """The load while a token-budget fault is on, and the line saying so: a closed loop at
    ``cfg.concurrency`` in flight per server (40 by default: more than 2 engines × 16
    max_num_seqs), so running reaches what the shrunken budget admits and requests wait."""
    return None, (
        f"token-budget fault on: load raised to {cfg.concurrency} in flight (closed loop) "
        "so requests queue"
    )


async def _boost_loop(
    cfg: DemoConfig,
    sims: Sequence[SimulatorHandle],
    gen: LoadGenerator,
    boost: LoadBoost,
    out: TextIO,
    live: bool,
) -> None:
    """Every ``cfg.refresh_s``: raise the load while a token-budget fault is on (the demo's
    default load leaves the budget unused, so the fault would show nothing), and put it back
    when the fault is cleared; without the live view a line says so each time."""
    normal = gen.config
    rate, text = boosted_load(cfg)
    while True:
        await asyncio.sleep(cfg.refresh_s)
        on = budget_fault_on(cfg, sims)
        if on == bool(boost.status):
            continue
        gen.config = replace(normal, rate=rate) if on else normal
        boost.status = text if on else ""
        if not live:
            back = f"load back to {cfg.rate:g} requests/s" if cfg.rate else "load back to normal"
            _print(out, f"specwatch demo: {text if on else back}")


def live_display(console: Console, *, stderr_is_terminal: bool = True) -> Live:
    """The in-place display the view is drawn with (redrawn on update only). Log lines go to
    stderr: when stderr is the terminal too they print above the view instead of tearing it;
    when it is redirected (``2> FILE``) they go there and the view never shows them."""
    return Live(
        console=console,
        auto_refresh=False,
        vertical_overflow="ellipsis",
        redirect_stdout=False,
        redirect_stderr=stderr_is_terminal,
    )


def _stderr_is_terminal() -> bool:
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty()) if isatty is not None else False


def view_size(console: Console, intro: str) -> tuple[int, int]:
    """The columns and rows the view may use on ``console``'s terminal below ``intro``: the
    rows ``intro`` takes and one for the cursor are left, so nothing scrolls off the top."""
    width, rows = console.size
    return width, max(1, rows - screen_rows(intro, width) - 1)


def screen_rows(text: str, width: int) -> int:
    """The terminal rows ``text`` takes at ``width`` columns (long lines wrap)."""
    return sum(max(1, -(-len(line) // max(width, 1))) for line in text.splitlines())


def _mirror_url(components: Sequence[Component], host: str) -> str | None:
    """The shadow component's mirror listener (its own port, bound when the app started)."""
    for c in components:
        if isinstance(c, ShadowPlug) and c.component.mirror_port is not None:
            return f"http://{host}:{c.component.mirror_port}"
    return None
