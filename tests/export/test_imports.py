"""export/ reads only value modules, and every label vocabulary it exports from 0 has one home
beside its producer."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from specwatch.alerts import values as alert_values
from specwatch.core import listen
from specwatch.observe import concurrency
from specwatch.observe import values as observe_values
from specwatch.shadow import classify
from specwatch.shadow import values as shadow_values
from tests.fakes import REPO

PKG = REPO / "specwatch"

#: What export/ may import from the rest of specwatch: the package version, the shared core
#: helpers, each chain's values module, and the shadow chain's published statistics
#: (``ShadowStats`` in ``published``, the builder in ``summary`` and the ``PairTally`` it
#: summarises) with its one verdict sentence.
ALLOWED: frozenset[str] = frozenset(
    {
        "specwatch",  # __version__
        "specwatch.core.clock",
        "specwatch.core.config",
        "specwatch.core.listen",
        "specwatch.core.logs",
        "specwatch.core.numbers",
        "specwatch.observe.values",
        "specwatch.shadow.values",
        "specwatch.shadow.published",
        "specwatch.shadow.summary",
        "specwatch.shadow.tally",
        "specwatch.shadow.verdict",
        "specwatch.alerts.values",
    }
)


def _imported(path: Path) -> set[str]:
    """Every ``specwatch`` module ``path`` imports, at any depth (``TYPE_CHECKING`` blocks and
    imports inside functions included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: relative import"
            assert node.module is not None
            found.add(node.module)
    return {m for m in found if m == "specwatch" or m.startswith("specwatch.")}


def test_export_imports_only_value_modules() -> None:
    """Outside its own package, every module of specwatch/export imports only :data:`ALLOWED`
    (no ledger, ingest, compare, decision or Alertmanager client module)."""
    outside = {
        path.name: sorted(
            m for m in _imported(path) if not m.startswith("specwatch.export") and m not in ALLOWED
        )
        for path in sorted((PKG / "export").glob("*.py"))
    }
    assert {name: mods for name, mods in outside.items() if mods} == {}


def test_the_import_scan_sees_nested_and_type_checking_imports(tmp_path: Path) -> None:
    """The scan above reads imports under ``if TYPE_CHECKING:`` and inside functions too."""
    src = tmp_path / "m.py"
    src.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from specwatch.shadow.ledger import Ledger\n"
        "def f():\n    import specwatch.shadow.compare\n"
        "from specwatch import __version__\n"
    )
    assert _imported(src) == {"specwatch", "specwatch.shadow.ledger", "specwatch.shadow.compare"}


#: vocabulary name -> the one module (under specwatch/) that assigns it.
HOMES: dict[str, str] = {
    "EXCLUDED_REASONS": "shadow/values.py",
    "WRITE_ERROR_REASONS": "shadow/values.py",
    "PROXY_UPSTREAM_ERROR_REASONS": "shadow/values.py",
    "VERDICTS": "shadow/values.py",
    "SCRAPE_ERROR_REASONS": "observe/values.py",
    "INVALID_REASONS": "observe/values.py",
    "THROUGHPUT_WITHHELD_REASONS": "observe/values.py",
    "LIMIT_STATUSES": "observe/concurrency.py",
    "LIMIT_REFERENCES": "observe/concurrency.py",
    "SEND_ERROR_REASONS": "alerts/values.py",
    "STATE_ERROR_REASONS": "alerts/values.py",
    "REFUSAL_REASONS": "core/listen.py",
}


def _assigned_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def test_each_vocabulary_is_assigned_in_one_module() -> None:
    """Each exported-from-0 label vocabulary is assigned in exactly its home module (the others
    import it), so the producer and the exporter can never list different names."""
    assigned: dict[str, list[str]] = {name: [] for name in HOMES}
    for path in sorted(PKG.rglob("*.py")):
        for name in _assigned_names(path) & HOMES.keys():
            assigned[name].append(str(path.relative_to(PKG)))
    assert assigned == {name: [home] for name, home in HOMES.items()}


def documented_values(family: str, label: str) -> set[str]:
    """The values docs/metrics.md gives ``label`` of ``family``: the backticked plain names in
    the parentheses after the label in the row's labels cell, else in the row's last cell (the
    meaning, where a long list is explained value by value)."""
    text = (REPO / "docs/metrics.md").read_text(encoding="utf-8")
    (row,) = [line for line in text.splitlines() if line.startswith(f"| `{family}` |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    where = cells[-1]
    for cell in cells[1:-1]:
        m = re.search(rf"`{label}` \(([^)]*)\)", cell)
        if m is not None:
            where = m.group(1)
    return set(re.findall(r"`([a-z][a-z_]*)`", where))


@pytest.mark.parametrize(
    ("vocabulary", "family", "label"),
    [
        (observe_values.SCRAPE_ERROR_REASONS, "specwatch_scrape_errors_total", "reason"),
        (listen.REFUSAL_REASONS, "specwatch_listener_refused_total", "reason"),
        (observe_values.LIMIT_STATUSES, "specwatch_speculation_limit_state", "state"),
        (concurrency.LIMIT_REFERENCES, "specwatch_speculation_limit_state", "reference"),
        (shadow_values.VERDICTS, "specwatch_decision_verdict", "verdict"),
        (alert_values.STATE_ERROR_REASONS, "specwatch_alert_state_errors_total", "reason"),
    ],
)
def test_literal_vocabularies_are_the_documented_values(
    vocabulary: tuple[str, ...], family: str, label: str
) -> None:
    """The tuples built from the ``Literal`` types the producers are typed with (so mypy checks
    every name a producer writes) hold exactly the values docs/metrics.md documents for the
    family's label, with no name twice: the written list operators read is the independent
    source, so a name added to the code and not explained (or the reverse) fails here."""
    assert len(set(vocabulary)) == len(vocabulary)
    assert set(vocabulary) == documented_values(family, label)


def test_producers_read_the_shared_definitions() -> None:
    """The names the producers' modules use are the values modules' objects, not copies."""
    assert classify.EXCLUDED_REASONS is shadow_values.EXCLUDED_REASONS
    assert observe_values.LIMIT_STATUSES is concurrency.LIMIT_STATUSES
