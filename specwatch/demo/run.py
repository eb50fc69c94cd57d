"""``specwatch demo``: a standard and a FLy simulator, live traffic and the sidecar in one process.

Everything runs in one asyncio event loop (no child process), so stopping the loop stops
everything: :func:`run_demo` starts two in-process simulators
(:func:`specwatch.simulate.launcher.start_simulator`), a :class:`LoadGenerator` sending the
canary categories and chat prompts to both (same request, same seed: a paired comparison),
and the sidecar (:func:`specwatch.server.app.build_app`) scraping both every second. It prints
the URLs, then a live view rendered from the published snapshot (:func:`render_view`), until SIGINT,
SIGTERM or the end of ``duration_s``; it then stops the load, the sidecar and the simulators
and returns 0.

The sidecar runs the whole product (:func:`demo_components`, the same components as
``specwatch run``): shadow sampling (the load generator mirrors its requests to the sidecar as
Envoy would, and the simulator's 240 canary questions with gold answers are replayed at
temperature 1; each sampled request goes to the standard arm, the FLy arm and a noise arm,
and the pairs land in an SQLite ledger in a temporary directory, removed at exit unless
``ledger_path`` is given) and alerting (the detectors over each snapshot and the shadow
statistics, with ``for`` durations shortened to demo scale; sent to Alertmanager only when
``alertmanager_urls`` are given). The view shows their sections from
``Snapshot.shadow`` / ``Snapshot.alerts``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import json
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from aiohttp import web

from specwatch.core.config import OVERALL, SINCE_START
from specwatch.export.json import snapshot_json
from specwatch.export.snapshot import Snapshot
from specwatch.server.app import STORE_KEY, Component, build_app
from specwatch.server.wiring import ShadowPlug, alerting_components, shadow_components
from specwatch.settings import Settings, load_settings
from specwatch.shadow.summary import OutcomeCounters
from specwatch.simulate.config import Role as SimRole
from specwatch.simulate.config import SimConfig
from specwatch.simulate.launcher import SimulatorHandle, start_simulator
from specwatch.simulate.loadgen import LoadConfig, LoadGenerator, LoadStats
from specwatch.simulate.quiz import write_canary_jsonl

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

    Shadow (``shadow``): the load generator mirrors ``mirror_fraction`` of its requests to the
    sidecar, which samples ``shadow_sample`` of them (hash of the request); the canary set
    (the simulator's 240 items × ``canary_variants``, at ``canary_temperature``) is replayed
    at ``canary_rate`` items/s; replays are capped at ``shadow_rps``/s and ``shadow_in_flight``
    in flight and pause while an arm's busiest engine runs ≥ ``shadow_pause_running_fraction``
    × max_num_seqs, or (``shadow_pause_on_waiting``) while an arm has a request waiting.
    ``ledger_path``: keep the ledger there (``None``: a temporary directory removed at exit).
    Alerting (``alerts``): ``alertmanager_urls`` to send to (none: detectors and gauges
    only), detectors evaluated every
    ``alert_interval_s`` with every ``for`` duration set to ``alert_for_s``.
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
    time_scale: float = 4.0
    concurrency: int = 40
    rate: float | None = 60.0
    max_tokens: int = 64
    temperature: float = 0.0
    seed: int = 0
    scrape_interval_s: float = 1.0
    windows: tuple[str, ...] = ("1m", "5m")
    refresh_s: float = 2.0
    ui: bool = True
    shadow: bool = True
    mirror_fraction: float = 1.0
    shadow_sample: float = 0.1
    canary_rate: float = 6.0
    canary_variants: int = 40
    canary_temperature: float = 1.0
    shadow_rps: float = 15.0
    shadow_in_flight: int = 8
    shadow_pause_running_fraction: float = 0.9
    shadow_pause_on_waiting: bool = True
    ledger_path: str | None = None
    alerts: bool = True
    alertmanager_urls: tuple[str, ...] = ()
    alert_interval_s: float = 2.0
    alert_for_s: float = 10.0


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


@dataclass(frozen=True, slots=True)
class DemoFiles:
    """Where the demo's shadow chain keeps its files.

    ``ledger``: the SQLite ledger; ``canary``: the canary JSONL; ``tempdir``: the temporary
    directory the demo created and removes at exit (:func:`remove_demo_files`); the ledger is
    inside it unless the user chose its path.
    """

    ledger: Path
    canary: Path
    tempdir: Path


def write_canary_file(path: Path, *, variants: int, temperature: float, seed: int) -> int:
    """Write the simulator's 240 canary items (gold answers, the ``answer: N`` regex checker)
    ``variants`` times as canary JSONL; returns the number of lines.

    Variant ``v`` asks for ``max_tokens`` 64 + v, so every line is a different request and gets
    its own replay seed (from the request hash): a fresh temperature-``temperature`` sample per
    pair, not the same answer again. Each pass is shuffled (``seed``) so the categories mix.
    Blocking (file write).
    """
    return write_canary_jsonl(path, variants=variants, temperature=temperature, seed=seed)


def prepare_demo_files(cfg: DemoConfig) -> DemoFiles:
    """Create the temporary directory, the canary file in it and choose the ledger path
    (``cfg.ledger_path``, else ``<tempdir>/ledger.sqlite``). Blocking; raises ``OSError``."""
    tempdir = Path(tempfile.mkdtemp(prefix="specwatch-demo-"))
    try:
        canary = tempdir / "canary.jsonl"
        write_canary_file(
            canary,
            variants=cfg.canary_variants,
            temperature=cfg.canary_temperature,
            seed=cfg.seed,
        )
    except OSError:
        shutil.rmtree(tempdir, ignore_errors=True)
        raise
    ledger = Path(cfg.ledger_path) if cfg.ledger_path else tempdir / "ledger.sqlite"
    return DemoFiles(ledger=ledger, canary=canary, tempdir=tempdir)


def remove_demo_files(files: DemoFiles) -> None:
    """Remove the demo's temporary directory (a ledger the user placed elsewhere is kept)."""
    shutil.rmtree(files.tempdir, ignore_errors=True)


def _detect_overrides(cfg: DemoConfig) -> dict[str, Any]:
    """Detector settings at demo scale: the demo's windows, every ``for`` = ``alert_for_s``."""
    short = cfg.windows[0] if cfg.windows else "1m"
    long = cfg.windows[-1] if cfg.windows else "5m"
    fors = (
        "acceptance_drop_for",
        "fly_gain_for",
        "inactive_for",
        "budget_for",
        "stall_for",
        "quality_e_value_for",
        "quality_non_inferiority_for",
        "flip_for",
        "target_down_for",
        "shadow_stalled_for",
        "ledger_failing_for",
    )
    return {
        **{f: cfg.alert_for_s for f in fors},
        "acceptance_short_window": short,
        "acceptance_baseline_window": long,
        "rate_window": short,
        "fly_gain_window": short,
        "flip_window": long,
        "shadow_stalled_window": short,
        "ledger_errors_window": 60.0,
    }


def demo_settings(
    cfg: DemoConfig, targets: DemoTargets, port: int, files: DemoFiles | None = None
) -> Settings:
    """The sidecar's :class:`Settings`: both simulators with their limits (so the capacity and
    budget gauges are populated), scrape every ``scrape_interval_s``, the demo's windows;
    alerting at demo scale (``cfg.alerts``); with ``files`` (and ``cfg.shadow``) the shadow
    chain: mirror + canary ingest, arms = the two targets by name plus a noise arm (a second
    replay to the standard server), the ledger at ``files.ledger``.

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
    overrides: dict[str, Any] = {
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
    if cfg.alerts:
        overrides["alerting"] = {
            "urls": list(cfg.alertmanager_urls),
            "evaluation_interval": cfg.alert_interval_s,
            "resend_interval": max(10.0, cfg.alert_interval_s),
        }
        overrides["detect"] = _detect_overrides(cfg)
    if cfg.shadow and files is not None:
        overrides["shadow"] = {
            "enabled": True,
            "modes": ["mirror", "canary"],
            "standard": {"target": "standard"},
            "fly": {"target": "fly"},
            "noise_kind": "standard",
            "sample_probability": cfg.shadow_sample,
            "max_shadow_rps": cfg.shadow_rps,
            "max_in_flight": cfg.shadow_in_flight,
            "queue_size": 4 * cfg.shadow_in_flight,
            "pause_running_fraction": cfg.shadow_pause_running_fraction,
            "pause_on_waiting": cfg.shadow_pause_on_waiting,
            "load_state_max_age_seconds": max(5.0, 5 * cfg.scrape_interval_s),
            "max_queue_age_seconds": 10.0,
            "pause_poll_seconds": 0.2,
            "max_tokens_cap": 2 * cfg.max_tokens,
            "mirror_require_shadow_host": True,
            "mirror_listen_host": cfg.host,
            "mirror_listen_port": 0,
            "canary_file": str(files.canary),
            "canary_rate_per_second": cfg.canary_rate,
            "canary_loop": True,
        }
        overrides["ledger"] = {"path": str(files.ledger)}
        overrides["paired"] = {"windows": list(cfg.windows), "refresh_seconds": 1.0}
    return load_settings(overrides=overrides)


def demo_components(settings: Settings, *, alerts: bool = True) -> list[Component]:
    """The components plugged into the demo's sidecar (``build_app(components=...)``), wired as
    ``specwatch run`` wires them: the shadow chain when ``settings.shadow.enabled``, then (with
    ``alerts``) the alerting component reading the shadow chain's published statistics."""
    shadow = shadow_components(settings)
    if not alerts:
        return [*shadow]
    alerting = alerting_components(settings)
    return [*shadow, *alerting]


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


def _ratio(num: Any, den: Any) -> str:
    if not isinstance(num, int | float) or not isinstance(den, int | float) or den <= 0:
        return "-"
    return f"{round(num)}/{round(den)} ({num / den:.3f})"


def _io_line(io: Mapping[str, Any], unpaired: Mapping[str, Any]) -> str:
    paused = sorted(r for r, on in (io.get("paused") or {}).items() if on)
    dropped = ", ".join(f"{r} {n}" for r, n in sorted((io.get("dropped_total") or {}).items()) if n)
    lost = sum(v for v in unpaired.values() if isinstance(v, int | float))
    return (
        f"        replay: in flight {_int(io.get('in_flight'))}  "
        f"queued {_int(io.get('queue_depth'))}  "
        f"paused {','.join(paused) if paused else 'no'}  "
        f"dropped {dropped or '0'}  unpaired {_int(lost)}"
    )


def _shadow_lines(shadow: Mapping[str, Any], window: str) -> list[str]:
    """Paired quality, from the ``since_start`` overall summary (its e-value is the
    anytime-valid one; else ``window``, else the first) when the shadow document has the
    ``windows → category → summary`` shape, else its scalar fields.

    Line 1: pairs replayed, pairs with a gold answer, lost/gained, the net loss with its
    interval, McNemar's one-sided p and the e-value. Line 2: answers that differ from the
    standard arm's (FLy and the noise arm: the noise floor), FLy's excess over the floor,
    non-inferiority. Line 3 (when ``io`` is present): the replay queue, pauses, drops.
    """
    windows = shadow.get("windows")
    if isinstance(windows, Mapping) and windows:
        w = next((c for c in (SINCE_START, window) if c in windows), next(iter(windows)))
        cats = windows[w] or {}
        cat = OVERALL if OVERALL in cats else next(iter(cats), None)
        s = cats.get(cat) if cat is not None else None
        if isinstance(s, Mapping):
            t = s.get("tally") if isinstance(s.get("tally"), Mapping) else None
            if t is not None:
                paired = (t.get("agree") or 0) + (t.get("disagree") or 0)
                noise_n = (t.get("noise_agree") or 0) + (t.get("noise_disagree") or 0)
                pairs = f"pairs {paired}  graded {_int(s.get('n'))}"
                flips = (
                    f"flips vs standard: fly {_ratio(t.get('disagree'), paired)}  "
                    f"noise floor {_ratio(t.get('noise_disagree'), noise_n)}  "
                    f"excess {_num(s.get('excess_flip_ratio'))}  "
                )
            else:
                pairs = f"pairs {_int(s.get('n'))}"
                flips = (
                    f"flip ratio fly {_num(s.get('fly_flip_ratio'))}  "
                    f"noise {_num(s.get('noise_flip_ratio'))}  "
                )
            lines = [
                f"shadow ({w}): {pairs}  lost {_int(s.get('lost'))}  "
                f"gained {_int(s.get('gained'))}  net loss {_num(s.get('net_loss_ratio'))} "
                f"[{_num(s.get('ci_lower'))}, {_num(s.get('ci_upper'))}]  "
                f"McNemar p(loss) {_num(s.get('p_loss'))}  e-value {_num(s.get('e_value'), '.3g')}",
                f"        {flips}non-inferior {_num(s.get('non_inferiority_pass'))}",
            ]
            io = shadow.get("io")
            if isinstance(io, Mapping):
                unpaired = shadow.get("unpaired_total")
                lines.append(_io_line(io, unpaired if isinstance(unpaired, Mapping) else {}))
            return lines
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
        mirrored = load.get("mirrored")
        lines.append(
            f"load: sent {load.get('sent', 0)}  ok {load.get('ok', 0)}  errors {err}"
            + (f"  mirrored {mirrored}" if mirrored is not None else "")
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
    if snap.shadow is None:
        doc.pop("shadow", None)
    if snap.alerts is None:
        doc.pop("alerts", None)
    return doc


def load_summary(
    stats: LoadStats, roles: Mapping[str, str], *, mirror: bool = False
) -> dict[str, Any]:
    """The ``load`` mapping :func:`render_view` shows; ``roles`` maps base URL → role name;
    ``mirror``: include the count of mirrored copies."""
    out: dict[str, Any] = {
        "sent": stats.sent,
        "ok": stats.ok,
        "errors": dict(stats.errors),
        "canary": {
            role: (stats.correct.get(url, 0), stats.graded.get(url, 0))
            for url, role in roles.items()
        },
    }
    if mirror:
        out["mirrored"] = stats.mirrored
    return out


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
    bound or the demo's files cannot be written and :class:`specwatch.settings.ConfigError` on
    bad settings (nothing is left running, the temporary directory is removed).
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
    files: DemoFiles | None = None
    shadow_pairs: Callable[[], int | None] = _no_pairs
    try:
        if cfg.shadow:
            files = await asyncio.to_thread(prepare_demo_files, cfg)
        sims.append(await start_simulator(std_cfg, host=cfg.host, port=0))
        sims.append(await start_simulator(fly_cfg, host=cfg.host, port=0))
        targets = DemoTargets(standard_url=sims[0].url, fly_url=sims[1].url)
        settings = demo_settings(cfg, targets, port=cfg.port or 0, files=files)
        components = demo_components(settings, alerts=cfg.alerts)
        shadow_pairs = _pairs_counter(components)
        app = build_app(settings, components=components)
        latest = _Latest()
        app[STORE_KEY].subscribe(latest)
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
        if files is not None:
            keep = "kept" if cfg.ledger_path else "removed at exit; --ledger PATH keeps it"
            intro.append(f"  shadow ledger: {files.ledger}  ({keep})")
        if cfg.alerts:
            sent = ", ".join(cfg.alertmanager_urls) or "none (--alertmanager-url URL sends them)"
            intro.append(f"  alerts to Alertmanager: {sent}")
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
                mirror_url=_mirror_url(components, cfg.host) if files is not None else None,
                mirror_fraction=cfg.mirror_fraction,
            ),
        )
        tasks.append(asyncio.create_task(gen.run(), name="demo-load"))
        roles = {targets.standard_url: "standard", targets.fly_url: "fly"}
        started = clock()
        if cfg.ui:
            tasks.append(
                asyncio.create_task(
                    _view_loop(
                        cfg, out, tty, intro, latest, gen, roles, started, clock, files is not None
                    ),
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
        if files is not None:
            await asyncio.to_thread(remove_demo_files, files)
        for sig in installed:
            loop.remove_signal_handler(sig)
    if gen is not None:
        st = gen.stats
        pairs = shadow_pairs()
        _print(
            out,
            f"specwatch demo: stopped; {st.sent} requests sent, {st.ok} answered"
            + (f", {pairs} shadow pairs" if pairs is not None else "")
            + (f"; ledger kept at {files.ledger}" if files is not None and cfg.ledger_path else ""),
        )
    return 0


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


def _mirror_url(components: Sequence[Component], host: str) -> str | None:
    """The shadow component's mirror listener (its own port, bound when the app started)."""
    for c in components:
        if isinstance(c, ShadowPlug) and c.component.mirror_port is not None:
            return f"http://{host}:{c.component.mirror_port}"
    return None


def _pairs_counter(components: Sequence[Component]) -> Callable[[], int | None]:
    """Reads the shadow component's paired requests (:func:`_no_pairs` without one)."""
    for c in components:
        if isinstance(c, ShadowPlug):
            return functools.partial(paired_requests, c.component.counters)
    return _no_pairs


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
    mirror: bool,
) -> None:
    window = cfg.windows[0] if cfg.windows else SINCE_START
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
            load=load_summary(gen.stats, roles, mirror=mirror),
            header=header,
            ansi=tty,
        )
        if tty:
            out.write(_CLEAR + text + "\n")
            out.flush()
        else:
            _print(out, text + "\n")
