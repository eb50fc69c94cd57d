"""doctor's checks of how specwatch is deployed, beside what Prometheus sees.

Each check returns ``(status, check, message)`` tuples (``ok``, ``warn``, ``fail``; the
command turns them into its findings):

* ``filesystem``: the ledger's filesystem, read from ``/proc/self/mountinfo`` (the mount whose
  mount point is the longest prefix of the ledger's directory): a warning on a network
  filesystem (SQLite's WAL needs shared memory and working locks on one host: on NFS or CIFS it
  gives "database is locked" or a corrupt file), on a memory one (``tmpfs``, ``ramfs``: gone at
  the next start) and on the container's own layer (``overlay``: gone with the container);
* ``alertmanager``: each configured Alertmanager's ``/api/v2/status``: a cluster of N peers
  reached through fewer than N URLs is one Service in front of a replicated Alertmanager,
  which hands each post to one replica; every replica must get every alert, as Prometheus
  sends them;
* ``dashboard``: a dashboard exported "for sharing externally" (``__inputs``, ``${DS_...}``
  data sources) is meant for Grafana's import screen; provisioned from a file or ConfigMap its
  inputs are never filled and every panel says its data source was not found;
* ``rule-range``: a range selector in a rule shorter than 4 scrape intervals (``rate(x[30s])``
  at a 15 s scrape): one missed or late scrape leaves fewer than two samples in the range and
  the rule goes empty (Grafana's ``$__rate_interval`` is 4 intervals for that reason);
* ``shutdown``: specwatch as a native sidecar (an init container with ``restartPolicy:
  Always``) gets SIGTERM only after the pod's main (vLLM) containers exited; their preStop
  hooks (``pod.main_exit_seconds`` when set in the container's env) are taken from the grace
  period before its own drain budget starts
  (:func:`specwatch.core.pod.shutdown_fit`).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specwatch.core.config import parse_duration
from specwatch.core.pod import PodSettings, shutdown_fit
from specwatch.shadow.ledger.files import (
    LAYER_FILESYSTEMS,
    MEMORY_FILESYSTEMS,
    MOUNTINFO,
    NETWORK_FILESYSTEMS,
    filesystem_of,
)

if TYPE_CHECKING:
    from specwatch.settings import Settings

__all__ = [
    "alertmanager_peer_findings",
    "dashboard_export_findings",
    "ledger_filesystem_findings",
    "native_sidecar_findings",
    "rule_range_findings",
]

Row = tuple[str, str, str]


def ledger_filesystem_findings(ledger: Path, mountinfo: str) -> list[Row]:
    """The ``filesystem`` check of the ledger file ``ledger`` against ``mountinfo`` (see the
    module doc); the directory is what counts (the file may not exist yet)."""
    where = str(ledger.parent.resolve())
    found = filesystem_of(where, mountinfo)
    if found is None:
        return [("warn", "filesystem", f"{where}: no mount found in mountinfo; not checked")]
    fstype, point, source = found
    on = f"the ledger ({ledger}) is on {fstype} ({source} at {point})"
    if fstype in NETWORK_FILESYSTEMS:
        return [
            (
                "warn",
                "filesystem",
                f"{on}, a network filesystem: SQLite's write-ahead log needs working locks and "
                "shared memory on one host, and over the network it gives 'database is locked' "
                "or a corrupt ledger; put ledger.path on a local disk (a ReadWriteOnce block "
                "volume)",
            )
        ]
    if fstype in MEMORY_FILESYSTEMS:
        return [
            (
                "warn",
                "filesystem",
                f"{on}, held in memory: every pair is lost when the pod restarts, and the "
                "ledger counts against the container's memory limit; put ledger.path on a "
                "lasting volume",
            )
        ]
    if fstype in LAYER_FILESYSTEMS:
        return [
            (
                "warn",
                "filesystem",
                f"{on}, the container's own layer: every pair is lost when the container "
                "restarts; mount a volume at the ledger's directory",
            )
        ]
    return [("ok", "filesystem", f"{on}, a local filesystem")]


def alertmanager_peer_findings(
    urls: Sequence[str], statuses: Mapping[str, Mapping[str, Any] | str]
) -> list[Row]:
    """The ``alertmanager`` check: ``statuses`` maps each configured URL to its
    ``/api/v2/status`` body, or to why it could not be read. A cluster of N peers (``cluster.
    peers``) reached through fewer than N configured URLs warns; an unreadable status warns
    that nothing was checked."""
    out: list[Row] = []
    for url in urls:
        status = statuses.get(url, "not queried")
        if isinstance(status, str):
            out.append(
                (
                    "warn",
                    "alertmanager",
                    f"{url}: status not read ({status}); not checked. If this is the shipped "
                    "address (kube-prometheus-stack release kube-prometheus-stack in namespace "
                    "monitoring), put your Alertmanager's in alerting.urls of config.yaml or "
                    "SPECWATCH_ALERTING__URLS (docs/deploy.md); until a post is acknowledged "
                    "specwatch_alertmanager_delivering is 0 and the Prometheus rules page instead",
                )
            )
            continue
        peers = (status.get("cluster") or {}).get("peers") or []
        n = len(peers)
        if n > len(urls):
            out.append(
                (
                    "warn",
                    "alertmanager",
                    f"{url} is one of a cluster of {n} Alertmanagers but alerting.urls lists "
                    f"{len(urls)}: a Service in front of replicas hands each post to one of "
                    "them, so the others miss alerts and resolves (and notify from a stale "
                    "state when they take over); list every replica, e.g. through its "
                    "headless Service (alertmanager-0.alertmanager-operated:9093, ...)",
                )
            )
        else:
            out.append(
                ("ok", "alertmanager", f"{url}: {max(n, 1)} peer(s), {len(urls)} URL(s) listed")
            )
    return out


_DS_INPUT = re.compile(r"\$\{DS_[A-Za-z0-9_]+\}")


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def dashboard_export_findings(dashboard: Mapping[str, Any]) -> list[Row]:
    """The ``dashboard`` export check of one dashboard (see the module doc)."""
    title = str(dashboard.get("title", "?"))
    inputs = [str(i.get("name")) for i in dashboard.get("__inputs") or [] if isinstance(i, dict)]
    used = sorted({m.group(0) for s in _strings(dashboard) for m in _DS_INPUT.finditer(s)})
    if not inputs and not used:
        return [("ok", "dashboard", f"{title}: no import inputs (fit to provision)")]
    named = ", ".join(used or [f"${{{n}}}" for n in inputs])
    return [
        (
            "warn",
            "dashboard",
            f"{title}: exported for sharing externally (__inputs, {named}): only Grafana's "
            "import screen fills those; provisioned from a file or ConfigMap every panel says "
            "its data source was not found. Export it without 'Export for sharing externally', "
            "or use the shipped file, whose data source is the ${datasource} variable",
        )
    ]


#: A range selector ``[5m]`` (not a subquery ``[1h:1m]``, which ranges over evaluations).
_RANGE = re.compile(r"\[\s*((?:\d+(?:\.\d+)?(?:ms|[smhdwy]))+)\s*\]")
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|[smhdwy])")
_UNIT = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def _seconds(text: str) -> float:
    return sum(float(n) * _UNIT[u] for n, u in _PART.findall(text))


def rule_range_findings(docs: Sequence[Mapping[str, Any]], scrape_seconds: float) -> list[Row]:
    """The ``rule-range`` check of every rule in ``docs`` (rules files or PrometheusRule
    objects) against ``scrape_seconds``, the scrape interval of the series they read."""
    out: list[Row] = []
    floor = 4 * scrape_seconds
    checked = 0
    for doc in docs:
        groups = doc.get("groups") or (doc.get("spec") or {}).get("groups") or []
        for group in groups:
            for rule in group.get("rules") or []:
                name = rule.get("record") or rule.get("alert") or "?"
                expr = str(rule.get("expr", ""))
                checked += 1
                short = sorted({m.group(1) for m in _RANGE.finditer(expr)} - {""})
                short = [r for r in short if _seconds(r) < floor]
                if short:
                    out.append(
                        (
                            "warn",
                            "rule-range",
                            f"{name} in group {group.get('name')}: range "
                            f"{', '.join('[' + r + ']' for r in short)} is under 4 scrape "
                            f"intervals ({scrape_seconds:g} s x 4 = {floor:g} s): one missed "
                            "scrape leaves fewer than two samples and the rule goes empty; use "
                            f"at least [{floor:g}s]",
                        )
                    )
    if checked and not out:
        out.append(("ok", "rule-range", f"{checked} rules: every range covers 4 scrape intervals"))
    return out


def monitor_scrape_seconds(objects: Sequence[Mapping[str, Any]]) -> float | None:
    """The longest ``interval`` of the PodMonitor/ServiceMonitor endpoints among ``objects``,
    else the Prometheus object's ``scrapeInterval``; ``None`` when none says."""
    found = [
        parse_duration(str(ep["interval"]))
        for o in objects
        if o.get("kind") in ("PodMonitor", "ServiceMonitor")
        for ep in (o.get("spec") or {}).get("podMetricsEndpoints")
        or (o.get("spec") or {}).get("endpoints")
        or []
        if ep.get("interval")
    ]
    if found:
        return max(found)
    for o in objects:
        if o.get("kind") == "Prometheus" and (o.get("spec") or {}).get("scrapeInterval"):
            return parse_duration(str(o["spec"]["scrapeInterval"]))
    return None


#: The budget ``server.shutdown_timeout_seconds`` has when the manifest does not set it.
DEFAULT_BUDGET_SECONDS = 10.0
#: The grace period Kubernetes gives a pod that does not set one.
DEFAULT_GRACE_SECONDS = 30.0


def pre_stop_seconds(container: Mapping[str, Any]) -> float:
    """How long a container's ``preStop`` hook holds it: a ``sleep`` action's seconds, or the
    ``N`` of an ``exec`` hook running ``sleep N`` (directly or in ``sh -c``); 0 otherwise."""
    hook = (container.get("lifecycle") or {}).get("preStop") or {}
    if "sleep" in hook:
        return float((hook["sleep"] or {}).get("seconds", 0))
    command = [str(c) for c in ((hook.get("exec") or {}).get("command") or [])]
    words = [w for part in command for w in (shlex.split(part) if " " in part else [part])]
    for i, word in enumerate(words[:-1]):
        if word.endswith("sleep"):
            try:
                return parse_duration(words[i + 1].rstrip(";"))
            except ValueError:
                return 0.0
    return 0.0


def _env(container: Mapping[str, Any]) -> dict[str, str]:
    return {str(e["name"]): str(e["value"]) for e in container.get("env") or [] if "value" in e}


def native_sidecar_findings(
    pods: Sequence[tuple[str, Mapping[str, Any]]],
) -> list[Row]:
    """The ``shutdown`` check of each pod spec (``(what, spec)``) that runs specwatch (an
    init container named or imaged ``specwatch``) as a native sidecar: the main containers'
    longest preStop (or ``SPECWATCH_POD__MAIN_EXIT_SECONDS`` from specwatch's env) passes
    before specwatch's SIGTERM, and the budget (``SPECWATCH_SERVER__SHUTDOWN_TIMEOUT_SECONDS``,
    else 10 s) plus its own preStop and the kill margin must fit what is left."""
    out: list[Row] = []
    for what, spec in pods:
        sidecars = [
            c
            for c in spec.get("initContainers") or []
            if c.get("restartPolicy") == "Always"
            and "specwatch" in f"{c.get('name', '')} {c.get('image', '')}"
        ]
        if not sidecars:
            continue
        sw = sidecars[0]
        env = _env(sw)
        grace = float(spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS))
        budget = float(
            env.get("SPECWATCH_SERVER__SHUTDOWN_TIMEOUT_SECONDS", DEFAULT_BUDGET_SECONDS)
        )
        main = [pre_stop_seconds(c) for c in spec.get("containers") or []]
        main_exit = float(env.get("SPECWATCH_POD__MAIN_EXIT_SECONDS", max(main, default=0.0)))
        pod = PodSettings(
            termination_grace_period_seconds=grace,
            pre_stop_seconds=pre_stop_seconds(sw),
            container="native_sidecar",
            main_exit_seconds=main_exit,
        )
        problems = shutdown_fit(pod, budget=budget, proxy=False)
        out += [("warn", "shutdown", f"{what}: {p.setting}: {p.message}") for p in problems]
        if not problems:
            out.append(
                (
                    "ok",
                    "shutdown",
                    f"{what}: specwatch as a native sidecar drains in the {grace - main_exit:g} s "
                    "left after the main containers exit",
                )
            )
    return out


def _pod_specs(objects: Sequence[Mapping[str, Any]]) -> list[tuple[str, Mapping[str, Any]]]:
    out: list[tuple[str, Mapping[str, Any]]] = []
    for o in objects:
        kind, meta = o.get("kind"), o.get("metadata") or {}
        if kind == "Pod":
            out.append((f"Pod {meta.get('name')}", o.get("spec") or {}))
        elif kind in ("Deployment", "StatefulSet", "DaemonSet"):
            tpl = (o.get("spec") or {}).get("template") or {}
            out.append((f"{kind} {meta.get('name')}", tpl.get("spec") or {}))
    return out


def file_rows(
    dashboards: Sequence[Mapping[str, Any]],
    rule_docs: Sequence[Mapping[str, Any]],
    objects: Sequence[Mapping[str, Any]],
    *,
    offline: bool,
) -> list[Row]:
    """The checks of the files on the command line: dashboards exported for sharing, native
    sidecar shutdown in the manifests, and (``offline``: no Prometheus to ask for the scrape
    interval) rule ranges against the monitors' ``interval``."""
    out = [r for d in dashboards for r in dashboard_export_findings(d)]
    out += native_sidecar_findings(_pod_specs(objects))
    if offline and rule_docs:
        interval = monitor_scrape_seconds(objects)
        if interval is None:
            out.append(
                (
                    "warn",
                    "rule-range",
                    "no scrape interval known (no --prometheus-url, no monitor interval in "
                    "--manifest): rule ranges not checked",
                )
            )
        else:
            out += rule_range_findings(rule_docs, interval)
    return out


async def _statuses(urls: Sequence[str], limit_s: float) -> dict[str, Mapping[str, Any] | str]:
    import aiohttp

    out: dict[str, Mapping[str, Any] | str] = {}
    timeout = aiohttp.ClientTimeout(total=limit_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for url in urls:
            try:
                async with session.get(f"{url}/api/v2/status") as resp:
                    if resp.status != 200:
                        out[url] = f"HTTP {resp.status}"
                        continue
                    body = await resp.json()
                    out[url] = body if isinstance(body, dict) else "not a status object"
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                out[url] = f"{type(exc).__name__}: {exc}"
    return out


def deployment_rows(settings: Settings, limit_s: float, mountinfo: Path = MOUNTINFO) -> list[Row]:
    """The checks of a loaded configuration where it runs: the ledger's filesystem (when the
    shadow chain is on and ``mountinfo`` is readable) and the Alertmanager peers."""
    import asyncio

    out: list[Row] = []
    if settings.shadow.enabled:
        try:
            text = mountinfo.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            out.append(("warn", "filesystem", f"{mountinfo}: unreadable ({exc}); not checked"))
        else:
            out += ledger_filesystem_findings(Path(settings.ledger.path), text)
    urls = settings.alerting.urls
    if urls:
        out += alertmanager_peer_findings(urls, asyncio.run(_statuses(urls, limit_s)))
    return out
