"""``specwatch run``: scrape the configured vLLM servers and serve specwatch's gauges.

Example: ``specwatch run --target standard=http://127.0.0.1:8000 --target
fly=http://127.0.0.1:8001,max_num_seqs=128,method=eagle3,num_speculative_tokens=3``.
A bad value prints one line naming the field and exits with code 2. SIGTERM drains and stops it
within ``server.shutdown_timeout_seconds`` (exit 0); Ctrl-C (SIGINT) does the same, then the
entry point prints ``specwatch run: interrupted`` and exits 130.
"""

from __future__ import annotations

import argparse
import logging
import sqlite3
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specwatch.cli.args import add_windows
from specwatch.core.config import parse_duration
from specwatch.core.logs import log_event, redact_url, resolve_format, setup_logging

if TYPE_CHECKING:  # pydantic's settings load when the command runs, not for ``--help``
    from specwatch.server.checks import Finding
    from specwatch.settings import Settings

logger = logging.getLogger("specwatch.run")


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``run`` and its flags (flags override the config file and the environment)."""
    p = subparsers.add_parser(
        "run",
        help="scrape vLLM servers and export speculative-decoding health",
        description="Scrape vLLM /metrics and serve specwatch_* gauges on /metrics.",
    )
    add_settings_arguments(p)
    p.set_defaults(handler=main)


def add_settings_arguments(p: argparse.ArgumentParser) -> None:
    """The flags that map onto :class:`~specwatch.settings.Settings` (shared with ``demo``)."""
    p.add_argument("--config", type=Path, help="YAML, TOML or JSON settings file")
    p.add_argument(
        "--target",
        action="append",
        metavar="NAME=URL[,key=value...]",
        help="a vLLM server; repeat per server (role inferred when NAME is standard|fly|baseline)",
    )
    p.add_argument("--host", help="listen address (default 0.0.0.0)")
    p.add_argument("--port", type=int, help="listen port (default 9477)")
    p.add_argument("--scrape-interval", metavar="DURATION", help="default scrape interval (5s)")
    p.add_argument("--scrape-timeout", metavar="DURATION", help="default scrape timeout (4s)")
    p.add_argument("--max-body-bytes", type=int, help="largest /metrics body read (decompressed)")
    add_windows(p)
    p.add_argument("--log-level", help="DEBUG, INFO, WARNING or ERROR")
    p.add_argument(
        "--log-format", help="json, plain or auto (default: plain on a terminal, else json)"
    )


def _duration(flag: str, text: str | None) -> float | None:
    """``text`` in seconds (``None`` when the flag was not given); :class:`ConfigError` naming
    ``flag`` when it is not a duration."""
    if text is None:
        return None
    try:
        return parse_duration(text)
    except ValueError as exc:
        from specwatch.settings import ConfigError

        raise ConfigError(f"config error: {flag}: {exc}") from None


def _given(**fields: Any) -> dict[str, Any]:
    """The flags that were given (not ``None``), keyed by their settings field name."""
    return {name: value for name, value in fields.items() if value is not None}


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Build :class:`Settings` from the file, the environment and these flags (highest).

    Raises :class:`~specwatch.settings.ConfigError` (one line naming the field).
    """
    from specwatch.settings import load_settings, parse_target_spec

    overrides: dict[str, Any] = {}
    if args.target:
        overrides["targets"] = [parse_target_spec(spec) for spec in args.target]
    sections: dict[str, dict[str, Any]] = {
        "server": _given(host=args.host, port=args.port),
        "scrape": _given(
            interval_seconds=_duration("--scrape-interval", args.scrape_interval),
            timeout_seconds=_duration("--scrape-timeout", args.scrape_timeout),
            max_body_bytes=args.max_body_bytes,
        ),
        "log": _given(level=args.log_level, format=args.log_format),
    }
    overrides.update((name, fields) for name, fields in sections.items() if fields)
    if args.window:
        overrides["windows"] = list(args.window)
    return load_settings(config_file=args.config, overrides=overrides)


def log_effective_config(settings: Settings, *, human: bool = False) -> None:
    """Log the effective configuration once, secrets shown as ``**********``. ``human`` (plain
    logs on a terminal): first one short line saying where it serves and what it scrapes, the
    whole configuration only at ``DEBUG`` (``--log-level DEBUG``)."""
    if not human:
        log_event(logger, logging.INFO, "effective config", config=settings.redacted())
        return
    server = settings.server
    log_event(
        logger,
        logging.INFO,
        f"serving on http://{server.host}:{server.port}/metrics",
        scraping=", ".join(f"{t.name}={redact_url(t.url)}" for t in settings.targets),
        shadow="on" if settings.shadow.enabled else "off",
        stop="Ctrl-C",
    )
    log_event(logger, logging.DEBUG, "effective config", config=settings.redacted())


def preflight(settings: Settings) -> None:
    """Check, before the event loop starts, what would otherwise fail deep in start-up.

    With shadow on: the ledger file can be opened as SQLite (or is a file of another format,
    which the ledger moves aside when it opens), and the canary set (when the
    ``canary`` mode is on) loads. Raises :class:`ConfigError` naming the setting.
    """
    if not settings.shadow.enabled:
        return
    # The ledger and canary modules load here, not when ``--help`` builds the parser.
    from specwatch.settings import ConfigError
    from specwatch.shadow.ingest.canary import CanaryFileError, load_canary
    from specwatch.shadow.ledger.files import check_openable, path_problem
    from specwatch.shadow.ledger.state import state_of_error

    path = settings.ledger.path
    try:
        check_openable(path)
    except sqlite3.Error as exc:
        cause = path_problem(path)
        # a file of another format is no reason to stop: the ledger's open moves it aside
        if cause is not None or state_of_error(exc) != "corrupt":
            raise ConfigError(
                f"config error: ledger.path: cannot open {path!r}: {cause or exc}"
            ) from exc
    shadow = settings.shadow
    if "canary" in shadow.modes:
        try:
            load_canary(
                shadow.canary_file, builtin=shadow.canary_builtin, model=shadow.canary_model
            )
        except CanaryFileError as exc:
            raise ConfigError(f"config error: shadow.canary_file: {exc}") from exc


def whole_config(settings: Settings) -> list[Finding]:
    """The whole-configuration checks (:func:`specwatch.server.checks.check_settings`): the
    warnings returned (logged once logging is set up, so they follow ``log.format``; but the
    shutdown-budget ones, :func:`log_shutdown_fit` logs them); the first error raised as
    :class:`ConfigError`."""
    from specwatch.server.checks import check_settings, shutdown_findings
    from specwatch.settings import ConfigError

    logged = shutdown_findings(settings)
    found = check_settings(settings)
    for f in found:
        if f.level == "error":
            raise ConfigError(f"config error: {f.setting}: {f.message}")
    return [f for f in found if f.level != "error" and f not in logged] + ledger_filesystem(
        settings
    )


#: What each risky filesystem does to the ledger (SQLite in WAL mode).
_FS_RISK = {
    "network": "a network filesystem: SQLite's write-ahead log needs working locks and shared "
    "memory on one host ('database is locked', corruption); use a local disk",
    "memory": "held in memory: every pair is lost at the next start; use a lasting volume",
}


def ledger_filesystem(settings: Settings, mountinfo: Path | None = None) -> list[Finding]:
    """A warning (setting ``ledger.path``) when shadow is on and the ledger's directory is on a
    network or memory filesystem (:func:`specwatch.shadow.ledger.files.filesystem_risk`; the
    container-layer case is left to ``specwatch doctor --config``: a local run from a
    checkout in a dev container is on one)."""
    if not settings.shadow.enabled:
        return []
    from specwatch.server.checks import Finding
    from specwatch.shadow.ledger.files import MOUNTINFO, filesystem_risk

    found = filesystem_risk(settings.ledger.path, mountinfo or MOUNTINFO)
    if found is None:
        return []
    risk, fstype, point, source = found
    if risk not in _FS_RISK:
        return []
    where = f"{settings.ledger.path!r} is on {fstype} ({source} at {point}), "
    return [Finding("warning", "ledger.path", where + _FS_RISK[risk])]


def log_shutdown_fit(settings: Settings) -> None:
    """One WARNING line per way the shutdown budget does not fit the pod
    (:func:`specwatch.server.checks.shutdown_findings`); nothing when it fits."""
    from specwatch.server.checks import shutdown_findings

    pod = settings.pod
    for f in shutdown_findings(settings):
        log_event(
            logger,
            logging.WARNING,
            "shutdown budget does not fit the pod",
            setting=f.setting,
            message=f.message,
            budget_seconds=settings.server.shutdown_timeout_seconds,
            pre_stop_seconds=pod.pre_stop_seconds,
            grace_seconds=pod.termination_grace_period_seconds,
            container=pod.container,
        )


def main(args: argparse.Namespace) -> int:
    """Run until SIGTERM (0) or SIGINT (:class:`KeyboardInterrupt` after the same orderly stop,
    for the entry point's line and 130); 2 on a configuration error."""
    # The server, shadow and alerting stacks (aiohttp, scipy, rapidfuzz) load only here.
    from specwatch.core.listen_http import CannotListen
    from specwatch.core.shutdown import exit_now
    from specwatch.server.app import build_app, serve
    from specwatch.server.wiring import alerting_components, shadow_components
    from specwatch.settings import ConfigError

    try:
        settings = settings_from_args(args)
        if not settings.targets:
            raise ConfigError("config error: targets: at least one --target is required")
        preflight(settings)
        warnings = whole_config(settings)
    except ConfigError as exc:
        print(f"specwatch run: {exc}", file=sys.stderr)
        return 2
    setup_logging(settings.log.level, settings.log.format, secrets=settings.secret_values())
    for f in warnings:
        log_event(
            logger, logging.WARNING, "configuration warning", setting=f.setting, message=f.message
        )
    log_effective_config(settings, human=resolve_format(settings.log.format) == "plain")
    log_shutdown_fit(settings)
    shadow = shadow_components(settings)
    alerting = alerting_components(settings)
    app = build_app(settings, components=[*shadow, *alerting])
    try:
        serve(app, settings)
    except CannotListen as exc:  # the bind alone: a later failure is not the port's
        reason = exc.strerror or exc
        print(
            f"specwatch run: server.port: cannot listen on "
            f"{settings.server.host}:{settings.server.port}: {reason}",
            file=sys.stderr,
        )
        return 2
    # drained and closed within the budget: no interpreter teardown to outlive it
    exit_now(0)
