"""``specwatch doctor``'s checks on the operator's own manifests: monitor port names that resolve
to nothing, and a ledger volume that a new pod does not keep."""

from __future__ import annotations

import copy
from typing import Any

from specwatch.tools.doctor.command import Finding, check_ledger_volume, check_ports
from tests.deploy.test_manifests import kustomize_build
from tests.fakes import REPO

Obj = dict[str, Any]


def _base() -> list[Obj]:
    return kustomize_build(REPO / "deploy" / "base")


def test_shipped_port_names_resolve() -> None:
    """The shipped PodMonitor's three endpoints name container ports of the vllm-pair pod."""
    got = check_ports(_base())
    assert [(f.status, f.message) for f in got] == [
        ("ok", f"PodMonitor vllm-pair port {p!r} names a container port")
        for p in ("specwatch", "std-http", "fly-http")
    ]


def test_renamed_port_is_a_failure_naming_the_ports_there() -> None:
    """A container port renamed (``fly-http`` → ``http``) leaves the PodMonitor endpoint
    selecting nothing: one FAIL naming the port and the ports that exist."""
    objs = copy.deepcopy(_base())
    (dep,) = [o for o in objs if o["kind"] == "Deployment"]
    for c in dep["spec"]["template"]["spec"]["containers"]:
        for p in c.get("ports", []):
            if p["name"] == "fly-http":
                p["name"] = "http"
    fails = [f for f in check_ports(objs) if f.status == "fail"]
    assert fails == [
        Finding(
            "fail",
            "ports",
            "PodMonitor vllm-pair port 'fly-http' names no container port of what it selects "
            "(there: http, specwatch, std-http, sw-mirror, sw-proxy): nothing is scraped there",
        )
    ]


def test_standalone_service_port_resolves() -> None:
    """The standalone ServiceMonitor for specwatch names the Service's ``http-specwatch``; the
    vLLM one (``targetPort`` by number, Services not in the files) is not judged."""
    got = check_ports(kustomize_build(REPO / "deploy" / "standalone"))
    assert [(f.status, f.message) for f in got] == [
        ("ok", "ServiceMonitor specwatch port 'http-specwatch' names a Service port")
    ]


def test_ledger_on_empty_dir_is_a_warning() -> None:
    """The shipped base keeps the ledger on the ``specwatch-state`` emptyDir: one WARN; the same
    mount on a PersistentVolumeClaim is OK."""
    objs = _base()
    assert check_ledger_volume(objs) == [
        Finding(
            "warn",
            "ledger",
            "Deployment vllm-pair keeps the ledger (/var/lib/specwatch) on emptyDir "
            "'specwatch-state': a new pod starts with no pairs; mount a PersistentVolumeClaim "
            "there to keep them",
        )
    ]
    objs = copy.deepcopy(objs)
    (dep,) = [o for o in objs if o["kind"] == "Deployment"]
    for v in dep["spec"]["template"]["spec"]["volumes"]:
        if v["name"] == "specwatch-state":
            v.pop("emptyDir")
            v["persistentVolumeClaim"] = {"claimName": "specwatch-ledger"}
    assert [f.status for f in check_ledger_volume(objs)] == ["ok"]
