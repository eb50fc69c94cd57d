"""Settings: defaults, precedence (file < env < CLI), short target form, one-line errors."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import pytest

from specwatch.__main__ import build_parser
from specwatch.__main__ import main as cli_main
from specwatch.cli.run import log_effective_config, settings_from_args
from specwatch.core.logs import JsonFormatter
from specwatch.core.roles import Role
from specwatch.settings import ConfigError, Settings, load_settings, parse_target_spec


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["run", *argv])


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("SPECWATCH_"):
            monkeypatch.delenv(key)


class TestDefaults:
    def test_defaults(self) -> None:
        """Port 9477, 5 s interval, windows 1m/5m/15m, JSON logs."""
        s = Settings()
        assert s.server.port == 9477
        assert s.scrape.interval_seconds == 5.0
        assert s.windows == ("1m", "5m", "15m")
        assert s.window_seconds == {"1m": 60.0, "5m": 300.0, "15m": 900.0}
        assert s.log.format == "auto"  # plain on a terminal, json otherwise

    def test_frozen(self) -> None:
        """Settings cannot be changed after construction."""
        s = Settings()
        with pytest.raises(ValueError, match="frozen"):
            s.windows = ("2m",)


class TestShortForm:
    def test_role_inferred_and_extras(self) -> None:
        """``fly=URL,key=value`` gives the role from the name and typed extra fields."""
        s = settings_from_args(
            _args(
                "--target",
                "standard=http://127.0.0.1:8000",
                "--target",
                "fly=http://h:8001,max_num_seqs=128,method=eagle3,num_speculative_tokens=3",
            )
        )
        std, fly = s.targets
        assert std.effective_role is Role.STANDARD
        assert std.url == "http://127.0.0.1:8000/metrics"
        assert fly.effective_role is Role.FLY
        assert (fly.max_num_seqs, fly.method, fly.num_speculative_tokens) == (128, "eagle3", 3)

    def test_explicit_role(self) -> None:
        """A name that is not a role needs role=."""
        t = parse_target_spec("a=http://h:1,role=baseline")
        assert load_settings(overrides={"targets": [t]}).targets[0].effective_role is Role.BASELINE


class TestPrecedence:
    def test_file_env_cli(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """CLI > environment > file > defaults, merged field by field in nested groups."""
        cfg = tmp_path / "c.yaml"
        cfg.write_text(
            "server: {host: 10.0.0.1, port: 1111}\n"
            "scrape: {interval_seconds: 7, timeout_seconds: 3}\n"
            "targets: [{name: fly, url: 'http://file:1'}]\n"
        )
        monkeypatch.setenv("SPECWATCH_SERVER__PORT", "2222")
        monkeypatch.setenv("SPECWATCH_SCRAPE__INTERVAL_SECONDS", "9")
        s = settings_from_args(_args("--config", str(cfg), "--scrape-interval", "2s"))
        assert s.server.host == "10.0.0.1"  # file
        assert s.server.port == 2222  # env over file
        assert s.scrape.interval_seconds == 2.0  # CLI over env
        assert s.scrape.timeout_seconds == 3.0  # file
        assert s.targets[0].url == "http://file:1/metrics"
        s2 = settings_from_args(_args("--config", str(cfg), "--target", "standard=http://cli:2"))
        assert [t.name for t in s2.targets] == ["standard"]  # CLI targets replace the file's

    def test_toml_and_env_targets(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A TOML file works; targets from the environment as JSON."""
        cfg = tmp_path / "c.toml"
        cfg.write_text('windows = ["30s", "2m"]\n[server]\nport = 9999\n')
        targets = [{"name": "standard", "url": "http://e:3", "max_num_seqs": 8}]
        monkeypatch.setenv("SPECWATCH_TARGETS", json.dumps(targets))
        s = load_settings(config_file=cfg)
        assert s.windows == ("30s", "2m")
        assert s.server.port == 9999
        assert s.targets[0].max_num_seqs == 8


class TestErrors:
    @pytest.mark.parametrize(
        ("argv", "field"),
        [
            (["--target", "fly=ftp://x"], "targets.0.url"),
            (["--target", "fly=http://x,max_num_seqs=0"], "targets.0.max_num_seqs"),
            (["--target", "fly=http://x,method=medusa"], "targets.0.method"),
            (["--target", "fly=http://x,vllm_version=banana"], "targets.0.vllm_version"),
            (["--target", "fly=http://x,colour=red"], "targets.0.colour"),
            (["--target", "fly=http://x", "--port", "70000"], "server.port"),
            (["--target", "fly=http://x", "--window", "0s"], "windows"),
            (["--target", "fly=http://x", "--scrape-interval", "soon"], "--scrape-interval"),
            (["--target", "x=http://x"], "targets.0"),
            ([], "targets"),
        ],
    )
    def test_one_line_exit_2(
        self, argv: list[str], field: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A bad value: exit code 2 and one stderr line naming the field."""
        assert cli_main(["run", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert f"config error: {field}" in err

    def test_bad_env_json(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A target list in the environment that is not JSON: one line naming the field."""
        monkeypatch.setenv("SPECWATCH_TARGETS", "fly=http://x")
        assert cli_main(["run"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert "config error: targets: SPECWATCH_TARGETS is not valid JSON" in err

    def test_windows_from_env(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Windows from the environment as a comma list or JSON."""
        monkeypatch.setenv("SPECWATCH_WINDOWS", "30s,2m")
        assert load_settings().windows == ("30s", "2m")
        monkeypatch.setenv("SPECWATCH_WINDOWS", '["10m"]')
        assert load_settings().windows == ("10m",)

    def test_bad_file(self, tmp_path: Path) -> None:
        """A broken YAML file names the file and line."""
        cfg = tmp_path / "c.yaml"
        cfg.write_text("server:\n  port: [1,\n")
        with pytest.raises(ConfigError, match=r"c\.yaml:\d+"):
            load_settings(config_file=cfg)


def test_effective_config_logged_without_secret(caplog: pytest.LogCaptureFixture) -> None:
    """The effective config is logged once as JSON, with the bearer token hidden."""
    caplog.set_level(logging.INFO, logger="specwatch")
    s = settings_from_args(_args("--target", "fly=http://h:1,bearer_token=hunter2"))
    log_effective_config(s)
    records = [r for r in caplog.records if r.getMessage() == "effective config"]
    assert len(records) == 1
    line = JsonFormatter().format(records[0])
    assert "hunter2" not in line
    assert json.loads(line)["config"]["targets"][0]["bearer_token"] == "**********"
    assert s.targets[0].bearer_token is not None
    assert s.targets[0].bearer_token.get_secret_value() == "hunter2"
