"""CLI flags, the subprocess and in-process launchers, and the load generator."""

from __future__ import annotations

import aiohttp
import pytest

from specwatch.__main__ import main as cli_main
from specwatch.simulate.config import Role, SimConfig, StepTimeModel
from specwatch.simulate.launcher import spawn_simulator, start_simulator
from specwatch.simulate.loadgen import LoadConfig, LoadGenerator
from tests.fakes import REPO

FAST = StepTimeModel(base_s=0.001, token_s=1e-6, seq_s=1e-6)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--method", "medusa"], "unknown --method"),
        (["--role", "fly", "--num-speculative-tokens", "1"], "FLy needs"),
        (["--role", "fly", "--fly-window-size", "4"], "1 <= W < K"),
        (["--vllm-version", "banana"], "unreadable vLLM version"),
        (["--method", "dspark", "--num-speculative-tokens", "5", "--max-num-batched-tokens",
          "512", "--max-num-seqs", "128", "--vllm-version", "0.25"], "static reservation"),
        (["--faults", '{"bogus": 1}'], "unknown fault"),
    ],
)  # fmt: skip
def test_bad_flags_exit_2_with_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each bad simulate flag exits 2 with its message in one line."""
    assert cli_main(["simulate", "--port", "0", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err
    assert len(err.splitlines()) == 1


async def test_spawned_simulator_serves_and_stops_cleanly() -> None:
    """A spawned simulator process serves its model name and faults, then stops with exit 0."""
    proc = await spawn_simulator(
        ["--role", "fly", "--time-scale", "0", "--served-model-name", "spawned",
         "--data-parallel-size", "2", "--faults", '{"fly_entropy_threshold": 0.1}']
    )  # fmt: skip
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(proc.url + "/v1/models") as r:
                assert (await r.json())["data"][0]["id"] == "spawned"
            async with s.post(proc.url + "/v1/completions",
                              json={"prompt": "hi there", "max_tokens": 8}) as r:  # fmt: skip
                body = await r.json()
                assert body["usage"]["completion_tokens"] == 8
            async with s.get(proc.url + "/admin/faults") as r:
                assert (await r.json())["fly_entropy_threshold"] == 0.1
    finally:
        rc = await proc.stop()
    assert rc == 0
    assert proc.process.returncode == 0


async def test_loadgen_fanout_to_two_in_process_simulators() -> None:
    """With fanout the load generator sends each job to both simulators and counts results per
    URL."""
    common = {"time_scale": 0.0, "step_time": FAST}
    std = await start_simulator(SimConfig(role=Role.STANDARD, **common))  # type: ignore[arg-type]
    fly = await start_simulator(SimConfig(role=Role.FLY, **common))  # type: ignore[arg-type]
    assert std.port != fly.port
    seen: list[tuple[str, str]] = []
    try:
        gen = LoadGenerator(
            [std.url, fly.url],
            LoadConfig(concurrency=6, duration_s=None, max_requests=30, max_tokens=100,
                       fanout=True, stream=True, chat=True, seed=4),
            on_result=lambda url, job, res: seen.append((url, job.category)),
        )  # fmt: skip
        stats = await gen.run()
    finally:
        await std.stop()
        await fly.stop()
    assert stats.sent == 60
    assert stats.ok == 60
    assert stats.errors == {}
    assert sum(stats.by_category.values()) == 60
    graded = stats.graded.get(std.url, 0)
    assert graded == stats.graded.get(fly.url, 0)
    assert graded == sum(n for c, n in stats.by_category.items() if c != "chat") // 2
    assert stats.correct.get(std.url, 0) <= graded
    assert stats.completion_tokens > 0
    assert len(seen) == 60


async def test_loadgen_counts_errors_by_reason() -> None:
    """The load generator counts failed requests by reason."""
    h = await start_simulator(SimConfig(time_scale=0.0, step_time=FAST))
    try:
        h.server.faults.completion_error_rate = 1.0
        gen = LoadGenerator([h.url], LoadConfig(concurrency=2, duration_s=None, max_requests=5,
                                                rate=1000.0))  # fmt: skip
        stats = await gen.run()
    finally:
        await h.stop()
    assert stats.sent == 5
    assert stats.ok == 0
    assert stats.errors == {"http_500": 5}


def test_simulator_imports_nothing_from_the_sidecar_but_core_and_vllm() -> None:
    """The simulator modules import only simulate, vllm and core from specwatch."""
    import ast

    root = REPO / "specwatch"
    files = [*sorted((root / "simulate").glob("*.py")), root / "cli" / "simulate.py"]
    assert len(files) >= 10
    for path in files:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module is not None:
                names = [node.module]
            for name in names:
                if name.startswith("specwatch"):
                    assert name.startswith(
                        ("specwatch.simulate", "specwatch.vllm", "specwatch.core")
                    ), (
                        path.name,
                        name,
                    )
