"""Where speculation stops paying: per-band profiles and the crossover, on hand-made points,
and the profile a tracker builds from real vLLM /metrics pages."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest

from specwatch.observe.concurrency import (
    ConcurrencyProfile,
    add_point,
    band_label,
    band_of,
    speculation_limit,
)
from specwatch.observe.parse import parse_page
from specwatch.observe.settings import TargetSettings
from specwatch.observe.tracker import TargetTracker, build_view
from tests.fixture_files import body


def _profile(points: Sequence[tuple[float, float]], itl: float | None = None) -> ConcurrencyProfile:
    p = ConcurrencyProfile()
    for running, tps in points:
        p = add_point(p, running, tps, itl)
    return p


def test_bands_are_powers_of_two() -> None:
    """Running counts fall into 1, 2-3, 4-7, … 512+; below 1 nothing decodes."""
    assert [band_of(x) for x in (0.5, 1, 3, 4, 7.9, 8, 600)] == [None, 1, 2, 4, 4, 8, 512]
    assert [band_label(b) for b in (1, 2, 4, 512)] == ["1", "2-3", "4-7", "512+"]


#: 8^(ln 1.6 / ln(80/47.5)): where FLy's log-linear speed meets 50 (see below).
_CROSS = 8 ** (math.log(1.6) / math.log(80 / 47.5))


def test_limit_reached_where_fly_is_no_faster_per_request() -> None:
    """8 scrapes at 1 running: standard 50 tokens/s per request, FLy 80 (1.6×); 4 at 8
    running: standard 400/8 = 50, FLy 380/8 = 47.5 (0.95×). With data at two concurrencies the
    local linear fit of log speed over log(running) is the straight line between them: FLy's
    log speed ln 80 − t·ln(80/47.5) (t = ln c / ln 8) meets ln 50 at t = ln 1.6 / ln(80/47.5) =
    0.9016, c = 8^0.9016 = 6.52, interpolated, not the band "from 8". Noise-free, so FLy is
    shown faster at 1 and slower at 8: the interval is 1-8; the bands keep their ratios."""
    std = _profile([(1, 50.0)] * 8 + [(8, 400.0)] * 8, itl=0.02)
    fly = _profile([(1, 80.0)] * 8 + [(8, 380.0)] * 8, itl=0.0125)
    lim = speculation_limit(std, fly)
    assert lim.status == "reached"
    assert lim.reference == "standard"
    assert lim.running == pytest.approx(_CROSS, rel=1e-6)
    assert lim.running is not None
    assert lim.running_lower is not None
    assert lim.running_upper is not None
    assert [lim.running_lower, lim.running_upper] == pytest.approx([1.0, 8.0])
    assert [b.band for b in lim.bands] == ["1", "8-15"]
    assert lim.bands[0].speed_ratio == pytest.approx(1.6)
    assert lim.bands[1].speed_ratio == pytest.approx(0.95)
    assert lim.bands[0].fly_itl_seconds == pytest.approx(0.0125)
    assert lim.text == (
        "FLy vs standard speculation: stops paying from about 7 running requests (95 % "
        "interval 1-8); per-request decode speed at 8 running: -5.0 % (95 % interval -5.0 % "
        "to -5.0 %)"
    )
    assert [c.reference for c in lim.comparisons] == ["standard"]


def test_not_reached_and_no_data() -> None:
    """FLy 1.5× at the one concurrency seen (8 scrapes each at 2 running) → not reached within
    the observed range, naming 2 as the highest concurrency seen, with the gain there
    (+50.0 %); fewer than 8 scrapes on an arm → no data."""
    std = _profile([(2, 100.0)] * 8)
    fly = _profile([(2, 150.0)] * 8)
    lim = speculation_limit(std, fly)
    assert lim.status == "not_reached"
    assert lim.running is None
    assert lim.text.startswith(
        "FLy vs standard speculation: not reached within the observed range (highest "
        "concurrency seen: 2); per-request decode speed at 2 running: +50.0 %"
    )
    few = speculation_limit(_profile([(2, 100.0)] * 7), fly)
    assert few.status == "no_data"
    # 7 scrapes: the estimate reads the points as of the last multiple of 8, none yet
    assert few.text == (
        "FLy vs standard speculation: not enough data: 8 points for FLy, 0 for standard "
        "speculation (need 8 each)"
    )


def test_limit_against_the_no_speculation_baseline() -> None:
    """With a baseline target (no speculation) FLy is compared with it first and with the
    standard arm second, each labelled. FLy is 1.2× the standard arm at both concurrencies
    (never reached against it), but against the baseline (50 per request at 1 and at 8
    running) it is the first test's line: 80 at 1, 47.5 at 8, reaching 50 at 8^0.9016 = 6.52
    running. The sentence says both, baseline first."""
    std = _profile([(1, 80 / 1.2)] * 8 + [(8, 380 / 1.2)] * 8)
    fly = _profile([(1, 80.0)] * 8 + [(8, 380.0)] * 8)
    base = _profile([(1, 50.0)] * 8 + [(8, 400.0)] * 8)
    against_std = speculation_limit(std, fly)
    assert against_std.status == "not_reached"
    lim = speculation_limit(std, fly, baseline=base)
    assert lim.reference == "baseline"
    assert lim.status == "reached"
    assert lim.running == pytest.approx(_CROSS, rel=1e-6)
    assert [(c.reference, c.status) for c in lim.comparisons] == [
        ("baseline", "reached"),
        ("standard", "not_reached"),
    ]
    against, versus_std = (c.text for c in lim.comparisons)
    assert against.startswith("FLy vs no speculation: stops paying from about 7 running requests")
    assert versus_std.startswith("FLy vs standard speculation: not reached within the observed")
    assert lim.text == f"{against}. {versus_std}"
    # the per-band table still compares FLy with the standard arm
    assert [round(b.speed_ratio, 6) for b in lim.bands] == [1.2, 1.2]


def test_tracker_builds_the_profile_from_real_pages() -> None:
    """Two real vLLM CPU pages 30 s apart: the second page's running count (8) and the 1m
    window's generation throughput give one point in band 8-15 (the first page has no window
    yet); the view carries the limit (no data yet: 1 point < 3)."""
    ngram = parse_page(body("vllm-metrics/real-cpu-ngram.txt"))
    mid = parse_page(body("vllm-metrics/real-cpu-draft-model-midflight.txt"))
    std = TargetTracker(TargetSettings(name="standard", url="http://s:1"), {"1m": 60.0})
    fly = TargetTracker(TargetSettings(name="fly", url="http://f:1"), {"1m": 60.0})
    for t in (std, fly):
        t.record_page(0.0, ngram, duration_seconds=0.01)
        t.record_page(30.0, mid, duration_seconds=0.01)
    snap = std.snapshot()
    running = snap.capacity.num_requests_running
    tps = snap.windows["1m"][min(snap.windows["1m"])].server.generation_tokens_per_second
    points = sum(b.points for _, b in snap.concurrency.bands)
    # the mid-flight page has 8 running requests on its one engine: one point in band 8-15
    assert running == 8
    assert tps is not None
    assert points == 1
    assert [lo for lo, _ in snap.concurrency.bands] == [8]
    sums = snap.concurrency.get(8)
    assert sums.throughput_sum == pytest.approx(tps)
    assert sums.speed_sum == pytest.approx(tps / 8)
    view = build_view([std.snapshot(), fly.snapshot()], now=31.0)
    assert view.speculation_limit is not None
    assert view.speculation_limit.status == "no_data"


def test_the_estimate_moves_only_every_eight_scrapes() -> None:
    """The estimate reads the points as of the last multiple of 8 scrapes per arm, so the 2 s
    view refreshes show one number between them: 16 scrapes each give the 6.52 crossing; 7
    more FLy scrapes at 8 running, much slower, leave it (the per-band table moves); the 8th
    moves it (earlier)."""
    std = _profile([(1, 50.0)] * 8 + [(8, 400.0)] * 8)
    fly = _profile([(1, 80.0)] * 8 + [(8, 380.0)] * 8)
    first = speculation_limit(std, fly)
    for _ in range(7):
        fly = add_point(fly, 8, 200.0, None)
    held = speculation_limit(std, fly)
    assert (held.running, held.text, held.curve) == (first.running, first.text, first.curve)
    assert held.bands != first.bands  # the per-band table is current
    fly = add_point(fly, 8, 200.0, None)
    moved = speculation_limit(std, fly)
    assert moved.running is not None
    assert first.running is not None
    assert moved.running < first.running
