"""A completion or chat request body read as vLLM 0.32's OpenAI frontend reads it: validated in
vLLM's order with vLLM's refusals (:mod:`specwatch.simulate.openai_errors`), then split into one
:class:`Choice` per output sequence (a batch of prompts times ``n``)."""

from __future__ import annotations

import math
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from specwatch.simulate import openai_errors as err
from specwatch.simulate.config import SimConfig
from specwatch.simulate.engine_core import SimRequest
from specwatch.simulate.openai_errors import APIError
from specwatch.simulate.quiz import item_for_prompt
from specwatch.simulate.replies import prompt_token_ids

#: vLLM's 400 for sampling parameters it cannot use with speculative decoding (vllm 0.32
#: ``SamplingParams._validate_spec_decode``).
SPEC_DECODE_UNSUPPORTED = (
    "The min_p and logit_bias sampling parameters are not yet supported with speculative decoding."
)
SAMPLING_EPS = 1e-5
#: Chat template overhead of the synthetic tokenizer, in tokens.
CHAT_TEMPLATE_TOKENS = 4


@dataclass(slots=True)
class Choice:
    """One output sequence: its engine request and, for ``echo``, the prompt it continues."""

    index: int
    req: SimRequest
    prompt_ids: list[int]
    echo_text: str = ""


@dataclass(slots=True)
class ParsedRequest:
    """A request that passed validation: its choices and how to answer."""

    request_id: str
    choices: list[Choice]
    prompt_tokens: int
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False  # stream_options.continuous_usage_stats: usage on every chunk
    return_token_ids: bool = False
    #: ``prompt_logprobs`` (top-k count per prompt token); ``None`` = not asked
    prompt_logprobs: int | None = None
    #: chat ``return_prompt_text``: the rendered chat, else ``None``
    prompt_text: str | None = None
    #: completions ``logprobs`` (top-k count) or chat ``top_logprobs``; ``None`` = not asked
    logprobs: int | None = None
    echo: bool = False
    tools: list[Any] = field(default_factory=list)
    tool_choice: Any = None
    #: answer with a tool call (a parser is configured and the tool choice asks for one)
    call_tool: bool = False


def _message_text(content: Any) -> str:
    """A message's text: a string, or the ``text`` of each ``{"type": "text"}`` part."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise APIError(400, "only text content parts are supported", "messages")
            texts.append(str(part.get("text", "")))
        return "\n".join(texts)
    raise APIError(400, "message content must be a string or a list of parts", "messages")


def chat_prompt(msgs: Any) -> tuple[str, str]:
    """The prompt key (the last user message when it is a quiz item) and the rendered chat."""
    if isinstance(msgs, list) and not msgs:
        raise err.empty_conversation()
    if not isinstance(msgs, list):
        raise APIError(400, "messages must be a non-empty list", "messages")
    parts: list[str] = []
    key = ""
    for m in msgs:
        if not isinstance(m, dict):
            raise APIError(400, "each message must be an object", "messages")
        text = _message_text(m.get("content", ""))
        parts.append(f"{m.get('role', 'user')}: {text}")
        if m.get("role", "user") == "user":
            key = text
    rendered = "\n".join(parts)
    return (key if item_for_prompt(key) is not None else rendered), rendered


def _prompts(p: Any) -> list[tuple[str, list[int] | None]]:
    """The prompts of a completion: ``(text, token ids or None)`` each."""
    if p is None or p == "" or p == []:
        raise err.missing_prompt()
    if isinstance(p, str):
        return [(p, None)]
    if all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        return [(" ".join(str(t) for t in p), list(p))]
    out: list[tuple[str, list[int] | None]] = []
    for item in p:
        if isinstance(item, str):
            out.append((item, None))
        elif isinstance(item, list) and item and all(isinstance(t, int) for t in item):
            out.append((" ".join(str(t) for t in item), list(item)))
        else:
            raise APIError(400, "prompt must be a string or a list of token ids", "prompt")
    return out


def _prompt_logprobs(body: dict[str, Any], chat: bool, logprobs: int | None) -> int | None:
    """The top-k count of ``prompt_logprobs``: asked for, or a chat ``echo`` (vLLM then gives
    the prompt's own tokens, with ``top_logprobs`` more when logprobs are asked)."""
    asked = body.get("prompt_logprobs")
    if isinstance(asked, int) and not isinstance(asked, bool):
        return asked
    if chat and body.get("echo"):
        return logprobs or 0
    return None


def _number(body: dict[str, Any], key: str, default: float) -> float:
    value = body.get(key, default)
    value = default if value is None else value
    if isinstance(value, str):
        value = float(value.strip())  # pydantic's lax number parsing (checked before)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise err.parameter_error(f"{key} must be a number, got {value}.", key, value)
    return float(value)


def _check_length(
    c: SimConfig, text: str, ids: list[int] | None, prompt_len: int, max_tokens: int | None
) -> None:
    """vLLM's length checks, in its order: characters, prompt tokens, max_tokens, both."""
    limit = c.max_model_len
    if ids is None and len(text) > err.CHARS_PER_TOKEN_BOUND * limit:
        raise err.prompt_too_many_chars(len(text), limit)
    if prompt_len > limit:
        # a text prompt is tokenized only up to one token past the limit
        at_least = ids is None
        count = limit + 1 if at_least else prompt_len
        raise err.prompt_too_many_tokens(count, limit, at_least=at_least)
    if max_tokens is not None and max_tokens > limit:
        raise err.max_tokens_over_len(max_tokens, limit)
    if max_tokens is not None and prompt_len + max_tokens > limit:
        raise err.max_tokens_over_room(max_tokens, limit, prompt_len)


def parse_request(
    c: SimConfig,
    body: Any,
    *,
    chat: bool,
    now: float,
    rng: random.Random,
    request_id: str | None = None,
) -> ParsedRequest:
    """Validate ``body`` as vLLM does and split it into choices (raises :class:`APIError`)."""
    err.validate_body(body, chat)
    assert isinstance(body, dict)
    model = body.get("model", c.served_model_name)
    if model != c.served_model_name:
        raise err.unknown_model(model, c.served_model_name)
    tools = body.get("tools") or []
    tool_choice = body.get("tool_choice")
    call_tool = False
    if chat and tools:
        refusal = err.tool_choice_without_parser(
            tool_choice, c.tool_call_parser, c.enable_auto_tool_choice
        )
        if refusal is not None:
            raise refusal
        call_tool = tool_choice != "none"
    ids_of: Callable[[str], list[int]] = lambda s: prompt_token_ids(s, c.vocab_size)  # noqa: E731
    prompts: list[tuple[str, list[int] | None]]
    if chat:
        key, rendered = chat_prompt(body.get("messages"))
        prompts = [(key, None)]
        lens = [len(ids_of(rendered)) + CHAT_TEMPLATE_TOKENS]
        texts = [rendered]
    else:
        prompts = _prompts(body.get("prompt"))
        lens = [len(ids) if ids is not None else len(ids_of(s)) for s, ids in prompts]
        texts = [s for s, _ in prompts]
    mt_key = "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens"
    max_tokens = err.as_int(body.get(mt_key))
    if max_tokens is not None and max_tokens < 1:
        raise err.parameter_error(
            f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens", max_tokens
        )
    for (text, ids), n_tok, rendered in zip(prompts, lens, texts, strict=True):
        _check_length(c, rendered if chat else text, ids, n_tok, max_tokens)
    temperature = _number(body, "temperature", 1.0)
    if temperature < 0:
        raise err.parameter_error(
            f"temperature must be non-negative, got {temperature}.", "temperature", temperature
        )
    top_p = _number(body, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise err.parameter_error(f"top_p must be in (0, 1], got {top_p}.", "top_p", top_p)
    min_p = _number(body, "min_p", 0.0)
    if not 0 <= min_p <= 1:
        raise err.parameter_error(f"min_p must be in [0, 1], got {min_p}.", "min_p", min_p)
    n = err.as_int(body.get("n"))
    n = 1 if n is None else n
    if n < 1:  # vLLM 0.32's words and its null param (checked against the real server)
        raise APIError(400, f"n must be at least 1, got {n}.")
    if not chat and body.get("suffix") is not None:
        raise APIError(
            400, "suffix is only supported for models with FIM completion rendering", "suffix"
        )
    sampled = temperature >= SAMPLING_EPS
    if n > 1 and not sampled:
        raise err.greedy_n(n)
    if c.speculative and ((sampled and min_p > SAMPLING_EPS) or body.get("logit_bias")):
        # vLLM SamplingParams._validate_spec_decode; a greedy request has min_p reset to 0
        # first (SamplingParams.__post_init__), so greedy + min_p is accepted
        raise APIError(400, SPEC_DECODE_UNSUPPORTED)
    stop = body.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise APIError(400, "stop must be a string or a list of strings", "stop")
    seed = err.as_int(body.get("seed"))
    if seed is None:
        seed = rng.getrandbits(63)
    if chat:
        logprobs = err.as_int(body.get("top_logprobs")) or 0 if body.get("logprobs") else None
    else:
        logprobs = err.as_int(body.get("logprobs"))
    echo = bool(body.get("echo", False)) and not chat
    rid = request_id or (("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex)
    choices: list[Choice] = []
    for (text, ids), n_tok in zip(prompts, lens, strict=True):
        budget = max_tokens if max_tokens is not None else (
            c.max_model_len - n_tok if chat else 16
        )  # fmt: skip
        for j in range(n):
            req = SimRequest(
                request_id=f"{rid}-{len(choices)}",
                prompt=text,
                prompt_len=n_tok,
                max_tokens=int(budget),
                arrival=now,
                temperature=temperature,
                top_p=top_p,
                seed=int(seed) + j,
                ignore_eos=bool(body.get("ignore_eos", False)),
                stop=tuple(stop),
                max_tokens_set=max_tokens is not None,
                include_stop_str=bool(body.get("include_stop_str_in_output", False)),
            )
            pids = ids if ids is not None else ids_of(text)
            choices.append(Choice(len(choices), req, pids, text if echo else ""))
    return ParsedRequest(
        request_id=rid,
        choices=choices,
        prompt_tokens=sum(lens),
        stream=bool(body.get("stream", False)),
        include_usage=bool((body.get("stream_options") or {}).get("include_usage", False)),
        continuous_usage=bool(
            (body.get("stream_options") or {}).get("include_usage", False)
            and (body.get("stream_options") or {}).get("continuous_usage_stats", False)
        ),
        return_token_ids=bool(body.get("return_token_ids", False)),
        prompt_logprobs=_prompt_logprobs(body, chat, logprobs),
        prompt_text=texts[0] if chat and body.get("return_prompt_text") else None,
        logprobs=logprobs,
        echo=echo,
        tools=list(tools),
        tool_choice=tool_choice,
        call_tool=call_tool,
    )
