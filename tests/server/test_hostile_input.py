"""``/healthz`` keeps answering within a second while the sidecar handles hostile input: a target
page of 100,000 model names (parsed in a worker thread) and six mirrored bodies of 200,000 keys
(refused as ``too_many_keys`` before parsing)."""

from __future__ import annotations

from pathlib import Path

from tests.server.hostile_inputs import quantile, run


async def test_healthz_answers_within_a_second_under_hostile_input(tmp_path: Path) -> None:
    """Through real HTTP on 127.0.0.1: the page is scraped (``specwatch_target_up`` 1) and every
    ``/healthz`` meanwhile answers 200 in under 1 s; each 2.3 MB body of 200,000 keys is answered
    400 and ``/healthz`` answers in under 1 s throughout."""
    timed = await run(tmp_path)
    assert timed.target_up == 1.0
    assert len(timed.page_latencies) >= 5
    assert max(timed.page_latencies) < 1.0
    assert timed.mirror_statuses == (400,) * 6
    assert max(timed.body_latencies) < 1.0
    assert quantile(timed.body_latencies, 0.99) < 1.0
