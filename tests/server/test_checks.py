"""Whole-configuration checks: arm combinations that leave a check blind are named."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from specwatch.server.checks import check_settings
from specwatch.settings import load_settings
from tests.fakes import REPO

TARGETS = [
    {"name": "standard", "url": "http://std:8000"},
    {"name": "fly", "url": "http://fly:8000"},
    {"name": "nospec", "url": "http://nospec:8000", "role": "baseline"},
]


def _shadow(**extra: Any) -> dict[str, Any]:
    return {
        "targets": TARGETS,
        "shadow": {
            "enabled": True,
            "standard": {"target": "standard"},
            "fly": {"target": "fly"},
            **extra,
        },
    }


def _lines(overrides: dict[str, Any]) -> list[str]:
    return [f.line() for f in check_settings(load_settings(overrides=overrides))]


def test_baseline_may_name_a_target_and_gets_its_url() -> None:
    """``baseline: {target: nospec}`` is accepted as the docs say and replays to that
    target's base URL."""
    s = load_settings(overrides=_shadow(baseline={"target": "nospec"}, noise_kind="standard"))
    assert s.shadow.baseline is not None
    assert s.shadow.baseline.url == "http://nospec:8000"


def test_speculating_noise_arm_beside_a_baseline_is_an_error() -> None:
    """``noise_kind: standard`` with a baseline: the lossless check compares two speculative
    answers, an error naming ``shadow.noise_kind``."""
    lines = _lines(_shadow(baseline={"target": "nospec"}, noise_kind="standard"))
    assert lines[0].startswith("error: shadow.noise_kind: standard beside shadow.baseline")


def test_no_noise_arm_beside_a_baseline_is_an_error_and_alone_a_warning() -> None:
    """``noise_kind: off`` with a baseline counts no lossless pairs (error); without one the
    flip rates have no noise floor (warning)."""
    lines = _lines(_shadow(baseline={"target": "nospec"}, noise_kind="off"))
    assert lines[0].startswith("error: shadow.noise_kind: off beside shadow.baseline")
    lines = _lines(_shadow(noise_kind="off"))
    assert lines == [
        "warning: shadow.noise_kind: off: no noise arm, so flip rates have no noise floor and "
        "SpecFlipRateAboveNoise cannot fire; set noise_kind: standard"
    ]


def test_a_sound_configuration_has_no_finding() -> None:
    """A baseline with ``noise_kind: baseline`` pointing the noise arm at it: nothing to say."""
    ok = _shadow(
        baseline={"target": "nospec"}, noise_kind="baseline", noise={"url": "http://nospec:8000"}
    )
    assert _lines(ok) == []


def test_a_role_with_no_target_and_an_arm_no_target_serves_are_warnings() -> None:
    """Only a standard target: the fly role has none; a fly arm at a URL nobody scrapes."""
    overrides = {
        "targets": [TARGETS[0]],
        "shadow": {
            "enabled": True,
            "noise_kind": "standard",
            "standard": {"target": "standard"},
            "fly": {"url": "http://elsewhere:8000"},
        },
    }
    assert _lines(overrides) == [
        "warning: shadow.fly: no scraped target serves http://elsewhere:8000: replays to it "
        "never pause under its load; add it to targets or set shadow.fly.target",
        "warning: targets: no target with role fly: the FLy vs standard comparison (pair "
        "gauges, SpecFLyGainLost) has nothing to compare",
    ]


def test_doctor_config_names_the_setting_and_exits_1(tmp_path: Path) -> None:
    """``specwatch doctor --config FILE`` (no Prometheus needed) fails on the blind noise arm
    and exits 1; a sound file exits 0 with one OK line."""
    bad = tmp_path / "bad.yaml"
    blind = _shadow(baseline={"target": "nospec"}, noise_kind="standard")
    bad.write_text(yaml.safe_dump(blind), encoding="utf-8")
    cmd = [sys.executable, "-m", "specwatch", "doctor", "--format", "table", "--config"]
    done = subprocess.run([*cmd, str(bad)], capture_output=True, text=True, cwd=REPO, check=False)
    assert done.returncode == 1, done.stderr
    assert "FAIL  config     shadow.noise_kind: standard beside shadow.baseline" in done.stdout
    good = tmp_path / "good.yaml"
    sound = _shadow(noise_kind="standard")
    good.write_text(yaml.safe_dump(sound), encoding="utf-8")
    done = subprocess.run([*cmd, str(good)], capture_output=True, text=True, cwd=REPO, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("OK    config")
