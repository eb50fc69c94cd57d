"""vLLM's HTTP surface over the simulated engines (aiohttp), in real time.

Routes: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (JSON or SSE
with ``data: [DONE]`` and a usage chunk when ``stream_options.include_usage``), ``GET /health``,
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
import math
import random
import time
import uuid
from typing import Any, cast

from aiohttp import web

from specwatch.core.clock import SYSTEM_MONOTONIC, MonotonicClock
from specwatch.core.logs import log_event
from specwatch.simulate import faults as faults_mod
from specwatch.simulate.config import Faults, Role, SimConfig
from specwatch.simulate.engine_core import (
    EngineCore,
    RequestOutput,
    SimRequest,
    dispatch,
    synthetic_lm,
    tokenize_len,
)
from specwatch.simulate.metrics import CONTENT_TYPE, SimMetrics
from specwatch.simulate.quiz import item_for_prompt
from specwatch.vllm.budget import budget_limits
from specwatch.vllm.request_metrics import metrics_object

log = logging.getLogger("specwatch.simulate")


#: vLLM's 400 for sampling parameters it cannot use with speculative decoding (vllm 0.32
#: ``SamplingParams._validate_spec_decode``).
SPEC_DECODE_UNSUPPORTED = (
    "The min_p and logit_bias sampling parameters are not yet supported with speculative decoding."
)
SAMPLING_EPS = 1e-5


class APIError(Exception):
    """An error answered with vLLM's error body."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


_ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    500: "InternalServerError",
    # vLLM's GracefulHTTPError (admission control) uses the status phrase as the type
    503: "Service Unavailable",
}
#: vLLM 0.33's messages (``vllm/exceptions.py`` ``QueueOverflowError``, ``MaxQueuedTokensError``).
ADMISSION_MESSAGES = {
    "max_num_queued_reqs": "The engine is currently busy and cannot accept new requests. "
    "Please try again later or on a different instance.",
    "max_num_queued_tokens": "The engine has reached its prefill token backlog limit. "
    "Please try again later or on a different instance.",
}


def error_response(status: int, message: str, param: str | None = None) -> web.Response:
    """vLLM's error body: ``{"error": {"message", "type", "param", "code"}}``."""
    body = {
        "error": {
            "message": message,
            "type": _ERROR_TYPES.get(status, "BadRequestError"),
            "param": param,
            "code": status,
        }
    }
    return web.json_response(body, status=status)


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
        app = web.Application(client_max_size=4 * 1024 * 1024)
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
        return web.json_response({"version": self.config.vllm_version})

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
            "permission": [],
        }
        return web.json_response({"object": "list", "data": [card]})

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
        return web.json_response(self.faults.as_dict())

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
        return web.json_response(self.faults.as_dict())

    async def h_faults_delete(self, _r: web.Request) -> web.Response:
        faults_mod.clear(self.faults)
        for w in self._wake:
            w.set()
        return web.json_response(self.faults.as_dict())

    async def h_restart(self, _r: web.Request) -> web.Response:
        self.restart()
        return web.json_response({"restarts": self.restarts})

    async def h_stats(self, _r: web.Request) -> web.Response:
        return web.json_response(self.stats())

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

    def _parse(self, body: Any, chat: bool) -> tuple[SimRequest, dict[str, Any]]:
        c = self.config
        if not isinstance(body, dict):
            raise APIError(400, "request body must be a JSON object")
        model = body.get("model", c.served_model_name)
        if model != c.served_model_name:
            raise APIError(404, f"The model `{model}` does not exist.", "model")
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                raise APIError(400, "messages must be a non-empty list", "messages")
            parts: list[str] = []
            key = ""
            for m in msgs:
                if not isinstance(m, dict) or not isinstance(m.get("content", ""), str):
                    raise APIError(400, "each message needs a string content", "messages")
                parts.append(f"{m.get('role', 'user')}: {m.get('content', '')}")
                if m.get("role", "user") == "user":
                    key = str(m.get("content", ""))
            prompt = key if item_for_prompt(key) is not None else "\n".join(parts)
            prompt_len = tokenize_len("\n".join(parts)) + 4
        else:
            p = body.get("prompt")
            if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):
                p = p[0]
            if isinstance(p, list) and p and all(isinstance(t, int) for t in p):
                prompt, prompt_len = " ".join(str(t) for t in p), len(p)
            elif isinstance(p, str):
                prompt, prompt_len = p, tokenize_len(p)
            else:
                raise APIError(400, "prompt must be a string or a list of token ids", "prompt")
        n = body.get("n", 1)
        if n != 1:
            raise APIError(400, "only n=1 is supported by the simulator", "n")
        temperature = body.get("temperature", 1.0)
        top_p = body.get("top_p", 1.0)
        if temperature is None:
            temperature = 1.0
        if top_p is None:
            top_p = 1.0
        if (
            isinstance(temperature, bool)
            or not isinstance(temperature, int | float)
            or not math.isfinite(temperature)
            or temperature < 0
        ):
            raise APIError(400, "temperature must be a number >= 0", "temperature")
        if isinstance(top_p, bool) or not isinstance(top_p, int | float) or not 0 < top_p <= 1:
            raise APIError(400, "top_p must be in (0, 1]", "top_p")
        min_p = body.get("min_p", 0.0)
        if isinstance(min_p, bool) or not isinstance(min_p, int | float) or not 0 <= min_p <= 1:
            raise APIError(400, "min_p must be in [0, 1]", "min_p")
        sampled = isinstance(temperature, int | float) and temperature >= SAMPLING_EPS
        if self.config.speculative and (
            (sampled and min_p > SAMPLING_EPS) or body.get("logit_bias")
        ):
            # vLLM SamplingParams._validate_spec_decode; a greedy request has min_p reset to 0
            # first (SamplingParams.__post_init__), so greedy + min_p is accepted
            raise APIError(400, SPEC_DECODE_UNSUPPORTED)
        mt_key = (
            "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens"
        )
        max_tokens = body.get(mt_key)
        max_set = max_tokens is not None
        if max_tokens is None:
            max_tokens = 16 if not chat else c.max_model_len - prompt_len
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise APIError(400, "max_tokens must be an integer >= 1", mt_key)
        if prompt_len + max_tokens > c.max_model_len:
            raise APIError(
                400,
                f"This model's maximum context length is {c.max_model_len} tokens. However, you "
                f"requested {prompt_len + max_tokens} tokens ({prompt_len} in the messages, "
                f"{max_tokens} in the completion). Please reduce the length of the messages or "
                "completion.",
                mt_key,
            )
        stop = body.get("stop") or []
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
            raise APIError(400, "stop must be a string or a list of strings", "stop")
        seed = body.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise APIError(400, "seed must be an integer", "seed")
        if seed is None:
            seed = self.rng.getrandbits(63)
        ignore_eos = bool(body.get("ignore_eos", False))
        req = SimRequest(
            request_id=("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex,
            prompt=prompt,
            prompt_len=prompt_len,
            max_tokens=int(max_tokens),
            arrival=self.mono_clock(),
            temperature=float(temperature),
            top_p=float(top_p),
            seed=int(seed),
            ignore_eos=ignore_eos,
            stop=tuple(stop),
            max_tokens_set=max_set,
        )
        opts = {
            "stream": bool(body.get("stream", False)),
            "include_usage": bool((body.get("stream_options") or {}).get("include_usage", False)),
            "spec_metrics": c.per_request_spec_decode_metrics,
            "return_token_ids": bool(body.get("return_token_ids", False)),
        }
        return req, opts

    async def _generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return error_response(400, "request body is not valid JSON")
        try:
            req, opts = self._parse(body, chat)
        except APIError as exc:
            return error_response(exc.status, exc.message, exc.param)
        rejected = self.admission_rejection()
        if rejected is not None:
            self.metrics.on_admission_rejected(rejected)
            return error_response(503, ADMISSION_MESSAGES[rejected])
        f = self.faults
        if f.completion_delay_s > 0:
            await asyncio.sleep(f.completion_delay_s)
        if f.completion_error_rate > 0 and self.rng.random() < f.completion_error_rate:
            return error_response(500, "simulated engine failure (fault injection)")
        queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        req.listener = queue.put_nowait
        core = self.submit(req)
        created = int(time.time())
        if opts["stream"]:
            return await self._stream(request, req, core, queue, opts, chat, created)
        try:
            while True:
                out = await queue.get()
                if out.finish_reason is not None:
                    break
        except asyncio.CancelledError:
            core.abort(req, self.mono_clock())
            raise
        return web.json_response(self._final_body(req, opts, chat, created))

    def _usage(self, req: SimRequest, *, streamed: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "prompt_tokens": req.prompt_len,
            "total_tokens": req.prompt_len + len(req.output),
            "completion_tokens": len(req.output),
        }
        if not streamed:
            out["prompt_tokens_details"] = None
            out["completion_tokens_details"] = None
        return out

    @property
    def system_fingerprint(self) -> str:
        """``vllm-<version>-<8 hex>``, as vLLM stamps replies."""
        return f"vllm-{self.config.vllm_version}-{self._fingerprint}"

    def _spec_metrics(
        self, req: SimRequest, opts: dict[str, Any], *, streamed: bool
    ) -> dict[str, Any] | None:
        mode = opts["spec_metrics"]
        if mode not in ("summary", "detailed") or not self.config.speculative:
            return None
        spec = req.spec.as_dict(
            self.config.num_speculative_tokens, detailed=mode == "detailed", streamed=streamed
        )
        return metrics_object(spec, streamed=streamed)

    def _final_body(
        self, req: SimRequest, opts: dict[str, Any], chat: bool, created: int
    ) -> dict[str, Any]:
        choice: dict[str, Any]
        ids = list(req.output) if opts["return_token_ids"] else None
        if chat:
            choice = {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": req.text,
                    "refusal": None,
                    "annotations": None,
                    "audio": None,
                    "function_call": None,
                    "reasoning": None,
                },
                "logprobs": None,
                "finish_reason": req.finish_reason,
                "stop_reason": None,
                "token_ids": ids,
                "routed_experts": None,
            }
        else:
            choice = {
                "index": 0,
                "text": req.text,
                "logprobs": None,
                "finish_reason": req.finish_reason,
                "stop_reason": None,
                "token_ids": ids,
                "prompt_logprobs": None,
                "prompt_token_ids": None,
                "routed_experts": None,
            }
        body: dict[str, Any] = {
            "id": req.request_id,
            "object": "chat.completion" if chat else "text_completion",
            "created": created,
            "model": self.config.served_model_name,
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": self.system_fingerprint,
            "usage": self._usage(req),
        }
        if chat:
            body.update(prompt_logprobs=None, prompt_token_ids=None, prompt_text=None)
        body.update(kv_transfer_params=None, ec_transfer_params=None)
        body["metrics"] = self._spec_metrics(req, opts, streamed=False)
        return body

    async def _stream(
        self,
        request: web.Request,
        req: SimRequest,
        core: EngineCore,
        queue: asyncio.Queue[RequestOutput],
        opts: dict[str, Any],
        chat: bool,
        created: int,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        obj = "chat.completion.chunk" if chat else "text_completion"
        name = self.config.served_model_name

        def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
            d: dict[str, Any] = {
                "id": req.request_id,
                "object": obj,
                "created": created,
                "model": name,
                "choices": choices,
            }
            d.update(extra)
            return b"data: " + json.dumps(d, separators=(",", ":")).encode() + b"\n\n"

        try:
            await resp.prepare(request)
            if chat:
                first = {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
                await resp.write(chunk([first], prompt_token_ids=None, prompt_text=None))
            while True:
                out = await queue.get()
                if not out.text and out.finish_reason is None:
                    continue
                c: dict[str, Any] = {"index": 0}
                if chat:
                    c["delta"] = {"content": out.text}
                else:
                    c["text"] = out.text
                c["logprobs"] = None
                c["finish_reason"] = out.finish_reason
                if out.finish_reason is not None or not chat:
                    c["stop_reason"] = None
                if not chat:
                    c["prompt_token_ids"] = None
                c["token_ids"] = out.token_ids if opts["return_token_ids"] else None
                extra: dict[str, Any] = {}
                if out.finish_reason is not None and not opts["include_usage"]:
                    extra["system_fingerprint"] = self.system_fingerprint
                await resp.write(chunk([c], **extra))
                if out.finish_reason is not None:
                    break
            if opts["include_usage"]:
                extra = {
                    "usage": self._usage(req, streamed=True),
                    "system_fingerprint": self.system_fingerprint,
                }
                sm = self._spec_metrics(req, opts, streamed=True)
                if sm is not None:
                    extra["metrics"] = sm
                await resp.write(chunk([], **extra))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            core.abort(req, self.mono_clock())
            raise
        return resp
