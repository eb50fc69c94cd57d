"""vLLM's engine step loop: the step-filling walk, admission, chunked prefill and a step-time model.

The walk follows ``vllm/v1/core/sched/scheduler.py:700-1080`` (v0.33.0), see
``vllm-metrics.md`` §9: two budgets, ``token_budget = T`` and ``input_budget = B``; RUNNING
requests are walked in order, each asking ``1 + K_pending`` (decode) or its remaining prompt
(prefill), clipped to ``min(want, token_budget, input_budget - S)``; scheduling subtracts n from
token_budget and ``n + S`` from input_budget; the walk stops when ``token_budget == 0`` or
``input_budget <= S``; a clipped decode has its drafts truncated. WAITING requests are admitted
while ``len(running) < A_eff`` and budget is left, A_eff being ``min(N, B // L)`` for
dflash/dspark under v0.33. v0.32 uses its own S table and no cap; v0.20-v0.25 reserve
``S_old * N`` statically (T = B - S_old*N) and walk one budget. The plateaus of
``num_requests_running`` *emerge* from this walk; nothing here uses the closed-form limits.

:class:`EngineCore` is synchronous and clock-free: ``step(now)`` is given the time. Drive it with
:class:`Simulation` (simulated time, for tests) or the server's real-time loop.
"""

from __future__ import annotations

import collections
import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from specwatch.simulate.config import Faults, Role, SimConfig
from specwatch.simulate.lm import (
    EOS,
    DraftSampleMethod,
    FlyParams,
    LMConfig,
    SeqTable,
    SyntheticLM,
    commit_state,
    verify,
)
from specwatch.simulate.quiz import params_for_prompt
from specwatch.vllm.methods import (
    ADMISSION_CAPPED_METHODS,
    BudgetRegime,
    method_slots,
    regime_for_version,
    static_reservation_slots,
)
from specwatch.vllm.request_metrics import spec_decode_object


@dataclass(slots=True)
class SpecStats:
    """One request's verify steps, for vLLM's per-request metrics
    (:mod:`specwatch.vllm.request_metrics`): ``per_step_accepted[i]`` of ``per_step_drafted[i]``
    draft tokens accepted at step ``i``."""

    per_step_accepted: list[int] = field(default_factory=list)
    per_step_drafted: list[int] = field(default_factory=list)

    def add_step(self, drafted: int, accepted: int) -> None:
        """Record one verify step."""
        self.per_step_drafted.append(drafted)
        self.per_step_accepted.append(accepted)

    def as_dict(self, num_spec_tokens: int, *, detailed: bool, streamed: bool) -> dict[str, Any]:
        """vLLM's ``metrics.speculative_decoding`` object for this request."""
        return spec_decode_object(
            num_spec_tokens=num_spec_tokens,
            per_step_accepted=self.per_step_accepted,
            per_step_drafted=self.per_step_drafted,
            detailed=detailed,
            streamed=streamed,
        )


@dataclass(slots=True)
class RequestOutput:
    """One output event: the new tokens and text of a step, and the finish reason if done."""

    token_ids: list[int]
    text: str
    finish_reason: str | None
    time: float


def _unit(key: str) -> float:
    """A uniform number in [0, 1) from ``key`` (the same request always draws the same)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") / 2**64


@dataclass(eq=False, slots=True)
class SimRequest:
    """A request inside one engine. Times are in the driver's clock (seconds)."""

    request_id: str
    prompt: str
    prompt_len: int
    max_tokens: int
    arrival: float
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    max_tokens_set: bool = True
    include_stop_str: bool = False
    listener: Callable[[RequestOutput], None] | None = None
    # state
    row: int = -1
    num_computed: int = 0
    prefill_target: int = 0
    blocks: int = 0
    num_preemptions: int = 0
    prompt_counted: bool = False
    output: list[int] = field(default_factory=list)
    text: str = ""
    pending_drafts: int = 0
    finish_reason: str | None = None
    #: the stop string that ended the request (vLLM's ``stop_reason``), else ``None``
    stop_reason: str | None = None
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    finished_at: float | None = None
    spec: SpecStats = field(default_factory=SpecStats)
    engine: int = 0

    @property
    def prefilling(self) -> bool:
        """True until the prompt (plus, after a preemption, the output so far) is computed."""
        return self.num_computed < self.prefill_target


@dataclass(slots=True)
class StepStats:
    """What one engine step did (fed to the metrics sink and the ground truth)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    waived: int = 0
    generation_tokens: int = 0
    cut_tokens: int = 0
    prompt_tokens: int = 0
    computed_prompt_tokens: int = 0
    scheduled_tokens: int = 0
    batch_rows: int = 0
    num_scheduled: int = 0
    preemptions: int = 0
    duration: float = 0.0


@dataclass(slots=True)
class GroundTruth:
    """Cumulative counters of one engine since start or the last restart (the simulator's truth).

    ``cut_tokens``: tokens a request's last step produced past its stop (EOS, max_tokens) and
    dropped; vLLM counts them as accepted but not as generated, so with every decode step
    drafting, generation_tokens + cut_tokens = first tokens + num_drafts + num_accepted_tokens.
    """

    steps: int = 0
    preemptions: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    fly_waivers: int = 0
    generation_tokens: int = 0
    cut_tokens: int = 0
    prompt_tokens: int = 0
    finished: dict[str, int] = field(default_factory=dict)
    max_running_seen: int = 0

    def add(self, s: StepStats) -> None:
        self.steps += 1
        self.preemptions += s.preemptions
        self.num_drafts += s.num_drafts
        self.num_draft_tokens += s.num_draft_tokens
        self.num_accepted_tokens += s.num_accepted_tokens
        for i, c in enumerate(s.accepted_per_pos):
            self.accepted_per_pos[i] += c
        self.fly_waivers += s.waived
        self.generation_tokens += s.generation_tokens
        self.cut_tokens += s.cut_tokens
        self.prompt_tokens += s.prompt_tokens

    def as_dict(self) -> dict[str, object]:
        return {
            "steps": self.steps,
            "preemptions": self.preemptions,
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "accepted_per_pos": list(self.accepted_per_pos),
            "fly_waivers": self.fly_waivers,
            "generation_tokens": self.generation_tokens,
            "cut_tokens": self.cut_tokens,
            "prompt_tokens": self.prompt_tokens,
            "finished": dict(self.finished),
            "max_running_seen": self.max_running_seen,
        }


class MetricsSink(Protocol):
    """Receives engine events (implemented by :class:`specwatch.simulate.metrics.SimMetrics`)."""

    def on_step(self, engine: int, stats: StepStats) -> None: ...

    def on_output(self, engine: int, req: SimRequest, now: float, first: bool) -> None: ...

    def on_finished(self, engine: int, req: SimRequest, now: float) -> None: ...

    def on_queue(self, engine: int, running: int, waiting: int, kv_usage: float) -> None: ...


def synthetic_lm(config: SimConfig) -> SyntheticLM:
    """The synthetic LM of a simulated server (shared by its engines), from its config."""
    return SyntheticLM(
        LMConfig(
            vocab_size=config.vocab_size,
            seed=config.seed,
            target_sharpness=config.target_sharpness,
            draft_noise=config.draft_noise,
        )
    )


def tokenize_len(prompt: str) -> int:
    """Prompt length in tokens of the synthetic tokenizer (one per whitespace word, plus BOS)."""
    return 1 + len(prompt.split())


def _prompt_tail_tokens(prompt: str, vocab_size: int) -> tuple[int, int]:
    words = prompt.split()[-2:]
    ids = [13 + (sum(w.encode()) * 131 + len(w)) % (vocab_size - 13) for w in words]
    while len(ids) < 2:
        ids.insert(0, 13)
    return ids[0], ids[1]


@dataclass(frozen=True, slots=True)
class StepResult:
    """End time, output events and stats of one step."""

    end: float
    outputs: list[tuple[SimRequest, RequestOutput]]
    stats: StepStats


@dataclass(frozen=True, slots=True)
class BudgetView:
    """Budget parameters in force for one step."""

    regime: BudgetRegime
    token_budget: int
    input_budget: float
    extra_slots: int
    admission_cap: int


class EngineCore:
    """One data-parallel engine: queues, the step walk, the LM and its counters."""

    def __init__(
        self,
        config: SimConfig,
        *,
        engine_index: int = 0,
        lm: SyntheticLM | None = None,
        faults: Faults | None = None,
        sink: MetricsSink | None = None,
    ) -> None:
        config.validate()
        self.config = config
        self.engine_index = engine_index
        self.lm = lm or synthetic_lm(config)
        self.faults = faults or Faults()
        self.sink = sink
        self.table = SeqTable()
        self.waiting: collections.deque[SimRequest] = collections.deque()
        self.running: list[SimRequest] = []
        self.truth = GroundTruth(accepted_per_pos=[0] * config.num_speculative_tokens)
        self._k = config.num_speculative_tokens if config.speculative else 0
        self._lookahead = (
            method_slots(config.method, config.num_speculative_tokens).lookahead_slots
            if self._k
            else 0
        )
        self._total_blocks = max(config.num_gpu_blocks - 1, 1)
        self.used_blocks = 0

    # -- queue --------------------------------------------------------------------------------
    def add_request(self, req: SimRequest) -> None:
        """Queue ``req`` (WAITING)."""
        req.engine = self.engine_index
        if req.prefill_target == 0:
            req.prefill_target = req.prompt_len
        self.waiting.append(req)

    def abort(self, req: SimRequest, now: float, reason: str = "abort") -> None:
        """Finish ``req`` early (client went away, or a stop string seen by the frontend)."""
        if req.finish_reason is not None:
            return
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.running:
            self.running.remove(req)
        self._finish(req, reason, now)

    def publish_queue(self) -> None:
        """Send the current running/waiting counts and KV usage to the sink (the
        ``vllm:num_requests_running``/``waiting`` gauges).

        Called after every scheduler pass, as vLLM logs its scheduler stats once per step
        (so a request that arrives during a step shows as waiting only if the next pass leaves
        it waiting), including a pass that schedules nothing, and by the server's step loop
        when it goes idle: with admission stalled and nothing running no step runs, and the
        gauges must still show the queue.
        """
        if self.sink is not None:
            self.sink.on_queue(
                self.engine_index, len(self.running), len(self.waiting), self.kv_usage()
            )

    def has_work(self) -> bool:
        return bool(self.running) or (bool(self.waiting) and not self.faults.stall_admission)

    def load(self) -> int:
        return len(self.running) + len(self.waiting)

    def reset_counters(self) -> None:
        """Restart: counters start again from zero (in-flight requests keep going)."""
        self.truth = GroundTruth(accepted_per_pos=[0] * self.config.num_speculative_tokens)

    # -- budgets ------------------------------------------------------------------------------
    def budget(self) -> BudgetView:
        """Budgets for the next step under the configured (or fault-overridden) rules."""
        c = self.config
        regime = regime_for_version(self.faults.vllm_version or c.vllm_version)
        b = self.faults.max_num_batched_tokens or c.max_num_batched_tokens
        t = c.max_num_scheduled_tokens or b
        if self.faults.max_num_batched_tokens is not None:
            t = min(t, b)
        n = c.max_num_seqs
        if not c.speculative:
            return BudgetView(regime, t, float(b), 0, n)
        k = c.num_speculative_tokens
        if regime is BudgetRegime.STATIC:
            s_old = static_reservation_slots(c.method, k)
            return BudgetView(regime, max(b - s_old * n, 1), math.inf, 0, n)
        slots = method_slots(c.method, k, regime=regime)
        cap = n
        if regime is BudgetRegime.V0_33 and c.method in ADMISSION_CAPPED_METHODS:
            cap = min(cap, b // max(slots.lookahead_slots, 1))
        return BudgetView(regime, t, float(b), slots.extra_batch_slots, cap)

    # -- the step -----------------------------------------------------------------------------
    def step(self, now: float, time_scale: float = 1.0) -> StepResult | None:
        """Run one engine step starting at ``now``; returns its end time
        (``now + duration * time_scale``) and output events, or None when nothing was scheduled."""
        bv = self.budget()
        s = bv.extra_slots
        token_budget = bv.token_budget
        input_budget = bv.input_budget
        stats = StepStats(accepted_per_pos=[0] * self.config.num_speculative_tokens)
        sched: list[tuple[SimRequest, int, int]] = []  # (req, num_new_tokens, num_drafts)
        for req in list(self.running):
            if token_budget <= 0 or input_budget <= s:
                break
            if req.blocks == 0:
                continue  # preempted earlier in this walk (a RUNNING request holds blocks)
            want = (
                req.prefill_target - req.num_computed if req.prefilling else 1 + req.pending_drafts
            )
            n_new = int(min(want, token_budget, input_budget - s))
            if n_new <= 0:
                break
            if not self._reserve(req, n_new, stats):
                continue  # preempted itself: no KV blocks left
            kd = 0 if req.prefilling else min(req.pending_drafts, n_new - 1)
            sched.append((req, n_new, kd))
            token_budget -= n_new
            input_budget -= n_new + s
        if not self.faults.stall_admission:
            while (
                self.waiting
                and len(self.running) < bv.admission_cap
                and token_budget > 0
                and input_budget > s
            ):
                req = self.waiting[0]
                want = req.prefill_target - req.num_computed
                n_new = int(min(want, token_budget, input_budget - s))
                if n_new < want and not self.config.enable_chunked_prefill:
                    break
                need = self._blocks_for(req, n_new)
                if need - req.blocks > self._total_blocks - self.used_blocks:
                    break  # no KV room to admit
                self.waiting.popleft()
                self._admit(req, now)
                self.used_blocks += need - req.blocks
                req.blocks = need
                sched.append((req, n_new, 0))
                token_budget -= n_new
                input_budget -= n_new + s
        if not sched:
            self.publish_queue()  # e.g. admission stalled: the queue is still what it is
            return None  # (validation guarantees a lone request fits, so no preemption is lost)
        emit: list[tuple[SimRequest, int]] = []
        for req, n_new, kd in sched:
            stats.scheduled_tokens += n_new
            stats.batch_rows += n_new + s
            if req.prefilling:
                req.num_computed += n_new
                stats.computed_prompt_tokens += n_new
                if not req.prefilling:
                    if not req.prompt_counted:
                        stats.prompt_tokens += req.prompt_len
                        req.prompt_counted = True
                    emit.append((req, 0))
            else:
                emit.append((req, kd))
        stats.num_scheduled = len(sched)
        duration = self.config.step_time.duration(stats.batch_rows, stats.num_scheduled)
        stats.duration = duration
        end = now + duration * time_scale
        outputs: list[tuple[SimRequest, RequestOutput]] = []
        if emit:
            outputs = self._run_model(emit, stats, end)
        self.truth.add(stats)
        self.truth.max_running_seen = max(self.truth.max_running_seen, len(self.running))
        if self.sink is not None:
            self.sink.on_step(self.engine_index, stats)
        self.publish_queue()
        return StepResult(end, outputs, stats)

    def kv_usage(self) -> float:
        """Fraction of KV blocks in use (vLLM ``kv_cache_usage_perc``: 1 - free/(blocks-1))."""
        return min(1.0, self.used_blocks / self._total_blocks)

    def _blocks_for(self, req: SimRequest, n_new: int) -> int:
        """KV blocks ``req`` holds once ``n_new`` more tokens plus L lookahead slots are
        allocated (``allocate_slots``)."""
        base = req.num_computed if req.prefilling else req.prompt_len + len(req.output)
        return -(-(base + n_new + self._lookahead) // self.config.block_size)

    def _reserve(self, req: SimRequest, n_new: int, stats: StepStats) -> bool:
        """Allocate KV blocks for ``req``, preempting from the tail of RUNNING when short
        (vLLM recompute preemption). False when ``req`` itself had to be preempted."""
        need = self._blocks_for(req, n_new)
        while need - req.blocks > self._total_blocks - self.used_blocks:
            victim = self.running[-1]
            self._preempt(victim, stats)
            if victim is req:
                return False
        self.used_blocks += need - req.blocks
        req.blocks = need
        return True

    def _preempt(self, req: SimRequest, stats: StepStats) -> None:
        self.running.remove(req)
        self.used_blocks -= req.blocks
        req.blocks = 0
        req.num_computed = 0
        req.prefill_target = req.prompt_len + len(req.output)
        req.num_preemptions += 1
        stats.preemptions += 1
        self.waiting.appendleft(req)

    def _admit(self, req: SimRequest, now: float) -> None:
        if req.row < 0:  # a preempted request keeps its model state
            params = params_for_prompt(req.prompt)
            rate = self.faults.wrong_answer_rate
            if rate > 0 and _unit(req.request_id) < rate:
                wrong = "".join(str((int(d) + 1) % 10) for d in params.gold)
                params = replace(params, gold=wrong)
            req.row = self.table.allocate(
                params,
                seed=req.seed,
                temperature=req.temperature,
                top_p=req.top_p,
                last_prompt_tokens=_prompt_tail_tokens(req.prompt, self.config.vocab_size),
            )
        if req.first_scheduled is None:
            req.first_scheduled = now
        self.running.append(req)

    def _draft_noise(self, n: int) -> np.ndarray:
        f = self.faults
        mult = f.draft_noise_multiplier
        if f.draft_noise_engine is not None and f.draft_noise_engine != self.engine_index:
            mult = 1.0
        return np.full(n, self.config.draft_noise * mult)

    def _fly(self) -> FlyParams | None:
        c = self.config
        if c.role is not Role.FLY:
            return None
        thr = self.faults.fly_entropy_threshold
        return FlyParams(
            window=c.fly_window,
            entropy_threshold=c.fly_entropy_threshold if thr is None else thr,
            top_k=c.fly_entropy_top_k,
        )

    def _run_model(
        self, emit: list[tuple[SimRequest, int]], stats: StepStats, end: float
    ) -> list[tuple[SimRequest, RequestOutput]]:
        rows = np.fromiter((r.row for r, _ in emit), np.int64, len(emit))
        kd = np.fromiter((k for _, k in emit), np.int64, len(emit))
        res = verify(
            self.lm,
            self.table,
            rows,
            kd,
            draft_noise=self._draft_noise(len(emit)),
            fly=self._fly(),
            draft_method=DraftSampleMethod(self.config.draft_sample_method),
        )
        commit_state(self.table, rows, res.final_state)
        drafted = kd > 0
        acc = res.accepted
        stats.num_drafts = int(drafted.sum())
        stats.num_draft_tokens = int(kd.sum())
        # counted before the max_tokens / EOS cut below, as vLLM's scheduler counts
        # len(sampled) - 1 before it trims the step's tokens at a stop; ``cut_tokens`` keeps
        # the trimmed ones, so generation + cut = first tokens + drafts + accepted
        stats.num_accepted_tokens = int(acc.sum())
        stats.waived = int(res.waived.sum())
        k = self.config.num_speculative_tokens
        if stats.num_drafts:
            counts = np.bincount(acc[drafted], minlength=k + 1)
            # per_pos[i] = number of drafts with accepted > i
            tail = np.cumsum(counts[::-1])[::-1]
            stats.accepted_per_pos = [int(x) for x in tail[1 : k + 1]]
        outputs: list[tuple[SimRequest, RequestOutput]] = []
        kd_list = kd.tolist()
        acc_list = acc.tolist()
        text_of = self.lm.pieces
        for i, (req, _) in enumerate(emit):
            toks = res.tokens[i]
            if kd_list[i] > 0:
                req.spec.add_step(kd_list[i], acc_list[i])
            finish: str | None = None
            room = req.max_tokens - len(req.output)
            if len(toks) >= room:
                toks = toks[:room]
                finish = "length"
            if not req.ignore_eos and EOS in toks:
                toks = toks[: toks.index(EOS) + 1]
                finish = "stop"
            req.output.extend(toks)
            stats.generation_tokens += len(toks)
            stats.cut_tokens += len(res.tokens[i]) - len(toks)
            prev_len = len(req.text)
            req.text += "".join(text_of[t] for t in toks)
            if req.stop:
                lo = max(0, prev_len - max(len(x) for x in req.stop))
                hits = [(p, x) for x in req.stop if (p := req.text.find(x, lo)) >= 0]
                if hits:
                    at, hit = min(hits)
                    req.text = req.text[: at + (len(hit) if req.include_stop_str else 0)]
                    req.stop_reason = hit
                    finish = "stop"
            delta = req.text[prev_len:] if len(req.text) > prev_len else ""
            first = req.first_token is None
            if first:
                req.first_token = end
            if self.sink is not None:
                self.sink.on_output(self.engine_index, req, end, first)
            req.last_token = end
            req.pending_drafts = self._k
            out = RequestOutput(list(toks), delta, finish, end)
            outputs.append((req, out))
            if finish is not None:
                self.running.remove(req)
                self._finish(req, finish, end, notify=False)
        return outputs

    def _finish(self, req: SimRequest, reason: str, now: float, notify: bool = True) -> None:
        req.finish_reason = reason
        req.finished_at = now
        self.used_blocks -= req.blocks
        req.blocks = 0
        if req.row >= 0:
            self.table.release(req.row)
            req.row = -1
        self.truth.finished[reason] = self.truth.finished.get(reason, 0) + 1
        if self.sink is not None:
            self.sink.on_finished(self.engine_index, req, now)
        if notify and req.listener is not None:
            req.listener(RequestOutput([], "", reason, now))


def dispatch(outputs: list[tuple[SimRequest, RequestOutput]]) -> None:
    """Hand each output event to its request's listener."""
    for req, out in outputs:
        if req.listener is not None:
            req.listener(out)


class Simulation:
    """Drive data-parallel :class:`EngineCore` s in simulated time (fast; for tests and benches).

    Each engine has its own clock; :meth:`run_until` repeatedly steps the engine whose clock is
    earliest, so engines overlap in time as they would on separate GPUs.
    """

    def __init__(
        self, config: SimConfig, *, sink: MetricsSink | None = None, faults: Faults | None = None
    ) -> None:
        self.config = config
        self.faults = faults or Faults()
        lm = synthetic_lm(config)
        self.cores = [
            EngineCore(config, engine_index=i, lm=lm, faults=self.faults, sink=sink)
            for i in range(config.data_parallel_size)
        ]
        self.clocks = [0.0] * len(self.cores)
        self.now = 0.0
        self._n = 0

    def submit(
        self,
        prompt: str,
        *,
        max_tokens: int = 64,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        ignore_eos: bool = False,
        stop: tuple[str, ...] = (),
        listener: Callable[[RequestOutput], None] | None = None,
    ) -> SimRequest:
        """Queue a request on the least-loaded engine at the current simulated time."""
        self._n += 1
        req = SimRequest(
            request_id=f"sim-{self._n}",
            prompt=prompt,
            prompt_len=tokenize_len(prompt),
            max_tokens=max_tokens,
            arrival=self.now,
            temperature=temperature,
            top_p=top_p,
            seed=self._n if seed is None else seed,
            ignore_eos=ignore_eos,
            stop=stop,
            listener=listener,
        )
        core = min(self.cores, key=lambda c: c.load())
        core.add_request(req)
        return req

    def step_once(self) -> bool:
        """Step the engine with work whose clock is earliest; False when no engine has work."""
        busy = [i for i, c in enumerate(self.cores) if c.has_work()]
        if not busy:
            return False
        i = min(busy, key=lambda j: self.clocks[j])
        start = max(self.clocks[i], self.now)
        res = self.cores[i].step(start)
        self.clocks[i] = res.end if res is not None else start + self.config.step_time.base_s
        self.now = max(self.now, min(self.clocks[j] for j in busy))
        if res is not None:
            dispatch(res.outputs)
        return True

    def run_until(self, t_end: float, on_step: Callable[[Simulation], None] | None = None) -> None:
        """Step engines in time order until the simulated time reaches ``t_end`` or no engine
        has work (then the time jumps to ``t_end``)."""
        while self.now < t_end:
            if not self.step_once():
                break
            if on_step is not None:
                on_step(self)
        if not any(c.has_work() for c in self.cores):
            self.now = max(self.now, t_end)
            self.clocks = [max(c, self.now) for c in self.clocks]

    def run_steps(self, n: int) -> None:
        """Run up to ``n`` engine steps."""
        for _ in range(n):
            if not self.step_once():
                return
