"""The package layers hold: import-linter's contracts pass, and the observe chain stays light."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.fakes import REPO

HEAVY = ("aiohttp", "scipy", "rapidfuzz", "pydantic_settings")


def test_import_contracts_hold() -> None:
    """``lint-imports`` (contracts in pyproject.toml) exits 0; on failure its report is shown."""
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe is not None, "lint-imports is not installed (it is in the test extra)"
    proc = subprocess.run(
        [exe, "--no-cache"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_tracker_import_loads_no_io_or_stats_stack() -> None:
    """``import specwatch.observe.tracker`` in a fresh interpreter loads none of aiohttp, scipy,
    rapidfuzz or pydantic_settings (the observe chain is pure computation)."""
    code = (
        "import json, sys; import specwatch.observe.tracker; "
        f"print(json.dumps(sorted(m for m in {list(HEAVY)!r} if m in sys.modules)))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(proc.stdout) == []


def test_tracker_import_loads_no_pydantic() -> None:
    """The observe chain alone does not load pydantic: settings types are annotations only."""
    code = "import sys; import specwatch.observe.tracker; print('pydantic' in sys.modules)"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert proc.stdout.strip() == "False"


def test_architecture_note_states_the_contracts() -> None:
    """docs/architecture.md names the layer order and every forbidden contract of pyproject.toml
    (its source packages, then its forbidden list)."""
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"][
        "contracts"
    ]
    note = " ".join((REPO / "docs" / "architecture.md").read_text().split())

    def short(module: str) -> str:
        return module.removeprefix("specwatch.")

    layers = next(c for c in contracts if c["type"] == "layers")["layers"]
    order = " > ".join(
        " | ".join(f"`{short(m)}`" for m in layer.split(" | ")) for layer in layers
    ).replace("`observe` | `shadow`", "`observe | shadow` (independent)")
    assert order in note
    for c in contracts:
        if c["type"] == "forbidden":
            sources = ", ".join(f"`{short(m)}`" for m in c["source_modules"])
            listed = ", ".join(short(m) for m in c["forbidden_modules"])
            assert f"{sources} (forbidden: {listed})" in note, sources
