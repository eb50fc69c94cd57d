"""deploy/standalone: specwatch in its own Deployment beside vLLM Services it scrapes by URL.

Rendered with ``kubectl kustomize``; built-in kinds validated with ``kubernetes-validate``
(strict) and the ServiceMonitor and PrometheusRule against the prometheus-operator CRD schemas,
as ``tests/deploy/test_manifests.py`` does for the in-pod deployment. Agreement with specwatch
itself uses the real settings loader on the generated ConfigMap's ``config.yaml``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from specwatch.settings import Settings, load_settings
from tests.deploy.test_manifests import (
    by_kind,
    kustomize_build,
    missing_references,
    one,
    validation_errors,
)

ROOT = Path(__file__).resolve().parents[2]
STANDALONE = ROOT / "deploy" / "standalone"
README = STANDALONE / "README.md"

Obj = dict[str, Any]


@pytest.fixture(scope="module")
def objs() -> list[Obj]:
    return kustomize_build(STANDALONE)


@pytest.fixture(scope="module")
def config(objs: list[Obj], tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """The settings specwatch loads from the rendered ConfigMap's config.yaml."""
    (cm,) = [
        o
        for o in by_kind(objs, "ConfigMap")
        if o["metadata"]["name"].startswith("specwatch-config")
    ]
    path = tmp_path_factory.mktemp("standalone") / "config.yaml"
    path.write_text(cm["data"]["config.yaml"], encoding="utf-8")
    return load_settings(config_file=path)


def test_references_resolve() -> None:
    """Every file the kustomization names exists under it (or is the mixin directory)."""
    assert missing_references(STANDALONE) == []


def test_renders_the_expected_objects(objs: list[Obj]) -> None:
    """Deployment, Service, two ServiceMonitors, the PrometheusRule and the dashboards, all in
    one namespace; no PodMonitor (nothing shares a pod with vLLM here)."""
    kinds = sorted({o["kind"] for o in objs})
    assert kinds == ["ConfigMap", "Deployment", "PrometheusRule", "Service", "ServiceMonitor"]
    assert {o["metadata"]["name"] for o in by_kind(objs, "ServiceMonitor")} == {
        "specwatch",
        "specwatch-vllm",
    }
    assert {o["metadata"]["namespace"] for o in objs} == {"llm-serving"}


def test_every_object_validates(objs: list[Obj]) -> None:
    """Strict validation of every rendered object (unknown fields are errors)."""
    for obj in objs:
        assert validation_errors(obj) == [], (obj["kind"], obj["metadata"]["name"])


def test_release_label_on_every_selected_object(objs: list[Obj]) -> None:
    """The release-label trap is handled: every ServiceMonitor and the PrometheusRule carry the
    same ``release`` label kube-prometheus-stack selects by, and the README says how to set it."""
    monitored = by_kind(objs, "ServiceMonitor") + by_kind(objs, "PrometheusRule")
    assert len(monitored) == 3
    assert {o["metadata"]["labels"].get("release") for o in monitored} == {"kube-prometheus-stack"}
    text = README.read_text(encoding="utf-8")
    assert "serviceMonitorSelector" in text
    assert "ruleSelector" in text


def test_specwatch_scrapes_services_by_url(config: Settings) -> None:
    """Targets and both arms are cluster Service URLs (never 127.0.0.1: not the same pod), the
    arms name the targets, and the listener is the default port."""
    assert [t.name for t in config.targets] == ["standard", "fly"]
    assert [str(t.role) for t in config.targets] == ["standard", "fly"]
    standard, fly = config.shadow.standard, config.shadow.fly
    assert standard is not None
    assert fly is not None
    for url in [t.url for t in config.targets] + [standard.url, fly.url]:
        host = urlsplit(str(url)).hostname or ""
        assert host.endswith(".svc"), url

    def netloc(url: object) -> str:
        return urlsplit(str(url)).netloc

    assert netloc(standard.url) == netloc(config.targets[0].url)
    assert netloc(fly.url) == netloc(config.targets[1].url)
    assert config.server.port == Settings().server.port


def test_service_monitor_reaches_specwatch(objs: list[Obj], config: Settings) -> None:
    """The specwatch ServiceMonitor selects the Service's labels and names a port the Service
    has, which targets the container port specwatch listens on. It honours specwatch's labels
    (its series carry their own role, target and model_name) and only adds ``model_name``, never
    ``role``."""
    monitor = one(objs, "ServiceMonitor", "specwatch")
    service = one(objs, "Service", "specwatch")
    deployment = one(objs, "Deployment", "specwatch")
    labels = service["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (endpoint,) = monitor["spec"]["endpoints"]
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    container_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert container_ports[port["targetPort"]] == port["port"] == config.server.port
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert endpoint["honorLabels"] is True
    assert [r["targetLabel"] for r in endpoint["relabelings"]] == ["model_name"]


def test_service_reaches_the_mirror_listener(objs: list[Obj], config: Settings) -> None:
    """Mirrored copies sent to the Service reach the mirror listener: the Service has a port
    whose target is the container port specwatch's mirror listener binds (9402, its own port,
    never the /metrics port 9477, where a copy would get 404)."""
    service = one(objs, "Service", "specwatch")
    deployment = one(objs, "Deployment", "specwatch")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    container_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert "mirror" in config.shadow.modes
    assert config.shadow.mirror_listen_port == 9402
    served = {container_ports[p["targetPort"]]: p["port"] for p in service["spec"]["ports"]}
    assert served == {9477: 9477, 9402: 9402}


def test_vllm_service_monitor_sets_role(objs: list[Obj]) -> None:
    """vLLM Services labelled specwatch.io/role are scraped with that value as ``role``."""
    monitor = one(objs, "ServiceMonitor", "specwatch-vllm")
    (expr,) = monitor["spec"]["selector"]["matchExpressions"]
    assert expr == {"key": "specwatch.io/role", "operator": "In", "values": ["standard", "fly"]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["relabelings"] == [
        {
            "sourceLabels": ["__meta_kubernetes_service_label_specwatch_io_role"],
            "targetLabel": "role",
        }
    ]


def test_single_writer_and_probes(objs: list[Obj]) -> None:
    """One replica recreated (one writer of the SQLite ledger), liveness on /healthz and
    readiness on /readyz of the named port, a read-only root and a writable ledger volume."""
    deployment = one(objs, "Deployment", "specwatch")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "specwatch"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "specwatch"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/var/lib/specwatch", "/tmp", "/etc/specwatch"} <= mounts
    cm = yaml.safe_load(
        next(o for o in by_kind(objs, "ConfigMap") if "config.yaml" in o.get("data", {}))["data"][
            "config.yaml"
        ]
    )
    assert cm["ledger"]["path"].startswith("/var/lib/specwatch/")
