"""The running sidecar loads none of the tools, the simulator, the demo or the report.

``specwatch run`` (what the container runs) is started for real, with Python's import-time
profile on (``PYTHONPROFILEIMPORTTIME=1`` is ``-X importtime``: one ``import time:`` line per
module on stderr), until it answers ``/healthz``; then every module it loaded is checked against
:data:`FORBIDDEN`. A quicker check imports every module of the runtime packages in a fresh
interpreter. The import-linter contract in ``pyproject.toml`` says the same about the import
statements; these tests check what a running process actually loads (a lazy import inside a
function, or a third-party package pulling in matplotlib, shows here and not there).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes import REPO
from tests.sidecar_process import free_port, run_config, specwatch_process

#: Module-name prefixes the running sidecar must never load.
FORBIDDEN = (
    "specwatch.tools",
    "specwatch.simulate",
    "specwatch.demo",
    "specwatch.report",
    "specwatch.cli.simulate",
    "specwatch.cli.demo",
    "matplotlib",
)

#: The runtime packages (what ``specwatch run`` and the container execute).
RUNTIME = (
    "core",
    "vllm",
    "observe",
    "shadow",
    "alerts",
    "export",
    "server",
    "settings",
)


def importtime_modules(text: str) -> list[str]:
    """The module names of ``-X importtime`` lines in ``text``, in load order:
    ``import time:       120 |        340 |   specwatch.core.clock`` -> ``specwatch.core.clock``."""
    return [
        line.rsplit("|", 1)[1].strip()
        for line in text.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    ][1:]  # the first line is the header (``self [us] | cumulative | imported package``)


def forbidden(modules: list[str]) -> list[str]:
    """The modules of ``modules`` that are, or are under, a :data:`FORBIDDEN` name."""
    return sorted({m for m in modules if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)})


def test_importtime_lines_are_read() -> None:
    """The header line is skipped, nested imports (indented) are read, other lines ignored."""
    text = (
        "import time: self [us] | cumulative | imported package\n"
        "import time:       120 |        340 | specwatch.core\n"
        "import time:        80 |         80 |   matplotlib.pyplot\n"
        '{"event": "listening"}\n'
    )
    assert importtime_modules(text) == ["specwatch.core", "matplotlib.pyplot"]
    assert forbidden(importtime_modules(text)) == ["matplotlib.pyplot"]
    assert forbidden(["specwatch.toolsy", "specwatch.tools", "specwatch.cli.run"]) == [
        "specwatch.tools"
    ]


async def test_specwatch_run_loads_no_tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``specwatch run`` with one unreachable target, started as a process and stopped once it
    answers /healthz, loaded its server and chains and none of :data:`FORBIDDEN`."""
    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")
    port = free_port()
    cfg = run_config(tmp_path, port)
    async with specwatch_process(tmp_path, ["run", "--config", str(cfg)], port=port) as p:
        code, _ = await p.stop(signal.SIGTERM)
    modules = importtime_modules(p.log_text())
    assert code == 0, p.log_text()[-3000:]
    loaded = {"specwatch.cli.run", "specwatch.server.app", "specwatch.observe.loop"}
    assert loaded <= set(modules)
    assert forbidden(modules) == []


@pytest.mark.parametrize(
    ("command", "module"),
    [
        ("doctor", "specwatch.tools.doctor.command"),
        ("fleet", "specwatch.tools.fleet.command"),
        ("simulate", "specwatch.cli.simulate"),
    ],
)
def test_the_check_sees_a_tool_loaded(command: str, module: str) -> None:
    """The same reading of the import-time profile finds the tool when a tool's command runs
    (``--help`` is enough to load its module), so the test above can fail."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "specwatch", command, "--help"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=True,
    )
    assert module in forbidden(importtime_modules(done.stderr)), done.stderr[-2000:]


def _loaded_by_runtime(extra: tuple[str, ...]) -> list[str]:
    """Every module of the runtime packages and ``specwatch.cli.run`` (plus ``extra``) imported
    in a fresh interpreter: the forbidden modules it then holds."""
    probe = (
        "import importlib, json, pkgutil, sys\n"
        "import specwatch\n"
        f"names = [f'specwatch.{{p}}' for p in {RUNTIME!r}] + ['specwatch.cli.run', *{extra!r}]\n"
        "for name in list(names):\n"
        "    module = importlib.import_module(name)\n"
        "    for info in pkgutil.walk_packages(getattr(module, '__path__', []), name + '.'):\n"
        "        importlib.import_module(info.name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=True,
    )
    modules: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return forbidden(modules)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ((), []),
        (("specwatch.tools.fleet.stats",), ["specwatch.tools", "specwatch.tools.fleet"]),
        (("specwatch.simulate.lm",), ["specwatch.simulate"]),
    ],
)
def test_every_runtime_module_imports_no_tool(extra: tuple[str, ...], expected: list[str]) -> None:
    """Importing every module of core, vllm, observe, shadow, alerts, export, server, settings
    and ``specwatch.cli.run`` loads no forbidden module; importing one tool or simulator module
    beside them is seen (its package is among the forbidden modules found)."""
    found = _loaded_by_runtime(extra)
    assert set(expected) <= set(found)
    if not expected:
        assert found == []
