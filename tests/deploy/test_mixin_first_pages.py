"""The rendered mixin's quality rules against ``first_pages`` through promtool.

A seeded stream of ``(category, outcome)`` pairs: harmless in three categories, then a loss in
one of them. One pair a minute, the sidecar's since-start gauges after each pair (the
no-net-loss e-value of all pairs and of each category, the margin e-process, the change
detector) become promtool input series, computed with the functions the sidecar folds. At the
minute before and the minute of every first page and warning that ``first_pages`` reports (and
at the end), promtool evaluates the shipped rules (``deploy/mixin/specwatch.rules.yaml``, their
expressions, ``for`` and labels; annotations dropped, they are text) and must find exactly the
alerts that the policy's bounds give on those values; the first minute at which each fires is
``first_pages``' pair.
"""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

from deploy.mixin.render import DEFAULT_RULES
from specwatch.shadow.settings import PairedSettings
from specwatch.shadow.stats import first_pages
from specwatch.shadow.stats.eprocess import net_loss_log_e_values, net_loss_path
from specwatch.shadow.stats.policy import CHANGE, MARGIN, NO_NET_LOSS, PAGE, PagePolicy, page_key
from specwatch.shadow.stats.sequential import betting_log_wealth

pytestmark = pytest.mark.promtool

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
CATS = ("a", "b", "c")
SIDECAR = {"job": "specwatch", "instance": "sw:9464", "window": "since_start"}


def _stream() -> list[tuple[str, int]]:
    """100 harmless pairs (40 % discordance), then 500 where category b loses 19 in 20 of its
    discordant pairs."""
    rng = np.random.default_rng(33)
    out: list[tuple[str, int]] = []
    for t in range(600):
        c = CATS[int(rng.integers(0, 3))]
        share = 0.95 if t >= 100 and c == "b" else 0.5
        u, v = rng.random(), rng.random()
        out.append((c, 0 if u >= 0.4 else (1 if v < share else -1)))
    return out


def _gauges(pairs: list[tuple[str, int]]) -> dict[tuple[str, str, str], list[float]]:
    """(alert, category, hypothesis) -> the gauge after each pair (index 0: before any)."""
    x = np.array([v for _, v in pairs], dtype=np.int64)
    names = np.array([c for c, _ in pairs], dtype=object)
    path = net_loss_path(x)
    out: dict[tuple[str, str, str], list[float]] = {
        (PAGE, "_all", NO_NET_LOSS): [1.0, *np.exp(path.log_e).tolist()],
        (CHANGE, "_all", ""): [0.0, *np.exp(path.log_detector).tolist()],
    }
    bet, _ = betting_log_wealth(x.astype(np.float64), PairedSettings().margin)
    out[(PAGE, "_all", MARGIN)] = [1.0, *np.exp(bet).tolist()]
    for c in CATS:
        idx = np.flatnonzero(names == c)
        per = np.exp(net_loss_log_e_values(x[idx]))
        seen = np.searchsorted(idx, np.arange(x.size), side="right") - 1
        after = np.where(seen >= 0, per[np.maximum(seen, 0)], 1.0)
        out[(PAGE, c, NO_NET_LOSS)] = [1.0, *after.tolist()]
    return out


def _series(key: tuple[str, str, str], values: list[float]) -> dict[str, str]:
    alert, category, hypothesis = key
    if alert == CHANGE:
        labels = f'job="{SIDECAR["job"]}",instance="{SIDECAR["instance"]}"'
        return {"series": f"specwatch_paired_change_detector{{{labels}}}", "values": _vals(values)}
    labels = ",".join(f'{k}="{v}"' for k, v in SIDECAR.items())
    labels += f',category="{category}",hypothesis="{hypothesis}"'
    return {"series": f"specwatch_paired_e_value{{{labels}}}", "values": _vals(values)}


def _vals(values: list[float]) -> str:
    return " ".join(repr(float(v)) for v in values)


def _fires(key: tuple[str, str, str], value: float, policy: PagePolicy) -> bool:
    alert, category, hypothesis = key
    if alert == CHANGE:
        return policy.change_fires(math.log(value)) if value > 0 else False
    return policy.pages(category, hypothesis, math.log(value))


def _labels(key: tuple[str, str, str]) -> dict[str, str]:
    alert, category, hypothesis = key
    if alert == CHANGE:
        base = {"job": SIDECAR["job"], "instance": SIDECAR["instance"]}
        return {**base, "severity": "warning", "check": "change", "category": "_all"}
    return {**SIDECAR, "category": category, "hypothesis": hypothesis} | {
        "severity": "critical",
        "check": "e_value",
    }


def _key_name(key: tuple[str, str, str]) -> str:
    alert, category, hypothesis = key
    if alert == CHANGE:
        return page_key(CHANGE, {"category": category})
    return page_key(PAGE, {"category": category, "hypothesis": hypothesis})


def test_rendered_rules_fire_where_first_pages_says(tmp_path: Path) -> None:
    """On the stream's gauges the policy fires first where ``first_pages`` says (overall, the
    lossy category and the margin test page; the harmless categories do not), and promtool
    finds the shipped rules firing exactly those alerts at every checked minute."""
    pairs = _stream()
    settings = PairedSettings()
    policy = PagePolicy.of(settings)
    expected_first = first_pages(pairs, settings)
    gauges = _gauges(pairs)
    # the policy on the gauges gives first_pages' pairs (minute t = after pair t)
    for key, values in gauges.items():
        hits = [t for t, v in enumerate(values) if t > 0 and _fires(key, v, policy)]
        assert (hits[0] if hits else None) == expected_first[_key_name(key)], key
    paged = [v for k, v in expected_first.items() if v is not None]
    assert expected_first[page_key(PAGE, {"category": "_all", "hypothesis": NO_NET_LOSS})]
    assert expected_first[page_key(PAGE, {"category": "b", "hypothesis": NO_NET_LOSS})]
    assert expected_first[page_key(PAGE, {"category": "a", "hypothesis": NO_NET_LOSS})] is None
    times = sorted({t for v in paged for t in (v - 1, v)} | {len(pairs)})

    rules = yaml.safe_load(DEFAULT_RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    tests: list[dict[str, object]] = []
    for alertname in (PAGE, CHANGE):
        for t in times:
            firing = [
                {"exp_labels": _labels(k)}
                for k, vals in gauges.items()
                if k[0] == alertname and _fires(k, vals[t], policy)
            ]
            tests.append({"eval_time": f"{t}m", "alertname": alertname, "exp_alerts": firing})
    doc = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [_series(k, v) for k, v in gauges.items()],
                "alert_rule_test": tests,
            }
        ],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(doc, width=10**9))
    out = subprocess.run(
        [PROMTOOL, "test", "rules", str(tmp_path / "test.yaml")],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
