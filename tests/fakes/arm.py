"""Fake OpenAI-compatible upstreams (real aiohttp servers on port 0) for the shadow I/O tests."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from specwatch.vllm.request_metrics import metrics_object, spec_decode_object


@dataclass
class Seen:
    """One request a fake upstream received."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass(frozen=True)
class RawReply:
    """Exact reply bytes: HTTP ``status``, ``Content-Type`` and ``body`` sent as given."""

    status: int
    content_type: str
    body: bytes


def raw_reply_file(path: Path) -> RawReply:
    """A reply saved as ``HTTP/1.1 <status> ...``, header lines, a blank line, then the body
    bytes (the ``.sse`` hard-case files)."""
    data = path.read_bytes()
    head, _, body = data.partition(b"\n\n")
    lines = head.decode("ascii").splitlines()
    status = int(lines[0].split()[1])
    headers = dict(line.split(": ", 1) for line in lines[1:])
    ctype = next(v for k, v in headers.items() if k.lower() == "content-type")
    return RawReply(status, ctype, body)


def request_key(body: dict[str, Any]) -> str:
    """What a scripted arm looks its reply up by: the prompt, or the last message's content."""
    msgs = body.get("messages")
    if isinstance(msgs, list) and msgs:
        return str(msgs[-1].get("content", ""))
    return str(body.get("prompt", ""))


@dataclass
class FakeArm:
    """Behaviour of one fake arm: ``mode`` is ``ok|hang|status|stream|in_band_error``, or
    ``script``: the :class:`RawReply` in ``replies`` under :func:`request_key` of the request
    (bytes exactly as given; an unknown key gets a 404).

    ``spec_steps``: tokens accepted at each verify step (K = 4 drafted per step); when set the
    reply carries vLLM's ``metrics.speculative_decoding`` (``--per-request-spec-decode-metrics
    summary`` shape; in a stream only on the usage chunk, when ``include_usage`` was asked).
    ``prompt_tokens`` is the ``usage.prompt_tokens`` it reports. In ``stream`` mode the
    content goes out as ``chunks`` (default: the text in two pieces), the first after
    ``first_delay`` seconds and each next one ``chunk_delay`` seconds later, and the usage chunk
    says ``completion_tokens``; with ``usage`` off no usage chunk is sent (a server ignoring
    ``include_usage``). ``POST /tokenize`` answers the bytes of ``tokenize`` written piece by
    piece, ``tokenize_delay`` seconds apart (default: a ``count`` of the prompt's words)."""

    text: str = "hello"
    mode: str = "ok"
    status: int = 200
    message: str = ""
    spec_steps: list[int] | None = None
    prompt_tokens: int = 3
    chunks: list[str] | None = None
    chunk_delay: float = 0.0
    first_delay: float = 0.0
    completion_tokens: int = 2
    seen: list[Seen] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    replies: dict[str, RawReply] = field(default_factory=dict)
    usage: bool = True
    tokenize: list[bytes] | None = None
    tokenize_delay: float = 0.0
    tokenized: list[str] = field(default_factory=list)

    async def handle_tokenize(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt = str(body.get("prompt", ""))
        self.tokenized.append(prompt)
        pieces = self.tokenize
        if pieces is None:
            pieces = [json.dumps({"count": len(prompt.split())}).encode()]
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        for i, piece in enumerate(pieces):
            if i:
                await asyncio.sleep(self.tokenize_delay)
            await resp.write(piece)
        await resp.write_eof()
        return resp

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.seen.append(Seen(request.path, dict(request.headers), body))
        self.arrived.set()
        if self.mode == "script":
            reply = self.replies.get(request_key(body))
            if reply is None:
                return web.Response(status=404, text="no scripted reply")
            resp = web.StreamResponse(status=reply.status)
            resp.headers["Content-Type"] = reply.content_type
            await resp.prepare(request)
            await resp.write(reply.body)
            await resp.write_eof()
            return resp
        if self.mode == "hang":
            await self.release.wait()
        if self.mode == "status":
            return web.json_response(
                {"error": {"message": self.message, "type": "BadRequestError"}},
                status=self.status,
            )
        if self.mode == "in_band_error":
            return web.json_response({"error": {"message": "engine dead"}})
        chat = request.path.endswith("/chat/completions")
        if self.mode == "stream":
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            pieces = self.chunks if self.chunks is not None else [self.text[:2], self.text[2:]]
            await asyncio.sleep(self.first_delay)
            for i, piece in enumerate(pieces):
                if i:
                    await asyncio.sleep(self.chunk_delay)
                delta = {"delta": {"content": piece}} if chat else {"text": piece}
                chunk = {"choices": [{"index": 0, **delta, "finish_reason": None}]}
                await resp.write(f"data: {json.dumps(chunk)}\r\n\r\n".encode())
            fin = {"choices": [{"index": 0, "finish_reason": "stop", "text": ""}]}
            await resp.write(f"data: {json.dumps(fin)}\n\n".encode())
            if not self.usage:
                await resp.write(b"data: [DONE]\n\n")
                await resp.write_eof()
                return resp
            usage: dict[str, Any] = {
                "choices": [],
                "usage": {
                    "prompt_tokens": self.prompt_tokens,
                    "completion_tokens": self.completion_tokens,
                },
            }
            if self.spec_steps is not None and body.get("stream_options", {}).get("include_usage"):
                usage["metrics"] = self._metrics(streamed=True)
            await resp.write(f"data: {json.dumps(usage)}\n\n: ping\n\ndata: [DONE]\n\n".encode())
            await resp.write_eof()
            return resp
        choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
        if chat:
            choice["message"] = {"role": "assistant", "content": self.text}
        else:
            choice["text"] = self.text
        out: dict[str, Any] = {
            "choices": [choice],
            "usage": {
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": 2,
                "total_tokens": self.prompt_tokens + 2,
            },
        }
        if self.spec_steps is not None:
            out["metrics"] = self._metrics(streamed=False)
        return web.json_response(out)

    def _metrics(self, *, streamed: bool) -> dict[str, Any]:
        steps = self.spec_steps or []
        spec = spec_decode_object(
            num_spec_tokens=4,
            per_step_accepted=steps,
            per_step_drafted=[4] * len(steps),
            detailed=False,
            streamed=streamed,
        )
        return metrics_object(spec, streamed=streamed)


@asynccontextmanager
async def serve_arm(arm: FakeArm) -> AsyncIterator[str]:
    """Run ``arm`` on 127.0.0.1 port 0; yields its base URL."""
    app = web.Application()
    app.router.add_post("/v1/completions", arm.handle)
    app.router.add_post("/v1/chat/completions", arm.handle)
    app.router.add_post("/tokenize", arm.handle_tokenize)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        arm.release.set()
        await server.close()
