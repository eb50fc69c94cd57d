"""End to end against a real vLLM CPU server with ``draft_model`` speculative decoding.

Real input: specwatch's acceptance rate α and mean acceptance length τ over a window
of real traffic must equal the values computed independently from two raw ``/metrics``
captures of that server bracketing the same window. The independent side is the small
exact-name line reader below (not specwatch code), with vLLM's definitions
(vLLM ``SpecDecodingLogging``): α = Δaccepted_tokens / Δdraft_tokens,
τ = 1 + Δaccepted_tokens / Δdrafts, per-position acceptance = Δaccepted_per_pos[i] / Δdrafts.

Traffic mixes temperature 0 (the draft, a copy of the target, is always accepted) and
temperature 1 (mostly rejected), so α lies strictly between 0 and 1 and a wrong formula shows.
Values are compared to 1e-12 relative: both sides divide the same integer counts.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.fakes import REPO, free_port

from .servers import VllmServer

pytestmark = pytest.mark.real_vllm

REPO_ROOT = REPO
DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
MAX_TOKENS = 40
T = TypeVar("T")


# --- the independent side: an exact-name reader of the text exposition ----------------------


def _samples(body: str, name: str) -> Iterator[tuple[str, float]]:
    """(label text, value) of every sample line whose metric name is exactly ``name``."""
    for line in body.splitlines():
        if not line or line.startswith("#"):
            continue
        brace, space = line.find("{"), line.find(" ")
        if 0 <= brace < space:
            metric, labels, rest = (
                line[:brace],
                line[brace : line.rindex("}") + 1],
                line[line.rindex("}") + 1 :],
            )
        else:
            metric, labels, rest = line[:space], "", line[space:]
        if metric == name:
            yield labels, float(rest.split()[0])


def counter_total(body: str, name: str) -> float:
    """Sum of the counter ``name`` over all its series (engines); fails if it is absent."""
    values = [value for _, value in _samples(body, name)]
    assert values, f"{name} not found in the /metrics body"
    return sum(values)


def per_position_totals(body: str) -> list[float]:
    """Accepted tokens per draft position, summed over engines, in position order 0..K-1."""
    totals: dict[int, float] = {}
    for labels, value in _samples(body, ACCEPTED_PER_POS):
        match = re.search(r'position="(\d+)"', labels)
        assert match, f"no position label in {labels}"
        position = int(match.group(1))
        totals[position] = totals.get(position, 0.0) + value
    assert sorted(totals) == list(range(len(totals))), f"positions {sorted(totals)}"
    return [totals[i] for i in range(len(totals))]


@dataclass(frozen=True)
class SpecCounters:
    """The spec-decode counters of one capture, summed over engines."""

    drafts: float
    draft_tokens: float
    accepted: float
    accepted_per_pos: tuple[float, ...]

    @classmethod
    def of(cls, body: str) -> SpecCounters:
        return cls(
            drafts=counter_total(body, DRAFTS),
            draft_tokens=counter_total(body, DRAFT_TOKENS),
            accepted=counter_total(body, ACCEPTED),
            accepted_per_pos=tuple(per_position_totals(body)),
        )


@dataclass(frozen=True)
class Expected:
    """α, τ and per-position acceptance over the window between two captures."""

    acceptance_rate: float
    mean_acceptance_length: float
    mean_draft_length: float
    per_position_acceptance_rate: list[float]


def expected_between(body_a: str, body_b: str) -> Expected:
    """vLLM's definitions applied to the counter increases from capture A to capture B."""
    a, b = SpecCounters.of(body_a), SpecCounters.of(body_b)
    drafts = b.drafts - a.drafts
    draft_tokens = b.draft_tokens - a.draft_tokens
    accepted = b.accepted - a.accepted
    # Preconditions on the real server, so the comparison below can tell formulas apart.
    assert drafts > 0, "no drafts in the window: speculation did not run"
    assert 0 < accepted < draft_tokens, (
        f"accepted {accepted} of {draft_tokens} draft tokens: need a partial acceptance"
    )
    per_pos = [pb - pa for pa, pb in zip(a.accepted_per_pos, b.accepted_per_pos, strict=True)]
    return Expected(
        acceptance_rate=accepted / draft_tokens,
        mean_acceptance_length=1.0 + accepted / drafts,
        mean_draft_length=draft_tokens / drafts,
        per_position_acceptance_rate=[n / drafts for n in per_pos],
    )


def assert_matches(view: dict[str, Any], expected: Expected) -> None:
    """specwatch's server view (analyze JSON or snapshot window) equals the independent values."""
    assert view["acceptance_rate"] == pytest.approx(expected.acceptance_rate, rel=1e-12)
    assert view["mean_acceptance_length"] == pytest.approx(
        expected.mean_acceptance_length, rel=1e-12
    )
    assert view["mean_draft_length"] == pytest.approx(expected.mean_draft_length, rel=1e-12)
    assert view["per_position_acceptance_rate"] == pytest.approx(
        expected.per_position_acceptance_rate, rel=1e-12
    )


# --- driving the server ---------------------------------------------------------------------


def drive_traffic(server: VllmServer) -> None:
    """Real completions: 4 sequential, then 8 concurrent; temperatures 0 and 1 alternate."""
    prompts = [
        "The server accepts",
        "Question 7: what is 12 plus 30? Answer:",
        "Each engine drafts four tokens",
        "alpha_3 = compute(",
    ]

    def one(i: int) -> None:
        answer = server.complete(
            prompts[i % len(prompts)],
            max_tokens=MAX_TOKENS,
            temperature=float(i % 2),
            ignore_eos=True,
        )
        assert answer["usage"]["completion_tokens"] == MAX_TOKENS
        assert answer["choices"][0]["finish_reason"] == "length"

    for i in range(4):
        one(i)
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(one, range(4, 12)))


def wait_until(probe: Callable[[], T | None], what: str, timeout: float = 60.0) -> T:
    """Poll ``probe`` every 0.2 s until it returns a value that is not None."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)


def quiescent_metrics(server: VllmServer) -> str:
    """A /metrics body taken once two captures 0.5 s apart show the same spec-decode counters."""

    def probe() -> str | None:
        first = server.metrics()
        time.sleep(0.5)
        second = server.metrics()
        return second if SpecCounters.of(first) == SpecCounters.of(second) else None

    return wait_until(probe, "the server's spec-decode counters to settle")


# --- (a) specwatch analyze A B --------------------------------------------------------------


def _specwatch_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT)
    return env


def test_analyze_two_real_captures_matches_independent_values(
    vllm_spec_server: VllmServer, tmp_path: Path
) -> None:
    """`specwatch analyze` over two real vLLM captures matches values computed independently from
    the counters."""
    body_a = quiescent_metrics(vllm_spec_server)
    drive_traffic(vllm_spec_server)
    body_b = quiescent_metrics(vllm_spec_server)
    expected = expected_between(body_a, body_b)
    path_a, path_b = tmp_path / "a.prom", tmp_path / "b.prom"
    path_a.write_text(body_a)
    path_b.write_text(body_b)

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "specwatch",
            "analyze",
            str(path_a),
            str(path_b),
            "--format",
            "json",
        ],
        cwd=REPO_ROOT,
        env=_specwatch_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert_matches(result["server"], expected)
    # One engine (engine="0"): its own view is the same window.
    assert sorted(result["engines"]) == ["0"]
    assert_matches(result["engines"]["0"], expected)


# --- (b) specwatch run: since_start against two captures ------------------------------------


@dataclass(frozen=True)
class Specwatch:
    """A ``specwatch run`` subprocess: its base URL, process and log file."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def snapshot(self) -> dict[str, Any] | None:
        """``/api/v1/snapshot`` as JSON, or None while it does not answer 200.

        Raises ``AssertionError`` once the process has exited."""
        if self.process.poll() is not None:
            raise AssertionError(f"specwatch run exited with code {self.process.returncode}")
        try:
            with urllib.request.urlopen(self.url + "/api/v1/snapshot", timeout=10) as response:
                data: dict[str, Any] = json.loads(response.read())
                return data
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return None


@contextlib.contextmanager
def specwatch_run(target_url: str, log_path: Path) -> Iterator[Specwatch]:
    """Run ``python -m specwatch run --target standard=URL`` scraping every 1 s; stop it after.

    The interval and the listen address are set through the documented environment
    (``SPECWATCH_SCRAPE__INTERVAL_SECONDS``, ``SPECWATCH_SERVER__HOST``/``__PORT``).
    """
    port = free_port()
    env = _specwatch_env()
    env.update(
        SPECWATCH_SCRAPE__INTERVAL_SECONDS="1",
        SPECWATCH_SERVER__HOST="127.0.0.1",
        SPECWATCH_SERVER__PORT=str(port),
    )
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "specwatch", "run", "--target", f"standard={target_url}"],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        yield Specwatch(url=f"http://127.0.0.1:{port}", process=process, log_path=log_path)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nspecwatch log:\n{log_path.read_text()[-4000:]}") from exc
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


def _epoch(value: Any) -> float:
    """A snapshot timestamp (epoch seconds, or an ISO 8601 string) as epoch seconds."""
    if isinstance(value, str):
        return datetime.fromisoformat(value).timestamp()
    return float(value)


def _target(snapshot: dict[str, Any] | None) -> dict[str, Any] | None:
    """The ``standard`` target's entry once it has had a good scrape, else None."""
    if snapshot is None:
        return None
    target: dict[str, Any] | None = snapshot.get("targets", {}).get("standard")
    if target is None or target.get("last_success") is None:
        return None
    return target


def test_run_since_start_matches_two_bracketing_captures(
    vllm_spec_server: VllmServer, tmp_path: Path
) -> None:
    """`specwatch run`'s since_start values equal those of two captures bracketing the traffic."""
    server = vllm_spec_server
    before = quiescent_metrics(server)  # no traffic from here until capture A
    with specwatch_run(server.url, tmp_path / "specwatch.log") as sw:
        first = wait_until(lambda: _target(sw.snapshot()), "specwatch's first good scrape")
        body_a = server.metrics()
        # Nothing ran since `before`, so specwatch's first scrape saw exactly capture A.
        assert SpecCounters.of(body_a) == SpecCounters.of(before)
        since_start = first["windows"]["since_start"]["server"]
        assert since_start["acceptance_rate"] is None  # no drafts yet: absent, not 0
        assert since_start["mean_acceptance_length"] is None

        drive_traffic(server)
        settled = quiescent_metrics(server)
        settled_at = time.time()

        # Two scrapes that ended after `settled_at`: the second began after the first ended
        # (never two scrapes of a target at once), so it read the settled counters.
        def scraped_after(t: float) -> float | None:
            target = _target(sw.snapshot())
            if target is None or _epoch(target["last_success"]) <= t:
                return None
            return _epoch(target["last_success"])

        one = wait_until(lambda: scraped_after(settled_at), "a scrape after the traffic")
        wait_until(lambda: scraped_after(one), "a second scrape after the traffic")
        snapshot = sw.snapshot()
        body_b = server.metrics()

    assert SpecCounters.of(body_b) == SpecCounters.of(settled)
    assert snapshot is not None
    target = snapshot["targets"]["standard"]
    assert target["up"] is True
    assert_matches(target["windows"]["since_start"]["server"], expected_between(body_a, body_b))
