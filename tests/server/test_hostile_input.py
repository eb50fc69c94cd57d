"""``/healthz`` keeps answering while the sidecar handles hostile input: a target page of 100,000
model names and six mirrored bodies of 200,000 keys (refused as ``too_many_keys`` before
parsing). The answer times a quiet machine reaches are a speed goal and live in
``bench/bench_hostile.py``; this test holds only bounds that a loaded 2-core machine keeps."""

from __future__ import annotations

from pathlib import Path

from tests.server.hostile_inputs import quantile, run

#: No /healthz answer may take longer, whatever the load (quiet: about 10 ms; seen under load:
#: 1.6 s). The prober records a status other than 200 as 99 s, far above it.
LOADED_MACHINE_BOUND_S = 5.0


async def test_healthz_answers_under_hostile_input(tmp_path: Path) -> None:
    """Through real HTTP on 127.0.0.1: the page is scraped (``specwatch_target_up`` 1) and every
    ``/healthz`` meanwhile answers 200, under 1 s at the median and under 5 s at most; each
    2.3 MB body of 200,000 keys is answered 400 and ``/healthz`` answers alike throughout."""
    timed = await run(tmp_path)
    assert timed.target_up == 1.0
    assert len(timed.page_latencies) >= 5
    assert timed.mirror_statuses == (400,) * 6
    for times in (timed.page_latencies, timed.body_latencies):
        assert max(times) < LOADED_MACHINE_BOUND_S, times
        assert quantile(times, 0.5) < 1.0, times
