"""The first start of ``specwatch run`` with shadow on, where no ledger exists yet: the ledger
is created, not reported damaged."""

from __future__ import annotations

import signal
from pathlib import Path

from tests.sidecar_process import free_port, run_config, specwatch_process


async def test_first_start_makes_no_corrupt_ledger(tmp_path: Path) -> None:
    """No ``*.corrupt-*`` file beside the new ledger and no "corrupt ledger" warning in the
    log: the start-up check of the ledger path must not leave an empty file for the ledger to
    move aside as damaged."""
    port = free_port()
    arm = {"url": "http://127.0.0.1:9"}
    cfg = run_config(
        tmp_path,
        port,
        targets=[
            {"name": "standard", "url": "http://127.0.0.1:9/metrics"},
            {"name": "fly", "url": "http://127.0.0.1:9/metrics"},
        ],
        shadow={
            "enabled": True,
            "modes": ["mirror"],
            "standard": arm,
            "fly": arm,
            "mirror_listen_host": "127.0.0.1",
            "mirror_listen_port": free_port(),
        },
    )
    async with specwatch_process(tmp_path, ["run", "--config", str(cfg)], port=port) as proc:
        rc, _ = await proc.stop(signal.SIGTERM)
    assert rc == 0
    assert "corrupt ledger" not in proc.log_text()
    _assert_one_sound_ledger(tmp_path)


def _assert_one_sound_ledger(tmp: Path) -> None:
    assert sorted(p.name for p in tmp.glob("ledger.sqlite.corrupt*")) == []
    assert (tmp / "ledger.sqlite").stat().st_size > 0
