"""The shipped deployment tried whole, as a new user installs it.

Each layout is rendered with ``kubectl kustomize`` (``deploy/overlays/example``: both vLLM servers
and the sidecar in one pod; ``deploy/standalone``: the sidecar beside two vLLM Services labelled
as production-stack and llm-d label theirs, every server in a container named ``vllm``). The
scrape configuration is derived from the rendered PodMonitor / ServiceMonitor as
prometheus-operator derives it (:mod:`tests.e2e.operator_scrape`), the rules from the rendered
PrometheusRule as rendered (its ranges and ``for`` durations unchanged). Real processes on
127.0.0.1: Prometheus, Alertmanager (routes by ``severity``, one inhibit rule), two
``specwatch simulate`` servers started with the rendered Deployment's vLLM flags, and
``specwatch run`` with the rendered ``config.yaml`` and canary set, changed only where things are
(:func:`localize`: addresses to 127.0.0.1, in-pod paths to files; a test fails when anything else
changes), so the rates, sampling, canary set and noise arm are the shipped ones.

Then, as the user would look: within five minutes the snapshot has graded pairs and a noise floor
(in-pod), every panel of every dashboard has data at its default variables
(or says when it is empty), ``specwatch doctor`` with the shipped manifests and dashboards exits
0, ``specwatch fleet`` gives the sidecar's own ledger table under the served model's name, the
vLLM cross-check panel gives one α per role equal to each server's own counters, every shipped
rule is loaded and evaluated without error, and a quality fault on the FLy server (the
simulator's ``wrong_answer_rate``) pages: the sidecar's own ``SpecQualityDrift`` push reaches
Alertmanager routed by ``severity="critical"`` to the ``page`` receiver, as the runbook says,
within minutes at the shipped canary rate.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from specwatch.core.config import OVERALL
from specwatch.simulate.loadgen import LoadConfig, LoadGenerator
from tests.deploy.test_manifests import kustomize_build
from tests.e2e.operator_scrape import Pod, Port, container_ports, scrape_configs
from tests.e2e.test_dashboards_prometheus import empty_at, empty_panels, variable_values
from tests.fakes import REPO, free_port
from tests.fakes.alertmanager import running_alertmanager
from tests.fakes.prometheus import run_prometheus
from tests.fakes.wait import poll
from tests.sidecar_process import run_specwatch, specwatch_process

pytestmark = [pytest.mark.promtool, pytest.mark.timeout(600)]

Obj = dict[str, Any]
DASHBOARDS = sorted((REPO / "grafana").glob("*.json"))
#: The Alertmanager configuration a user has: route by severity, critical inhibits warning.
AM_CONFIG = {
    "route": {
        "receiver": "default",
        "group_by": ["alertname", "namespace"],
        "group_wait": "0s",
        "routes": [
            {"matchers": ['severity="critical"'], "receiver": "page"},
            {"matchers": ['severity="warning"'], "receiver": "ticket"},
            {"matchers": ['severity="info"'], "receiver": "null"},
        ],
    },
    "inhibit_rules": [
        {
            "source_matchers": ['severity="critical"'],
            "target_matchers": ['severity="warning"'],
            "equal": ["namespace"],
        }
    ],
    "receivers": [{"name": n} for n in ("default", "page", "ticket", "null")],
}


def one(objs: Sequence[Obj], kind: str, name: str | None = None) -> Obj:
    """The single object of ``kind`` (named ``name``, or whose name starts with it)."""
    found = [
        o
        for o in objs
        if o["kind"] == kind and (name is None or o["metadata"]["name"].startswith(name))
    ]
    assert len(found) == 1, (kind, name, [o["metadata"]["name"] for o in found])
    return found[0]


def vllm_flags(container: Obj) -> tuple[str, list[str]]:
    """The role and the ``specwatch simulate`` flags for one vLLM container of the Deployment:
    its scheduler flags as they are, its ``--speculative-config`` as the simulator's flags."""
    args: list[str] = container["args"]
    flags: list[str] = []
    role = "standard"
    for arg in args[1:]:
        if arg.startswith("--speculative-config="):
            spec = json.loads(arg.split("=", 1)[1])
            role = "fly" if spec.get("rejection_sample_method") == "fly" else "standard"
            flags += [f"--method={spec['method']}"]
            flags += [f"--num-speculative-tokens={spec['num_speculative_tokens']}"]
            for key in ("fly_window_size", "fly_entropy_threshold", "fly_entropy_top_k"):
                if key in spec:
                    flags.append(f"--{key.replace('_', '-')}={spec[key]}")
        elif re.match(
            r"--(served-model-name|max-num-seqs|max-num-batched-tokens|max-model-len"
            r"|seed|per-request-spec-decode-metrics)=",
            arg,
        ):
            flags.append(arg)
    return role, flags


@contextlib.asynccontextmanager
async def simulate(tmp: Path, name: str, role: str, flags: list[str]) -> AsyncIterator[str]:
    """``specwatch simulate --role ROLE FLAGS`` on a free port; yields its base URL."""
    port = free_port()
    log = (tmp / f"sim-{name}.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "specwatch",
        "simulate",
        f"--role={role}",
        "--host=127.0.0.1",
        f"--port={port}",
        "--vllm-version=0.33.0",
        *flags,
        stdout=log,
        stderr=asyncio.subprocess.STDOUT,
        cwd=str(REPO),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as s:

            async def up() -> bool | None:
                assert proc.returncode is None, (tmp / f"sim-{name}.log").read_text()[-2000:]
                async with s.get(f"{url}/health") as r:
                    return True if r.status == 200 else None

            await poll(f"simulator {name}", up, within=30)
        yield url
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()
        log.close()


#: The only leaves of the rendered ``config.yaml`` that :func:`localize` may change: where things
#: are (listen addresses, server URLs, files), never how specwatch behaves (rates, modes, sampling,
#: windows, timings). ``*`` stands for any list index.
LOCAL_KEYS = frozenset(
    {
        ("server", "host"),
        ("server", "port"),
        ("targets", "*", "url"),
        ("shadow", "standard", "url"),
        ("shadow", "fly", "url"),
        ("shadow", "mirror_listen_host"),
        ("shadow", "mirror_listen_port"),
        ("shadow", "canary_file"),
        ("ledger", "path"),
        ("alerting", "urls", "*"),
    }
)


def localize(doc: Obj, urls: dict[str, str], tmp: Path, port: int, files: dict[str, Path]) -> Obj:
    """The one rewrite of the rendered ``config.yaml``: the cluster's addresses become this
    machine's (127.0.0.1, free ports, each role's simulator) and its in-pod paths become files
    under ``tmp`` or the ConfigMap's other files written out (``files``: file name → path); the
    Alertmanager URLs become ``urls["alertmanager"]``.
    Nothing else; :func:`changed_leaves` lets a test prove it."""
    out: Obj = yaml.safe_load(yaml.safe_dump(doc))
    out["server"].update(host="127.0.0.1", port=port)
    for t in out["targets"]:
        t["url"] = urls[t["role"]]
    sh = out["shadow"]
    for arm in ("standard", "fly"):
        sh[arm]["url"] = urls[arm]
    sh.update(mirror_listen_host="127.0.0.1", mirror_listen_port=free_port())
    if "canary_file" in sh:
        sh["canary_file"] = str(files[Path(sh["canary_file"]).name])
    out["ledger"]["path"] = str(tmp / "ledger.sqlite")
    if (out.get("alerting") or {}).get("urls"):
        out["alerting"]["urls"] = [urls["alertmanager"] for _ in out["alerting"]["urls"]]
    return out


def changed_leaves(a: object, b: object, at: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Paths (list indexes as ``*``) where ``a`` and ``b`` differ: a changed, added or removed
    leaf, or a list of another length."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: set[tuple[str, ...]] = set()
        for k in a.keys() | b.keys():
            out |= changed_leaves(a.get(k), b.get(k), (*at, str(k)))
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return set().union(*(changed_leaves(x, y, (*at, "*")) for x, y in zip(a, b, strict=True)))
    return set() if a == b else {at}


def sidecar_config(objs: Sequence[Obj], urls: dict[str, str], tmp: Path, port: int) -> Path:
    """The rendered ``config.yaml`` through :func:`localize`, written with the ConfigMap's other
    files (the canary set) under ``tmp``; the test fails if anything but an address or a path
    changed."""
    cm = one(objs, "ConfigMap", "specwatch-config")
    files: dict[str, Path] = {}
    for name, text in cm["data"].items():
        if name != "config.yaml":
            files[name] = tmp / name
            files[name].write_text(text, encoding="utf-8")
    rendered = yaml.safe_load(cm["data"]["config.yaml"])
    doc = localize(rendered, urls, tmp, port, files)
    assert changed_leaves(rendered, doc) <= LOCAL_KEYS, changed_leaves(rendered, doc) - LOCAL_KEYS
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def test_localize_changes_only_addresses_and_paths(tmp_path: Path) -> None:
    """Both shipped configs go through :func:`localize` changing only :data:`LOCAL_KEYS`, every
    one of the addresses it must change does change, and the guard sees a changed rate."""
    for where in ("overlays/example", "standalone"):
        objs = kustomize_build(REPO / "deploy" / where)
        cm = one(objs, "ConfigMap", "specwatch-config")
        rendered = yaml.safe_load(cm["data"]["config.yaml"])
        urls = {
            "standard": "http://127.0.0.1:1",
            "fly": "http://127.0.0.1:2",
            "alertmanager": "http://127.0.0.1:4",
        }
        files = {n: tmp_path / n for n in cm["data"]}
        doc = localize(rendered, urls, tmp_path, 3, files)
        changed = changed_leaves(rendered, doc)
        assert changed <= LOCAL_KEYS, changed - LOCAL_KEYS
        assert {("server", "port"), ("targets", "*", "url"), ("ledger", "path")} <= changed
        assert yaml.safe_dump(doc).count("127.0.0.1") >= 6
        assert "svc" not in yaml.safe_dump(doc)
        if where == "overlays/example":  # the example pages through its Alertmanager
            assert doc["alerting"]["urls"] == ["http://127.0.0.1:4"]
        doc["shadow"]["canary_rate_per_second"] = 40.0
        assert ("shadow", "canary_rate_per_second") in changed_leaves(rendered, doc) - LOCAL_KEYS


def prometheus_config(objs: Sequence[Obj], pods: Sequence[Pod], tmp: Path, am: str) -> Obj:
    """prometheus.yml: the monitors' scrape jobs, the PrometheusRule's rules, Alertmanager."""
    rule = one(objs, "PrometheusRule")
    rules = tmp / "rules.yaml"
    rules.write_text(yaml.safe_dump(rule["spec"], sort_keys=False))
    jobs: list[Obj] = []
    for kind in ("PodMonitor", "ServiceMonitor"):
        for m in (o for o in objs if o["kind"] == kind):
            jobs += scrape_configs(m, pods, interval="1s")
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": jobs,
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [am.split("//")[1]]}]}]},
    }


async def query(session: aiohttp.ClientSession, prom: str, expr: str) -> list[Obj]:
    async with session.get(f"{prom}/api/v1/query", params={"query": expr}) as r:
        body: Obj = await r.json()
    assert body["status"] == "success", (expr, body)
    result: list[Obj] = body["data"]["result"]
    return result


async def own_alpha(session: aiohttp.ClientSession, url: str) -> float:
    """α from a server's own ``/metrics``: accepted over draft tokens."""
    async with session.get(f"{url}/metrics") as r:
        text = await r.text()
    acc = sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("vllm:spec_decode_num_accepted_tokens_total{")
    )
    draft = sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("vllm:spec_decode_num_draft_tokens_total{")
    )
    return acc / draft


@contextlib.asynccontextmanager
async def layout(
    tmp: Path, name: str
) -> AsyncIterator[tuple[aiohttp.ClientSession, str, str, dict[str, str]]]:
    """Everything of one layout running; yields (session, Prometheus URL, Alertmanager URL,
    role → simulator URL) once every dashboard panel has data."""
    objs = kustomize_build(
        REPO / "deploy" / ("overlays/example" if name == "in-pod" else "standalone")
    )
    session = aiohttp.ClientSession()
    port = free_port()
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(session.close)
        urls: dict[str, str] = {}
        if name == "in-pod":
            dep = one(objs, "Deployment", "vllm-pair")
            containers = {c["name"]: c for c in dep["spec"]["template"]["spec"]["containers"]}
            for cname in ("vllm-standard", "vllm-fly"):
                role, flags = vllm_flags(containers[cname])
                urls[role] = await stack.enter_async_context(simulate(tmp, cname, role, flags))
        else:
            # the servers the standalone config.yaml describes (method, K, scheduler limits)
            cfg_doc = yaml.safe_load(
                one(objs, "ConfigMap", "specwatch-config")["data"]["config.yaml"]
            )
            for t in cfg_doc["targets"]:
                role = t["role"]
                flags = [
                    "--served-model-name=llama-3.1-8b-instruct",
                    f"--method={t['method']}",
                    f"--num-speculative-tokens={t['num_speculative_tokens']}",
                    f"--max-num-seqs={t['max_num_seqs']}",
                    f"--max-num-batched-tokens={t['max_num_batched_tokens']}",
                ]
                urls[role] = await stack.enter_async_context(simulate(tmp, role, role, flags))
        am = (
            await stack.enter_async_context(
                running_alertmanager(tmp, session, config=yaml.safe_dump(AM_CONFIG))
            )
        ).url
        cfg = sidecar_config(objs, {**urls, "alertmanager": am}, tmp, port)
        await stack.enter_async_context(
            specwatch_process(tmp, ["run", "--config", str(cfg)], port=port)
        )
        sidecar = f"127.0.0.1:{port}"
        if name == "in-pod":
            dep = one(objs, "Deployment", "vllm-pair")
            address = {"vllm-standard": urls["standard"], "vllm-fly": urls["fly"]}
            ports = [
                Port(c, pname, num, address[c].split("//")[1] if c in address else sidecar)
                for c, plist in container_ports(dep).items()
                for pname, num in plist
                if pname not in ("sw-proxy", "sw-mirror")
            ]
            ns = dep["metadata"]["namespace"]
            pods = [Pod("vllm-pair-0", ns, dep["spec"]["template"]["metadata"]["labels"], ports)]
        else:
            svc = one(objs, "Service", "specwatch")
            dep = one(objs, "Deployment", "specwatch")
            ns = dep["metadata"]["namespace"]
            ((cname, plist),) = container_ports(dep).items()
            pods = [
                Pod(
                    "specwatch-0",
                    ns,
                    dep["spec"]["template"]["metadata"]["labels"],
                    [Port(cname, plist[0][0], plist[0][1], sidecar)],
                    service="specwatch",
                    service_labels=svc["metadata"]["labels"],
                    service_ports={
                        p["name"]: dict(plist)[p["targetPort"]]
                        if isinstance(p["targetPort"], str)
                        else p["targetPort"]
                        for p in svc["spec"]["ports"]
                    },
                ),
                # production-stack: vllm-<model>-engine-service; llm-d: <model>-decode. Both run
                # the server in a container named "vllm"; the user labels the Services once.
                Pod(
                    "vllm-llama-deployment-vllm-0",
                    ns,
                    {"app": "vllm"},
                    [Port("vllm", "container-port", 8000, urls["standard"].split("//")[1])],
                    service="vllm-llama-engine-service",
                    service_labels={"app": "vllm", "specwatch.io/role": "standard"},
                    service_ports={"router-sport": 8000},
                ),
                Pod(
                    "llama-decode-0",
                    ns,
                    {"llm-d.ai/role": "decode"},
                    [Port("vllm", "vllm", 8000, urls["fly"].split("//")[1])],
                    service="llama-decode",
                    service_labels={"specwatch.io/role": "fly"},
                    service_ports={"http": 8000},
                ),
            ]
        config = prometheus_config(objs, pods, tmp, am)
        prom = await stack.enter_async_context(run_prometheus(tmp, config, session))
        if name == "in-pod":
            # as the mesh does: live traffic to the standard server (the vllm Service), and the
            # rendered VirtualService's share of it copied to the sidecar's mirror listener
            vs = one(objs, "VirtualService")
            (share,) = {
                m["percentage"]["value"] for r in vs["spec"]["http"] for m in r.get("mirrors", [])
            }
            mirror_port = yaml.safe_load(cfg.read_text())["shadow"]["mirror_listen_port"]
            shape = LoadConfig(
                concurrency=6,
                duration_s=None,
                max_tokens=48,
                temperature=1.0,
                mirror_url=f"http://127.0.0.1:{mirror_port}",
                mirror_fraction=share / 100,
            )
            load = LoadGenerator([urls["standard"]], shape, session=session)
        else:
            shape = LoadConfig(
                concurrency=6, duration_s=None, fanout=True, max_tokens=48, temperature=1.0
            )
            load = LoadGenerator(list(urls.values()), shape, session=session)
        task = asyncio.create_task(load.run())

        async def stop_load() -> None:
            load.stop()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

        stack.push_async_callback(stop_load)
        last: list[str] = []

        async def all_have_data() -> bool | None:
            last[:] = await empty_panels(session, prom)
            return True if not last else None

        try:
            # the shipped rates (canary 0.2/s, 5 s scrapes): five minutes, as a user would wait
            await poll("every panel has data", all_have_data, within=300, every=5)
        except AssertionError:
            raise AssertionError("panels without data:\n" + "\n".join(last)) from None
        # the scrape labels never rename a series' own labels (honorLabels on specwatch)
        assert await query(session, prom, '{exported_model_name=~".+"}') == []
        assert await query(session, prom, '{exported_role=~".+"}') == []
        yield session, prom, am, urls


OUTCOMES = ("both_correct", "lost", "gained", "both_wrong")


async def own_ledger(session: aiohttp.ClientSession, instance: str) -> dict[tuple[str, str], int]:
    """The sidecar's own ``specwatch_ledger_pairs{arm="fly"}`` from its ``/metrics``:
    (category, outcome) → pairs, correctness outcomes only."""
    async with session.get(f"http://{instance}/metrics") as r:
        text = await r.text()
    own: dict[tuple[str, str], int] = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            if (
                smp.name == "specwatch_ledger_pairs"
                and smp.labels.get("arm") == "fly"
                and smp.labels["outcome"] in OUTCOMES
            ):
                own[(smp.labels["category"], smp.labels["outcome"])] = int(smp.value)
    return own


async def fleet_is_the_sidecars_ledger(session: aiohttp.ClientSession, prom: str) -> None:
    """``specwatch fleet --format json`` gives one model, the served model's name, from one
    sidecar, no series skipped, and per category the 2x2 table of the sidecar's own ``/metrics``
    (``specwatch_ledger_pairs{arm="fly"}``): the pair counts only grow while the canary runs, so
    each cell lies between the sidecar's count read before the last scrape (1.5 s before the
    fleet query, scrapes every 1 s) and its count read after the query."""
    (instance,) = {
        r["metric"]["instance"] for r in await query(session, prom, "specwatch_build_info")
    }
    before = await own_ledger(session, instance)
    await asyncio.sleep(1.5)
    rc, out, err = await run_specwatch("fleet", f"--prometheus-url={prom}", "--format=json")
    after = await own_ledger(session, instance)
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["bad_series"] == {}, out
    assert list(doc["models"]) == ["llama-3.1-8b-instruct"], out
    model = doc["models"]["llama-3.1-8b-instruct"]
    assert model["sidecars"] == 1
    got = {(c, o): v[o] for c, v in model["categories"].items() if c != OVERALL for o in OUTCOMES}
    # the fleet lists a 0 where no series is; a cell whose first pair came after the last
    # scrape (absent before, present after) may be missing from the fleet's table
    assert set(before) <= set(got), (got, before)
    assert all(before.get(cell, 0) == 0 for cell in set(after) - set(got)), (got, after)
    for cell, n in got.items():
        want = (before.get(cell, 0), after.get(cell, 0))
        assert want[0] <= n <= want[1], (cell, want, n)
    assert sum(got.values()) > 0


#: What a token-budget panel reads: the budget the sidecar works out from the configured
#: limits and the K it uses.
BUDGET_SERIES = re.compile(
    r"specwatch_(admission_cap_requests|decode_full_per_step_requests|budget_bound"
    r"|speculative_tokens)\{"
)


async def token_budget_panels_read_the_pages_k(session: aiohttp.ClientSession, prom: str) -> None:
    """The shipped config.yaml sets no num_speculative_tokens, yet every token-budget panel has
    data at its default variables, and the K behind them is each server's own: the
    ``--speculative-config`` K of the rendered Deployment, source ``observed``."""
    dep = one(kustomize_build(REPO / "deploy/overlays/example"), "Deployment", "vllm-pair")
    want = {}
    for c in dep["spec"]["template"]["spec"]["containers"]:
        if c["name"] in ("vllm-standard", "vllm-fly"):
            role, flags = vllm_flags(c)
            (k,) = [f.split("=", 1)[1] for f in flags if f.startswith("--num-speculative-tokens=")]
            want[role] = ("observed", float(k))
    got = {
        r["metric"]["role"]: (r["metric"]["source"], float(r["value"][1]))
        for r in await query(session, prom, "specwatch_speculative_tokens")
    }
    assert got == want
    budget = 0
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text(encoding="utf-8"))
        chosen = [
            p
            for p in dashboard["panels"]
            if any(BUDGET_SERIES.search(t["expr"]) for t in p.get("targets", []))
        ]
        budget += len(chosen)
        values = await variable_values(session, prom, dashboard)
        assert await empty_at(session, prom, {**dashboard, "panels": chosen}, values, "K") == []
    assert budget >= 3  # R_max / D_full, budget bound, limits and K


def largest(doc: object, key: str) -> float:
    """The largest number under ``key`` anywhere in a JSON document (0 when none)."""
    if isinstance(doc, dict):
        here = [float(v) for k, v in doc.items() if k == key and isinstance(v, int | float)]
        return max([*here, *(largest(v, key) for v in doc.values())], default=0.0)
    if isinstance(doc, list):
        return max((largest(v, key) for v in doc), default=0.0)
    return 0.0


async def graded_pairs_and_a_noise_floor(session: aiohttp.ClientSession, prom: str) -> None:
    """With the shipped config as it is, the sidecar's snapshot holds labelled (graded) pairs
    and noise-arm pairs (the noise floor) once the panels have data (within five minutes)."""
    (instance,) = {
        r["metric"]["instance"] for r in await query(session, prom, "specwatch_build_info")
    }
    async with session.get(f"http://{instance}/api/v1/snapshot") as r:
        snap: Obj = await r.json()
    assert largest(snap, "labelled") > 0, json.dumps(snap)[:3000]
    assert largest(snap, "noise_pairs") > 0, json.dumps(snap)[:3000]


@pytest.mark.slow
@pytest.mark.timeout(1500)
async def test_in_pod_deployment_as_shipped(tmp_path: Path) -> None:
    """The example overlay: dashboards full (the token-budget panels with the servers' own K),
    doctor clean, fleet's table under the model name, every shipped rule evaluated, and a
    quality fault paging through the sidecar's own push, routed by severity to the page
    receiver."""
    async with layout(tmp_path, "in-pod") as (session, prom, am, urls):
        await graded_pairs_and_a_noise_floor(session, prom)
        await token_budget_panels_read_the_pages_k(session, prom)
        rendered = tmp_path / "rendered.yaml"
        rendered.write_text(
            yaml.safe_dump_all(kustomize_build(REPO / "deploy/overlays/example")), encoding="utf-8"
        )
        manifests = [str(rendered)]
        last: list[str] = []

        async def doctor_clean() -> bool | None:
            # asked again (3 times at most) when one scrape of the loaded sidecar timed out
            rc, out, err = await run_specwatch(
                "doctor",
                f"--prometheus-url={prom}",
                *(f"--manifest={m}" for m in manifests),
                *(f"--dashboard={d}" for d in DASHBOARDS),
                f"--alertmanager-url={am}",
                "--format=table",
            )
            last[:] = [out + err]
            if rc != 0 or "FAIL" in out:
                return None
            # the live Alertmanager's inhibit rule compares labels specwatch's alerts carry
            assert f"OK    inhibit    {am}: inhibit rule 1: equal labels carried" in out, out
            # the ledger on the overlay's PersistentVolumeClaim, and the mesh's 100 % copies
            assert (
                "OK    ledger     Deployment vllm-pair keeps the ledger on a lasting volume" in out
            )
            assert "WARN  ledger" not in out, out
            assert "OK    mirror" in out, out
            return True

        try:
            await poll("doctor says all is well", doctor_clean, within=10, every=2)
        except AssertionError:
            raise AssertionError(last[0]) from None

        await fleet_is_the_sidecars_ledger(session, prom)

        await rules_loaded_and_evaluated(session, prom)

        # a quality fault on the FLy server: its model favours a wrong answer to every item, so
        # FLy loses the canary items standard answers right
        fault = {"wrong_answer_rate": 1.0}
        async with session.post(f"{urls['fly']}/admin/faults", json=fault) as r:
            assert r.status == 200

        async def paged() -> list[Obj] | None:
            # the sidecar's own push (its labels name the hypothesis; Prometheus's rule does not)
            flt = ['alertname="SpecQualityDrift"', 'hypothesis=~".+"']
            async with session.get(f"{am}/api/v2/alerts", params={"filter": flt}) as r:
                got: list[Obj] = await r.json()
            return got or None

        # evidence at 0.2 canary pairs/s, then the shipped 5-minute hold (quality_e_value_for)
        alerts = await poll("SpecQualityDrift in Alertmanager", paged, within=900, every=5)
        assert {a["labels"]["severity"] for a in alerts} == {"critical"}
        assert {r["name"] for a in alerts for r in a["receivers"]} == {"page"}
        assert {a["status"]["state"] for a in alerts} == {"active"}


async def rules_loaded_and_evaluated(session: aiohttp.ClientSession, prom: str) -> None:
    """Every group of the rendered PrometheusRule is loaded with every rule, each evaluated at
    least once and none with an error (the durations as shipped: most ``for`` holds outlast
    the test, so firing is shown by the sidecar's own push instead)."""
    async with session.get(f"{prom}/api/v1/rules") as r:
        body: Obj = await r.json()
    groups = body["data"]["groups"]
    shipped = one(kustomize_build(REPO / "deploy/overlays/example"), "PrometheusRule")["spec"]
    assert sorted(g["name"] for g in groups) == sorted(g["name"] for g in shipped["groups"])
    assert sum(len(g["rules"]) for g in groups) == sum(len(g["rules"]) for g in shipped["groups"])
    for g in groups:
        for rule in g["rules"]:
            assert rule["health"] == "ok", (rule["name"], rule.get("lastError"))
            assert not rule.get("lastError"), rule
            assert not rule["lastEvaluation"].startswith("0001-"), rule["name"]


@pytest.mark.slow
async def test_standalone_deployment_tells_roles_apart(tmp_path: Path) -> None:
    """The standalone layout beside production-stack / llm-d servers (both container "vllm"):
    every dashboard full at defaults, and the vLLM cross-check panel gives one α per role equal to
    each server's own counters, not one merged α."""
    async with layout(tmp_path, "standalone") as (session, prom, _am, urls):
        overview = json.loads((REPO / "grafana/specwatch-overview.json").read_text())
        panel = next(
            p
            for p in overview["panels"]
            if "vLLM" in p.get("title", "") and "accepted" in p.get("description", "")
        )
        expr = panel["targets"][0]["expr"]
        expr = expr.replace("$__rate_interval", "1h").replace('"$namespace"', '"llm-serving"')
        expr = re.sub(r'=~"\$\w+"', '=~".*"', expr)
        expr = expr.replace("rate(", "increase(")
        got: dict[str, float] = {}

        async def both_roles() -> bool | None:
            # increase() needs two scrapes of each server; "every panel has data" needed one role
            got.clear()
            got.update(
                {
                    r["metric"].get("role", ""): float(r["value"][1])
                    for r in await query(session, prom, expr)
                }
            )
            return True if set(got) >= {"standard", "fly"} else None

        with contextlib.suppress(AssertionError):
            await poll("an α for each role", both_roles, within=30, every=1)
        assert set(got) == {"standard", "fly"}, got
        for role, url in urls.items():
            # counters keep moving under load: the two reads are a scrape apart at most
            assert got[role] == pytest.approx(await own_alpha(session, url), abs=0.03), role
        assert abs(got["standard"] - got["fly"]) > 0.02, got
        await fleet_is_the_sidecars_ledger(session, prom)
