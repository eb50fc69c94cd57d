"""Shadow, ledger and paired-statistics settings on the core Settings (env, file, targets)."""

from __future__ import annotations

import os

import pytest

from specwatch.server.wiring import arm_targets, shadow_components
from specwatch.settings import ConfigError, Settings, load_settings

TARGETS = (
    '[{"name": "std", "url": "http://vllm-a:8000", "role": "standard"},'
    ' {"name": "fly", "url": "http://vllm-b:8001/metrics"}]'
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("SPECWATCH_"):
            monkeypatch.delenv(key)


def test_defaults_shadow_off_and_ledger_in_working_dir() -> None:
    """By default the shadow chain is off, the ledger is in the working directory and paired
    defaults hold."""
    s = Settings()
    assert s.shadow.enabled is False
    assert s.ledger.path == "specwatch-ledger.sqlite"
    assert s.paired.alpha == 0.05
    assert s.paired.margin == 0.01
    assert s.paired.detect_net_loss == 0.02
    assert s.paired.window_seconds == {
        "15m": 900.0,
        "1h": 3600.0,
        "24h": 86400.0,
        "since_start": None,
    }
    assert shadow_components(s) == []


def test_env_turns_shadow_on_with_arms_by_target_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """Environment variables enable the shadow chain with arms resolved by target name."""
    monkeypatch.setenv("SPECWATCH_TARGETS", TARGETS)
    monkeypatch.setenv("SPECWATCH_SHADOW__ENABLED", "true")
    monkeypatch.setenv("SPECWATCH_SHADOW__MODES", '["mirror", "canary"]')
    monkeypatch.setenv("SPECWATCH_SHADOW__CANARY_BUILTIN", "true")
    monkeypatch.setenv("SPECWATCH_SHADOW__STANDARD__TARGET", "std")
    monkeypatch.setenv("SPECWATCH_SHADOW__FLY__TARGET", "fly")
    monkeypatch.setenv("SPECWATCH_SHADOW__SAMPLE_PROBABILITY", "0.25")
    monkeypatch.setenv("SPECWATCH_LEDGER__PATH", "/var/lib/specwatch/ledger.sqlite")
    monkeypatch.setenv("SPECWATCH_LEDGER__MAX_ROWS", "1000")
    monkeypatch.setenv("SPECWATCH_PAIRED__MARGIN", "0.02")
    monkeypatch.setenv("SPECWATCH_PAIRED__WINDOWS", "15m,6h")
    s = load_settings()
    assert s.shadow.enabled
    assert s.shadow.modes == ("mirror", "canary")
    assert s.shadow.sample_probability == 0.25
    assert s.shadow.standard is not None
    assert s.shadow.fly is not None
    assert s.shadow.standard.url == "http://vllm-a:8000"
    assert s.shadow.fly.url == "http://vllm-b:8001"
    assert s.ledger.path == "/var/lib/specwatch/ledger.sqlite"
    assert s.ledger.max_rows == 1000
    assert s.paired.margin == 0.02
    assert s.paired.windows == ("15m", "6h")
    assert arm_targets(s) == {"standard": "std", "fly": "fly"}
    assert len(shadow_components(s)) == 1


def test_arm_without_target_maps_by_url_and_noise_uses_standard() -> None:
    """An arm without a target maps to the target with its URL; a standard noise arm maps like
    the standard arm."""
    s = load_settings(
        overrides={
            "targets": [
                {"name": "standard", "url": "http://a:8000"},
                {"name": "fly", "url": "http://b:8001"},
            ],
            "shadow": {
                "standard": {"url": "http://a:8000/"},
                "fly": {"url": "http://elsewhere:9000"},
                "noise_kind": "standard",
            },
        }
    )
    assert arm_targets(s) == {"standard": "standard", "noise": "standard"}


def test_unknown_arm_target_is_one_line_error() -> None:
    """An arm naming an unknown target is a one-line ConfigError."""
    with pytest.raises(ConfigError, match=r"shadow.fly.target: no target named 'nope'"):
        load_settings(
            overrides={
                "targets": [{"name": "standard", "url": "http://a:8000"}],
                "shadow": {"standard": {"target": "standard"}, "fly": {"target": "nope"}},
            }
        )


def test_enabled_without_arms_is_rejected() -> None:
    """Enabling the shadow chain without arms is a ConfigError."""
    with pytest.raises(ConfigError, match="shadow"):
        load_settings(overrides={"shadow": {"enabled": True}})


def test_arm_token_redacted_in_effective_config() -> None:
    """An arm's token is redacted in the effective configuration."""
    s = load_settings(
        overrides={
            "shadow": {
                "standard": {"url": "http://a:8000", "token": "s3cret"},
                "fly": {"url": "http://b:8000"},
            }
        }
    )
    red = s.redacted()
    assert red["shadow"]["standard"]["token"] == "**********"
    assert red["shadow"]["fly"]["token"] is None
    assert "s3cret" not in repr(red)


def test_bad_paired_window_named() -> None:
    """A bad paired window is a ConfigError naming paired.windows."""
    with pytest.raises(ConfigError, match=r"paired\.windows"):
        load_settings(overrides={"paired": {"windows": ["since_start"]}})


def test_arm_keepalive_defaults_below_vllms_idle_timeout_and_is_per_arm() -> None:
    """An arm keeps idle connections 4 s unless told otherwise (vLLM closes them at 5 s); each
    arm sets its own; the mirror listens on 9402 with a 16 MiB body limit, the proxy too."""
    from specwatch.shadow.settings import ArmEndpoint, ShadowSettings

    s = ShadowSettings.model_validate(
        {
            "standard": {"url": "http://std:8000", "keepalive_seconds": 2.5},
            "fly": {"url": "http://fly:8000"},
        }
    )
    assert s.standard is not None
    assert s.fly is not None
    assert (s.standard.keepalive_seconds, s.fly.keepalive_seconds) == (2.5, 4.0)
    assert ArmEndpoint(url="http://x").keepalive_seconds < 5.0
    assert (s.mirror_listen_port, s.mirror_max_body_bytes) == (9402, 16 * 1024 * 1024)
    assert s.proxy_max_body_bytes == 16 * 1024 * 1024
