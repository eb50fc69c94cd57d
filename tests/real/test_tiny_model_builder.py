"""scripts/make_tiny_model.py: deterministic, and the models fit vLLM's CPU constraints.

Runs the builder with the vLLM venv's python (it needs torch/transformers/tokenizers, which
specwatch does not depend on), so it is a real_vllm test.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from .servers import TinyModels

pytestmark = pytest.mark.real_vllm

BUILDER = Path(__file__).resolve().parents[2] / "scripts" / "make_tiny_model.py"


def _build(python: Path, out: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [str(python), str(BUILDER), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    manifest: dict[str, Any] = json.loads((out / "manifest.json").read_text())
    return manifest


def _config(model_dir: Path) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((model_dir / "config.json").read_text())
    return config


def test_builder_is_deterministic_and_matches_the_models_under_test(
    vllm_python: Path, tiny_models: TinyModels, tmp_path: Path
) -> None:
    first = _build(vllm_python, tmp_path / "one")
    second = _build(vllm_python, tmp_path / "two")
    assert first == second
    # The files on disk are the ones the manifest lists, byte for byte.
    assert (tmp_path / "one" / "target" / "model.safetensors").read_bytes() == (
        tmp_path / "two" / "target" / "model.safetensors"
    ).read_bytes()
    # The models the real-server tests use were built by this version of the builder.
    in_use = json.loads((tiny_models.target.parent / "manifest.json").read_text())
    assert in_use == first


def test_models_fit_vllm_cpu_draft_model_constraints(tiny_models: TinyModels) -> None:
    target, draft, same = (
        _config(p) for p in (tiny_models.target, tiny_models.draft, tiny_models.draft_same)
    )
    for config in (target, draft):
        assert config["architectures"] == ["LlamaForCausalLM"]
        assert config["vocab_size"] == 512  # draft_model needs equal vocabularies
        head_dim = config["hidden_size"] // config["num_attention_heads"]
        assert head_dim >= 32  # smallest head size vLLM's CPU attention accepts
    assert draft["hidden_size"] < target["hidden_size"]
    assert same == target
    assert (tiny_models.draft_same / "model.safetensors").read_bytes() == (
        tiny_models.target / "model.safetensors"
    ).read_bytes()
    tokenizer = json.loads((tiny_models.target / "tokenizer.json").read_text())
    added = {t["content"] for t in tokenizer["added_tokens"]}
    assert {"<|endoftext|>", "<|user|>", "<|assistant|>"} <= added
    assert len(tokenizer["model"]["vocab"]) == 512
