"""The frozen pydantic base model every settings group derives from (kept apart from
:mod:`specwatch.core.config` so that importing window names does not load pydantic)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    """Immutable, unknown fields are an error (a typo in a config file fails loudly), and a
    float setting must be finite (`.inf` or `.nan` for a duration or rate is a config error)."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", allow_inf_nan=False, use_attribute_docstrings=True
    )
