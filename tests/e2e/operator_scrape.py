"""Prometheus scrape configurations derived from rendered PodMonitor / ServiceMonitor objects the
way prometheus-operator derives them, for pods and services that run on 127.0.0.1 (pure).

prometheus-operator turns each endpoint of a monitor into one scrape job whose relabelings, in
order: keep the targets whose container port (PodMonitor ``port``) or Service port (ServiceMonitor
``port``; ``targetPort`` by number) has the endpoint's name, set ``namespace``, ``container``,
``pod`` (and ``service`` for a ServiceMonitor) from the Kubernetes meta labels, set ``job`` (a
PodMonitor's ``<namespace>/<name>``, a ServiceMonitor's Service name, or the ``jobLabel`` value)
and ``endpoint`` (the port's name), then apply the endpoint's own ``relabelings``;
``honorLabels`` becomes ``honor_labels``. Here the Kubernetes service discovery is replaced by
static targets that carry the same ``__meta_kubernetes_*`` labels, and Prometheus itself runs the
relabelings, so the target labels are the ones a cluster would get.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]

#: The relabel config fields prometheus-operator renames from camelCase.
_RELABEL_FIELDS = {
    "sourceLabels": "source_labels",
    "separator": "separator",
    "targetLabel": "target_label",
    "regex": "regex",
    "modulus": "modulus",
    "replacement": "replacement",
    "action": "action",
}


@dataclass(frozen=True)
class Port:
    """One container port as the pod declares it, and where it listens here."""

    container: str
    name: str
    number: int
    address: str


@dataclass(frozen=True)
class Pod:
    """One pod: name, namespace, labels, its container ports, and the Service (name, labels,
    port name → target port number) in front of it, if any."""

    name: str
    namespace: str
    labels: Mapping[str, str]
    ports: Sequence[Port]
    service: str = ""
    service_labels: Mapping[str, str] = field(default_factory=dict)
    service_ports: Mapping[str, int] = field(default_factory=dict)


def _sanitize(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _relabel(raw: Obj) -> Obj:
    return {_RELABEL_FIELDS[k]: v for k, v in raw.items() if k in _RELABEL_FIELDS}


def _meta(pod: Pod, port: Port) -> dict[str, str]:
    labels = {
        "__meta_kubernetes_namespace": pod.namespace,
        "__meta_kubernetes_pod_name": pod.name,
        "__meta_kubernetes_pod_container_name": port.container,
        "__meta_kubernetes_pod_container_port_name": port.name,
        "__meta_kubernetes_pod_container_port_number": str(port.number),
    }
    labels.update({f"__meta_kubernetes_pod_label_{_sanitize(k)}": v for k, v in pod.labels.items()})
    if pod.service:
        labels["__meta_kubernetes_service_name"] = pod.service
        labels.update(
            {
                f"__meta_kubernetes_service_label_{_sanitize(k)}": v
                for k, v in pod.service_labels.items()
            }
        )
        for svc_port, number in pod.service_ports.items():
            if number == port.number:
                labels["__meta_kubernetes_endpoint_port_name"] = svc_port
                break
    return labels


def _matches(selector: Obj, labels: Mapping[str, str]) -> bool:
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions", []):
        have = labels.get(expr["key"])
        op = expr["operator"]
        if op == "In" and have not in expr["values"]:
            return False
        if op == "NotIn" and have in expr["values"]:
            return False
        if op == "Exists" and have is None:
            return False
    return True


def _job(endpoint: Obj, index: int, kind: str, monitor: Obj) -> Obj:
    meta = monitor["metadata"]
    job: Obj = {
        "job_name": f"{kind}/{meta['namespace']}/{meta['name']}/{index}",
        "honor_labels": bool(endpoint.get("honorLabels", False)),
        "metrics_path": endpoint.get("path", "/metrics"),
        "static_configs": [],
    }
    return job


def scrape_configs(monitor: Obj, pods: Sequence[Pod], *, interval: str) -> list[Obj]:
    """The scrape jobs prometheus-operator generates for ``monitor`` (a PodMonitor or
    ServiceMonitor object) over ``pods``, every endpoint scraped every ``interval``."""
    kind = monitor["kind"]
    spec = monitor["spec"]
    ns = monitor["metadata"]["namespace"]
    endpoints = spec["podMetricsEndpoints"] if kind == "PodMonitor" else spec["endpoints"]
    out: list[Obj] = []
    for i, ep in enumerate(endpoints):
        job = _job(ep, i, "podMonitor" if kind == "PodMonitor" else "serviceMonitor", monitor)
        job["scrape_interval"] = interval
        job["scrape_timeout"] = interval
        for pod in pods:
            if pod.namespace != ns:
                continue
            selected = pod.labels if kind == "PodMonitor" else pod.service_labels
            if kind == "ServiceMonitor" and not pod.service:
                continue
            if not _matches(spec["selector"], selected):
                continue
            for port in pod.ports:
                job["static_configs"].append(
                    {"targets": [port.address], "labels": _meta(pod, port)}
                )
        relabel: list[Obj] = []
        if kind == "PodMonitor":
            relabel.append(
                {
                    "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                    "regex": ep["port"],
                    "action": "keep",
                }
            )
        elif "port" in ep:
            relabel.append(
                {
                    "source_labels": ["__meta_kubernetes_endpoint_port_name"],
                    "regex": ep["port"],
                    "action": "keep",
                }
            )
        else:
            relabel.append(
                {
                    "source_labels": ["__meta_kubernetes_pod_container_port_number"],
                    "regex": str(ep["targetPort"]),
                    "action": "keep",
                }
            )
        for label, meta in (
            ("namespace", "namespace"),
            ("container", "pod_container_name"),
            ("pod", "pod_name"),
        ):
            relabel.append({"source_labels": [f"__meta_kubernetes_{meta}"], "target_label": label})
        if kind == "PodMonitor":
            relabel.append(
                {"target_label": "job", "replacement": f"{ns}/{monitor['metadata']['name']}"}
            )
            if spec.get("jobLabel"):
                relabel.append(
                    {
                        "source_labels": [
                            f"__meta_kubernetes_pod_label_{_sanitize(spec['jobLabel'])}"
                        ],
                        "target_label": "job",
                        "regex": "(.+)",
                    }
                )
            relabel.append({"target_label": "endpoint", "replacement": ep["port"]})
        else:
            relabel.append(
                {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"}
            )
            relabel.append(
                {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"}
            )
            if spec.get("jobLabel"):
                relabel.append(
                    {
                        "source_labels": [
                            f"__meta_kubernetes_service_label_{_sanitize(spec['jobLabel'])}"
                        ],
                        "target_label": "job",
                        "regex": "(.+)",
                    }
                )
            relabel.append(
                {
                    "target_label": "endpoint",
                    "replacement": str(ep.get("port", ep.get("targetPort"))),
                }
            )
        relabel += [_relabel(r) for r in ep.get("relabelings", [])]
        job["relabel_configs"] = relabel
        if ep.get("metricRelabelings"):
            job["metric_relabel_configs"] = [_relabel(r) for r in ep["metricRelabelings"]]
        if job["static_configs"]:
            out.append(job)
    return out


def container_ports(deployment: Obj) -> dict[str, list[tuple[str, int]]]:
    """Container name → its ``(port name, container port)`` pairs, from a Deployment."""
    return {
        c["name"]: [(p["name"], int(p["containerPort"])) for p in c.get("ports", [])]
        for c in deployment["spec"]["template"]["spec"]["containers"]
    }
