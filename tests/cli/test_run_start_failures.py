"""``specwatch run`` start-ups that fail: the line says why, and a failed start changes no file
(the port is taken before any state is restored)."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from specwatch.__main__ import main
from specwatch.alerts.alert import Alert, Severity, alert_key
from specwatch.alerts.saved import SavedAlerts, dump, write_atomic

TARGETS = ["--target", "standard=http://127.0.0.1:9", "--target", "fly=http://127.0.0.1:9"]


def _shadow_env(monkeypatch: pytest.MonkeyPatch, ledger: Path) -> None:
    monkeypatch.setenv("SPECWATCH_SHADOW__ENABLED", "true")
    monkeypatch.setenv("SPECWATCH_SHADOW__STANDARD", '{"target": "standard"}')
    monkeypatch.setenv("SPECWATCH_SHADOW__FLY", '{"target": "fly"}')
    monkeypatch.setenv("SPECWATCH_LEDGER__PATH", str(ledger))


def _err(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["run", *argv])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("case", ["missing", "file", "read_only"])
def test_ledger_path_says_why_it_cannot_be_opened(
    case: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A ledger whose parent directory does not exist, is a file, or cannot be written: exit 2,
    one line naming the parent and the cause (before: "unable to open database file")."""
    parent = tmp_path / "ledgers"
    if case == "file":
        parent.write_text("not a directory\n")
    elif case == "read_only":
        if os.geteuid() == 0:
            pytest.skip("root writes into a read-only directory")
        parent.mkdir()
        parent.chmod(0o555)
    _shadow_env(monkeypatch, parent / "pairs.sqlite")
    code, err = _err(TARGETS, capsys)
    if case == "read_only":
        parent.chmod(0o755)
    assert code == 2
    assert err.count("\n") == 1, err
    says = {
        "missing": f"parent directory {str(parent)!r} does not exist",
        "file": f"{str(parent)!r} is not a directory",
        "read_only": f"parent directory {str(parent)!r} is not writable",
    }[case]
    ledger = str(parent / "pairs.sqlite")
    assert err == f"specwatch run: config error: ledger.path: cannot open {ledger!r}: {says}\n"


def test_port_in_use_leaves_the_alert_state_file_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A second ``run`` on a port another socket holds: exit 2 naming server.port, and the
    saved alert state (a pending timer and a firing alert, written 10 s ago) is neither
    restored nor rewritten: its bytes and mtime are as before."""
    now = time.time()
    down = Alert("SpecwatchTargetDown", Severity.CRITICAL, "down", "", {"target": "standard"})
    state = tmp_path / "alerts.json"
    saved = SavedAlerts(now - 10, {alert_key(down.identity()): now - 100}, ((down, now - 50),))
    write_atomic(state, dump(saved))
    os.utime(state, (now - 10, now - 10))
    before = (state.read_bytes(), state.stat().st_mtime_ns)
    _shadow_env(monkeypatch, tmp_path / "pairs.sqlite")
    monkeypatch.setenv("SPECWATCH_ALERTING__STATE_FILE", str(state))
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        argv = [*TARGETS, "--host", "127.0.0.1", "--port", str(held.getsockname()[1])]
        code, err = _err([*argv, "--log-level", "INFO"], capsys)
    assert code == 2
    assert err.splitlines()[-1].startswith("specwatch run: server.port: cannot listen on")
    assert "restored" not in err
    assert (state.read_bytes(), state.stat().st_mtime_ns) == before


def test_a_failure_after_the_bind_is_not_reported_as_the_port(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """An OverflowError raised once serving began (as a ledger write did at shutdown) reaches
    the caller as itself, never as "server.port: cannot listen" with exit code 2."""
    import specwatch.server.app as app_module

    def serve_then_fail(app: object, settings: object) -> None:
        raise OverflowError("Python int too large to convert to SQLite INTEGER")

    monkeypatch.setattr(app_module, "serve", serve_then_fail)
    _shadow_env(monkeypatch, tmp_path / "pairs.sqlite")
    with pytest.raises(OverflowError, match="SQLite INTEGER"):
        main(["run", *TARGETS, "--host", "127.0.0.1", "--port", "0"])
    assert "cannot listen" not in capsys.readouterr().err
