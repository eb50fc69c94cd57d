"""Project-level promises: the README's two commands, CI running exactly the test command, the
docs' links and paths resolving, and no tracker numbers in the project's text."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

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


class TestPackaging:
    def test_version_matches_metadata(self) -> None:
        """`specwatch.__version__` is the installed distribution's version (when installed)."""
        try:
            installed = version("specwatch")
        except PackageNotFoundError:
            pytest.fail("specwatch is not installed; `pip install .` first (scripts/test.sh does)")
        assert __version__ == installed

    def test_version_constant_is_the_pyproject_version(self) -> None:
        """`specwatch.__version__` (a constant, so ``--help`` never reads package metadata) is
        pyproject.toml's ``[project] version``."""
        project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
        assert __version__ == project["version"]

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


def tracked_files() -> list[Path]:
    """The repository's tracked files (``git ls-files``), else every file outside dot-folders,
    virtual environments and caches."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        skip = {"__pycache__", "build", "dist", "node_modules"}
        return sorted(
            p
            for p in ROOT.rglob("*")
            if p.is_file()
            and not any(part.startswith(".") or part in skip for part in p.relative_to(ROOT).parts)
        )
    return sorted(ROOT / name for name in out.decode().split("\0") if name)


def text_of(path: Path) -> str | None:
    """The file's text, ``None`` for a binary file (a NUL byte, or not UTF-8) or a missing one
    (deleted but not yet committed)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


#: A tracker reference: the word issue or issues (any case), an optional ``#``, then a number.
#: An upstream one names its repository first (``owner/repo``, then the word and number) and is a
#: citation, not a tracker number.
TRACKER_NUMBER = re.compile(r"\bissues?[ \t]*#?[ \t]*\d+", re.IGNORECASE)
UPSTREAM_REPO = re.compile(r"[\w.-]+/[\w.-]+[ \t]+$")


def tracker_numbers(text: str) -> list[tuple[int, str]]:
    """``(line, reference)`` for each tracker reference in ``text`` that does not name an
    upstream repository first."""
    return [
        (text.count("\n", 0, m.start()) + 1, m.group(0))
        for m in TRACKER_NUMBER.finditer(text)
        if not UPSTREAM_REPO.search(text[max(0, m.start() - 120) : m.start()])
    ]


def test_tracker_numbers_are_found_and_upstream_citations_are_not() -> None:
    """The matcher finds a bare tracker number in each spelling and lets an upstream citation
    (``owner/repo`` first) through."""
    word = "iss" + "ue"  # assembled, so this file does not trip its own check
    assert tracker_numbers(f"Within 2x of nginx ({word} 16, item 4)") == [(1, f"{word} 16")]
    assert tracker_numbers(f"{word.title()}s 3 and 4;\nsee {word} #12") == [
        (1, f"{word.title()}s 3"),
        (2, f"{word} #12"),
    ]
    assert tracker_numbers(f"after vllm-project/vllm {word} #53130 (values)") == []
    assert tracker_numbers(f"a known {word}, fixed in 2 places") == []


def test_no_tracker_numbers_in_tracked_text() -> None:
    """No tracked text file cites a tracker number: code, docs and tests say what the thing is
    (the proxy goal, the report's slowness), not where it was asked for."""
    found = [
        f"{path.relative_to(ROOT)}:{line}: {hit}"
        for path in tracked_files()
        if (text := text_of(path)) is not None
        for line, hit in tracker_numbers(text)
    ]
    assert found == [], "tracker numbers:\n" + "\n".join(found)


def markdown_files() -> list[Path]:
    return [p for p in tracked_files() if p.suffix == ".md" and p.exists()]


def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown text: lower case, punctuation other
    than ``-`` and ``_`` dropped, spaces as ``-``, ``-1``, ``-2`` ... on repeats."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = re.match(r"#{1,6}\s+(.*)", line)
        if fenced or heading is None:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def test_heading_anchors_by_hand() -> None:
    """Anchors as GitHub writes them, worked by hand for a code span, punctuation and a repeat."""
    text = (
        "# Fleet (`specwatch fleet --listen host:port`)\n## 5. Where it lives\n## Notes\n## Notes\n"
    )
    assert heading_anchors(text) == {
        "fleet-specwatch-fleet---listen-hostport",
        "5-where-it-lives",
        "notes",
        "notes-1",
    }


def test_markdown_links_resolve() -> None:
    """Every relative link in a tracked Markdown file (README, docs/, the deploy and test notes)
    names a file that exists, and its ``#anchor``, if any, a heading of that file."""
    broken: list[str] = []
    for md in markdown_files():
        for link in re.findall(r"\]\(([^)\s]+)\)", md.read_text(encoding="utf-8")):
            if re.match(r"[a-z][a-z0-9+.-]*:", link):  # http:, https:, mailto:
                continue
            path, _, anchor = link.partition("#")
            target = (md.parent / path).resolve() if path else md
            if not target.exists():
                broken.append(f"{md.relative_to(ROOT)}: {link} (no such file)")
            elif (
                anchor
                and target.suffix == ".md"
                and anchor not in heading_anchors(target.read_text(encoding="utf-8"))
            ):
                broken.append(f"{md.relative_to(ROOT)}: {link} (no such heading)")
    assert broken == [], "\n".join(broken)


#: A repository path in a code span: `specwatch/shadow/values.py`, `deploy/mixin/`.
REPO_PATH = re.compile(r"`((?:specwatch|tests|docs|bench|deploy|scripts|grafana)/[\w./-]*)`")


def test_paths_named_in_markdown_exist() -> None:
    """Every repository path a tracked Markdown file names in a code span exists, except the
    "before" column of an old -> new map (which names what is gone)."""
    missing: list[str] = []
    for md in markdown_files():
        in_map = False
        for line in md.read_text(encoding="utf-8").splitlines():
            if line.startswith("#"):
                in_map = bool(re.search(r"\bold\b.*\bnew\b", line, re.IGNORECASE))
            checked = line.split("|", 2)[-1] if in_map and line.startswith("|") else line
            missing += [
                f"{md.relative_to(ROOT)}: {path}"
                for path in REPO_PATH.findall(checked)
                if not (ROOT / path).exists()
            ]
    assert missing == [], "\n".join(missing)
