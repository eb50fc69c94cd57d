"""vLLM 0.32's error replies, word for word: the error body, request-validation failures in
pydantic's words and the checks vLLM's OpenAI frontend makes after them.

Two kinds of 400 come from a real server (``tests/fixtures/vllm-conformance/``): a body FastAPI
cannot validate (not JSON, a missing required field, a field of the wrong type, no JSON content
type) has ``type: "Bad Request"``, ``param: "body.<field>"`` (``"body.<byte offset>"`` for
broken JSON) and ``"N validation error(s):\\n  {...}"``; a request that validates but that vLLM
refuses has ``type: "BadRequestError"``, its own message and usually
``"(parameter=..., value=...)"``.
"""

from __future__ import annotations

import json
from typing import Any

#: ``type`` of vLLM's error body per status (``GracefulHTTPError`` and FastAPI's request
#: validation use the status phrase, the OpenAI frontend its exception names).
ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    500: "InternalServerError",
    503: "Service Unavailable",
}
#: The type of a body that fails FastAPI's request validation.
VALIDATION_TYPE = "Bad Request"
#: vLLM's character pre-check: a prompt longer than this many characters per token of
#: ``max_model_len`` is refused before it is tokenized.
CHARS_PER_TOKEN_BOUND = 13


class APIError(Exception):
    """An error answered with vLLM's error body (``type`` from the status unless given)."""

    def __init__(
        self, status: int, message: str, param: str | None = None, type_: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type = type_ or ERROR_TYPES.get(status, "BadRequestError")

    def body(self) -> dict[str, Any]:
        """``{"error": {"message", "type", "param", "code"}}``."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.status,
            }
        }


def _input_repr(value: Any) -> Any:
    """How vLLM's validation message shows an input: containers by size, scalars as they are."""
    if isinstance(value, dict):
        return f"<dict of {len(value)} items>"
    if isinstance(value, list):
        return f"<list of {len(value)} items>"
    return value


def validation_error(errors: list[dict[str, Any]]) -> APIError:
    """The 400 for pydantic ``errors`` (each with ``type``, ``loc``, ``msg``, ``input``)."""
    n = len(errors)
    head = f"{n} validation error{'s' if n != 1 else ''}:"
    lines = [head, *(f"  {e!r}" for e in errors)]
    return APIError(400, "\n".join(lines), str(errors[0]["loc"]), VALIDATION_TYPE)


def unsupported_media_type() -> APIError:
    """The 400 for a POST whose Content-Type is not ``application/json``."""
    return APIError(
        400,
        "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed",
        None,
        VALIDATION_TYPE,
    )


def invalid_json(exc: json.JSONDecodeError) -> APIError:
    """The 400 for a body that is not JSON (``loc`` is the byte offset where parsing failed)."""
    loc = f"body.{exc.pos}"
    return validation_error(
        [
            {
                "type": "json_invalid",
                "loc": loc,
                "msg": "JSON decode error",
                "input": "<dict of 0 items>",
                "ctx": {"error": exc.msg},
            }
        ]
    )


def _int_error(field: str, value: Any) -> dict[str, Any] | None:
    """Pydantic's complaint about ``value`` for an optional integer field, or ``None``."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return None
    loc = f"body.{field}"
    if isinstance(value, str):
        try:
            int(value.strip())
        except ValueError:
            msg = "Input should be a valid integer, unable to parse string as an integer"
            return {"type": "int_parsing", "loc": loc, "msg": msg, "input": value}
        return None
    if isinstance(value, float) and value.is_integer():
        return None
    if isinstance(value, float):
        msg = "Input should be a valid integer, got a number with a fractional part"
        return {"type": "int_from_float", "loc": loc, "msg": msg, "input": value}
    if isinstance(value, bool):
        return None
    return {
        "type": "int_type",
        "loc": loc,
        "msg": "Input should be a valid integer",
        "input": _input_repr(value),
    }


FLOAT_FIELDS = ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty",
                "repetition_penalty", "length_penalty")  # fmt: skip


def _float_error(field: str, value: Any) -> dict[str, Any] | None:
    """Pydantic's complaint about ``value`` for an optional number field, or ``None``."""
    if value is None or isinstance(value, int | float):
        return None
    loc = f"body.{field}"
    if isinstance(value, str):
        try:
            float(value.strip())
        except ValueError:
            msg = "Input should be a valid number, unable to parse string as a number"
            return {"type": "float_parsing", "loc": loc, "msg": msg, "input": value}
        return None
    return {"type": "float_type", "loc": loc, "msg": "Input should be a valid number",
            "input": _input_repr(value)}  # fmt: skip


def empty_conversation() -> APIError:
    """vLLM's 400 for a chat (or chat ``/tokenize``) with an empty ``messages`` list."""
    return APIError(
        400, "Cannot apply chat template to an empty conversation. Provide at least one message."
    )


def _prompt_errors(value: Any) -> list[dict[str, Any]]:
    """Pydantic's four complaints about a ``prompt`` that is none of ``list[int]``,
    ``list[list[int]]``, ``str``, ``list[str]`` (a list of other things is left to vLLM)."""
    if value is None or isinstance(value, str | list):
        return []
    shown = _input_repr(value)
    loc = "body.prompt"
    as_list = {"type": "list_type", "loc": loc, "msg": "Input should be a valid list"}
    as_str = {"type": "string_type", "loc": loc, "msg": "Input should be a valid string"}
    return [{**e, "input": shown} for e in (as_list, as_list, as_str, as_list)]


def validate_body(body: Any, chat: bool) -> None:
    """Raise the pydantic-style 400 for a decoded body FastAPI would refuse."""
    if not isinstance(body, dict):
        raise validation_error(
            [
                {
                    "type": "model_attributes_type",
                    "loc": "body",
                    "msg": "Input should be a valid dictionary or object to extract fields from",
                    "input": _input_repr(body),
                }
            ]
        )
    errors: list[dict[str, Any]] = []
    if chat and "messages" not in body:
        errors.append(
            {
                "type": "missing",
                "loc": "body.messages",
                "msg": "Field required",
                "input": _input_repr(body),
            }
        )
    if not chat:
        errors += _prompt_errors(body.get("prompt"))
    for field in ("max_tokens", "max_completion_tokens", "n", "seed", "logprobs", "top_logprobs"):
        if chat and field == "logprobs":
            continue
        err = _int_error(field, body.get(field))
        if err is not None:
            errors.append(err)
    for field in FLOAT_FIELDS:
        err = _float_error(field, body.get(field))
        if err is not None:
            errors.append(err)
    if errors:
        raise validation_error(errors)


def as_int(value: Any) -> Any:
    """An integer field after pydantic's lax coercion (``"10"`` -> 10, ``3.0`` -> 3)."""
    if isinstance(value, str):
        return int(value.strip())
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def unknown_model(model: object, served: str) -> APIError:
    """The 404 for a model name the server does not serve."""
    return APIError(404, f"The model `{model}` does not exist. Valid aliases: {served}.", "model")


def parameter_error(message: str, param: str, value: object = None, show: bool = True) -> APIError:
    """vLLM's ``VLLMValidationError``: the message, then ``(parameter=..., value=...)``."""
    tail = f" (parameter={param}, value={value})" if show else f" (parameter={param})"
    return APIError(400, message + tail, param)


def missing_prompt() -> APIError:
    """The 400 for a completion without a prompt."""
    return parameter_error(
        "Either prompt or prompt_embeds must be provided and non-empty.", "prompt", show=False
    )


def greedy_n(n: int) -> APIError:
    """The 400 for ``n > 1`` at temperature 0."""
    return APIError(400, f"n must be 1 when using greedy sampling, got {n}.")


def context_limit(max_model_len: int) -> str:
    """The sentence every over-long refusal starts with."""
    return f"This model's maximum context length is {max_model_len} tokens. However, "


def prompt_too_many_chars(chars: int, max_model_len: int) -> APIError:
    """vLLM's character pre-check (before tokenizing)."""
    bound = CHARS_PER_TOKEN_BOUND * max_model_len
    return parameter_error(
        context_limit(max_model_len) + f"your prompt contains {chars} characters (more than "
        f"{bound} characters, which is the upper bound for {max_model_len} input tokens). Please "
        "reduce the length of the input prompt.",
        "input_text",
        chars,
    )


def prompt_too_many_tokens(tokens: int, max_model_len: int, *, at_least: bool) -> APIError:
    """The 400 for a prompt with no room left for one output token (``at_least``: a text prompt,
    tokenized only up to the limit)."""
    count = f"at least {tokens}" if at_least else str(tokens)
    return parameter_error(
        context_limit(max_model_len) + f"your prompt contains {count} input tokens, which "
        "exceeds this limit even without any output tokens. Please reduce the length of the "
        "input prompt.",
        "input_tokens",
        tokens,
    )


def max_tokens_over_len(max_tokens: int, max_model_len: int) -> APIError:
    """The 400 for ``max_tokens`` alone beyond ``max_model_len``."""
    return parameter_error(
        f"max_tokens={max_tokens} cannot be greater than max_model_len={max_model_len}. Please "
        "request fewer output tokens.",
        "max_tokens",
        max_tokens,
    )


def max_tokens_over_room(max_tokens: int, max_model_len: int, prompt_len: int) -> APIError:
    """The 400 for a prompt and ``max_tokens`` that fit alone but not together."""
    return parameter_error(
        f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's "
        f"maximum context length is {max_model_len} tokens and your request has {prompt_len} "
        f"input tokens ({max_tokens} > {max_model_len} - {prompt_len}).",
        "max_tokens",
        max_tokens,
    )


def tool_choice_without_parser(
    tool_choice: Any, parser: str | None, auto_enabled: bool
) -> APIError | None:
    """vLLM's 400 for a tool choice the server is not set up for, or ``None`` when it is."""
    if tool_choice == "none":
        return None
    if tool_choice in (None, "auto"):
        if parser is None or not auto_enabled:
            return APIError(
                400,
                '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser '
                "to be set",
            )
        return None
    if parser is not None:
        return None
    if tool_choice == "required":
        return APIError(400, 'tool_choice="required" requires --tool-call-parser to be set')
    name = (
        ((tool_choice or {}).get("function") or {}).get("name")
        if isinstance(tool_choice, dict)
        else None
    )
    return APIError(400, f'tool_choice=function "{name}" requires --tool-call-parser to be set')
