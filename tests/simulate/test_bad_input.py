"""The simulator's HTTP API with NaN/Infinity (Python's json and many clients send them).

Before: ``temperature: NaN`` was served (200), and ``/admin/faults`` took ``NaN``/``Infinity`` for
``completion_delay_s``, ``draft_noise_multiplier`` and ``fly_entropy_threshold`` and then
returned non-strict JSON (``NaN``) from ``GET /admin/faults``. Now each is a 400 with the
parameter named and the faults unchanged.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, NoReturn

import aiohttp
import pytest

from specwatch.simulate.config import Role, SimConfig, StepTimeModel
from specwatch.simulate.launcher import SimulatorHandle, start_simulator

FAST = StepTimeModel(base_s=0.001, token_s=1e-6, seq_s=1e-6)


@pytest.fixture
async def sim() -> AsyncIterator[SimulatorHandle]:
    cfg = SimConfig(role=Role.FLY, served_model_name="sim-a", time_scale=0.0, step_time=FAST)
    handle = await start_simulator(cfg)
    try:
        yield handle
    finally:
        await handle.stop()


def _strict(name: str) -> NoReturn:
    raise ValueError(f"non-strict JSON constant {name}")


async def _post_raw(url: str, text: str) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as s,
        s.post(url, data=text, headers={"Content-Type": "application/json"}) as r,
    ):
        return r.status, json.loads(await r.text(), parse_constant=_strict)


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "true"])
async def test_non_finite_or_bool_temperature_is_400(sim: SimulatorHandle, value: str) -> None:
    """A non-finite or boolean temperature is a 400 naming the temperature parameter."""
    body = f'{{"model": "sim-a", "prompt": "hi", "max_tokens": 2, "temperature": {value}}}'
    status, doc = await _post_raw(sim.url + "/v1/completions", body)
    assert status == 400
    assert doc["error"]["param"] == "temperature"


@pytest.mark.parametrize(
    "key", ["completion_delay_s", "draft_noise_multiplier", "fly_entropy_threshold"]
)
@pytest.mark.parametrize("value", ["NaN", "Infinity"])
async def test_non_finite_fault_values_are_400_and_faults_stay_strict_json(
    sim: SimulatorHandle, key: str, value: str
) -> None:
    """A non-finite fault value is a 400, and the faults document stays unchanged and strict
    JSON."""
    async with aiohttp.ClientSession() as s, s.get(sim.url + "/admin/faults") as r:
        before = json.loads(await r.text(), parse_constant=_strict)
    status, doc = await _post_raw(sim.url + "/admin/faults", f'{{"{key}": {value}}}')
    assert status == 400
    assert doc["error"]["message"] == f"{key} must be a finite number"
    async with aiohttp.ClientSession() as s, s.get(sim.url + "/admin/faults") as r:
        after = json.loads(await r.text(), parse_constant=_strict)
    assert after == before
