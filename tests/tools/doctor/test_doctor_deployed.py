"""``specwatch doctor``'s checks of how specwatch is deployed: the ledger's filesystem, dashboards
exported for sharing, rule ranges against the scrape interval, and the drain budget of a native
sidecar (the Alertmanager peer check is ``tests/e2e/test_alertmanager_cluster.py``)."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from specwatch.__main__ import main
from specwatch.cli.run import ledger_filesystem
from specwatch.core.pod import PodSettings, shutdown_fit
from specwatch.server.checks import check_settings
from specwatch.settings import Settings
from specwatch.shadow.ledger.files import filesystem_of
from specwatch.tools.doctor.deployed import (
    alertmanager_peer_findings,
    ledger_filesystem_findings,
    native_sidecar_findings,
)
from tests.fakes import REPO

#: A container's mounts as the kernel lists them (proc(5)); the fields a real one has, written
#: by hand: the ledger directory on NFS, a scratch tmpfs, a local ext4 data disk, a mount
#: point with a space (escaped \040), the root on overlay.
MOUNTINFO = """\
1449 1350 0:170 / / rw,relatime master:620 - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w
1450 1449 0:172 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
1462 1449 0:55 /exports/sw /var/lib/specwatch rw shared:30 - nfs4 10.0.0.9:/exports/sw rw,vers=4.2
1463 1449 0:60 / /scratch rw,nosuid,nodev - tmpfs tmpfs rw,size=65536k
1464 1449 259:1 / /data rw,relatime shared:31 master:2 - ext4 /dev/nvme0n1p1 rw
1465 1464 259:2 / /data/my\\040disk rw,relatime - cifs //nas/share rw
"""


def _row(path: str) -> tuple[str, str]:
    [(status, check, message)] = ledger_filesystem_findings(Path(path), MOUNTINFO)
    assert check == "filesystem"
    return status, message


def test_filesystem_is_the_longest_mount_point_above_the_path() -> None:
    """The mount holding a path is the one whose mount point is its longest prefix (``/data``
    is not a prefix of ``/database``), escapes undone."""
    assert filesystem_of("/var/lib/specwatch", MOUNTINFO) == (
        "nfs4",
        "/var/lib/specwatch",
        "10.0.0.9:/exports/sw",
    )
    assert filesystem_of("/data/my disk/x", MOUNTINFO) == ("cifs", "/data/my disk", "//nas/share")
    assert filesystem_of("/data/x", MOUNTINFO) == ("ext4", "/data", "/dev/nvme0n1p1")
    assert filesystem_of("/database", MOUNTINFO) == ("overlay", "/", "overlay")


def test_network_and_memory_filesystems_warn_local_is_ok(tmp_path: Path) -> None:
    """The ledger on NFS or CIFS warns of locking and corruption, on tmpfs of losing every
    pair, on the container's overlay of losing them with the container; on ext4 it is OK."""
    status, message = _row("/var/lib/specwatch/ledger.sqlite")
    assert status == "warn"
    assert "nfs4 (10.0.0.9:/exports/sw at /var/lib/specwatch), a network filesystem" in message
    assert "database is locked" in message
    status, message = _row("/data/my disk/ledger.sqlite")
    assert (status, "cifs" in message, "network filesystem" in message) == ("warn", True, True)
    status, message = _row("/scratch/ledger.sqlite")
    assert (status, "tmpfs" in message, "held in memory" in message) == ("warn", True, True)
    status, message = _row("/home/ledger.sqlite")
    assert (status, "overlay" in message, "container's own layer" in message) == (
        "warn",
        True,
        True,
    )
    assert _row("/data/ledger.sqlite")[0] == "ok"


def test_run_warns_at_start_on_network_and_memory_filesystems(tmp_path: Path) -> None:
    """``specwatch run``'s start-up checks (the warnings it logs): the ledger under a directory
    the mount table shows on tmpfs, then on NFS, is one ``ledger.path`` warning each; on ext4,
    or with shadow off, none."""
    table = tmp_path / "mountinfo"
    ledger = tmp_path / "state" / "ledger.sqlite"
    ledger.parent.mkdir()
    point = str(ledger.parent.resolve())
    arms = {"standard": {"url": "http://127.0.0.1:1"}, "fly": {"url": "http://127.0.0.1:2"}}
    on = {"shadow": {"enabled": True, **arms}}
    settings = Settings.model_validate({**on, "ledger": {"path": str(ledger)}})
    for fstype, source, words in [
        ("tmpfs", "tmpfs", "held in memory"),
        ("nfs", "nas:/x", "a network filesystem"),
        ("ext4", "/dev/sda1", None),
    ]:
        table.write_text(
            f"1 0 0:1 / / rw - ext4 /dev/sda1 rw\n2 1 0:2 / {point} rw - {fstype} {source} rw\n"
        )
        found = ledger_filesystem(settings, table)
        if words is None:
            assert found == []
            continue
        [warning] = found
        assert (warning.level, warning.setting) == ("warning", "ledger.path")
        assert f"is on {fstype} ({source} at {point}), {words}" in warning.message
    table.write_text(f"1 0 0:1 / / rw - ext4 /dev/sda1 rw\n2 1 0:2 / {point} rw - tmpfs t rw\n")
    off = Settings.model_validate({"ledger": {"path": str(ledger)}})
    assert ledger_filesystem(off, table) == []


@pytest.mark.skipif(shutil.which("findmnt") is None, reason="needs util-linux findmnt")
def test_doctor_config_names_the_real_filesystem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``specwatch doctor --config`` with the ledger under a temporary directory names the type
    ``findmnt`` (util-linux, an independent reader of the same table) gives for it."""
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "targets": [
                    {"name": "std", "url": "http://127.0.0.1:1", "role": "standard"},
                    {"name": "fly", "url": "http://127.0.0.1:2", "role": "fly"},
                ],
                "shadow": {
                    "enabled": True,
                    "standard": {"url": "http://127.0.0.1:1"},
                    "fly": {"url": "http://127.0.0.1:2"},
                    "noise": {"url": "http://127.0.0.1:1"},
                },
                "ledger": {"path": str(tmp_path / "ledger.sqlite")},
            }
        )
    )
    fstype = subprocess.run(
        ["findmnt", "-n", "-o", "FSTYPE", "--target", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout.strip()
    main(["doctor", "--config", str(cfg), "--format", "json"])
    rows = json.loads(capsys.readouterr().out)
    [row] = [r for r in rows if r["check"] == "filesystem"]
    assert f"is on {fstype} (" in row["message"]


def _dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((REPO / "grafana" / "specwatch-alerts.json").read_text())
    return loaded


def _exported(dash: dict[str, Any]) -> dict[str, Any]:
    """``dash`` as Grafana's "Export for sharing externally" writes it: an ``__inputs`` entry
    for the data source and every panel's data source replaced by ``${DS_PROMETHEUS}``."""
    out = copy.deepcopy(dash)
    out["__inputs"] = [
        {
            "name": "DS_PROMETHEUS",
            "label": "Prometheus",
            "type": "datasource",
            "pluginId": "prometheus",
        }
    ]
    for panel in out.get("panels", []):
        panel["datasource"] = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
    return out


def test_dashboard_exported_for_sharing_warns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``doctor --dashboard`` (no Prometheus needed): the shipped dashboard is fit to
    provision; the same dashboard exported for sharing warns, naming ``${DS_PROMETHEUS}``."""
    shipped = tmp_path / "shipped.json"
    shipped.write_text(json.dumps(_dashboard()))
    exported = tmp_path / "exported.json"
    exported.write_text(json.dumps(_exported(_dashboard())))
    code = main(
        ["doctor", "--format", "table", "--dashboard", str(shipped), "--dashboard", str(exported)]
    )
    lines = [ln for ln in capsys.readouterr().out.splitlines() if " dashboard " in ln]
    title = _dashboard()["title"]
    assert code == 0
    assert len(lines) == 2
    assert lines[0].startswith("WARN")
    assert f"{title}: exported for sharing externally (__inputs, ${{DS_PROMETHEUS}})" in lines[0]
    assert lines[1].startswith("OK")
    assert "no import inputs" in lines[1]


def test_rule_range_under_four_scrape_intervals_warns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rules file read with the shipped PodMonitor (15 s interval: 4 x 15 = 60 s): a rule over
    ``[30s]`` warns, ``[1m]`` and the subquery ``[5m:10s]`` do not; the shipped rules pass."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        yaml.safe_dump(
            {
                "groups": [
                    {
                        "name": "mine",
                        "rules": [
                            {"record": "short", "expr": "rate(vllm:x_total[30s])"},
                            {"record": "fine", "expr": "rate(vllm:x_total[1m])"},
                            {"record": "sub", "expr": "max_over_time(rate(a[1m])[5m:10s])"},
                        ],
                    }
                ]
            }
        )
    )
    monitor = REPO / "deploy" / "base" / "podmonitor.yaml"
    code = main(["doctor", "--format", "table", "--rules", str(rules), "--manifest", str(monitor)])
    out = capsys.readouterr().out.splitlines()
    ranged = [ln for ln in out if "rule-range" in ln]
    assert code == 0
    assert len(ranged) == 1
    assert ranged[0].startswith("WARN")
    assert (
        "short in group mine: range [30s] is under 4 scrape intervals (15 s x 4 = 60 s)"
        in (ranged[0])
    )
    shipped = REPO / "deploy" / "mixin" / "specwatch.rules.yaml"
    main(["doctor", "--format", "table", "--rules", str(shipped), "--manifest", str(monitor)])
    ranged = [ln for ln in capsys.readouterr().out.splitlines() if "rule-range" in ln]
    assert len(ranged) == 1
    assert ranged[0].startswith("OK")


def test_native_sidecar_budget_after_vllm_exits() -> None:
    """Grace 30 s, vLLM exits 27 s in, the 10 s default budget: only 3 s remain for 10 + 0 + 1
    = 11 s; the message names both fixes (budget 2 s, grace 38 s). At 19 s it fits (30 - 19 =
    11). A regular container or an unknown exit time is not judged by this rule."""
    pod = PodSettings(
        termination_grace_period_seconds=30, container="native_sidecar", main_exit_seconds=27
    )
    [problem] = shutdown_fit(pod, budget=10, proxy=True)
    assert problem.setting == "server.shutdown_timeout_seconds"
    assert "(27 s into terminationGracePeriodSeconds 30 s): 3 s remain" in problem.message
    assert "lower it to 2 s or raise terminationGracePeriodSeconds to 38 s" in problem.message
    fits = pod.model_copy(update={"main_exit_seconds": 19})
    assert shutdown_fit(fits, budget=10, proxy=True) == []
    unknown = pod.model_copy(update={"main_exit_seconds": None})
    assert shutdown_fit(unknown, budget=10, proxy=True) == []
    settings = Settings.model_validate(
        {
            "pod": {
                "termination_grace_period_seconds": 30,
                "container": "native_sidecar",
                "main_exit_seconds": 27,
            }
        }
    )
    [finding] = [f for f in check_settings(settings) if "native sidecar" in f.message]
    assert (finding.level, finding.setting) == ("warning", "server.shutdown_timeout_seconds")


def _sidecar_pod(vllm_pre_stop: dict[str, Any]) -> dict[str, Any]:
    return {
        "terminationGracePeriodSeconds": 30,
        "initContainers": [
            {"name": "specwatch", "image": "ghcr.io/specwatch/specwatch", "restartPolicy": "Always"}
        ],
        "containers": [
            {"name": "vllm-standard", "image": "vllm/vllm-openai"},
            {
                "name": "vllm-fly",
                "image": "vllm/vllm-openai",
                "lifecycle": {"preStop": vllm_pre_stop},
            },
        ],
    }


@pytest.mark.parametrize(
    "hook",
    [{"sleep": {"seconds": 27}}, {"exec": {"command": ["/bin/sh", "-c", "sleep 27"]}}],
    ids=["sleep_action", "exec_sleep"],
)
def test_doctor_manifest_native_sidecar_warns(hook: dict[str, Any]) -> None:
    """A pod whose vLLM container holds 27 s in preStop (a sleep action or ``sh -c 'sleep
    27'``) with specwatch as a native sidecar at the default budget: a warning with the 3 s
    left; with a 15 s preStop it is OK (15 s left)."""
    [(status, check, message)] = native_sidecar_findings([("Deployment p", _sidecar_pod(hook))])
    assert (status, check) == ("warn", "shutdown")
    assert "Deployment p: server.shutdown_timeout_seconds: as a native sidecar" in message
    assert "3 s remain" in message
    short = _sidecar_pod({"sleep": {"seconds": 15}})
    [(status, _, message)] = native_sidecar_findings([("Deployment p", short)])
    assert status == "ok"
    assert "15 s left" in message


def test_unreachable_alertmanager_names_the_setting_to_change() -> None:
    """An Alertmanager whose status cannot be read (the shipped address in a cluster without
    kube-prometheus-stack in ``monitoring``) is a warning that names where the address is set
    and what happens meanwhile (the rules page)."""
    url = (
        "http://alertmanager-kube-prometheus-stack-alertmanager-0"
        ".alertmanager-operated.monitoring.svc:9093"
    )
    ((level, check, text),) = alertmanager_peer_findings(
        [url], {url: "ClientConnectorDNSError: Cannot connect to host"}
    )
    assert (level, check) == ("warn", "alertmanager")
    assert "alerting.urls of config.yaml or SPECWATCH_ALERTING__URLS" in text
    assert "specwatch_alertmanager_delivering is 0 and the Prometheus rules page" in text
