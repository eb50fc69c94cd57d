"""``specwatch replay``: every detector over saved ``/metrics`` timelines, on a simulated clock.

The offline twin of ``promtool test rules`` for specwatch's own detectors, for tuning thresholds
and for post-mortems on captured scrapes::

    specwatch replay --target 'c08=DIR,max_num_seqs=256,num_speculative_tokens=3' --format json

``--target NAME=DIR[,key=value...]`` (repeatable) takes the keys of ``run``'s ``--target``
(``max_num_seqs``, ``max_num_batched_tokens``, ``num_speculative_tokens``, ``method``,
``vllm_version``, ``role``, ...); the role defaults to ``standard`` when NAME is not a role.
``DIR`` holds one body per scrape named ``<seconds since start>.prom`` (text exposition) or
``.om`` (OpenMetrics); other files are ignored. The same ``--config`` file and ``SPECWATCH_*``
environment as ``run`` set the windows and the ``detect`` group (thresholds, detector windows,
``for`` durations); ``--window`` overrides the windows. The file's other groups (its targets,
``shadow``, ``ledger``, ``server``) are ignored, so ``run``'s file works unchanged.
``specwatch record`` writes such directories from running servers.

The clock: each target's pages are fed to the observe chain at their scrape times; the
detectors are evaluated every ``alerting.evaluation_interval`` seconds from the first scrape to
the last (as Prometheus evaluates rules), each time over every page at or before that time. No
shadow traffic is replayed, so the paired-quality alerts never fire here.

Output: ``--format json`` prints ``{"alerts": [{"alertname", "severity", "labels", "value",
"summary", "fired_at", "resolved_at"}]}`` (times in seconds since start, ``resolved_at`` null
while still firing at the end), ordered by ``fired_at``; ``--format table`` at most 80
columns: one line per alert, its labels and summary wrapped below it. Without ``--format``: the
table on a terminal, JSON in a pipe or a file (as every command that prints data).
Exit code 2 (one line on stderr) for a bad flag or setting, a missing directory, a directory
without bodies or a body name that is not a number of seconds. A body that fails to parse is a
failed scrape (as in ``run``): counted per reason, logged once, and the replay goes on.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import re
import sys
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specwatch.cli.args import add_output_format, add_windows, output_format
from specwatch.core.logs import log_event, setup_logging
from specwatch.core.roles import Role
from specwatch.observe.parse import ParseError, parse_page
from specwatch.observe.prefilter import OPENMETRICS_CONTENT_TYPE

if TYPE_CHECKING:  # settings, parser, trackers and detectors load when replaying, not for --help
    from specwatch.alerts.alert import Alert, AlertKey
    from specwatch.alerts.settings import DetectSettings
    from specwatch.observe.settings import ScrapeSettings, TargetSettings
    from specwatch.observe.tracker import TargetTracker

logger = logging.getLogger("specwatch.replay")

#: The config file's groups replay reads; the others (``shadow``, ``ledger``, ``server``, the
#: file's ``targets``, ...) are ignored, so ``run``'s config file works as it is.
USED_GROUPS = ("windows", "detect", "alerting", "scrape", "log")

#: Body file suffix → content type given to the parser.
SUFFIXES: dict[str, str] = {".prom": "text/plain", ".om": OPENMETRICS_CONTENT_TYPE}


@dataclass(frozen=True, slots=True)
class Scrape:
    """One saved body: its target, scrape time (seconds since start), text and content type."""

    target: str
    t: float
    body: str
    content_type: str
    path: Path


@dataclass(frozen=True, slots=True)
class Transition:
    """One firing interval of one alert: fired at ``fired_at``, resolved at ``resolved_at``
    (``None``: still firing at the end). Times in seconds since start."""

    alert: Alert
    fired_at: float
    resolved_at: float | None


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``replay``."""
    p = subparsers.add_parser(
        "replay",
        help="run every detector over saved /metrics timelines (offline)",
        description="Evaluate specwatch's windows and detectors over saved /metrics bodies on a "
        "simulated clock and print what fired and resolved, when.",
    )
    p.add_argument("--config", type=Path, help="YAML, TOML or JSON settings file (as for run)")
    p.add_argument(
        "--target",
        action="append",
        required=True,
        metavar="NAME=DIR[,key=value...]",
        help="a directory of <seconds>.prom / <seconds>.om bodies; repeat per server",
    )
    add_windows(p)
    add_output_format(p)
    p.add_argument("--log-level", default="WARNING", help="DEBUG, INFO, WARNING or ERROR")
    p.set_defaults(handler=main)


def _target(spec: str) -> tuple[dict[str, Any], Path]:
    """``NAME=DIR[,k=v...]`` → (target mapping with a placeholder URL, DIR)."""
    from specwatch.settings import parse_target_spec

    raw = parse_target_spec(spec)
    directory = Path(raw.pop("url"))
    raw["url"] = f"http://replay.invalid/{raw['name']}"
    raw.setdefault("role", raw["name"] if raw["name"] in tuple(Role) else "")
    if not raw["role"]:
        raw["role"] = "standard"
    return raw, directory


def read_timeline(name: str, directory: Path) -> list[Scrape]:
    """The bodies of one directory, sorted by time. :class:`ConfigError` on a missing
    directory, no bodies, or a body name that is not a finite number of seconds."""
    from specwatch.settings import ConfigError

    if not directory.is_dir():
        raise ConfigError(f"--target {name}: {directory} is not a directory")
    out: list[Scrape] = []
    for path in sorted(directory.iterdir()):
        ctype = SUFFIXES.get(path.suffix)
        if ctype is None:
            continue
        try:
            t = float(path.stem)
        except ValueError:
            t = math.nan
        if not math.isfinite(t) or t < 0:
            raise ConfigError(f"--target {name}: {path.name}: name must be <seconds>{path.suffix}")
        try:
            body = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--target {name}: {path}: cannot read: {exc}") from None
        out.append(Scrape(name, t, body, ctype, path))
    if not out:
        raise ConfigError(f"--target {name}: no <seconds>.prom or .om bodies in {directory}")
    return sorted(out, key=lambda s: s.t)


def replay(
    targets: Sequence[TargetSettings],
    scrapes: Sequence[Scrape],
    *,
    windows: Mapping[str, float],
    detect: DetectSettings,
    evaluation_interval: float,
    scrape: ScrapeSettings | None = None,
) -> list[Transition]:
    """Feed ``scrapes`` (any order) to one tracker per target and evaluate the detectors every
    ``evaluation_interval`` seconds from the first scrape time to the last (inclusive).
    ``scrape``: the per-target bounds the trackers keep (``specwatch run``'s; defaults when
    ``None``).

    Pure apart from one log line per unparseable body. Returns the firing intervals in
    ``fired_at`` order (ties by alert name and labels).
    """
    from specwatch.observe.settings import ScrapeSettings
    from specwatch.observe.tracker import TargetTracker

    bounds = scrape if scrape is not None else ScrapeSettings()
    trackers = {t.name: TargetTracker.from_settings(t, bounds, windows) for t in targets}
    ordered = sorted(scrapes, key=lambda s: (s.t, s.target))
    if not ordered:
        return []
    from specwatch.alerts.alert import alert_key
    from specwatch.alerts.pending import Detector  # the statistics stack loads here, not for --help
    from specwatch.observe.tracker import build_view

    detector = Detector(detect)
    start, end = ordered[0].t, ordered[-1].t
    steps = math.floor((end - start) / evaluation_interval + 1e-9)
    ticks = [start + i * evaluation_interval for i in range(steps + 1)]
    if ticks[-1] < end:
        ticks.append(end)
    open_: dict[AlertKey, tuple[Alert, float]] = {}
    done: list[Transition] = []
    i = 0
    for now in ticks:
        while i < len(ordered) and ordered[i].t <= now + 1e-9:
            _feed(trackers[ordered[i].target], ordered[i])
            i += 1
        view = build_view([tr.snapshot() for tr in trackers.values()], now=now)
        firing = {alert_key(a.identity()): a for a in detector.evaluate(view, None, now)}
        for key in [k for k in open_ if k not in firing]:
            alert, since = open_.pop(key)
            done.append(Transition(alert, since, now))
        for key, alert in firing.items():
            if key not in open_:
                open_[key] = (alert, now)
    done.extend(Transition(alert, since, None) for alert, since in open_.values())
    done.sort(key=lambda tr: (tr.fired_at, tr.alert.alertname, alert_key(tr.alert.labels)))
    return done


def _feed(tracker: TargetTracker, scrape: Scrape) -> None:
    try:
        page = parse_page(
            scrape.body, content_type=scrape.content_type, engine=tracker.target.engine
        )
    except ParseError as exc:
        tracker.record_error("parse", duration_seconds=None)
        log_event(
            logger,
            logging.WARNING,
            "replay body not parsed; counted as a failed scrape",
            target=scrape.target,
            file=str(scrape.path),
            line=exc.line,
            reason=exc.message,
        )
        return
    tracker.record_page(scrape.t, page, duration_seconds=None)


def transitions_json(found: Sequence[Transition]) -> dict[str, Any]:
    """The ``--format json`` document."""
    return {
        "alerts": [
            {
                "alertname": tr.alert.alertname,
                "severity": str(tr.alert.severity),
                "labels": dict(sorted(tr.alert.labels.items())),
                "value": tr.alert.value
                if tr.alert.value is None or math.isfinite(tr.alert.value)
                else None,
                "summary": tr.alert.summary,
                "fired_at": tr.fired_at,
                "resolved_at": tr.resolved_at,
            }
            for tr in found
        ]
    }


#: The widest line :func:`render_table` writes (a terminal's width).
TABLE_WIDTH = 80


def render_table(found: Sequence[Transition], width: int = TABLE_WIDTH) -> str:
    """At most ``width`` columns: one line per firing interval (fired and resolved seconds,
    severity, value, alert name, cut with ``…`` if it cannot fit), then its labels and its
    summary, each wrapped between words below it, indented by two spaces."""
    if not found:
        return "no alert fired"
    head = ("fired_at", "resolved_at", "severity", "value", "alertname")
    rows = [
        (
            f"{tr.fired_at:g}",
            "-" if tr.resolved_at is None else f"{tr.resolved_at:g}",
            str(tr.alert.severity),
            "-" if tr.alert.value is None else f"{tr.alert.value:.6g}",
            tr.alert.alertname,
        )
        for tr in found
    ]
    widths = [max(len(r[c]) for r in (head, *rows)) for c in range(len(head) - 1)]
    indent = "  "
    room = max(width - sum(widths) - 2 * len(widths), 2)

    def line(cells: Sequence[str]) -> str:
        name = cells[-1] if len(cells[-1]) <= room else cells[-1][: room - 1] + "…"
        return "  ".join([*(c.ljust(w) for c, w in zip(cells, widths, strict=False)), name])

    out = [line(head)]
    for tr, cells in zip(found, rows, strict=True):
        labels = ", ".join(f"{k}={v}" for k, v in sorted(tr.alert.labels.items())) or "-"
        out.append(line(cells))
        for text in (labels, tr.alert.summary):
            out += textwrap.wrap(
                text,
                width,
                initial_indent=indent,
                subsequent_indent=indent,
                break_on_hyphens=False,
            )
    return "\n".join(out)


def main(args: argparse.Namespace) -> int:
    """Print the alerts; 2 on a bad flag, setting or directory."""
    from specwatch.settings import ConfigError, load_settings

    try:
        specs = [_target(spec) for spec in args.target]
        overrides: dict[str, Any] = {"targets": [raw for raw, _ in specs]}
        if args.window:
            overrides["windows"] = list(args.window)
        settings = load_settings(config_file=args.config, overrides=overrides, only=USED_GROUPS)
        scrapes = [s for (raw, d) in specs for s in read_timeline(raw["name"], d)]
    except ConfigError as exc:
        print(f"specwatch replay: {exc}", file=sys.stderr)
        return 2
    setup_logging(args.log_level, settings.log.format)
    found = replay(
        settings.targets,
        scrapes,
        windows=settings.window_seconds,
        detect=settings.detect,
        evaluation_interval=settings.alerting.evaluation_interval,
        scrape=settings.scrape,
    )
    if output_format(args.format) == "json":
        print(json.dumps(transitions_json(found), indent=2, allow_nan=False))
    else:
        print(render_table(found))
    if not found:
        print(
            nothing_fired_note(
                [(raw["name"], raw.get("num_speculative_tokens")) for raw, _ in specs],
                scrapes,
                settings.window_seconds,
            ),
            file=sys.stderr,
        )
    return 0


_POSITION = re.compile(r'^vllm:spec_decode_num_accepted_tokens_per_pos\S*position="(\d+)"', re.M)


def page_k(body: str) -> int | None:
    """K as a vLLM page shows it: the draft positions of
    ``vllm:spec_decode_num_accepted_tokens_per_pos`` (highest position + 1); ``None`` without
    that counter."""
    positions = [int(m) for m in _POSITION.findall(body)]
    return max(positions) + 1 if positions else None


def nothing_fired_note(
    targets: Sequence[tuple[str, object]],
    scrapes: Sequence[Scrape],
    windows: Mapping[str, float],
) -> str:
    """What was evaluated when no alert fired (for stderr), so a mismatch shows: per target the
    pages read, the K used and where it came from (``--target``'s ``num_speculative_tokens``,
    or not set), and the K its last page shows; then the windows and the time span."""
    parts: list[str] = []
    for name, k in targets:
        pages = [s for s in scrapes if s.target == name]
        used = (
            f"K={k} from --target"
            if k is not None
            else "K not set (--target ...,num_speculative_tokens=K)"
        )
        shown = page_k(pages[-1].body) if pages else None
        seen = f", the pages show K={shown}" if shown is not None else ""
        parts.append(f"{name}: {len(pages)} pages, {used}{seen}")
    span = (
        f"{min(s.t for s in scrapes):g} to {max(s.t for s in scrapes):g} s"
        if scrapes
        else "no time"
    )
    return (
        "specwatch replay: no alert fired; evaluated "
        + "; ".join(parts)
        + f"; windows {', '.join(windows)} over {span}"
    )
