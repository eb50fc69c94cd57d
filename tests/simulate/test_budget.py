"""Token-budget starvation emerges from the step walk (vllm-metrics.md §9), in simulated time."""

from __future__ import annotations

import pytest

from specwatch.simulate.config import Faults, SimConfig
from specwatch.simulate.engine_core import EngineCore, Simulation
from specwatch.vllm.budget import budget_limits, required_batched_tokens
from specwatch.vllm.methods import BudgetRegime


def _saturate(
    version: str, b: int, *, k: int = 5, method: str = "dspark", n_req: int = 200,
    steps: int = 150, faults: Faults | None = None,
) -> tuple[list[int], list[int], list[int], EngineCore]:  # fmt: skip
    cfg = SimConfig(method=method, num_speculative_tokens=k, max_num_batched_tokens=b,
                    max_num_seqs=128, vllm_version=version)  # fmt: skip
    sim = Simulation(cfg, faults=faults)
    for i in range(n_req):
        # max_tokens far beyond what 150 steps can emit: nobody finishes, load stays saturating
        sim.submit(f"user request number {i} asks about the weather", max_tokens=3000,
                   ignore_eos=True)  # fmt: skip
    core = sim.cores[0]
    running, waiting, drafts_per_step = [], [], []
    for _ in range(steps):
        d0 = core.truth.num_drafts
        sim.run_steps(1)
        running.append(len(core.running))
        waiting.append(len(core.waiting))
        drafts_per_step.append(core.truth.num_drafts - d0)
    return running, waiting, drafts_per_step, core


def test_dspark_v033_admission_cap_plateau_85() -> None:
    """Under v0.33 accounting a 512-token budget caps admission at 85 running requests, all
    verified in full."""
    # v0.33: S = 0, L = K + 1 = 6, admission cap B // L = 512 // 6 = 85; 85 * 6 = 510 <= 512
    running, waiting, dps, core = _saturate("0.33.0", 512)
    assert max(running) == 85
    assert running[50:] == [85] * 100
    assert min(waiting[50:]) == 200 - 85
    assert dps[50:] == [85] * 100  # every running request verified in full each step
    assert core.truth.num_draft_tokens == 5 * core.truth.num_drafts


def test_dspark_v032_walk_plateau_51() -> None:
    """Under v0.32 accounting the budget walk plateaus at 51 running requests."""
    # v0.32: no cap, S = K - 1 = 4: each decode costs 6 + 4 = 10 of B; 51 * 10 = 510, then
    # input_budget 2 <= S stops the walk and leaves nothing to admit a waiting request
    running, waiting, dps, _ = _saturate("0.32.0", 512)
    assert max(running) == 51
    assert running[50:] == [51] * 100
    assert min(waiting[50:]) == 200 - 51
    assert dps[50:] == [51] * 100


def test_plateaus_match_the_closed_form() -> None:
    """The simulated plateaus equal decode_full_per_step from the closed-form budget limits."""
    for version, regime in (("0.33.0", BudgetRegime.V0_33), ("0.32.0", BudgetRegime.V0_32)):
        running, _, _, _ = _saturate(version, 512, steps=80)
        lim = budget_limits(max_num_batched_tokens=512, max_num_seqs=128,
                            num_speculative_tokens=5, method="dspark", regime=regime)  # fmt: skip
        assert running[-1] == lim.decode_full_per_step


def test_big_budget_reaches_max_num_seqs() -> None:
    """A large token budget lets running reach max_num_seqs."""
    running, waiting, dps, _ = _saturate("0.33.0", 8192, steps=60)
    assert max(running) == 128
    assert running[-1] == 128
    assert waiting[-1] == 200 - 128
    assert dps[-1] == 128


def test_static_reservation_truncates_the_tail() -> None:
    """v0.25's static reservation admits one extra request whose drafts are truncated."""
    # v0.25: T = B - S_old * N = 1024 - 4 * 128 = 512; 85 full decodes (510) and the 86th gets
    # the 2 tokens left: one draft instead of five (truncation shows as mean draft length < K)
    running, _, dps, core = _saturate("0.25.0", 1024)
    assert running[-1] == 86
    assert dps[-1] == 86
    t = core.truth
    steps_tail = 100
    assert t.num_draft_tokens < 5 * t.num_drafts
    assert t.num_draft_tokens >= 5 * t.num_drafts - 4 * (steps_tail + 50)


def test_fault_shrinks_the_budget_and_truncates_drafts() -> None:
    """A budget fault cuts the decodes per step and truncates the last request's drafts."""
    faults = Faults()
    _running, _, dps, core = _saturate("0.33.0", 8192, steps=40, faults=faults)
    assert dps[-1] == 128
    faults.max_num_batched_tokens = 256
    d0, t0 = core.truth.num_drafts, core.truth.num_draft_tokens
    for _ in range(10):
        core.step(0.0)
    drafts = core.truth.num_drafts - d0
    tokens = core.truth.num_draft_tokens - t0
    # 256 // 6 = 42 full decodes (252 tokens) + one with 4 tokens left: 3 drafts
    assert drafts == 43 * 10
    assert tokens == (42 * 5 + 3) * 10
    assert len(core.running) == 128  # still RUNNING though most got no tokens


def test_fault_switches_to_old_accounting() -> None:
    """A vLLM-version fault switches the engine to the old budget accounting at the next step."""
    faults = Faults()
    running, _, _, core = _saturate("0.33.0", 512, steps=30, faults=faults)
    assert running[-1] == 85
    faults.vllm_version = "0.32.0"
    d0 = core.truth.num_drafts
    core.step(0.0)
    assert core.truth.num_drafts - d0 == 51


def test_stalled_admission_keeps_requests_waiting() -> None:
    """A stalled admission keeps every request waiting until it is lifted."""
    faults = Faults(stall_admission=True)
    sim = Simulation(SimConfig(), faults=faults)
    for i in range(10):
        sim.submit(f"request {i}", max_tokens=20)
    sim.run_until(5.0)
    core = sim.cores[0]
    assert len(core.running) == 0
    assert len(core.waiting) == 10
    faults.stall_admission = False
    sim.run_until(60.0)
    assert len(core.waiting) == 0
    assert core.truth.finished.get("length", 0) + core.truth.finished.get("stop", 0) == 10


def test_chunked_prefill_splits_a_long_prompt() -> None:
    """A prompt longer than the budget is prefilled in chunks, emitting its first token at the
    last chunk."""
    cfg = SimConfig(max_num_batched_tokens=64, max_num_seqs=8)
    sim = Simulation(cfg)
    long_prompt = " ".join(f"w{i}" for i in range(199))  # 200 tokens with BOS
    req = sim.submit(long_prompt, max_tokens=5)
    sim.cores[0]
    computed = []
    for _ in range(4):
        sim.run_steps(1)
        computed.append(req.num_computed)
    assert computed == [64, 128, 192, 200]
    assert len(req.output) == 1  # the step that finished the prefill emitted the first token


def test_data_parallel_engines_share_load() -> None:
    """Data-parallel engines share requests evenly and all draft."""
    cfg = SimConfig(data_parallel_size=3)
    sim = Simulation(cfg)
    for i in range(30):
        sim.submit(f"dp request {i}", max_tokens=30)
    sim.run_until(1e6)
    per_engine = [sum(c.truth.finished.values()) for c in sim.cores]
    assert per_engine == [10, 10, 10]
    assert all(c.truth.num_drafts > 0 for c in sim.cores)


def test_kv_pressure_preempts_and_recomputes_without_changing_outputs() -> None:
    """KV pressure preempts and recomputes requests without changing their outputs, and counts
    preemptions."""
    from specwatch.simulate.metrics import SimMetrics

    def run(blocks: int) -> tuple[list[list[int]], Simulation, SimMetrics]:
        cfg = SimConfig(max_model_len=256, num_gpu_blocks=blocks, block_size=16)
        m = SimMetrics(cfg)
        sim = Simulation(cfg, sink=m)
        reqs = [sim.submit(f"kv pressure request {i}", max_tokens=100, ignore_eos=True,
                           seed=i, temperature=0.0) for i in range(20)]  # fmt: skip
        kv_seen: list[float] = []
        sim.run_until(1e9, on_step=lambda s: kv_seen.append(s.cores[0].kv_usage()))
        assert max(kv_seen) <= 1.0
        assert all(len(r.output) == 100 for r in reqs)
        return [r.output for r in reqs], sim, m

    roomy, sim_roomy, _ = run(16384)
    tight, sim_tight, m = run(40)  # 39 usable blocks of 16 tokens; a request needs up to 8
    truth = sim_tight.cores[0].truth
    assert sim_roomy.cores[0].truth.preemptions == 0
    assert truth.preemptions > 0
    assert (
        m.registry.get_sample_value(
            "vllm:num_preemptions_total", {"model_name": "sim-model", "engine": "0"}
        )
        == truth.preemptions
    )
    # greedy: a preempted request recomputes its context and continues token for token
    assert tight == roomy
    assert sum(truth.accepted_per_pos) == truth.num_accepted_tokens


def test_required_batched_tokens_is_n_times_one_plus_k_plus_s() -> None:
    """mtp K=7 (S=0), N=1024: 1024·(1+7+0) = 8192; eagle3 parallel K=3 (S=2), N=16: 16·6 = 96."""
    assert required_batched_tokens(1024, 7, 0) == 8192
    assert required_batched_tokens(16, 3, 2) == 96
    with pytest.raises(ValueError, match=">= 0"):
        required_batched_tokens(-1, 3, 0)


def test_budget_limits_slots_per_request_uses_the_same_rule() -> None:
    """budget_limits' per-request slots equal required_batched_tokens(1, K, S): dspark v0.32,
    K=5 has S = K-1 = 4, so 1+5+4 = 10 slots and D_full = 512 // 10 = 51."""
    lim = budget_limits(
        max_num_batched_tokens=512,
        max_num_seqs=128,
        num_speculative_tokens=5,
        method="dspark",
        regime=BudgetRegime.V0_32,
    )
    assert lim.slots_per_request == required_batched_tokens(1, 5, 4) == 10
    assert lim.decode_full_per_step == 51
