"""Every port the README and docs/ name is checked against the settings: the sidecar's port is
``Settings().server.port``, the shadow proxy's ``shadow.proxy_listen_port``, a vLLM server's
(real or ``specwatch simulate``) is in 8000..8099 (``simulate``'s default is 8000), Alertmanager
9093, Prometheus 9090, Grafana 3000; the free ports in docs/demo.md's example output are
ephemeral and that page says the printed ports may differ."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from specwatch.cli.simulate import add_parser as add_simulate
from specwatch.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
HOST_PORT = re.compile(r"(?<![\w/.-])([A-Za-z0-9.<>_\[\]-]+):(\d{2,5})\b")
FORWARD = re.compile(r"port-forward \S+ (\d+)(?::(\d+))?")
SIDECAR_HOSTS = re.compile(r"^(specwatch|sw-[\w-]+)$")
OTHERS = {9093: "alertmanager", 9090: "prometheus", 3000: "grafana"}


def _simulate_default_port() -> int:
    parser = argparse.ArgumentParser()
    add_simulate(parser.add_subparsers())
    ns = parser.parse_args(["simulate", "--role", "fly"])
    return int(ns.port)


def _ports() -> list[tuple[str, str, int]]:
    found: list[tuple[str, str, int]] = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for m in HOST_PORT.finditer(text):
            found.append((path.name, m.group(1), int(m.group(2))))
        for m in FORWARD.finditer(text):
            found += [(path.name, "port-forward", int(p)) for p in m.groups() if p]
    return found


def test_every_documented_port_matches_the_settings() -> None:
    """Each (file, host, port): sidecar hosts and 94xx ports are the configured ones, vLLM
    ports sit next to simulate's default, the rest are the well-known peers' ports; only
    docs/demo.md may show ephemeral (>= 32768) ports, as example output."""
    s = Settings()
    sidecar = {s.server.port, s.shadow.proxy_listen_port}
    assert s.server.port == 9400
    vllm = range(_simulate_default_port(), _simulate_default_port() + 100)
    ports = _ports()
    assert len(ports) >= 20  # the scan finds the docs' ports at all
    wrong = []
    for name, host, port in ports:
        if SIDECAR_HOSTS.match(host) or 9400 <= port < 9500:
            ok = port in sidecar
        elif port >= 32768:
            ok = name == "demo.md"
        else:
            ok = port in vllm or (port in OTHERS and OTHERS[port] in host.lower())
        if not ok:
            wrong.append((name, host, port))
    assert wrong == []


def test_demo_doc_says_its_ports_may_differ() -> None:
    """docs/demo.md shows example ports; it says the demo prints the ones it actually used."""
    text = (ROOT / "docs" / "demo.md").read_text(encoding="utf-8")
    assert "may differ" in text
    assert "prints the port it actually" in text
