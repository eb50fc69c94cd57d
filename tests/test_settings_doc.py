"""The settings reference page, docs/settings.md, is what the code says, and removed settings
fail with a line that names them."""

from __future__ import annotations

from pathlib import Path

import pytest

from specwatch.settings import REMOVED_SETTINGS, ConfigError, load_settings
from specwatch.settings_doc import DOC_PATH, REGENERATE, render

ROOT = Path(__file__).resolve().parents[1]


def test_page_is_what_the_generator_writes() -> None:
    """docs/settings.md equals :func:`render` byte for byte; after changing a setting, run the
    command in the failure message."""
    page = (ROOT / DOC_PATH).read_text(encoding="utf-8")
    assert page == render(), f"{DOC_PATH} is out of date: run `{REGENERATE}`"


def test_every_row_names_an_environment_variable_that_works(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three rows of the page, one per nesting depth, set through the environment variable the
    page names, reach the settings (values picked to differ from the defaults)."""
    page = render()
    cases = [
        ("scrape.interval_seconds", "SPECWATCH_SCRAPE__INTERVAL_SECONDS", "2.5"),
        (
            "alerting.tls.insecure_skip_verify",
            "SPECWATCH_ALERTING__TLS__INSECURE_SKIP_VERIFY",
            "true",
        ),
        ("shadow.sample_probability", "SPECWATCH_SHADOW__SAMPLE_PROBABILITY", "0.25"),
    ]
    for path, var, value in cases:
        assert f"| `{path}` |" in page
        assert f"`{var}`" in page
        monkeypatch.setenv(var, value)
    s = load_settings()
    assert s.scrape.interval_seconds == 2.5
    assert s.alerting.tls.insecure_skip_verify is True
    assert s.shadow.sample_probability == 0.25


def test_arm_rows_are_shared_by_the_four_arms() -> None:
    """The arm endpoint's fields appear once for all four arms, with the arm as a choice."""
    page = render()
    assert "| `shadow.{standard\\|fly\\|noise\\|baseline}.timeout_seconds` |" in page
    assert "`shadow.standard.timeout_seconds`" not in page


@pytest.mark.parametrize("path", sorted(REMOVED_SETTINGS))
def test_removed_setting_in_a_config_file_names_it(path: str, tmp_path: Path) -> None:
    """A config file that still sets a removed setting fails with one line naming it."""
    group, name = path.split(".")
    config = tmp_path / "old.yaml"
    config.write_text(f"{group}:\n  {name}: 1\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_settings(config_file=config)
    assert str(info.value).startswith(f"config error: {path}: no longer a setting (")
    assert f"| `{path}` |" not in render()


def test_removed_setting_in_the_environment_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment variable of a removed setting fails the same way."""
    monkeypatch.setenv("SPECWATCH_SHADOW__PAUSE_POLL_SECONDS", "0.1")
    with pytest.raises(ConfigError, match=r"^config error: shadow\.pause_poll_seconds: no longer"):
        load_settings()


def test_a_field_without_a_description_fails_the_page() -> None:
    """The generator refuses a setting nobody described (so the page cannot lose a row)."""
    from pydantic import BaseModel

    from specwatch import settings_doc

    class Bare(BaseModel):
        knob: int = 1

    with pytest.raises(ValueError, match=r"g\.knob has no description"):
        list(settings_doc._rows(Bare, "g.", "SPECWATCH_G__"))
