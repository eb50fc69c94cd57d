"""Ports: the defaults collide with no exporter a GPU node runs, and every doc and manifest that
names a specwatch port names the one in the settings.

The listener default is ``specwatch.settings.ServerSettings().port``; the streaming proxy's is
``specwatch.shadow.settings.ShadowSettings().proxy_listen_port`` and the mirror listener's
``mirror_listen_port``. Each place that names one (the README, docs, deploy manifests, the
Dockerfile, the example overlay) is matched by a pattern that says which of the three it is
(``specwatch:N`` on a line that says "mirror" is the mirror port), and every match must equal
the settings; the old default 9400 (NVIDIA dcgm-exporter's) must appear nowhere.
"""

from __future__ import annotations

import re

import yaml

from specwatch.settings import Settings
from specwatch.shadow.settings import ShadowSettings
from tests.fakes import REPO

ROOT = REPO
PORT = Settings().server.port
PROXY_PORT = ShadowSettings().proxy_listen_port
MIRROR_PORT = ShadowSettings().mirror_listen_port

#: Ports that services on a GPU node of a vLLM cluster listen on by default (host network or a
#: pod a Service points at): vLLM and production-stack's router, Ray, the kubelet,
#: node-exporter, dcgm-exporter, the NVIDIA GPU exporters, process-exporter, cAdvisor,
#: Prometheus, Alertmanager, Pushgateway, Grafana, OpenTelemetry's Prometheus exporter,
#: kube-state-metrics, ingress-nginx.
GPU_NODE_PORTS = {
    8000: "vLLM OpenAI server",
    8001: "second vLLM server / production-stack engine",
    8080: "production-stack router, cAdvisor",
    8265: "Ray dashboard",
    3000: "Grafana",
    9090: "Prometheus",
    9091: "Pushgateway",
    9093: "Alertmanager",
    9094: "Alertmanager cluster",
    9100: "node-exporter",
    9256: "process-exporter",
    9400: "NVIDIA dcgm-exporter",
    9445: "nvidia_gpu_prometheus_exporter",
    9464: "OpenTelemetry Prometheus exporter",
    9835: "nvidia_gpu_exporter",
    10250: "kubelet",
    10254: "ingress-nginx metrics",
    8443: "kube-state-metrics / webhooks",
}

#: Files that name specwatch's ports.
FILES = [
    ROOT / "README.md",
    ROOT / "Dockerfile",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "deploy").rglob("*.md")),
    *sorted((ROOT / "deploy").rglob("*.yaml")),
    *sorted((ROOT / "deploy").rglob("*.env")),
]

#: (pattern, which port its first group names)
PATTERNS = [
    (r"(?:localhost|127\.0\.0\.1|HOST):(\d+)/(?:api/v1|readyz|healthz)", PORT),
    (r"(?:localhost|127\.0\.0\.1|HOST):(\d+)/metrics[^\n]*(?:specwatch|metrics\.txt)", PORT),
    (r"sidecar on http://127\.0\.0\.1:(\d+)", PORT),
    (r"port-forward [^\n]* (\d+)(?::\d+)? &[^\n]*specwatch", PORT),
    (r"port-forward deploy/vllm-pair (\d+)", PORT),
    (r"SPECWATCH_SERVER__PORT[=', ]+(\d+)", PORT),
    (r"(?m)^(?!.*\bmirror).*?specwatch:(\d+)(?![\d.])", PORT),
    (r"(?m)^(?=.*\bmirror).*?specwatch:(\d+)(?![\d.])", MIRROR_PORT),
    (r"EXPOSE (\d+)", PORT),
    (r"EXPOSE \d+ (\d+)", PROXY_PORT),
    (r"`specwatch` \| (\d+) \(`specwatch`\)", PORT),
    (r"`specwatch` \| (\d+) \(`sw-proxy`\)", PROXY_PORT),
    (r"`specwatch` \| (\d+) \(`sw-mirror`\)", MIRROR_PORT),
]


def test_defaults_avoid_gpu_node_ports() -> None:
    """Neither default is a port a GPU node's usual services listen on (9400 is dcgm-exporter's)."""
    assert PORT == 9477
    assert PORT not in GPU_NODE_PORTS, GPU_NODE_PORTS.get(PORT)
    assert PROXY_PORT not in GPU_NODE_PORTS, GPU_NODE_PORTS.get(PROXY_PORT)
    assert MIRROR_PORT not in GPU_NODE_PORTS, GPU_NODE_PORTS.get(MIRROR_PORT)
    assert len({PORT, PROXY_PORT, MIRROR_PORT}) == 3


def test_every_named_port_is_the_setting() -> None:
    """Each port a doc, manifest or the Dockerfile names for specwatch equals the settings."""
    seen = 0
    for path in FILES:
        text = path.read_text(encoding="utf-8")
        for pattern, want in PATTERNS:
            for m in re.finditer(pattern, text):
                assert int(m.group(1)) == want, f"{path.relative_to(ROOT)}: {m.group(0)!r}"
                seen += 1
    assert seen >= 20


def test_no_file_names_the_old_default() -> None:
    """9400 (dcgm-exporter) is named nowhere, except on a line that says it is dcgm-exporter's."""
    for path in [*FILES, *sorted((ROOT / "grafana").glob("*.json"))]:
        for line in path.read_text(encoding="utf-8").splitlines():
            if re.search(r"\b9400\b", line):
                assert "dcgm-exporter" in line, f"{path.relative_to(ROOT)}: {line}"


def test_manifests_use_the_settings_ports() -> None:
    """containerPort, Service port/targetPort and the config file's server.port are the defaults."""
    ports: list[tuple[str, int]] = []
    for path in sorted((ROOT / "deploy").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if not isinstance(doc, dict):
                continue
            if doc.get("server", {}).get("port") is not None:
                ports.append(("specwatch", doc["server"]["port"]))
            spec = doc.get("spec", {}) if isinstance(doc.get("spec"), dict) else {}
            for c in spec.get("template", {}).get("spec", {}).get("containers", []):
                if c.get("name") == "specwatch":
                    ports += [(p["name"], p["containerPort"]) for p in c.get("ports", [])]
            if doc.get("kind") == "Service":
                ports += [(p["name"], p["port"]) for p in spec.get("ports", [])]
    wanted = {"specwatch": PORT, "sw-proxy": PROXY_PORT, "sw-mirror": MIRROR_PORT}
    checked = [(name, port) for name, port in ports if name in wanted]
    assert checked
    for name, port in checked:
        assert port == wanted[name], (name, port)
