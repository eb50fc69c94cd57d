"""The demo's configuration: what it runs (:class:`DemoConfig`), the two simulators' shapes, the
sidecar's :class:`~specwatch.settings.Settings` and components, and its temporary files.

Pure apart from :func:`prepare_demo_files` / :func:`remove_demo_files` (blocking file I/O, run
them in a thread).
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specwatch.simulate.config import Role as SimRole
from specwatch.simulate.config import SimConfig

if TYPE_CHECKING:  # the server and statistics stacks load when used, not for ``demo --help``
    from specwatch.server.app import Component
    from specwatch.settings import Settings

#: The port the demo's sidecar tries first (falls back to a free port when it is taken; the
#: demo prints the port it actually used).
DEFAULT_PORT = 9477


@dataclass(frozen=True, slots=True)
class DemoConfig:
    """What the demo runs; every field has a demo-friendly default.

    ``duration_s``: stop after this many seconds (``None``: until SIGINT/SIGTERM).
    ``port``: the sidecar's port (``None``: 9477, or a free port when 9477 is taken; 0: free).
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
    ``alert_interval_s`` with every ``for`` duration set to ``alert_for_s``; the acceptance
    drop compares ``acceptance_window`` (an extra scrape window, shorter than the view's) with
    the longest window, so a drafter fault shows within seconds of the demo's start.
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
    acceptance_window: str = "20s"


@dataclass(frozen=True, slots=True)
class DemoTargets:
    """Where the demo's simulators listen (base URLs, no trailing slash).

    ``noise_url``: a second standard simulator serving only the noise arm's replays, so the
    standard and the FLy servers receive exactly the same traffic (live requests and one
    replay each) and their throughput compares equal traffic; ``None``: the noise arm replays
    to the standard server (which then serves more than FLy).
    """

    standard_url: str
    fly_url: str
    noise_url: str | None = None


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
        # every reply carries its own τ, as vLLM 0.33 with this flag does: the ledger then
        # holds the verdict's τ, so the view and `specwatch report` print the same sentence
        "per_request_spec_decode_metrics": "summary",
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
    from specwatch.simulate.quiz import write_canary_jsonl  # numpy loads here, not for --help

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


def non_inferiority_min_pairs(
    margin: float = 0.01, discordant: float = 0.2, alpha: float = 0.05
) -> int:
    """Labelled pairs after which the demo lets "non-inferiority not shown" alert: Connor's
    (1987) one-sided sample size to show non-inferiority at ``margin`` with power 0.8 when FLy
    truly loses nothing, at a pessimistic ``discordant`` rate (0.2: the simulator's canary
    replays flip about 15 %). 12,364 with the defaults: hours of demo traffic, so the demo's
    quality alert fires on the e-value's evidence, not on too few pairs."""
    from specwatch.shadow.stats.power import questions_needed

    return questions_needed(margin, discordant, alpha=alpha, power=0.8, two_sided=False)


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
        # No page from a lack of evidence: "non-inferiority not shown" only after as many
        # pairs as would show it for a FLy that loses nothing (see non_inferiority_min_pairs).
        "quality_min_pairs": non_inferiority_min_pairs(),
        "acceptance_short_window": cfg.acceptance_window,
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
    standard replay, to ``targets.noise_url`` when given, else to the standard server), the
    ledger at ``files.ledger``.

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
        "windows": list(dict.fromkeys([*cfg.windows, cfg.acceptance_window])),
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
            "mirror_listen_host": cfg.host,
            "mirror_listen_port": 0,
            "standard": {"target": "standard"},
            "fly": {"target": "fly"},
            "noise_kind": "standard",
            **({"noise": {"url": targets.noise_url}} if targets.noise_url else {}),
            "sample_probability": cfg.shadow_sample,
            "max_shadow_rps": cfg.shadow_rps,
            "max_in_flight": cfg.shadow_in_flight,
            "queue_size": 4 * cfg.shadow_in_flight,
            "pause_running_fraction": cfg.shadow_pause_running_fraction,
            "pause_on_waiting": cfg.shadow_pause_on_waiting,
            "load_state_max_age_seconds": max(5.0, 5 * cfg.scrape_interval_s),
            "max_queue_age_seconds": 10.0,
            "max_tokens_cap": 2 * cfg.max_tokens,
            "mirror_require_shadow_host": True,
            "canary_file": str(files.canary),
            "canary_rate_per_second": cfg.canary_rate,
            "canary_loop": True,
        }
        overrides["ledger"] = {"path": str(files.ledger)}
        overrides["paired"] = {"windows": list(cfg.windows), "refresh_seconds": 1.0}
    from specwatch.settings import load_settings

    return load_settings(overrides=overrides)


def demo_components(settings: Settings, *, alerts: bool = True) -> list[Component]:
    """The components plugged into the demo's sidecar (``build_app(components=...)``), wired as
    ``specwatch run`` wires them: the shadow chain when ``settings.shadow.enabled``, then (with
    ``alerts``) the alerting component reading the shadow chain's published statistics."""
    from specwatch.server.wiring import alerting_components, shadow_components

    shadow = shadow_components(settings)
    if not alerts:
        return [*shadow]
    alerting = alerting_components(settings)
    return [*shadow, *alerting]
