"""Project-level promises: the README's two commands, CI running exactly the test command."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version

import pytest

from specwatch import __version__
from tests.fakes import REPO

ROOT = REPO


def readme_bash_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(r"```bash\n(.*?)```", text, flags=re.S)


class TestReadme:
    def test_first_command_installs_and_runs_the_demo(self) -> None:
        """The README's first command installs the project and runs `specwatch demo`."""
        first = readme_bash_blocks()[0].strip()
        assert "pip install" in first
        assert first.endswith("specwatch demo")

    def test_ci_runs_exactly_the_readme_test_command(self) -> None:
        """`.ci/run` runs the README's second command, verbatim, as its last test step."""
        test_command = readme_bash_blocks()[1].strip()
        ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
        ci_lines = [line.strip() for line in ci.splitlines()]
        assert test_command in ci_lines
        for step in ("ruff check .", "ruff format --check .", "mypy --strict"):
            assert step in ci_lines
            assert ci_lines.index(step) < ci_lines.index(test_command)

    def test_readme_links_exist(self) -> None:
        """Every relative link in the README points at a file in the repository."""
        text = (ROOT / "README.md").read_text(encoding="utf-8")
        for link in re.findall(r"\]\(([^)#]+)\)", text):
            if "://" in link:
                continue
            assert (ROOT / link).exists(), link


class TestPackaging:
    def test_version_matches_metadata(self) -> None:
        """`specwatch.__version__` is the installed distribution's version (when installed)."""
        try:
            installed = version("specwatch")
        except PackageNotFoundError:
            pytest.fail("specwatch is not installed; `pip install .` first (scripts/test.sh does)")
        assert __version__ == installed

    def test_python_dash_m_and_version_flag(self) -> None:
        """`python -m specwatch --version` prints the version and exits 0."""
        out = subprocess.run(
            [sys.executable, "-m", "specwatch", "--version"],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
            timeout=60,
        )
        assert out.stdout.strip() == f"specwatch {__version__}"


def test_every_test_has_a_docstring() -> None:
    """Every test function under tests/ has a docstring saying what it shows."""
    files = sorted((ROOT / "tests").rglob("test_*.py"))
    assert len(files) > 50
    missing = [
        f"{path.relative_to(ROOT)}::{node.name}"
        for path in files
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test")
        and ast.get_docstring(node) is None
    ]
    assert missing == [], "tests without a docstring:\n" + "\n".join(missing)
