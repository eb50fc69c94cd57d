"""The simulator's answers on request kinds real vLLM 0.32 was found to answer otherwise before
(``/tokenize`` with messages, ``/detokenize``, ``continuous_usage_stats``, ``prompt_logprobs``,
wrong-type numbers, an empty conversation, ``/load``), over real HTTP. The live comparison with
the real server is ``tests/e2e/real_vllm/test_surface.py``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from specwatch.simulate.launcher import SimulatorHandle, start_simulator
from tests.vllm_conformance import REAL_LIKE
from tests.vllm_surface import cases, stale_rows, uncovered, unexplained_by

PROMPT = "alpha beta gamma"  # the synthetic tokenizer: BOS, then one id per word -> 4 tokens


@pytest.fixture
async def sim() -> AsyncIterator[SimulatorHandle]:
    handle = await start_simulator(REAL_LIKE)
    try:
        yield handle
    finally:
        await handle.stop()


async def _post(url: str, body: dict[str, Any]) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.post(url, json=body) as r:
        return r.status, await r.text()


async def test_tokenize_and_detokenize_agree(sim: SimulatorHandle) -> None:
    """/tokenize then /detokenize gives back the joined token strings; a bad ``tokens`` is a
    400 naming ``body.tokens`` (vLLM's validation error shape)."""
    status, text = await _post(
        sim.url + "/tokenize", {"model": "tiny", "prompt": PROMPT, "return_token_strs": True}
    )
    tok = json.loads(text)
    assert status == 200
    assert tok["count"] == 4
    assert tok["tokens"][0] == 1
    assert len(tok["token_strs"]) == 4
    status, text = await _post(sim.url + "/detokenize", {"model": "tiny", "tokens": tok["tokens"]})
    assert status == 200
    assert json.loads(text) == {"prompt": "".join(tok["token_strs"])}
    status, text = await _post(sim.url + "/detokenize", {"model": "tiny", "tokens": "x"})
    assert status == 400
    assert json.loads(text)["error"]["param"] == "body.tokens"


async def test_tokenize_with_messages_counts_the_rendered_chat(sim: SimulatorHandle) -> None:
    """/tokenize with ``messages`` counts the chat as rendered; empty messages get vLLM's
    "Cannot apply chat template to an empty conversation" error."""
    messages = [{"role": "user", "content": PROMPT}]
    status, text = await _post(sim.url + "/tokenize", {"model": "tiny", "messages": messages})
    assert status == 200
    count = json.loads(text)["count"]
    assert count > 3  # the three words plus the template's role markers
    status, text = await _post(sim.url + "/tokenize", {"model": "tiny", "messages": []})
    assert status == 400
    assert json.loads(text)["error"]["message"].startswith("Cannot apply chat template")


async def test_continuous_usage_stats_put_running_usage_on_every_chunk(
    sim: SimulatorHandle,
) -> None:
    """``stream_options.continuous_usage_stats`` puts the running usage on every chunk:
    completion tokens never go down and end at ``max_tokens``; prompt tokens are the same on
    every chunk."""
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 4, "temperature": 0,
            "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}  # fmt: skip
    status, text = await _post(sim.url + "/v1/completions", body)
    assert status == 200
    events = [json.loads(b[6:]) for b in text.split("\n\n") if b and b != "data: [DONE]"]
    counts = [e["usage"]["completion_tokens"] for e in events if e["choices"]]
    assert counts == sorted(counts)
    assert counts[-1] == 4
    assert all(e["usage"]["prompt_tokens"] == 4 for e in events)


async def test_prompt_logprobs_and_prompt_token_ids(sim: SimulatorHandle) -> None:
    """``prompt_logprobs`` and ``return_token_ids`` answer one entry per prompt token (the
    first entry ``null``, as vLLM writes it)."""
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 2, "temperature": 0,
            "prompt_logprobs": 1, "return_token_ids": True}  # fmt: skip
    status, text = await _post(sim.url + "/v1/completions", body)
    choice = json.loads(text)["choices"][0]
    assert status == 200
    assert len(choice["prompt_token_ids"]) == 4
    assert choice["prompt_logprobs"][0] is None
    assert len(choice["prompt_logprobs"]) == 4


async def test_wrong_type_temperature_is_pydantics_error(sim: SimulatorHandle) -> None:
    """A temperature of "hot" is a 400 naming ``body.temperature``; a numeric string is
    accepted, as vLLM's pydantic models accept it."""
    body = {"model": "tiny", "prompt": PROMPT, "temperature": "hot"}
    status, text = await _post(sim.url + "/v1/completions", body)
    error = json.loads(text)["error"]
    assert status == 400
    assert error["type"] == "Bad Request"
    assert error["param"] == "body.temperature"
    assert "float_parsing" in error["message"]
    status, _ = await _post(sim.url + "/v1/completions", {**body, "temperature": "0.5"})
    assert status == 200  # pydantic's lax mode parses a numeric string


async def test_load_counts_nothing_when_idle(sim: SimulatorHandle) -> None:
    """``GET /load`` on an idle server answers ``{"server_load": 0}``."""
    async with aiohttp.ClientSession() as s, s.get(sim.url + "/load") as r:
        assert r.status == 200
        assert await r.json() == {"server_load": 0}


def test_the_surface_table_is_enforced_both_ways() -> None:
    """A difference no row covers is reported, so is a row that covers none; a row's kind
    covers longer kinds only at a word boundary."""
    rows = [("field /v1/responses", "status", "not served"), ("route POST /x", "status", "r")]
    found = [
        "field /v1/responses seed: status: 200 vs 404",
        "field /v1/responses_extra seed: status: 200 vs 404",
        "route POST /x: keys/types $.a: 'int' vs 'str'",
    ]
    assert unexplained_by(found, rows) == found[1:]
    assert stale_rows(found, rows) == [rows[1]]


def test_a_field_without_a_sample_is_uncovered_and_gets_no_case() -> None:
    """A request field or route of the installed vLLM with no sample is named as uncovered
    and gets no conformance case."""
    surface = {"/v1/completions": ["prompt", "a_new_field"]}
    served = ["GET /health", "POST /v1/new_route"]
    assert uncovered(surface, served) == [
        "field /v1/completions a_new_field",
        "route POST /v1/new_route",
    ]
    made = cases(surface, served)
    assert sorted(made) == ["field /v1/completions prompt", "route GET /health"]
    assert made["field /v1/completions prompt"]["body"]["prompt"] == "Another prompt"
