"""Sampler: reproducible hash sampling, quotas, load-aware pause, caps, bounded queue."""

from __future__ import annotations

import hashlib
import json

import pytest

from specwatch.shadow.sample import (
    OTHER_CATEGORY,
    ArmLoad,
    CategoryBound,
    CategoryQuota,
    LoadPause,
    Sampler,
    TokenBucket,
    canonical_request_bytes,
    hash_fraction,
    pause_explanation,
    pause_reasons,
    request_hash,
    seed_from_hash,
)
from specwatch.shadow.values import ShadowRequest, Source
from tests.fakes import FakeMonotonicClock


def _req(i: int, category: str = "default", **extra: object) -> ShadowRequest:
    body = {"model": "m", "prompt": f"question {i}", **extra}
    return ShadowRequest(
        path="/v1/completions",
        body=body,
        request_hash=request_hash("/v1/completions", body),
        received_at=0.0,
        source=Source.MIRROR,
        category=category,
    )


def test_request_hash_matches_independent_sha256_and_ignores_volatile_fields() -> None:
    """request_hash is SHA-256 of the canonical request, ignoring key order and volatile fields,
    changed by path and salt."""
    body = {"prompt": "é", "model": "m", "stream": True, "user": "u1"}
    # independent construction of the canonical form
    canon = '{"body":{"model":"m","prompt":"é"},"path":"/v1/completions"}'.encode()
    assert canonical_request_bytes("/v1/completions", body) == canon
    assert request_hash("/v1/completions", body) == hashlib.sha256(b"\x00" + canon).hexdigest()
    # key order and stream flag do not change the hash; content and path do
    same = {"model": "m", "prompt": "é", "stream": False}
    assert request_hash("/v1/completions", same) == request_hash("/v1/completions", body)
    assert request_hash("/v1/chat/completions", same) != request_hash("/v1/completions", same)
    assert request_hash("/v1/completions", same, salt="x") != request_hash("/v1/completions", same)


def test_hash_fraction_and_seed_by_hand() -> None:
    """hash_fraction and seed_from_hash give hand-computed values."""
    assert hash_fraction("8" + "0" * 63) == 0.5
    assert hash_fraction("0" * 64) == 0.0
    assert hash_fraction("f" * 16 + "0" * 48) == pytest.approx(1.0 - 2.0**-64)
    assert seed_from_hash("0" * 16 + "00000010" + "0" * 40) == 16
    assert seed_from_hash("0" * 16 + "ffffffff" + "0" * 40) == 0xFFFFFFFF % (2**31 - 1)


def test_sampling_is_reproducible_and_matches_fraction() -> None:
    """Sampling by hash fraction is reproducible, near the probability, and takes none at 0 and
    all at 1."""
    clock = FakeMonotonicClock(1000.0)
    reqs = [_req(i) for i in range(2000)]
    expected = [hash_fraction(r.request_hash) < 0.25 for r in reqs]
    decisions = []
    for _ in range(2):
        s = Sampler(probability=0.25, mono_clock=clock, queue_size=10_000, max_rps=1e9)
        decisions.append([s.offer(r) == "admitted" for r in reqs])
        assert s.not_sampled == expected.count(False)
        assert s.admitted == expected.count(True)
    assert decisions[0] == decisions[1] == expected
    # the rate is near p (binomial sd for n=2000, p=.25 is 19.4; 5 sd bound)
    assert abs(sum(expected) - 500) < 100
    # p=0 takes nothing, p=1 takes everything
    s0 = Sampler(probability=0.0, mono_clock=clock, queue_size=10, max_rps=1e9)
    s1 = Sampler(probability=1.0, mono_clock=clock, queue_size=10_000, max_rps=1e9)
    assert all(s0.offer(r) == "not_sampled" for r in reqs[:50])
    assert all(s1.offer(r) == "admitted" for r in reqs[:50])


def test_token_bucket_by_hand() -> None:
    """The token bucket allows its burst, refills at its rate up to the burst and rejects a zero
    rate."""
    clock = FakeMonotonicClock(1000.0)
    b = TokenBucket(rate=2.0, burst=3.0, mono_clock=clock)
    assert [b.take() for _ in range(4)] == [True, True, True, False]
    clock.advance(0.5)  # +1 token
    assert [b.take(), b.take()] == [True, False]
    clock.advance(10.0)  # refill capped at burst 3
    assert [b.take() for _ in range(4)] == [True, True, True, False]
    with pytest.raises(ValueError, match="rate"):
        TokenBucket(rate=0.0, burst=1.0, mono_clock=clock)


def test_category_quotas_are_per_category() -> None:
    """Category quotas limit only the listed categories, each with its own bucket."""
    clock = FakeMonotonicClock(1000.0)
    s = Sampler(
        probability=1.0,
        mono_clock=clock,
        queue_size=100,
        max_rps=1e9,
        quota=CategoryQuota({"math": 1.0}, None, burst=2.0),
    )
    math = [s.offer(_req(i, "math")) for i in range(4)]
    other = [s.offer(_req(100 + i, "chat")) for i in range(4)]
    assert math == ["admitted", "admitted", "category_quota", "category_quota"]
    assert other == ["admitted"] * 4  # no quota for unlisted categories
    clock.advance(1.0)
    assert s.offer(_req(50, "math")) == "admitted"
    assert s.dropped["category_quota"] == 2


def test_ten_thousand_categories_keep_twenty_and_fold_the_rest() -> None:
    """10,000 distinct categories offered once each (quota 1/s on every category): 20 are kept
    (first come), the other 9,980 are queued as ``other`` and counted; the per-category token
    buckets number 21 (20 + ``other``), so ``other`` hits its quota after its burst of 2."""
    clock = FakeMonotonicClock(1000.0)
    bound = CategoryBound(20)
    s = Sampler(
        probability=1.0,
        mono_clock=clock,
        queue_size=20_000,
        max_rps=1e9,
        quota=CategoryQuota(default_per_second=1.0, burst=2.0),
        categories=bound,
    )
    results = [s.offer(_req(i, f"user-{i:05d}")) for i in range(10_000)]
    assert bound.kept == {f"user-{i:05d}" for i in range(20)}
    assert bound.overflowed == 9_980
    assert results[:22] == ["admitted"] * 22
    assert results[22:] == ["category_quota"] * (10_000 - 22)
    queued = [s.queue.get_nowait().category for _ in range(s.queue.qsize())]
    assert queued == [f"user-{i:05d}" for i in range(20)] + [OTHER_CATEGORY] * 2
    assert len(s._buckets) == 21


def test_category_bound_seeded_by_volume_keeps_room_for_nothing_else() -> None:
    """Seeded with 25 categories (largest first) and a limit of 20: the first 20 are kept,
    ``other`` never takes a place, a 26th category reads as ``other``."""
    bound = CategoryBound(20, [OTHER_CATEGORY, *(f"c{i}" for i in range(25))])
    assert bound.kept == {f"c{i}" for i in range(20)}
    assert bound("c3") == "c3"
    assert bound("c22") == OTHER_CATEGORY
    assert bound(OTHER_CATEGORY) == OTHER_CATEGORY
    assert bound.overflowed == 1


def test_rate_limit_and_queue_full() -> None:
    """The sampler drops for rate_limit beyond the burst and queue_full beyond the queue,
    counting each."""
    clock = FakeMonotonicClock(1000.0)
    s = Sampler(probability=1.0, mono_clock=clock, queue_size=3, max_rps=2.0)
    # burst = max(1, rps) = 2
    assert [s.offer(_req(i)) for i in range(3)] == ["admitted", "admitted", "rate_limit"]
    clock.advance(0.5)
    assert s.offer(_req(10)) == "admitted"
    clock.advance(0.5)
    assert s.offer(_req(11)) == "queue_full"  # queue holds 3
    assert s.queue.qsize() == 3
    assert s.dropped["rate_limit"] == 1
    assert s.dropped["queue_full"] == 1


def test_pause_reasons_by_hand() -> None:
    """pause_reasons names waiting, running near max and stale load readings."""
    fresh = 100.0

    def pr(loads: dict[str, ArmLoad], now: float, on_waiting: bool = True) -> frozenset[str]:
        return pause_reasons(
            loads, now, on_waiting=on_waiting, running_fraction=0.8, max_age_seconds=30.0
        )

    ok = {"standard": ArmLoad(7, 0, 10, fresh), "fly": ArmLoad(0, 0, None, fresh)}
    assert pr(ok, 110.0) == frozenset()
    near = {"standard": ArmLoad(8, 0, 10, fresh)}
    assert pr(near, 110.0) == {"running_near_max"}
    waiting = {"fly": ArmLoad(1, 2, 10, fresh)}
    assert pr(waiting, 110.0) == {"waiting"}
    assert pr(waiting, 110.0, on_waiting=False) == frozenset()
    stale = {"fly": ArmLoad(0, 0, 10, fresh)}
    assert pr(stale, 131.0) == {"load_stale"}
    never = {"fly": ArmLoad(None, None, None, None)}
    assert pr(never, 0.0) == {"load_stale"}


def test_sampler_pauses_and_counts_transitions() -> None:
    """The sampler drops while paused and counts one pause per transition into a reason."""
    clock = FakeMonotonicClock(1000.0)
    loads = {"standard": ArmLoad(0, 0, 10, clock.t), "fly": ArmLoad(0, 0, 10, clock.t)}
    s = Sampler(
        probability=1.0,
        mono_clock=clock,
        queue_size=100,
        max_rps=1e9,
        pause=LoadPause(lambda: loads),
    )
    assert s.offer(_req(1)) == "admitted"
    loads["fly"] = ArmLoad(3, 1, 10, clock.t)
    assert s.offer(_req(2)) == "paused"
    assert s.offer(_req(3)) == "paused"
    assert s.paused == {"waiting"}
    assert s.pauses["waiting"] == 1  # one transition, two drops
    assert s.dropped["paused"] == 2
    loads["fly"] = ArmLoad(9, 0, 10, clock.t)
    assert s.offer(_req(4)) == "paused"
    assert s.paused == {"running_near_max"}
    loads["fly"] = ArmLoad(1, 0, 10, clock.t)
    assert s.offer(_req(5)) == "admitted"
    assert s.paused == frozenset()
    assert s.pauses["running_near_max"] == 1


def test_force_skips_only_probability() -> None:
    """A forced offer skips the probability step but not the queue limit."""
    clock = FakeMonotonicClock(1000.0)
    s = Sampler(probability=0.0, mono_clock=clock, queue_size=1, max_rps=1e9)
    assert s.offer(_req(1), force=True) == "admitted"
    assert s.offer(_req(2), force=True) == "queue_full"


def test_canonical_rejects_nan() -> None:
    """The canonical form rejects NaN, which is not JSON."""
    with pytest.raises(ValueError, match="JSON"):
        canonical_request_bytes("/v1/completions", {"x": float("nan")})
    assert json.loads(canonical_request_bytes("/p", {"a": 1}))["body"] == {"a": 1}


def test_pause_explanation_names_the_arm_and_its_numbers() -> None:
    """The sentence behind the pause, worked out by hand for each reason."""
    now = 100.0

    def explain(loads: dict[str, ArmLoad]) -> str:
        return pause_explanation(
            loads, now, on_waiting=True, running_fraction=0.8, max_age_seconds=30.0
        )

    assert explain({"standard": ArmLoad(3, 0, 10, now)}) == ""
    assert (
        explain({"standard": ArmLoad(5, 12, 128, now)})
        == "paused: standard has 12 requests waiting"
    )
    assert (
        explain({"fly": ArmLoad(110, 1, 128, now)})
        == "paused: fly has 1 request waiting; fly runs 110 of 128 sequences (pauses at 80%)"
    )
    assert (
        explain({"fly": ArmLoad(0, 0, 10, now - 42)})
        == "paused: fly's last load reading is 42 s old"
    )


def test_canary_trickle_passes_only_a_chosen_pause_at_its_rate() -> None:
    """With a trickle of 0.1/s, canary offers pass a ``waiting`` pause once, then again after
    10 s; live offers never do; a stale reading (not a chosen pause) lets nothing through; the
    replay worker is told once that a trickled request need not wait."""
    clock = FakeMonotonicClock(1000.0)
    loads = {"standard": ArmLoad(2, 5, 10, clock.t)}
    s = Sampler(
        probability=1.0,
        mono_clock=clock,
        queue_size=100,
        max_rps=1e9,
        pause=LoadPause(lambda: loads, trickle_per_second=0.1),
    )
    assert s.offer(_req(1)) == "paused"
    assert s.offer(_req(2), force=True, trickle=True) == "admitted"
    assert s.offer(_req(3), force=True, trickle=True) == "paused"
    assert s.pause_text == "paused: standard has 5 requests waiting"
    clock.t += 10.0
    loads["standard"] = ArmLoad(2, 5, 10, clock.t)
    assert s.offer(_req(4), force=True, trickle=True) == "admitted"
    assert s.trickled == 2
    clock.t += 60.0  # the reading is now 60 s old: load_stale, not chosen
    assert s.offer(_req(5), force=True, trickle=True) == "paused"
    first = s.queue.get_nowait()
    assert s.passes_pause(first)
    assert not s.passes_pause(first)
