"""``specwatch demo``: a standard and a FLy simulator, live traffic and the sidecar in one process.

Everything runs in one asyncio event loop (no child process), so stopping the loop stops
everything: :func:`run_demo` starts two in-process simulators
(:func:`specwatch.simulate.launcher.start_simulator`), a :class:`LoadGenerator` sending the
canary categories and chat prompts to both (same request, same seed: a paired comparison),
and the sidecar (:func:`specwatch.app.build_app`) scraping both every second. It prints the URLs,
then a live view rendered from the published snapshot (:func:`render_view`), until SIGINT,
SIGTERM or the end of ``duration_s``; it then stops the load, the sidecar and the simulators
and returns 0.

Components that other chains add (shadow sampling, alerting) are built in one place,
:func:`demo_components`; the view shows their sections as soon as they publish under
``Snapshot.extras["shadow"]`` / ``["alerts"]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from aiohttp import web

from specwatch.app import STORE_KEY, Component, build_app
from specwatch.export import snapshot_json
from specwatch.model import Snapshot
from specwatch.settings import Settings, load_settings
from specwatch.simulate.config import Role as SimRole
from specwatch.simulate.config import SimConfig
from specwatch.simulate.launcher import SimulatorHandle, start_simulator
from specwatch.simulate.loadgen import LoadConfig, LoadGenerator, LoadStats

#: The port the demo's sidecar tries first (falls back to a free port when it is taken).
DEFAULT_PORT = 9400


@dataclass(frozen=True, slots=True)
class DemoConfig:
    """What the demo runs; every field has a demo-friendly default.

    ``duration_s``: stop after this many seconds (``None``: until SIGINT/SIGTERM).
    ``port``: the sidecar's port (``None``: 9400, or a free port when 9400 is taken; 0: free).
    Simulator shape: ``data_parallel_size`` engines each with ``max_num_seqs`` N,
    ``max_num_batched_tokens`` B, ``num_speculative_tokens`` K of ``method``; FLy's threshold
    ``fly_entropy_threshold`` (nats). Load: ``concurrency`` requests in flight, each sent to
    both servers, at most ``rate`` requests/s (``None``: closed loop), ``max_tokens`` each.
    ``time_scale`` multiplies the simulated step times (a slower "GPU": requests stay longer,
    so running approaches max_num_seqs at a load the CPU sustains). ``scrape_interval_s``,
    ``windows``: the sidecar's settings. ``refresh_s``: view period.
    """

    duration_s: float | None = None
    host: str = "127.0.0.1"
    port: int | None = None
    data_parallel_size: int = 2
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512
    num_speculative_tokens: int = 4
    method: str = "eagle3"
    vllm_version: str = "0.33.0"
    fly_entropy_threshold: float = 0.3
    time_scale: float = 8.0
    concurrency: int = 40
    rate: float | None = 60.0
    max_tokens: int = 64
    temperature: float = 0.0
    seed: int = 0
    scrape_interval_s: float = 1.0
    windows: tuple[str, ...] = ("1m", "5m")
    refresh_s: float = 2.0
    ui: bool = True


@dataclass(frozen=True, slots=True)
class DemoTargets:
    """Where the demo's simulators listen (base URLs, no trailing slash)."""

    standard_url: str
    fly_url: str


def simulator_configs(cfg: DemoConfig) -> tuple[SimConfig, SimConfig]:
    """The standard and FLy :class:`SimConfig` (same model tables and seed, so the two servers
    differ only where FLy waives a rejection)."""
    common: dict[str, Any] = {
        "served_model_name": "demo-model",
        "method": cfg.method,
        "num_speculative_tokens": cfg.num_speculative_tokens,
        "max_num_seqs": cfg.max_num_seqs,
        "max_num_batched_tokens": cfg.max_num_batched_tokens,
        "data_parallel_size": cfg.data_parallel_size,
        "vllm_version": cfg.vllm_version,
        "seed": cfg.seed,
        "time_scale": cfg.time_scale,
        "fly_entropy_threshold": cfg.fly_entropy_threshold,
    }
    std = SimConfig(role=SimRole.STANDARD, **common)
    fly = SimConfig(role=SimRole.FLY, **common)
    std.validate()
    fly.validate()
    return std, fly


def demo_settings(cfg: DemoConfig, targets: DemoTargets, port: int) -> Settings:
    """The sidecar's :class:`Settings`: both simulators with their limits (so the capacity and
    budget gauges are populated), scrape every ``scrape_interval_s``, the demo's windows.

    Environment variables ``SPECWATCH_*`` still apply below these values.
    Raises :class:`specwatch.settings.ConfigError`.
    """
    limits = {
        "max_num_seqs": cfg.max_num_seqs,
        "max_num_batched_tokens": cfg.max_num_batched_tokens,
        "num_speculative_tokens": cfg.num_speculative_tokens,
        "method": cfg.method,
        "vllm_version": cfg.vllm_version,
    }
    return load_settings(
        overrides={
            "targets": [
                {"name": "standard", "url": targets.standard_url, **limits},
                {"name": "fly", "url": targets.fly_url, **limits},
            ],
            "windows": list(cfg.windows),
            "scrape": {
                "interval_seconds": cfg.scrape_interval_s,
                "timeout_seconds": max(0.5, cfg.scrape_interval_s * 0.9),
            },
            "server": {"host": cfg.host, "port": port},
        }
    )


def demo_components(settings: Settings, targets: DemoTargets) -> list[Component]:
    """The components plugged into the demo's sidecar (``build_app(components=...)``).

    This is the single place where the demo adds other chains: shadow sampling (issue 4:
    mirror the demo traffic through ``targets.standard_url`` / ``targets.fly_url`` and publish
    ``extras["shadow"]``) and alerting (issue 5: detectors over the snapshot, publishing
    ``extras["alerts"]``). The live view renders both sections as soon as they appear.
    """
    components: list[Component] = []
    return components


# -- the live view ------------------------------------------------------------------------------

_BOLD, _DIM, _RED, _GREEN, _RESET = "\x1b[1m", "\x1b[2m", "\x1b[31m", "\x1b[32m", "\x1b[0m"
_CLEAR = "\x1b[H\x1b[2J"


def _num(v: Any, fmt: str = ".3f") -> str:
    if isinstance(v, bool) or v is None:
        return "-" if v is None else ("yes" if v else "no")
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return format(v, fmt)
    return str(v)


def _int(v: Any) -> str:
    return "-" if not isinstance(v, int | float) else str(round(v))


def _pick_window(windows: Mapping[str, Any], wanted: str) -> str | None:
    if wanted in windows:
        return wanted
    return next(iter(windows), None)


def _target_rows(doc: Mapping[str, Any], window: str) -> list[list[str]]:
    rows = [["target", "role", "up", "α", "τ", "tok/s", "running/max", "waiting", "per engine α"]]
    for name, t in (doc.get("targets") or {}).items():
        w = _pick_window(t.get("windows") or {}, window)
        win = (t.get("windows") or {}).get(w) or {} if w else {}
        server = win.get("server") or {}
        engines = win.get("engines") or {}
        cap = t.get("capacity") or {}
        lim = t.get("limits") or {}
        running = cap.get("num_requests_running")
        if running is None:
            running = server.get("num_requests_running")
        max_seqs = lim.get("max_num_seqs")
        per_engine = " ".join(
            f"e{e}={_num(h.get('acceptance_rate'))}" for e, h in sorted(engines.items())
        )
        rows.append(
            [
                name,
                str(t.get("role", "-")),
                "up" if t.get("up") else ("stale" if t.get("stale") else "down"),
                _num(server.get("acceptance_rate")),
                _num(server.get("mean_acceptance_length"), ".2f"),
                _num(server.get("generation_tokens_per_second"), ".0f"),
                f"{_int(running)}/{_int(max_seqs)}",
                _int(server.get("num_requests_waiting")),
                per_engine or "-",
            ]
        )
    return rows


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in rows]


def _shadow_lines(shadow: Mapping[str, Any], window: str) -> list[str]:
    """Paired quality: the overall summary of ``window`` (else ``since_start``) when the shadow
    document has the ``windows → category → summary`` shape, else its scalar fields."""
    windows = shadow.get("windows")
    if isinstance(windows, Mapping) and windows:
        w = window if window in windows else ("since_start" if "since_start" in windows else None)
        w = w or next(iter(windows))
        cats = windows[w] or {}
        cat = "_all" if "_all" in cats else next(iter(cats), None)
        s = cats.get(cat) if cat is not None else None
        if isinstance(s, Mapping):
            return [
                f"shadow ({w}): pairs {_int(s.get('n'))}  lost {_int(s.get('lost'))}  "
                f"gained {_int(s.get('gained'))}  net loss {_num(s.get('net_loss_ratio'))} "
                f"[{_num(s.get('ci_lower'))}, {_num(s.get('ci_upper'))}]  "
                f"McNemar p(loss) {_num(s.get('p_loss'))}  e-value {_num(s.get('e_value'), '.3g')}",
                f"        flip ratio fly {_num(s.get('fly_flip_ratio'))}  "
                f"noise {_num(s.get('noise_flip_ratio'))}  "
                f"non-inferior {_num(s.get('non_inferiority_pass'))}",
            ]
    flat = [
        f"{k} {_num(v)}"
        for k, v in shadow.items()
        if isinstance(v, int | float | str | bool) and k != "generated_at"
    ]
    return ["shadow: " + ("  ".join(flat[:8]) if flat else "(waiting for pairs)")]


def _alert_lines(alerts: Sequence[Any], ansi: bool) -> list[str]:
    if not alerts:
        return ["alerts: none firing"]
    out = [f"alerts: {len(alerts)} firing"]
    for a in alerts:
        labels = a.get("labels", a) if isinstance(a, Mapping) else {}
        name = labels.get("alertname", "?") if isinstance(labels, Mapping) else str(a)
        sev = labels.get("severity", "") if isinstance(labels, Mapping) else ""
        rest = (
            " ".join(
                f"{k}={v}" for k, v in sorted(labels.items()) if k not in ("alertname", "severity")
            )
            if isinstance(labels, Mapping)
            else ""
        )
        line = f"  {name} [{sev}] {rest}".rstrip()
        out.append(f"{_RED}{line}{_RESET}" if ansi else line)
    return out


def render_view(
    doc: Mapping[str, Any],
    *,
    window: str = "1m",
    load: Mapping[str, Any] | None = None,
    header: str = "",
    ansi: bool = False,
) -> str:
    """The live view as text, from a ``/api/v1/snapshot`` document (``snapshot_json``).

    Lines: ``header`` (its first line bold with ``ansi``); one row per target (α, τ, generation
    tokens/s of ``window`` — the first window the target has when ``window`` is missing —
    most-loaded engine's running / max_num_seqs, waiting, α per engine); the pair view (α gain,
    τ ratio); ``load`` (``sent``, ``ok``,
    ``errors``, canary ``correct``/``graded`` per role) when given; a shadow section when
    ``doc["shadow"]`` is not empty; the alerts (``doc["alerts"]``, a list) when the document has
    that key. ``ansi`` adds bold/colour escapes (no cursor movement).
    """
    lines: list[str] = []
    if header:
        first, *rest = header.split("\n")
        lines.append(f"{_BOLD}{first}{_RESET}" if ansi else first)
        lines.extend(rest)
    rows = _table(_target_rows(doc, window))
    lines.append(f"{_DIM}{rows[0]}{_RESET}" if ansi else rows[0])
    lines.extend(rows[1:])
    pair = doc.get("pair") or {}
    pw = _pick_window(pair, window)
    if pw is not None:
        p = pair[pw] or {}
        gain = p.get("acceptance_gain_ratio")
        lines.append(
            f"pair ({pw}): α fly − standard "
            f"{'-' if gain is None else format(gain, '+.3f')}  "
            f"τ fly / standard {_num(p.get('mean_acceptance_length_ratio'))}  "
            f"throughput fly / standard {_num(p.get('throughput_ratio'))}"
        )
    if load is not None:
        errors = load.get("errors") or {}
        err = sum(errors.values()) if isinstance(errors, Mapping) else 0
        acc = "  ".join(
            f"{role} {c}/{g}" for role, (c, g) in sorted((load.get("canary") or {}).items())
        )
        lines.append(
            f"load: sent {load.get('sent', 0)}  ok {load.get('ok', 0)}  errors {err}"
            + (f"  canary correct: {acc}" if acc else "")
        )
    shadow = doc.get("shadow")
    if isinstance(shadow, Mapping) and shadow:
        lines.extend(_shadow_lines(shadow, window))
    if "alerts" in doc:
        alerts = doc.get("alerts")
        lines.extend(_alert_lines(alerts if isinstance(alerts, list) else [], ansi))
    return "\n".join(lines)


def view_document(snap: Snapshot) -> dict[str, Any]:
    """``snapshot_json(snap)`` without the ``shadow``/``alerts`` placeholders that no component
    has published yet (so the view shows those sections only once a component provides them)."""
    doc = snapshot_json(snap)
    for key in ("shadow", "alerts"):
        if key not in snap.extras:
            doc.pop(key, None)
    return doc


def load_summary(stats: LoadStats, roles: Mapping[str, str]) -> dict[str, Any]:
    """The ``load`` mapping :func:`render_view` shows; ``roles`` maps base URL → role name."""
    return {
        "sent": stats.sent,
        "ok": stats.ok,
        "errors": dict(stats.errors),
        "canary": {
            role: (stats.correct.get(url, 0), stats.graded.get(url, 0))
            for url, role in roles.items()
        },
    }


# -- running it ---------------------------------------------------------------------------------


@dataclass
class _Latest:
    """A store listener keeping the last published snapshot for the view."""

    snap: Snapshot | None = None

    def __call__(self, snap: Snapshot) -> None:
        self.snap = snap


async def _start_site(runner: web.AppRunner, host: str, port: int | None) -> int:
    """Bind the sidecar; ``None``: the default port, or a free one when it is taken."""
    try:
        site = web.TCPSite(runner, host, DEFAULT_PORT if port is None else port)
        await site.start()
    except OSError as exc:
        if port is not None or exc.errno != errno.EADDRINUSE:
            raise
        site = web.TCPSite(runner, host, 0)
        await site.start()
    for addr in runner.addresses:
        if isinstance(addr, tuple) and len(addr) >= 2:
            return int(addr[1])
    raise RuntimeError("sidecar bound no TCP address")


def _print(out: TextIO, text: str) -> None:
    out.write(text + "\n")
    out.flush()


async def run_demo(
    cfg: DemoConfig,
    *,
    out: TextIO,
    tty: bool = False,
    stop: asyncio.Event | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Run the demo until SIGINT/SIGTERM (handlers installed here), ``stop`` is set, or
    ``cfg.duration_s`` elapses; then stop everything and return 0.

    ``out``: where the URLs and the view go; ``tty``: redraw the view in place with ANSI
    escapes (else plain text blocks). Raises ``OSError`` when the sidecar's port cannot be
    bound and :class:`specwatch.settings.ConfigError` on bad settings (nothing is left running).
    """
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
    std_cfg, fly_cfg = simulator_configs(cfg)
    sims: list[SimulatorHandle] = []
    runner: web.AppRunner | None = None
    tasks: list[asyncio.Task[Any]] = []
    gen: LoadGenerator | None = None
    try:
        sims.append(await start_simulator(std_cfg, host=cfg.host, port=0))
        sims.append(await start_simulator(fly_cfg, host=cfg.host, port=0))
        targets = DemoTargets(standard_url=sims[0].url, fly_url=sims[1].url)
        settings = demo_settings(cfg, targets, port=cfg.port or 0)
        app = build_app(settings, components=demo_components(settings, targets))
        latest = _Latest()
        app[STORE_KEY].add_listener(latest)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        port = await _start_site(runner, cfg.host, cfg.port)
        base = f"http://{cfg.host}:{port}"
        intro = [
            f"specwatch demo: sidecar on {base}",
            f"  metrics:  {base}/metrics",
            f"  snapshot: {base}/api/v1/snapshot",
            f"  standard simulator: {targets.standard_url}  (vLLM API, /metrics, /admin)",
            f"  fly simulator:      {targets.fly_url}",
            f"  try a fault: curl -X POST {targets.fly_url}/admin/faults -d "
            + "'"
            + json.dumps({"fly_entropy_threshold": 0.05})
            + "'",
        ]
        _print(
            out,
            "\n".join(intro)
            + "\n  stop: Ctrl-C"
            + (f" (or wait {cfg.duration_s:g} s)" if cfg.duration_s is not None else ""),
        )
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
            ),
        )
        tasks.append(asyncio.create_task(gen.run(), name="demo-load"))
        roles = {targets.standard_url: "standard", targets.fly_url: "fly"}
        started = clock()
        if cfg.ui:
            tasks.append(
                asyncio.create_task(
                    _view_loop(cfg, out, tty, intro, latest, gen, roles, started, clock),
                    name="demo-view",
                )
            )
        timeout = cfg.duration_s
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout)
    finally:
        for t in tasks:
            if t.get_name() == "demo-view":
                t.cancel()
        if gen is not None:
            gen.stop()
        for t in tasks:
            if t.get_name() == "demo-load":
                # requests in flight finish (each takes well under a second); then give up
                with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                    await asyncio.wait_for(asyncio.shield(t), 5.0)
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        if runner is not None:
            await runner.cleanup()
        for h in reversed(sims):
            await h.stop()
        for sig in installed:
            loop.remove_signal_handler(sig)
    if gen is not None:
        st = gen.stats
        _print(out, f"specwatch demo: stopped; {st.sent} requests sent, {st.ok} answered")
    return 0


async def _view_loop(
    cfg: DemoConfig,
    out: TextIO,
    tty: bool,
    intro: Sequence[str],
    latest: _Latest,
    gen: LoadGenerator,
    roles: Mapping[str, str],
    started: float,
    clock: Callable[[], float],
) -> None:
    window = cfg.windows[0] if cfg.windows else "since_start"
    while True:
        await asyncio.sleep(cfg.refresh_s)
        if latest.snap is None:
            continue
        elapsed = clock() - started
        total = f" / {cfg.duration_s:g}s" if cfg.duration_s is not None else ""
        header = f"specwatch demo  {elapsed:.0f}s{total}  window {window}  (Ctrl-C to stop)"
        if tty:  # the redraw clears the screen: keep the URLs on it
            header += "\n" + "\n".join(line.strip() for line in intro[1:]) + "\n"
        text = render_view(
            view_document(latest.snap),
            window=window,
            load=load_summary(gen.stats, roles),
            header=header,
            ansi=tty,
        )
        if tty:
            out.write(_CLEAR + text + "\n")
            out.flush()
        else:
            _print(out, text + "\n")
