"""``specwatch record`` writes the timeline ``specwatch replay`` reads, from a running server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from specwatch.__main__ import main as cli_main
from specwatch.simulate.config import Role, SimConfig
from specwatch.simulate.launcher import start_simulator
from specwatch.tools.offline.record import body_name, record, replay_command
from tests.fakes import REPO


def test_body_names_are_seconds_with_the_format_suffix() -> None:
    """12.5 s after the start, text exposition → ``12.500.prom``; OpenMetrics → ``.om``."""
    assert body_name(12.5, "text/plain; version=0.0.4") == "12.500.prom"
    assert body_name(0.0, "application/openmetrics-text; version=1.0.0") == "0.000.om"


async def test_record_then_replay_with_the_shipped_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Record a simulator for 2 s every 0.5 s (5 bodies, at 0, 0.5, ... 2 s), then replay the
    directory with ``deploy/base/config.yaml`` (two targets and a shadow group) and one
    target: replay ignores the settings it does not use and prints its JSON, exit 0."""
    sim = await start_simulator(SimConfig(role=Role.STANDARD), port=0)
    try:
        written = await record(
            {"standard": f"{sim.url}/metrics"},
            tmp_path,
            interval=0.5,
            duration=2.2,
            stop=asyncio.Event(),
        )
    finally:
        await sim.stop()
    assert written == {"standard": 5}
    names = sorted(p.name for p in (tmp_path / "standard").iterdir())
    assert names[0] == "0.000.prom"
    assert replay_command(tmp_path, ["standard"]) == (
        f"specwatch replay --target standard={tmp_path / 'standard'}"
    )
    config = REPO / "deploy/base/config.yaml"
    argv = ["replay", "--config", str(config), "--target", f"standard={tmp_path / 'standard'}"]
    rc = await asyncio.to_thread(cli_main, [*argv, "--format", "json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "alerts" in json.loads(out.out)


def test_record_bad_flags_exit_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A target that is not NAME=URL, or a bad interval: exit 2, one line naming it."""
    assert cli_main(["record", "--target", "nourl", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "--target" in err[0]
    argv = ["record", "--target", "a=http://x:1", "--out", str(tmp_path), "--interval", "0"]
    assert cli_main(argv) == 2
    assert "--interval" in capsys.readouterr().err


def test_the_shipped_example_timeline_replays_to_an_acceptance_drop(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``docs/example-timeline``: 8 bodies of the demo's standard server recorded every 10 s,
    the drafter fault on engine 1 from about 30 s; replayed with its config, engine 1's
    SpecAcceptanceDrop fires at 50 s (the 20 s window fully after the fault)."""
    example = REPO / "docs/example-timeline"
    limits = "max_num_seqs=16,max_num_batched_tokens=512,num_speculative_tokens=4,method=eagle3"
    argv = ["replay", "--config", str(example / "config.yaml")]
    argv += ["--target", f"standard={example / 'standard'},{limits}", "--format", "json"]
    assert cli_main(argv) == 0
    alerts = json.loads(capsys.readouterr().out)["alerts"]
    assert [(a["alertname"], a["labels"]["engine"], a["fired_at"]) for a in alerts] == [
        ("SpecAcceptanceDrop", "1", 50.0)
    ]
