"""The frozen pydantic base model every settings group derives from (kept apart from
:mod:`specwatch.core.config` so that importing window names does not load pydantic)."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


def takes_bool(annotation: Any) -> bool:
    """Whether a field of this type may hold ``True``/``False``: ``bool`` itself, ``Any``, a
    ``Literal`` of a bool, or a union / ``Annotated`` / container of one (a number-only field
    does not: ``interval_seconds = true`` is a mistake, not 1 second)."""
    if annotation is bool or annotation is Any or annotation is object:
        return True
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return any(isinstance(v, bool) for v in typing.get_args(annotation))
    if origin is typing.Annotated:
        return takes_bool(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return any(takes_bool(a) for a in typing.get_args(annotation))
    return annotation not in (int, float)


class Frozen(BaseModel):
    """Immutable, unknown fields are an error (a typo in a config file fails loudly), a float
    setting must be finite (`.inf` or `.nan` for a duration or rate is a config error), and a
    number setting takes no boolean (TOML's and YAML's ``true`` is not 1)."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", allow_inf_nan=False, use_attribute_docstrings=True
    )

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and info.field_name is not None:
            field = cls.model_fields.get(info.field_name)
            if field is not None and not takes_bool(field.annotation):
                raise ValueError(f"{str(value).lower()} is a boolean; a number is expected")
        return value
