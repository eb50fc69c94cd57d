"""The simulator's /metrics: vLLM 0.33 names, types, labels, buckets and counter identities."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from specwatch.simulate.config import Role, SimConfig
from specwatch.simulate.engine_core import SimRequest, Simulation
from specwatch.simulate.metrics import SimMetrics, request_tokens_buckets

TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20,
        40, 80, 160, 640, 2560]  # fmt: skip
ITL = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40,
       80]  # fmt: skip
ITER = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]


def _run(cfg: SimConfig, n: int = 40) -> tuple[SimMetrics, Simulation, list[SimRequest]]:
    m = SimMetrics(cfg)
    sim = Simulation(cfg, sink=m)
    reqs = [sim.submit(f"metrics request {i}", max_tokens=60, temperature=1.0, seed=i)
            for i in range(n)]  # fmt: skip
    sim.run_until(1e6)
    return m, sim, reqs


def _families(text: str) -> dict[str, tuple[str, list[Sample]]]:
    return {f.name: (f.type, list(f.samples)) for f in text_string_to_metric_families(text)}


def _value(samples: list[Sample], name: str, **labels: str) -> float:
    hits = [s.value for s in samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]  # fmt: skip
    assert len(hits) == 1, (name, labels, hits)
    return float(hits[0])


def test_names_types_labels_and_buckets() -> None:
    """The simulator exports vLLM's metric names, types, labels and buckets."""
    cfg = SimConfig(role=Role.FLY, data_parallel_size=2, num_speculative_tokens=4,
                    served_model_name="m1")  # fmt: skip
    m, _, _ = _run(cfg)
    fams = _families(m.exposition().decode())
    expected_types = {
        "vllm:spec_decode_num_drafts": "counter",
        "vllm:spec_decode_num_draft_tokens": "counter",
        "vllm:spec_decode_num_accepted_tokens": "counter",
        "vllm:spec_decode_num_accepted_tokens_per_pos": "counter",
        "vllm:num_requests_running": "gauge",
        "vllm:num_requests_waiting": "gauge",
        "vllm:num_requests_waiting_by_reason": "gauge",
        "vllm:kv_cache_usage_perc": "gauge",
        "vllm:generation_tokens": "counter",
        "vllm:prompt_tokens": "counter",
        "vllm:request_success": "counter",
        "vllm:iteration_tokens_total": "histogram",
        "vllm:time_to_first_token_seconds": "histogram",
        "vllm:inter_token_latency_seconds": "histogram",
        "vllm:e2e_request_latency_seconds": "histogram",
        "vllm:cache_config_info": "gauge",
    }
    for name, typ in expected_types.items():
        assert fams[name][0] == typ, name
    drafts = fams["vllm:spec_decode_num_drafts"][1]
    assert {s.name for s in drafts} == {"vllm:spec_decode_num_drafts_total"}
    # prometheus_client exposes `_created` as its own gauge family, as vLLM's pages show
    created = fams["vllm:spec_decode_num_drafts_created"]
    assert created[0] == "gauge"
    assert all(s.value > 1.6e9 for s in created[1])
    assert {s.labels["engine"] for s in drafts} == {"0", "1"}
    assert {s.labels["model_name"] for s in drafts} == {"m1"}
    per_pos = fams["vllm:spec_decode_num_accepted_tokens_per_pos"][1]
    positions = {s.labels["position"] for s in per_pos if s.name.endswith("_total")}
    assert positions == {"0", "1", "2", "3"}
    reasons = {s.labels["finished_reason"] for s in fams["vllm:request_success"][1]}
    assert reasons == {"stop", "length", "abort", "error", "repetition"}
    assert {s.labels["reason"] for s in fams["vllm:num_requests_waiting_by_reason"][1]} == {
        "capacity", "deferred"}  # fmt: skip
    assert all("model_name" not in s.labels for s in fams["vllm:cache_config_info"][1])

    def bounds(fam: str) -> list[float]:
        les = [s.labels["le"] for s in fams[fam][1]
               if s.name.endswith("_bucket") and s.labels["engine"] == "0"]  # fmt: skip
        assert les[-1] == "+Inf"
        return [float(x) for x in les[:-1]]

    assert bounds("vllm:time_to_first_token_seconds") == TTFT
    assert bounds("vllm:inter_token_latency_seconds") == ITL
    assert bounds("vllm:iteration_tokens_total") == ITER
    assert bounds("vllm:request_prompt_tokens") == list(request_tokens_buckets(4096))
    assert request_tokens_buckets(4096)[-3:] == (500.0, 1000.0, 2000.0)  # 5000 > 4096
    iter_names = {s.name for s in fams["vllm:iteration_tokens_total"][1]}
    assert "vllm:iteration_tokens_total_count" in iter_names
    assert fams["vllm:iteration_tokens_total_created"][0] == "gauge"


def test_counter_identities_match_ground_truth() -> None:
    """The exported spec-decode counters equal the ground truth per engine, with per-position
    counts summing to accepted."""
    cfg = SimConfig(role=Role.STANDARD, data_parallel_size=2, num_speculative_tokens=4)
    m, sim, reqs = _run(cfg)
    fams = _families(m.exposition().decode())
    acc_all = drafts_all = 0.0
    for core in sim.cores:
        e = str(core.engine_index)
        t = core.truth
        drafts = _value(fams["vllm:spec_decode_num_drafts"][1],
                        "vllm:spec_decode_num_drafts_total", engine=e)  # fmt: skip
        dtok = _value(fams["vllm:spec_decode_num_draft_tokens"][1],
                      "vllm:spec_decode_num_draft_tokens_total", engine=e)  # fmt: skip
        acc = _value(fams["vllm:spec_decode_num_accepted_tokens"][1],
                     "vllm:spec_decode_num_accepted_tokens_total", engine=e)  # fmt: skip
        per_pos = [
            _value(fams["vllm:spec_decode_num_accepted_tokens_per_pos"][1],
                   "vllm:spec_decode_num_accepted_tokens_per_pos_total", engine=e, position=str(i))
            for i in range(4)
        ]  # fmt: skip
        assert (drafts, dtok, acc) == (t.num_drafts, t.num_draft_tokens, t.num_accepted_tokens)
        assert sum(per_pos) == acc  # per-position counts sum to accepted
        assert per_pos == sorted(per_pos, reverse=True)  # p_i is non-increasing
        assert per_pos == t.accepted_per_pos
        # tau = 1 + accepted / drafts, and it equals 1 + sum of per-position rates
        tau = 1 + acc / drafts
        assert abs(tau - (1 + sum(p / drafts for p in per_pos))) < 1e-12
        assert 1.5 < tau < 4.0
        gen = _value(fams["vllm:generation_tokens"][1], "vllm:generation_tokens_total", engine=e)
        mine = [r for r in reqs if r.engine == core.engine_index]
        assert gen == sum(len(r.output) for r in mine) == t.generation_tokens
        # per-request spec metrics reconcile with the counters (vLLM acceptance_metrics.md)
        assert sum(len(r.spec.per_step_accepted) for r in mine) == drafts
        assert sum(sum(r.spec.per_step_accepted) for r in mine) == acc
        ok = _value(fams["vllm:request_success"][1], "vllm:request_success_total", engine=e,
                    finished_reason="length") + _value(
            fams["vllm:request_success"][1], "vllm:request_success_total", engine=e,
            finished_reason="stop")  # fmt: skip
        assert ok == len(mine)
        ttft_count = _value(fams["vllm:time_to_first_token_seconds"][1],
                            "vllm:time_to_first_token_seconds_count", engine=e)  # fmt: skip
        assert ttft_count == len(mine)
        acc_all += acc
        drafts_all += drafts
    assert drafts_all > 0
    assert acc_all > 0


def test_baseline_has_no_spec_decode_series() -> None:
    """A baseline server exports no spec_decode series and counts its generated tokens."""
    m, sim, reqs = _run(SimConfig(role=Role.BASELINE), n=5)
    fams = _families(m.exposition().decode())
    assert not any(name.startswith("vllm:spec_decode") for name in fams)
    assert sim.cores[0].truth.num_drafts == 0
    gen = _value(fams["vllm:generation_tokens"][1], "vllm:generation_tokens_total", engine="0")
    assert gen == sum(len(r.output) for r in reqs)


def test_reset_starts_counters_from_zero() -> None:
    """A metrics reset starts the counters from zero."""
    m, _, _ = _run(SimConfig(), n=5)
    before = _families(m.exposition().decode())
    assert _value(before["vllm:spec_decode_num_drafts"][1],
                  "vllm:spec_decode_num_drafts_total", engine="0") > 0  # fmt: skip
    m.reset()
    after = _families(m.exposition().decode())
    assert _value(after["vllm:spec_decode_num_drafts"][1],
                  "vllm:spec_decode_num_drafts_total", engine="0") == 0  # fmt: skip
