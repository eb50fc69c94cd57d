"""The mixin on every jsonnet a user may have: go-jsonnet renders it identically to PyPI's C++
jsonnet (the one ``render.py`` uses), and a ``jsonnet`` command on PATH either renders it
identically (>= 0.20) or, older (Debian 12 ships 0.18), stops with the mixin's own message naming
the minimum version, never with a half-rendered rule file."""

from __future__ import annotations

import importlib
import json
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

from deploy.mixin import render
from tests.fakes import REPO

SNIPPET = (
    "local m = import 'specwatch/deploy/mixin/mixin.libsonnet';\n"
    "{ prometheusRules: m.prometheusRules, prometheusAlerts: m.prometheusAlerts,\n"
    "  grafanaDashboards: m.grafanaDashboards }\n"
)


def reference() -> dict[str, object]:
    """The wheel's render of the checked-in mixin (what render.py writes)."""
    out = render.evaluate_mixin(thresholds=render.threshold_values())
    return {k: out[k] for k in ("prometheusRules", "prometheusAlerts", "grafanaDashboards")}


def vendored(tmp: Path) -> Path:
    """The repository laid out as jsonnet-bundler vendors it (vendor/specwatch/...)."""
    root = tmp / "vendor" / "specwatch"
    root.mkdir(parents=True)
    for part in ("deploy", "grafana"):
        (root / part).symlink_to(REPO / part)
    return tmp / "vendor"


def go_jsonnet() -> ModuleType:
    try:
        return importlib.import_module("_gojsonnet")
    except ImportError:
        pytest.skip("go-jsonnet (the gojsonnet wheel) is not installed")


def test_go_jsonnet_renders_what_the_wheel_renders(monkeypatch: pytest.MonkeyPatch) -> None:
    """go-jsonnet (the gojsonnet wheel) evaluates render.py's snippet to the same rules and
    dashboards as the C++ wheel."""
    want = reference()
    monkeypatch.setattr(render, "_jsonnet", go_jsonnet())
    got = render.evaluate_mixin(thresholds=render.threshold_values())
    assert {k: got[k] for k in want} == want


def test_a_jsonnet_command_renders_it_or_names_the_minimum(tmp_path: Path) -> None:
    """A `jsonnet` on PATH renders the vendored mixin as the wheel does (>= 0.20), or stops
    with the mixin's message naming 0.20 and writes nothing (Debian 12's 0.18)."""
    binary = shutil.which("jsonnet")
    if binary is None:
        pytest.skip("no jsonnet command on PATH (apt install jsonnet)")
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    m = re.search(r"v(\d+)\.(\d+)", version.stdout + version.stderr)
    assert m is not None, version
    run = subprocess.run(
        [binary, "-J", str(vendored(tmp_path)), "-e", SNIPPET],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    if (int(m[1]), int(m[2])) < (0, 20):
        assert run.returncode != 0
        assert "the specwatch mixin needs jsonnet >= 0.20" in run.stderr, run.stderr
        assert run.stdout == ""
    else:
        assert run.returncode == 0, run.stderr
        got = json.loads(run.stdout)
        want = reference()
        # the thresholds file is checked in as render.py writes it, so the two agree
        assert got == want
