"""`specwatch run` start-up errors: one clear line naming the setting, exit code 2."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from specwatch.__main__ import main


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["run", *argv])
    err = capsys.readouterr().err.strip()
    return code, err


class TestRunPreflight:
    def test_unopenable_ledger_path(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A ledger in a directory that does not exist fails before start-up, naming ledger.path."""
        monkeypatch.setenv("SPECWATCH_SHADOW__ENABLED", "true")
        monkeypatch.setenv("SPECWATCH_SHADOW__STANDARD", '{"target": "standard"}')
        monkeypatch.setenv("SPECWATCH_SHADOW__FLY", '{"target": "fly"}')
        monkeypatch.setenv("SPECWATCH_LEDGER__PATH", str(tmp_path / "missing" / "l.sqlite"))
        code, err = run(
            ["--target", "standard=http://127.0.0.1:9", "--target", "fly=http://127.0.0.1:9"],
            capsys,
        )
        assert code == 2
        assert len(err.splitlines()) == 1
        assert "ledger.path" in err

    def test_unreadable_canary_file(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Canary mode with a file that does not exist fails before start-up, naming the file."""
        monkeypatch.setenv("SPECWATCH_SHADOW__ENABLED", "true")
        monkeypatch.setenv("SPECWATCH_SHADOW__MODES", '["canary"]')
        monkeypatch.setenv("SPECWATCH_SHADOW__STANDARD", '{"target": "standard"}')
        monkeypatch.setenv("SPECWATCH_SHADOW__FLY", '{"target": "fly"}')
        monkeypatch.setenv("SPECWATCH_SHADOW__CANARY_FILE", str(tmp_path / "nope.jsonl"))
        monkeypatch.setenv("SPECWATCH_LEDGER__PATH", str(tmp_path / "l.sqlite"))
        code, err = run(
            ["--target", "standard=http://127.0.0.1:9", "--target", "fly=http://127.0.0.1:9"],
            capsys,
        )
        assert code == 2
        assert len(err.splitlines()) == 1
        assert "shadow.canary_file" in err
        assert "nope.jsonl" in err

    def test_port_in_use(self, capsys: pytest.CaptureFixture[str]) -> None:
        """A listen port another socket holds gives exit 2 and one line naming server.port."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
            held.bind(("127.0.0.1", 0))
            held.listen(1)
            port = held.getsockname()[1]
            argv = ["--target", "standard=http://127.0.0.1:9", "--host", "127.0.0.1"]
            argv += ["--port", str(port), "--log-level", "ERROR"]
            code, err = run(argv, capsys)
        assert code == 2
        assert err.splitlines()[-1].startswith("specwatch run: server.port: cannot listen on")


class TestSecretsInConfig:
    def test_effective_config_hides_url_passwords_and_query_tokens(self) -> None:
        """The logged config shows URL passwords and query values as asterisks."""
        from specwatch.settings import load_settings

        s = load_settings(
            overrides={
                "targets": [
                    {"name": "standard", "url": "http://bob:hunter2@h:8000/metrics?token=abc"}
                ],
                "alerting": {"urls": ["http://am:s3cret@am:9093/?k=v"]},
            }
        )
        text = str(s.redacted())
        assert "hunter2" not in text
        assert "abc" not in text
        assert "s3cret" not in text
        assert "http://bob:**********@h:8000/metrics?token=**********" in text

    def test_bearer_token_and_url_password_together_is_a_config_error(self) -> None:
        """Two Authorization sources on one target are refused at start, naming the target."""
        from specwatch.settings import ConfigError, load_settings

        with pytest.raises(ConfigError, match="standard"):
            load_settings(
                overrides={
                    "targets": [{"name": "standard", "url": "http://u:p@h:1", "bearer_token": "t"}]
                }
            )

    def test_unresolvable_listen_host(self, capsys: pytest.CaptureFixture[str]) -> None:
        """A listen host that is not an address is exit 2 with one line, not a traceback."""
        argv = ["--target", "standard=http://127.0.0.1:9", "--host", "256.1.1.1"]
        code, err = run([*argv, "--log-level", "ERROR"], capsys)
        assert code == 2
        assert err.splitlines()[-1].startswith("specwatch run: server.port: cannot listen on")
