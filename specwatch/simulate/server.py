"""vLLM's HTTP surface over the simulated engines (aiohttp), in real time.

Routes: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (JSON or SSE
with ``data: [DONE]`` and a usage chunk when ``stream_options.include_usage``, usage on every
chunk with ``continuous_usage_stats``), ``POST /tokenize`` (prompt or messages),
``POST /detokenize``, ``GET /health``, ``GET /ping``, ``GET /load``, ``GET /kv_event_sources``,
``GET /version``, ``GET /metrics``; admin: ``GET|POST|DELETE /admin/faults``,
``POST /admin/restart``, ``GET /admin/stats`` (ground truth). Errors use vLLM's body
``{"error": {"message", "type", "param", "code"}}``.

Admission control (vLLM 0.33 ``--max-num-queued-reqs`` / ``--max-num-queued-tokens``, both off
by default): a completion request that passes validation but finds a limit reached is refused
before it is queued with vLLM's answer, HTTP 503 and
``{"error": {"message": "The engine is currently busy ...", "type": "Service Unavailable",
"param": null, "code": 503}}``, and ``vllm:admission_rejections_total{model_name, reason}``
counts it (see :meth:`SimServer.admission_rejection`). Streaming requests are refused the same
way, before the event stream starts.

Response bodies follow vLLM 0.32's field for field (``tests/fixtures/vllm-responses/``, checked
against the real server by ``tests/e2e/real_vllm/test_conformance.py``): ``null`` for what the
simulator does not compute (``logprobs``, ``service_tier``, ``kv_transfer_params``, ...),
``system_fingerprint`` ``vllm-<version>-<8 hex>``. Per-request speculative-decoding metrics are
returned as vLLM returns them under the same flag, ``--per-request-spec-decode-metrics
none|summary|detailed`` (:mod:`specwatch.vllm.request_metrics`): a non-streamed reply carries
``metrics`` (``null`` at ``none``), a stream carries them only on the final usage chunk and only
with ``stream_options.include_usage``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
import uuid
from typing import Any, cast

from aiohttp import web
from aiohttp.typedefs import Handler

from specwatch.core.clock import SYSTEM_MONOTONIC, MonotonicClock
from specwatch.core.logs import log_event
from specwatch.simulate import faults as faults_mod
from specwatch.simulate import openai_errors as err
from specwatch.simulate.config import Faults, Role, SimConfig
from specwatch.simulate.engine_core import (
    EngineCore,
    RequestOutput,
    SimRequest,
    dispatch,
    synthetic_lm,
)
from specwatch.simulate.metrics import CONTENT_TYPE, SimMetrics
from specwatch.simulate.openai_errors import APIError
from specwatch.simulate.replies import (
    chat_logprobs,
    chosen_tool,
    completion_logprobs,
    prompt_logprobs,
    prompt_token_ids,
    tool_call,
)
from specwatch.simulate.requests import Choice, ParsedRequest, chat_prompt, parse_request
from specwatch.vllm.budget import budget_limits
from specwatch.vllm.request_metrics import metrics_object

log = logging.getLogger("specwatch.simulate")


#: vLLM 0.33's messages (``vllm/exceptions.py`` ``QueueOverflowError``, ``MaxQueuedTokensError``).
ADMISSION_MESSAGES = {
    "max_num_queued_reqs": "The engine is currently busy and cannot accept new requests. "
    "Please try again later or on a different instance.",
    "max_num_queued_tokens": "The engine has reached its prefill token backlog limit. "
    "Please try again later or on a different instance.",
}


def json_reply(body: Any, status: int = 200) -> web.Response:
    """A JSON reply as vLLM sends it (``Content-Type: application/json``, no charset)."""
    return web.Response(
        body=json.dumps(body, ensure_ascii=False).encode(),
        status=status,
        headers={"Content-Type": "application/json"},
    )


def error_response(status: int, message: str, param: str | None = None) -> web.Response:
    """vLLM's error body: ``{"error": {"message", "type", "param", "code"}}``."""
    return json_reply(APIError(status, message, param).body(), status)


@web.middleware
async def vllm_http(request: web.Request, handler: Handler) -> web.StreamResponse:
    """What vLLM's FastAPI app does around every route: unknown paths and methods answer
    ``{"detail": ...}`` in JSON, and every reply carries ``vary: Origin`` (CORS)."""
    try:
        resp = await handler(request)
    except web.HTTPException as exc:
        if exc.status not in (404, 405):
            raise
        resp = json_reply({"detail": exc.reason}, exc.status)
        if exc.status == 405 and "Allow" in exc.headers:
            resp.headers["Allow"] = exc.headers["Allow"]
    if not resp.prepared:
        resp.headers["vary"] = "Origin"
    return resp


async def _vary_on_stream(_request: web.Request, resp: web.StreamResponse) -> None:
    resp.headers.setdefault("vary", "Origin")


class SimServer:
    """One simulated vLLM server: engines, metrics, faults and the aiohttp application.

    ``mono_clock`` is a monotonic clock in seconds (default ``SYSTEM_MONOTONIC``).
    """

    def __init__(
        self,
        config: SimConfig,
        *,
        mono_clock: MonotonicClock = SYSTEM_MONOTONIC,
        rng: random.Random | None = None,
    ) -> None:
        config.validate()
        self.config = config
        self.mono_clock = mono_clock
        self.rng = rng or random.Random(config.seed)
        self.faults = Faults()
        self.metrics = SimMetrics(config)
        lm = synthetic_lm(config)
        self.lm = lm
        self.cores = [
            EngineCore(config, engine_index=i, lm=lm, faults=self.faults, sink=self.metrics)
            for i in range(config.data_parallel_size)
        ]
        self._wake = [asyncio.Event() for _ in self.cores]
        self._tasks: list[asyncio.Task[None]] = []
        self.started_at = time.time()
        self._fingerprint = uuid.uuid4().hex[:8]
        self.restarts = 0
        self.app = self._make_app()

    # -- lifecycle ------------------------------------------------------------------------------
    def _make_app(self) -> web.Application:
        app = web.Application(client_max_size=4 * 1024 * 1024, middlewares=[vllm_http])
        app.on_response_prepare.append(_vary_on_stream)
        app.router.add_get("/ping", self.h_health)
        app.router.add_post("/ping", self.h_health)
        app.router.add_post("/tokenize", self.h_tokenize)
        app.router.add_post("/detokenize", self.h_detokenize)
        app.router.add_get("/load", self.h_load)
        app.router.add_get("/kv_event_sources", self.h_kv_event_sources)
        app.router.add_get("/v1/models", self.h_models)
        app.router.add_post("/v1/completions", self.h_completions)
        app.router.add_post("/v1/chat/completions", self.h_chat)
        app.router.add_get("/health", self.h_health)
        app.router.add_get("/version", self.h_version)
        app.router.add_get("/metrics", self.h_metrics)
        app.router.add_get("/admin/faults", self.h_faults_get)
        app.router.add_post("/admin/faults", self.h_faults_post)
        app.router.add_delete("/admin/faults", self.h_faults_delete)
        app.router.add_post("/admin/restart", self.h_restart)
        app.router.add_get("/admin/stats", self.h_stats)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, _app: web.Application) -> None:
        self.start_engines()

    async def _on_cleanup(self, _app: web.Application) -> None:
        await self.stop_engines()

    def start_engines(self) -> None:
        """Start one step-loop task per engine in the running event loop."""
        if not self._tasks:
            self._tasks = [
                asyncio.create_task(self._engine_loop(i), name=f"sim-engine-{i}")
                for i in range(len(self.cores))
            ]

    async def stop_engines(self) -> None:
        """Cancel the step loops and wait for them."""
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []

    async def _engine_loop(self, i: int) -> None:
        core = self.cores[i]
        wake = self._wake[i]
        scale = self.config.time_scale
        while True:
            if not core.has_work():
                core.publish_queue()  # idle (or admission stalled): the gauges show the queue
                wake.clear()
                await wake.wait()
                continue
            res = core.step(self.mono_clock(), scale)
            if res is None:
                # running requests exist but nothing fits (e.g. admission stalled): idle a tick
                await asyncio.sleep(self.config.step_time.base_s * max(scale, 0.01))
                continue
            delay = res.end - self.mono_clock()
            await asyncio.sleep(delay if delay > 0 else 0)
            dispatch(res.outputs)

    def restart(self) -> None:
        """Counters reset, as after a server restart (requests in flight keep going)."""
        self.metrics.reset()
        for core in self.cores:
            core.reset_counters()
            core.publish_queue()  # gauges are state, not counters: the new registry has them
        self.restarts += 1

    # -- request plumbing -----------------------------------------------------------------------
    def submit(self, req: SimRequest) -> EngineCore:
        """Queue ``req`` on the least-loaded engine and wake it."""
        i = min(range(len(self.cores)), key=lambda j: self.cores[j].load())
        self.cores[i].add_request(req)
        self._wake[i].set()
        return self.cores[i]

    def admission_rejection(self) -> str | None:
        """The reason a new request would be refused now, or ``None`` to admit it.

        vLLM 0.33's frontend check (``AsyncLLM.check_admission``), in its order:
        ``max_num_queued_reqs`` refuses when unfinished requests (waiting + running, across
        the data-parallel engines) + 1 would exceed the limit; ``max_num_queued_tokens``
        refuses when the prompt tokens of requests still in prefill (no output yet; counted
        in full, as vLLM's frontend does) are already >= the limit. ``None`` limits never
        refuse.
        """
        c = self.config
        unfinished = sum(core.load() for core in self.cores)
        if c.max_num_queued_reqs is not None and unfinished + 1 > c.max_num_queued_reqs:
            return "max_num_queued_reqs"
        if c.max_num_queued_tokens is not None:
            prefilling = sum(
                r.prompt_len
                for core in self.cores
                for r in (*core.waiting, *core.running)
                if r.first_token is None
            )
            if prefilling >= c.max_num_queued_tokens:
                return "max_num_queued_tokens"
        return None

    # -- handlers -------------------------------------------------------------------------------
    async def h_health(self, _r: web.Request) -> web.Response:
        return web.Response(status=200)

    async def h_version(self, _r: web.Request) -> web.Response:
        return json_reply({"version": self.config.vllm_version})

    async def h_models(self, _r: web.Request) -> web.Response:
        name = self.config.served_model_name
        created = int(self.started_at)
        card = {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": name,
            "parent": None,
            "max_model_len": self.config.max_model_len,
            "permission": [
                {
                    "id": "modelperm-" + self._fingerprint * 2,
                    "object": "model_permission",
                    "created": created,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }
        return json_reply({"object": "list", "data": [card]})

    async def h_metrics(self, _r: web.Request) -> web.Response:
        mode = self.faults.metrics_mode
        if mode == "error":
            return web.Response(status=500, text="Internal Server Error")
        if mode == "malformed":
            return web.Response(body=faults_mod.MALFORMED_METRICS_BODY, content_type="text/plain")
        resp = web.Response(body=self.metrics.exposition())
        resp.headers["Content-Type"] = CONTENT_TYPE
        return resp

    async def h_faults_get(self, _r: web.Request) -> web.Response:
        return json_reply(self.faults.as_dict())

    async def h_faults_post(self, request: web.Request) -> web.Response:
        try:
            patch = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return error_response(400, "body is not JSON")
        if not isinstance(patch, dict):
            return error_response(400, "body must be a JSON object")
        try:
            faults_mod.apply_patch(self.faults, patch)
        except faults_mod.FaultError as exc:
            return error_response(400, str(exc))
        log_event(log, logging.INFO, "faults set", faults=json.dumps(patch, sort_keys=True))
        for w in self._wake:
            w.set()
        return json_reply(self.faults.as_dict())

    async def h_faults_delete(self, _r: web.Request) -> web.Response:
        faults_mod.clear(self.faults)
        for w in self._wake:
            w.set()
        return json_reply(self.faults.as_dict())

    async def h_restart(self, _r: web.Request) -> web.Response:
        self.restart()
        return json_reply({"restarts": self.restarts})

    async def h_stats(self, _r: web.Request) -> web.Response:
        return json_reply(self.stats())

    def stats(self) -> dict[str, Any]:
        """Ground truth: config, budget limits and each engine's counters since the last restart.

        ``server`` sums the engines (``accepted_per_pos`` elementwise).
        """
        c = self.config
        engines: dict[str, Any] = {}
        total: dict[str, Any] = {}
        for core in self.cores:
            d = core.truth.as_dict()
            d["num_requests_running"] = len(core.running)
            d["num_requests_waiting"] = len(core.waiting)
            bv = core.budget()
            d["budget"] = {
                "regime": bv.regime.value,
                "token_budget": bv.token_budget,
                "input_budget": None if bv.input_budget == float("inf") else bv.input_budget,
                "extra_slots": bv.extra_slots,
                "admission_cap": bv.admission_cap,
            }
            engines[str(core.engine_index)] = d
            for key in (
                "steps",
                "num_drafts",
                "num_draft_tokens",
                "num_accepted_tokens",
                "fly_waivers",
                "generation_tokens",
                "cut_tokens",
                "prompt_tokens",
                "num_requests_running",
                "num_requests_waiting",
            ):
                total[key] = int(total.get(key, 0)) + int(cast(int, d[key]))
            pp = total.setdefault("accepted_per_pos", [0] * c.num_speculative_tokens)
            for i, v in enumerate(core.truth.accepted_per_pos):
                pp[i] += v
        limits: dict[str, Any] | None = None
        if c.speculative:
            lim = budget_limits(
                max_num_batched_tokens=c.max_num_batched_tokens,
                max_num_seqs=c.max_num_seqs,
                num_speculative_tokens=c.num_speculative_tokens,
                method=c.method,
                regime=c.regime,
            )
            limits = {
                "admission_cap": lim.admission_cap,
                "decode_full_per_step": lim.decode_full_per_step,
                "budget_bound": lim.budget_bound,
            }
        return {
            "role": c.role.value,
            "model_name": c.served_model_name,
            "restarts": self.restarts,
            "config": {
                "method": c.method,
                "num_speculative_tokens": c.num_speculative_tokens if c.speculative else 0,
                "max_num_seqs": c.max_num_seqs,
                "max_num_batched_tokens": c.max_num_batched_tokens,
                "vllm_version": c.vllm_version,
                "data_parallel_size": c.data_parallel_size,
                "fly_window_size": c.fly_window if c.role is Role.FLY else None,
                "fly_entropy_threshold": c.fly_entropy_threshold if c.role is Role.FLY else None,
                "fly_entropy_top_k": c.fly_entropy_top_k if c.role is Role.FLY else None,
            },
            "closed_form_limits": limits,
            "faults": self.faults.as_dict(),
            "engines": engines,
            "server": total,
        }

    async def h_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def h_chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def h_tokenize(self, request: web.Request) -> web.Response:
        """vLLM's ``POST /tokenize`` for a text prompt or a chat (the synthetic tokenizer and
        chat rendering, no BOS unless ``add_special_tokens``; ``return_token_strs`` gives the
        vocabulary pieces)."""
        if self.faults.tokenize_error:
            return error_response(500, "tokenizer fault injected")
        try:
            body = await self._json_body(request)
            if not isinstance(body, dict):
                raise err.missing_prompt()
            if "messages" in body:
                _key, prompt = chat_prompt(body["messages"])
            else:
                text = body.get("prompt")
                if not isinstance(text, str):
                    raise err.missing_prompt()
                prompt = text
        except APIError as exc:
            return json_reply(exc.body(), exc.status)
        ids = prompt_token_ids(prompt, self.config.vocab_size)
        if not body.get("add_special_tokens", "messages" not in body):
            ids = ids[1:]
        pieces = self.lm.pieces
        strs = [pieces[i % len(pieces)] for i in ids] if body.get("return_token_strs") else None
        return json_reply(
            {
                "count": len(ids),
                "max_model_len": self.config.max_model_len,
                "tokens": ids,
                "token_strs": strs,
            }
        )

    async def h_detokenize(self, request: web.Request) -> web.Response:
        """vLLM's ``POST /detokenize``: the vocabulary pieces of ``tokens`` joined."""
        try:
            body = await self._json_body(request)
        except APIError as exc:
            return json_reply(exc.body(), exc.status)
        tokens = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in tokens
        ):
            errors = [{"type": "list_type", "loc": "body.tokens",
                       "msg": "Input should be a valid list", "input": tokens}]  # fmt: skip
            return json_reply(err.validation_error(errors).body(), 400)
        pieces = self.lm.pieces
        return json_reply({"prompt": "".join(pieces[t % len(pieces)] for t in tokens)})

    async def h_load(self, _r: web.Request) -> web.Response:
        """vLLM's ``GET /load``: requests in flight (running and waiting) on all engines."""
        load = sum(len(c.running) + len(c.waiting) for c in self.cores)
        return json_reply({"server_load": load})

    async def h_kv_event_sources(self, _r: web.Request) -> web.Response:
        """vLLM's ``GET /kv_event_sources``: no KV-event publishers configured."""
        return json_reply({})

    async def _json_body(self, request: web.Request) -> Any:
        """The decoded body of a POST, refused as FastAPI refuses it."""
        if request.content_type != "application/json":
            raise err.unsupported_media_type()
        raw = await request.read()
        try:
            return json.loads(raw)
        except json.JSONDecodeError as exc:
            raise err.invalid_json(exc) from None
        except UnicodeDecodeError:
            raise err.invalid_json(json.JSONDecodeError("Invalid UTF-8", "", 0)) from None

    async def _generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        header_id = request.headers.get("x-request-id")
        rid = None
        if header_id:
            rid = ("chatcmpl-" if chat else "cmpl-") + header_id
        try:
            body = await self._json_body(request)
            parsed = parse_request(
                self.config,
                body,
                chat=chat,
                now=self.mono_clock(),
                rng=self.rng,
                request_id=rid,
            )
        except APIError as exc:
            return json_reply(exc.body(), exc.status)
        if self.faults.stream_usage_ignored:  # a server that never sends streamed usage
            parsed.include_usage = parsed.continuous_usage = False
        rejected = self.admission_rejection()
        if rejected is not None:
            self.metrics.on_admission_rejected(rejected)
            return error_response(503, ADMISSION_MESSAGES[rejected])
        f = self.faults
        if f.completion_delay_s > 0:
            await asyncio.sleep(f.completion_delay_s)
        if f.completion_error_rate > 0 and self.rng.random() < f.completion_error_rate:
            return error_response(500, "simulated engine failure (fault injection)")
        queue: asyncio.Queue[tuple[Choice, RequestOutput]] = asyncio.Queue()
        cores: list[tuple[EngineCore, SimRequest]] = []
        for ch in parsed.choices:
            ch.req.listener = lambda out, ch=ch: queue.put_nowait((ch, out))
            cores.append((self.submit(ch.req), ch.req))
        created = int(time.time())
        if parsed.stream:
            return await self._stream(request, parsed, cores, queue, chat, created)
        open_choices = len(parsed.choices)
        try:
            while open_choices:
                _, out = await queue.get()
                if out.finish_reason is not None:
                    open_choices -= 1
        except asyncio.CancelledError:
            self._abort(cores)
            raise
        return json_reply(self._final_body(parsed, chat, created))

    def _abort(self, cores: list[tuple[EngineCore, SimRequest]]) -> None:
        for core, req in cores:
            if req.finish_reason is None:
                core.abort(req, self.mono_clock())

    def _usage(self, parsed: ParsedRequest, *, streamed: bool = False) -> dict[str, Any]:
        completion = sum(len(ch.req.output) for ch in parsed.choices)
        out: dict[str, Any] = {
            "prompt_tokens": parsed.prompt_tokens,
            "total_tokens": parsed.prompt_tokens + completion,
            "completion_tokens": completion,
        }
        if not streamed:
            out["prompt_tokens_details"] = None
            out["completion_tokens_details"] = None
        return out

    @property
    def system_fingerprint(self) -> str:
        """``vllm-<version>-<8 hex>``, as vLLM stamps replies."""
        return f"vllm-{self.config.vllm_version}-{self._fingerprint}"

    def _spec_metrics(self, parsed: ParsedRequest, *, streamed: bool) -> dict[str, Any] | None:
        """The per-request speculative metrics, as vLLM 0.32 reports them: only for a single
        choice that the engine finished (a stop string is seen by the frontend, after the
        engine's last report: vLLM sends ``null`` there, and for ``n > 1`` or a batch)."""
        mode = self.config.per_request_spec_decode_metrics
        if mode not in ("summary", "detailed") or not self.config.speculative:
            return None
        if len(parsed.choices) != 1:
            return None
        req = parsed.choices[0].req
        if req.stop_reason is not None:
            return None
        spec = req.spec.as_dict(
            self.config.num_speculative_tokens, detailed=mode == "detailed", streamed=streamed
        )
        return metrics_object(spec, streamed=streamed)

    def _logprobs(
        self, parsed: ParsedRequest, ch: Choice, tokens: list[int], start: int, offset: int,
        chat: bool, *, with_prompt: bool = False,
    ) -> dict[str, Any] | None:  # fmt: skip
        if parsed.logprobs is None:
            return None
        pieces = self.lm.pieces
        if chat:
            return chat_logprobs(tokens, pieces, parsed.logprobs, start_position=start)
        prompt = ch.prompt_ids if with_prompt else ()
        return completion_logprobs(
            tokens, pieces, parsed.logprobs, start_position=start, text_offset=offset,
            prompt=prompt,
        )  # fmt: skip

    def _message(self, parsed: ParsedRequest, ch: Choice) -> tuple[dict[str, Any], str | None]:
        """A chat choice's message and finish reason (a tool call when one is asked for)."""
        req = ch.req
        message: dict[str, Any] = {
            "role": "assistant",
            "content": req.text,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "tool_calls": [],
            "reasoning": None,
        }
        finish = req.finish_reason
        if parsed.call_tool:
            tool = chosen_tool(parsed.tools, parsed.tool_choice)
            message["content"] = None
            message["tool_calls"] = [tool_call(tool, req.text)]
            finish = "stop" if isinstance(parsed.tool_choice, dict) else "tool_calls"
        else:
            del message["tool_calls"]
        return message, finish

    def _prompt_logprobs(self, parsed: ParsedRequest, ch: Choice) -> list[Any] | None:
        if parsed.prompt_logprobs is None:
            return None
        return prompt_logprobs(ch.prompt_ids, self.lm.pieces, parsed.prompt_logprobs)

    def _final_body(self, parsed: ParsedRequest, chat: bool, created: int) -> dict[str, Any]:
        choices: list[dict[str, Any]] = []
        for ch in parsed.choices:
            req = ch.req
            ids = list(req.output) if parsed.return_token_ids else None
            choice: dict[str, Any]
            if chat:
                message, finish = self._message(parsed, ch)
                choice = {
                    "index": ch.index,
                    "message": message,
                    "logprobs": self._logprobs(parsed, ch, req.output, 0, 0, chat),
                    "finish_reason": finish,
                    "stop_reason": req.stop_reason,
                    "token_ids": ids,
                    "routed_experts": None,
                }
            else:
                plp = self._prompt_logprobs(parsed, ch)
                if plp is None and parsed.echo and parsed.logprobs is not None:
                    plp = prompt_logprobs(ch.prompt_ids, self.lm.pieces, parsed.logprobs)
                choice = {
                    "index": ch.index,
                    "text": ch.echo_text + req.text,
                    "logprobs": self._logprobs(
                        parsed, ch, req.output, 0, 0, chat, with_prompt=parsed.echo
                    ),
                    "finish_reason": req.finish_reason,
                    "stop_reason": req.stop_reason,
                    "token_ids": ids,
                    "prompt_logprobs": plp,
                    "prompt_token_ids": ch.prompt_ids if parsed.return_token_ids else None,
                    "routed_experts": None,
                }
            choices.append(choice)
        body: dict[str, Any] = {
            "id": parsed.request_id,
            "object": "chat.completion" if chat else "text_completion",
            "created": created,
            "model": self.config.served_model_name,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": self.system_fingerprint,
            "usage": self._usage(parsed),
        }
        if chat:
            first = parsed.choices[0]
            body.update(
                prompt_logprobs=self._prompt_logprobs(parsed, first),
                prompt_token_ids=first.prompt_ids if parsed.return_token_ids else None,
                prompt_text=parsed.prompt_text,
            )
        body.update(kv_transfer_params=None, ec_transfer_params=None)
        body["metrics"] = self._spec_metrics(parsed, streamed=False)
        return body

    async def _stream(
        self,
        request: web.Request,
        parsed: ParsedRequest,
        cores: list[tuple[EngineCore, SimRequest]],
        queue: asyncio.Queue[tuple[Choice, RequestOutput]],
        chat: bool,
        created: int,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            status=200, headers={"Content-Type": "text/event-stream; charset=utf-8"}
        )
        obj = "chat.completion.chunk" if chat else "text_completion"
        name = self.config.served_model_name

        def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
            d: dict[str, Any] = {
                "id": parsed.request_id,
                "object": obj,
                "created": created,
                "model": name,
                "choices": choices,
            }
            if parsed.continuous_usage and choices:
                done = sum(sent.values())
                d["usage"] = {
                    "prompt_tokens": parsed.prompt_tokens,
                    "total_tokens": parsed.prompt_tokens + done,
                    "completion_tokens": done,
                }
                if chat:
                    d["usage"]["completion_tokens_details"] = None
            d.update(extra)
            return b"data: " + json.dumps(d, separators=(",", ":")).encode() + b"\n\n"

        sent = {ch.index: 0 for ch in parsed.choices}  # tokens streamed per choice
        offset = {ch.index: 0 for ch in parsed.choices}  # characters streamed per choice
        try:
            await resp.prepare(request)
            if chat:
                for ch in parsed.choices:
                    first = {
                        "index": ch.index,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                    await resp.write(chunk([first], prompt_token_ids=None, prompt_text=None))
            open_choices = len(parsed.choices)
            while open_choices:
                ch, out = await queue.get()
                if not out.text and out.finish_reason is None and parsed.logprobs is None:
                    continue
                if chat and parsed.call_tool and out.finish_reason is None:
                    continue  # the tool call goes out whole on the finishing chunk
                if not out.text and not out.token_ids and out.finish_reason is None:
                    continue
                i = ch.index
                c: dict[str, Any] = {"index": i}
                if chat and parsed.call_tool and out.finish_reason is not None:
                    message, finish = self._message(parsed, ch)
                    c["delta"] = {"tool_calls": [{"index": 0, **message["tool_calls"][0]}]}
                elif chat:
                    c["delta"] = {"content": out.text}
                else:
                    c["text"] = out.text
                lp_tokens = out.token_ids if parsed.logprobs is not None else []
                c["logprobs"] = self._logprobs(parsed, ch, lp_tokens, sent[i], offset[i], chat)
                sent[i] += len(out.token_ids)
                offset[i] += len(out.text)
                finish = out.finish_reason
                if chat and parsed.call_tool and finish is not None:
                    finish = "stop" if isinstance(parsed.tool_choice, dict) else "tool_calls"
                c["finish_reason"] = finish
                if out.finish_reason is not None or not chat:
                    # vLLM names the stop string on the finishing chunk only
                    c["stop_reason"] = ch.req.stop_reason if out.finish_reason else None
                if not chat:
                    c["prompt_token_ids"] = None
                c["token_ids"] = out.token_ids if parsed.return_token_ids else None
                extra: dict[str, Any] = {}
                if out.finish_reason is not None and not parsed.include_usage:
                    extra["system_fingerprint"] = self.system_fingerprint
                await resp.write(chunk([c], **extra))
                if out.finish_reason is not None:
                    open_choices -= 1
            if parsed.include_usage:
                extra = {
                    "usage": self._usage(parsed, streamed=True),
                    "system_fingerprint": self.system_fingerprint,
                }
                sm = self._spec_metrics(parsed, streamed=True)
                if sm is not None:
                    extra["metrics"] = sm
                await resp.write(chunk([], **extra))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            self._abort(cores)
            raise
        return resp
