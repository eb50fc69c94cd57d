"""Pins for "one home per concept": each shared rule or constant is defined once, and the
copies that used to exist cannot come back unnoticed."""

from __future__ import annotations

import ast
import math
import re

import pytest
import yaml

from specwatch.alerts import conditions, rules
from specwatch.core import config as core_config
from specwatch.core import roles, wire
from specwatch.core.numbers import exp_or_inf, finite_or_none
from specwatch.observe import window
from specwatch.shadow.settings import ShadowSettings
from specwatch.shadow.stats import paired
from specwatch.shadow.stats.eprocess import COMPONENTS
from specwatch.shadow.stats.paired import PairedCounts
from specwatch.simulate import config as sim_config
from specwatch.tools.offline.paired_test import _table, paired_report
from tests.fakes import REPO
from tests.shadow.stats.eprocess_reference import count_form

ROOT = REPO
PKG = ROOT / "specwatch"


def _sources() -> dict[str, str]:
    return {str(p.relative_to(PKG)): p.read_text() for p in sorted(PKG.rglob("*.py"))}


def _string_constants(src: str) -> set[str]:
    """Every string literal in ``src`` that is not a docstring."""
    tree = ast.parse(src)
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return {
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
    }


_SQL = re.compile(r"\bSELECT\b|\bINSERT\b|execute\(|sqlite3\.connect")


def _sql_outside_the_ledger(sources: dict[str, str]) -> list[str]:
    """The modules of ``sources`` (paths under specwatch/) outside shadow/ledger/ with SQL."""
    return [
        n for n, src in sources.items() if not n.startswith("shadow/ledger/") and _SQL.search(src)
    ]


def test_sql_only_in_the_ledger() -> None:
    """No ``SELECT``/``INSERT``/``execute(``/``sqlite3.connect`` anywhere in specwatch/ but the
    package shadow/ledger/ (the e-process and reports read the ledger through its methods),
    and the pattern does find the package's own SQL (so the pin is not vacuous)."""
    sources = _sources()
    assert _sql_outside_the_ledger(sources) == []
    inside = {
        n for n, src in sources.items() if n.startswith("shadow/ledger/") and _SQL.search(src)
    }
    assert {"shadow/ledger/writer.py", "shadow/ledger/files.py"} <= inside


def test_sql_outside_the_ledger_package_is_caught() -> None:
    """An ``execute(`` call or an SQL string in any module outside shadow/ledger/, even one named
    like it (shadow/ledger.py, shadow/ledger_extra.py), is reported; inside the package it is
    not."""
    sources = {
        "shadow/ledger/queries.py": 'SQL = "SELECT 1"',
        "shadow/ledger.py": 'SQL = "SELECT COUNT(*) FROM pairs"',
        "shadow/ledger_extra.py": "conn.execute(sql)",
        "report/data.py": 'q = "INSERT INTO pairs VALUES (1)"',
        "shadow/component.py": "x = 1",
    }
    assert _sql_outside_the_ledger(sources) == [
        "shadow/ledger.py",
        "shadow/ledger_extra.py",
        "report/data.py",
    ]


def test_the_exp_overflow_limit_is_written_once() -> None:
    """``709`` (the largest safe ``exp`` argument) appears only in core/numbers.py."""
    offenders = [n for n, src in _sources().items() if "709" in src and n != "core/numbers.py"]
    assert offenders == []


def test_exp_or_inf_and_finite_or_none_by_hand() -> None:
    """exp(0) = 1, exp(709) is finite (≈ 8.2e307), anything above 709 is inf; JSON drops inf/NaN."""
    assert exp_or_inf(0.0) == 1.0
    assert exp_or_inf(709.0) == math.exp(709.0)
    assert exp_or_inf(709.5) == math.inf
    assert exp_or_inf(1e6) == math.inf
    assert finite_or_none(2.5) == 2.5
    assert finite_or_none(math.inf) is None
    assert finite_or_none(math.nan) is None
    assert finite_or_none(None) is None


def test_paired_test_reports_inf_not_a_clamped_e_value() -> None:
    """n losses and no gains: the no-net-loss e-value is Σ_j w_j (2 θ_j)^n, dominated by its
    largest lost share (θ = 0.98, weight 0.021): for n = 2000 its log is ≈ 2000 ln 1.96 ≈ 1345.9
    > 709, so ``paired-test`` says inf (it used to print exp(709)); for n = 1000 (log ≈ 669) it
    is the finite sum."""
    big = paired_report(PairedCounts(0, 2000, 0, 0), margin=0.01, alpha=0.05)
    assert big["e_value"] == math.inf
    assert "inf" in _table(big)
    small = paired_report(PairedCounts(0, 1000, 0, 0), margin=0.01, alpha=0.05)
    assert small["e_value"] == pytest.approx(count_form(1000, 0), rel=1e-9)
    theta, weight = COMPONENTS[-1]
    assert theta == 0.98
    assert small["e_value"] == pytest.approx(weight * 1.96**1000, rel=0.01)


def test_mcnemar_lives_in_stats_paired() -> None:
    """Both z forms are defined once, in shadow/stats/paired.py; the alert conditions use them.
    By hand: 9 lost, 1 gained → z = 8/√10; pooled two-proportion z of 30/100 vs 10/100 is
    0.2 / √(0.2·0.8·0.02) = 0.2 / 0.056569 = 3.5355."""
    defs = [
        n
        for n, src in _sources().items()
        if re.search(r"^def (mcnemar\w*|two_proportion_z)\(", src, re.M)
    ]
    assert defs == ["shadow/stats/paired.py"]
    assert conditions.mcnemar_z is paired.mcnemar_z
    assert conditions.two_proportion_z is paired.two_proportion_z
    assert paired.mcnemar_z(9, 1) == pytest.approx(8 / math.sqrt(10))
    assert paired.two_proportion_z(30, 100, 10, 100) == pytest.approx(3.5355339, rel=1e-6)


def test_since_start_and_overall_are_named_once() -> None:
    """The literals ``"since_start"`` and ``"_all"`` appear (outside docstrings) only in
    core/config.py; the observe window and the detectors use that constant."""
    offenders = [
        n
        for n, src in _sources().items()
        if n != "core/config.py" and {"since_start", "_all"} & _string_constants(src)
    ]
    assert offenders == []
    assert window.SINCE_START is core_config.SINCE_START  # type: ignore[attr-defined]
    assert rules.SINCE_START is core_config.SINCE_START  # type: ignore[attr-defined]
    assert (core_config.SINCE_START, core_config.OVERALL) == ("since_start", "_all")


def test_one_role_enum() -> None:
    """The simulator uses core.roles.Role; no other ``class Role`` exists."""
    assert sim_config.Role is roles.Role
    defs = [n for n, src in _sources().items() if re.search(r"^class Role\b", src, re.M)]
    assert defs == ["core/roles.py"]


def test_wire_constants_are_written_once() -> None:
    """Header names and the ``-shadow`` suffix appear as literals only in core/wire.py."""
    wanted = {"X-Specwatch-Category", "X-Specwatch-Shadow", "-shadow"}
    offenders = [
        n
        for n, src in _sources().items()
        if n != "core/wire.py" and wanted & _string_constants(src)
    ]
    assert offenders == []


@pytest.mark.parametrize(
    ("url", "base"),
    [
        ("http://h:8000/metrics", "http://h:8000"),
        ("http://h:8000/metrics/", "http://h:8000"),
        ("http://h:8000/", "http://h:8000"),
        ("http://h:8000/v1/metrics", "http://h:8000/v1"),
        ("http://h:8000", "http://h:8000"),
    ],
)
def test_server_base_strips_metrics_and_slashes(url: str, base: str) -> None:
    """One base-URL rule for arm ↔ target matching and for arms named by target."""
    assert wire.server_base(url) == base


def test_server_base_is_the_only_base_stripper() -> None:
    """No other module strips ``/metrics`` off a URL by hand."""
    offenders = [
        n
        for n, src in _sources().items()
        if n != "core/wire.py" and re.search(r"""-\s*len\(["']/metrics["']\)""", src)
    ]
    assert offenders == []


def test_default_proxy_port_is_free_in_the_shipped_pod() -> None:
    """``shadow.proxy_listen_port`` defaults to 9401: the port the specwatch container declares for
    its proxy, and no other container's port or ``--port`` argument in deploy/base/deployment.yaml
    (the FLy vLLM server listens on 8001, the old default)."""
    doc = yaml.safe_load((ROOT / "deploy/base/deployment.yaml").read_text())
    containers = doc["spec"]["template"]["spec"]["containers"]
    default = ShadowSettings().proxy_listen_port
    assert default == 9401
    own: set[int] = set()
    others: set[int] = set()
    for c in containers:
        ports = {p["containerPort"] for p in c.get("ports", [])}
        ports |= {int(a.split("=", 1)[1]) for a in c.get("args", []) if a.startswith("--port=")}
        (own if c["name"] == "specwatch" else others).update(ports)
    assert default in own
    assert default not in others
    assert 8001 in others
