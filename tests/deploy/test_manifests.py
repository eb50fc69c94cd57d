"""Kubernetes manifests under deploy/ and grafana/: they render, validate and agree with each other.

Built-in kinds are validated with ``kubernetes-validate`` (strict: unknown fields are errors)
against Kubernetes 1.34, the first release with Dynamic Resource Allocation at
``resource.k8s.io/v1``.
Custom resources (PodMonitor, PrometheusRule, VirtualService, HTTPRoute) are validated against the
CRDs' own OpenAPI schemas, committed under ``tests/deploy/schemas/`` (see its README for sources).
Kustomizations are rendered with ``kubectl kustomize`` (kustomize built into kubectl).
Agreement with specwatch itself uses the real code: ``specwatch.settings.load_settings`` on the
ConfigMap's config.yaml plus the env file, and the routes of ``specwatch.server.app.build_app``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import jsonschema
import kubernetes_validate
import pytest
import yaml
from pydantic import BaseModel

from specwatch.server.app import build_app
from specwatch.settings import Settings, load_settings
from specwatch.shadow.settings import ShadowSettings
from tests.fakes import REPO

ROOT = REPO
DEPLOY = ROOT / "deploy"
BASE = DEPLOY / "base"
OVERLAY = DEPLOY / "overlays" / "example"
GRAFANA = ROOT / "grafana"
MIXIN = DEPLOY / "mixin"
SCHEMAS = Path(__file__).resolve().parent / "schemas"

#: Oldest Kubernetes the manifests target (resource.k8s.io/v1 is GA from 1.34).
K8S_VERSION = "1.34.0"
SPECWATCH_PORT = 9477
MIRROR_PORT = ShadowSettings().mirror_listen_port
MIRROR_PATHS = {"/v1/completions", "/v1/chat/completions"}

Obj = dict[str, Any]

CRD_SCHEMAS: dict[tuple[str, str], str] = {
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitor-monitoring.coreos.com-v1.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule-monitoring.coreos.com-v1.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor-monitoring.coreos.com-v1.json",
    ("networking.istio.io/v1", "VirtualService"): "virtualservice-networking.istio.io-v1.json",
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): "httproute-gateway.networking.k8s.io-v1.json",
}


# ------------------------------------------------------------------------------------------------
# helpers: load, render, validate
# ------------------------------------------------------------------------------------------------


def load_yaml_docs(path: Path) -> list[Obj]:
    """All non-empty YAML documents of a file."""
    with path.open(encoding="utf-8") as fh:
        return [cast(Obj, doc) for doc in yaml.safe_load_all(fh) if doc]


def kustomize_build(path: Path) -> list[Obj]:
    """Render a kustomization with ``kubectl kustomize`` and return its objects."""
    kubectl = shutil.which("kubectl")
    assert kubectl is not None, "kubectl missing from PATH"
    proc = subprocess.run(
        [kubectl, "kustomize", str(path)], capture_output=True, text=True, check=False, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return [cast(Obj, doc) for doc in yaml.safe_load_all(proc.stdout) if doc]


def kustomization_references(directory: Path) -> Iterator[tuple[str, Path]]:
    """Every path a kustomization.yaml names: resources, generator files and env files."""
    kust = load_yaml_docs(directory / "kustomization.yaml")[0]
    for entry in kust.get("resources", []):
        yield "resource", directory / entry
    for gen in kust.get("configMapGenerator", []) + kust.get("secretGenerator", []):
        for entry in gen.get("files", []):
            yield "file", directory / entry.split("=", 1)[-1]
        for entry in gen.get("envs", []):
            yield "env", directory / entry


def missing_references(directory: Path) -> list[str]:
    """Names a kustomization refers to that do not exist, or dirs without a kustomization.yaml.

    Kustomize loads files only at or below the kustomization's directory; anything outside must
    be a directory with its own kustomization.yaml, so that is reported too.
    """
    problems = []
    for kind, path in kustomization_references(directory):
        shown = os.path.relpath(path.resolve(), directory.resolve())
        if kind == "resource" and path.is_dir():
            if not (path / "kustomization.yaml").exists():
                problems.append(f"{shown}: directory without kustomization.yaml")
        elif not path.is_file():
            problems.append(f"{kind} {shown}: missing")
        elif not path.resolve().is_relative_to(directory.resolve()):
            problems.append(f"{shown}: file outside the kustomization")
    return problems


def close_objects(schema: Any) -> Any:
    """Copy of a CRD schema where objects with ``properties`` reject unknown fields."""
    if isinstance(schema, list):
        return [close_objects(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: close_objects(value) for key, value in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields", False)
    ):
        out["additionalProperties"] = False
    return out


_CRD_VALIDATORS: dict[tuple[str, str], jsonschema.Draft7Validator] = {}


def crd_validator(api_version: str, kind: str) -> jsonschema.Draft7Validator:
    key = (api_version, kind)
    if key not in _CRD_VALIDATORS:
        raw = json.loads((SCHEMAS / CRD_SCHEMAS[key]).read_text(encoding="utf-8"))
        schema = close_objects(raw)
        # the API server owns metadata; the CRD schema only says "object"
        # and apiVersion/kind (some generated CRDs, e.g. Istio's, leave them out)
        schema["properties"]["metadata"] = {"type": "object"}
        schema["properties"]["apiVersion"] = {"const": api_version}
        schema["properties"]["kind"] = {"const": kind}
        _CRD_VALIDATORS[key] = jsonschema.Draft7Validator(schema)
    return _CRD_VALIDATORS[key]


def validation_errors(obj: Obj) -> list[str]:
    """Schema errors for one object (empty when valid); unknown kinds are an error."""
    key = (str(obj.get("apiVersion")), str(obj.get("kind")))
    if key in CRD_SCHEMAS:
        errors = sorted(crd_validator(*key).iter_errors(obj), key=lambda e: list(e.path))
        return [f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors]
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [str(exc).splitlines()[0]]
    except kubernetes_validate.SchemaNotFoundError:
        return [f"no schema for {key}"]
    return []


def by_kind(objs: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = [o for o in by_kind(objs, kind) if name is None or o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


@pytest.fixture(scope="module")
def base() -> list[Obj]:
    return kustomize_build(BASE)


@pytest.fixture(scope="module")
def pod_spec(base: list[Obj]) -> Obj:
    return cast(Obj, one(base, "Deployment")["spec"]["template"]["spec"])


def container(pod: Obj, name: str) -> Obj:
    found = [c for c in pod["containers"] if c["name"] == name]
    assert len(found) == 1, name
    return cast(Obj, found[0])


def vllm_flags(c: Obj) -> tuple[str, dict[str, str]]:
    """(model, {flag: value}) from a ``vllm serve MODEL --flag=value ...`` container."""
    assert c["command"] == ["vllm", "serve"]
    model, *rest = c["args"]
    flags: dict[str, str] = {}
    for arg in rest:
        name, sep, value = arg.partition("=")
        assert sep, f"use --flag=value form: {arg}"
        flags[name] = value.strip()
    return model, flags


def port_by_name(c: Obj) -> dict[str, int]:
    return {p["name"]: int(p["containerPort"]) for p in c.get("ports", [])}


# ------------------------------------------------------------------------------------------------
# rendering
# ------------------------------------------------------------------------------------------------


class TestKustomizationReferences:
    @pytest.mark.parametrize("directory", [BASE, GRAFANA, MIXIN], ids=["base", "grafana", "mixin"])
    def test_references_resolve(self, directory: Path) -> None:
        """Every resource, generator file and env file the kustomization names exists."""
        assert missing_references(directory) == []

    def test_overlay_references_resolve(self) -> None:
        """The example overlay's references exist, including deploy/mixin (rules and dashboards)."""
        assert missing_references(OVERLAY) == []

    def test_resolver_reports_a_file_outside_the_root(self, tmp_path: Path) -> None:
        """A file outside the kustomization directory is reported, as kustomize refuses it."""
        (tmp_path / "a").mkdir()
        (tmp_path / "x.yaml").write_text("kind: ConfigMap\n")
        (tmp_path / "a" / "kustomization.yaml").write_text("resources:\n  - ../x.yaml\n")
        assert missing_references(tmp_path / "a") == ["../x.yaml: file outside the kustomization"]


@pytest.mark.kubectl
class TestRender:
    def test_base_objects(self, base: list[Obj]) -> None:
        """The base renders the pod, its GPU claim template, Services, config and a PodMonitor."""
        kinds = sorted((o["kind"], o["metadata"]["name"].split("-")[0]) for o in base)
        assert kinds == [
            ("ConfigMap", "specwatch"),
            ("ConfigMap", "specwatch"),
            ("Deployment", "vllm"),
            ("NetworkPolicy", "vllm"),
            ("PodMonitor", "vllm"),
            ("ResourceClaimTemplate", "vllm"),
            ("Service", "specwatch"),
            ("Service", "vllm"),
        ]

    def test_podmonitor_sets_role_on_vllm_endpoints(self, base: list[Obj]) -> None:
        """The mixin groups vLLM series by ``role``: fixed per vLLM port, none on specwatch's,
        whose series carry their own; specwatch's endpoint honours its labels and adds
        ``model_name`` (the vLLM servers' --served-model-name) for the ledger series that have
        none, so ``specwatch fleet`` groups by model without an ``exported_model_name``."""
        endpoints = one(base, "PodMonitor")["spec"]["podMetricsEndpoints"]
        roles = {
            e["port"]: [(r["targetLabel"], r["replacement"]) for r in e.get("relabelings", [])]
            for e in endpoints
        }
        assert roles == {
            "specwatch": [("model_name", "llama-3.1-8b-instruct")],
            "std-http": [("role", "standard")],
            "fly-http": [("role", "fly")],
        }

    def test_podmonitor_model_name_is_the_served_model(
        self, base: list[Obj], pod_spec: Obj
    ) -> None:
        """Only specwatch's endpoint honours labels (vLLM's own ``model_name`` and the target's
        ``role`` never collide there), and its ``model_name`` is the name both servers serve."""
        endpoints = one(base, "PodMonitor")["spec"]["podMetricsEndpoints"]
        honor = {e["port"]: e.get("honorLabels", False) for e in endpoints}
        assert honor == {"specwatch": True, "std-http": False, "fly-http": False}
        served = {
            a.split("=", 1)[1]
            for c in pod_spec["containers"]
            for a in c.get("args", [])
            if a.startswith("--served-model-name=")
        }
        (sw,) = [e for e in endpoints if e["port"] == "specwatch"]
        assert {r["replacement"] for r in sw["relabelings"]} == served

    def test_generated_config_names_are_referenced(self, base: list[Obj], pod_spec: Obj) -> None:
        """The hashed ConfigMap names kustomize generates are the ones the pod mounts and reads."""
        names = {o["metadata"]["name"] for o in by_kind(base, "ConfigMap")}
        sw = container(pod_spec, "specwatch")
        used = {sw["envFrom"][0]["configMapRef"]["name"]}
        used |= {v["configMap"]["name"] for v in pod_spec["volumes"] if "configMap" in v}
        assert used == names
        assert all(re.fullmatch(r"specwatch-(config|env)-[a-z0-9]{10}", n) for n in names)

    def test_grafana_dashboards_become_labelled_configmaps(self) -> None:
        """One ConfigMap per dashboard JSON, labelled grafana_dashboard "1", content unchanged."""
        objs = kustomize_build(GRAFANA)
        files = sorted(GRAFANA.glob("*.json"))
        assert len(objs) == len(files) == 4
        rendered = {}
        for obj in objs:
            assert obj["kind"] == "ConfigMap"
            assert obj["metadata"]["labels"]["grafana_dashboard"] == "1"
            (key, text), *rest = obj["data"].items()
            assert rest == []
            rendered[key] = text
        assert rendered == {f.name: f.read_text(encoding="utf-8") for f in files}

    def test_overlay_renders_everything_in_one_namespace(self) -> None:
        """The overlay adds dashboards, the PrometheusRule and the mirror; all in llm-serving."""
        objs = kustomize_build(OVERLAY)
        kinds = {o["kind"] for o in objs}
        assert {"Deployment", "PodMonitor", "PrometheusRule", "VirtualService"} <= kinds
        for obj in objs:
            if obj["kind"] != "Namespace":
                assert obj["metadata"]["namespace"] == "llm-serving", obj["metadata"]["name"]
        for kind in ("PodMonitor", "PrometheusRule"):
            for obj in by_kind(objs, kind):
                assert obj["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        for obj in objs:
            assert validation_errors(obj) == [], obj["metadata"]["name"]


# ------------------------------------------------------------------------------------------------
# schema validation
# ------------------------------------------------------------------------------------------------


def _overlay_files() -> list[Path]:
    return sorted(p for p in OVERLAY.glob("*.yaml") if p.name != "kustomization.yaml")


class TestSchemas:
    @pytest.mark.kubectl
    def test_rendered_base_and_dashboards_validate(self, base: list[Obj]) -> None:
        """Every rendered object of the base and the dashboards validates (strict fields)."""
        for obj in base + kustomize_build(GRAFANA):
            assert validation_errors(obj) == [], f"{obj['kind']}/{obj['metadata']['name']}"

    @pytest.mark.parametrize("path", _overlay_files(), ids=lambda p: p.name)
    def test_overlay_files_validate(self, path: Path) -> None:
        """Every manifest file of the overlay (mirror routes, namespace) validates as written."""
        for obj in load_yaml_docs(path):
            assert validation_errors(obj) == []

    def test_builtin_validator_rejects_an_unknown_field(self) -> None:
        """A misspelt container field fails strict Kubernetes validation."""
        bad = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "x"},
            "spec": {"containers": [{"name": "a", "image": "b", "readinesProbe": {}}]},
        }
        assert validation_errors(bad) != []

    def test_crd_validator_rejects_unknown_field_and_range(self) -> None:
        """A misspelt PodMonitor field and a mirror percent above 100 both fail."""
        podmonitor = {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PodMonitor",
            "metadata": {"name": "x"},
            "spec": {"selector": {}, "podMetricEndpoints": [{"port": "m"}]},
        }
        assert any("podMetricEndpoints" in e for e in validation_errors(podmonitor))
        route = load_yaml_docs(OVERLAY / "mirror-httproute.yaml")[0]
        route["spec"]["rules"][0]["filters"][0]["requestMirror"]["percent"] = 150
        assert any("150" in e for e in validation_errors(route))

    def test_unknown_kind_is_an_error(self) -> None:
        """A kind with neither a Kubernetes nor a committed CRD schema is not silently passed."""
        assert validation_errors({"apiVersion": "example.com/v1", "kind": "Widget"}) != []


# ------------------------------------------------------------------------------------------------
# the pod: two vLLM servers and the sidecar agree with each other and with specwatch's config
# ------------------------------------------------------------------------------------------------


@pytest.mark.kubectl
class TestVllmPair:
    def test_same_model_draft_k_and_limits(self, pod_spec: Obj) -> None:
        """Both servers share target, draft, K and scheduler limits; only the rule differs."""
        std_model, std = vllm_flags(container(pod_spec, "vllm-standard"))
        fly_model, fly = vllm_flags(container(pod_spec, "vllm-fly"))
        assert std_model == fly_model
        for flag in (
            "--max-model-len",
            "--max-num-seqs",
            "--max-num-batched-tokens",
            "--seed",
            "--served-model-name",
            "--gpu-memory-utilization",
        ):
            assert std[flag] == fly[flag], flag
        std_spec = json.loads(std["--speculative-config"])
        fly_spec = json.loads(fly["--speculative-config"])
        for key in ("method", "model", "num_speculative_tokens"):
            assert std_spec[key] == fly_spec[key], key
        assert std_spec["rejection_sample_method"] == "standard"
        assert fly_spec["rejection_sample_method"] == "fly"

    def test_fly_parameters_within_vllm_constraints(self, pod_spec: Obj) -> None:
        """FLy needs K ≥ 2, 1 ≤ fly_window_size < K, threshold ≥ 0 nats, top-k ≥ 1 (vLLM 0.33)."""
        _, fly = vllm_flags(container(pod_spec, "vllm-fly"))
        spec = json.loads(fly["--speculative-config"])
        k = spec["num_speculative_tokens"]
        assert isinstance(k, int)
        assert k >= 2
        assert isinstance(spec["fly_window_size"], int)
        assert 1 <= spec["fly_window_size"] < k
        assert float(spec["fly_entropy_threshold"]) >= 0
        assert isinstance(spec["fly_entropy_top_k"], int)
        assert spec["fly_entropy_top_k"] >= 1
        assert set(spec) == {
            "method", "model", "num_speculative_tokens", "rejection_sample_method",
            "fly_window_size", "fly_entropy_threshold", "fly_entropy_top_k",
        }  # fmt: skip

    def test_both_fit_on_the_shared_gpu(self, base: list[Obj], pod_spec: Obj) -> None:
        """Both servers claim the one pod-level GPU claim and their memory shares sum to ≤ 0.95."""
        total = 0.0
        for name in ("vllm-standard", "vllm-fly"):
            c = container(pod_spec, name)
            assert c["resources"]["claims"] == [{"name": "gpu"}]
            total += float(vllm_flags(c)[1]["--gpu-memory-utilization"])
        assert total <= 0.95
        (claim,) = pod_spec["resourceClaims"]
        assert claim["name"] == "gpu"
        template = one(base, "ResourceClaimTemplate", claim["resourceClaimTemplateName"])
        requests = template["spec"]["spec"]["devices"]["requests"]
        assert [r["exactly"]["count"] for r in requests] == [1]

    def test_ports_match_flags(self, pod_spec: Obj) -> None:
        """Each server's --port is its declared containerPort; the two differ (8000, 8001)."""
        ports = []
        for name in ("vllm-standard", "vllm-fly"):
            c = container(pod_spec, name)
            port = int(vllm_flags(c)[1]["--port"])
            assert list(port_by_name(c).values()) == [port]
            ports.append(port)
        assert ports == [8000, 8001]


@pytest.fixture(scope="module")
def specwatch_config() -> Obj:
    return cast(Obj, yaml.safe_load((BASE / "config.yaml").read_text(encoding="utf-8")))


@pytest.mark.kubectl
class TestSpecwatchSidecar:
    def test_security_context(self, pod_spec: Obj) -> None:
        """The image's non-root uid, read-only root fs, no privilege escalation, no capabilities."""
        sc = container(pod_spec, "specwatch")["securityContext"]
        dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
        (user,) = re.findall(r"^USER (\d+):(\d+)$", dockerfile, flags=re.MULTILINE)
        assert sc == {
            "runAsNonRoot": True,
            "runAsUser": int(user[0]),
            "runAsGroup": int(user[1]),
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        }

    def test_writable_paths_are_volumes(self, pod_spec: Obj) -> None:
        """With a read-only root, /tmp and the ledger directory are emptyDir mounts."""
        sw = container(pod_spec, "specwatch")
        volumes = {v["name"]: v for v in pod_spec["volumes"]}
        mounts = {m["mountPath"]: volumes[m["name"]] for m in sw["volumeMounts"]}
        assert "emptyDir" in mounts["/tmp"]
        assert "emptyDir" in mounts["/var/lib/specwatch"]

    def test_probes_and_ports(self, pod_spec: Obj) -> None:
        """Liveness and readiness both on /healthz of the 9477 listener, which the image EXPOSEs.

        Readiness must not be /readyz: the pod is Ready only when every container is, so a
        specwatch that cannot scrape would take vLLM out of the Service.
        """
        sw = container(pod_spec, "specwatch")
        ports = port_by_name(sw)
        assert ports[sw["livenessProbe"]["httpGet"]["port"]] == SPECWATCH_PORT
        assert sw["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert ports[sw["readinessProbe"]["httpGet"]["port"]] == SPECWATCH_PORT
        assert sw["readinessProbe"]["httpGet"]["path"] == "/healthz"
        for name in ("vllm-standard", "vllm-fly"):  # vLLM's own readiness stays on vLLM
            probe = container(pod_spec, name)["readinessProbe"]["httpGet"]
            assert probe["port"] in port_by_name(container(pod_spec, name))
        dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
        (exposed,) = re.findall(r"^EXPOSE (.+)$", dockerfile, flags=re.MULTILINE)
        assert sorted(ports.values()) == sorted(int(p) for p in exposed.split())

    def test_resources_set(self, pod_spec: Obj) -> None:
        """The sidecar requests and limits CPU and memory."""
        res = container(pod_spec, "specwatch")["resources"]
        assert set(res["requests"]) == {"cpu", "memory"}
        assert set(res["limits"]) == {"cpu", "memory"}

    def test_env_names_and_port(self, base: list[Obj], pod_spec: Obj) -> None:
        """Env keys are SPECWATCH_<GROUP>__<FIELD>; SERVER__PORT is the listener's port."""
        sw = container(pod_spec, "specwatch")
        env_cm = one(base, "ConfigMap", sw["envFrom"][0]["configMapRef"]["name"])
        env = env_cm["data"]
        assert env
        for key in env:
            assert re.fullmatch(r"SPECWATCH_[A-Z0-9]+(_[A-Z0-9]+)*__[A-Z0-9]+(_[A-Z0-9]+)*", key)
        assert int(env["SPECWATCH_SERVER__PORT"]) == SPECWATCH_PORT

    def test_config_file_is_mounted_where_args_point(self, base: list[Obj], pod_spec: Obj) -> None:
        """``run --config PATH``: PATH is a key of the mounted ConfigMap at its mount path."""
        sw = container(pod_spec, "specwatch")
        assert sw["args"][0] == "run"
        config_path = Path(sw["args"][sw["args"].index("--config") + 1])
        volumes = {v["name"]: v for v in pod_spec["volumes"]}
        mount = next(m for m in sw["volumeMounts"] if m["mountPath"] == str(config_path.parent))
        assert mount["readOnly"] is True
        cm = one(base, "ConfigMap", volumes[mount["name"]]["configMap"]["name"])
        assert yaml.safe_load(cm["data"][config_path.name]) == yaml.safe_load(
            (BASE / "config.yaml").read_text(encoding="utf-8")
        )

    def test_config_targets_match_the_servers(self, pod_spec: Obj, specwatch_config: Obj) -> None:
        """Targets point at each server's localhost port with that server's limits and method;
        K is left to the page (the position labels vLLM creates at start-up), so the settings
        carry no copy of it that a redeploy with another K would make stale."""
        assert specwatch_config["server"]["port"] == SPECWATCH_PORT
        targets = {t["role"]: t for t in specwatch_config["targets"]}
        assert set(targets) == {"standard", "fly"}
        for role, name in (("standard", "vllm-standard"), ("fly", "vllm-fly")):
            _, flags = vllm_flags(container(pod_spec, name))
            spec = json.loads(flags["--speculative-config"])
            target = targets[role]
            assert target["url"] == f"http://127.0.0.1:{flags['--port']}"
            assert target["max_num_seqs"] == int(flags["--max-num-seqs"])
            assert target["max_num_batched_tokens"] == int(flags["--max-num-batched-tokens"])
            assert "num_speculative_tokens" not in target
            assert target["method"] == spec["method"]


@pytest.mark.kubectl
class TestServicesAndMonitoring:
    def test_service_target_ports_exist(self, base: list[Obj], pod_spec: Obj) -> None:
        """Every Service targetPort names a container port of the pod it selects."""
        names = {n for c in pod_spec["containers"] for n in port_by_name(c)}
        labels = one(base, "Deployment")["spec"]["template"]["metadata"]["labels"]
        for svc in by_kind(base, "Service"):
            assert svc["spec"]["selector"].items() <= labels.items()
            for port in svc["spec"]["ports"]:
                assert port["targetPort"] in names

    def test_podmonitor_scrapes_specwatch_and_both_servers(
        self, base: list[Obj], pod_spec: Obj
    ) -> None:
        """The PodMonitor scrapes /metrics on the specwatch port and on each vLLM port."""
        pm = one(base, "PodMonitor")
        owners = {n: c["name"] for c in pod_spec["containers"] for n in port_by_name(c)}
        scraped = {owners[e["port"]] for e in pm["spec"]["podMetricsEndpoints"]}
        assert scraped == {"specwatch", "vllm-standard", "vllm-fly"}
        assert {e["path"] for e in pm["spec"]["podMetricsEndpoints"]} == {"/metrics"}
        labels = one(base, "Deployment")["spec"]["template"]["metadata"]["labels"]
        assert pm["spec"]["selector"]["matchLabels"].items() <= labels.items()


def _service_port(base: list[Obj], name: str, number: int) -> Obj:
    svc = one(base, "Service", name)
    (port,) = [p for p in svc["spec"]["ports"] if p["port"] == number]
    return cast(Obj, port)


@pytest.mark.kubectl
class TestMirror:
    def test_istio_mirror(self, base: list[Obj], pod_spec: Obj) -> None:
        """The VirtualService mirrors only the completions paths, a share in (0, 100], to the
        mirror listener's port (9402, not the /metrics port)."""
        (vs,) = load_yaml_docs(OVERLAY / "mirror-virtualservice.yaml")
        mirrored = [r for r in vs["spec"]["http"] if "mirrors" in r]
        assert len(mirrored) == 1
        route = mirrored[0]
        assert {m["uri"]["exact"] for m in route["match"]} == MIRROR_PATHS
        (mirror,) = route["mirrors"]
        assert 0 < mirror["percentage"]["value"] <= 100
        dest = mirror["destination"]
        port = _service_port(base, dest["host"], dest["port"]["number"])
        assert port_by_name(container(pod_spec, "specwatch"))[port["targetPort"]] == MIRROR_PORT
        for r in vs["spec"]["http"]:
            (live,) = r["route"]
            live_port = _service_port(base, live["destination"]["host"], 8000)
            assert live_port["targetPort"] == "std-http"

    def test_gateway_api_mirror(self, base: list[Obj], pod_spec: Obj) -> None:
        """The HTTPRoute's RequestMirror sends the completions paths' share to specwatch:9402."""
        (route,) = load_yaml_docs(OVERLAY / "mirror-httproute.yaml")
        mirrored = [
            r for r in route["spec"]["rules"]
            if any(f["type"] == "RequestMirror" for f in r.get("filters", []))
        ]  # fmt: skip
        assert len(mirrored) == 1
        rule = mirrored[0]
        assert {m["path"]["value"] for m in rule["matches"]} == MIRROR_PATHS
        assert {m["path"]["type"] for m in rule["matches"]} == {"Exact"}
        (flt,) = rule["filters"]
        assert 0 < flt["requestMirror"]["percent"] <= 100
        ref = flt["requestMirror"]["backendRef"]
        port = _service_port(base, ref["name"], ref["port"])
        assert port_by_name(container(pod_spec, "specwatch"))[port["targetPort"]] == MIRROR_PORT

    def test_only_the_mesh_reaches_the_mirror_port(self, base: list[Obj], pod_spec: Obj) -> None:
        """The NetworkPolicy selects the pod; the mirror port (9402) is allowed only from pods
        Istio injected (``security.istio.io/tlsMode: istio``, any namespace), while the live,
        /metrics and proxy ports stay open to all; the specwatch settings listen on 9402."""
        pol = one(base, "NetworkPolicy")
        labels = one(base, "Deployment")["spec"]["template"]["metadata"]["labels"]
        assert pol["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
        assert pol["spec"]["policyTypes"] == ["Ingress"]
        numbers = {n: p for c in pod_spec["containers"] for n, p in port_by_name(c).items()}
        open_ports: set[int] = set()
        mesh_ports: set[int] = set()
        for rule in pol["spec"]["ingress"]:
            ports = {numbers[p["port"]] for p in rule["ports"]}
            if "from" not in rule:
                open_ports |= ports
            else:
                assert rule["from"] == [
                    {
                        "namespaceSelector": {},
                        "podSelector": {"matchLabels": {"security.istio.io/tlsMode": "istio"}},
                    }
                ]
                mesh_ports |= ports
        assert mesh_ports == {MIRROR_PORT} == {9402}
        assert open_ports == {8000, 8001, SPECWATCH_PORT, 9401}
        cfg = yaml.safe_load((ROOT / "deploy/base/config.yaml").read_text())
        assert cfg["shadow"]["mirror_listen_port"] == MIRROR_PORT
        assert cfg["server"]["port"] == SPECWATCH_PORT != MIRROR_PORT

    def test_both_servers_return_per_request_spec_decode_metrics(self, pod_spec: Obj) -> None:
        """Both vLLM containers run with ``--per-request-spec-decode-metrics=summary`` (replies
        carry ``metrics.speculative_decoding``, read for alpha and tau per arm)."""
        for name in ("vllm-standard", "vllm-fly"):
            assert "--per-request-spec-decode-metrics=summary" in container(pod_spec, name)["args"]


def test_speculative_config_flags_are_one_line_json() -> None:
    """Each folded --speculative-config value in deployment.yaml is a one-line JSON object."""
    text = (BASE / "deployment.yaml").read_text(encoding="utf-8")
    docs = yaml.safe_load(text)
    for c in docs["spec"]["template"]["spec"]["containers"]:
        for arg in c.get("args", []):
            if arg.startswith("--speculative-config="):
                value = json.loads(arg.split("=", 1)[1])
                assert isinstance(value, dict)
                assert "\n" not in arg


# ------------------------------------------------------------------------------------------------
# agreement with specwatch itself: its real Settings and its real routes
# ------------------------------------------------------------------------------------------------


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines as kustomize's ``envs`` reads them (comments and blanks skipped)."""
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, line
            out[key] = value
    return out


ENV_FILE = read_env_file(BASE / "specwatch.env")


def settings_field(env_name: str) -> tuple[str, ...]:
    """The Settings field path an env name sets (``SPECWATCH_SERVER__PORT`` → server.port),
    checked against the real models: pydantic-settings ignores an unknown group silently."""
    assert env_name.startswith("SPECWATCH_"), env_name
    path = tuple(p.lower() for p in env_name.removeprefix("SPECWATCH_").split("__"))
    model: Any = Settings
    for part in path:
        assert isinstance(model, type), f"{env_name}: {part} is below a leaf field"
        assert issubclass(model, BaseModel), env_name
        assert part in model.model_fields, f"{env_name}: no field {part!r} in {model.__name__}"
        model = model.model_fields[part].annotation
    return path


@pytest.fixture
def deployed_settings(monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings exactly as the sidecar loads them: config.yaml plus the env file."""
    for key in list(os.environ):
        if key.startswith("SPECWATCH_"):
            monkeypatch.delenv(key)
    for key, value in ENV_FILE.items():
        monkeypatch.setenv(key, value)
    return load_settings(config_file=BASE / "config.yaml")


def app_get_paths(settings: Settings) -> set[str]:
    app = build_app(settings, scrape=False)
    return {r.resource.canonical for r in app.router.routes() if r.method == "GET" and r.resource}


@pytest.mark.kubectl
class TestAgreementWithSpecwatch:
    def test_env_names_are_settings_fields(self) -> None:
        """Every SPECWATCH_* name in the env file names a real (nested) Settings field."""
        assert ENV_FILE
        for key in ENV_FILE:
            assert len(settings_field(key)) >= 1

    def test_env_name_checker_rejects_a_wrong_group(self) -> None:
        """A misspelt group, which pydantic-settings would ignore, fails the check above."""
        with pytest.raises(AssertionError, match="no field 'servr'"):
            settings_field("SPECWATCH_SERVR__PORT")
        with pytest.raises(AssertionError, match="no field 'prot'"):
            settings_field("SPECWATCH_SERVER__PROT")

    def test_loaded_settings_match_the_manifests(
        self, deployed_settings: Settings, pod_spec: Obj
    ) -> None:
        """load_settings(config.yaml + env) listens on the sidecar's port, logs as the env says,
        and scrapes each vLLM container's port with its flags' limits."""
        s = deployed_settings
        sw_ports = port_by_name(container(pod_spec, "specwatch"))
        assert s.server.port == sw_ports["specwatch"] == int(ENV_FILE["SPECWATCH_SERVER__PORT"])
        assert s.server.host == ENV_FILE["SPECWATCH_SERVER__HOST"]
        assert s.log.level == ENV_FILE["SPECWATCH_LOG__LEVEL"].upper()
        assert s.log.format == ENV_FILE["SPECWATCH_LOG__FORMAT"]
        by_role = {t.effective_role.value: t for t in s.targets}
        assert set(by_role) == {"standard", "fly"}
        for role, name in (("standard", "vllm-standard"), ("fly", "vllm-fly")):
            c = container(pod_spec, name)
            _, flags = vllm_flags(c)
            spec = json.loads(flags["--speculative-config"])
            t = by_role[role]
            assert t.url == f"http://127.0.0.1:{next(iter(port_by_name(c).values()))}/metrics"
            assert t.limits.max_num_seqs == int(flags["--max-num-seqs"])
            assert t.limits.max_num_batched_tokens == int(flags["--max-num-batched-tokens"])
            assert t.limits.num_speculative_tokens is None  # read from the page
            assert t.limits.method == spec["method"]
            image_tag = {
                i["name"]: i["newTag"]
                for i in load_yaml_docs(BASE / "kustomization.yaml")[0]["images"]
            }
            assert t.limits.vllm_version == image_tag["vllm/vllm-openai"].removeprefix("v")

    def test_shadow_ledger_paired_and_alerting_groups(
        self, deployed_settings: Settings, pod_spec: Obj
    ) -> None:
        """config.yaml's shadow arms are the vLLM containers' ports and scrape targets, the
        ledger sits on the state volume, and the alerting credentials named in its comments
        are real Settings fields."""
        s = deployed_settings
        sh = s.shadow
        assert sh.enabled
        assert sh.modes == ("mirror", "canary")
        assert sh.noise_kind == "standard"  # the noise floor, on the standard server
        assert sh.standard is not None
        assert sh.fly is not None
        assert sh.noise is None
        # the canary set is the generated ConfigMap's second file, mounted beside config.yaml
        mounts = {
            m["name"]: m["mountPath"] for m in container(pod_spec, "specwatch")["volumeMounts"]
        }
        assert sh.canary_file == f"{mounts['specwatch-config']}/canary.jsonl"
        kust = load_yaml_docs(BASE / "kustomization.yaml")[0]
        assert "../canary" in kust["components"]
        comp = load_yaml_docs(BASE.parent / "canary" / "kustomization.yaml")[0]
        (gen,) = comp["configMapGenerator"]
        assert (gen["name"], gen["behavior"], gen["files"]) == (
            "specwatch-config",
            "merge",
            ["canary.jsonl"],
        )
        for arm, name in ((sh.standard, "vllm-standard"), (sh.fly, "vllm-fly")):
            port = next(iter(port_by_name(container(pod_spec, name)).values()))
            assert arm.url == f"http://127.0.0.1:{port}"
            assert arm.target in {t.name for t in s.targets}
        mounts = {
            m["name"]: m["mountPath"] for m in container(pod_spec, "specwatch")["volumeMounts"]
        }
        assert Path(s.ledger.path).parent == Path(mounts["specwatch-state"])
        assert "emptyDir" in next(v for v in pod_spec["volumes"] if v["name"] == "specwatch-state")
        assert s.paired.windows == ("15m", "1h", "24h")
        # the example pages through kube-prometheus-stack's Alertmanager (one replica, by pod)
        assert s.alerting.urls == [
            "http://alertmanager-kube-prometheus-stack-alertmanager-0"
            ".alertmanager-operated.monitoring.svc:9093"
        ]
        text = (BASE / "config.yaml").read_text(encoding="utf-8")
        names = set(re.findall(r"SPECWATCH_ALERTING__[A-Z_]+", text))
        assert names == {
            "SPECWATCH_ALERTING__URLS",  # the overlay's way to set the address
            "SPECWATCH_ALERTING__BEARER_TOKEN",
            "SPECWATCH_ALERTING__BASIC_USERNAME",
            "SPECWATCH_ALERTING__BASIC_PASSWORD",
        }
        for name in names:
            assert len(settings_field(name)) == 2

    def test_env_overrides_the_file(
        self, deployed_settings: Settings, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The documented precedence holds for the sidecar: env beats config.yaml."""
        monkeypatch.setenv("SPECWATCH_SERVER__PORT", "9500")
        assert load_settings(config_file=BASE / "config.yaml").server.port == 9500
        assert deployed_settings.server.port == SPECWATCH_PORT

    def test_probe_scrape_and_healthcheck_paths_are_routes(
        self, deployed_settings: Settings, pod_spec: Obj
    ) -> None:
        """The app built from those settings serves every path the manifests and image use."""
        routes = app_get_paths(deployed_settings)
        assert {"/healthz", "/readyz", "/metrics", "/api/v1/snapshot"} <= routes
        sw = container(pod_spec, "specwatch")
        for probe in ("livenessProbe", "readinessProbe"):
            assert sw[probe]["httpGet"]["path"] in routes
        pm = load_yaml_docs(BASE / "podmonitor.yaml")[0]
        for ep in pm["spec"]["podMetricsEndpoints"]:
            if ep["port"] == "specwatch":
                assert ep["path"] in routes
        dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
        (healthcheck,) = re.findall(r"^HEALTHCHECK .*?(?=^\S)", dockerfile, re.M | re.S)
        used = set(re.findall(r"127\.0\.0\.1:\{port\}(/[a-z/]+)", healthcheck))
        assert used == {"/healthz"}
        assert used <= routes
        assert settings_field("SPECWATCH_SERVER__PORT") == ("server", "port")
        assert "SPECWATCH_SERVER__PORT" in healthcheck

    def test_config_yaml_groups_are_settings_fields(self) -> None:
        """Top-level keys of config.yaml are Settings fields (extra keys are a startup error)."""
        config = yaml.safe_load((BASE / "config.yaml").read_text(encoding="utf-8"))
        assert set(config) <= set(Settings.model_fields)


def test_alertmanager_url_is_set_in_one_place_from_an_overlay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shipped Alertmanager address (kube-prometheus-stack in ``monitoring``) is replaced
    from an overlay without touching the base: a ``specwatch-env`` merge of
    ``SPECWATCH_ALERTING__URLS``, as the comment in ``deploy/base/config.yaml`` shows, reaches
    the pod's env, and the settings read with it and the shipped config.yaml post there."""
    mine = "http://alertmanager-main-0.alertmanager-operated.observability.svc:9093"
    base = DEPLOY / "base"
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(base, tmp_path)],
                "configMapGenerator": [
                    {
                        "name": "specwatch-env",
                        "behavior": "merge",
                        "literals": [f'SPECWATCH_ALERTING__URLS=["{mine}"]'],
                    }
                ],
            }
        )
    )
    text = (base / "config.yaml").read_text()
    assert "SPECWATCH_ALERTING__URLS" in text
    assert "behavior: merge" in text
    shipped = load_settings(config_file=base / "config.yaml").alerting.urls
    assert [".monitoring.svc" in u for u in shipped] == [True]
    objs = kustomize_build(tmp_path)
    (env,) = [
        o
        for o in objs
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("specwatch-env")
    ]
    monkeypatch.setenv("SPECWATCH_ALERTING__URLS", env["data"]["SPECWATCH_ALERTING__URLS"])
    assert load_settings(config_file=base / "config.yaml").alerting.urls == [mine]
