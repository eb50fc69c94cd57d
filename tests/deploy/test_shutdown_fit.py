"""The shipped Deployments tell specwatch their termination grace period and container order
(``SPECWATCH_POD__*`` env), equal to the pod spec they sit in, and the shutdown budget the
rendered settings give fits it (no start-up warning), for ``deploy/base`` (sidecar beside the
vLLM containers) and ``deploy/standalone`` (a pod of its own)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, cast

import pytest

from specwatch.server.checks import shutdown_findings
from specwatch.settings import Settings, load_settings
from tests.deploy.test_manifests import BASE, kustomize_build, one, read_env_file, settings_field

STANDALONE = BASE.parent / "standalone"

Obj = dict[str, Any]


def _specwatch(pod: Obj) -> tuple[Obj, str]:
    """specwatch's container in ``pod`` and its order, worked out from the spec:
    ``native_sidecar`` (an init container restarting Always), ``standalone`` (no other
    container) or ``container``."""
    init = [c for c in pod.get("initContainers", []) if c["name"] == "specwatch"]
    if init:
        assert init[0].get("restartPolicy") == "Always"
        return cast(Obj, init[0]), "native_sidecar"
    [sw] = [c for c in pod["containers"] if c["name"] == "specwatch"]
    return cast(Obj, sw), "standalone" if len(pod["containers"]) == 1 else "container"


def _settings(objs: list[Obj], tmp: Path) -> Settings:
    """What the sidecar loads: the rendered config.yaml, the env file and the container env."""
    [cm] = [
        o
        for o in objs
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("specwatch-config")
    ]
    path = tmp / "config.yaml"
    path.write_text(cm["data"]["config.yaml"], encoding="utf-8")
    return load_settings(config_file=path)


@pytest.mark.kubectl
@pytest.mark.parametrize("layout", [BASE, STANDALONE], ids=["base", "standalone"])
def test_the_pod_env_matches_the_pod_and_the_budget_fits(
    layout: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``SPECWATCH_POD__TERMINATION_GRACE_PERIOD_SECONDS`` equals the rendered
    ``terminationGracePeriodSeconds``, ``SPECWATCH_POD__CONTAINER`` the container order, both
    name real settings, and the loaded settings give no shutdown-budget warning."""
    objs = kustomize_build(layout)
    pod = cast(Obj, one(objs, "Deployment")["spec"]["template"]["spec"])
    sw, order = _specwatch(pod)
    env = {e["name"]: e["value"] for e in sw.get("env", []) if "value" in e}
    pod_env = {k: v for k, v in env.items() if k.startswith("SPECWATCH_POD__")}
    assert set(pod_env) == {
        "SPECWATCH_POD__TERMINATION_GRACE_PERIOD_SECONDS",
        "SPECWATCH_POD__CONTAINER",
    }
    for key in pod_env:
        assert settings_field(key)[0] == "pod"
    assert float(pod_env["SPECWATCH_POD__TERMINATION_GRACE_PERIOD_SECONDS"]) == float(
        pod["terminationGracePeriodSeconds"]
    )
    assert pod_env["SPECWATCH_POD__CONTAINER"] == order
    for key in [k for k in list(os.environ) if k.startswith("SPECWATCH_")]:
        monkeypatch.delenv(key)
    env_file = layout / "specwatch.env"
    for key, value in {**(read_env_file(env_file) if env_file.exists() else {}), **env}.items():
        if key.startswith("SPECWATCH_"):
            monkeypatch.setenv(key, value)
    s = _settings(objs, tmp_path)
    assert s.pod.termination_grace_period_seconds == pod["terminationGracePeriodSeconds"]
    assert s.pod.container == order
    assert shutdown_findings(s) == []
