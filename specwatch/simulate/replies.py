"""Pieces of a simulated reply that vLLM 0.32 computes per token: log-probabilities (completions
and chat, the prompt's with ``echo``), prompt token ids and tool calls.

The synthetic LM does not keep the distributions it sampled from, so log-probabilities are drawn
again, deterministically from (token, position): the chosen token gets a value in (-2, 0) and
its alternatives lower ones (the chosen token ranks first, as at temperature 0); prompt tokens
lie far lower, as a real model's do for text it did not predict. They have vLLM's shapes and
plausible magnitudes, not the meaning of a probability of the synthetic model.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Sequence
from typing import Any

#: Token ids below this are digits and punctuation in the synthetic vocabulary.
_FIRST_WORD = 13


def _unit(*key: int) -> float:
    """A uniform number in [0, 1) fixed by ``key``."""
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def prompt_token_ids(prompt: str, vocab_size: int) -> list[int]:
    """The synthetic tokenizer's ids of a text prompt: BOS (id 1) then one id per word."""
    span = max(1, vocab_size - _FIRST_WORD)
    return [1] + [_FIRST_WORD + (sum(w.encode()) * 131 + len(w)) % span for w in prompt.split()]


def token_logprob(token: int, position: int) -> float:
    """The chosen token's log-probability at ``position`` of the output."""
    return -2.0 * _unit(token, position) ** 2 - 1e-4


def alternatives(
    token: int, position: int, k: int, vocab_size: int, chosen_lp: float
) -> list[tuple[int, float]]:
    """``k`` other tokens with log-probabilities below ``chosen_lp``, best first."""
    out: list[tuple[int, float]] = []
    lp = chosen_lp
    for j in range(k):
        other = (token + 1 + int(_unit(token, position, j) * (vocab_size - 1))) % vocab_size
        if other == token or any(other == t for t, _ in out):
            other = (other + 1 + j) % vocab_size
        lp -= 0.05 + 1.5 * _unit(position, token, j)
        out.append((other, lp))
    return out


def completion_logprobs(
    tokens: Sequence[int],
    pieces: Sequence[str],
    k: int,
    *,
    start_position: int = 0,
    text_offset: int = 0,
    prompt: Sequence[int] = (),
) -> dict[str, Any]:
    """The ``logprobs`` object of a completion choice (or of one streamed chunk): per token its
    text, offset, log-probability and a map of up to ``k`` top tokens (the chosen one
    included). ``prompt`` tokens (``echo``) come first, the very first with ``null``."""
    vocab = len(pieces)
    out: dict[str, Any] = {
        "text_offset": [],
        "token_logprobs": [],
        "tokens": [],
        "top_logprobs": [],
    }
    offset = text_offset
    for i, t in enumerate(prompt):
        out["text_offset"].append(offset)
        out["tokens"].append(pieces[t % vocab])
        if i == 0:
            out["token_logprobs"].append(None)
            out["top_logprobs"].append(None)
        else:
            lp = -8.0 - 20.0 * _unit(t, i, -1)
            top = {pieces[t % vocab]: lp}
            for o, olp in alternatives(t, -i, max(k - 1, 0), vocab, -0.01):
                top.setdefault(pieces[o], olp + 0.0)
            out["token_logprobs"].append(lp)
            out["top_logprobs"].append(top)
        offset += len(pieces[t % vocab])
    for i, t in enumerate(tokens):
        pos = start_position + i
        lp = token_logprob(t, pos)
        top = {pieces[t]: lp}
        for o, olp in alternatives(t, pos, max(k - 1, 0), vocab, lp):
            top.setdefault(pieces[o], olp)
        out["text_offset"].append(offset)
        out["tokens"].append(pieces[t])
        out["token_logprobs"].append(lp)
        out["top_logprobs"].append(top)
        offset += len(pieces[t])
    return out


def prompt_logprobs(prompt: Sequence[int], pieces: Sequence[str], k: int) -> list[Any]:
    """``prompt_logprobs`` of an ``echo`` choice: ``null``, then per prompt token a map
    ``{token_id: {logprob, rank, decoded_token}}`` with the token itself and ``k`` best."""
    vocab = len(pieces)
    out: list[Any] = [None]
    for i, t in enumerate(prompt[1:], start=1):
        lp = -8.0 - 20.0 * _unit(t, i, -1)
        entry = {
            str(t): {
                "logprob": lp,
                "rank": 2 + int(_unit(i, t) * (vocab - 2)),
                "decoded_token": pieces[t % vocab],
            }
        }
        for rank, (o, olp) in enumerate(alternatives(t, -i, k, vocab, -0.01), start=1):
            entry.setdefault(str(o), {"logprob": olp, "rank": rank, "decoded_token": pieces[o]})
        out.append(entry)
    return out


def _chat_entry(token: int, lp: float, pieces: Sequence[str]) -> dict[str, Any]:
    text = pieces[token]
    return {"token": text, "logprob": lp, "bytes": list(text.encode())}


def chat_logprobs(
    tokens: Sequence[int], pieces: Sequence[str], k: int, *, start_position: int = 0
) -> dict[str, Any]:
    """The ``logprobs`` object of a chat choice: ``{"content": [...]}`` with per token its text,
    log-probability, UTF-8 bytes and ``k`` top entries (the chosen one first)."""
    vocab = len(pieces)
    content = []
    for i, t in enumerate(tokens):
        pos = start_position + i
        lp = token_logprob(t, pos)
        entry = _chat_entry(t, lp, pieces)
        top = [_chat_entry(t, lp, pieces)][:k]
        top += [_chat_entry(o, olp, pieces) for o, olp in alternatives(t, pos, k - 1, vocab, lp)]
        entry["top_logprobs"] = top[:k]
        content.append(entry)
    return {"content": content}


def _obj(value: Any) -> dict[str, Any]:
    """``value`` when it is a JSON object, else an empty one."""
    return value if isinstance(value, dict) else {}


def _argument_value(schema: Any, words: list[str], i: int) -> Any:
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind in ("integer", "number"):
        return len(words[i % len(words)]) if words else 1
    if kind == "boolean":
        return i % 2 == 0
    if kind == "array":
        return []
    if kind == "object":
        return {}
    return words[i % len(words)] if words else "value"


def tool_call(tool: Any, text: str) -> dict[str, Any]:
    """One ``tool_calls`` entry calling ``tool`` (an OpenAI tool definition) with arguments
    that satisfy its required parameters, filled from words of the generated ``text``."""
    function = _obj(tool.get("function")) if isinstance(tool, dict) else {}
    params = _obj(function.get("parameters"))
    props = _obj(params.get("properties"))
    listed = params.get("required")
    required = listed if isinstance(listed, list) else list(props)
    words = [w for w in "".join(ch if ch.isalnum() else " " for ch in text).split() if w]
    args = {
        str(name): _argument_value(props.get(name), words, i) for i, name in enumerate(required)
    }
    return {
        "id": "chatcmpl-tool-" + uuid.uuid4().hex[:16],
        "type": "function",
        "function": {"name": str(function.get("name", "")), "arguments": json.dumps(args)},
    }


def chosen_tool(tools: Sequence[Any], tool_choice: Any) -> Any:
    """The tool a call goes to: the named one, else the first."""
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name")
        for t in tools:
            if isinstance(t, dict) and (t.get("function") or {}).get("name") == name:
                return t
    return tools[0] if tools else {}
