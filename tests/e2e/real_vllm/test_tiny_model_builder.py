"""scripts/make_tiny_model.py: deterministic, and the models fit vLLM's CPU constraints.

Runs the builder with the vLLM venv's python (it needs torch/transformers/tokenizers, which
specwatch does not depend on), so it is a real_vllm test.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.fakes import REPO

from .servers import TinyModels

pytestmark = pytest.mark.real_vllm

BUILDER = REPO / "scripts" / "make_tiny_model.py"


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


def _digests(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "manifest.json"
    }


def _config(model_dir: Path) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((model_dir / "config.json").read_text())
    return config


def test_builder_is_deterministic_and_matches_the_models_under_test(
    vllm_python: Path, tiny_models: TinyModels, tmp_path: Path
) -> None:
    """A fresh build of the tiny models equals, byte for byte, the models under test and its
    manifest."""
    # The models under test were built earlier, in another process, by this same builder
    # (scripts/test.sh keys them by the builder's sha256): a fresh build must equal them.
    fresh = _build(vllm_python, tmp_path / "fresh")
    in_use = json.loads((tiny_models.target.parent / "manifest.json").read_text())
    assert fresh == in_use
    # The manifest lists the files on disk, byte for byte.
    assert fresh["files"] == _digests(tmp_path / "fresh")
    assert (tmp_path / "fresh" / "target" / "model.safetensors").read_bytes() == (
        tiny_models.target / "model.safetensors"
    ).read_bytes()


def test_models_fit_vllm_cpu_draft_model_constraints(tiny_models: TinyModels) -> None:
    """The tiny target and draft models meet vLLM's CPU draft-model constraints (vocab, head
    size, tokens)."""
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
