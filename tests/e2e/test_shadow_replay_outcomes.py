"""Replay outcomes end to end: ``specwatch run`` (a subprocess, configured by a YAML file as a user
does) replays canary items to two fake arms on 127.0.0.1 that send the exact bytes of the C16 and
C29 hard cases and of malformed replies; the exported counters, the ledger and the log lines are
checked against values worked out by hand from the case files."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from specwatch.shadow.ledger.ledger import Ledger
from specwatch.shadow.ledger.rows import LedgerRow
from tests.fakes import REPO, free_port
from tests.fakes.arm import FakeArm, RawReply, raw_reply_file, serve_arm
from tests.fakes.wait import poll

CASES = REPO / "tests" / "fixtures" / "cases"
C29: list[dict[str, Any]] = json.loads((CASES / "C29_replay_pairs.json").read_text())["pairs"]
SSE = "text/event-stream; charset=utf-8"


def _json(body: Mapping[str, Any], status: int = 200) -> RawReply:
    return RawReply(status, "application/json", json.dumps(body).encode())


def _as_stream(body: Mapping[str, Any]) -> RawReply:
    """A chat completion body sent the way vLLM streams it: a role delta, the content delta, the
    finish chunk, a usage-only chunk, ``[DONE]``."""
    ch = body["choices"][0]

    def chunk(delta: dict[str, Any], finish: str | None) -> bytes:
        c = {
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return b"data: " + json.dumps(c).encode() + b"\n\n"

    usage = {"object": "chat.completion.chunk", "choices": [], "usage": body["usage"]}
    data = (
        chunk({"role": "assistant", "content": ""}, None)
        + chunk({"content": ch["message"]["content"]}, None)
        + chunk({}, ch["finish_reason"])
        + b"data: "
        + json.dumps(usage).encode()
        + b"\n\n"
        + b"data: [DONE]\n\n"
    )
    return RawReply(200, SSE, data)


PARIS = _json(
    {
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"content": "Paris"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }
)
GOOD_STREAM = _as_stream(json.loads(PARIS.body))
DELTA = b'data: {"choices":[{"index":0,"delta":{"content":"Par"},"finish_reason":null}]}\n\n'


def _script() -> tuple[dict[str, RawReply], dict[str, RawReply], list[dict[str, Any]]]:
    """Standard replies (JSON), FLy replies (streams: FLy is a stream arm) and the canary items."""
    std: dict[str, RawReply] = {}
    fly: dict[str, RawReply] = {}
    items: list[dict[str, Any]] = []
    for case in C29:
        std[case["id"]] = _json(case["standard"]["body"], case["standard"]["status"])
        fly[case["id"]] = _as_stream(case["fly"]["body"])
        gold = "42" if case["id"] == "F1" else "129"
        items.append({"id": case["id"], "gold": gold, "checker": "math"})
    for name in ("only_done", "error_mid_stream", "event_error"):
        std[name] = PARIS
        fly[name] = raw_reply_file(CASES / f"C16_sse_{name}.sse")
        items.append({"id": name, "gold": "Paris"})
    std["after_done"], fly["after_done"] = PARIS, RawReply(200, SSE, GOOD_STREAM.body + DELTA)
    std["not_utf8"], fly["not_utf8"] = (
        PARIS,
        RawReply(200, SSE, DELTA.replace(b"Par", b"P\xe9r") + GOOD_STREAM.body),
    )
    std["cut_json"], fly["cut_json"] = (
        RawReply(200, "application/json", PARIS.body[:30]),
        GOOD_STREAM,
    )
    bad = {"error": {"message": "logprobs must be <= 20", "type": "BadRequestError", "code": 400}}
    std["refused"], fly["refused"] = _json(bad, 400), GOOD_STREAM
    items += [{"id": k, "gold": "Paris"} for k in ("after_done", "not_utf8", "cut_json", "refused")]
    for it in items:
        it["messages"] = [{"role": "user", "content": it["id"]}]
        it["category"] = "cases"
    return std, fly, items


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def _by(
    m: Mapping[tuple[str, frozenset[tuple[str, str]]], float], name: str, *keys: str
) -> dict[tuple[str, ...], float]:
    """Non-zero samples of ``name`` keyed by the values of ``keys``."""
    out = {}
    for (n, labels), v in m.items():
        if n == name and v:
            d = dict(labels)
            out[tuple(d[k] for k in keys)] = v
    return out


async def test_replay_outcomes_through_specwatch_run(tmp_path: Path) -> None:
    """13 canary items through ``specwatch run``: C29 F1/F3/F4 are compared (agree 2, disagree 1:
    mismatch 1/3, F1 graded both correct, F3/F4 truncated and ungraded); F2/F5 (FLy ``abort`` /
    ``cancelled``) and F6 (standard ``abort``) are unpaired; the three C16 streams are unpaired
    and told apart (empty stream, in-band 500 with the partial text kept, in-band 400); a chunk
    after ``[DONE]``, a non-UTF-8 byte and a cut JSON body are unpaired with their own reason; a
    400 is excluded. Counters by reason and arm, ledger rows and one log line per failed reply
    agree; no traceback."""
    std_replies, fly_replies, items = _script()
    canary = tmp_path / "canary.jsonl"
    canary.write_text("".join(json.dumps(it) + "\n" for it in items))
    ledger = tmp_path / "ledger.sqlite"
    std, fly = (
        FakeArm(mode="script", replies=std_replies),
        FakeArm(mode="script", replies=fly_replies),
    )
    port = free_port()
    async with serve_arm(std) as su, serve_arm(fly) as fu, aiohttp.ClientSession() as session:
        config = {
            # a scrape target is required; this one is no arm's server, so it cannot pause replay
            "targets": [{"name": "other", "url": "http://127.0.0.1:9", "role": "baseline"}],
            "shadow": {
                "enabled": True,
                "modes": ["canary"],
                "canary_file": str(canary),
                "canary_rate_per_second": 50.0,
                "canary_loop": False,
                "max_shadow_rps": 100.0,
                "standard": {"url": su},
                "fly": {"url": fu},
                "stream_arms": ["fly"],
                "store_text": True,
            },
            "ledger": {"path": str(ledger)},
            "paired": {"windows": ["1h"], "refresh_seconds": 0.2},
        }
        cfg = tmp_path / "specwatch.yaml"
        cfg.write_text(yaml.safe_dump(config))
        log_path = tmp_path / "specwatch.log"
        with log_path.open("wb") as log:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "specwatch",
                "run",
                "--config",
                str(cfg),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--log-format",
                "json",
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
            )
        url = f"http://127.0.0.1:{port}/metrics"
        try:

            async def finished() -> dict[tuple[str, frozenset[tuple[str, str]]], float] | None:
                assert proc.returncode is None, log_path.read_text()[-3000:]
                async with session.get(url) as r:
                    m = _samples(await r.text())
                done = sum(_by(m, "specwatch_shadow_replays_total", "status").values())
                pairs = sum(_by(m, "specwatch_shadow_pairs_total", "outcome").values())
                return m if done == len(items) and pairs >= 3 else None

            m = await poll("every canary item replayed", finished, within=90)
        finally:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), timeout=30)
    assert _by(m, "specwatch_shadow_replays_total", "status") == {
        ("paired",): 3,
        ("unpaired",): 9,
        ("excluded",): 1,
    }
    assert _by(m, "specwatch_shadow_unpaired_total", "reason") == {
        ("fly_aborted",): 1,
        ("fly_unknown_finish_reason",): 1,
        ("standard_aborted",): 1,
        ("fly_empty_stream",): 1,
        ("fly_in_band_5xx",): 1,
        ("fly_in_band_4xx",): 1,
        ("fly_data_after_done",): 1,
        ("fly_invalid_utf8",): 1,
        ("standard_invalid_json",): 1,
    }
    assert _by(m, "specwatch_shadow_excluded_total", "reason") == {("bad_request",): 1}
    assert _by(m, "specwatch_shadow_arm_errors_total", "arm", "reason") == {
        ("fly", "aborted"): 1,
        ("fly", "unknown_finish_reason"): 1,
        ("standard", "aborted"): 1,
        ("fly", "empty_stream"): 1,
        ("fly", "in_band_5xx"): 1,
        ("fly", "in_band_4xx"): 1,
        ("fly", "data_after_done"): 1,
        ("fly", "invalid_utf8"): 1,
        ("standard", "invalid_json"): 1,
        ("standard", "bad_request"): 1,
    }
    assert _by(m, "specwatch_shadow_pairs_total", "arm", "outcome") == {
        ("fly", "agree"): 2,
        ("fly", "disagree"): 1,
        ("fly", "both_correct"): 1,
    }
    async with Ledger(ledger) as led:
        rows: dict[str, LedgerRow] = {str(r.item_id): r for r in await led.query()}
    assert len(rows) == len(items)
    f3, f4 = rows["F3"], rows["F4"]
    assert (f3.fly_agrees, f3.standard_truncated, f3.fly_truncated, f3.fly_correct) == (
        True,
        True,
        True,
        None,
    )
    assert (f4.fly_agrees, f4.fly_divergence_char, f4.standard_truncated, f4.fly_correct) == (
        False,
        0,
        True,
        None,
    )
    assert (rows["F1"].standard_correct, rows["F1"].fly_correct) == (True, True)
    mid = rows["error_mid_stream"]
    assert (mid.fly_error, mid.fly_error_code, mid.fly_text) == (
        "in_band_5xx",
        500,
        "The capital of",
    )
    assert (mid.standard_error, mid.standard_text) == (None, "Paris")
    assert (rows["event_error"].fly_error_code, rows["F5"].fly_finish_reason) == (400, "cancelled")
    lines = [json.loads(x) for x in log_path.read_text().splitlines() if x.startswith("{")]
    failed = sorted(
        (x["arm"], x["reason"]) for x in lines if x.get("event") == "shadow arm reply failed"
    )
    assert failed == sorted(
        k
        for k, v in _by(m, "specwatch_shadow_arm_errors_total", "arm", "reason").items()
        if k != ("standard", "bad_request")
        for _ in range(int(v))
    )
    assert "Traceback" not in log_path.read_text()
