"""``LoadConfig.max_requests`` is exact even when concurrency exceeds it (tasks are launched
before any of them has sent)."""

from __future__ import annotations

import pytest

from specwatch.simulate.config import SimConfig, StepTimeModel
from specwatch.simulate.launcher import start_simulator
from specwatch.simulate.loadgen import LoadConfig, LoadGenerator

FAST = StepTimeModel(base_s=0.001, token_s=1e-6, seq_s=1e-6)


@pytest.mark.parametrize(("fanout", "sent"), [(False, 5), (True, 10)])
async def test_max_requests_is_exact_with_more_concurrency(fanout: bool, sent: int) -> None:
    """max_requests is exact even with more concurrency than requests, with and without fanout."""
    a = await start_simulator(SimConfig(time_scale=0.0, step_time=FAST))
    b = await start_simulator(SimConfig(time_scale=0.0, step_time=FAST))
    try:
        gen = LoadGenerator(
            [a.url, b.url],
            LoadConfig(concurrency=16, duration_s=None, max_requests=5, max_tokens=8,
                       fanout=fanout),
        )  # fmt: skip
        stats = await gen.run()
    finally:
        await a.stop()
        await b.stop()
    assert stats.sent == sent
    assert stats.ok == sent
