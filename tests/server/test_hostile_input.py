"""``/healthz`` keeps answering while the sidecar handles hostile input: a target page of 100,000
model names and six mirrored bodies of 200,000 keys (refused as ``too_many_keys`` before
parsing). The answer times a quiet machine reaches are a speed goal and live in
``bench/bench_hostile.py``; this test holds only bounds that a loaded 2-core machine keeps."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.server.hostile_inputs import quantile, run, run_repeated

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


@pytest.mark.slow
async def test_healthz_answers_within_a_second_while_a_100k_series_page_is_parsed_again_and_again(
    tmp_path: Path,
) -> None:
    """The 100,000-series page scraped back to back (six parses of 5 MB, each seconds long on
    a loaded machine): every ``/healthz`` meanwhile answers 200 in under 1 s (before: up to
    1.2 s on a quiet machine, 2.35 s under load, while a full garbage collection of the
    parse's objects held the interpreter)."""
    times = await run_repeated(tmp_path, scrapes=6)
    assert len(times) >= 20
    assert max(times) < 1.0, sorted(times)[-5:]
