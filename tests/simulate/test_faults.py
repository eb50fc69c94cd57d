"""Fault patches: validation, per-engine acceptance drop, and a real-time server run."""

from __future__ import annotations

import math

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specwatch.simulate.config import Faults, SimConfig, StepTimeModel
from specwatch.simulate.engine_core import Simulation
from specwatch.simulate.faults import FaultError, apply_patch, clear
from specwatch.simulate.launcher import start_simulator


def test_patch_is_validated_all_or_nothing() -> None:
    """A fault patch is validated as a whole: one bad field applies nothing; clear restores the
    defaults."""
    f = Faults()
    with pytest.raises(FaultError, match="metrics_mode"):
        apply_patch(f, {"stall_admission": True, "metrics_mode": "sometimes"})
    assert f.stall_admission is False  # nothing applied
    with pytest.raises(FaultError, match="must be a boolean"):
        apply_patch(f, {"stall_admission": 1})
    with pytest.raises(FaultError, match="unreadable"):
        apply_patch(f, {"vllm_version": "x.y"})
    with pytest.raises(FaultError, match=r"\[0, 1\]"):
        apply_patch(f, {"completion_error_rate": 2})
    apply_patch(f, {"fly_entropy_threshold": 0, "max_num_batched_tokens": 256})
    assert f.fly_entropy_threshold == 0.0
    assert f.max_num_batched_tokens == 256
    clear(f)
    assert f == Faults()


def test_degrade_one_engine_drops_only_its_acceptance() -> None:
    """Degrading one engine's drafts lowers only that engine's acceptance."""
    faults = Faults(draft_noise_multiplier=4.0, draft_noise_engine=1)
    sim = Simulation(SimConfig(data_parallel_size=2), faults=faults)
    for i in range(40):
        sim.submit(f"engine fault request {i}", max_tokens=80, ignore_eos=True, seed=i)
    sim.run_until(math.inf)
    e0, e1 = (c.truth for c in sim.cores)
    a0 = e0.num_accepted_tokens / e0.num_draft_tokens
    a1 = e1.num_accepted_tokens / e1.num_draft_tokens
    ref = Simulation(SimConfig(data_parallel_size=2))
    for i in range(40):
        ref.submit(f"engine fault request {i}", max_tokens=80, ignore_eos=True, seed=i)
    ref.run_until(math.inf)
    r0 = ref.cores[0].truth
    assert a0 == r0.num_accepted_tokens / r0.num_draft_tokens  # engine 0 untouched
    assert a1 < a0 - 0.15


async def test_real_time_server_records_latency_histograms() -> None:
    """At real time the simulator records TTFT, end-to-end and inter-token latency histograms."""
    # time_scale 1: each step sleeps its simulated duration (a few ms here)
    cfg = SimConfig(step_time=StepTimeModel(base_s=0.002, token_s=1e-5, seq_s=1e-5))
    h = await start_simulator(cfg)
    try:
        async with aiohttp.ClientSession() as s:
            async with s.post(h.url + "/v1/completions",
                              json={"prompt": "real time", "max_tokens": 12}) as r:  # fmt: skip
                assert (await r.json())["usage"]["completion_tokens"] == 12
            async with s.get(h.url + "/metrics") as r:
                text = await r.text()
    finally:
        await h.stop()
    values = {
        (smp.name, smp.labels.get("le")): smp.value
        for fam in text_string_to_metric_families(text)
        for smp in fam.samples
    }
    assert values[("vllm:time_to_first_token_seconds_count", None)] == 1
    assert values[("vllm:e2e_request_latency_seconds_count", None)] == 1
    # every verify step after the first token is one inter-token-latency observation
    itl_count = values[("vllm:inter_token_latency_seconds_count", None)]
    steps = values[("vllm:iteration_tokens_total_count", None)]
    assert itl_count == steps - 1
    # a step lasts >= 2 ms of real time, so TTFT is above the 1 ms bucket bound
    assert values[("vllm:time_to_first_token_seconds_bucket", "0.001")] == 0
